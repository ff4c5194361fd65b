"""Replaying at a what-if mesh: the replayed ranks renumbered to the target ranks they play, and the report's lines.

The rules live in :mod:`nbox_trace.mesh` (which groups form which dimension) and :mod:`emulator_core.scenario.mesh` (how
a target mesh places ranks and sizes collectives); this module applies them to the replay's graphs and says what
was applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from emulator_core.pricing import group_shape
from emulator_core.scenario import MeshError, MeshPlan, Scenario, parse_mesh, parse_override, plan_mesh
from nbox_replay.inputs.graph import RankGraph
from nbox_trace.mesh import RecordedMesh, canonical_name

__all__ = ["MESH_AXIS", "mesh_axis_name", "mesh_dict", "mesh_lines", "plan_for", "relabel", "set_world_size",
           "topology_spans"]

#: A sweep axis ``mesh.<dim>`` varies one dimension's degree.
MESH_AXIS = "mesh."


def mesh_axis_name(key: str) -> str:
    """The dimension of a ``mesh.<dim>`` sweep axis (canonical name).

    Raises:
        MeshNameError: not ``mesh.<known dimension>``.
    """
    return canonical_name(key[len(MESH_AXIS):], where=f"--vary {key}")


def relabel(graphs: Mapping[int, RankGraph], plan: MeshPlan) -> dict[int, RankGraph]:
    """The graphs keyed by the target rank each plays, with their send/recv peers renumbered the same way.

    Raises:
        MeshError: a replayed rank or a peer that has no place in the target mesh.
    """
    out: dict[int, RankGraph] = {}
    for rank, g in graphs.items():
        target = plan.rank_map.get(rank)
        if target is None:
            raise MeshError(f"{plan.text}: replayed rank {rank} has no place in the mesh {plan.describe()}")
        comm = dict(g.comm)
        for i, c in g.comm.items():
            if c.peer is not None:
                peer = plan.target_rank(c.peer)
                if peer is None:
                    raise MeshError(f"{plan.text}: rank {rank} sends to or receives from rank {c.peer}, which has no "
                                    f"place in the mesh {plan.describe()}")
                comm[i] = replace(c, peer=peer)
        out[target] = replace(g, rank=target, comm=comm)
    return out


def plan_for(recorded: RecordedMesh, mesh: str | Sequence[tuple[str, int]], *, groups: Mapping[str, Sequence[int]],
             replayed: Sequence[int], placement: Sequence[str] | None, world_size: int | None = None,
             text: str | None = None, set_world: int | None = None, placement_by: str = "--placement",
             batch_size: int | None = None) -> MeshPlan:
    """The plan of ``mesh`` (``"dp=512,tp=2"`` or parsed pairs) on ``recorded``; ``world_size`` and ``set_world``: a
    world size asked for as well (``--world-size``, ``--set world_size``), which the mesh must make;
    ``placement_by``: where the placement came from, for its errors; ``batch_size``: the recorded per-rank batch
    of a fixed global batch (None: weak scaling).

    Raises:
        MeshError: a bad mesh or placement (named), or a world size the mesh does not make.
    """
    pairs = parse_mesh(mesh) if isinstance(mesh, str) else tuple(mesh)
    label = text or f"--mesh {mesh if isinstance(mesh, str) else ','.join(f'{n}={d}' for n, d in pairs)}"
    plan = plan_mesh(recorded, pairs, groups=groups, replayed=replayed, placement=placement, text=label,
                     placement_by=placement_by, batch_size=batch_size)
    if world_size is not None and world_size != plan.world:
        raise MeshError(f"{label}: the mesh {plan.describe()} has {plan.world} ranks, but --world-size is "
                        f"{world_size}")
    if set_world is not None and set_world != plan.world:
        raise MeshError(f"{label}: the mesh {plan.describe()} has {plan.world} ranks, but --set world_size is "
                        f"{set_world}")
    return plan


def set_world_size(overrides: Sequence[str]) -> int | None:
    """The world size a ``--set world_size=N`` asks for (the last one; None: none, or not an integer, which loading
    the scenario then refuses)."""
    found = None
    for o in overrides:
        key, value = parse_override(o)
        if key == ["world_size"] and isinstance(value, int) and not isinstance(value, bool):
            found = value
    return found


def topology_spans(plan: MeshPlan, scenario: Scenario) -> dict[str, str]:
    """Per mesh dimension, the topology dimensions one of its groups spans on ``scenario`` (pricing's own
    :func:`emulator_core.pricing.pricer.group_shape`), e.g. ``{"tp": "gpu(2)", "dp": "gpu(4) x node(128)"}``."""
    out: dict[str, str] = {}
    strides = plan.strides()
    for name in plan.order:
        members = [c * strides[name] for c in range(plan.degrees[name])]
        shape = group_shape(scenario, members)
        out[name] = " x ".join(f"{d.name}({n})" for n, d in shape.dims) or "one rank"
    return out


def mesh_lines(recorded: RecordedMesh, plan: MeshPlan | None, spans: Mapping[str, str] | None) -> list[str]:
    """The report's mesh lines: the recorded mesh (how each dimension was named), then the what-if's."""
    out = ["recorded " + line if i == 0 else line for i, line in enumerate(recorded.lines())]
    if plan is None:
        return out
    moved = {r: t for r, t in plan.rank_map.items() if r != t}
    out.append(f"what-if mesh: {plan.describe()} (placement outermost first, from {plan.text}); replayed ranks "
               + ("keep their numbers" if not moved else
                  "play " + ", ".join(f"{r}->{t}" for r, t in sorted(plan.rank_map.items())[:16])))
    for name in plan.order:
        rec = recorded.degrees()[name]
        where = f", on topology {spans[name]}" if spans and name in spans else ""
        out.append(f"  {name}: {rec} -> {plan.degrees[name]} ranks{where}")
    if plan.batch is not None:
        out.append(f"  {plan.batch.describe()}")
    return out


def describe_mesh(recorded: RecordedMesh, plan: MeshPlan | None,
                  scenario: Scenario) -> tuple[list[str], dict[str, Any]]:
    """The report's mesh lines and their JSON: the recorded mesh, and the what-if's placed on ``scenario``'s topology
    (:func:`mesh_lines`, :func:`mesh_dict`, :func:`topology_spans`)."""
    spans = topology_spans(plan, scenario) if plan is not None else None
    return mesh_lines(recorded, plan, spans), mesh_dict(recorded, plan, spans)


def mesh_dict(recorded: RecordedMesh, plan: MeshPlan | None, spans: Mapping[str, str] | None) -> dict[str, Any]:
    """The JSON of :func:`mesh_lines`."""
    return {"recorded": recorded.to_dict(),
            "what_if": None if plan is None else {**plan.to_dict(), "topology": dict(spans or {})}}
