"""NCCL's own tuning model: which (algorithm, protocol) NCCL picks for a collective, and the time it models.

NCCL (``src/graph/tuning.cc``, v2.29.7-1; constants in ``data/nccl_tuning.toml`` with file and line citations)
prices every (algorithm, protocol) as ``time_us = latency_us + nBytes / (1000 * bandwidth_gbps)`` and runs the
cheapest. :func:`nccl_tune` does the same: the graphs from :mod:`emulator_core.network.nccl_graph`, the bandwidths and
latencies from ncclTopoTuneModel, the choice from the minimum. Its conventions:

* ``nbytes`` is nbox's (the per-rank INPUT buffer, :mod:`emulator_core.network.costmodels`); NCCL's ``nBytes`` is
  nccl-tests' "size": ``nranks * nbytes`` for all_gather, ``nbytes`` for the others.
* ``intra_bw_gbps``: a GPU's NVLink line rate to the NVSwitch; ``inter_bw_gbps``: its NIC's; per direction, GB/s
  (1e9 bytes/s; H100: 450 and 50 for 400 Gb/s).
* latencies: ``None`` means NCCL's model exactly. ``inter_latency_us`` is ``graph->latencyInter``, added to each
  inter-node step (twice for Simple); ``intra_latency_us``, an nbox extension, to each intra-node step.
* ``net_protocols`` (``None``: NCCL's three) and ``net_slice_bytes``, per protocol the slice a network hop holds
  before forwarding (an nbox extension, ``emulator_core.network.fabric_kinds``): each network hop on the critical path
  adds ``min(slice, bytes per channel step) / per-channel network bandwidth``.
* ``nnodes``: nodes the group spans (``ppn = nranks / nnodes``); ``nvls``: NVLink SHARP; ``collnet``: InfiniBand
  SHARP; ``arch``: the GPU generation; ``cpu``: the host CPU vendor (the LL bandwidth cap, the network post overhead).

What is assumed rather than read from a real machine: docs/design/nccl-model.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator_core.network import Graph, Graphs, search_graphs
from emulator_core.scenario import toml_loads

__all__ = ["ALGORITHMS", "ARCHS", "COLLECTIVES", "CPUS", "PROTOCOLS", "NcclChoice", "nccl_constants",
           "nccl_supports", "nccl_tune"]

DATA_FILE = Path(__file__).with_name("data") / "nccl_tuning.toml"
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")  # ncclFunc_t order
ARCHS = ("volta", "ampere", "hopper", "blackwell")
CPUS = ("intel", "amd", "arm")


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's pick: ``algorithm`` (one of :data:`ALGORITHMS`), ``protocol`` (one of :data:`PROTOCOLS`), its
    modeled ``time_us``, and every enabled candidate as ``(algorithm, protocol, time_us)`` in NCCL's order."""

    algorithm: str
    protocol: str
    time_us: float
    candidates: tuple[tuple[str, str, float], ...]


@functools.cache
def nccl_constants() -> dict[str, Any]:
    """The parsed ``data/nccl_tuning.toml`` (read once)."""
    return toml_loads()(DATA_FILE.read_text(encoding="utf-8"))


def nccl_supports(collective: str) -> bool:
    """Whether NCCL's tuner models ``collective`` (its five collectives; send/recv, all_to_all are p2p)."""
    return collective in COLLECTIVES


def _index2(nnodes: int) -> int:
    return nnodes - 1 if nnodes <= 2 else 2  # tuning.cc 251


def log2i(n: int) -> int:
    """NCCL's log2i: floor(log2(n)) for n >= 1, -1 for 0 (utils.h 49, bitops.h log2Down)."""
    return int(n).bit_length() - 1


@dataclass(frozen=True)
class _Ctx:
    collective: str
    nranks: int
    nnodes: int
    ppn: int
    arch: str
    cpu: str
    nvls: bool
    collnet: bool
    graphs: Graphs
    intra_extra_us: float
    latency_inter_us: float
    net_slices: tuple[float, float, float] | None = None

    @property
    def nsteps(self) -> int:  # tuning.cc 269-271
        if self.collective == "all_reduce":
            return 2 * (self.nranks - 1)
        return self.nranks - 1 if self.collective in ("all_gather", "reduce_scatter") else self.nranks


