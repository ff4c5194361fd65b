"""The comm nodes of one rank: one ``COMM_COLL_NODE`` / ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` per collective.

Each stands in place of its ``c10d::<op>`` operator; attributes follow the contract exactly (``is_cpu_op``
false, ``comm_type`` int64, ``comm_size`` int64 bytes, ``pg_name``; ``comm_src``/``comm_dst``/``comm_tag``
int32 on p2p). Facts, sources and the ``comm_size`` convention are in :mod:`nbox_record.sources.comms`; the
collective log's records are joined to the ET's collectives in order. The duration is the best measure
of the communication: the span of gloo's worker thread (``gloo:<op>`` marker), else done - issue from
``collectives.json``, else the CPU call (an NCCL kernel, when there is one, replaces it:
:mod:`nbox_record.convert.gpu`).
"""

from __future__ import annotations

from typing import Any

from nbox_record.convert.attrs import MAX_NAME, set_attr, storages, write_io
from nbox_record.convert.deps import OutNode
from nbox_record.convert.groups import ProcessGroups
from nbox_record.convert.inputs import RankInputs
from nbox_record.convert.toplevel import Collective
from nbox_record.sources import (
    P2P_KINDS,
    RPC_NAME,
    CommFacts,
    CpuEvent,
    collective_facts,
    in_int32,
    short_op,
)
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import InvalidInputError


