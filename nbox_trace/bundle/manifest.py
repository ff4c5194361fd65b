"""Trace bundles: per-rank Chakra ETs plus ``manifest.json``, written atomically, read as untrusted.

Layout of a bundle directory (schema ``nbox_trace.bundle`` 1.x)::

    manifest.json           the facts below, and a sha256 + size for every other file
    trace/trace.<rank>.et   one Chakra ET per recorded rank (``prefix`` = ``trace/trace``)
    comm_group.json         {"<pg_name>": [global ranks]}, ASTRA-sim's process-group file

The manifest records: schema version; producer versions (nbox, torch, backend, CUDA/NCCL if any, Python); hardware;
the job (world size, ranks recorded, process groups with global ranks, parallelism, the command); the observed
iteration time from un-instrumented iterations (microseconds: median, p10, p90 and every sample per rank); how the
capture was made; whether it is complete.

``observed.thread_cpu_us`` (optional; a reader that does not know it ignores it), per rank ``"<rank>"``, in
microseconds: the training thread's time on a CPU per clean iteration (``clean``) and per captured one
(``captured``), the captured iterations' wall time (``captured_wall``), the time runnable but waiting for a CPU per
clean iteration (``clean_run_queue``), ``cpu_share`` (the rank's CPU quota as a fraction of one CPU; absent without
one: nbox_trace/threadtime.py), and ``clean_segments``: per clean iteration, ``[on CPU, run queue]`` of each segment
of the thread's time between the collectives it issued (nbox_record/capture/segments.py), checked on read
(:data:`MAX_SEGMENT_ITERATIONS`, :data:`MAX_SEGMENTS`, finite non-negative numbers; a malformed one refuses the
bundle, naming the key). The replay reads them for its profiler correction (``nbox_replay.inputs.profiler``) and the
live replay's host-work pad (``nbox_replay.live.hostwork``).

Writing goes to a temporary directory beside the target, renamed into place at the end, so an interrupted ``nbox
record`` never leaves a half-written bundle under the final name. Reading treats every byte as untrusted: size caps,
no path outside the bundle, versions checked, nothing executed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from nbox_trace import __version__
from nbox_trace.chakra import TraceSet, resolve_trace_set
from nbox_trace.errors import InputNotFoundError, InvalidInputError, NboxError

BUNDLE_SCHEMA = "nbox.bundle"
#: major.minor. A reader refuses a newer major (it may mean anything); a newer minor only adds keys.
BUNDLE_VERSION = "1.1"
MANIFEST_NAME = "manifest.json"
TRACE_PREFIX = "trace/trace"
COMM_GROUP_NAME = "comm_group.json"
MAX_MANIFEST_BYTES = 16 << 20
#: Files a manifest may list.
MAX_FILES = 4096
_HASH_CHUNK = 1 << 20


class BundleError(InvalidInputError):
    """A bundle (or its manifest) is malformed, inconsistent, or from an unsupported version."""


class BundleWriteError(NboxError):
    """A bundle could not be written."""

    exit_code = 5


@dataclass(frozen=True)
class FileEntry:
    """One file of the bundle: path relative to the bundle root (POSIX), size and sha256."""

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``. Times in microseconds; see the module docstring for the meaning of each part."""

    producer: dict[str, Any]
    hardware: dict[str, Any]
    job: dict[str, Any]
    observed: dict[str, Any]
    capture: dict[str, Any]
    complete: bool = True
    files: tuple[FileEntry, ...] = ()
    schema: str = BUNDLE_SCHEMA
    version: str = BUNDLE_VERSION
    #: what made it: "recorded" (nbox record), "imported" (record convert), "emulated" (nbox emulate -o).
    kind: str = "recorded"
    #: null, or what ``nbox bundle anonymize`` did: {"level", "key_id", "nbox"}.
    anonymized: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["files"] = [asdict(f) for f in self.files]
        extra = dict(out.pop("extra"))
        extra.pop("migrated_from", None)  # a fact about the file read, not part of the manifest
        out.update(extra)  # keys from a newer minor version, kept as they came
        return out