def _algorithm_applies(c: _Ctx, a: str) -> bool:
    """tuning.cc 274-278 (which algorithms a collective has), updateCollCostTable (enqueue.cc 1908-1915) and
    the disables of tuning.cc 463-477."""
    coll = c.collective
    if coll in ("broadcast", "reduce") and a != "ring":
        return False
    if coll in ("all_gather", "reduce_scatter") and a not in ("pat", "ring", "nvls", "collnet_direct"):
        return False
    if coll == "all_reduce" and a == "pat":
        return False
    if a in ("collnet_direct", "collnet_chain"):
        max_local = int(nccl_constants()["search"]["max_direct_arity"]) + 1
        return c.collnet and c.nnodes > 1 and c.ppn <= max_local and c.graphs.for_algorithm(a).n_channels > 0
    if a in ("nvls", "nvls_tree"):
        arity = int(nccl_constants()["search"]["max_nvls_arity"])
        if c.graphs.nvls.n_channels == 0 or (coll != "all_reduce" and c.ppn > arity):
            return False
        if a == "nvls_tree":
            return c.nnodes > 1
        return c.nnodes == 1 or c.collnet  # NVLS across nodes is NVLS + SHARP (enqueue.cc 1911)
    return True


def _bus_bandwidth(c: _Ctx, a: str, p: str, g: Graph) -> float:
    """tuning.cc 280-344: the bus bandwidth (GB/s) of ``a`` / ``p``; 0 means disabled."""
    k = nccl_constants()
    ref, arch, i2, coll = k["refinements"], c.arch, _index2(c.nnodes), c.collective
    gather = coll in ("all_gather", "reduce_scatter")
    if a in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain") and p != "Simple":
        return 0.0  # 281, 312-313
    if a == "pat" and (p != "Simple" or c.ppn != 1):
        return 0.0  # 282-283: ncclPatEnable needs one GPU per node
    ll_row = arch if c.nnodes == 1 else ("ampere" if c.cpu == "amd" else "volta")  # 253-254
    ll_max = float(k["ll_max_gbps"][ll_row][i2])
    collnet_algo = a in ("collnet_direct", "collnet_chain")
    bw = g.bw_intra_gbps if c.nnodes <= 2 or collnet_algo else g.bw_inter_gbps  # 285
    if a in ("nvls", "nvls_tree"):  # 286-301
        if g.n_channels < 2:
            return 0.0
        intra = g.bw_intra_gbps * float(k["nvls_efficiency"][arch]) * (g.n_channels - 1) / g.n_channels
        intra *= float(ref["nvls_all_reduce_pipeline_factor"]) if coll == "all_reduce" else (c.ppn - 1) / c.ppn
        inter = g.bw_inter_gbps * (2 if c.nnodes <= 2 and a == "nvls_tree" else 1)
        bw = min(intra, inter, float(k["per_channel_max_nvls_tree_gbps"][arch][i2]) if a == "nvls_tree" else math.inf)
    bus = g.n_channels * bw  # 302
    if a == "ring" and p == "LL":  # 305-311
        bus = min(ll_max, bus * float(ref["ring_ll_bw_factor"]))
    if a == "ring" and p == "LL128":
        bus = min(bus * float(ref["ring_ll128_bw_factor"]),
                  g.n_channels * float(k["per_channel_max_ring_ll128_gbps"][arch][i2]))
    if a == "tree" and coll == "all_reduce":
        bus = min(bus * float(ref["tree_all_reduce_bw_factor"]),
                  g.n_channels * float(k["per_channel_max_tree_gbps"][arch][i2]))
    if a == "tree" and p == "LL":
        bus = min(bus / float(ref["tree_ll_bw_divisor"]), ll_max)
    if a == "tree" and p == "LL128":
        factor = ref["tree_ll128_bw_factor_one_node"] if c.nnodes == 1 else ref["tree_ll128_bw_factor_nodes"]
        bus = min(bus * float(factor), g.n_channels * float(k["per_channel_max_tree_ll128_gbps"][arch][i2]))
    if a == "pat":
        bus *= float(ref["pat_bw_factor"])
    if a == "collnet_direct":  # 314-324
        if gather:
            bus = c.ppn * min(g.bw_intra_gbps, g.bw_inter_gbps * float(ref["collnet_direct_gather_inter_factor"]))
        else:
            factor = c.ppn / g.n_channels
            factor -= (factor - 1) / 2
            bus /= factor
            if int(k["compute_capability"][arch]) >= 90:
                bus *= float(ref["collnet_direct_hopper_bw_factor"])
    if a in ("nvls", "collnet_direct") and gather and c.nnodes > 1 and not c.collnet:
        bus = 0.0  # 327-344: across nodes these need the CollNet plugin
    if not (a != "ring" and gather):  # 346-352: bus bandwidth -> algorithm bandwidth
        bus *= c.nranks / c.nsteps if a in ("ring", "nvls", "nvls_tree") else float(ref["tree_ratio"])
    return bus


