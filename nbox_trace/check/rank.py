"""Per-rank checks: stream one rank's file once, summarize it and list what it does wrong.

Per rank: metadata version and ``schema`` attribute, node counts by type, collectives by process group and type
(count, total bytes), point-to-point traffic, total COMP duration, and the graph metrics of :mod:`.graph`.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from pathlib import Path

from nbox_trace.chakra import CONTRACT_KINDS, DEFAULT_MAX_MESSAGE_BYTES, Attr, EtReader, as_int, attr_map
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.check.graph import graph_metrics
from nbox_trace.check.report import CollectiveStat, CollOp, P2POp, ProblemLog, RankReport
from nbox_trace.contract import (
    COMM_NODE_TYPES,
    COMM_TYPE_NAMES,
    PG_INIT_NODE,
    SPLIT_ATTRS,
    comm_type_name,
    node_type_name,
    parse_pg_init,
)


def inspect_rank(path: str | os.PathLike[str], rank: int, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> RankReport:
    """Stream one rank's file once and summarize it (see the module docstring).

    Raises:
        TraceDecodeError: the file cannot be decoded.
    """
    log = ProblemLog(rank)
    ids: list[int] = []
    durs: list[int] = []
    dep_start: list[int] = []
    dep_ids: list[int] = []
    n_data: list[int] = []
    id_index: dict[int, int] = {}
    type_counts: Counter[int] = Counter()
    coll_stats: Counter[tuple[str, int]] = Counter()
    coll_bytes: Counter[tuple[str, int]] = Counter()
    coll_seq: dict[str, list[CollOp]] = defaultdict(list)
    p2p: list[tuple[str, P2POp]] = []
    pg_init: dict[str, list[int]] = {}
    pg_desc: dict[str, str] = {}
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
            elif t in COMM_NODE_TYPES and as_int(cpu_op):
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
                        desc = group.get("pg_desc")
                        if isinstance(desc, str) and desc:
                            pg_desc[name] = desc[:200]
                except ValueError as exc:
                    log.add("bad-pg-init", "warning", f"node id {nid}: cannot read the process groups: {exc}", nid)
        for z in reader.zero_length_messages:
            log.add("zero-length-message", "error",
                    f"zero-length message at byte offset {z.offset} (node index {z.node_index}): an empty node; "
                    "Chakra's reader stops there and drops every later node")
        compressed = reader.compressed

    dep_start.append(len(dep_ids))
    roots, depth, critical = graph_metrics(ids, durs, dep_start, dep_ids, n_data, id_index, log)
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
        pg_desc=pg_desc,
    )


def _int_attr(attrs: dict[str, Attr], name: str) -> int | None:
    found = attrs.get(name)
    return None if found is None else as_int(found)


def _check_collective(node: pb.Node, attrs: dict[str, Attr], log: ProblemLog,
                      stats: Counter[tuple[str, int]], nbytes: Counter[tuple[str, int]],
                      seq: dict[str, list[CollOp]]) -> None:
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
    seq[pg].append(CollOp(ctype, size, nid, split))


def _check_p2p(node: pb.Node, attrs: dict[str, Attr], rank: int, log: ProblemLog) -> P2POp | None:
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
    return P2POp(src, dst, values["comm_tag"], values["comm_size"], nid)  # type: ignore[arg-type]

