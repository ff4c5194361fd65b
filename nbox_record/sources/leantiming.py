"""Operator times from the lean pass: iterations profiled by Kineto alone, mapped onto the captured operators.

With ``nbox record --lean-iterations L`` (off by default), the L iterations before the capture run under Kineto only
(CPU activity, no shapes, no ET observer), and each captured top-level operator takes the median duration of its
counterparts there (:func:`lean_times`, a :class:`LeanTime` per operator).

Counterparts: both passes are read the same way (:func:`top_sequences`). An iteration is the span between two of
nbox's boundary markers; on each thread its top-level events are the ``cpu_op`` events not inside an earlier one
(``record_function`` scopes are not operators), and an event's key is ``(thread, name, k)``: the k-th top-level
event of that name on that thread in its iteration. A captured event whose key no lean iteration has keeps its
recorded duration, and the replay's profiler correction still applies to it.

The gap: each key also carries the time on its thread from the end of the previous top-level event (or the
iteration's opening marker) to its start, the framework's work between operators, which the replay charges to the
thread before the operator (``nbox_gap_micros``). A thread that runs backward events while the training thread
waits for it (:func:`_handoff_threads`: a CUDA backward on the autograd engine's device thread) and the training
thread are one timeline: a gap there runs from the previous event on either, and is marked ``joined``
(``nbox_gap_joined``), so the replay starts it once the other thread's work its node depends on has ended.

All times microseconds. Nothing here reads files: :mod:`nbox_record.sources.kineto` does. Why the pass exists, and
why it is off by default: docs/design/lean-pass.md.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nbox_record.handoff import BOUNDARY_MARKER
from nbox_record.sources.kineto import CpuEvent, KinetoTrace

__all__ = ["LeanTime", "Key", "lean_times", "top_sequences"]

#: (thread, operator name, occurrence of that name among the thread's top-level events in its iteration)
Key = tuple[tuple[str, str], str, int]


@dataclass(frozen=True)
class LeanTime:
    """One captured operator's lean figures: median duration and gap before it (us), over ``samples`` iterations;
    ``joined``: the gap was measured on its thread's timeline joined with a thread it hands work to, or is handed
    work by (:func:`_handoff_threads`; in most of the lean iterations), so the replay starts it once that other
    thread's work its node waited for has ended (``nbox_gap_joined``, nbox_replay/virtual/engine.py)."""

    duration_us: float
    gap_us: float
    samples: int
    joined: bool = False


def top_sequences(cpu: Sequence[CpuEvent]) -> list[dict[Key, int]]:
    """Per iteration (between consecutive boundary markers, in time order): each top-level ``cpu_op`` event's key
    and its index in ``cpu``. Events outside every iteration are left out."""
    bounds = sorted(ev.ts for ev in cpu if ev.name == BOUNDARY_MARKER)
    if len(bounds) < 2:
        return []
    order = sorted((i for i, ev in enumerate(cpu) if ev.cat == "cpu_op"),
                   key=lambda i: (cpu[i].thread, cpu[i].ts, -cpu[i].dur))
    out: list[dict[Key, int]] = [{} for _ in range(len(bounds) - 1)]
    counts: list[dict[tuple[tuple[str, str], str], int]] = [{} for _ in out]
    thread: tuple[str, str] | None = None
    open_end = -1.0
    for i in order:
        ev = cpu[i]
        if ev.thread != thread:
            thread, open_end = ev.thread, -1.0
        if ev.ts < open_end:
            continue  # inside the top-level event still open on this thread
        open_end = ev.end
        j = bisect.bisect_right(bounds, ev.ts) - 1
        if not 0 <= j < len(out) or ev.end > bounds[j + 1]:
            continue  # before the first marker, after the last, or across one
        name_key = (ev.thread, ev.name)
        k = counts[j].get(name_key, 0)
        counts[j][name_key] = k + 1
        out[j][(ev.thread, ev.name, k)] = i
    return out


#: The top-level events of a backward pass run by the autograd engine (``evaluate_function`` of each node).
AUTOGRAD_EVENT = "autograd::engine::evaluate_function:"