#: How :func:`job_iterations_us` makes the job's iteration from its ranks' (stored as ``observed.rule``).
OBSERVED_RULE = "per iteration, the mean over ranks (the job's pace); un-instrumented iterations only"


def job_iterations_us(per_rank_us: Mapping[int, Sequence[float]]) -> list[float]:
    """The job's iteration times from each rank's own (one list per rank, iteration ``i`` at index ``i``; the
    shortest list sets the count): per iteration, the mean over ranks.

    The ranks of a synchronous job advance in lock step: over a window every rank completes the same iterations,
    so each rank's window (the sum of its times) is the job's, up to where each rank's clock starts and stops.
    Their mean per iteration is the job's pace. The largest rank's time of each iteration is not: where a rank's
    boundary falls (after its optimizer step, say) moves from one iteration to the next by a rank's own jitter, and
    the largest of W such intervals grows with W while the job's pace does not, and can exceed every rank's own
    window (docs/results.md, "The job's iteration time"). The same holds on a GPU cluster, for any ranks that
    time their own iterations.

    Raises:
        ValueError: no rank, or a rank with no time.
    """
    if not per_rank_us or not all(per_rank_us.values()):
        raise ValueError("the job's iterations need at least one timed iteration per rank")
    n = min(len(v) for v in per_rank_us.values())
    ranks = list(per_rank_us.values())
    return [math.fsum(float(times[i]) for times in ranks) / len(ranks) for i in range(n)]


def observed_summary(per_rank_us: Mapping[int, list[float]]) -> dict[str, Any]:
    """The observed iteration time: median, p10, p90 over the job's iterations (:func:`job_iterations_us`: per
    iteration, the mean over ranks). Percentiles use the inclusive method of :func:`statistics.quantiles`.
    Bundles written before this rule carry ``"per iteration, the slowest rank"`` in ``rule``.

    Raises:
        ValueError: no rank, or a rank with no time.
    """
    job = job_iterations_us(per_rank_us)
    if len(job) >= 2:
        deciles = statistics.quantiles(job, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    else:
        p10 = p90 = job[0]
    return {
        "iteration_time_us": {"median": statistics.median(job), "p10": p10, "p90": p90, "n": len(job),
                              "min": min(job), "max": max(job)},
        "rule": OBSERVED_RULE,
        "per_rank_us": {str(r): list(v) for r, v in sorted(per_rank_us.items())},
    }


#: The most ranks, and iterations per rank, :func:`per_rank_times` accepts (untrusted input).
MAX_REMADE_RANKS, MAX_REMADE_ITERATIONS = 65_536, 100_000


def per_rank_times(raw: object) -> dict[int, list[float]]:
    """A manifest's ``observed.per_rank_us`` checked (untrusted): a mapping of rank numbers to non-empty lists of
    finite positive times, at most :data:`MAX_REMADE_RANKS` ranks of :data:`MAX_REMADE_ITERATIONS` each.

    Raises:
        ValueError: names the first bad part (``observed.per_rank_us is missing``, ``observed.per_rank_us['x'] is
            not a list of times``).
    """
    if not isinstance(raw, Mapping) or not 0 < len(raw) <= MAX_REMADE_RANKS:
        raise ValueError("observed.per_rank_us is missing")
    per_rank: dict[int, list[float]] = {}
    for key, times in raw.items():
        if (not isinstance(key, str) or not key.isdigit() or not isinstance(times, list)
                or not 0 < len(times) <= MAX_REMADE_ITERATIONS
                or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0
                           for t in times)):
            raise ValueError(f"observed.per_rank_us[{str(key)[:20]!r}] is not a list of times")
        per_rank[int(key)] = [float(t) for t in times]
    return per_rank