def _net_overhead_us(c: _Ctx) -> float:
    return float(nccl_constants()["net_overhead_us"]["other" if c.cpu == "arm" else c.cpu])  # tuning.cc 215-220


def _latency_us(c: _Ctx, a: str, p: str, g: Graph) -> float:
    """tuning.cc 354-402: the latency (us) of ``a`` / ``p``."""
    k = nccl_constants()
    pi, hw, ref, coll = PROTOCOLS.index(p), k["hw_latency_us"], k["refinements"], c.collective
    lat = float(k["base_latency_us"][a][pi])
    intra = float(hw["nvlink"][a][pi]) + c.intra_extra_us
    inter = float(hw["net"]["tree" if c.ppn == 1 else a][pi]) + c.latency_inter_us
    if p == "Simple":
        inter += c.latency_inter_us  # 360: the flush
    log_nodes = log2i(c.nnodes)
    if a == "ring":
        kind = "nvlink" if c.nnodes == 1 else "net"
        step = float(hw[kind][a][pi]) + (c.intra_extra_us if c.nnodes == 1 else 0.0)
        if coll in ("broadcast", "reduce"):
            if g.same_channels:
                return lat + step
            if p == "Simple":
                step = float(hw[kind]["tree"][pi]) + (c.intra_extra_us if c.nnodes == 1 else 0.0)
            return lat + c.nsteps * step
        overhead = 0.0
        if c.nnodes > 1:
            overhead = _net_overhead_us(c) * (float(ref["net_overhead_simple_factor"]) if p == "Simple" else 1.0)
        intra = max(intra, overhead)
        n_inter = 0 if c.nnodes == 1 else (2 * (c.nnodes - 1) if coll == "all_reduce" else c.nnodes - 1)
        return lat + (c.nsteps - n_inter) * intra + n_inter * inter
    if a == "tree":
        return lat + (2 * ((c.ppn - 1) * intra + log_nodes * inter) if coll == "all_reduce" else 0.0)
    if a == "collnet_direct":
        arity = float(ref["collnet_direct_arity_latency_us"])
        return lat + 2 * (min(1, c.ppn - 1) * intra + (c.ppn - 1) * arity) + inter
    if a == "collnet_chain":
        return lat + 2 * (c.ppn - 1) * intra + inter
    if a == "nvls":
        return intra + (inter if c.nnodes > 1 else 0.0)
    if a == "nvls_tree":
        return lat + intra + 2 * log_nodes * inter
    if coll in ("all_gather", "reduce_scatter"):  # pat
        return (lat + log_nodes * (inter / float(ref["pat_log_latency_divisor"]))
                + c.nranks * float(ref["pat_linear_latency_us"]))
    return lat


def _net_hops(c: _Ctx, a: str) -> int:
    """The network hops on ``a``'s critical path over ``c.nnodes`` nodes (as :func:`_latency_us` counts them)."""
    log_nodes = max(1, log2i(c.nnodes))
    if a == "ring":
        return 2 * (c.nnodes - 1) if c.collective == "all_reduce" else c.nnodes - 1
    if a in ("tree", "nvls_tree"):
        return 2 * log_nodes if c.collective == "all_reduce" else log_nodes
    if a == "pat":
        return log_nodes
    return 2 if c.collective == "all_reduce" else 1  # collnet, nvls across nodes: up to the switch and back


def _fill_us(c: _Ctx, a: str, p: str, nccl_bytes: float) -> float:
    """The network hops' store-and-forward slices (module docstring, ``net_slice_bytes``): each hop on the critical
    path holds one slice (at most what a channel moves per step) before forwarding it, at the channel's network
    bandwidth."""
    if c.net_slices is None or c.nnodes == 1:
        return 0.0
    g = c.graphs.for_algorithm(a)
    channels = max(1, g.n_channels)
    per_step = nccl_bytes / channels / (c.nranks if a == "ring" and c.collective not in ("broadcast", "reduce")
                                        else 1)
    chunk = min(c.net_slices[PROTOCOLS.index(p)], per_step)
    bw = g.bw_inter_gbps if g.bw_inter_gbps > 0 else g.bw_intra_gbps
    return _net_hops(c, a) * chunk / (1000.0 * bw) if bw > 0 else 0.0