def _handoff_threads(cpu: Sequence[CpuEvent], iteration: dict[Key, int],
                     training: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The threads that work while a training thread waits for them: each runs at least one backward event
    (:data:`AUTOGRAD_EVENT`) and none of its top-level events overlaps a training thread's. On a CUDA rank the
    autograd engine runs the backward on its device thread while the caller blocks in ``backward()``; on a CPU rank
    the caller runs it itself, and there is no such thread (docs/design/lean-pass.md)."""
    spans = sorted((cpu[i].ts, cpu[i].end) for key, i in iteration.items() if key[0] in training)
    starts = [s for s, _ in spans]
    reach: list[float] = []  # the latest end among the spans starting at or before each one
    for _, end in spans:
        reach.append(max(end, reach[-1]) if reach else end)
    backward: set[tuple[str, str]] = set()
    overlapping: set[tuple[str, str]] = set()
    for key, i in iteration.items():
        thread = key[0]
        if thread in training:
            continue
        ev = cpu[i]
        if ev.name.startswith(AUTOGRAD_EVENT):
            backward.add(thread)
        k = bisect.bisect_left(starts, ev.end) - 1
        if k >= 0 and reach[k] > ev.ts:
            overlapping.add(thread)
    return backward - overlapping


def _gaps(cpu: Sequence[CpuEvent], iteration: dict[Key, int], start_us: float,
          training: set[tuple[str, str]]) -> tuple[dict[Key, float], set[Key]]:
    """Each top-level event's gap before it on its thread (us; from ``start_us``, the opening marker, for the
    thread's first). Only the ``training`` threads (those that hold the boundary markers) and the threads they
    hand work to (:func:`_handoff_threads`) have gaps; another thread (gloo's) is idle between its events, not
    busy. A training thread and its handoff threads are one timeline, one of them working at a time: a gap runs
    from the previous event on any of them, so the caller's wait for a backward pass on another thread is not a
    gap, and the engine's work between backward events is. Also the keys on such a joined timeline."""
    handoff = _handoff_threads(cpu, iteration, training) if training else set()
    joined = ("", "training and handoff threads")  # not a (pid, tid) Kineto writes
    by_thread: dict[tuple[str, str], list[tuple[float, float, Key]]] = {}
    for key, i in iteration.items():
        timeline = joined if handoff and (key[0] in training or key[0] in handoff) else key[0]
        by_thread.setdefault(timeline, []).append((cpu[i].ts, cpu[i].end, key))
    out: dict[Key, float] = {}
    for thread, events in by_thread.items():
        events.sort()
        busy = thread in training or thread == joined
        prev_end = start_us
        for ts, end, key in events:
            out[key] = max(0.0, ts - prev_end) if busy else 0.0
            prev_end = max(prev_end, end)
    return out, {key for _, _, key in by_thread.get(joined, [])}


def lean_times(captured: KinetoTrace, lean: KinetoTrace) -> dict[int, LeanTime]:
    """For each top-level event of ``captured`` (by index in ``captured.cpu``) whose key is found in ``lean``'s
    iterations: the median lean duration and gap over those iterations (module docstring)."""
    lean_iters = top_sequences(lean.cpu)
    if not lean_iters:
        return {}
    bounds = sorted(ev.ts for ev in lean.cpu if ev.name == BOUNDARY_MARKER)
    training = {ev.thread for ev in lean.cpu if ev.name == BOUNDARY_MARKER}
    samples: dict[Key, tuple[list[float], list[float], list[bool]]] = {}
    for j, it in enumerate(lean_iters):
        gaps, joined = _gaps(lean.cpu, it, bounds[j], training)
        for key, i in it.items():
            durs, gs, js = samples.setdefault(key, ([], [], []))
            durs.append(lean.cpu[i].dur)
            gs.append(gaps[key])
            js.append(key in joined)
    out: dict[int, LeanTime] = {}
    for it in top_sequences(captured.cpu):
        for key, i in it.items():
            found = samples.get(key)
            if found is not None:
                out[i] = LeanTime(float(statistics.median(found[0])), float(statistics.median(found[1])),
                                  len(found[0]), 2 * sum(found[2]) > len(found[2]))
    return out
