"""Mutation-fuzzing campaign against nbox's readers of untrusted bytes (longer than the test-suite's fuzz).

    python bench/fuzz.py [--seconds S] [--target et|manifest|archive|all] [--seed N] [--json]

Targets, each fed mutations of a corpus of real inputs:

* ``et``: Chakra ET files (the shipped bundles' traces and ``tests/data/samples``) through
  :func:`nbox_trace.check.inspect_rank` (which streams :class:`~nbox_trace.chakra.codec.EtReader`);
* ``manifest``: the shipped bundles' ``manifest.json`` through
  :func:`nbox_trace.bundle.manifest.parse_manifest`, and when
  one parses, :func:`nbox_trace.bundle.manifest.verify_files` against its bundle;
* ``archive``: a bundle packed with :func:`nbox_trace.bundle.archive.pack_bundle` through ``read_archive_manifest`` and
  ``unpack_bundle`` into a fresh directory (skipped, and reported as such, while
  ``nbox_trace.bundle.archive`` is absent).

Each case runs in-process under a per-case time guard (SIGALRM) and is classified: ``ok`` (the reader
returned), ``refused`` (an :class:`~nbox_trace.errors.NboxError`, the contract for bad input) or ``crash`` (any other
exception, or the time guard firing). The first few distinct crashes are saved with their input and traceback
under a temporary directory (printed). Exit status 1 when any case crashed. No hypothesis, no atheris: plain
``random.Random(seed)`` mutations, so a seed and a case number reproduce a case.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from nbox_trace.bundle.manifest import parse_manifest, verify_files  # noqa: E402
from nbox_trace.chakra import codec  # noqa: E402
from nbox_trace.check import inspect_rank  # noqa: E402
from nbox_trace.errors import NboxError  # noqa: E402

SAMPLES = REPO_ROOT / "tests" / "data" / "samples"
#: Corpus files larger than this are left out (mutating a multi-megabyte file per case is mostly copying).
MAX_SEED_BYTES = 1 << 20
#: A case running longer than this is a hang, counted as a crash.
CASE_TIMEOUT_S = 10.0
#: Distinct crashes saved per target (input + traceback).
SAVED_CRASHES = 5
TARGETS = ("et", "manifest", "archive")

INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x0A, 0x08, 0x10, 0x12, 0x1A, 0x22, 0x3A]
JSON_SNIPPETS = [
    b"[", b"]", b"{", b"}", b'"', b",", b":", b"null", b"true", b"-1", b"1e999", b"NaN", b"18446744073709551616",
    b"9" * 5000, b"[" * 3000, b'"../x"', b'"/etc/passwd"', b'"a\\\\b"', b'"\\u0000"', b'"\\ud800"', b'"1.0"', b'"2.0"',
    b'"1.1"', b'"\\u00b2.0"', b'"01.0"', b"1.0", b'"x"', b'{"a": 1, "a": 2}', b"\xff", b"\xed\xa0\x80",
]


@dataclass
class Crash:
    case: int
    kind: str
    message: str
    where: str
    input_path: str
    traceback: str


@dataclass
class Stats:
    target: str
    cases: int = 0
    ok: int = 0
    refused: int = 0
    crashes: int = 0
    wall_s: float = 0.0
    skipped: str | None = None
    crash_kinds: dict[str, int] = field(default_factory=dict)
    saved: list[Crash] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.cases / self.wall_s if self.wall_s else 0.0


class CaseTimeout(Exception):
    """Raised by the per-case alarm: the reader hung (or is pathologically slow) on one input."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise CaseTimeout(f"case ran past {CASE_TIMEOUT_S} s")


# -- mutation ---------------------------------------------------------------------------------------
_varint = codec._varint  # the protobuf varint the ET framing uses (lying length prefixes are made with it)


