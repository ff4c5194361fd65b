"""Summarize one bundle: the manifest's facts, a per-rank summary of its traces, and its size on disk.

:func:`inspect_bundle` is a pure function over a bundle directory (see :mod:`nbox_trace.bundle`): it reads
``manifest.json`` (validating it, migrating older versions), runs :func:`nbox_trace.check.inspect_trace`
over ``trace/trace.<rank>.et`` with the bundle's ``comm_group.json``, and returns a frozen
:class:`BundleSummary` whose :meth:`~BundleSummary.to_dict` is JSON-ready (schema
:data:`INSPECT_SCHEMA`) and whose :meth:`~BundleSummary.lines` are for humans. Times in microseconds.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbox_trace.bundle.manifest import COMM_GROUP_NAME, MANIFEST_NAME, Manifest, read_manifest, trace_prefix
from nbox_trace.check import RankReport, TraceReport, inspect_trace
from nbox_trace.mesh import RecordedMesh, infer_mesh, mesh_facts
from nbox_trace.units import format_bytes, format_in, time_unit

#: Version of the JSON document :meth:`BundleSummary.to_dict` produces.
INSPECT_SCHEMA = "nbox.bundle-inspect/1"
_ITER_KEYS = ("median", "p10", "p90", "n")


@dataclass(frozen=True)
class CollectiveSummary:
    """Collectives of one type on one process group of one rank: how many and how many bytes in all."""

    pg_name: str
    comm_type: str
    count: int
    total_bytes: int


@dataclass(frozen=True)
class RankSummary:
    """One rank's trace. ``comp_duration_us`` is the sum of COMP node durations."""

    rank: int
    path: str
    file_bytes: int
    node_count: int
    nodes_by_type: dict[str, int]
    comp_duration_us: int
    collectives: tuple[CollectiveSummary, ...]
    p2p_sends: int
    p2p_recvs: int
    p2p_bytes_sent: int
    depth: int
    critical_path_us: int
    problem_count: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["collectives"] = [asdict(c) for c in self.collectives]
        return out


@dataclass(frozen=True)
class FileSize:
    """One file of the bundle: the size the manifest lists and the size on disk (None: missing)."""

    path: str
    listed_bytes: int
    disk_bytes: int | None


