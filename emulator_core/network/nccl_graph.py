"""NCCL's channel search, simplified: how many channels each algorithm's graph gets and at what bandwidth.

NCCL's tuner (``src/graph/tuning.cc``) prices an algorithm with its graph: ``nChannels`` and the per-channel
bandwidths ``bwIntra`` / ``bwInter`` (GB/s) that ``ncclTopoCompute`` (``src/graph/search.cc``) finds by trying the
speeds of a fixed array. This module replays that search on an idealised system, with the constants of
``data/nccl_tuning.toml``:

* intra-node: every GPU reaches an NVSwitch with its NVLinks, counted at ``nvlink_link_gbps`` per link, so a GPU's
  NCCL-counted NVLink bandwidth is the scenario's line rate times ``nvlink_link_gbps / nvlink_nominal_link_gbps``
  (H100: 450 GB/s line rate -> 18 x 20.6 = 370.8 GB/s);
* inter-node: one NIC per GPU over PCIe; a channel leaving the node takes ``min(NIC, PCIe)`` GB/s from one NIC.

A channel's cost per pattern: ring / tree / CollNet chain: every GPU sends ``bwIntra`` per channel, a channel
crossing nodes takes ``bwInter`` from one NIC; NVLS: the busiest GPU carries ``(n + 1) * bwIntra`` (distinct heads);
CollNet direct: the head exchanges ``bwIntra`` with all other GPUs. The search follows ncclTopoCompute: pass 1
lowers the speed while ``next / best > 0.49``, stopping at a "perfect" graph; then ``ncclTopoDupChannels``; then
pass 2 raises the speed (ring), ``bwInter`` (NVLS) or ``bwIntra`` (trees) while it fits; a ring or tree with no
channel falls back to one channel at 0.1 GB/s. Units: GB/s = 1e9 bytes/s, per direction. What is simplified, and the
source lines followed: docs/design/nccl-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Graph", "Graphs", "search_graphs"]

_EPS = 1e-6  # NCCL subtracts floats from link bandwidths; this absorbs the rounding of n * speed <= total


@dataclass(frozen=True)
class Graph:
    """One algorithm's graph: ``n_channels`` channels of ``bw_intra_gbps`` / ``bw_inter_gbps`` each (GB/s)."""

    n_channels: int
    bw_intra_gbps: float
    bw_inter_gbps: float
    same_channels: bool = True


@dataclass(frozen=True)
class Graphs:
    """The graphs NCCL's tuner reads (init.cc 917: tree and PAT share the tree graph, NVLS and NVLS tree the
    NVLS graph), plus ``comm_channels``: ``comm->nChannels`` after connect.cc 453 doubled the ring's."""

    ring: Graph
    tree: Graph
    nvls: Graph
    collnet_direct: Graph
    collnet_chain: Graph
    comm_channels: int

    def for_algorithm(self, algorithm: str) -> Graph:
        """The graph ``graphs[algorithm]`` of tuning.cc (init.cc 917)."""
        table = {"tree": self.tree, "ring": self.ring, "collnet_direct": self.collnet_direct,
                 "collnet_chain": self.collnet_chain, "nvls": self.nvls, "nvls_tree": self.nvls,
                 "pat": self.tree}
        return table[algorithm]


_NONE = Graph(0, 0.0, 0.0)
Fits = Callable[[int, float, float], bool]


def _speeds(consts: Mapping[str, Any], arch: str, inter: bool) -> list[float]:
    prefix = {"hopper": "sm90_", "blackwell": "sm100_"}.get(arch, "")
    return [float(s) for s in consts["search"][f"{prefix}speeds_{'inter' if inter else 'intra'}_gbps"]]


def _max_fit(fits: Fits, bw_intra: float, bw_inter: float, max_channels: int) -> int:
    n = 0
    while n < max_channels and fits(n + 1, bw_intra, bw_inter):
        n += 1
    return n


def _better(pattern: str, n: int, bi: float, be: float, best: Graph | None, ngpus: int) -> bool:
    """ncclTopoCompareGraphs (search.cc 420-440): NVLS wants more channels, the others more bandwidth."""
    if best is None:
        return True
    if pattern == "nvls":
        return (n > best.n_channels and n <= ngpus) or n * be > best.n_channels * best.bw_inter_gbps
    return n * bi > best.n_channels * best.bw_intra_gbps


@dataclass(frozen=True)
class _System:
    """What ncclTopoCompute reads besides the pattern: the speed array, ``system->maxBw`` (the best path
    bandwidth to a GPU, or to a NIC across nodes), ``system->totalBw`` (a GPU's total), ccMin, the GPU count."""

    speeds: list[float]
    max_bw: float
    total_bw: float
    compute_capability: int
    ngpus: int


