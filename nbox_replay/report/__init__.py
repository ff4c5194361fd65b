"""What a replay says: the one run summary, the report and the Perfetto timelines.

The run summary (``summary``: iteration time, breakdown, speed-up), the report (``render``), a prediction against a
recording at the what-if's scale (``truth``) and the timelines (``timeline``).

May import: ``nbox_replay.virtual``, ``nbox_replay.inputs``, ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "render": ("ReplayReport",),
    "summary": ("RankChoiceError", "RunSummary", "format_speedup", "speedup", "summarize_sim"),
    "timeline": ("write_timelines",),
    "truth": ("Truth",),
}

__all__ = ["RankChoiceError", "ReplayReport", "RunSummary", "Truth", "format_speedup", "speedup", "summarize_sim",
    "write_timelines"]

if TYPE_CHECKING:
    from nbox_replay.report.render import ReplayReport
    from nbox_replay.report.summary import RankChoiceError, RunSummary, format_speedup, speedup, summarize_sim
    from nbox_replay.report.timeline import write_timelines
    from nbox_replay.report.truth import Truth
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
