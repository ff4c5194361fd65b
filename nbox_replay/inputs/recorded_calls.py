"""The recording's own time of each replayed collective, beside the model's (the replay report's ``recorded``).

A member's recorded duration of a collective runs from its issue to its end, so it includes waiting for the
members that arrived later and, for an asynchronous call, for the group's previous call still running. A member's
own time counts from when the call could start on it: its recorded start, or the recorded end of its previous call
on the same process group if that is later (the replay orders a group's calls the same way). The call's own time
is the shortest own time over its members: the member that arrived last, whose call ran from its arrival to the
collective's end (every member's call ends when the collective does). It is known only when every member the
recording had in the group was replayed; with one of two, the shortest would still include waiting.

Calls that ran at the same time in the recording (gloo runs up to two at once on its worker threads) split their
time otherwise than the model, which runs them one after another: their sum is what compares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["RecordedStreams", "recorded_call_us", "recorded_time_us", "recording_complete"]


def recorded_call_us(own_us: Mapping[int, float]) -> float | None:
    """The call's own time from its members' own times (rank -> us; module docstring): the shortest; None when a
    member's time is not a positive finite number (a node without a measured duration)."""
    values = list(own_us.values())
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        return None
    return min(values)


def recording_complete(recorded_members: Sequence[int], own_us: Mapping[int, float]) -> bool:
    """Whether ``own_us`` has every member the recording had in the group, at least two (module docstring)."""
    return len(recorded_members) >= 2 and all(r in own_us for r in recorded_members)


def recorded_time_us(recorded_members: Sequence[int], own_us: Mapping[int, float]) -> float | None:
    """The recording's own time of a call (us; module docstring): :func:`recorded_call_us` of its members' own times
    when the recording is complete (:func:`recording_complete`), else None."""
    return recorded_call_us(own_us) if recording_complete(recorded_members, own_us) else None


class RecordedStreams:
    """One rank's recorded calls, per process group, in the order the replay issues them (reset per repetition of
    the graph: each repetition replays the same recorded calls)."""

    def __init__(self) -> None:
        self._last_end_us: dict[str, float] = {}

    def reset(self) -> None:
        self._last_end_us.clear()

    def own_us(self, pg: str, start_us: float, duration_us: float) -> float:
        """The call's own time on this rank (us; module docstring); its recorded duration when the trace has no
        start time (``start_us`` <= 0)."""
        if start_us <= 0:
            return duration_us
        end = start_us + duration_us
        prev = self._last_end_us.get(pg)
        self._last_end_us[pg] = end if prev is None else max(prev, end)
        return duration_us if prev is None or prev <= start_us else max(0.0, end - prev)
