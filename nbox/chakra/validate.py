"""Validate and summarize Chakra traces: what is in them, and what is wrong with them.

:func:`inspect_trace` is the library behind ``nbox trace inspect``. Per rank it streams the file
once and reports: metadata version and ``schema`` attribute, node counts by type, collectives by
process group and type (count, total bytes), point-to-point traffic, total COMP duration, roots,
dependency depth and critical-path length, and every problem with its node id. Across ranks it
checks that each process group's sequence of collectives (type and size) is the same on all member
ranks, and that point-to-point sends and receives pair up; a mismatch is what hangs a replay.

Dependencies are the union of ``data_deps`` and ``ctrl_deps``, as ASTRA-sim's current feeder waits
on both. Depth counts nodes on the longest dependency chain; the critical path is the longest chain
by the sum of ``duration_micros`` (microseconds). Both are computed with Kahn's algorithm, without
recursion, so a 1M-node chain is fine.

Problems are facts, not exceptions: an undecodable file raises (``TraceDecodeError``), everything a
decodable file does wrong is a :class:`Problem`. Problems of one kind beyond
:data:`MAX_PROBLEMS_PER_CODE` per rank are folded into one entry with a count.
"""

from __future__ import annotations

import ast
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox.chakra import et_def_pb2 as pb
from nbox.chakra.attrs import CONTRACT_KINDS, Attr, as_int, attr_map
from nbox.chakra.codec import DEFAULT_MAX_MESSAGE_BYTES, EtReader
from nbox.chakra.tracefiles import TraceSet, resolve_trace_set
from nbox.errors import InputNotFoundError, InvalidInputError

#: Version of the JSON document :meth:`TraceReport.to_dict` produces.
REPORT_SCHEMA = "nbox.trace-inspect/1"
#: Problems of one code listed one by one per rank; the rest are folded into a count.
MAX_PROBLEMS_PER_CODE = 20
#: Name of the METADATA node carrying the PyTorch process-group config.
PG_INIT_NODE = "## process_group:init ##"
#: Attributes that mark an all-to-all with per-peer split sizes (sizes may differ across ranks).
SPLIT_ATTRS = ("nbox_in_split_sizes", "nbox_out_split_sizes", "in_split_size", "out_split_size")
_MAX_PG_JSON_BYTES = 16 << 20

NODE_TYPE_NAMES = {v: k for k, v in pb.NodeType.items()}
COMM_TYPE_NAMES = {v: k for k, v in pb.CollectiveCommType.items()}
_COMM_NODE_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


def node_type_name(value: int) -> str:
    return NODE_TYPE_NAMES.get(value, f"NODE_TYPE_{value}")


def comm_type_name(value: int) -> str:
    return COMM_TYPE_NAMES.get(value, f"COMM_TYPE_{value}")


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


class _ProblemLog:
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
class _CollOp:
    comm_type: int
    size: int
    node_id: int
    split: bool  # all-to-all-v: sizes may legitimately differ across ranks


@dataclass(frozen=True)
class _P2POp:
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
    coll_seq: dict[str, list[_CollOp]] = field(default_factory=dict, repr=False)
    p2p: list[tuple[str, _P2POp]] = field(default_factory=list, repr=False)
    pg_init: dict[str, list[int]] = field(default_factory=dict, repr=False)

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


