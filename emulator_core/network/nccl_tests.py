"""Read nccl-tests' standard output (``all_reduce_perf`` and friends) into one measured curve per file.

What a file may hold, and how each part is read (nccl-tests ``src/common.cu`` prints them; versions differ):

* ``# Collective test starting: all_reduce_perf``: the collective (``*_perf`` name, :data:`TESTS`).
* ``#  Rank  3 Group  0 Pid 1234 on host-a device  3 [0000:5d:00] NVIDIA H100 80GB HBM3`` (old versions: no
  ``Group``): one line per rank;
  the distinct hosts are the nodes, the ranks per host the GPUs per node (every host must hold as many). A
  single process driving 8 GPUs (``-g 8``) prints 8 rank lines on one host.
* the column header ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time ...``: which of the
  optional ``redop`` / ``root`` columns the rows carry (all_gather and alltoall have neither in some versions,
  root only for broadcast/reduce in others) and the wrong-count column's name (``#wrong`` or ``error``);
  the units line ``(B) (elements) (us) (GB/s)`` says whether times are in us or ms.
* data rows: ``size count type [redop] [root] time algbw busbw wrong [time algbw busbw wrong]``, the
  out-of-place group first (the one read), the in-place group optional; ``wrong`` may be ``N/A``.

Anything else (launcher warnings, ``NCCL version`` and ``NCCL INFO`` lines, ``# Avg bus bandwidth``) is skipped.
A file of bare rows (pasted from a report) works with ``collective`` and ``shape`` given by the caller; where the
log says them too they must agree, else the file is refused. Every row's algbw/busbw ratio is checked against
the collective's bus factor over the shape's ranks (nccl-tests ``doc/PERFORMANCE.md``), which catches a wrong
``--collective`` or ``--shape`` even on bare rows.

Limits: a file over :data:`MAX_FILE_BYTES`, a line over :data:`MAX_LINE_CHARS`, more than :data:`MAX_ROWS`
rows, bytes that are not UTF-8, a malformed or truncated row, a second curve in the same file: each is a
one-line :class:`NcclTestsError` naming the file and line. Nothing is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nbox_trace.errors import InvalidInputError

__all__ = ["BUS_FACTORS", "MAX_FILE_BYTES", "TESTS", "Curve", "NcclTestsError", "Point", "parse_shape",
           "read_curve", "read_curve_text"]

#: Largest file read (bytes): nccl-tests output of a full sweep with every rank line of 100k GPUs fits.
MAX_FILE_BYTES = 16 << 20
MAX_LINE_CHARS = 4096
MAX_ROWS = 4096
MAX_RANKS = 1 << 20

#: nccl-tests binary -> nbox collective name.
TESTS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "alltoall_perf": "all_to_all", "broadcast_perf": "broadcast", "reduce_perf": "reduce",
         "sendrecv_perf": "send_recv", "gather_perf": "gather", "scatter_perf": "scatter"}

#: busbw / algbw per collective over p ranks (nccl-tests doc/PERFORMANCE.md).
BUS_FACTORS: dict[str, Callable[[int], float]] = {
               "all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
               "reduce_scatter": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p,
               "gather": lambda p: (p - 1) / p, "scatter": lambda p: (p - 1) / p,
               "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0, "send_recv": lambda p: 1.0}

_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "none", "premulsum", "mulsum"})
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+(\d+)"
                      r"\s*(?:\[[^\]]*\])?\s*(.*)$")
_TEST_RE = re.compile(r"^#?\s*Collective test starting:\s*(\S+)")
_COMMAND_RE = re.compile(r"\b([a-z_]+_perf)(?:_mpi)?\b")
_INT_RE = re.compile(r"^\d+$")
_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\d+)\s*$")


class NcclTestsError(InvalidInputError):
    """An nccl-tests output file that cannot be read, or that contradicts ``--collective`` / ``--shape``; the
    message names the file and line. Exit code 3."""


@dataclass(frozen=True)
class Point:
    """One row's out-of-place figures: nccl-tests' ``size`` (bytes; all_gather: the gathered total), ``time_us``
    (the average per call, microseconds), ``algbw_gbps`` and ``busbw_gbps`` (GB/s = 1e9 bytes/s) as printed."""

    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class Curve:
    """One nccl-tests run: ``collective`` (nbox name), ``nodes`` x ``gpus_per_node`` ranks, its rows by size.

    ``said``: what the log itself said (``"collective"``, ``"shape"``), the rest came from the caller.
    ``gpu``: the device name of rank 0's line (``""`` when absent); ``version``: the ``NCCL version`` line's.
    """

    path: str
    collective: str
    nodes: int
    gpus_per_node: int
    points: tuple[Point, ...]
    said: frozenset[str] = frozenset()
    gpu: str = ""
    version: str = ""

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def parse_shape(text: str) -> tuple[int, int]:
    """``"4x8"`` -> (4 nodes, 8 GPUs per node); :class:`NcclTestsError` otherwise."""
    m = _SHAPE_RE.match(text) if isinstance(text, str) and len(text) < 64 else None
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1 or int(m.group(1)) * int(m.group(2)) > MAX_RANKS:
        raise NcclTestsError(f"--shape {text!r}: must be NODESxGPUS_PER_NODE, e.g. 4x8 (each >= 1)")
    return int(m.group(1)), int(m.group(2))


def read_curve(path: Path, *, collective: str | None = None, shape: tuple[int, int] | None = None) -> Curve:
    """Read one nccl-tests output file (module docstring); ``collective`` / ``shape`` (nodes, GPUs per node) for
    what the file does not say. Raises :class:`NcclTestsError` naming the file (and line)."""
    try:
        with Path(path).open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise NcclTestsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise NcclTestsError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; not an nccl-tests output")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise NcclTestsError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None
    return read_curve_text(text, str(path), collective=collective, shape=shape)


class _Layout:
    """Which columns a row has: ``redop`` and ``root`` after the type, then groups of (time, algbw, busbw, wrong)."""

    def __init__(self, redop: bool, root: bool, ms: bool = False) -> None:
        self.redop, self.root, self.ms = redop, root, ms


def _header_layout(tokens: list[str]) -> _Layout | None:
    names = [t.lower() for t in tokens]
    if not names or names[0] != "size" or "time" not in names:
        return None
    return _Layout("redop" in names or "op" in names, "root" in names)


def _number(tok: str, where: str, what: str) -> float:
    if not _NUM_RE.match(tok):
        raise NcclTestsError(f"{where}: {what} {tok[:24]!r} is not a number")
    value = float(tok)
    if not math.isfinite(value):
        raise NcclTestsError(f"{where}: {what} {tok[:24]!r} is not finite")
    return value


def _row(tokens: list[str], layout: _Layout | None, where: str) -> Point:
    size = int(tokens[0])
    if len(tokens) < 3 or not _INT_RE.match(tokens[1]):
        raise NcclTestsError(f"{where}: truncated or malformed row (size, count, type, ... expected)")
    rest = tokens[3:]
    if layout is None:  # bare rows: infer the optional columns
        redop = bool(rest) and rest[0].lower() in _REDOPS
        after = len(rest) - (1 if redop else 0)
        layout = _Layout(redop, after in (5, 9))
    rest = rest[(1 if layout.redop else 0) + (1 if layout.root else 0):]
    if len(rest) not in (4, 8):
        raise NcclTestsError(f"{where}: truncated or malformed row: {len(tokens)} columns where "
                             f"{3 + layout.redop + layout.root + 8} were expected")
    if layout.redop and tokens[3].lower() not in _REDOPS:
        raise NcclTestsError(f"{where}: {tokens[3][:24]!r} is not a reduction operation")
    if layout.root and not re.match(r"^-?\d+$", tokens[3 + layout.redop]):
        raise NcclTestsError(f"{where}: root {tokens[3 + layout.redop][:24]!r} is not an integer")
    time_us = _number(rest[0], where, "time")
    algbw = _number(rest[1], where, "algbw")
    busbw = _number(rest[2], where, "busbw")
    for i, tok in enumerate(rest[3::4]):
        if tok.upper() != "N/A" and not _INT_RE.match(tok):
            raise NcclTestsError(f"{where}: wrong-count column {tok[:24]!r} is not a count or N/A")
        if tok != "N/A" and _INT_RE.match(tok) and int(tok) > 0 and i == 0:
            raise NcclTestsError(f"{where}: the run reports {tok} wrong results; its timings are not a fabric's")
    for tok in rest[4:7]:
        _number(tok, where, "in-place figure")
    if time_us <= 0 or algbw < 0 or busbw < 0:
        raise NcclTestsError(f"{where}: time must be > 0 and bandwidths >= 0")
    if layout.ms:
        time_us *= 1000.0
    return Point(size, time_us, algbw, busbw)


@dataclass
class _State:
    name: str
    test: str | None = None
    test_line: int = 0
    hosts: dict[int, str] | None = None
    gpu: str = ""
    version: str = ""
    layout: _Layout | None = None
    rows_started: bool = False
    ended: bool = False
    commands: set[str] = field(default_factory=set)


def read_curve_text(text: str, name: str, *, collective: str | None = None,
                    shape: tuple[int, int] | None = None) -> Curve:
    """:func:`read_curve` on text already read; ``name`` names it in errors."""
    if collective is not None and collective not in BUS_FACTORS:
        raise NcclTestsError(f"--collective {collective!r}: must be one of {', '.join(BUS_FACTORS)}")
    st = _State(name)
    points: list[Point] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{name}:{lineno}"
        if len(line) > MAX_LINE_CHARS:
            raise NcclTestsError(f"{where}: line longer than {MAX_LINE_CHARS} characters")
        if "\x00" in line:
            raise NcclTestsError(f"{where}: NUL byte; not an nccl-tests output")
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            _comment(st, s, where, bool(points))
            continue
        if s.startswith("NCCL version"):
            st.version = s.split()[2][:40] if len(s.split()) > 2 else ""
            continue
        tokens = s.split()
        if not _INT_RE.match(tokens[0]) or len(tokens[0]) > 20 or (len(tokens) > 1 and not _INT_RE.match(tokens[1])):
            _stray(st, s, where, bool(points))  # a launcher's, NCCL's or a report's own line
            continue
        if st.ended:
            raise NcclTestsError(f"{where}: a second curve in one file; give one nccl-tests run per file")
        if len(points) >= MAX_ROWS:
            raise NcclTestsError(f"{where}: more than {MAX_ROWS} rows")
        p = _row(tokens, st.layout, where)
        if p.size_bytes == 0 or (points and p.size_bytes == points[-1].size_bytes):
            continue  # all_gather's sizes below ranks x type size round to 0, a size can repeat: nothing new
        if points and p.size_bytes < points[-1].size_bytes:
            raise NcclTestsError(f"{where}: size {p.size_bytes} does not follow {points[-1].size_bytes} "
                                 f"(sizes must increase: one curve per file)")
        points.append(p)
    if not points:
        raise NcclTestsError(f"{name}: no nccl-tests rows (size count type ... time algbw busbw) found")
    return _finish(st, points, collective, shape)


def _stray(st: _State, s: str, where: str, have_rows: bool) -> None:
    """A line that is neither a comment nor a row: a rank line or the test name that lost its '#' (pasted through
    Markdown), the command line naming the ``*_perf`` binary, or anything else (skipped)."""
    if _RANK_RE.match(s) or _TEST_RE.match(s):
        _comment(st, s, where, have_rows)
        return
    for name in _COMMAND_RE.findall(s):
        if name in TESTS:
            st.commands.add(TESTS[name])


def _comment(st: _State, s: str, where: str, have_rows: bool) -> None:
    m = _TEST_RE.match(s)
    if m:
        if st.test is not None or have_rows:
            raise NcclTestsError(f"{where}: a second test in one file; give one nccl-tests run per file")
        test = m.group(1)
        if test not in TESTS:
            raise NcclTestsError(f"{where}: test {test[:40]!r} is not one of {', '.join(TESTS)}")
        st.test = TESTS[test]
        return
    m = _RANK_RE.match(s)
    if m:
        if have_rows:
            raise NcclTestsError(f"{where}: a rank line after the rows; give one nccl-tests run per file")
        hosts = st.hosts if st.hosts is not None else {}
        rank = int(m.group(1))
        if rank in hosts or rank >= MAX_RANKS:
            raise NcclTestsError(f"{where}: rank {rank} listed twice or out of range")
        hosts[rank] = m.group(2)
        st.hosts = hosts
        if rank == 0:
            st.gpu = m.group(4).strip()[:80]
        return
    tokens = s.lstrip("#").split()
    layout = _header_layout(tokens)
    if layout is not None:
        if have_rows:
            st.ended = True
        st.layout = layout
        return
    if st.layout is not None and tokens and tokens[0] == "(B)":
        st.layout.ms = "(ms)" in tokens
    elif have_rows and tokens[:2] in (["Out", "of"], ["Avg", "bus"]):
        st.ended = True


def _finish(st: _State, points: list[Point], collective: str | None, shape: tuple[int, int] | None) -> Curve:
    said: set[str] = set()
    coll = collective
    if st.test is not None:
        said.add("collective")
        if collective is not None and collective != st.test:
            raise NcclTestsError(f"{st.name}: the log ran {st.test}, not --collective {collective}")
        coll = st.test
    if st.test is None and len(st.commands) == 1:  # no test line, but one *_perf binary named (the command line)
        said.add("collective")
        (named,) = st.commands
        if collective is not None and collective != named:
            raise NcclTestsError(f"{st.name}: the log's command ran {named}, not --collective {collective}")
        coll = named
    if coll is None:
        raise NcclTestsError(f"{st.name}: the log does not say its collective (no '# Collective test starting' "
                             f"line); give --collective")
    nodes_gpn = shape
    if st.hosts:
        ranks = sorted(st.hosts)
        if ranks != list(range(len(ranks))):
            raise NcclTestsError(f"{st.name}: rank lines skip a rank (got {len(ranks)} lines, largest rank "
                                 f"{ranks[-1]}); the file is truncated or edited")
        per_host: dict[str, int] = {}
        for host in st.hosts.values():
            per_host[host] = per_host.get(host, 0) + 1
        counts = set(per_host.values())
        if len(counts) != 1:
            raise NcclTestsError(f"{st.name}: hosts run different numbers of ranks ({sorted(counts)}); nbox "
                                 f"models the same GPUs per node on every node")
        logged = (len(per_host), counts.pop())
        said.add("shape")
        if shape is not None and shape != logged:
            raise NcclTestsError(f"{st.name}: the log ran {logged[0]}x{logged[1]} (nodes x GPUs per node), "
                                 f"not --shape {shape[0]}x{shape[1]}")
        nodes_gpn = logged
    if nodes_gpn is None:
        raise NcclTestsError(f"{st.name}: the log does not say its shape (no '#  Rank ... on HOST' lines); give "
                             f"--shape NODESxGPUS_PER_NODE")
    nodes, gpn = nodes_gpn
    p = nodes * gpn
    if p < 2:
        raise NcclTestsError(f"{st.name}: one rank moves nothing over a fabric; nbox needs >= 2 ranks")
    _check_ratios(st.name, coll, p, points)
    return Curve(st.name, coll, nodes, gpn, tuple(points), frozenset(said), st.gpu, st.version)


def _check_ratios(name: str, collective: str, p: int, points: list[Point]) -> None:
    """busbw / algbw must be the collective's bus factor over p ranks, and algbw size / time: on rows with
    bandwidths large enough that the printed two decimals are precise."""
    factor = BUS_FACTORS[collective](p)
    for pt in points:
        if pt.algbw_gbps >= 5.0 and factor > 0:
            ratio = pt.busbw_gbps / pt.algbw_gbps
            if abs(ratio - factor) > 0.02 * factor + 0.01:
                raise NcclTestsError(f"{name}: size {pt.size_bytes}: busbw/algbw = {ratio:.3f}, but {collective} "
                                     f"over {p} ranks gives {factor:.3f}: wrong collective or shape")
            implied = pt.size_bytes / pt.time_us / 1e3
            if abs(implied - pt.algbw_gbps) > 0.05 * pt.algbw_gbps + 0.02:
                raise NcclTestsError(f"{name}: size {pt.size_bytes}: time {pt.time_us:g} us gives algbw "
                                     f"{implied:.2f} GB/s, the row says {pt.algbw_gbps:g}: not a consistent row")
