"""A collective held on the device: the hold protocol, a fake device for tests and the CUDA one.

The protocol and its engine (``hold``), a device that plays it without a GPU (``fake``) and the CUDA device
(``_cuda``, which needs torch and NVRTC; loaded only when used).

May import: ``nbox_trace`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "_cuda": ("CudaDevice",),
    "hold": ("ClockOffset", "Device", "DeviceHoldWork", "HoldEngine", "HoldError", "STATUS_TIMED_OUT", "Stream"),
}

__all__ = ["ClockOffset", "CudaDevice", "Device", "DeviceHoldWork", "HoldEngine", "HoldError", "STATUS_TIMED_OUT",
    "Stream"]

if TYPE_CHECKING:
    from emulator_core.device._cuda import CudaDevice
    from emulator_core.device.hold import (
        STATUS_TIMED_OUT,
        ClockOffset,
        Device,
        DeviceHoldWork,
        HoldEngine,
        HoldError,
        Stream,
    )
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
