"""Verify a bundle (a directory, or a ``.nbox`` archive) received from someone else.

:func:`verify_bundle` runs the checks below in order and returns a :class:`VerifyReport`; the bundle
verifies only when every check holds. A check that cannot run because an earlier one failed is
reported as skipped (a failure), never as passed.

1. ``archive`` (archives only): unpacked member by member against the manifest into a temporary
   directory (:func:`nbox_trace.bundle.archive.unpack_bundle`: names, types, caps, sizes, streamed sha256).
2. ``manifest``: valid JSON of schema ``nbox_trace.bundle``, a version this nbox reads (older ones are
   migrated; a newer major is refused naming the nbox that wrote it), every key of the right type.
3. ``files``: every file the manifest lists and no other; each a regular file whose size matches
   (sizes are compared before any hashing), then its sha256, streamed.
4. ``layout``: one trace per recorded rank (``job.ranks_recorded``) and ``comm_group.json``; the
   manifest's process groups are those of ``comm_group.json``.
5. ``traces``: every rank's trace decodes and breaks no rule of ``nbox trace inspect --strict``.
6. ``collectives``: across ranks, each process group's collective sequence agrees (same type and size
   at each position on every member) and point-to-point sends and receives pair up.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox_trace.bundle.manifest import (
    COMM_GROUP_NAME,
    TRACE_PREFIX,
    BundleError,
    Manifest,
    read_manifest,
    trace_prefix,
    verify_files,
)
from nbox_trace.check import Problem, TraceReport, inspect_trace, iter_problem_lines
from nbox_trace.errors import InputNotFoundError, InvalidInputError

#: Version of the JSON document :meth:`VerifyReport.to_dict` produces.
VERIFY_SCHEMA = "nbox.bundle-verify/1"
#: Problem lines kept per check (the count is always complete).
MAX_DETAIL = 40
CHECKS = ("archive", "manifest", "files", "layout", "traces", "collectives")


@dataclass(frozen=True)
class Check:
    """One check: passed or not, and the problems found (each names the file, rank or node)."""

    name: str
    ok: bool
    problems: tuple[str, ...] = ()
    problem_count: int = 0
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "skipped": self.skipped, "problem_count": self.problem_count,
                "problems": list(self.problems)}


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify_bundle`."""

    path: str
    checks: tuple[Check, ...]
    version: str | None = None
    migrated_from: str | None = None
    kind: str | None = None
    ranks: tuple[int, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": VERIFY_SCHEMA, "path": self.path, "ok": self.ok, "version": self.version,
                "migrated_from": self.migrated_from, "kind": self.kind, "ranks": list(self.ranks),
                "checks": [c.to_dict() for c in self.checks]}

    def lines(self) -> list[str]:
        head = f"{self.path}: {'verified' if self.ok else 'NOT verified'}"
        if self.version:
            head += f" (bundle version {self.version}"
            head += f", migrated from {self.migrated_from})" if self.migrated_from else ")"
        out = [head]
        for c in self.checks:
            state = "skipped" if c.skipped else ("ok" if c.ok else f"FAILED ({c.problem_count} problem(s))")
            out.append(f"  {c.name:<12} {state}")
            out.extend(f"    {p}" for p in c.problems)
            if c.problem_count > len(c.problems):
                out.append(f"    ... {c.problem_count - len(c.problems)} more (--json lists up to {MAX_DETAIL})")
        return out


def _check(name: str, problems: list[str]) -> Check:
    return Check(name, not problems, tuple(problems[:MAX_DETAIL]), len(problems))


def _skipped(names: tuple[str, ...], why: str) -> list[Check]:
    return [Check(n, False, (f"not checked: {why}",), 0, skipped=True) for n in names]