@dataclass(frozen=True)
class BundleSummary:
    """Everything :func:`inspect_bundle` says about one bundle."""

    path: str
    schema_version: str
    migrated_from: str | None
    kind: str
    anonymized: dict[str, Any] | None
    complete: bool
    producer: dict[str, Any]
    hardware: dict[str, Any]
    world_size: int | None
    ranks_recorded: tuple[int, ...]
    #: process group name -> its global ranks (None: membership unknown).
    process_groups: dict[str, list[int] | None]
    script: str | None
    args: tuple[str, ...]
    job: dict[str, Any]
    #: {median, p10, p90, n} of the observed iteration time, or None when not measured.
    iteration_time_us: dict[str, float] | None
    capture: dict[str, Any]
    ranks: tuple[RankSummary, ...]
    problem_count: int
    files: tuple[FileSize, ...]
    manifest_bytes: int
    #: sum of every listed file on disk plus ``manifest.json``.
    size_on_disk_bytes: int
    #: the parallelism the process groups form (:mod:`nbox_trace.mesh`); None without a world size.
    mesh: RecordedMesh | None = None

    @property
    def missing_files(self) -> tuple[str, ...]:
        """Files the manifest lists that are not on disk (a deleted trace is not summarized, so say so)."""
        return tuple(f.path for f in self.files if f.disk_bytes is None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": INSPECT_SCHEMA}
        for key in self.__dataclass_fields__:
            out[key] = getattr(self, key)
        out["missing_files"] = list(self.missing_files)
        out["ranks_recorded"] = list(self.ranks_recorded)
        out["args"] = list(self.args)
        out["ranks"] = [r.to_dict() for r in self.ranks]
        out["files"] = [asdict(f) for f in self.files]
        out["mesh"] = self.mesh.to_dict() if self.mesh is not None else None
        return out

    def lines(self) -> list[str]:
        out = [f"bundle {self.path}: {self.kind}, version {self.schema_version}"
               + (f" (migrated from {self.migrated_from})" if self.migrated_from else "")
               + ("" if self.complete else ", INCOMPLETE")
               + (f", anonymized ({self.anonymized.get('level', '?')})" if self.anonymized else "")]
        for part in ("producer", "hardware"):
            facts = ", ".join(f"{k} {v}" for k, v in sorted(getattr(self, part).items()) if v not in (None, ""))
            out.append(f"{part}: {facts or 'not recorded in the manifest'}")
        cmd = " ".join([self.script or "?", *self.args])
        out.append(f"job: world size {self.world_size}, ranks recorded {list(self.ranks_recorded)}, command: {cmd}")
        for pg, members in sorted(self.process_groups.items()):
            out.append(f"  process group {pg!r}: ranks {members if members is not None else 'unknown'}")
        if self.mesh is not None:
            out += self.mesh.lines()
        it = self.iteration_time_us
        if it is None:
            out.append("observed iteration time: not measured")
        else:
            unit = time_unit([it["median"], it["p10"], it["p90"]])
            out.append(f"observed iteration time ({unit[0]}): median {format_in(it['median'], unit)}, "
                       f"p10 {format_in(it['p10'], unit)}, p90 {format_in(it['p90'], unit)} (n={it['n']})")
        out.append("capture: " + ", ".join(f"{k} {v}" for k, v in sorted(self.capture.items())))
        cu = time_unit(r.comp_duration_us for r in self.ranks)  # one unit across the ranks' lines
        pu = time_unit(r.critical_path_us for r in self.ranks)
        for r in self.ranks:
            colls = "; ".join(f"{c.comm_type}@{c.pg_name} x{c.count} {format_bytes(c.total_bytes)}"
                              for c in r.collectives)
            out.append(f"rank {r.rank}: {r.node_count} nodes, compute {format_in(r.comp_duration_us, cu)} {cu[0]}, "
                       f"critical path {format_in(r.critical_path_us, pu)} {pu[0]}, collectives: {colls or 'none'}"
                       + (f", p2p {r.p2p_sends} send / {r.p2p_recvs} recv" if r.p2p_sends or r.p2p_recvs else ""))
        out.append(f"trace problems: {self.problem_count}")
        out.extend(f"MISSING: {path} is listed in the manifest but not on disk" for path in self.missing_files)
        present = len(self.files) - len(self.missing_files) + 1
        out.append(f"size on disk: {format_bytes(self.size_on_disk_bytes)} in {present} files")
        return out


def _iteration_time(observed: dict[str, Any]) -> dict[str, float] | None:
    it = observed.get("iteration_time_us")
    if not isinstance(it, dict) or not all(isinstance(it.get(k), int | float) for k in _ITER_KEYS):
        return None
    return {k: it[k] for k in _ITER_KEYS}


def _process_groups(manifest: Manifest, report: TraceReport) -> dict[str, list[int] | None]:
    """The manifest's groups, else the trace's; a conventional world group ('' or '0', None) only if used."""
    ws = manifest.job.get("world_size")
    used = {c.pg_name for r in report.ranks for c in r.collectives}
    groups: dict[str, list[int] | None] = {}
    for name, members in report.process_groups.items():
        if members is not None:
            groups[name] = list(members)
        elif name in used:
            groups[name] = list(range(ws)) if type(ws) is int and ws > 0 else None
    raw = manifest.job.get("process_groups")
    if isinstance(raw, dict):
        for name, members in raw.items():
            if isinstance(members, list) and all(type(m) is int for m in members):
                groups[str(name)] = list(members)
    return dict(sorted(groups.items()))


def _rank_summary(rank: RankReport, root: Path) -> RankSummary:
    """``path`` is relative to the bundle (the same for a directory and for its unpacked archive)."""
    colls = tuple(CollectiveSummary(c.pg_name, c.comm_type, c.count, c.total_bytes) for c in rank.collectives)
    try:
        path = Path(rank.path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        path = rank.path
    return RankSummary(rank.rank, path, rank.file_bytes, rank.node_count, dict(rank.nodes_by_type),
                       rank.comp_duration_us, colls, rank.p2p_sends, rank.p2p_recvs, rank.p2p_bytes_sent,
                       rank.depth, rank.critical_path_us, sum(p.count for p in rank.problems))


def load_bundle(bundle: str | os.PathLike[str]) -> tuple[Manifest, TraceReport]:
    """The validated manifest and the trace report of a bundle directory.

    Raises:
        InputNotFoundError: not a bundle (no manifest), or no trace files in it.
        InvalidInputError: a bad manifest (BundleError) or an undecodable trace (TraceDecodeError).
    """
    root = Path(bundle)
    manifest = read_manifest(root)
    comm_group = root / COMM_GROUP_NAME
    report = inspect_trace(trace_prefix(root), comm_group=comm_group if comm_group.is_file() else None)
    return manifest, report


def summarize(root: Path, manifest: Manifest, report: TraceReport) -> BundleSummary:
    """Build the summary from an already loaded manifest and trace report (see :func:`load_bundle`)."""
    files = []
    for entry in manifest.files:
        p = root / entry.path
        files.append(FileSize(entry.path, entry.bytes, p.stat().st_size if p.is_file() else None))
    manifest_bytes = (root / MANIFEST_NAME).stat().st_size
    job = manifest.job
    ws = job.get("world_size")
    recorded = job.get("ranks_recorded")
    args = job.get("args")
    script = job.get("script")
    groups = _process_groups(manifest, report)
    mesh = infer_mesh(mesh_facts(ws, groups, report.ranks)) if type(ws) is int and ws > 0 else None
    return BundleSummary(
        path=str(root), schema_version=manifest.version, migrated_from=manifest.extra.get("migrated_from"),
        kind=manifest.kind, anonymized=manifest.anonymized, complete=manifest.complete,
        producer=dict(manifest.producer), hardware=dict(manifest.hardware),
        world_size=ws if type(ws) is int else None,
        ranks_recorded=tuple(r for r in recorded if type(r) is int) if isinstance(recorded, list)
        else tuple(report_rank.rank for report_rank in report.ranks),
        process_groups=groups,
        script=script if isinstance(script, str) else None,
        args=tuple(str(a) for a in args) if isinstance(args, list) else (),
        job=dict(job), iteration_time_us=_iteration_time(manifest.observed), capture=dict(manifest.capture),
        ranks=tuple(_rank_summary(r, root) for r in report.ranks), problem_count=report.problem_count(),
        files=tuple(files), manifest_bytes=manifest_bytes,
        size_on_disk_bytes=manifest_bytes + sum(f.disk_bytes or 0 for f in files), mesh=mesh)


def inspect_bundle(bundle: str | os.PathLike[str]) -> BundleSummary:
    """Summarize a bundle directory: manifest facts, per-rank trace summaries, size on disk.

    Raises:
        InputNotFoundError: not a bundle (no manifest), or no trace files in it.
        InvalidInputError: a bad manifest, or a trace file that cannot be decoded (the message names it).
    """
    root = Path(bundle)
    manifest, report = load_bundle(root)
    return summarize(root, manifest, report)


__all__ = ["INSPECT_SCHEMA", "BundleSummary", "CollectiveSummary", "FileSize", "RankSummary", "inspect_bundle",
           "load_bundle", "summarize"]