def _algo_time_us(c: _Ctx, a: str, p: str, bw: float, lat: float, nccl_bytes: float) -> float:
    """ncclTopoGetAlgoTime (tuning.cc 587-605) with numPipeOps = 1, plus :func:`_fill_us`."""
    k = nccl_constants()
    ref = k["refinements"]
    log_size = log2i(int(nccl_bytes) >> 6)
    factors = k["tree_correction_factor"][p]
    if a == "tree" and c.collective == "all_reduce" and 0 <= log_size < 23:
        bw *= float(factors[log_size])
    if (a == "nvls_tree" and c.collective == "all_reduce" and 0 <= log_size < 24
            and int(k["compute_capability"][c.arch]) >= 100 and c.cpu in ("intel", "amd")):
        bw *= float(factors[log_size])
    if (a == "ring" and p == "Simple" and c.nnodes > 1 and c.collective == "all_reduce"
            and int(nccl_bytes) // (c.graphs.comm_channels * c.nranks) >= int(ref["ring_plateau_min_bytes"])):
        cc = int(k["compute_capability"][c.arch])
        lat *= float(ref["ring_plateau_latency_factor" if cc >= 80 else "ring_plateau_latency_factor_pre_ampere"])
    return lat + nccl_bytes / (1000.0 * bw) + _fill_us(c, a, p, nccl_bytes)


def _check_number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} = {value!r}: must be {'> 0' if positive else '>= 0'}")
    return float(value)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} = {value!r}: must be an integer >= 1")
    return value


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} = {value!r}: must be one of {', '.join(allowed)}")
    return value


@functools.lru_cache(maxsize=256)
def _graphs(arch: str, ppn: int, nnodes: int, nvlink_gbps: float, nic_gbps: float, nvls: bool,
            collnet: bool) -> Graphs:
    """NCCL's channel search for one system shape, once per process (every collective and group of that shape on
    that system gets the same graphs, as in NCCL, which searches once per communicator)."""
    return search_graphs(nccl_constants(), arch=arch, ppn=ppn, nnodes=nnodes, nvlink_gbps=nvlink_gbps,
                         nic_gbps=nic_gbps, nvls=nvls, collnet=collnet)


@dataclass(frozen=True)
class NcclPlan:
    """Everything of NCCL's model that does not depend on the size, for one (collective, ranks, nodes, system):
    the channel search and each applicable (algorithm, protocol)'s bus bandwidth and latency. Call it with a
    size (:meth:`choose`) to get :class:`NcclChoice`; :func:`nccl_tune` is plan-then-choose in one call."""

    collective: str
    ctx: _Ctx
    options: tuple[tuple[str, str, float, float], ...]  # (algorithm, protocol, bus GB/s, latency us)

    def choose(self, nbytes: float) -> NcclChoice:
        """NCCL's choice and modeled time (us) for ``nbytes`` (per-rank input); ``ValueError`` on a bad size."""
        size = _check_number("nbytes", nbytes, positive=False)
        if self.ctx.nranks == 1:  # updateCollCostTable (enqueue.cc 1903-1906)
            return NcclChoice("ring", "Simple", 0.0, (("ring", "Simple", 0.0),))
        nccl_bytes = size * self.ctx.nranks if self.collective == "all_gather" else size
        candidates = tuple((a, p, _algo_time_us(self.ctx, a, p, bw, lat, nccl_bytes))
                           for a, p, bw, lat in self.options)
        best = candidates[0]
        for cand in candidates[1:]:
            if cand[2] < best[2]:  # topoGetAlgoInfo: strict <, so the first in NCCL's order wins ties
                best = cand
        return NcclChoice(best[0], best[1], best[2], candidates)


