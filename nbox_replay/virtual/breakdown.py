"""The one definition of a replay's breakdown: how one rank spent one iteration (pure, no I/O, no engine).

A rank's iteration window ``[start_us, end_us)`` is cut into four parts that **partition** it exactly
(they add up to ``end_us - start_us``); at every instant the first of these that holds names the part:

1. **compute**: at least one compute operation of the rank runs. Compute intervals are a *union*: two
   streams or threads computing at once count once, and a GPU kernel inside its launching host operator
   is not counted twice;
2. **exposed communication**: no compute, and the rank is inside the modeled span (start to end) of one of
   its collectives or point-to-point operations;
3. **waiting for peers**: none of the above, and the rank has issued a collective that has not started,
   because a participant issued it later or the group's previous collective is still running (from this
   rank's issue to the collective's start);
4. **idle**: the rest (dependencies on the host, issue costs outside any wait, the end of a window the
   rank finished early).

**Overlapped communication** (compute running inside a communication span) is reported beside the four
parts, never in their sum: it is communication the schedule hid.

Per-communication figures use the same sweep: an instant of exposed communication goes to the active span
that started first (the one the rank's communication stream is busy with), an instant of waiting to the
pending operation issued first, so the per-operation figures add up to the rank's totals.

Everything is microseconds on one clock (virtual time, or one measured clock for every rank of a live run).
The entry points: :func:`partition` (one rank, one window), :func:`job_windows` (the job's iteration
windows from every rank's iteration ends), :func:`median_index` (which iteration a report shows).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Breakdown", "CommSpan", "RankIntervals", "job_windows", "median_index", "partition", "slowest_rank"]

#: The parts of the partition, in priority order (the first that holds at an instant names it).
PARTS = ("compute", "exposed_comm", "waiting", "idle")


@dataclass(frozen=True)
class CommSpan:
    """One communication operation as one rank saw it (microseconds): issued at ``issue_us``; the
    collective ran (its modeled or measured span) from ``start_us`` to ``end_us``; ``issue_us <= start_us``
    (an operation with no separate issue has ``issue_us == start_us``)."""

    issue_us: float
    start_us: float
    end_us: float


@dataclass
class RankIntervals:
    """What one rank did, as intervals on one clock (microseconds): the compute operations' ``(start, end)``
    (any thread or stream; overlaps allowed), and its communication operations."""

    compute: list[tuple[float, float]] = field(default_factory=list)
    comms: list[CommSpan] = field(default_factory=list)


@dataclass(frozen=True)
class Breakdown:
    """One rank's partition of one iteration window (module docstring). Microseconds.

    ``compute_us + exposed_comm_us + waiting_us + idle_us == iteration_us`` (up to float rounding);
    ``overlapped_comm_us`` is beside the sum. ``comm_exposed_us``/``comm_waiting_us``: per entry of the
    :class:`RankIntervals`' ``comms``, its share of the exposed and waiting time (they sum to the totals).
    """

    rank: int
    start_us: float
    end_us: float
    compute_us: float
    exposed_comm_us: float
    waiting_us: float
    idle_us: float
    overlapped_comm_us: float
    comm_exposed_us: tuple[float, ...] = ()
    comm_waiting_us: tuple[float, ...] = ()

    @property
    def iteration_us(self) -> float:
        """The window's length: what the four parts add up to."""
        return self.end_us - self.start_us

    def parts_us(self) -> float:
        """compute + exposed comm + waiting + idle (equals :attr:`iteration_us` up to float rounding)."""
        return self.compute_us + self.exposed_comm_us + self.waiting_us + self.idle_us

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "iteration": self.iteration_us, "compute": self.compute_us,
                "exposed_comm": self.exposed_comm_us, "waiting_for_peers": self.waiting_us, "idle": self.idle_us,
                "overlapped_comm": self.overlapped_comm_us}


# event kinds, ordered so that at one instant ends are handled before starts (half-open intervals)
_END, _START = 0, 1
_COMPUTE, _SPAN, _WAIT = 0, 1, 2


