"""Iteration boundaries and timing of one recording rank (see :mod:`nbox_record.capture.bootstrap`, "Iterations").

Boundary n (1-based): n < W warm-up; n = W starts the clock; each boundary up to W+K closes one timed
iteration; then the lean pass (Kineto alone, :mod:`nbox_record.sources.leantiming`) runs from W+K to W+K+L, and the
capture from W+K+L to W+K+L+C (:func:`step_at`; L = 0: the capture starts at W+K).

The captured iterations are timed the same way (wall, and the training thread's time on a CPU and in a run
queue, :mod:`nbox_trace.threadtime`), so that the replay can tell how much the profiler inflated the
recorded compute (``nbox_replay.inputs.profiler``). In the clean iterations the thread's times are also sampled at
each collective the training thread issues (:mod:`nbox_record.capture.segments`), which cuts each iteration into
segments (start to first collective, between consecutive ones, last to end), each with its time on a CPU and in a
run queue, so that the replay can scale each segment of a captured iteration separately. The first captured
iteration is timed from the end of the profiler's start (:meth:`IterationClock.capture_started`), not from
boundary W+K: starting Kineto and the ET observer is a one-off cost that no recorded operator carries.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence
from typing import Literal

from nbox_record.handoff import Config
from nbox_trace.threadtime import ThreadTimes

#: What a boundary calls for: start the lean pass, finish it and start the capture, start the capture (no lean
#: pass), mark a lean or captured boundary, finish the capture, or (no capture) finish after the timed iterations.
Step = Literal["start_lean", "finish_lean", "start_capture", "mark", "finish_capture", "finish_timing"]


def step_at(n: int, config: Config) -> Step | None:
    """The capture step that boundary ``n`` calls for, if any."""
    warmup, timed, captured = config.effective_warmup, config.iterations, config.capture
    if config.no_capture:
        return "finish_timing" if n == warmup + timed else None
    lean = config.effective_lean
    if lean and n == warmup + timed:
        return "start_lean"
    if lean and warmup + timed < n < warmup + timed + lean:
        return "mark"
    first = warmup + timed + lean  # the capture's first boundary
    if n == first:
        return "finish_lean" if lean else "start_capture"
    if first < n < first + captured:
        return "mark"
    if n == first + captured:
        return "finish_capture"
    return None


def now_s() -> float:
    """``time.perf_counter`` seconds; on CUDA after a device synchronize (time what the device did, not
    what the host queued)."""
    torch_module = sys.modules.get("torch")
    if torch_module is not None and torch_module.cuda.is_initialized():
        torch_module.cuda.synchronize()
    return time.perf_counter()


class IterationClock:
    """The boundaries counted so far, of which kind, and the timed iterations' durations (microseconds)."""

    def __init__(self, warmup: int, timed: int, captured: int = 0, lean: int = 0) -> None:
        self.warmup, self.timed, self.captured, self.lean = warmup, timed, captured, lean
        self.kind: str | None = None  # "optimizer_step" | "marker"
        self.count = 0
        self.iteration_us: list[float] = []
        self.split_us: list[tuple[float, float]] = []  # per timed iteration: (on CPU, run queue)
        #: per timed iteration whose collectives were all sampled: each segment's (on CPU, run queue)
        self.segments_us: list[list[tuple[float, float]]] = []
        self.window: list[float] = []  # perf_counter seconds: start and end of the timed iterations
        self._t_prev: float | None = None
        self._tt_prev: ThreadTimes | None = None  # the training thread's CPU accounting at the last boundary
        self.capture_us: list[float] = []  # per captured iteration: wall
        self.capture_split_us: list[tuple[float, float]] = []  # per captured iteration: (on CPU, run queue)
        self._cap_prev: tuple[float, ThreadTimes | None] | None = None

    def restart(self, kind: str) -> None:
        """Count again from zero with boundaries of ``kind`` (the first marker call)."""
        self.kind = kind
        self.count = 0
        self.iteration_us, self.split_us, self.segments_us = [], [], []
        self.capture_us, self.capture_split_us = [], []
        self._t_prev, self._tt_prev, self._cap_prev = None, None, None

    def take(self, n: int, now: float, tt: ThreadTimes | None,
             marks: Sequence[ThreadTimes | None] | None = None) -> None:
        """Boundary ``n`` happened at ``now`` (:func:`now_s`) with the thread's times ``tt``; ``marks``: the thread's
        times at each collective it issued since the previous boundary (None: not sampled)."""
        warmup, timed = self.warmup, self.timed
        if n == warmup:
            self._t_prev, self._tt_prev = now, tt
            self.window = [now]
        elif warmup < n <= warmup + timed and self._t_prev is not None:
            self.iteration_us.append((now - self._t_prev) * 1e6)
            if tt is not None and self._tt_prev is not None:
                self.split_us.append(((tt.on_cpu_ns - self._tt_prev.on_cpu_ns) / 1e3,
                                      (tt.run_queue_ns - self._tt_prev.run_queue_ns) / 1e3))
                if marks is not None and all(m is not None for m in marks):
                    points = [self._tt_prev, *(m for m in marks if m is not None), tt]
                    self.segments_us.append([((b.on_cpu_ns - a.on_cpu_ns) / 1e3,
                                              (b.run_queue_ns - a.run_queue_ns) / 1e3)
                                             for a, b in itertools.pairwise(points)])
            self._t_prev, self._tt_prev = now, tt
            if n == warmup + timed:
                self.window.append(now)
        elif (warmup + timed + self.lean < n <= warmup + timed + self.lean + self.captured
              and self._cap_prev is not None):
            t_prev, tt_prev = self._cap_prev
            self.capture_us.append((now - t_prev) * 1e6)
            if tt is not None and tt_prev is not None:
                self.capture_split_us.append(((tt.on_cpu_ns - tt_prev.on_cpu_ns) / 1e3,
                                              (tt.run_queue_ns - tt_prev.run_queue_ns) / 1e3))
            self._cap_prev = (now, tt)

    def capture_started(self, now: float, tt: ThreadTimes | None) -> None:
        """The profiler has started (after boundary W+K+L): the first captured iteration is timed from here."""
        self._cap_prev = (now, tt)

    def window_s(self) -> tuple[float, float]:
        """Start and end of the timed iterations (perf_counter seconds; 0.0 where not reached)."""
        t0, t1 = [*self.window, 0.0, 0.0][:2]
        return t0, t1