def _json_loads(text: str | bytes) -> Any:
    """json.loads for untrusted text: every failure (deep nesting, huge integers, bad bytes) is a ValueError."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not valid JSON: {type(exc).__name__}: {str(exc)[:120]}") from None


def parse_pg_init(values: str) -> list[dict[str, Any]]:
    """Parse the ``inputs.values`` of a ``## process_group:init ##`` node into a list of dicts.

    PyTorch writes a JSON list of process groups; Chakra's converter wraps it as a Python-literal list
    holding that JSON string (``['[{"pg_name": "0", ...}]']``). Both are accepted; nothing is evaluated
    (``ast.literal_eval`` parses literals only, and the input is size-capped).

    Raises:
        ValueError: not one of those shapes.
    """
    if len(values) > _MAX_PG_JSON_BYTES:
        raise ValueError(f"process-group config is {len(values)} bytes, over the {_MAX_PG_JSON_BYTES} cap")
    try:
        data: Any = _json_loads(values)
    except ValueError:
        try:
            data = ast.literal_eval(values)
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError) as exc:
            raise ValueError(f"neither JSON nor a literal list: {type(exc).__name__}") from None
    out: list[dict[str, Any]] = []
    stack = [data]
    while stack:  # flatten lists and JSON strings nested inside lists, without recursion
        item = stack.pop()
        if isinstance(item, str):
            stack.append(_json_loads(item))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            out.append(item)
        else:
            raise ValueError(f"unexpected {type(item).__name__} in process-group config")
    return out


def inspect_rank(path: str | os.PathLike[str], rank: int, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> RankReport:
    """Stream one rank's file once and summarize it (see the module docstring).

    Raises:
        TraceDecodeError: the file cannot be decoded.
    """
    log = _ProblemLog(rank)
    ids: list[int] = []
    durs: list[int] = []
    dep_start: list[int] = []
    dep_ids: list[int] = []
    n_data: list[int] = []
    id_index: dict[int, int] = {}
    type_counts: Counter[int] = Counter()
    coll_stats: Counter[tuple[str, int]] = Counter()
    coll_bytes: Counter[tuple[str, int]] = Counter()
    coll_seq: dict[str, list[_CollOp]] = defaultdict(list)
    p2p: list[tuple[str, _P2POp]] = []
    pg_init: dict[str, list[int]] = {}
    comp_us = 0
    p2p_sent = 0

    with EtReader(path, max_message_bytes=max_message_bytes) as reader:
        meta = attr_map(reader.metadata.attr)
        schema = str(meta["schema"].value) if "schema" in meta and meta["schema"].kind == "string_val" else None
        for node in reader:
            nid = node.id
            t = node.type
            idx = len(ids)
            if nid in id_index:
                log.add("duplicate-id", "error", f"node id {nid} appears again (node index {idx}); "
                        f"dependencies on it are ambiguous", nid)
            else:
                id_index[nid] = idx
            ids.append(nid)
            durs.append(node.duration_micros)
            dep_start.append(len(dep_ids))
            dep_ids.extend(node.data_deps)
            n_data.append(len(node.data_deps))
            dep_ids.extend(node.ctrl_deps)
            type_counts[t] += 1
            if t == pb.COMP_NODE:
                comp_us += node.duration_micros
            elif t == pb.INVALID_NODE:
                log.add("invalid-node-type", "error", f"node id {nid} has type INVALID_NODE (0)", nid)
            elif t > pb.COMM_COLL_NODE:
                log.add("unknown-node-type", "warning",
                        f"node id {nid} has NodeType {t}, from a newer Chakra draft nbox does not interpret", nid)
            attrs = attr_map(node.attr) if len(node.attr) else {}
            for name, found in attrs.items():
                want = CONTRACT_KINDS.get(name)
                if want is not None and found.kind != want:
                    log.add("wrong-attr-kind", "warning",
                            f"node id {nid}: attribute {name!r} is {found.kind}, the contract says {want} "
                            f"(consumers reading {want} see 0)", nid)
            cpu_op = attrs.get("is_cpu_op")
            if cpu_op is None:
                if t != pb.METADATA_NODE:
                    log.tally("missing-is-cpu-op", "warning", "lack is_cpu_op, which the contract wants on every node",
                              nid)
            elif t in _COMM_NODE_TYPES and as_int(cpu_op):
                log.add("comm-is-cpu-op", "error",
                        f"node id {nid}: comm node has is_cpu_op true (ASTRA-sim rejects it)", nid)
            if t == pb.COMM_COLL_NODE:
                _check_collective(node, attrs, log, coll_stats, coll_bytes, coll_seq)
            elif t in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                op = _check_p2p(node, attrs, rank, log)
                if op is not None:
                    p2p.append(("send" if t == pb.COMM_SEND_NODE else "recv", op))
                    if t == pb.COMM_SEND_NODE:
                        p2p_sent += op.size
            elif t == pb.METADATA_NODE and node.name == PG_INIT_NODE:
                try:
                    for group in parse_pg_init(node.inputs.values):
                        name = str(group.get("pg_name", ""))
                        ranks = group.get("ranks", [])
                        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                            raise ValueError(f"process group {name!r}: 'ranks' is not a list of integers")
                        pg_init[name] = ranks
                except ValueError as exc:
                    log.add("bad-pg-init", "warning", f"node id {nid}: cannot read the process groups: {exc}", nid)
        for z in reader.zero_length_messages:
            log.add("zero-length-message", "error",
                    f"zero-length message at byte offset {z.offset} (node index {z.node_index}): an empty node; "
                    "Chakra's reader stops there and drops every later node")
        compressed = reader.compressed

    dep_start.append(len(dep_ids))
    roots, depth, critical = _graph_metrics(ids, durs, dep_start, dep_ids, n_data, id_index, log)
    collectives = [CollectiveStat(pg, comm_type_name(ct), n, coll_bytes[(pg, ct)])
                   for (pg, ct), n in sorted(coll_stats.items())]
    sends = sum(1 for kind, _ in p2p if kind == "send")
    return RankReport(
        rank=rank, path=str(path), file_bytes=Path(path).stat().st_size, compressed=compressed,
        version=reader.metadata.version, schema=schema, node_count=len(ids),
        nodes_by_type={node_type_name(t): n for t, n in sorted(type_counts.items())},
        collectives=collectives, p2p_sends=sends, p2p_recvs=len(p2p) - sends, p2p_bytes_sent=p2p_sent,
        comp_duration_us=comp_us, roots=roots, depth=depth, critical_path_us=critical,
        problems=log.finish(), coll_seq=dict(coll_seq), p2p=p2p, pg_init=pg_init,
    )


def _int_attr(attrs: dict[str, Attr], name: str) -> int | None:
    found = attrs.get(name)
    return None if found is None else as_int(found)


def _check_collective(node: pb.Node, attrs: dict[str, Attr], log: _ProblemLog,
                      stats: Counter[tuple[str, int]], nbytes: Counter[tuple[str, int]],
                      seq: dict[str, list[_CollOp]]) -> None:
    nid = node.id
    ctype = _int_attr(attrs, "comm_type")
    size = _int_attr(attrs, "comm_size")
    missing = [n for n, v in (("comm_type", ctype), ("comm_size", size)) if v is None]
    if missing:
        log.add("comm-missing-attr", "error",
                f"node id {nid} ({node.name[:60]!r}): collective without {' and '.join(missing)}", nid)
    if ctype is not None and ctype not in COMM_TYPE_NAMES:
        log.add("bad-enum", "error", f"node id {nid}: comm_type {ctype} is not a CollectiveCommType (0-9)", nid)
        ctype = None
    if size is not None and size < 0:
        log.add("bad-value", "error", f"node id {nid}: comm_size {size} is negative", nid)
        size = None
    if ctype is None or size is None:
        return
    pg_attr = attrs.get("pg_name")
    pg = "" if pg_attr is None or pg_attr.value is None else str(pg_attr.value)
    stats[(pg, ctype)] += 1
    nbytes[(pg, ctype)] += size
    split = ctype == pb.ALL_TO_ALL and any(a in attrs for a in SPLIT_ATTRS)
    seq[pg].append(_CollOp(ctype, size, nid, split))


def _check_p2p(node: pb.Node, attrs: dict[str, Attr], rank: int, log: _ProblemLog) -> _P2POp | None:
    nid = node.id
    is_send = node.type == pb.COMM_SEND_NODE
    kind = "send" if is_send else "recv"
    values = {n: _int_attr(attrs, n) for n in ("comm_src", "comm_dst", "comm_tag", "comm_size")}
    needed = ("comm_dst", "comm_tag", "comm_size") if is_send else ("comm_src", "comm_tag", "comm_size")
    missing = [n for n in needed if values[n] is None]
    if missing:
        log.add("p2p-missing-attr", "error", f"node id {nid}: {kind} without {', '.join(missing)}", nid)
        return None
    other = "comm_src" if is_send else "comm_dst"
    if values[other] is None:
        log.tally("p2p-missing-end", "warning",
                  "are sends without comm_src or receives without comm_dst (consumers take this rank; "
                  "the contract says write all three)", nid)
    src = values["comm_src"] if values["comm_src"] is not None else rank
    dst = values["comm_dst"] if values["comm_dst"] is not None else rank
    return _P2POp(src, dst, values["comm_tag"], values["comm_size"], nid)  # type: ignore[arg-type]


def _graph_metrics(ids: list[int], durs: list[int], dep_start: list[int], dep_ids: list[int], n_data: list[int],
                   id_index: dict[int, int], log: _ProblemLog) -> tuple[int, int, int]:
    """Roots, depth (nodes) and critical path (us) by Kahn's algorithm; reports dangling deps and cycles."""
    n = len(ids)
    preds: list[tuple[int, ...]] = []
    indeg = [0] * n
    succ_count = [0] * n
    for i in range(n):
        lo, hi = dep_start[i], dep_start[i + 1]
        if lo == hi:
            preds.append(())
            continue
        resolved = set()
        for k in range(lo, hi):
            dep = dep_ids[k]
            j = id_index.get(dep)
            if j is None:
                which = "data_deps" if k - lo < n_data[i] else "ctrl_deps"
                log.add("dangling-dep", "error", f"node id {ids[i]}: {which} names id {dep}, not a node of this file",
                        ids[i])
            elif j == i:
                log.add("cycle", "error", f"node id {ids[i]} depends on itself", ids[i])
            else:
                resolved.add(j)
        p = tuple(resolved)
        preds.append(p)
        indeg[i] = len(p)
        for j in p:
            succ_count[j] += 1
    # successor lists in CSR form
    succ_start = [0] * (n + 1)
    for i in range(n):
        succ_start[i + 1] = succ_start[i] + succ_count[i]
    fill = succ_start[:-1].copy()
    succ = [0] * succ_start[n]
    for i in range(n):
        for j in preds[i]:
            succ[fill[j]] = i
            fill[j] += 1
    start_us = [0] * n
    level = [1] * n
    queue = [i for i in range(n) if indeg[i] == 0]
    roots = len(queue)
    head = 0
    depth = 0
    critical = 0
    while head < len(queue):
        u = queue[head]
        head += 1
        finish = start_us[u] + durs[u]
        lv = level[u]
        if finish > critical:
            critical = finish
        if lv > depth:
            depth = lv
        for k in range(succ_start[u], succ_start[u + 1]):
            v = succ[k]
            if finish > start_us[v]:
                start_us[v] = finish
            if lv + 1 > level[v]:
                level[v] = lv + 1
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    if head < n:
        blocked = [i for i in range(n) if indeg[i] > 0]
        cycle = _find_cycle(blocked[0], preds, indeg)
        shown = " -> ".join(str(ids[i]) for i in cycle[:8]) + (" -> ..." if len(cycle) > 8 else "")
        log.add("cycle", "error",
                f"dependency cycle through node ids {shown} -> {ids[cycle[0]]}; {len(blocked)} node(s) are on "
                "or behind a cycle and can never run", ids[cycle[0]])
    return roots, depth, critical