def observed_iteration_us(observed: Mapping[str, Any]) -> dict[str, Any] | None:
    """A manifest's observed iteration time (``iteration_time_us``: median, p10, p90, n, ...) under this version's
    rule (:data:`OBSERVED_RULE`): as stored when the manifest names that rule; remade from its ``per_rank_us`` when it
    names another (or none: bundles written before the rule took the slowest rank per iteration) and those lists
    pass :func:`per_rank_times`; else as stored. None without one. A remade summary carries ``remade_from`` (the
    stored rule)."""
    stored = observed.get("iteration_time_us") or None
    if not isinstance(stored, Mapping):
        return None
    rule = observed.get("rule")
    if rule == OBSERVED_RULE:
        return dict(stored)
    try:
        per_rank = per_rank_times(observed.get("per_rank_us"))
    except ValueError:
        return dict(stored)
    remade: dict[str, Any] = dict(observed_summary(per_rank)["iteration_time_us"])
    remade["remade_from"] = rule if isinstance(rule, str) else "per iteration, the slowest rank"
    return remade


#: ``observed`` key of the per-rank thread CPU figures (module docstring) and the lists each rank may carry.
THREAD_CPU_KEY = "thread_cpu_us"
THREAD_CPU_LISTS = ("clean", "captured", "captured_wall", "clean_run_queue")
#: Per rank, the clean iterations' segments between collectives (module docstring), and its caps (untrusted).
SEGMENTS_KEY = "clean_segments"
MAX_SEGMENT_ITERATIONS = 10_000
MAX_SEGMENTS = 100_000


