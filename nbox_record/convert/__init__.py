"""Turning one recording into Chakra ETs, rank by rank (``nbox record``'s last step, ``nbox record convert``).

Assembly (``assemble``) of the nodes chosen (``toplevel``) and linked (``deps``): compute (``comp``), communication
(``comm``), GPU (``gpu``), devices (``device``), inputs (``inputs``), attributes (``attrs``), groups (``groups``),
metadata (``meta``); and the importer of ``nbox record convert`` (``importer``).

May import: ``nbox_record.sources``, ``nbox_record.handoff``, ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "importer": ("ConvertConfig", "RankInput", "convert_ranks", "import_traces"),
}

__all__ = ["ConvertConfig", "RankInput", "convert_ranks", "import_traces"]

if TYPE_CHECKING:
    from nbox_record.convert.importer import ConvertConfig, RankInput, convert_ranks, import_traces
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
