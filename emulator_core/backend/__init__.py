"""The ``nbox`` torch.distributed backend: a process group whose collectives take the modeled time.

The process group and its observer hook (``process_group``), the calls in flight (``calls``), the works and their
wait (``delay``), the data rule for emulated members (``mirror``), eager and object point-to-point calls
(``eager``, ``objectp2p``), the clock shared by real ranks (``clocksync``), what the live backend can play
(``live_policy``, no torch), the world read from the environment (``emulation_config``) and calls held on the
device (``devicecall``). Registered by ``emulator_core._autoload``.
Names load on first use: ``live_policy`` and ``clocksync`` without torch, the process group with it.

May import: ``emulator_core.device``, ``emulator_core.pricing``, ``emulator_core.scenario`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "clocksync": ("Clock",),
    "delay": ("sleep_until",),
    "live_policy": ("live_unsupported",),
    "process_group": ("Observer", "add_observer", "clock_report", "create_process_group", "process_clock",
        "remove_observer"),
}

__all__ = ["Clock", "Observer", "add_observer", "clock_report", "create_process_group", "live_unsupported",
    "process_clock", "remove_observer", "sleep_until"]

if TYPE_CHECKING:
    from emulator_core.backend.clocksync import Clock
    from emulator_core.backend.delay import sleep_until
    from emulator_core.backend.live_policy import live_unsupported
    from emulator_core.backend.process_group import (
        Observer,
        add_observer,
        clock_report,
        create_process_group,
        process_clock,
        remove_observer,
    )
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