def thread_cpu_figures(per_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``observed.thread_cpu_us`` from each rank's ``timings.json`` (``iteration_cpu_us``, ``capture_cpu_us``,
    ``capture_iteration_us``, and ``iteration_run_queue_us`` as ``clean_run_queue``: the training thread's time
    runnable but waiting for a CPU per clean iteration, nbox_trace/threadtime.py), and ``iteration_segments_us``
    as :data:`SEGMENTS_KEY` where every clean iteration has its segments, and ``cpu_share`` where the rank ran under a
    CPU quota; ranks that lack the clean or the captured CPU times are left out."""
    out: dict[str, dict[str, Any]] = {}
    for rank, t in sorted(per_rank.items()):
        clean, captured, wall = t.get("iteration_cpu_us"), t.get("capture_cpu_us"), t.get("capture_iteration_us")
        queued = t.get("iteration_run_queue_us")
        if isinstance(clean, list) and clean and isinstance(captured, list) and captured:
            out[str(rank)] = {"clean": [float(x) for x in clean], "captured": [float(x) for x in captured],
                              "captured_wall": [float(x) for x in wall] if isinstance(wall, list) else [],
                              "clean_run_queue": [float(x) for x in queued] if isinstance(queued, list) else []}
            share = t.get("cpu_share")
            if isinstance(share, (int, float)) and not isinstance(share, bool) and math.isfinite(share) and share > 0:
                out[str(rank)]["cpu_share"] = float(share)
            segments = t.get("iteration_segments_us")
            if isinstance(segments, list) and len(segments) == len(clean):
                out[str(rank)][SEGMENTS_KEY] = [[[float(c), float(q)] for c, q in segs] for segs in segments]
    return out


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def check_segments(observed: Mapping[str, Any], where: str) -> None:
    """Refuse a malformed ``observed.thread_cpu_us.<rank>.clean_segments`` (module docstring); absent is fine.

    Raises:
        BundleError: one line naming the key and what is wrong.
    """
    per_rank = observed.get(THREAD_CPU_KEY)
    if not isinstance(per_rank, Mapping):
        return
    for rank, entry in per_rank.items():
        if not isinstance(entry, Mapping) or SEGMENTS_KEY not in entry:
            continue
        key = f"observed.{THREAD_CPU_KEY}[{str(rank)[:20]!r}].{SEGMENTS_KEY}"
        iterations = entry[SEGMENTS_KEY]
        if not isinstance(iterations, list) or len(iterations) > MAX_SEGMENT_ITERATIONS:
            raise BundleError(f"{where}: {key} must be a list of at most {MAX_SEGMENT_ITERATIONS} iterations")
        for i, segs in enumerate(iterations):
            if not isinstance(segs, list) or not segs or len(segs) > MAX_SEGMENTS:
                raise BundleError(f"{where}: {key}[{i}] must be a list of 1 to {MAX_SEGMENTS} segments")
            for k, seg in enumerate(segs):
                if not (isinstance(seg, list) and len(seg) == 2 and all(_number(x) for x in seg)):
                    raise BundleError(f"{where}: {key}[{i}][{k}] must be [cpu_us, run_queue_us], two finite "
                                      f"non-negative numbers, got {str(seg)[:60]}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_relpath(rel: str, where: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or rel.startswith("./") or "\0" in rel:
        raise BundleError(f"{where}: file path {rel!r} is not a plain relative path inside the bundle")
    return p


@contextlib.contextmanager
def staged_directory(target: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """A fresh directory beside ``target`` to fill; when the block ends without error it is renamed to
    ``target`` (replacing what is there: a directory, a file or a link, never followed), otherwise it is
    removed, so nothing half-written is ever left. Every writer of a bundle directory goes through it.

    Raises:
        BundleWriteError: ``target`` exists and not ``overwrite``; a directory cannot be created or
            renamed (an ``OSError`` inside the block becomes one too).
    """
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise BundleWriteError(f"{target}: already exists (use --overwrite to replace it)")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise BundleWriteError(f"{target}: cannot create a directory in {parent}: {exc.strerror or exc}") from exc
    try:
        yield tmp
        if target.exists() or target.is_symlink():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        else:
            os.replace(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise BundleWriteError(f"{target}: write failed: {exc.strerror or exc}") from exc
        raise


def write_bundle(out: str | os.PathLike[str], manifest: Manifest, files: Mapping[str, Path | bytes], *,
                 overwrite: bool = False) -> Path:
    """Write a bundle directory atomically; return its path.

    Args:
        out: the bundle directory to create.
        manifest: everything but ``files``, which is computed here (size + sha256 of each file).
        files: bundle-relative POSIX path -> source file (copied) or bytes.
        overwrite: replace an existing ``out`` (only once the new bundle is complete).

    Raises:
        BundleWriteError: ``out`` exists (without overwrite), or a write failed; nothing is left behind.
    """
    target = Path(out)
    with staged_directory(target, overwrite=overwrite) as tmp:
        entries = []
        for rel, src in sorted(files.items()):
            if rel == MANIFEST_NAME:
                raise BundleWriteError(f"{target}: {MANIFEST_NAME} is written by write_bundle, not passed in")
            _check_relpath(rel, str(target))
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, bytes):
                dest.write_bytes(src)
            else:
                shutil.copyfile(src, dest)
            entries.append(FileEntry(rel, dest.stat().st_size, _sha256(dest)))
        final = Manifest(**{**{k: getattr(manifest, k) for k in manifest.__dataclass_fields__},
                            "files": tuple(entries)})
        (tmp / MANIFEST_NAME).write_text(json.dumps(final.to_dict(), indent=1, sort_keys=True) + "\n")
        for path in [tmp, *tmp.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return target


#: Oldest version this nbox still reads, by migrating it (see :data:`MIGRATIONS`).
OLDEST_READABLE_VERSION = "1.0"


def _migrate_1_0(data: dict[str, Any]) -> dict[str, Any]:
    """1.0 -> 1.1: ``kind`` (what made the bundle) and ``anonymized`` (null: not anonymized) were added."""
    capture = data.get("capture")
    capture = capture if isinstance(capture, dict) else {}
    kind = "imported" if capture.get("source") == "nbox record convert" else "recorded"
    return {**data, "kind": kind, "anonymized": None, "version": "1.1"}


#: version -> function turning a manifest of that version into one of the next version.
MIGRATIONS = {"1.0": _migrate_1_0}
BUNDLE_KINDS = ("recorded", "imported", "emulated")


def _version_tuple(version: object, where: str) -> tuple[int, int]:
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise BundleError(f"{where}: key 'version' is {version!r}, expected 'MAJOR.MINOR'")
    return int(parts[0]), int(parts[1])


def migrate_manifest(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Bring a decoded manifest of any readable version to :data:`BUNDLE_VERSION`.

    A newer minor version of the current major is read as it is (minors only add keys, kept in
    ``extra``). A newer major is refused, naming the nbox that wrote it; an older version with no
    migration is refused, naming the oldest one this nbox reads.
    """
    major, minor = _version_tuple(data.get("version"), where)
    cur_major, cur_minor = _version_tuple(BUNDLE_VERSION, "BUNDLE_VERSION")
    if major > cur_major:
        producer = data.get("producer")
        producer = producer if isinstance(producer, dict) else {}
        writer = producer.get("nbox") if isinstance(producer.get("nbox"), str) else None
        by = f"written by nbox {writer[:40]}" if writer else "written by a newer nbox"
        raise BundleError(f"{where}: bundle version {data['version']} ({by}) is newer than this nbox "
                          f"({__version__}) reads (up to {cur_major}.x); read it with "
                          f"{'nbox ' + writer[:40] if writer else 'that nbox'} or later")
    seen = 0
    while (major, minor) < (cur_major, cur_minor):
        step = MIGRATIONS.get(data["version"])
        if step is None or seen > len(MIGRATIONS):
            raise BundleError(f"{where}: bundle version {data['version']} is too old; this nbox reads "
                              f"{OLDEST_READABLE_VERSION} to {BUNDLE_VERSION}")
        data = step(data)
        major, minor = _version_tuple(data.get("version"), where)
        seen += 1
    return data


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """Decode and validate the bytes of a ``manifest.json`` (from a directory or an archive member).

    Older versions are migrated (:func:`migrate_manifest`); ``Manifest.version`` is then the current one
    and ``Manifest.extra['migrated_from']`` the version on disk.

    Raises:
        BundleError: over the size cap, not JSON, a newer major version, or a key missing or mistyped.
    """
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: {len(raw)} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{where}: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != BUNDLE_SCHEMA:
        raise BundleError(f"{where}: key 'schema' is {str(data.get('schema'))[:80]!r}, expected {BUNDLE_SCHEMA!r}")
    on_disk = data.get("version")
    data = migrate_manifest(data, where)
    for key in ("producer", "hardware", "job", "observed", "capture"):
        if not isinstance(data.get(key), dict):
            raise BundleError(f"{where}: key {key!r} missing or not an object")
    check_segments(data["observed"], where)
    if not isinstance(data.get("complete"), bool):
        raise BundleError(f"{where}: key 'complete' missing or not true/false")
    if data.get("kind") not in BUNDLE_KINDS:
        raise BundleError(f"{where}: key 'kind' is {str(data.get('kind'))[:80]!r}, expected one of {BUNDLE_KINDS}")
    if data.get("anonymized") is not None and not isinstance(data.get("anonymized"), dict):
        raise BundleError(f"{where}: key 'anonymized' must be null or an object")
    raw_files = data.get("files")
    if not isinstance(raw_files, list):
        raise BundleError(f"{where}: key 'files' missing or not a list")
    if len(raw_files) > MAX_FILES:
        raise BundleError(f"{where}: lists {len(raw_files)} files, over the cap of {MAX_FILES}")
    entries = []
    seen = set()
    for i, f in enumerate(raw_files):
        if not (isinstance(f, dict) and isinstance(f.get("path"), str) and type(f.get("bytes")) is int
                and f["bytes"] >= 0 and isinstance(f.get("sha256"), str) and len(f["sha256"]) == 64
                and all(c in "0123456789abcdef" for c in f["sha256"])):
            raise BundleError(f"{where}: files[{i}] is not {{path, bytes >= 0, sha256 (64 hex digits)}}")
        _check_relpath(f["path"], f"{where}: files[{i}]")
        if f["path"] == MANIFEST_NAME or f["path"] in seen:
            raise BundleError(f"{where}: files[{i}] lists {f['path']!r} twice")
        seen.add(f["path"])
        entries.append(FileEntry(f["path"], f["bytes"], f["sha256"]))
    extra = {k: v for k, v in data.items() if k not in Manifest.__dataclass_fields__}
    if on_disk != data["version"]:
        extra["migrated_from"] = on_disk
    return Manifest(producer=data["producer"], hardware=data["hardware"], job=data["job"],
                    observed=data["observed"], capture=data["capture"], complete=data["complete"],
                    files=tuple(entries), schema=data["schema"], version=data["version"], kind=data["kind"],
                    anonymized=data.get("anonymized"), extra=extra)


