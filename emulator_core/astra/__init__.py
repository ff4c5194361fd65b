"""ASTRA-sim, both ways: a scenario exported as ASTRA-sim's network/system files and read back.

One rule for each convention (``conventions``), the flat YAML ASTRA-sim reads (``flatyaml``) and the files
(``config``), for ``nbox scenario export/import`` and bench/astra_parity.py.

May import: ``emulator_core.scenario``, ``emulator_core.network`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "config": ("NETWORK_FILE", "SYSTEM_FILE", "export_astra", "import_astra"),
}

__all__ = ["NETWORK_FILE", "SYSTEM_FILE", "export_astra", "import_astra"]

if TYPE_CHECKING:
    from emulator_core.astra.config import NETWORK_FILE, SYSTEM_FILE, export_astra, import_astra
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
