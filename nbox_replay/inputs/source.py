"""What is being replayed: a trace bundle, or a bare Chakra ET (a directory or ``<prefix>`` of ``.et`` files).

:func:`open_source` reads the manifest (a bundle) or only the traces (a bare ET, e.g. an ASTRA-sim workload),
checks that every recorded rank's file is there and that the ranks agree on their collectives, and
gathers what the replay needs: process-group membership, the recorded world size, the device it was
recorded on, and the observed iteration time. Nothing is replayed from a trace that fails these checks:
a mismatch would make the replay wait forever or answer the wrong collectives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nbox_replay.inputs.graph import ReplayInputError
from nbox_trace.bundle import Manifest, locate_traces, observed_iteration_us
from nbox_trace.chakra import EtReader, TraceSet, find_attr
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.check import inspect_trace
from nbox_trace.mesh import MeshFacts, RecordedMesh, infer_mesh, mesh_facts

__all__ = ["ReplaySource", "open_source"]

#: Problem codes that make a replay meaningless (the ranks would wait for each other forever).
#: (A cycle is refused when the graph is loaded; a self-dependency is dropped there.)
FATAL_CODES = ("collective-mismatch", "pg-membership", "p2p-mismatch")


@dataclass(frozen=True)
class ReplaySource:
    """A bundle or bare trace, checked and ready to load.

    Attributes:
        path: what the user named.
        trace_set: the per-rank ``.et`` files.
        manifest: the bundle's manifest, or None for a bare ET.
        groups: process group name -> member global ranks (at the recorded world size).
        recorded_world: world size at recording.
        device: ``"cpu"``, ``"cuda"`` or ``"unknown"`` (bare ET: no live compute); a bundle's is its
            manifest's ``hardware.device``, else read off its traces (:func:`_bundle_device`).
        observed: the manifest's observed iteration time (median, p10, p90, n; microseconds), if any.
        warnings: non-fatal problems found in the traces (count).
        mesh_facts: what the recorded mesh is inferred from (:mod:`nbox_trace.mesh`).
    """

    path: str
    trace_set: TraceSet
    manifest: Manifest | None
    groups: dict[str, list[int]]
    recorded_world: int
    device: str
    observed: dict[str, Any] | None
    warnings: int
    mesh_facts: MeshFacts | None = None

    @property
    def ranks(self) -> list[int]:
        return self.trace_set.ranks

    def mesh(self, names: tuple[str, ...] | None = None) -> RecordedMesh:
        """The recorded mesh, its dimensions named by ``names`` (outermost first) when given
        (:func:`nbox_trace.mesh.infer_mesh`)."""
        facts = self.mesh_facts or MeshFacts.build(self.recorded_world, self.groups)
        return infer_mesh(facts, names)


def _recorded_world(manifest: Manifest | None, trace_set: TraceSet, groups: dict[str, list[int] | None],
                    meta_world: list[int]) -> int:
    """The manifest's world size; for a bare ET the largest rank (+1) seen in file names or groups."""
    if manifest is not None:
        w = manifest.job.get("world_size")
        if isinstance(w, int) and w >= 1:
            return w
    candidates = [max(trace_set.ranks) + 1, *meta_world]
    candidates += [max(m) + 1 for m in groups.values() if m]
    return max(candidates)


def _bundle_device(manifest: Manifest, trace_set: TraceSet) -> str:
    """``"cuda"`` or ``"cpu"``: the manifest's ``hardware.device``; when it says nothing (a bundle imported
    before the converter read the device off the traces), ``"cuda"`` if the lowest rank's trace holds GPU
    work (a compute node with ``is_cpu_op`` false), else ``"cpu"``."""
    said = manifest.hardware.get("device")
    if isinstance(said, str) and said:
        return "cuda" if said.startswith("cuda") else "cpu"
    with EtReader(trace_set.files[min(trace_set.ranks)]) as reader:
        for node in reader:
            if node.type == pb.COMP_NODE:
                flag = find_attr(node, "is_cpu_op")
                if flag is not None and flag.WhichOneof("value") == "bool_val" and not flag.bool_val:
                    return "cuda"
    return "cpu"


def open_source(path: str | os.PathLike[str], *, name: str | None = None) -> ReplaySource:
    """Open and check a bundle directory or a bare Chakra ET (``name``: what the user called it, for messages and
    the report, e.g. the ``.nbox`` archive ``path`` was unpacked from; default ``path``).

    Raises:
        InputNotFoundError: nothing there, or a rank's trace file named by the manifest is missing.
        BundleError: a malformed manifest.
        ReplayInputError: ranks that disagree on their collectives or process groups (the message names
            the group, the position and the ranks), or no trace at all.
    """
    trace_set, manifest = locate_traces(path)
    report = inspect_trace(trace_set)
    path = name if name is not None else path
    fatal = [p for p in report.all_problems() if p.severity == "error" and p.code in FATAL_CODES]
    if fatal:
        lines = "\n".join(f"  {p.message}" + (f" (rank {p.rank}" + (f", node {p.node_id})" if p.node_id is not None
                                                                        else ")") if p.rank is not None else "")
                          for p in fatal[:10])
        raise ReplayInputError(f"{path}: cannot replay: the ranks do not agree:\n{lines}")
    world = _recorded_world(manifest, trace_set, report.process_groups, [])
    groups = {name: (sorted(m) if m else list(range(world))) for name, m in report.process_groups.items()}
    device = "unknown"
    observed = None
    if manifest is not None:
        device = _bundle_device(manifest, trace_set)
        observed = observed_iteration_us(manifest.observed)  # under this version's rule, remade if need be
    warnings = sum(p.count for p in report.all_problems()) - len(fatal)
    return ReplaySource(str(path), trace_set, manifest, groups, world, device, observed, warnings,
                        mesh_facts(world, groups, report.ranks))
