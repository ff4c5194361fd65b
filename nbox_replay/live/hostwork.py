"""The host work a live replay does not re-run, put back as padding of its live operators.

A live replay with ``--compute live`` re-executes the recorded top-level operators and nothing else: the
training framework's own work between and around them (Python hooks of FSDP and DDP, the autograd engine's
bookkeeping, the optimizer's loop) is not re-run, and neither is the CPU the real rank's communication took
from it (gloo's threads and the kernel's network work on the rank's core, which leave the training thread
runnable but waiting). The replayed rank's thread ends each iteration sooner than the real one did.

The recorder measures, per clean (un-instrumented) iteration, the real training thread's time on a CPU and its time
runnable but waiting for one (``observed.thread_cpu_us``: ``clean`` and ``clean_run_queue``,
:mod:`nbox_trace.threadtime`). A live worker measures the same two for its own thread per iteration in every
repetition (the operators, its own walk and the nbox backend's calls; a fallback operator's recorded duration
counts as spent; the CPU time of its waits does not: a wait for a collective, a fallback's or a padding's wait
spins its last 200 us to wake on time, where the real thread blocks in gloo's wait), and pads each timed repetition
by what the repetitions before it measured (the padding is a wait, so it does not change what is measured):

    pad_us = (clean_us + clean_run_queue_us) - replay_us     (per iteration, microseconds; 0 when negative)

(``replay_us``: the median over the repetitions before, below) and each live operator is stretched by ``1 + pad_us /
live_us`` (``live_us``: the operators' own time per iteration, likewise), so the rank's thread is busy per iteration
as long as the real one was. The stretch is a wait after the operator (the rank's core is not kept busy), applied
with the scenario's compute factor (a straggler's factor multiplies it). Where the framework's work sits in the
iteration is not known (Kineto records operators, not the time between them without the communication waits mixed
in: the lean pass of nbox_record/sources/leantiming.py measured the gaps and found them dominated by waits), so it is
spread over the operators in proportion to their time. A bundle recorded before the run-queue figure existed pads to the
CPU time alone.

**The repetitions before.** ``replay_us`` is the median over the repetitions before the padded one, the first (cold)
one left out when there are two or more. The last repetition's alone would be a
bias: the pad cannot be negative, so a repetition that happened to run fast raised the next one's pad while a slow
one could not lower it, and the padded time averaged ``E[R] + E[max(0, clean - R')]`` (``R'`` the repetition before)
rather than ``max(clean, E[R])``; a replayed thread varies from one repetition to the next within a launch, and
both rules replayed on measured repetitions showed the median's pad near the right answer and the last
repetition's too large (docs/results.md, "The live replay's pad and its own overhead"). A pad still cannot take back
a replay slower than its recording, whose launch drew other luck: that part of the one-sided share stays
(docs/results.md, "Where the live replay's extra over its recording comes from").

**Both ways (``replay.host_work=match``).** The pad only lengthens: a replayed thread busier than the recorded one (its
walk through the graph and the backend's issue of each collective; the real thread's framework work is what the
recorded figure holds instead) keeps its
excess, and that excess is the replay's, not the training job's. ``match`` credits it back: with ``pad_us`` negative
the factor falls below 1, and each live operator, instead of a wait after it, moves the rank's own timeline
``(1 - factor) x`` its time behind the host clock (:meth:`emulator_core.backend.clocksync.Clock.credit`). The rank's
arrivals at later collectives go out that much earlier on the reference timeline, its waits end that much later in host
time, and its measured iteration is that much shorter, so per iteration the rank's thread counts as long as the real
one's, either way. The credit is taken on the operators in proportion to their time, like the pad, and cannot
exceed them (factor >= 0). Under ``match`` the replay's figure (``replay_us``) is its time outside its waits (host
time, a fallback's recorded duration counted as spent), not its thread's busy time: time the walk spends blocked
outside a wait (on the GIL while the backend's resolver thread answers a call, for instance) is on neither the CPU
nor the run queue, and the busy figure would leave it in. On the testbed's examples the two figures are close
(docs/results.md); both are reported (``busy_us``).

Credit alone would not shorten the job: the answer to a collective needs every real peer's arrival time, which comes
in host time, and a peer credited more than this rank runs that much behind in host time, so this rank would wait
for it past the answered end and be late on its own timeline by the difference (each rank would end up as late as
the most-credited one). So with ``match`` a wait that ends past the answered end on the rank's timeline is credited
too (the worker's ``_catch_up``): that overshoot is the emulator's (a peer's credit, the arrival exchange's round
trip, a wake-up on a busy core), not the modeled cluster's, and each wait then ends where the model put it, as on the
virtual clock. Reported per rank as ``caught_up_us`` per iteration.

Each worker holds its heap first (:mod:`nbox_replay.live.allocator`: no trimming, a fixed mmap threshold), so its
operators do not page-fault more than the real run's did: the pad then starts from the operators' own time.

The first repetition of a worker is slow (its tensors are made, caches are cold: its operators run several
times slower than in the repetitions after it), so a warm figure needs ``--warmup`` 2 or more, and a median a few
more (``nbox replay`` defaults to 4); with ``--warmup 1`` the first timed repetition is padded too little.

**On CUDA** the device runs the recorded kernels themselves (re-launched by the live operators); what the replay
does not re-run is the host's work between launches. The plan is the same (the real thread's time on or waiting for
a CPU per clean iteration less the replaying thread's, both counting the spins of their synchronizing calls), but
``live_us`` is then the operators' launch time on the host, and the pad is not a stretch of the operators: the walk
(:mod:`nbox_replay.live.streams`) waits on the host ``(factor - 1) x`` each live operator's launch time before its
next launch or collective. A host-bound rank is slowed by it as the real one was; a device-bound one is not, its
device's queue absorbing the host's waits. ``match`` is refused there: its credit moves the rank's timeline behind
the host clock, while the device's kernels and holds keep running on the host's.

Not applied (``pad_us`` 0, the reason kept): without a repetition before to measure on, or without the recorder's
figure for the rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HOST_WORK_MODES", "HostPad", "plan_pad"]

#: ``replay.host_work``: ``pad`` (lengthen only; the default with live compute), ``match`` (lengthen or credit: module
#: docstring, "Both ways") or ``off``.
HOST_WORK_MODES = ("pad", "match", "off")


@dataclass(frozen=True)
class HostPad:
    """One replayed rank's padding. Times in microseconds per captured iteration.

    Attributes:
        clean_us: the real training thread's time on a CPU and waiting for one per clean iteration (the
            recorder's medians; 0: none).
        replay_us: the replaying thread's time per iteration in the repetitions before (on a CPU and waiting for
            one, plus fallbacks' recorded durations): their median, the cold first left out (module docstring).
        live_us: the live operators' own time per iteration in them (their median).
        pad_us: ``clean_us - replay_us``, at least 0 (``pad``) or at least ``-live_us`` (``match``; negative:
            credited, module docstring); 0 with a reason in ``why_not`` when not applied.
        factor: the stretch of each live operator, ``1 + pad_us / live_us`` (1.0: none; below 1: credited).
        why_not: why no padding was planned ('' when it was, even a zero one).
        caught_up_us: with ``match``, what the rank's waits ran past the answered ends and were credited, per
            iteration of the repetition (module docstring, "Both ways"; 0 otherwise).
        busy_us: the replaying thread's own busy time per iteration in the repetitions before (their median, as
            ``replay_us``): ``replay_us`` itself without ``match``; with it, shown beside the time outside the
            waits that ``replay_us`` then is (0: not measured).
    """

    clean_us: float
    replay_us: float
    live_us: float
    pad_us: float
    factor: float
    why_not: str = ""
    caught_up_us: float = 0.0
    busy_us: float = 0.0

    def to_dict(self) -> dict[str, float | str | None]:
        return {"clean_us": self.clean_us, "replay_us": self.replay_us, "live_us": self.live_us,
                "pad_us": self.pad_us, "factor": self.factor, "why_not": self.why_not or None,
                "caught_up_us": self.caught_up_us, "busy_us": self.busy_us}

    @staticmethod
    def from_dict(doc: object) -> HostPad | None:
        """A worker's figure (written by nbox's own worker: trusted shape, checked anyway); None when absent."""
        if not isinstance(doc, dict):
            return None
        try:
            return HostPad(float(doc["clean_us"]), float(doc["replay_us"]), float(doc["live_us"]),
                           float(doc["pad_us"]), float(doc["factor"]), str(doc.get("why_not") or ""),
                           float(doc.get("caught_up_us") or 0.0), float(doc.get("busy_us") or 0.0))
        except (KeyError, TypeError, ValueError):
            return None


def _warm_median(per_repetition: Sequence[float]) -> float:
    """The median of the repetitions' figures, the first (cold) one left out when there are two or more."""
    return statistics.median(per_repetition[1:] if len(per_repetition) >= 2 else per_repetition)


