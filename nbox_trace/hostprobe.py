"""How fast this core runs host work now: a fixed piece of work timed on the calling thread.

Why
---
The live replay pads each rank's operators up to the real training thread's time per clean iteration
(:mod:`nbox_replay.hostwork`), a figure the recorder measured at one moment on one core. A core's speed moves on a
shared machine (on the namespace testbed a pinned training thread took 17.6-19.2 ms per iteration on one core and
22.0-25.6 ms on the other in one recording, and the same operators ran 13.9 ms and 20.7 ms per iteration on one
core in two rounds of one bench run: README, run G), so a recording made in a slow moment pads every later replay by its
slowness. The recorder times this probe at its warm-up boundaries and right after its clean iterations, the live
worker before each of its warm-up repetitions, and the pad scales the recorded figure by the ratio of their
medians: the host work at this core's speed now. A core's speed moves within seconds on this VM (probes with
50 ms sleeps between them, in one pinned process, took about 0.33 or about 0.55 ms per repeat, in runs of
several), so each side samples it more than once.

What it runs
------------
:data:`PROBE_REPEATS` repeats of the same work, each timed by the thread's time on a CPU plus its time runnable and
waiting for one (:mod:`nbox_trace.threadtime`: the measure of the recorder's clean figure; wall time where the
kernel does not expose the run queue); the replay keeps their median. One repeat is what a
CPU training step's thread does, in small: a 192 x 192 float32 matrix product (a compute-bound kernel), 24 small
operators on 64 x 64 tensors (the dispatcher's and the allocator's per-call cost) and a loop of Python dict and
list work (the framework's own code). About 0.3 ms per repeat on the 2-core VM of this project (one thread), 13-23
ms per probe with its warm-up; run back to back for 6 s, one pinned thread's repeats held at 280-300 us (medians
per 50 ms).

The caller passes its ``torch`` module: this module does not import torch (the trace base never does).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from nbox_trace.threadtime import thread_times_ns

__all__ = ["PROBE_KEY", "PROBE_REPEATS", "hour_ratio", "probe_us", "probe_samples_us"]

#: Key of a rank's probe samples (microseconds) in ``timings.json`` and in ``observed.thread_cpu_us``.
PROBE_KEY = "probe"
#: Timed repeats per probe (the median is kept).
PROBE_REPEATS = 21
#: Untimed repeats first: the matrix product's first calls run 40% slower (243 -> 170 us over its first 20 calls,
#: measured here), a cold start that the recorder's late probe does not have and the worker's early one would.
WARMUP_REPEATS = 20
#: A ratio outside these bounds is not a core's speed moving but a broken measure: the pad keeps the recorded
#: figure (``hour_ratio`` returns None).
_RATIO_BOUNDS = (0.25, 4.0)


def _busy_ns() -> int:
    tt = thread_times_ns()
    if tt is None:
        return time.perf_counter_ns()
    return tt.on_cpu_ns + tt.run_queue_ns


def _one(a: Any, b: Any, small: Any) -> None:
    a.mm(b)
    x = small
    for _ in range(8):
        x = (x + 1.0).relu_().mul_(0.5)
    table: dict[int, list[int]] = {}
    for i in range(400):
        table.setdefault(i % 37, []).append(i)
    sum(len(v) for v in table.values())


def probe_samples_us(torch: Any, repeats: int = PROBE_REPEATS) -> list[float]:
    """``repeats`` timings of one repeat of the probe (microseconds each; module docstring), after
    :data:`WARMUP_REPEATS` untimed ones. Runs under ``torch.no_grad``."""
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        a = torch.rand(192, 192, generator=gen)
        b = torch.rand(192, 192, generator=gen)
        small = torch.rand(64, 64, generator=gen)
        for _ in range(WARMUP_REPEATS):
            _one(a, b, small)
        out: list[float] = []
        for _ in range(max(1, repeats)):
            t0 = _busy_ns()
            _one(a, b, small)
            out.append((_busy_ns() - t0) / 1000.0)
    return out


def probe_us(torch: Any, repeats: int = PROBE_REPEATS) -> float:
    """The median of :func:`probe_samples_us` (microseconds)."""
    return float(statistics.median(probe_samples_us(torch, repeats)))


def hour_ratio(recorded_us: float | None, now_us: float | None) -> float | None:
    """How much slower (above 1) or faster this core runs the probe now than the recording's did:
    ``now_us / recorded_us``; None where either is missing or the ratio is outside ``[0.25, 4]``."""
    if not recorded_us or not now_us or recorded_us <= 0 or now_us <= 0:
        return None
    ratio = now_us / recorded_us
    return ratio if _RATIO_BOUNDS[0] <= ratio <= _RATIO_BOUNDS[1] else None
