"""nccl-tests' bandwidth figures of a collective's modeled time: algbw and busbw, in GB/s (1e9 bytes/s).

Source: nccl-tests ``doc/PERFORMANCE.md``. ``nbytes`` is costmodels' convention (the per-rank input); algbw
divides nccl-tests' "size" (``p * nbytes`` for all_gather, gather, scatter; 0 for barrier) by the time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from emulator_core.network import costmodels as cm

__all__ = ["algorithm_bandwidth_gbps", "bus_bandwidth_gbps"]

#: nccl-tests busbw factor per collective (doc/PERFORMANCE.md), as a function of p.
_BUS_FACTOR: Mapping[str, Callable[[int], float]] = MappingProxyType(
    {
        "all_reduce": lambda p: 2 * (p - 1) / p,
        "reduce_scatter": lambda p: (p - 1) / p,
        "all_gather": lambda p: (p - 1) / p,
        "all_to_all": lambda p: (p - 1) / p,
        "all_to_all_v": lambda p: (p - 1) / p,
        "gather": lambda p: (p - 1) / p,
        "scatter": lambda p: (p - 1) / p,
        "broadcast": lambda p: 1.0,
        "reduce": lambda p: 1.0,
        "send_recv": lambda p: 1.0,
        "barrier": lambda p: 0.0,
    }
)


def algorithm_bandwidth_gbps(collective: str, nbytes: float, p: int, time_us: float) -> float:
    """nccl-tests algbw in GB/s (1e9 bytes/s): its "size" / time; size is p·n for all_gather/gather/scatter."""
    cm.algorithms_for(collective)
    n = cm.check_finite("nbytes", nbytes)
    t = cm.check_finite("time_us", time_us)
    if t <= 0:
        raise ValueError(f"time_us must be > 0, got {time_us!r}")
    size = p * n if collective in ("all_gather", "gather", "scatter") else n
    if collective == "barrier":
        size = 0.0
    return size / t / cm.BYTES_PER_US_PER_GBPS


def bus_bandwidth_gbps(collective: str, nbytes: float, p: int, time_us: float) -> float:
    """nccl-tests busbw in GB/s (1e9 bytes/s): ``algbw · factor``.

    Factors (nccl-tests doc/PERFORMANCE.md): all_reduce ``2(p-1)/p``; all_gather, reduce_scatter,
    all_to_all(_v), gather, scatter ``(p-1)/p``; broadcast, reduce, send_recv 1; barrier 0 (no data).
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an int >= 1, got {p!r}")
    return algorithm_bandwidth_gbps(collective, nbytes, p, time_us) * _BUS_FACTOR[collective](p)
