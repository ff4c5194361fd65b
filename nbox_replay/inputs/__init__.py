"""What a replay reads: a rank's ET as lists, the bundle checked, the mesh, the recorded times.

A rank's ET as lists (``graph``), a bundle or bare ET opened and checked (``source``), the replayed ranks at a
what-if mesh (``meshing``), recorded compute less the profiler's cost (``profiler``) and the recording's own time of
each call (``recorded_calls``).

May import: ``emulator_core`` doors and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "graph": ("COLLECTIVE", "COMPUTE", "CommInfo", "META", "RECV", "RankGraph", "SEND", "captured_iterations",
        "load_rank"),
    "meshing": ("MESH_AXIS", "describe_mesh", "mesh_axis_name", "plan_for", "relabel", "set_world_size"),
    "profiler": ("Correction", "MODES", "correct_graphs", "from_worker_doc", "plan_correction"),
    "recorded_calls": ("RecordedStreams", "recorded_time_us"),
    "source": ("ReplaySource", "open_source"),
}

__all__ = ["COLLECTIVE", "COMPUTE", "CommInfo", "Correction", "MESH_AXIS", "META", "MODES", "RECV", "RankGraph",
    "RecordedStreams", "ReplaySource", "SEND", "captured_iterations", "correct_graphs", "from_worker_doc",
    "describe_mesh", "load_rank", "mesh_axis_name", "open_source", "plan_correction", "plan_for",
    "recorded_time_us", "relabel", "set_world_size"]

if TYPE_CHECKING:
    from nbox_replay.inputs.graph import (
        COLLECTIVE,
        COMPUTE,
        META,
        RECV,
        SEND,
        CommInfo,
        RankGraph,
        captured_iterations,
        load_rank,
    )
    from nbox_replay.inputs.meshing import (
        MESH_AXIS,
        describe_mesh,
        mesh_axis_name,
        plan_for,
        relabel,
        set_world_size,
    )
    from nbox_replay.inputs.profiler import (
        MODES,
        Correction,
        correct_graphs,
        from_worker_doc,
        plan_correction,
    )
    from nbox_replay.inputs.recorded_calls import RecordedStreams, recorded_time_us
    from nbox_replay.inputs.source import ReplaySource, open_source
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