def _find_cycle(start: int, preds: list[tuple[int, ...]], indeg: list[int]) -> list[int]:
    """Walk blocked predecessors from ``start`` until a node repeats; return that cycle (in dependency order)."""
    seen: dict[int, int] = {}
    path: list[int] = []
    u = start
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = next(j for j in preds[u] if indeg[j] > 0)
    return list(reversed(path[seen[u]:]))


def load_comm_groups(path: str | os.PathLike[str]) -> dict[str, list[int]]:
    """Read an ASTRA-sim ``comm_group.json``: ``{"<pg_name>": [global ranks]}``.

    Raises:
        InvalidInputError: not JSON, too big, or not that shape (the message names the key).
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise InputNotFoundError(f"{p}: comm-group file not found (or not a regular file)")
        size = p.stat().st_size
        if size > _MAX_PG_JSON_BYTES:
            raise InvalidInputError(f"{p}: {size} bytes, over the {_MAX_PG_JSON_BYTES}-byte cap for a comm-group file")
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"{p}: cannot read the comm-group file: {exc.strerror or exc}") from None
    try:
        data = _json_loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"{p}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"{p}: expected an object {{pg_name: [ranks]}}, got {type(data).__name__}")
    out: dict[str, list[int]] = {}
    for key, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise InvalidInputError(f"{p}: key {key!r}: expected a list of integer ranks, got {ranks!r:.80}")
        out[str(key)] = ranks
    return out


def find_comm_group_file(trace_set: TraceSet) -> Path | None:
    """ASTRA-sim keeps ``comm_group.json`` beside the traces or in a sibling ``inputs/`` folder."""
    d = trace_set.directory
    for candidate in (d / "comm_group.json", d.parent / "inputs" / "comm_group.json", d.parent / "comm_group.json"):
        if candidate.is_file():
            return candidate
    return None


def _membership(trace_set: TraceSet, reports: list[RankReport],
                comm_group_path: str | os.PathLike[str] | None) -> tuple[dict[str, list[int] | None], str]:
    """Process group -> global ranks (None = all ranks), and where that came from."""
    groups: dict[str, list[int] | None] = {}
    source = "convention ('' and '0' are all ranks; other groups: the ranks that use them)"
    path = Path(comm_group_path) if comm_group_path is not None else find_comm_group_file(trace_set)
    if path is not None:
        groups.update(load_comm_groups(path))
        source = str(path)
    else:
        seen_init = False
        for r in reports:
            for name, ranks in r.pg_init.items():
                seen_init = True
                groups.setdefault(name, ranks or None)
        if seen_init:
            source = f"'{PG_INIT_NODE}' metadata nodes"
    for world in ("", "0"):
        groups.setdefault(world, None)
    return groups, source


def check_cross_rank(reports: list[RankReport], groups: dict[str, list[int] | None]) -> list[Problem]:
    """Collective sequences per process group must match on member ranks; p2p sends must meet receives."""
    problems: list[Problem] = []
    present = {r.rank: r for r in reports}
    used: dict[str, set[int]] = defaultdict(set)
    for r in reports:
        for pg in r.coll_seq:
            used[pg].add(r.rank)
    for pg in sorted(used):
        if pg in groups:
            declared = groups[pg]
            members = sorted(present) if declared is None else sorted(declared)
        else:
            members = sorted(used[pg])
        for rank in sorted(used[pg] - set(members)):
            problems.append(Problem("pg-membership", "error",
                                    f"rank {rank} issues collectives on process group {pg!r}, whose members are "
                                    f"{members}", rank))
        ranks_here = [m for m in members if m in present]
        if len(ranks_here) < 2:
            continue
        ref_rank = ranks_here[0]
        ref = present[ref_rank].coll_seq.get(pg, [])
        for other in ranks_here[1:]:
            msg = _first_divergence(ref, present[other].coll_seq.get(pg, []), ref_rank, other)
            if msg is not None:
                text, node_id = msg
                problems.append(Problem("collective-mismatch", "error",
                                        f"process group {pg!r} (ranks {members}): {text}", other, node_id))
    problems.extend(_check_p2p_pairs(present))
    return problems


def _describe(op: _CollOp) -> str:
    return f"{comm_type_name(op.comm_type)} of {op.size} B (node id {op.node_id})"


def _first_divergence(a: list[_CollOp], b: list[_CollOp], ra: int, rb: int) -> tuple[str, int | None] | None:
    for i in range(min(len(a), len(b))):
        x, y = a[i], b[i]
        if x.comm_type != y.comm_type or (x.size != y.size and not (x.split or y.split)):
            return (f"collective #{i} differs: rank {ra} has {_describe(x)}, rank {rb} has {_describe(y)}",
                    y.node_id)
    if len(a) != len(b):
        i = min(len(a), len(b))
        longer, ra_, rb_ = (a, ra, rb) if len(a) > len(b) else (b, rb, ra)
        return (f"collective #{i}: rank {ra_} has {_describe(longer[i])}, rank {rb_} has none "
                f"(rank {ra} issues {len(a)}, rank {rb} issues {len(b)})", longer[i].node_id)
    return None


def _check_p2p_pairs(present: dict[int, RankReport]) -> list[Problem]:
    sent: dict[tuple[int, int, int], list[_P2POp]] = defaultdict(list)
    received: dict[tuple[int, int, int], list[_P2POp]] = defaultdict(list)
    for r in present.values():
        for kind, op in r.p2p:
            (sent if kind == "send" else received)[(op.src, op.dst, op.tag)].append(op)
    problems: list[Problem] = []
    for key in sorted(set(sent) | set(received)):
        src, dst, tag = key
        if src not in present or dst not in present:
            continue  # the other end is not in this trace set
        snd, rcv = sent.get(key, []), received.get(key, [])
        for i in range(max(len(snd), len(rcv))):
            if i >= len(snd) or i >= len(rcv) or snd[i].size != rcv[i].size:
                if i >= len(snd):
                    text = f"rank {dst} receives message #{i} (node id {rcv[i].node_id}) that rank {src} never sends"
                    rank, nid = dst, rcv[i].node_id
                elif i >= len(rcv):
                    text = f"rank {src} sends message #{i} (node id {snd[i].node_id}) that rank {dst} never receives"
                    rank, nid = src, snd[i].node_id
                else:
                    text = (f"message #{i}: rank {src} sends {snd[i].size} B (node id {snd[i].node_id}), rank {dst} "
                            f"receives {rcv[i].size} B (node id {rcv[i].node_id})")
                    rank, nid = dst, rcv[i].node_id
                problems.append(Problem("p2p-mismatch", "error", f"{src} -> {dst} tag {tag}: {text}", rank, nid))
                break
    return problems


def inspect_trace(path: str | os.PathLike[str] | TraceSet, *, comm_group: str | os.PathLike[str] | None = None,
                  max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> TraceReport:
    """Summarize and validate a trace: one ``.et``, a directory, or a ``<prefix>`` of per-rank files.

    Args:
        path: what the user named, or an already resolved TraceSet.
        comm_group: an ASTRA-sim ``comm_group.json`` giving process-group membership; by default one
            beside the traces (or in ``../inputs/``) is used, else the METADATA process-group nodes.

    Raises:
        InputNotFoundError, InvalidInputError, TraceDecodeError: see resolve_trace_set and EtReader.
    """
    trace_set = path if isinstance(path, TraceSet) else resolve_trace_set(path)
    reports = [inspect_rank(p, rank, max_message_bytes=max_message_bytes) for rank, p in trace_set.files.items()]
    groups, source = _membership(trace_set, reports, comm_group)
    problems = check_cross_rank(reports, groups)
    return TraceReport(trace_set.prefix, str(trace_set.directory), reports, groups, source, problems)


def iter_problem_lines(report: TraceReport) -> Iterable[str]:
    """One human line per problem: ``rank R node N: [code] message``."""
    for p in report.all_problems():
        where = []
        if p.rank is not None:
            where.append(f"rank {p.rank}")
        if p.node_id is not None:
            where.append(f"node {p.node_id}")
        yield f"{' '.join(where) or 'trace'}: [{p.severity} {p.code}] {p.message}"


__all__ = [
    "MAX_PROBLEMS_PER_CODE", "PG_INIT_NODE", "REPORT_SCHEMA", "CollectiveStat", "Problem", "RankReport",
    "TraceReport", "check_cross_rank", "comm_type_name", "find_comm_group_file", "inspect_rank", "inspect_trace",
    "iter_problem_lines", "load_comm_groups", "node_type_name", "parse_pg_init",
]