def mutate(rng: random.Random, data: bytes, corpus: list[bytes], *, json_aware: bool = False) -> bytes:
    """One to four stacked byte-level mutations (plus JSON tokens for manifests)."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        n = len(buf)
        pos = rng.randrange(n + 1)
        op = rng.randrange(12 if json_aware else 10)
        if op == 0 and n:
            buf[pos % n] ^= 1 << rng.randrange(8)  # bit flip
        elif op == 1 and n:
            buf[pos % n] = rng.choice(INTERESTING_BYTES)
        elif op == 2:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            del buf[pos : pos + rng.randint(1, 64)]
        elif op == 4:
            del buf[pos:]  # truncate
        elif op == 5 and n:  # duplicate a chunk somewhere else
            start = rng.randrange(n)
            chunk = bytes(buf[start : start + rng.randint(1, 256)])
            where = rng.randrange(len(buf) + 1)
            buf[where:where] = chunk
        elif op == 6:  # splice with another corpus entry
            other = rng.choice(corpus)
            cut = rng.randrange(len(other) + 1)
            buf = buf[:pos] + bytearray(other[cut:])
        elif op == 7:  # a varint: a length prefix that lies, or a huge field value
            value = rng.choice((0, 1, 127, 128, 16383, 16384, 1 << 31, 1 << 32, 1 << 63, (1 << 64) - 1,
                                rng.randrange(1 << 20)))
            buf[pos : pos + rng.randint(0, 2)] = _varint(value)
        elif op == 8 and n:  # overwrite a run with one byte value
            start = pos % n
            length = min(rng.randint(1, 32), n - start)
            buf[start : start + length] = bytes([rng.choice(INTERESTING_BYTES)]) * length
        elif op == 9 and n > 1:  # swap two chunks
            a, b = sorted(rng.sample(range(n), 2))
            size = rng.randint(1, max(1, min(32, b - a)))
            buf[a : a + size], buf[b : b + size] = buf[b : b + size], buf[a : a + size]
        elif op >= 10:  # JSON token
            snippet = rng.choice(JSON_SNIPPETS)
            if op == 10:
                buf[pos:pos] = snippet
            else:  # replace a JSON scalar (number, string, literal) with the snippet
                text = bytes(buf)
                tokens = list(re.finditer(rb'-?\d[\d.eE+-]*|"(?:[^"\\]|\\.)*"|true|false|null', text))
                if tokens:
                    m = rng.choice(tokens)
                    buf = bytearray(text[: m.start()] + snippet + text[m.end() :])
    return bytes(buf)


# -- targets ----------------------------------------------------------------------------------------
class Target:
    name = ""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.corpus: list[bytes] = []

    def case(self, rng: random.Random, data: bytes) -> None:
        """Run the reader on ``data``; return normally, or let its exception out."""
        raise NotImplementedError

    def generate(self, rng: random.Random) -> bytes:
        return mutate(rng, rng.choice(self.corpus), self.corpus)


class EtTarget(Target):
    name = "et"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        files = sorted((REPO_ROOT / "traces").glob("*/trace/*.et"))
        if (SAMPLES / "chakra_et").is_dir():
            files += sorted((SAMPLES / "chakra_et").rglob("*.et"))
            files += sorted((SAMPLES / "cpu_gloo_official_pipeline").glob("*.et"))
        self.corpus = [p.read_bytes() for p in files if p.stat().st_size <= MAX_SEED_BYTES]
        self.path = work / "trace.0.et"

    def generate(self, rng: random.Random) -> bytes:
        seed = rng.choice(self.corpus)
        roll = rng.random()
        if roll < 0.15:  # mutate inside the gzip stream's payload, then compress
            return gzip.compress(mutate(rng, seed, self.corpus), compresslevel=1, mtime=0)
        if roll < 0.25:  # corrupt the gzip stream itself
            return mutate(rng, gzip.compress(seed, compresslevel=1, mtime=0), self.corpus)
        return mutate(rng, seed, self.corpus)

    def case(self, rng: random.Random, data: bytes) -> None:
        self.path.write_bytes(data)
        inspect_rank(self.path, rng.randrange(-1, 9))


class ManifestTarget(Target):
    name = "manifest"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.bundles = [p.parent for p in sorted((REPO_ROOT / "traces").glob("*/manifest.json"))]
        self.corpus = [(b / "manifest.json").read_bytes() for b in self.bundles]

    def generate(self, rng: random.Random) -> bytes:
        return mutate(rng, rng.choice(self.corpus), self.corpus, json_aware=True)

    def case(self, rng: random.Random, data: bytes) -> None:
        manifest = parse_manifest(data, "fuzz/manifest.json")
        if self.bundles and rng.random() < 0.2:  # read-only: sizes, hashes and listing of a real bundle
            verify_files(rng.choice(self.bundles), manifest)


class ArchiveTarget(Target):
    name = "archive"

    def __init__(self, work: Path, archive: ModuleType) -> None:
        super().__init__(work)
        self.archive = archive
        for bundle in sorted((REPO_ROOT / "traces").glob("*/manifest.json")):
            out = work / f"seed-{bundle.parent.name}.nbox"
            archive.pack_bundle(bundle.parent, out)
            self.corpus.append(out.read_bytes())
            out.unlink()
        self.path = work / "case.nbox"
        self.out = work / "out"

    def case(self, rng: random.Random, data: bytes) -> None:
        self.path.write_bytes(data)
        if self.out.exists():
            shutil.rmtree(self.out)
        try:
            if rng.random() < 0.3:
                self.archive.read_archive_manifest(self.path)
            else:
                self.archive.unpack_bundle(self.path, self.out)
        finally:
            stray = sorted(set(os.listdir(self.work)) - {self.path.name, self.out.name})
            if stray:
                raise AssertionError(f"archive reader left files outside its output directory: {stray[:5]}")


# -- the campaign -----------------------------------------------------------------------------------
def _where(tb: traceback.StackSummary) -> str:
    """The innermost frame inside nbox (else the innermost frame): where the crash happened."""
    frames = [f for f in tb if "/nbox/" in f.filename] or list(tb)
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno} ({last.name})"


def run_target(target: Target, seconds: float, seed: int, crash_dir: Path) -> Stats:
    stats = Stats(target.name)
    rng = random.Random(f"{seed}:{target.name}")
    start = time.perf_counter()
    deadline = start + seconds
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        while time.perf_counter() < deadline:
            data = target.generate(rng)
            case_rng = random.Random(f"{seed}:{target.name}:{stats.cases}")
            stats.cases += 1
            signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
            try:
                target.case(case_rng, data)
            except NboxError:
                stats.refused += 1
            except Exception as exc:  # the point of the exercise: anything else is a crash
                stats.crashes += 1
                tb = traceback.extract_tb(exc.__traceback__)
                key = f"{type(exc).__name__} at {_where(tb)}"
                stats.crash_kinds[key] = stats.crash_kinds.get(key, 0) + 1
                if stats.crash_kinds[key] == 1 and len(stats.saved) < SAVED_CRASHES:
                    saved = crash_dir / f"{target.name}-crash-{len(stats.saved)}.bin"
                    saved.write_bytes(data)
                    text = "".join(traceback.format_exception(exc))
                    saved.with_suffix(".txt").write_text(text)
                    stats.saved.append(Crash(stats.cases, type(exc).__name__, str(exc)[:300], _where(tb),
                                             str(saved), text))
            else:
                stats.ok += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    stats.wall_s = time.perf_counter() - start
    return stats


def make_target(name: str, work: Path) -> Target | str:
    """The target, or why it is skipped."""
    work.mkdir(parents=True, exist_ok=True)
    if name == "et":
        return EtTarget(work)
    if name == "manifest":
        return ManifestTarget(work)
    try:
        archive: ModuleType = importlib.import_module("nbox_trace.bundle.archive")
    except ImportError as exc:
        return f"nbox_trace.bundle.archive not importable ({exc})"
    missing = [f for f in ("pack_bundle", "unpack_bundle", "read_archive_manifest") if not hasattr(archive, f)]
    if missing:
        return f"nbox_trace.bundle.archive lacks {', '.join(missing)}"
    return ArchiveTarget(work, archive)


def print_table(results: list[Stats], peak_rss_mib: float, seed: int, crash_dir: Path) -> None:
    header = f"{'target':<9} {'cases':>8} {'ok':>8} {'refused':>8} {'crashes':>8} {'cases/s':>9} {'wall s':>7}"
    print(header)
    print("-" * len(header))
    for s in results:
        if s.skipped:
            print(f"{s.target:<9} skipped: {s.skipped}")
            continue
        print(f"{s.target:<9} {s.cases:>8} {s.ok:>8} {s.refused:>8} {s.crashes:>8} {s.rate:>9.0f} {s.wall_s:>7.1f}")
    print(f"seed {seed}; peak RSS {peak_rss_mib:.0f} MiB")
    for s in results:
        for kind, n in sorted(s.crash_kinds.items()):
            print(f"  {s.target}: {n} x {kind}")
        for c in s.saved:
            print(f"  {s.target} case {c.case}: {c.kind}: {c.message[:160]}\n    input: {c.input_path}"
                  f"\n    traceback: {Path(c.input_path).with_suffix('.txt')}")
    if any(s.crashes for s in results):
        print(f"crash inputs kept in {crash_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="wall time per target (default 60)")
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (1 << 31)
    names = TARGETS if args.target == "all" else (args.target,)
    root = Path(tempfile.mkdtemp(prefix="nbox-fuzz-"))
    crash_dir = root / "crashes"
    crash_dir.mkdir()
    results: list[Stats] = []
    cwd = os.getcwd()
    try:
        for name in names:
            work = root / name
            target = make_target(name, work)
            if isinstance(target, str):
                results.append(Stats(name, skipped=target))
                continue
            os.chdir(work)  # a reader writing to a relative path writes here, not into the repository
            try:
                results.append(run_target(target, args.seconds, seed, crash_dir))
            finally:
                os.chdir(cwd)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        os.chdir(cwd)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    crashed = any(s.crashes for s in results)
    if not crashed:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        out: dict[str, Any] = {
            "seed": seed, "peak_rss_mib": round(peak_rss_mib, 1), "crash_dir": str(crash_dir) if crashed else None,
            "targets": [{**{k: v for k, v in asdict(s).items() if k != "saved"}, "cases_per_s": round(s.rate, 1),
                         "saved": [{k: v for k, v in asdict(c).items() if k != "traceback"} for c in s.saved]}
                        for s in results],
        }
        print(json.dumps(out, indent=1))
    else:
        print_table(results, peak_rss_mib, seed, crash_dir)
    return 1 if crashed else 0



if __name__ == "__main__":
    sys.exit(main())
