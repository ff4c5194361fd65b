"""Evaluate an ``[[nccl_fit]]`` entry: the time of its collective at a size and node count.

The model and the source of each term are in :mod:`emulator_core.scenario.nccl_fit`'s docstring; this module computes
``floor(N)``, ``K(N)`` and ``T(S, N)`` with NCCL's tuner (:mod:`emulator_core.pricing.nccl_tuner`) for the node-count
scaling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from emulator_core.network import BUS_FACTORS
from emulator_core.pricing.nccl_tuner import nccl_supports, nccl_tune
from emulator_core.scenario import Datasheet, NcclFit, nccl_fit

__all__ = ["Prepared", "between", "between_us", "floor_us", "prepare", "regime_factor", "time_us"]


def _nccl_busbw(collective: str, size: float, nodes: int, gpn: int, fabric: Datasheet) -> float | None:
    """NCCL's modeled bus bandwidth (GB/s) of ``collective`` at nccl-tests size ``size``; None if not modeled."""
    p = nodes * gpn
    if not nccl_supports(collective) or p < 2:
        return None
    n = size / p if collective == "all_gather" else size
    t = nccl_tune(collective, n, p, nodes, intra_bw_gbps=fabric.intra_bw_gbps, inter_bw_gbps=fabric.inter_bw_gbps,
                  nvls=fabric.nvls, collnet=fabric.collnet).time_us
    return size * BUS_FACTORS[collective](p) / (t * 1e3) if t > 0 else None


def _nccl_floor_us(collective: str, size: float, nodes: int, gpn: int, fabric: Datasheet) -> float | None:
    p = nodes * gpn
    if not nccl_supports(collective) or p < 2:
        return None
    n = size / p if collective == "all_gather" else size
    return nccl_tune(collective, n, p, nodes, intra_bw_gbps=fabric.intra_bw_gbps,
                     inter_bw_gbps=fabric.inter_bw_gbps, nvls=fabric.nvls, collnet=fabric.collnet).time_us


def regime_factor(fit: NcclFit, nodes: int, fabric: Datasheet) -> float:
    """``K(N)`` of the module docstring: 1 within the fit's regime, else NCCL's (or the datasheet's) ratio."""
    if nccl_fit.regime(nodes) == nccl_fit.regime(fit.nodes):
        return 1.0
    big = fit.busbw[-1][0] * (fit.ranks if fit.collective in nccl_fit.PER_RANK else 1)
    there = _nccl_busbw(fit.collective, big, nodes, fit.gpus_per_node, fabric)
    here = _nccl_busbw(fit.collective, big, fit.nodes, fit.gpus_per_node, fabric)
    if there is not None and here is not None and here > 0:
        return there / here
    def link(n: int) -> float:
        return fabric.intra_bw_gbps if n == 1 else fabric.inter_bw_gbps
    return link(nodes) / link(fit.nodes)


def floor_us(fit: NcclFit, nodes: int, fabric: Datasheet) -> float:
    """``floor(N)`` of the module docstring."""
    if fit.latency_us == 0 or nodes == fit.nodes:
        return fit.latency_us
    there = _nccl_floor_us(fit.collective, 8.0, nodes, fit.gpus_per_node, fabric)
    here = _nccl_floor_us(fit.collective, 8.0, fit.nodes, fit.gpus_per_node, fabric)
    if there is None or here is None or here <= 0:
        return fit.latency_us
    return fit.latency_us * there / here


@dataclass(frozen=True)
class Prepared:
    """A fit at one node count with its size-independent terms computed once (the floor, the regime factor, the
    bus factor): calling it with an nccl-tests size is a table look-up, cheap enough for every call of a replay."""

    fit: NcclFit
    ranks: int
    floor_us: float
    per_byte_us: float  # factor(p) / (1000 * K / share): the time per byte at a bus bandwidth of 1 GB/s

    def __call__(self, size_bytes: float) -> float:
        if self.ranks < 2:
            return 0.0
        if size_bytes <= 0:
            return self.floor_us
        m = nccl_fit.step_bytes(self.fit.collective, size_bytes, self.ranks)
        return self.floor_us + size_bytes * self.per_byte_us / self.fit.busbw_at(m)


def prepare(fit: NcclFit, nodes: int, fabric: Datasheet) -> Prepared:
    """The fit's model at ``nodes`` nodes of its GPUs per node (``emulator_core.scenario.nccl_fit``'s docstring)."""
    p = nodes * fit.gpus_per_node
    if p < 2:
        return Prepared(fit, p, 0.0, 0.0)
    k = regime_factor(fit, nodes, fabric) if nccl_fit.regime(nodes) != nccl_fit.regime(fit.nodes) else 1.0
    per_byte = BUS_FACTORS[fit.collective](p) * nccl_fit.network_share(fit.collective, nodes) / (1e3 * k)
    return Prepared(fit, p, floor_us(fit, nodes, fabric), per_byte)


def time_us(fit: NcclFit, size_bytes: float, nodes: int, fabric: Datasheet) -> float:
    """The modeled time (us) of the fit's collective at nccl-tests size ``size_bytes`` on ``nodes`` nodes of the
    fit's GPUs per node (``emulator_core.scenario.nccl_fit``'s docstring). 0 bytes cost the floor. One call: use
    :func:`prepare` to price many sizes."""
    return prepare(fit, nodes, fabric)(size_bytes)


def between_us(lo: NcclFit, hi: NcclFit, size_bytes: float, nodes: int, fabric: Datasheet) -> float:
    """The time at ``nodes`` between two fits measured at ``lo.nodes < nodes < hi.nodes``: each one's prediction,
    interpolated linearly in log time over log nodes."""
    return between(prepare(lo, nodes, fabric), prepare(hi, nodes, fabric), nodes)(size_bytes)


def between(lo: Prepared, hi: Prepared, nodes: int) -> Callable[[float], float]:
    """:func:`between_us` with both fits prepared: ``size_bytes -> us``."""
    w = math.log(nodes / lo.fit.nodes) / math.log(hi.fit.nodes / lo.fit.nodes)

    def model(size_bytes: float) -> float:
        t_lo, t_hi = lo(size_bytes), hi(size_bytes)
        if t_lo <= 0 or t_hi <= 0:
            return max(t_lo, t_hi)
        return math.exp((1 - w) * math.log(t_lo) + w * math.log(t_hi))
    return model