def _search(consts: Mapping[str, Any], fits: Fits, system: _System, *, pattern: str, min_channels: int,
            max_channels: int) -> Graph:
    """ncclTopoCompute's two passes (search.cc 1087-1213) on the counting model ``fits(n, bwIntra, bwInter)``."""
    search = consts["search"]
    speeds, max_bw, total_bw = system.speeds, system.max_bw, system.total_bw
    compute_capability, ngpus = system.compute_capability, system.ngpus
    if pattern != "ring" and ngpus > 1:
        total_bw *= ngpus / (ngpus - 1)  # search.cc 1101
    i = 0
    while (speeds[i] > max_bw or speeds[i] * min_channels > total_bw) and i < len(speeds) - 1:
        i += 1
    best: Graph | None = None
    while True:  # pass 1: lower the speed until a solution is found and the next speed is much slower
        s = speeds[i]
        n = _max_fit(fits, s, s, max_channels)
        if n >= max(min_channels, 1) and _better(pattern, n, s, s, best, ngpus):
            best = Graph(n, s, s)
            if n == max_channels:
                break  # "perfect" (search.cc 589, 1125)
        if best is not None and best.n_channels * best.bw_inter_gbps >= total_bw:
            break
        if i < len(speeds) - 1 and (best is None or speeds[i + 1] / best.bw_inter_gbps > search["decrease_ratio"]):
            i += 1
            continue
        break
    if best is None:
        return _NONE
    if pattern != "nvls":  # ncclTopoDupChannels (search.cc 962-975)
        bw = best.bw_intra_gbps
        skip = (compute_capability > search["dup_skip_min_compute_capability"] and bw < search["dup_skip_bw_gbps"]
                and best.n_channels > search["dup_skip_min_channels"])
        if bw >= search["dup_min_bw_gbps"] and not skip:
            dup = min(2 * best.n_channels, max_channels)
            div = math.ceil(dup / best.n_channels)
            best = Graph(dup, best.bw_intra_gbps / div, best.bw_inter_gbps / div)
    # pass 2 (search.cc 1183-1212): try faster speeds keeping at least the channels found
    i = 0
    while speeds[i] > best.bw_inter_gbps and i < len(speeds) - 1:
        i += 1
    bi = be = speeds[i]
    lo, hi = best.n_channels, (best.n_channels if pattern == "nvls" else max_channels)
    while i > 0:
        if pattern == "ring":
            bi = be = speeds[i - 1]
        elif pattern == "nvls" and be == best.bw_inter_gbps and be < 2 * bi:
            be = speeds[i - 1]
        elif bi == best.bw_intra_gbps and bi < 2 * be:
            bi = speeds[i - 1]
        else:
            break
        i -= 1
        n = _max_fit(fits, bi, be, hi)
        if n >= lo and _better(pattern, n, bi, be, best, ngpus):
            best = Graph(n, bi, be)
    return best


def search_graphs(consts: Mapping[str, Any], *, arch: str, ppn: int, nnodes: int, nvlink_gbps: float,
                  nic_gbps: float, nvls: bool, collnet: bool) -> Graphs:
    """The graphs of a system of ``nnodes`` nodes with ``ppn`` GPUs each.

    ``nvlink_gbps``: a GPU's NVLink bandwidth as NCCL counts it (links x ``nvlink_link_gbps``), GB/s per
    direction. ``nic_gbps``: what one channel can take from one NIC, ``min(NIC, PCIe)``, GB/s per direction.
    ``nvls`` / ``collnet``: whether NCCL would build the NVLS / CollNet graphs (init.cc 1103-1127).
    """
    cc = int(consts["compute_capability"][arch])
    multi = nnodes > 1
    speeds = _speeds(consts, arch, multi)
    max_bw = min(nic_gbps, nvlink_gbps) if multi and ppn > 1 else (nic_gbps if multi else nvlink_gbps)
    total_bw = max(nvlink_gbps if ppn > 1 else 0.0, float(consts["assumed"]["gpu_nic_pcie_gbps"][arch]))
    per_nic = (lambda be: math.floor(nic_gbps / be + _EPS)) if multi else (lambda be: 1 << 30)
    system = _System(speeds, max_bw, total_bw, cc, ppn)

    def chain(n: int, bi: float, be: float) -> bool:
        return (ppn == 1 or n * bi <= nvlink_gbps + _EPS) and n <= ppn * per_nic(be)

    def nvls_fits(n: int, bi: float, be: float) -> bool:
        return n <= ppn and (n + 1) * bi <= nvlink_gbps + _EPS and (not multi or be <= nic_gbps + _EPS)

    def direct(n: int, bi: float, be: float) -> bool:
        spread = 0.0 if ppn == 1 else (n - 1) * bi / (ppn - 1)
        return n <= ppn and bi + spread <= nvlink_gbps + _EPS and be <= nic_gbps + _EPS

    search = consts["search"]
    ring = _search(consts, chain, system, pattern="ring", min_channels=1,
                   max_channels=int(search["max_channels"]) // 2)
    tree = _search(consts, chain, system, pattern="tree", min_channels=ring.n_channels,
                   max_channels=ring.n_channels) if ring.n_channels else _NONE
    fallback = Graph(1, float(search["fallback_bw_gbps"]), float(search["fallback_bw_gbps"]))
    ring = ring if ring.n_channels else fallback
    tree = tree if tree.n_channels else fallback
    n = min(ring.n_channels, tree.n_channels)  # init.cc 1275: rings and trees keep the same channel count
    ring = replace(ring, n_channels=n, same_channels=not multi)
    tree = replace(tree, n_channels=n)
    nvls_graph = _NONE
    if nvls and cc >= 90 and ppn >= 2:  # search.cc 1063: NVLS needs an NVSwitch and sm90
        top = min(int(search["max_nvls_arity"]), ppn)
        nvls_graph = _search(consts, nvls_fits, system, pattern="nvls", min_channels=1 if multi else top,
                             max_channels=top)
    chain_graph = direct_graph = _NONE
    if collnet and multi:
        chain_graph = _search(consts, chain, system, pattern="tree", min_channels=n, max_channels=n)
        direct_graph = _search(consts, direct, system, pattern="collnet_direct", min_channels=1,
                               max_channels=min(int(search["max_direct_arity"]) + 1, ppn))
    comm_channels = min(int(search["max_channels"]), 2 * n)  # connect.cc 453
    if chain_graph.n_channels and chain_graph.bw_intra_gbps > chain_graph.bw_inter_gbps:  # connect.cc 458-462
        comm_channels = min(int(search["max_channels"]), comm_channels + comm_channels // 2)
    return Graphs(ring, tree, nvls_graph, direct_graph, chain_graph, comm_channels)