def plan_pad(clean_us: float | None, history: Sequence[tuple[float, float]], per_repetition: int,
             both_ways: bool = False, busy_history: Sequence[float] = ()) -> HostPad:
    """The padding of one rank from the real thread's time on or waiting for a CPU per clean iteration
    (``clean_us``; None: the bundle has none for this rank) and the ``(replay_us, live_us)`` totals of the
    worker's repetitions so far, oldest first (empty: none yet), each holding ``per_repetition`` captured
    iterations. The replay's own time is their median, the first (cold) repetition left out when there are two
    or more (module docstring). ``both_ways`` (``replay.host_work=match``): a replay busier than the real thread is
    credited the difference (a factor below 1) instead of left as it is; its history then holds each repetition's
    time outside its waits (module docstring, "Both ways"). ``busy_history``: the repetitions' busy times, the same
    length, for the report's ``busy_us`` (empty: not measured)."""
    k = max(1, per_repetition)
    if not clean_us or clean_us <= 0:
        return HostPad(0.0, 0.0, 0.0, 0.0, 1.0, "the bundle carries no clean CPU time for this rank")
    if not history:
        return HostPad(clean_us, 0.0, 0.0, 0.0, 1.0, "no repetition before to measure the replay's own time on "
                                                     "(--warmup 0)")
    replay_us = _warm_median([r for r, _ in history]) / k
    live_us = _warm_median([x for _, x in history]) / k
    if live_us <= 0:
        return HostPad(clean_us, replay_us, live_us, 0.0, 1.0, "no operator ran live")
    busy_us = _warm_median(busy_history) / k if busy_history else 0.0
    pad_us = max(-live_us if both_ways else 0.0, clean_us - replay_us)
    return HostPad(clean_us, replay_us, live_us, pad_us, 1.0 + pad_us / live_us, busy_us=busy_us)