class CommNodes:
    """Facts and nodes of the collectives of ``inputs``; counts comm_size_unknown and p2p_unknown_peer."""

    def __init__(self, inputs: RankInputs, pgs: ProcessGroups, stats: dict[str, int]) -> None:
        self.inputs, self.pgs, self.stats = inputs, pgs, stats

    def records(self) -> dict[int, dict[str, Any]]:
        """Join collectives.json records, in order, with the ET's ``c10d::`` collectives.

        The log sees every collective the process group is asked for (``nbox emulate``'s observer), or every one
        issued above autograd (``nbox record``'s Autograd-key kernel): it cannot see functional collectives, nor,
        when recording, c10d ops issued from inside another operator's kernel (see :mod:`nbox_record.capture.commlog`).
        A capture by this nbox names each record inside its ET node (``nbox::collective/<pg>/<seq>/<op>``,
        :mod:`nbox_record.capture.commlog`): the join is then by that identity (:func:`by_identity`), whatever the
        order or nesting the ET observer gave the nodes (issue 16: DDP's buffer broadcasts, its reducer's
        all-reduce and a user broadcast diverged when joined by position).
        Older captures: the join is in order (:func:`align`): each record pairs with an ET collective of the same op;
        a top-level ET collective must pair; one nested in another operator pairs when the log saw it and is left
        out (keeping the facts of its own inputs) when it did not. The ET observer sometimes nests a top-level
        collective under an operator left open by another thread's record function, so nesting alone cannot
        decide which collectives the log saw (this was the intermittent "absent from the host ET" failure).
        """
        log, et = self.inputs.log, self.inputs.et
        if log is None:
            return {}
        ops = [a for a in self.inputs.w.anchors if a.node.name.startswith("c10d::")]
        records = log.records
        if any(a.identity is not None for a in ops):
            return by_identity(ops, records, str(log.path), str(et.path))
        pairs = align([short_op(a.node.name) for a in ops], [a.in_op for a in ops],
                      [short_op(r["op"]) for r in records])
        if pairs is not None:
            return {ops[i].node.id: records[j] for i, j in pairs}
        top = [a for a in ops if not a.in_op]  # no alignment: name the first place the two disagree
        for i in range(max(len(top), len(records))):
            if i >= len(top) or i >= len(records):
                extra = (f"the log's #{i} is {records[i]['op']!r} (seq {records[i]['seq']}), absent from the host ET"
                         if i < len(records) else
                         f"the host ET's #{i} is {top[i].node.name!r} (node id {top[i].node.id}), absent from the log")
                raise InvalidInputError(
                    f"{log.path}: lists {len(records)} collectives but the host ET {et.path} has "
                    f"{len(top)} c10d collective ops: {extra}")
            rec, op = records[i], top[i]
            if short_op(rec["op"]) != short_op(op.node.name):
                raise InvalidInputError(
                    f"{log.path}: collective #{i} is {rec['op']!r} (seq {rec['seq']}) but the host ET "
                    f"{et.path} has {op.node.name!r} (node id {op.node.id}) there: the captures diverge")
        raise InvalidInputError(f"{log.path}: its {len(records)} collectives cannot be matched in order with the "
                                f"{len(ops)} c10d collective ops of the host ET {et.path}")

    def facts(self, a: Collective, rec: dict[str, Any] | None) -> CommFacts:
        """What is known of collective ``a``: its inputs, overlaid by its ``record_param_comms``, then by
        its log record; its process group resolved."""
        f = collective_facts(a.node, a.kind, a.rpc, rec)
        self.pgs.resolve(f)
        return f

    def item(self, a: Collective, f: CommFacts) -> OutNode:
        """The comm node of collective ``a`` with facts ``f``."""
        n, rank = a.node, self.inputs.rank
        where = f"{self.inputs.et.path}: node id {n.id} ({n.name})"
        if f.kind in P2P_KINDS:
            node_type = pb.COMM_SEND_NODE if f.kind == "SEND" else pb.COMM_RECV_NODE
            if f.peer is None:  # recv_any_source_: the sender is known only at run time
                self.stats["p2p_unknown_peer"] += 1
        else:
            node_type = pb.COMM_COLL_NODE
        name = n.name if n.name != RPC_NAME else f"nccl:{f.op or f.kind.lower()}"
        node = pb.Node(name=name[:MAX_NAME], type=node_type)
        set_attr(node, "is_cpu_op", False)
        if node_type == pb.COMM_COLL_NODE:
            set_attr(node, "comm_type", pb.CollectiveCommType.Value(f.kind))
        if f.size is None:
            self.stats["comm_size_unknown"] += 1
        set_attr(node, "comm_size", f.size if f.size is not None else 0)
        set_attr(node, "pg_name", f.pg_name or "0")
        if f.kind in P2P_KINDS:
            peer = f.peer if f.peer is not None else -1
            tag = f.tag if f.tag is not None else 0
            for value, what in ((peer, "peer rank"), (tag, "tag"), (rank, "rank")):
                if not in_int32(value):
                    raise InvalidInputError(f"{where}: {what} {value} does not fit comm_src/comm_dst/comm_tag (int32)")
            src, dst = (rank, peer) if f.kind == "SEND" else (peer, rank)
            set_attr(node, "comm_src", src)
            set_attr(node, "comm_dst", dst)
            set_attr(node, "comm_tag", tag)
        _extras(node, f, n.name)
        set_attr(node, "op_schema", n.op_schema)
        for attr in ("tid", "rf_id", "seq_id"):
            set_attr(node, attr, getattr(n, attr))
        set_attr(node, "nbox_et_id", n.id)
        if a.iteration is not None:
            set_attr(node, "nbox_iteration", a.iteration)
        write_io(n, node)
        ev = self.inputs.ev(n)
        start = ev.ts if ev is not None else f.issue_us
        cpu_dur = ev.dur if ev is not None else None
        if cpu_dur is not None:
            set_attr(node, "nbox_cpu_duration_micros", max(0, round(cpu_dur)))
        dur = self._worker_span(a, ev)
        if dur is None and f.done_us is not None and f.issue_us is not None:
            dur = max(0.0, f.done_us - f.issue_us)
        if dur is None:
            dur = cpu_dur
        if start is not None:
            node.start_time_micros = max(0, round(start))
        if dur is not None:
            node.duration_micros = max(0, round(dur))
        else:
            set_attr(node, "nbox_untimed", True)
        return OutNode((n.order, 0, 0.0, 0), node, thread=n.tid, start=start,
                       end=None if start is None or cpu_dur is None else start + cpu_dur, comm=True, pg=f.pg_name,
                       sync=not f.async_op, wait_us=f.wait_us, reads=storages(n.inputs.values),
                       writes=storages(n.outputs.values))

    def _worker_span(self, a: Collective, anchor_ev: CpuEvent | None) -> float | None:
        """Duration of the marker that ran on another thread (gloo's worker), if any."""
        for m in a.markers:
            ev = self.inputs.ev(m)
            if ev is not None and (anchor_ev is None or ev.thread != anchor_ev.thread):
                return ev.dur
        return None

    def internal_ops(self) -> set[int]:
        """Top-level ops that ran on a collective library's worker thread (gloo's copies, its AVG divide).

        A worker thread is one Kineto puts a ``gloo:``/``nccl:`` marker on although no collective was issued from
        it (the marker opens on the issuing thread and closes on the worker); linked to a collective or loose
        (one the ET observer misplaced). Every ``gloo:`` marker in the Kineto trace counts, not only those the ET
        links to a collective: gloo runs a group's work on two threads, and the markers of one of them were seen
        unlinked in some recordings (a DTensor script: 16 copies per iteration of one rank counted as compute, in 4
        recordings of 25). Every top-level op of such a thread is the library's own work: user code never runs
        there, and some of it (gloo's divide for ``ReduceOp.AVG``) runs after the marker closed.
        """
        inputs = self.inputs
        if inputs.trace is None:
            return set()
        issuing = {ev.thread for a in inputs.w.anchors if (ev := inputs.ev(a.node)) is not None}
        markers = [m for a in inputs.w.anchors for m in a.markers] + inputs.w.loose_markers
        workers = {ev.thread for m in markers if (ev := inputs.ev(m)) is not None and ev.thread not in issuing}
        # gloo's markers only: NCCL's are recorded on the issuing thread, which must never lose its operators
        workers |= {ev.thread for ev in inputs.trace.cpu if ev.name.startswith("gloo:") and ev.thread not in issuing}
        return {n.id for n in inputs.w.tops if (ev := inputs.ev(n)) is not None and ev.thread in workers}


