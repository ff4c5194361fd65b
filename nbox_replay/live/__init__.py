"""The live replay: operators re-executed on the real clock, communication through the nbox backend.

The run (``run``), its per-rank worker launched as ``python -m nbox_replay.live._worker`` (``_worker``) with its comm
nodes' calls (``issues``) and, on CUDA, its walk on the recorded streams (``streams``, over torch's CUDA streams in
``cudalanes``), the operators (``ops``, ``fastcall``, ``values``, ``allocator``, ``children``), host work padding
(``hostwork``), the compute measurement with its worker (``measure``, ``_measure_worker``) and what each worker is
told, as a dataclass (``workerconfig``).

May import: ``nbox_replay.report``, ``nbox_replay.virtual``, ``nbox_replay.inputs``, ``emulator_core`` doors and
``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "hostwork": ("HOST_WORK_MODES", "HostPad"),
    "measure": ("measure_compute",),
    "run": ("LiveConfig", "LiveResult", "live_refusal", "replay_paired"),
}

__all__ = ["HOST_WORK_MODES", "HostPad", "LiveConfig", "LiveResult", "live_refusal", "measure_compute",
    "replay_paired"]

if TYPE_CHECKING:
    from nbox_replay.live.hostwork import HOST_WORK_MODES, HostPad
    from nbox_replay.live.measure import measure_compute
    from nbox_replay.live.run import LiveConfig, LiveResult, live_refusal, replay_paired
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