def nccl_plan(collective: str, nranks: int, nnodes: int, *, intra_bw_gbps: float, inter_bw_gbps: float,
              intra_latency_us: float | None = None, inter_latency_us: float | None = None, nvls: bool = False,
              collnet: bool = False, arch: str = "hopper", cpu: str = "intel",
              net_protocols: tuple[str, ...] | None = None,
              net_slice_bytes: tuple[float, float, float] | None = None) -> NcclPlan:
    """The size-independent part of :func:`nccl_tune` (same arguments but the size); ``ValueError`` naming the bad
    argument and value."""
    if not nccl_supports(collective):
        raise ValueError(f"collective = {collective!r}: NCCL's tuner models only {', '.join(COLLECTIVES)}")
    nranks = _check_int("nranks", nranks)
    nnodes = _check_int("nnodes", nnodes)
    if nranks % nnodes:
        raise ValueError(f"nnodes = {nnodes!r}: must divide nranks = {nranks} (GPUs per node)")
    intra_bw = _check_number("intra_bw_gbps", intra_bw_gbps, positive=True)
    inter_bw = _check_number("inter_bw_gbps", inter_bw_gbps, positive=True)
    intra_extra = lat_inter = 0.0
    if intra_latency_us is not None:
        intra_extra = _check_number("intra_latency_us", intra_latency_us, positive=False)
    if inter_latency_us is not None:
        lat_inter = _check_number("inter_latency_us", inter_latency_us, positive=False)
    for flag, value in (("nvls", nvls), ("collnet", collnet)):
        if not isinstance(value, bool):
            raise ValueError(f"{flag} = {value!r}: must be true or false")
    arch = _check_choice("arch", arch, ARCHS)
    cpu = _check_choice("cpu", cpu, CPUS)
    if net_protocols is not None:
        net_protocols = tuple(_check_choice("net_protocols", q, PROTOCOLS) for q in net_protocols)
        if not net_protocols:
            raise ValueError("net_protocols = (): needs at least one protocol")
    slices = None if net_slice_bytes is None else \
        tuple(_check_number("net_slice_bytes", v, positive=True) for v in net_slice_bytes)
    if slices is not None and len(slices) != len(PROTOCOLS):
        raise ValueError(f"net_slice_bytes = {net_slice_bytes!r}: needs one size per protocol (LL, LL128, Simple)")
    k = nccl_constants()
    ppn = nranks // nnodes
    nvlink_gbps = intra_bw * float(k["nvlink_link_gbps"][arch]) / float(k["assumed"]["nvlink_nominal_link_gbps"][arch])
    nic_gbps = min(inter_bw, float(k["assumed"]["gpu_nic_pcie_gbps"][arch]))
    graphs = _graphs(arch, ppn, nnodes, nvlink_gbps, nic_gbps, nvls, collnet)
    ctx = _Ctx(collective, nranks, nnodes, ppn, arch, cpu, nvls, collnet, graphs, intra_extra, lat_inter,
               None if slices is None else (slices[0], slices[1], slices[2]))
    options: list[tuple[str, str, float, float]] = []
    if nranks > 1:
        for a in ALGORITHMS:
            if not _algorithm_applies(ctx, a):
                continue
            g = graphs.for_algorithm(a)
            for p in PROTOCOLS:
                if nnodes > 1 and net_protocols is not None and p not in net_protocols:
                    continue
                bw = _bus_bandwidth(ctx, a, p, g)
                if bw > 0:
                    options.append((a, p, bw, _latency_us(ctx, a, p, g)))
    return NcclPlan(collective, ctx, tuple(options))


def nccl_tune(collective: str, nbytes: float, nranks: int, nnodes: int, *, intra_bw_gbps: float,
              inter_bw_gbps: float, intra_latency_us: float | None = None, inter_latency_us: float | None = None,
              nvls: bool = False, collnet: bool = False, arch: str = "hopper", cpu: str = "intel") -> NcclChoice:
    """NCCL's (algorithm, protocol) for ``collective`` on ``nbytes`` (per-rank input) over ``nranks`` ranks on
    ``nnodes`` nodes, and its modeled time in microseconds. Conventions: see the module docstring.

    Raises ``ValueError`` naming the bad argument and value.
    """
    _check_number("nbytes", nbytes, positive=False)
    return nccl_plan(collective, nranks, nnodes, intra_bw_gbps=intra_bw_gbps, inter_bw_gbps=inter_bw_gbps,
                     intra_latency_us=intra_latency_us, inter_latency_us=inter_latency_us, nvls=nvls,
                     collnet=collnet, arch=arch, cpu=cpu).choose(nbytes)