def partition(intervals: RankIntervals, start_us: float, end_us: float, *, rank: int = 0) -> Breakdown:
    """Partition the window ``[start_us, end_us)`` of one rank (module docstring); intervals are clipped to it.

    O(n log n) in the intervals that meet the window. A window of zero or negative length is all zeros.
    """
    comms = intervals.comms
    n_comm = len(comms)
    exposed_by = [0.0] * n_comm
    waiting_by = [0.0] * n_comm
    if not end_us > start_us:
        return Breakdown(rank, start_us, max(start_us, end_us), 0.0, 0.0, 0.0, 0.0, 0.0, tuple(exposed_by),
                         tuple(waiting_by))
    events: list[tuple[float, int, int, int]] = []  # (time, end/start, class, comm index)

    def add(s: float, e: float, cls: int, idx: int) -> None:
        s, e = max(s, start_us), min(e, end_us)
        if e > s:
            events.append((s, _START, cls, idx))
            events.append((e, _END, cls, idx))

    for s, e in intervals.compute:
        add(s, e, _COMPUTE, -1)
    for k, c in enumerate(comms):
        add(c.start_us, c.end_us, _SPAN, k)
        add(c.issue_us, min(c.start_us, c.end_us), _WAIT, k)
    events.sort()
    totals = [0.0, 0.0, 0.0, 0.0]  # PARTS order
    overlapped = 0.0
    n_compute = 0
    spans: list[tuple[float, int]] = []  # heap of active spans by (start, index); lazy deletion
    waits: list[tuple[float, int]] = []  # heap of active waits by (issue, index)
    span_on = [False] * n_comm
    wait_on = [False] * n_comm
    n_span = n_wait = 0
    t = start_us
    for when, what, cls, idx in events:
        if when > t:
            dt = when - t
            if n_compute:
                totals[0] += dt
                if n_span:
                    overlapped += dt
            elif n_span:
                totals[1] += dt
                while not span_on[spans[0][1]]:
                    heapq.heappop(spans)
                exposed_by[spans[0][1]] += dt
            elif n_wait:
                totals[2] += dt
                while not wait_on[waits[0][1]]:
                    heapq.heappop(waits)
                waiting_by[waits[0][1]] += dt
            else:
                totals[3] += dt
            t = when
        delta = 1 if what == _START else -1
        if cls == _COMPUTE:
            n_compute += delta
        elif cls == _SPAN:
            n_span += delta
            span_on[idx] = what == _START
            if what == _START:
                heapq.heappush(spans, (comms[idx].start_us, idx))
        else:
            n_wait += delta
            wait_on[idx] = what == _START
            if what == _START:
                heapq.heappush(waits, (comms[idx].issue_us, idx))
    if end_us > t:
        totals[3] += end_us - t
    return Breakdown(rank, start_us, end_us, totals[0], totals[1], totals[2], totals[3], overlapped,
                     tuple(exposed_by), tuple(waiting_by))


def job_windows(rank_ends: Mapping[int, Sequence[float]], origin_us: float = 0.0) -> list[tuple[float, float]]:
    """The job's iteration windows from each rank's iteration ends (absolute times, one per iteration, every
    rank the same count): iteration ``j`` of the job ends when its last rank ends it, and starts where
    iteration ``j - 1`` of the job ended (the first at ``origin_us``). Every rank's breakdown of
    iteration ``j`` partitions this same window, so the windows add up to the run's wall time.

    Raises:
        ValueError: ranks with different iteration counts (a caller's error).
    """
    counts = {len(v) for v in rank_ends.values()}
    if len(counts) > 1:
        raise ValueError(f"ranks report different iteration counts: {sorted(counts)}")
    n = counts.pop() if counts else 0
    windows: list[tuple[float, float]] = []
    prev = origin_us
    for j in range(n):
        end = max(prev, max(v[j] for v in rank_ends.values()))
        windows.append((prev, end))
        prev = end
    return windows


def median_index(times_us: Sequence[float]) -> int:
    """The index of the median iteration: the middle one by time (ties by position); with an even count the
    lower middle one, so the report's iteration time is a real iteration whose parts add up to it."""
    if not times_us:
        raise ValueError("no iterations")
    order = sorted(range(len(times_us)), key=lambda j: (times_us[j], j))
    return order[(len(order) - 1) // 2]


def slowest_rank(rank_ends: Mapping[int, Sequence[float]], j: int) -> int:
    """The rank that ends iteration ``j`` last (the lowest such rank on a tie): the one the job waits for."""
    return max(rank_ends, key=lambda r: (rank_ends[r][j], -r))
