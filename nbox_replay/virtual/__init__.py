"""The virtual-time replay: simulated time on an event core.

The engine (``engine``: :func:`simulate`) and what it returns (``results``), the event core (``events``: clock,
heap, tie-break counter) and where an iteration's time went (``breakdown``).

May import: ``nbox_replay.inputs``, ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "breakdown": ("Breakdown", "CommSpan", "RankIntervals", "job_windows", "median_index", "partition",
        "slowest_rank"),
    "engine": ("retarget", "simulate"),
    "results": ("CollectiveAnswer", "RankResult", "SimResult"),
}

__all__ = ["Breakdown", "CollectiveAnswer", "CommSpan", "RankIntervals", "RankResult", "SimResult", "job_windows",
    "median_index", "partition", "retarget", "simulate", "slowest_rank"]

if TYPE_CHECKING:
    from nbox_replay.virtual.breakdown import (
        Breakdown,
        CommSpan,
        RankIntervals,
        job_windows,
        median_index,
        partition,
        slowest_rank,
    )
    from nbox_replay.virtual.engine import retarget, simulate
    from nbox_replay.virtual.results import CollectiveAnswer, RankResult, SimResult
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
