"""The profiler correction's ``segments`` rule: each stretch of a captured iteration between two collectives scaled
to the same stretch of the clean iterations (the rule, and why: :mod:`nbox_replay.inputs.profiler`).

The recorder samples the training thread's CPU time at each collective that thread issues in its clean timed
iterations (nbox_record/capture/segments.py): segment 0 runs from the iteration's start to the first collective,
segment k from collective k to collective k + 1, the last from the last collective to the iteration's end. Here the
captured iteration's training-thread compute nodes are cut the same way, in node order, at the comm nodes on that
thread (the converter puts a collective after the operator it was issued in, on the issuing thread's resource,
nbox_replay/inputs/graph.py), and segment k's nodes are scaled so that their sum is the median of clean segment k.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence

__all__ = ["scale_segments", "segment_medians"]

#: Caps on what a manifest may carry (untrusted input; the bundle reader checks the same).
_MAX_ITERATIONS = 10_000
_MAX_SEGMENTS = 100_000


def _time(x: object) -> bool:
    """A finite, non-negative number of microseconds (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")


def segment_medians(iterations: object, *, runnable: bool = False) -> tuple[float, ...] | None:
    """The median CPU time of each segment over the clean iterations (``clean_segments``: per iteration a list of
    ``[cpu_us, run_queue_us]``; with ``runnable``, the CPU time plus the run-queue time: the thread's time on a CPU
    or waiting for one), over the iterations with the most common number of segments (an iteration that
    issued another number of collectives, e.g. a metric's all-reduce every few steps, cannot be matched segment by
    segment); None when there are none, they are malformed, or no number of segments is shared by more than half
    of the iterations."""
    if not isinstance(iterations, list) or not iterations or len(iterations) > _MAX_ITERATIONS:
        return None
    cpu: list[list[float]] = []
    for segs in iterations:
        if not isinstance(segs, list) or not segs or len(segs) > _MAX_SEGMENTS:
            return None
        row = []
        for seg in segs:
            if not (isinstance(seg, list) and len(seg) == 2 and all(_time(x) for x in seg)):
                return None
            row.append(float(seg[0]) + (float(seg[1]) if runnable else 0.0))
        cpu.append(row)
    counts = collections.Counter(len(row) for row in cpu)
    common, seen = max(counts.items(), key=lambda item: (item[1], -item[0]))
    if 2 * seen <= len(cpu):
        return None
    rows = [row for row in cpu if len(row) == common]
    return tuple(float(statistics.median(column)) for column in zip(*rows, strict=True))


def scale_segments(durations: Sequence[float], corrected: Sequence[bool], cuts: Sequence[bool],
                   iteration: Sequence[int], clean_us: Sequence[float] | None,
                   fallback: Sequence[float]) -> tuple[list[float], dict[int, str]]:
    """``durations`` with the ``corrected`` nodes of each captured iteration scaled segment by segment to
    ``clean_us`` (the clean segments' medians), a segment ending at each node flagged in ``cuts`` (the training
    thread's comm nodes), in node order; ``iteration``: each node's captured iteration.

    A captured iteration whose segment count is not ``len(clean_us)``, or with a segment whose corrected nodes
    sum to 0, keeps ``fallback``'s durations (the one-factor rule's); returns, per such iteration, why."""
    n_clean = len(clean_us) if clean_us else 0
    segment = [0] * len(durations)
    counts: dict[int, int] = {}
    for i, (cut, it) in enumerate(zip(cuts, iteration, strict=True)):
        segment[i] = counts.get(it, 0)
        if cut:
            counts[it] = segment[i] + 1
    totals: dict[tuple[int, int], float] = {}
    for i, (d, c, it) in enumerate(zip(durations, corrected, iteration, strict=True)):
        if c:
            totals[(it, segment[i])] = totals.get((it, segment[i]), 0.0) + d
            counts.setdefault(it, 0)
    why: dict[int, str] = {}
    for it in sorted(counts):
        found = counts[it] + 1
        if not n_clean:
            why[it] = "no clean segments"
        elif found != n_clean:
            why[it] = f"{found} segments captured, {n_clean} clean"
        else:
            empty = [k for k in range(found) if totals.get((it, k), 0.0) <= 0]
            if empty:
                why[it] = f"segment {empty[0]} has no recorded compute"
    out = list(durations)
    for i, (d, c, it) in enumerate(zip(durations, corrected, iteration, strict=True)):
        if not c:
            continue
        if it in why or clean_us is None:
            out[i] = fallback[i]
        else:
            out[i] = d * clean_us[segment[i]] / totals[(it, segment[i])]
    return out, why