def _layout(root: Path, manifest: Manifest) -> list[str]:
    problems = []
    listed = {f.path for f in manifest.files}
    ranks = manifest.job.get("ranks_recorded")
    if not (isinstance(ranks, list) and ranks and all(type(r) is int and r >= 0 for r in ranks)):
        return [f"manifest.json: job.ranks_recorded is {str(ranks)[:80]}, expected a non-empty list of ranks"]
    traces = {p for p in listed if p.startswith(TRACE_PREFIX + ".") and p.endswith(".et")}
    expected = {f"{TRACE_PREFIX}.{r}.et" for r in ranks}
    problems += [f"{p}: job.ranks_recorded names this rank but the manifest lists no such trace"
                 for p in sorted(expected - traces)]
    problems += [f"{p}: a trace of a rank not in job.ranks_recorded {ranks}" for p in sorted(traces - expected)]
    if COMM_GROUP_NAME not in listed:
        problems.append(f"{COMM_GROUP_NAME}: not listed in the manifest")
        return problems
    try:
        with open(root / COMM_GROUP_NAME, "rb") as f:
            groups = json.loads(f.read(16 << 20))
    except (OSError, ValueError, RecursionError) as exc:
        return [*problems, f"{COMM_GROUP_NAME}: not readable JSON: {str(exc)[:200]}"]
    declared = manifest.job.get("process_groups")
    if isinstance(declared, dict) and declared != groups:
        names = sorted(set(declared) ^ set(groups) if isinstance(groups, dict) else set(declared))[:5]
        problems.append(f"manifest.json: job.process_groups differ from {COMM_GROUP_NAME}"
                        + (f" (groups only in one: {names})" if names else " (members differ)"))
    return problems


def _verify_dir(root: Path, shown: str, before: list[Check]) -> VerifyReport:
    try:
        manifest = read_manifest(root)
    except BundleError as exc:
        checks = [*before, Check("manifest", False, (str(exc),), 1)]
        return VerifyReport(shown, tuple(checks + _skipped(CHECKS[2:], "the manifest is not valid")))
    checks = [*before, Check("manifest", True)]
    files = verify_files(root, manifest)
    checks.append(_check("files", files))
    layout = _layout(root, manifest)
    checks.append(_check("layout", layout))

    def report(ranks: tuple[int, ...] = ()) -> VerifyReport:
        migrated = manifest.extra.get("migrated_from")
        return VerifyReport(shown, tuple(checks), manifest.version, str(migrated) if migrated else None,
                            manifest.kind, ranks)

    if files or layout:
        checks += _skipped(("traces", "collectives"), "the files do not match the manifest")
        return report()
    try:
        trace_report = inspect_trace(trace_prefix(root), comm_group=root / COMM_GROUP_NAME)
    except InvalidInputError as exc:
        checks += [Check("traces", False, (str(exc),), 1), *_skipped(("collectives",), "a trace does not decode")]
        return report()
    per_rank = [line for r in trace_report.ranks for line in _lines(r.problems, trace_report)]
    cross = _lines(trace_report.problems, trace_report)
    checks += [Check("traces", not per_rank, tuple(per_rank[:MAX_DETAIL]),
                     sum(p.count for r in trace_report.ranks for p in r.problems)),
               Check("collectives", not cross, tuple(cross[:MAX_DETAIL]), sum(p.count for p in trace_report.problems))]
    return report(tuple(r.rank for r in trace_report.ranks))


def _lines(problems: list[Problem], report: TraceReport) -> list[str]:
    """Problem lines of ``problems`` only, worded as ``nbox trace inspect`` words them."""
    sub = TraceReport(report.prefix, report.directory, [], report.process_groups, report.process_groups_source,
                      list(problems))
    return list(iter_problem_lines(sub))


def verify_bundle(bundle: str | os.PathLike[str]) -> VerifyReport:
    """Run every check of the module docstring on a bundle directory or a ``.nbox`` archive.

    Raises:
        InputNotFoundError: nothing at ``bundle``, or a directory without ``manifest.json``.
    """
    path = Path(bundle)
    if path.is_dir():
        return _verify_dir(path, str(path), [])
    from nbox_trace.bundle.archive import ArchiveError, bundle_directory

    if not path.is_file():
        raise InputNotFoundError(f"{path}: no such bundle directory or archive")
    with contextlib.ExitStack() as stack:
        try:
            unpacked = stack.enter_context(bundle_directory(path))
        except (ArchiveError, BundleError) as exc:
            checks = [Check("archive", False, (str(exc),), 1), *_skipped(CHECKS[1:], "the archive was refused")]
            return VerifyReport(str(path), tuple(checks))
        return _verify_dir(unpacked, str(path), [Check("archive", True)])


__all__ = ["CHECKS", "VERIFY_SCHEMA", "Check", "VerifyReport", "verify_bundle"]
