"""NCCL's all-to-all as NCCL runs it: a group of point-to-point sends and receives, one pair per peer.

NCCL has no all-to-all algorithm and its tuner prices none: nccl-tests' ``alltoall_perf`` and PyTorch's
``ProcessGroupNCCL::alltoall_base`` post one ``ncclSend`` and one ``ncclRecv`` per peer inside a group, and NCCL
schedules them together (``src/enqueue.cc``; since 2.12 every peer fits one round when the channels allow,
``src/graph/paths.cc`` ncclTopoComputeP2pChannels). Per rank, for a send buffer of ``S`` bytes over ``p`` ranks on
nodes of ``g`` GPUs (``m = S / p`` to each peer):

* the ``g - 1`` peers on the node are reached over NVLink P2P, concurrently with the network:
  ``nvlink latency + (g - 1) m / nvlink bandwidth``;
* the ``p - g`` peers on other nodes all leave through the GPU's NIC, so it carries ``(p - g) m`` each way:
  ``(p - g) m / NIC bandwidth``;
* the proxy hands each peer's bytes to the network in ``p2p_chunk_bytes`` messages (NCCL's
  ``NCCL_P2P_NET_CHUNKSIZE``, 128 KiB by default, ``src/init.cc`` computeBuffSizes), and each message costs NCCL's
  per-message network overhead (``getNetOverhead``, ``src/graph/tuning.cc``: 1 us on Intel hosts, 2 us on AMD),
  ``ceil(m / chunk)`` sends plus one receive post per network peer, serial with the stream: the overhead is what
  keeps a NIC below its line rate at large sizes, and the per-peer post is what makes thousands of peers cost more
  than eight at small ones;
* once: NCCL's network hardware latency for Simple (``hwLat[NET]``), the fabric's own per-message latency twice
  (NCCL's ``latencyInter`` for Simple, as its tuner counts it for a collective), and the first message's
  store-and-forward through the proxy at the NIC's rate.

The time is the slower of the NVLink part and the network part. What is left out: NCCL's channel count per peer
(every peer is taken to run at once), the switch's behaviour under thousands of concurrent flows, and uneven
all-to-all-v splits (priced as an even exchange of the larger of the bytes sent and received). How it compares with
measured all-to-all curves: ``python bench/nccl_tests_fit.py`` (docs/results.md, "nccl-tests curves").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from emulator_core.pricing.nccl_tuner import ARCHS, CPUS, nccl_constants

__all__ = ["DEFAULT_P2P_CHUNK_BYTES", "nccl_all_to_all_us"]

#: NCCL's ``NCCL_P2P_NET_CHUNKSIZE`` default (src/init.cc: ``1 << 17``).
DEFAULT_P2P_CHUNK_BYTES = 1 << 17


def _positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} = {value!r}: must be a finite number > 0")
    return float(value)


def _peer_bytes(nbytes: float, nranks: int, send_bytes: Sequence[float] | None = None,
               recv_bytes: Sequence[float] | None = None) -> float:
    """The bytes each peer gets: ``nbytes / nranks``, or for all-to-all-v the larger of the sums sent and received
    spread evenly over the ``nranks - 1`` peers."""
    if send_bytes is None and recv_bytes is None:
        return nbytes / nranks
    sizes = [*(send_bytes or ()), *(recv_bytes or ())]
    if any(not math.isfinite(v) or v < 0 for v in sizes):
        raise ValueError(f"send_bytes / recv_bytes: every entry must be a finite number >= 0, got {sizes!r}")
    total = max(sum(send_bytes or ()), sum(recv_bytes or ()))
    return total / max(1, nranks - 1)


def nccl_all_to_all_us(nbytes: float, nranks: int, nnodes: int, *, intra_bw_gbps: float, inter_bw_gbps: float,
                       inter_latency_us: float = 0.0, cpu: str = "intel", arch: str = "hopper",
                       chunk_bytes: float = DEFAULT_P2P_CHUNK_BYTES,
                       send_bytes: Sequence[float] | None = None,
                       recv_bytes: Sequence[float] | None = None) -> float:
    """Microseconds of NCCL's all-to-all of a per-rank send buffer ``nbytes`` over ``nranks`` ranks on ``nnodes``
    nodes (module docstring). Bandwidths in GB/s per GPU per direction, as NCCL's tuner takes them (the NVLink
    figure is the line rate; the NIC is capped by its PCIe link as in the tuner). ``ValueError`` names a bad
    argument."""
    if not isinstance(nranks, int) or not isinstance(nnodes, int) or nranks < 1 or nnodes < 1 or nranks % nnodes:
        raise ValueError(f"nranks = {nranks!r}, nnodes = {nnodes!r}: need whole ranks on every node")
    if cpu not in CPUS or arch not in ARCHS:
        raise ValueError(f"cpu = {cpu!r}, arch = {arch!r}: known {', '.join(CPUS)} / {', '.join(ARCHS)}")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes = {nbytes!r}: must be a finite number >= 0")
    chunk = _positive("chunk_bytes", chunk_bytes)
    if nranks == 1:
        return 0.0
    k = nccl_constants()
    nvlink = _positive("intra_bw_gbps", intra_bw_gbps) * float(k["nvlink_link_gbps"][arch]) \
        / float(k["assumed"]["nvlink_nominal_link_gbps"][arch])
    nic = min(_positive("inter_bw_gbps", inter_bw_gbps), float(k["assumed"]["gpu_nic_pcie_gbps"][arch]))
    ppn = nranks // nnodes
    m = _peer_bytes(nbytes, nranks, send_bytes, recv_bytes)
    hw = k["hw_latency_us"]
    simple = 2  # the protocols' order in NCCL's tables: LL, LL128, Simple
    on_node = float(hw["nvlink"]["ring"][simple]) + (ppn - 1) * m / (1000.0 * nvlink) if ppn > 1 else 0.0
    if nnodes == 1:
        return on_node
    peers = nranks - ppn
    overhead = float(k["net_overhead_us"]["other" if cpu == "arm" else cpu])
    messages = peers * (math.ceil(m / chunk) + 1) if m > 0 else peers
    network = (float(hw["net"]["ring"][simple]) + 2.0 * inter_latency_us + min(chunk, m) / (1000.0 * nic)
               + peers * m / (1000.0 * nic) + messages * overhead)
    return max(on_node, network)