def read_manifest(bundle: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``manifest.json`` of a bundle directory (files are not hashed here).

    Raises:
        InputNotFoundError: no bundle or no manifest there.
        BundleError: see :func:`parse_manifest`.
    """
    root = Path(bundle)
    path = root / MANIFEST_NAME
    if path.is_symlink() or not path.is_file():
        raise InputNotFoundError(f"{root}: not a bundle (no {MANIFEST_NAME} as a regular file)")
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path}: {size} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    with open(path, "rb") as f:
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    return parse_manifest(raw, str(path))


def _entry_problem(root: Path, entry: FileEntry) -> str | None:
    """What is wrong with one listed file, or None. Never follows a link, at any depth of the path."""
    p = root
    try:
        for part in PurePosixPath(entry.path).parts:
            p = p / part
            if p.is_symlink():
                return f"{entry.path}: the path goes through a symbolic link ({p.relative_to(root).as_posix()})"
        if not p.is_file():
            return f"{entry.path}: missing or not a regular file"
        size = p.stat().st_size
        if size != entry.bytes:
            return f"{entry.path}: {size} bytes, manifest says {entry.bytes}"
        if _sha256(p) != entry.sha256:
            return f"{entry.path}: sha256 differs from the manifest"
    except OSError as exc:
        return f"{entry.path}: cannot be checked: {exc.strerror or exc}"
    return None


def verify_files(bundle: str | os.PathLike[str], manifest: Manifest) -> list[str]:
    """Check every listed file: present, a regular file reached without any link, size first, then
    streamed sha256.

    Returns the list of problems (empty when all hold); files not listed are reported too.
    """
    root = Path(bundle)
    problems = [problem for entry in manifest.files if (problem := _entry_problem(root, entry)) is not None]
    listed = {e.path for e in manifest.files} | {MANIFEST_NAME}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if (p.is_file() or p.is_symlink()) and rel not in listed:
            problems.append(f"{rel}: present but not listed in the manifest")
    return problems


def trace_prefix(bundle: str | os.PathLike[str]) -> Path:
    """The ``<prefix>`` of the bundle's per-rank traces, for nbox_trace.check.inspect_trace."""
    return Path(bundle) / TRACE_PREFIX


def locate_traces(path: str | os.PathLike[str]) -> tuple[TraceSet, Manifest | None]:
    """The per-rank traces of what a user named, and the bundle's manifest (None for a bare trace).

    The one rule every command that reads traces follows (``nbox trace inspect``, replay, sweep): a directory with
    a ``manifest.json`` is a bundle, whose traces are ``trace/trace.<rank>.et`` and must include every rank the
    manifest records; anything else is a bare Chakra ET (one file, a directory, or a ``<prefix>``).

    Raises:
        InputNotFoundError: nothing there, or a rank the manifest records has no trace file (named).
        BundleError: a malformed manifest.
        InvalidInputError: see :func:`~nbox_trace.chakra.tracefiles.resolve_trace_set`.
    """
    root = Path(path)
    if not (root / MANIFEST_NAME).is_file():
        return resolve_trace_set(root), None
    manifest = read_manifest(root)
    prefix = trace_prefix(root)
    recorded = manifest.job.get("ranks_recorded") or []
    missing = [r for r in recorded if not Path(f"{prefix}.{r}.et").is_file()]
    if missing:
        raise InputNotFoundError(f"{root}: the manifest records rank(s) {missing} but "
                                 f"{prefix}.{missing[0]}.et is missing")
    return resolve_trace_set(prefix), manifest
