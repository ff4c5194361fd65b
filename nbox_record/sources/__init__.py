"""Reading what a rank recorded: the host ET, the Kineto trace, the collective log.

The host execution trace (``hostet``), Kineto's trace (``kineto``), the collectives' facts from the three sources
(``comms``), the host ET's nesting repaired by Kineto's clock (``nesting``) and the lean pass's timings
(``leantiming``). A new trace importer's readers go here.

May import: ``nbox_record.handoff`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "comms": ("CollectiveLogData", "CommFacts", "P2P_KINDS", "RPC_NAME", "collective_facts",
        "collective_kind", "in_int32", "load_collective_log", "marker_kind", "short_op"),
    "hostet": ("EtNode", "HostEt", "USER_SCOPE", "iter_tensors", "read_host_et"),
    "kineto": ("CpuEvent", "GpuOp", "KinetoTrace", "enclosing_events", "join_host_ops", "launching_events",
        "read_kineto"),
    "leantiming": ("LeanTime", "lean_times"),
    "nesting": ("repair_nesting",),
}

__all__ = ["CollectiveLogData", "CommFacts", "CpuEvent", "EtNode", "GpuOp", "HostEt", "KinetoTrace",
    "LeanTime", "P2P_KINDS", "RPC_NAME", "USER_SCOPE", "collective_facts", "collective_kind", "enclosing_events",
    "in_int32", "iter_tensors", "join_host_ops", "launching_events", "lean_times", "load_collective_log",
    "marker_kind", "read_host_et", "read_kineto", "repair_nesting", "short_op"]

if TYPE_CHECKING:
    from nbox_record.sources.comms import (
        P2P_KINDS,
        RPC_NAME,
        CollectiveLogData,
        CommFacts,
        collective_facts,
        collective_kind,
        in_int32,
        load_collective_log,
        marker_kind,
        short_op,
    )
    from nbox_record.sources.hostet import USER_SCOPE, EtNode, HostEt, iter_tensors, read_host_et
    from nbox_record.sources.kineto import (
        CpuEvent,
        GpuOp,
        KinetoTrace,
        enclosing_events,
        join_host_ops,
        launching_events,
        read_kineto,
    )
    from nbox_record.sources.leantiming import LeanTime, lean_times
    from nbox_record.sources.nesting import repair_nesting
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
