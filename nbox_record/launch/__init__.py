"""The launcher side of ``nbox record`` and ``nbox emulate``: start the ranks, wait, report.

``record`` (``launcher``: launch spec, failure report, conversion) and ``emulate`` (``emulation``: the emulated
world's ranks, the report).

May import: every room of ``nbox_record`` below it, ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "emulation": ("EmulateConfig", "emulate", "format_text"),
    "launcher": ("RecordConfig", "record"),
}

__all__ = ["EmulateConfig", "RecordConfig", "emulate", "format_text", "record"]

if TYPE_CHECKING:
    from nbox_record.launch.emulation import EmulateConfig, emulate, format_text
    from nbox_record.launch.launcher import RecordConfig, record
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
