"""``nbox bundle merge``: join the per-node bundles of one multi-node recording into one bundle of every rank.

Each node's ``nbox record --nnodes N --node-rank R --rdzv-endpoint ...`` writes a bundle of its own ranks; their
manifests carry the run's identity (``job.job_id``, the same random id on every node of one run, from the job's
rendezvous store) and the node (``job.nodes``). :func:`merge_bundles` checks that the inputs belong together, then
writes one bundle (atomically) whose traces are all of theirs, whose process groups are the union of theirs (a group
named in several must have the same members), and whose observed iteration time is recomputed over every rank (per
iteration, the mean over every rank of the job: ``manifest.job_iterations_us``).

Refused, naming the file (:class:`MergeError`, exit 3): an input that does not verify its own files, is incomplete,
not a multi-node recording, or of another kind; inputs from different runs (``job_id``, torchrun ``run_id``,
rendezvous endpoint), of a different world size or node count, different producer versions (nbox, torch, backend,
CUDA, NCCL), capture settings or anonymization; ranks recorded by two inputs; ranks of the world that no input
holds; a file (other than the traces and ``comm_group.json``) that two inputs hold with different contents; an
observed ``per_rank_us`` that is not a list of finite positive times per rank (``manifest.per_rank_times``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbox_trace import __version__
from nbox_trace.bundle.manifest import (
    COMM_GROUP_NAME,
    THREAD_CPU_KEY,
    TRACE_PREFIX,
    BundleError,
    Manifest,
    observed_summary,
    per_rank_times,
    read_manifest,
    verify_files,
    write_bundle,
)
from nbox_trace.errors import InvalidInputError, UsageError

__all__ = ["MergeError", "MergeResult", "merge_bundles"]

#: Producer keys that must agree across the inputs (a bundle mixing torch versions would not replay as one run).
SAME_PRODUCER = ("nbox", "torch", "backend", "cuda", "nccl")
#: Job keys that must agree: one run, one world.
SAME_JOB = ("job_id", "run_id", "rdzv_endpoint", "world_size", "nnodes")


class MergeError(InvalidInputError):
    """The bundles cannot be merged: the message names the file and what does not match."""


@dataclass(frozen=True)
class MergeResult:
    """What :func:`merge_bundles` wrote: the bundle, its ranks, the nodes (per input, its ranks) and the observed
    median iteration time over all ranks (microseconds)."""

    out: Path
    ranks: list[int]
    nodes: list[dict[str, Any]]
    observed_median_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"bundle": str(self.out), "ranks": self.ranks, "nodes": self.nodes,
                "observed_iteration_median_us": self.observed_median_us}


@dataclass(frozen=True)
class _Input:
    name: str          # as the user named it
    root: Path         # the directory (an archive unpacked)
    manifest: Manifest


def _open(path: Path, stack: contextlib.ExitStack) -> _Input:
    from nbox_trace.bundle.archive import bundle_directory

    try:
        root = stack.enter_context(bundle_directory(path))
        manifest = read_manifest(root)
    except BundleError as exc:
        raise MergeError(f"{path}: {exc}") from None
    problems = verify_files(root, manifest)
    if problems:
        raise MergeError(f"{path}: does not verify ({len(problems)} problem(s), first: {problems[0]}); "
                         f"run `nbox bundle verify {path}`")
    if not manifest.complete:
        raise MergeError(f"{path}: an incomplete bundle (written with --keep-partial); merge needs complete ones")
    job = manifest.job
    if job.get("nnodes") in (None, "1") or not job.get("job_id") or not isinstance(job.get("nodes"), list):
        raise MergeError(f"{path}: not one node's bundle of a multi-node recording (`nbox record --nnodes N "
                         f"--rdzv-endpoint ...` on each node writes those); nothing to merge it with")
    ranks = job.get("ranks_recorded")
    if not (isinstance(ranks, list) and ranks and all(type(r) is int and r >= 0 for r in ranks)):
        raise MergeError(f"{path}: job.ranks_recorded is {str(ranks)[:80]}, expected a non-empty list of ranks")
    return _Input(str(path), root, manifest)


def _same(inputs: Sequence[_Input], what: str, get: Any) -> None:
    """Refuse when ``get(manifest)`` differs between the first input and another, naming both files."""
    first = get(inputs[0].manifest)
    for other in inputs[1:]:
        value = get(other.manifest)
        if value != first:
            raise MergeError(f"{other.name}: {what} is {str(value)[:120]}, but {inputs[0].name} has "
                             f"{str(first)[:120]}: not bundles of one run")


def _check_together(inputs: Sequence[_Input]) -> None:
    _same(inputs, "kind", lambda m: m.kind)
    for key in SAME_JOB:
        _same(inputs, f"job.{key}", lambda m, k=key: m.job.get(k))
    for key in SAME_PRODUCER:
        _same(inputs, f"the producer's {key} version" if key != "backend" else "the backend",
              lambda m, k=key: m.producer.get(k))
    _same(inputs, "the capture settings", lambda m: {k: v for k, v in m.capture.items() if k != "source"})
    _same(inputs, "anonymization", lambda m: m.anonymized)
    owner: dict[int, str] = {}
    for inp in inputs:
        for r in inp.manifest.job["ranks_recorded"]:
            if r in owner:
                raise MergeError(f"{inp.name}: rank {r} is also recorded by {owner[r]}: the same node twice, or "
                                 f"bundles of different runs")
            owner[r] = inp.name
    world = inputs[0].manifest.job.get("world_size")
    if type(world) is int and world > 0:
        missing = sorted(set(range(world)) - set(owner))
        beyond = sorted(set(owner) - set(range(world)))
        if beyond:
            raise MergeError(f"{owner[beyond[0]]}: rank {beyond[0]} is outside the world of {world} rank(s)")
        if missing:
            raise MergeError(f"rank(s) {missing} of the world of {world} are in none of the bundles given "
                             f"({', '.join(i.name for i in inputs)}): merge the bundle of every node")


def _groups(inputs: Sequence[_Input]) -> dict[str, list[int]]:
    merged: dict[str, list[int]] = {}
    where: dict[str, str] = {}
    for inp in inputs:
        try:
            with open(inp.root / COMM_GROUP_NAME, "rb") as f:
                groups = json.loads(f.read(16 << 20))
        except (OSError, ValueError, RecursionError) as exc:
            raise MergeError(f"{inp.name}: {COMM_GROUP_NAME} is not readable JSON: {str(exc)[:160]}") from None
        if not isinstance(groups, dict):
            raise MergeError(f"{inp.name}: {COMM_GROUP_NAME} is not an object of group -> ranks")
        for name, members in groups.items():
            if name in merged and merged[name] != members:
                raise MergeError(f"{inp.name}: process group {name!r} has members {str(members)[:80]}, but "
                                 f"{where[name]} has {str(merged[name])[:80]}")
            merged.setdefault(name, members)
            where.setdefault(name, inp.name)
    return merged


def _files(inputs: Sequence[_Input], comm_group: bytes) -> dict[str, Path | bytes]:
    files: dict[str, Path | bytes] = {COMM_GROUP_NAME: comm_group}
    seen: dict[str, tuple[str, str]] = {}
    for inp in inputs:
        traces = {f"{TRACE_PREFIX}.{r}.et" for r in inp.manifest.job["ranks_recorded"]}
        for entry in inp.manifest.files:
            if entry.path == COMM_GROUP_NAME:
                continue
            if entry.path.startswith(TRACE_PREFIX + ".") and entry.path not in traces:
                raise MergeError(f"{inp.name}: {entry.path} is a trace of a rank its manifest does not record")
            if entry.path in seen and seen[entry.path][1] != entry.sha256:
                raise MergeError(f"{inp.name}: {entry.path} differs from the one in {seen[entry.path][0]}")
            seen.setdefault(entry.path, (inp.name, entry.sha256))
            files.setdefault(entry.path, inp.root / entry.path)
    return files


def _observed(inputs: Sequence[_Input]) -> dict[str, Any]:
    per_rank: dict[int, list[float]] = {}
    cpu: dict[str, Any] = {}  # each node's ranks' thread CPU figures, kept as they came (the replay checks them)
    for inp in inputs:
        node_cpu = inp.manifest.observed.get(THREAD_CPU_KEY)
        if isinstance(node_cpu, dict):
            cpu.update(node_cpu)
        try:
            per_rank.update(per_rank_times(inp.manifest.observed.get("per_rank_us")))
        except ValueError as err:
            raise MergeError(f"{inp.name}: {err}: the observed time cannot be merged") from None
    merged = observed_summary(per_rank)
    if cpu:
        merged[THREAD_CPU_KEY] = cpu
    return merged


def merge_bundles(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                  overwrite: bool = False) -> MergeResult:
    """Merge the per-node bundles ``paths`` (directories or ``.nbox`` archives) into the bundle directory ``out``.

    Raises:
        UsageError: fewer than two inputs, or one named twice.
        InputNotFoundError: an input does not exist or has no manifest.
        MergeError: see the module docstring (the message names the file).
        BundleWriteError: ``out`` exists without ``overwrite``, or writing failed (nothing is left behind).
    """
    named = [Path(p) for p in paths]
    if len(named) < 2:
        raise UsageError(f"nbox bundle merge: give two or more bundles (one per node), got {len(named)}")
    if len({p.resolve() for p in named}) < len(named):
        raise UsageError("nbox bundle merge: a bundle is named twice")
    with contextlib.ExitStack() as stack:
        inputs = sorted((_open(p, stack) for p in named), key=lambda i: min(i.manifest.job["ranks_recorded"]))
        _check_together(inputs)
        groups = _groups(inputs)
        comm_group = (json.dumps(groups, indent=1) + "\n").encode()
        files = _files(inputs, comm_group)
        first = inputs[0].manifest
        ranks = sorted(r for i in inputs for r in i.manifest.job["ranks_recorded"])
        nodes = [node for i in inputs for node in i.manifest.job["nodes"] if isinstance(node, dict)]
        job = {**first.job, "ranks_recorded": ranks, "process_groups": groups, "nodes": nodes}
        job.pop("node_rank", None)  # one node's fact; each node's is in job.nodes
        hardware = dict(first.hardware)
        if any(i.manifest.hardware != first.hardware for i in inputs[1:]):
            hardware["per_node"] = [i.manifest.hardware for i in inputs]
        extra = {k: v for k, v in first.extra.items() if k != "migrated_from"}
        extra["merged"] = {"nbox": __version__, "from": [Path(i.name).name for i in inputs]}
        manifest = Manifest(producer=first.producer, hardware=hardware, job=job, observed=_observed(inputs),
                            capture=first.capture, complete=True, kind=first.kind, anonymized=first.anonymized,
                            extra=extra)
        written = write_bundle(out, manifest, files, overwrite=overwrite)
    return MergeResult(written, ranks, [{"node_rank": n.get("node_rank"), "ranks": n.get("ranks"),
                                         "hostname": n.get("hostname"), "local_addr": n.get("local_addr")}
                                        for n in nodes],
                       float(manifest.observed["iteration_time_us"]["median"]))
