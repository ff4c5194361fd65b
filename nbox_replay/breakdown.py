"""The one definition of an iteration's breakdown, per rank: a pure function over intervals (microseconds).

Every instant ``t`` of a rank's iteration ``[start_us, end_us)`` is counted in exactly one part, by the
first rule that holds:

1. **compute**: at least one compute interval of the rank covers ``t`` (intervals are merged first, so
   parallel threads or streams, and a GPU kernel inside the host op that launched it, count once);
2. **exposed comm**: no compute, and ``t`` lies inside the modeled span ``[start, end)`` of one of the
   rank's collectives (the collective is running and nothing hides it);
3. **waiting for peers**: no compute, no running collective, and ``t`` lies inside ``[issue, start)`` of
   one of the rank's collectives: it was issued but has not started, because a participant or the
   group's previous collective is late;
4. **idle**: everything else (issue costs, host overhead, gaps the trace leaves).

So compute + exposed comm + waiting + idle = ``end_us - start_us`` exactly (up to float rounding), with no
clamping. **Overlapped comm** is reported beside the sum, not in it: the time inside a collective's
modeled span while compute runs. Intervals are clipped to the iteration; empty or inverted ones count
nothing. The same function serves the live replay (intervals the workers measured on their clock) and can
serve the virtual one (intervals of the simulated timeline).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Breakdown", "CommSpan", "merge", "partition"]


@dataclass(frozen=True)
class CommSpan:
    """One collective (or send/recv) of a rank, microseconds on the rank's clock: issued at ``issue_us``,
    running (modeled) from ``start_us`` to ``end_us``."""

    issue_us: float
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Breakdown:
    """One rank's iteration cut into parts (module docstring), microseconds. The four first parts sum to
    ``iteration_us``; ``overlapped_comm_us`` is beside them."""

    iteration_us: float
    compute_us: float
    exposed_comm_us: float
    waiting_us: float
    idle_us: float
    overlapped_comm_us: float

    def to_dict(self) -> dict[str, float]:
        return {"iteration": self.iteration_us, "compute": self.compute_us, "exposed_comm": self.exposed_comm_us,
                "waiting_for_peers": self.waiting_us, "idle": self.idle_us,
                "overlapped_comm": self.overlapped_comm_us}

    @staticmethod
    def mean(parts: Sequence[Breakdown]) -> Breakdown:
        """The part-wise mean of ``parts`` (still a partition of the mean iteration); ValueError when empty."""
        if not parts:
            raise ValueError("the mean of no breakdowns")
        n = float(len(parts))
        return Breakdown(*(sum(getattr(p, f) for p in parts) / n for f in
                           ("iteration_us", "compute_us", "exposed_comm_us", "waiting_us", "idle_us",
                            "overlapped_comm_us")))


def merge(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of ``intervals`` clipped to ``[lo, hi)``, as sorted disjoint ``(start, end)`` pairs."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    out: list[tuple[float, float]] = []
    for a, b in clipped:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(xs: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in xs)


def _minus(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``xs`` without ``ys`` (both sorted and disjoint)."""
    out: list[tuple[float, float]] = []
    j = 0
    for a, b in xs:
        cur = a
        while j < len(ys) and ys[j][1] <= cur:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def partition(start_us: float, end_us: float, compute: Iterable[tuple[float, float]],
              comms: Iterable[CommSpan]) -> Breakdown:
    """Cut the iteration ``[start_us, end_us)`` of one rank into its parts (module docstring).

    Args:
        start_us, end_us: the iteration's bounds on the rank's clock (microseconds).
        compute: ``(start, end)`` of every compute interval of the rank (any thread or stream).
        comms: every collective and send/recv the rank took part in.
    """
    total = max(0.0, end_us - start_us)
    spans = list(comms)
    busy = merge(compute, start_us, end_us)
    running = merge(((c.start_us, c.end_us) for c in spans), start_us, end_us)
    pending = merge(((c.issue_us, c.start_us) for c in spans), start_us, end_us)
    exposed = _minus(running, busy)
    waiting = _minus(_minus(pending, busy), running)
    compute_us = _length(busy)
    exposed_us = _length(exposed)
    waiting_us = _length(waiting)
    return Breakdown(total, compute_us, exposed_us, waiting_us, total - compute_us - exposed_us - waiting_us,
                     _length(running) - exposed_us)
