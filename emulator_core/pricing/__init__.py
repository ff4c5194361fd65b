"""A scenario's collectives priced: the time of one collective over one group, and the answer to a call.

:func:`price` and :class:`Pricer` (``pricer``: the one ``auto`` choice), the per-dimension time
(``collective_time``), NCCL's tuner (``nccl_tuner``, data/nccl_tuning.toml), a measured nccl-tests curve evaluated
(``nccl_curve``), and the fabric that answers a collective from its members' arrival times (``answer``).

May import: ``emulator_core.scenario``, ``emulator_core.network`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "answer": ("ComputeBetween", "Fabric", "FabricGroup", "mirror_member", "mirror_weights"),
    "nccl_curve": ("time_us",),
    "pricer": ("Pricer", "extrapolation_note", "datasheet_of", "group_shape", "make_pricer", "price"),
}

__all__ = ["ComputeBetween", "Fabric", "FabricGroup", "Pricer", "extrapolation_note", "datasheet_of", "group_shape",
    "make_pricer", "mirror_member", "mirror_weights", "price", "time_us"]

if TYPE_CHECKING:
    from emulator_core.pricing.answer import ComputeBetween, Fabric, FabricGroup, mirror_member, mirror_weights
    from emulator_core.pricing.nccl_curve import time_us
    from emulator_core.pricing.pricer import Pricer, datasheet_of, extrapolation_note, group_shape, make_pricer, price
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
