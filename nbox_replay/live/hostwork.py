"""The host work a live replay does not re-run, put back as padding of its live operators.

A live replay with ``--compute live`` re-executes the recorded operators only: the framework's work around them
and the CPU the real rank's communication took from its thread are not re-run. The recorder's figure per clean
iteration, ``clean_us``, is the real training thread's time on a CPU plus its time runnable but waiting for one
(``observed.thread_cpu_us``: ``clean`` + ``clean_run_queue``; the CPU time alone in an older bundle). A worker
measures its own thread the same way every repetition (a fallback's recorded duration counts as spent, the CPU time
of its waits does not) and pads each timed repetition by the repetitions before it (:func:`plan_pad`):

    pad_us = clean_us - replay_us            (per captured iteration, microseconds; at least 0)
    factor = 1 + pad_us / live_us            (each live operator's stretch)

``replay_us`` and ``live_us`` (the live operators' own time) are medians over the repetitions before, the first
(cold) one left out when there are two or more; so ``--warmup`` 2 or more. On a CPU the stretch is a wait after each
live operator, times the rank's compute factor; on CUDA (:mod:`nbox_replay.live.streams`) a wait on the host of
``(factor - 1) x`` each live operator's launch time, before its next launch or collective. Not applied (``pad_us``
0, ``why_not`` says why): no repetition before, no recorder figure for the rank, no live operator.

**Both ways** (``replay.host_work=match``, CPU only): ``pad_us`` may be negative, down to ``-live_us``. Each live
operator then moves the rank's own timeline ``(1 - factor) x`` its time behind the host clock
(:meth:`emulator_core.backend.clocksync.Clock.credit`), ``replay_us`` is the time outside the waits (``busy_us``: the
busy time, reported beside it), and a wait that ends past the answered end on the rank's timeline is credited the
overshoot too (``caught_up_us`` per iteration).

Why the pad is planned so: docs/design/host-work.md.
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