def _extras(node: pb.Node, f: CommFacts, et_name: str) -> None:
    """nbox's own comm attributes: op, source, dtype, async, root, all-to-all splits, seq, group description."""
    set_attr(node, "nbox_op", f.op or short_op(et_name))
    set_attr(node, "nbox_comm_source", f.source)
    if f.dtype:
        set_attr(node, "nbox_dtype", f.dtype)
    if f.async_op is not None:
        set_attr(node, "nbox_async", f.async_op)
    if f.root is not None:
        set_attr(node, "nbox_root", f.root)
    if f.kind == "ALL_TO_ALL":
        if f.in_splits:
            set_attr(node, "nbox_in_split_sizes", f.in_splits)
        if f.out_splits:
            set_attr(node, "nbox_out_split_sizes", f.out_splits)
    if f.seq is not None:
        set_attr(node, "nbox_seq", f.seq)
    if f.pg_desc:
        set_attr(node, "nbox_pg_desc", f.pg_desc)


def by_identity(ops: list[Collective], records: list[dict[str, Any]], log_path: str,
                et_path: str) -> dict[int, dict[str, Any]]:
    """Pair each ET collective carrying an identity ``(pg_name, seq, op)`` with the log record of that seq,
    checking its group and op; ET id -> record. Every record must be named by exactly one ET collective; an
    ET collective without an identity (the log did not see it: see :mod:`nbox_record.capture.commlog`) pairs with
    nothing and keeps the facts of its own inputs."""
    by_seq = {int(r["seq"]): r for r in records}
    out: dict[int, dict[str, Any]] = {}
    seen: dict[int, int] = {}
    for a in ops:
        if a.identity is None:
            continue
        pg, seq, op = a.identity
        rec = by_seq.get(seq)
        where = f"{et_path}: node id {a.node.id} ({a.node.name}) names collective {pg}/{seq}/{op}"
        if rec is None:
            raise InvalidInputError(f"{where}, absent from {log_path}")
        if rec["pg_name"] != pg or rec["op"] != op or short_op(a.node.name) != short_op(op):
            raise InvalidInputError(f"{where} but {log_path} has seq {seq} as {rec['op']!r} on group "
                                    f"{rec['pg_name']!r}: the captures diverge")
        if seq in seen:
            raise InvalidInputError(f"{where}, as does node id {seen[seq]}")
        seen[seq] = a.node.id
        out[a.node.id] = rec
    missing = [r for r in records if int(r["seq"]) not in seen]
    if missing:
        r = missing[0]
        raise InvalidInputError(f"{log_path}: {len(missing)} collective(s) absent from the host ET {et_path}, "
                                f"the first {r['op']!r} (seq {r['seq']}, group {r['pg_name']!r})")
    return out


def align(op_names: list[str], nested: list[bool], record_names: list[str]) -> list[tuple[int, int]] | None:
    """Pair every record with an ET collective of the same name, in order; ``(op index, record index)`` pairs, or
    None when impossible. A top-level op (``nested[i]`` false) must be paired; a nested one may be skipped, and is
    skipped whenever the rest still pairs (the log usually cannot see nested ones).

    Dynamic programming over (ops seen, ops skipped): O(ops x skips), skips = len(ops) - len(records) >= 0.
    """
    n, m = len(op_names), len(record_names)
    skips = n - m
    if skips < 0:
        return None
    # ok[i][s]: ops[i:] and records[i - s:] can still be paired, s ops skipped so far
    ok = [[False] * (skips + 1) for _ in range(n + 1)]
    ok[n][skips] = True
    for i in range(n - 1, -1, -1):
        for s in range(min(i, skips), -1, -1):
            j = i - s
            can_skip = nested[i] and s < skips and ok[i + 1][s + 1]
            can_pair = j < m and op_names[i] == record_names[j] and ok[i + 1][s]
            ok[i][s] = can_skip or can_pair
    if not ok[0][0]:
        return None
    pairs: list[tuple[int, int]] = []
    s = 0
    for i in range(n):
        if nested[i] and s < skips and ok[i + 1][s + 1]:
            s += 1
        else:
            pairs.append((i, i - s))
    return pairs
