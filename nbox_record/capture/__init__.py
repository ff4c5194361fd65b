"""Inside each recorded rank: the bootstrap, the recorder's state machine and the files it writes.

The bootstrap that ``_inject/sitecustomize.py`` starts (``bootstrap``), the recorder (``recorder``) with its
iteration boundaries (``clock``), the ET observer, Kineto and collective log (``session``, ``commlog``), the
watchdog (``watch``), timings.json (``facts``), error.json and the exit (``exitreport``), interpreter hooks
(``hooks``), the profiler's own cost (``scriptprofiler``), and the taps of ``nbox emulate`` (``emulated_rank``,
``emulated_tap``).

May import: ``nbox_record.handoff``, ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "emulated_rank": ("EMULATE_ALL", "EMULATE_REPORT"),
}

__all__ = ["EMULATE_ALL", "EMULATE_REPORT", "bootstrap"]

if TYPE_CHECKING:
    from nbox_record.capture import bootstrap
    from nbox_record.capture.emulated_rank import EMULATE_ALL, EMULATE_REPORT
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
