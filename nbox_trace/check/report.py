"""What the checker reports: problems, per-rank summaries and the trace's report (schema ``nbox.trace-inspect/1``).

Problems are facts, not exceptions: an undecodable file raises (``TraceDecodeError``), everything a decodable file
does wrong is a :class:`Problem`. Problems of one kind beyond :data:`MAX_PROBLEMS_PER_CODE` per rank are folded into
one entry with a count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Version of the JSON document :meth:`TraceReport.to_dict` produces.
REPORT_SCHEMA = "nbox.trace-inspect/1"
#: Problems of one code listed one by one per rank; the rest are folded into a count.
MAX_PROBLEMS_PER_CODE = 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a trace.

    ``code`` is a stable slug (e.g. ``dangling-dep``); ``severity`` is ``error`` (consumers break or
    replay hangs) or ``warning`` (deviates from the contract, readable with care); ``count`` > 1
    when several occurrences were folded into this entry.
    """

    code: str
    severity: str
    message: str
    rank: int | None = None
    node_id: int | None = None
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "rank": self.rank, "node_id": self.node_id, "count": self.count}


class ProblemLog:
    def __init__(self, rank: int | None) -> None:
        self.rank = rank
        self.items: list[Problem] = []
        self.counts: Counter[str] = Counter()
        self.severity: dict[str, str] = {}
        self.tallies: dict[str, tuple[str, str, int, int | None]] = {}

    def tally(self, code: str, severity: str, what: str, node_id: int) -> None:
        """Count a widespread, low-stakes deviation; :meth:`finish` reports it once with the first node."""
        _, _, n, first = self.tallies.get(code, (severity, what, 0, node_id))
        self.tallies[code] = (severity, what, n + 1, first)

    def add(self, code: str, severity: str, message: str, node_id: int | None = None) -> None:
        self.counts[code] += 1
        self.severity[code] = severity
        if self.counts[code] <= MAX_PROBLEMS_PER_CODE:
            self.items.append(Problem(code, severity, message, self.rank, node_id))

    def finish(self) -> list[Problem]:
        for code, (severity, what, n, first) in sorted(self.tallies.items()):
            self.items.append(Problem(code, severity, f"{n} node(s) {what} (first: node id {first})",
                                      self.rank, first, n))
        for code, n in sorted(self.counts.items()):
            if n > MAX_PROBLEMS_PER_CODE:
                extra = n - MAX_PROBLEMS_PER_CODE
                self.items.append(Problem(code, self.severity[code],
                                          f"... and {extra} more {code} problems like the above", self.rank,
                                          None, extra))
        return self.items


@dataclass(frozen=True)
class CollectiveStat:
    """Collectives of one type on one process group of one rank."""

    pg_name: str
    comm_type: str
    count: int
    total_bytes: int


@dataclass(frozen=True)
class CollOp:
    comm_type: int
    size: int
    node_id: int
    split: bool  # all-to-all-v: sizes may legitimately differ across ranks


@dataclass(frozen=True)
class P2POp:
    src: int
    dst: int
    tag: int
    size: int
    node_id: int


@dataclass
class RankReport:
    """Summary and problems of one rank's file. Durations in microseconds."""

    rank: int
    path: str
    file_bytes: int
    compressed: bool
    version: str
    schema: str | None
    node_count: int
    nodes_by_type: dict[str, int]
    collectives: list[CollectiveStat]
    p2p_sends: int
    p2p_recvs: int
    p2p_bytes_sent: int
    comp_duration_us: int
    roots: int
    depth: int
    critical_path_us: int
    problems: list[Problem]
    coll_seq: dict[str, list[CollOp]] = field(default_factory=dict, repr=False)
    p2p: list[tuple[str, P2POp]] = field(default_factory=list, repr=False)
    pg_init: dict[str, list[int]] = field(default_factory=dict, repr=False)
    #: process group name -> its description (``pg_desc``, e.g. DeviceMesh's ``mesh_tp``), where written.
    pg_desc: dict[str, str] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "path": self.path, "file_bytes": self.file_bytes, "compressed": self.compressed,
            "version": self.version, "schema": self.schema, "node_count": self.node_count,
            "nodes_by_type": self.nodes_by_type,
            "collectives": [vars(c) for c in self.collectives],
            "p2p": {"sends": self.p2p_sends, "recvs": self.p2p_recvs, "bytes_sent": self.p2p_bytes_sent},
            "comp_duration_us": self.comp_duration_us, "roots": self.roots, "depth": self.depth,
            "critical_path_us": self.critical_path_us,
            "problems": [p.to_dict() for p in self.problems],
        }


@dataclass
class TraceReport:
    """Everything ``nbox trace inspect`` says about one trace (all ranks)."""

    prefix: str
    directory: str
    ranks: list[RankReport]
    process_groups: dict[str, list[int] | None]
    process_groups_source: str
    problems: list[Problem]  # cross-rank problems

    def all_problems(self) -> list[Problem]:
        out = [p for r in self.ranks for p in r.problems]
        return out + self.problems

    def problem_count(self) -> int:
        return sum(p.count for p in self.all_problems())

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "prefix": self.prefix,
            "directory": self.directory,
            "rank_ids": [r.rank for r in self.ranks],
            "process_groups": self.process_groups,
            "process_groups_source": self.process_groups_source,
            "problem_count": self.problem_count(),
            "ranks": [r.to_dict() for r in self.ranks],
            "cross_rank_problems": [p.to_dict() for p in self.problems],
        }



def iter_problem_lines(report: TraceReport) -> Iterable[str]:
    """One human line per problem: ``rank R node N: [code] message``."""
    for p in report.all_problems():
        where = []
        if p.rank is not None:
            where.append(f"rank {p.rank}")
        if p.node_id is not None:
            where.append(f"node {p.node_id}")
        yield f"{' '.join(where) or 'trace'}: [{p.severity} {p.code}] {p.message}"

