"""Convert one rank's raw capture (host ET JSON + Kineto + optional ``collectives.json``) to Chakra ET nodes.

:func:`convert_rank` is the entry point; what comes out (design.md "Trace model", chakra-format.md):

* one ``COMP_NODE`` per **top-level operator** of the host ET (which nodes those are, and which are
  containers looked into: :mod:`nbox_record.toplevel`). Each carries ``is_cpu_op`` true,
  ``op_schema``, the inputs/outputs as JSON text in the IOInfo strings (values with tensor ids,
  shapes, types; strides in ``nbox_input_strides``/``nbox_output_strides``), ``tid``, ``rf_id``,
  ``seq_id``, ``fw_parent``, ``fw_tid``, ``scope``, ``nbox_et_id``, ``nbox_iteration`` (from
  ``ProfilerStep#N``), ``nbox_annotation`` (enclosing ``record_function`` names) and start/duration
  from Kineto (:mod:`nbox_record.kineto`). An operator Kineto does not know keeps duration 0 and gets
  ``nbox_untimed`` true. One without an ``aten`` schema (``autograd::engine::evaluate_function: ...``,
  ``fsdp::`` ops, DDP's ``copy_bucket_to_grad``) also lists, for live replay, the outermost ``aten``
  operators under it in execution order (never those of a collective hoisted out of it) in
  ``nbox_children``: JSON text, a list of ``{name, op_schema, et_id, inputs: {values, shapes, types},
  outputs: {values, shapes, types}[, input_strides]}``, the node's own formats (:func:`_io`) parsed. Over
  :data:`MAX_CHILDREN` operators or :data:`MAX_CHILDREN_BYTES` of text it is left out and
  ``nbox_children_truncated`` is true instead.
* one comm node (``COMM_COLL_NODE``, ``COMM_SEND_NODE``, ``COMM_RECV_NODE``) per collective, in place
  of its ``c10d::<op>`` operator; a collective issued inside a top-level operator (DDP's all-reduce
  inside ``evaluate_function: AccumulateGrad``) is hoisted out and follows that operator. Attributes
  follow the contract exactly (``is_cpu_op`` false, ``comm_type`` int64, ``comm_size`` int64 bytes,
  ``pg_name``; ``comm_src``/``comm_dst``/``comm_tag`` int32 on p2p). Facts, sources and the
  ``comm_size`` convention (per-rank *input* bytes; for ALL_GATHER the per-rank input shard, as
  ASTRA-sim counts it) are in :mod:`nbox_record.comms`. Extras: ``nbox_op``, ``nbox_comm_source``,
  ``nbox_dtype``, ``nbox_async``, ``nbox_root``, ``nbox_in_split_sizes``/``nbox_out_split_sizes``
  (all-to-all), ``nbox_seq``, ``nbox_pg_desc``, ``nbox_stream``, ``nbox_cpu_duration_micros``. The
  duration is the best measure of the communication: the NCCL kernel(s) it launched (the node then
  starts with its kernel and sits on that stream), else the span of gloo's worker thread
  (``gloo:<op>`` marker), else done - issue from ``collectives.json``, else the CPU call.
* GPU work from Kineto (kernels, memcpy, memset) as ``COMP_NODE`` with ``is_cpu_op`` false,
  ``nbox_stream`` and ``nbox_gpu_kind``; GPU ops launched outside the host ET's span are dropped.
* first, a ``METADATA_NODE`` ``## process_group:init ##`` whose ``inputs.values`` is the JSON list of
  process groups (the ET's own, merged, plus groups learnt from the collectives).

Dependencies (:mod:`nbox_record.deps`) are all in ``data_deps`` and point to earlier nodes only, so
the graph is complete and acyclic by construction; node ids are 0.. in recorded order.

Process groups: from ``## process_group:init ##`` (``ranks: []`` with ``group_size`` N is ranks
0..N-1), ``collectives.json`` and ``record_param_comms`` (rank start/stride/size). A collective
whose group the trace does not name is put on ``"0"`` (the world) when its size is the world size or
unknown (``stats["pg_assumed_world"]``); a group of size 1 is this rank alone, named
``SINGLETON_PG_BASE + rank`` so that each rank's differs.

Dropped, and counted in ``stats``: ``gloo:``/``nccl:`` markers at top level, the work a gloo worker
thread did inside a collective (the copies of an all-gather: the collective already stands for it),
nodes unreachable from the roots. The inputs are untrusted: size-capped, parsed without recursion,
never evaluated; every error is an :class:`~nbox_trace.errors.InvalidInputError` naming the file.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbox_record.comms import (
    COLL_TYPES,
    P2P_KINDS,
    RPC_NAME,
    CollectiveLogData,
    CommFacts,
    facts_from_op_inputs,
    facts_from_record,
    facts_from_rpc,
    in_int32,
    kind_of_collective_name,
    load_collective_log,
    rpc_collective_name,
    short_op,
)
from nbox_record.deps import Key, OutNode, link
from nbox_record.hostet import EtNode, HostEt, iter_tensors, read_host_et
from nbox_record.kineto import CpuEvent, KinetoTrace, enclosing_events, join_host_ops, launching_events, read_kineto
from nbox_record.toplevel import (
    BOOKKEEPING,
    Collective,
    Walk,
    link_loose_markers,
    op_namespace,
    runnable_descendants,
    walk,
)
from nbox_trace import __version__
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import AttrValue, make_attr
from nbox_trace.contract import PG_INIT_NODE, parse_pg_init
from nbox_trace.errors import InvalidInputError
from nbox_trace.jsonio import DEFAULT_MAX_JSON_BYTES

METADATA_VERSION = "1.0.0"
_MAX_NAME = 2048
#: Name of a size-1 process group whose name the trace does not give: this number + the rank.
SINGLETON_PG_BASE = 1_000_000
#: Caps of ``nbox_children`` (per node): operators listed, and bytes of its JSON text.
MAX_CHILDREN = 512
MAX_CHILDREN_BYTES = 256 * 1024


@dataclass(frozen=True)
class RankConversion:
    """One rank converted: ``nodes`` have unique increasing ids and are ready for ``EtWriter``."""

    rank: int
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]
    process_groups: dict[str, list[int]]  # pg_name -> global ranks (for comm_group.json)
    stats: dict[str, int]


# -- the conversion --------------------------------------------------------------------------------
def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _set(node: pb.Node, name: str, value: AttrValue) -> None:
    node.attr.append(make_attr(name, value))


def _storages(value: Any) -> list[int]:
    return sorted({t[1] for t in iter_tensors(value) if t[1] > 0})


def _io(n: EtNode, node: pb.Node) -> None:
    node.inputs.CopyFrom(pb.IOInfo(values=_dumps(n.inputs.values), shapes=_dumps(n.inputs.shapes),
                                   types=_dumps(n.inputs.types)))
    node.outputs.CopyFrom(pb.IOInfo(values=_dumps(n.outputs.values), shapes=_dumps(n.outputs.shapes),
                                    types=_dumps(n.outputs.types)))
    if n.inputs.strides is not None:
        _set(node, "nbox_input_strides", _dumps(n.inputs.strides))
    if n.outputs.strides is not None:
        _set(node, "nbox_output_strides", _dumps(n.outputs.strides))


def _times(node: pb.Node, ev: CpuEvent | None) -> None:
    if ev is None:
        _set(node, "nbox_untimed", True)
        return
    node.start_time_micros = max(0, round(ev.ts))
    node.duration_micros = max(0, round(ev.dur))


def _child(c: EtNode) -> dict[str, Any]:
    """One entry of ``nbox_children``: the IOInfo lists of :func:`_io` (parsed, not JSON text)."""
    entry: dict[str, Any] = {
        "name": c.name[:_MAX_NAME], "op_schema": c.op_schema, "et_id": c.id,
        "inputs": {"values": c.inputs.values, "shapes": c.inputs.shapes, "types": c.inputs.types},
        "outputs": {"values": c.outputs.values, "shapes": c.outputs.shapes, "types": c.outputs.types}}
    if c.inputs.strides is not None:
        entry["input_strides"] = c.inputs.strides
    return entry


def _children(n: EtNode, et: HostEt, w: Walk, node: pb.Node) -> None:
    """``nbox_children`` of a top-level operator live replay cannot run itself (no aten schema)."""
    if op_namespace(n.op_schema) == "aten":
        return
    found = runnable_descendants(et, w, n)
    if not found:
        return
    text = _dumps([_child(c) for c in found[:MAX_CHILDREN]]) if len(found) <= MAX_CHILDREN else ""
    if not text or len(text.encode()) > MAX_CHILDREN_BYTES:
        _set(node, "nbox_children_truncated", True)
        return
    _set(node, "nbox_children", text)


def _comp_item(n: EtNode, ev: CpuEvent | None, w: Walk, et: HostEt) -> OutNode:
    node = pb.Node(name=n.name[:_MAX_NAME], type=pb.COMP_NODE)
    _set(node, "is_cpu_op", True)
    _set(node, "op_schema", n.op_schema)
    for attr in ("tid", "rf_id", "seq_id", "fw_parent", "fw_tid", "scope"):
        _set(node, attr, getattr(n, attr))
    _set(node, "nbox_et_id", n.id)
    if n.id in w.iteration:
        _set(node, "nbox_iteration", w.iteration[n.id])
    if n.id in w.annotation:
        _set(node, "nbox_annotation", w.annotation[n.id])
    _io(n, node)
    _children(n, et, w, node)
    _times(node, ev)
    return OutNode((n.order, 0, 0.0, 0), node, thread=n.tid, start=None if ev is None else ev.ts,
                 end=None if ev is None else ev.end, reads=_storages(n.inputs.values),
                 writes=_storages(n.outputs.values))


class _Converter:
    def __init__(self, et: HostEt, trace: KinetoTrace | None, log: CollectiveLogData | None, rank: int,
                 world_size: int | None) -> None:
        self.et, self.trace, self.log, self.rank = et, trace, log, rank
        self.stats: dict[str, int] = dict.fromkeys(
            ("host_nodes", "pg_assumed_world", "pg_unresolved", "comm_size_unknown", "p2p_unknown_peer",
             "gpu_ops_folded_into_comm", "gpu_unlinked", "gpu_dropped"), 0)
        self.stats["host_nodes"] = len(et.nodes)
        self.w = walk(et)
        self.stats["unreachable_nodes"] = len(et.nodes) - self.w.visited
        self.ev_of: dict[int, int] = {}
        self.join_method = "none"
        if trace is not None:
            nodes = sorted((n for n in et.nodes.values() if not n.name.startswith(BOOKKEEPING)),
                           key=lambda n: (n.order, n.id))
            self.ev_of, self.join_method = join_host_ops(nodes, trace)
        self.groups: dict[str, list[int]] = {}
        self.group_desc: dict[str, str] = {}
        self.pg_entries: list[dict[str, Any]] = []
        self._read_pg_init()
        if log is not None:
            for name, (desc, ranks) in log.groups.items():
                self._add_group(name, ranks, desc)
        self.world = world_size or (log.world_size if log else None) or (trace.world_size if trace else None) \
            or self._pg_init_world()

    def ev(self, n: EtNode) -> CpuEvent | None:
        assert self.trace is not None or not self.ev_of
        i = self.ev_of.get(n.id)
        return None if i is None or self.trace is None else self.trace.cpu[i]

    # -- process groups ------------------------------------------------------------------------
    def _add_group(self, name: str, ranks: list[int], desc: str | None = None) -> None:
        if ranks and name not in self.groups:
            self.groups[name] = list(ranks)
        if desc and name not in self.group_desc:
            self.group_desc[name] = desc

    def _read_pg_init(self) -> None:
        merged: dict[str, dict[str, Any]] = {}
        for n in self.w.pg_nodes:
            values = n.inputs.values
            if not values or not isinstance(values[0], str):
                raise InvalidInputError(f"{self.et.path}: node id {n.id} ({PG_INIT_NODE}): inputs.values[0] is not "
                                        "the process-group JSON text")
            try:
                entries = parse_pg_init(values[0])
            except ValueError as exc:
                raise InvalidInputError(f"{self.et.path}: node id {n.id} ({PG_INIT_NODE}): {exc}") from None
            for e in entries:
                name = str(e.get("pg_name", ""))
                ranks, size = e.get("ranks", []), e.get("group_size")
                if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
                    raise InvalidInputError(f"{self.et.path}: node id {n.id}: process group {name!r}: 'ranks' is "
                                            "not a list of ranks")
                if not ranks and isinstance(size, int) and 0 < size <= 1 << 20:
                    ranks = list(range(size))
                merged[name] = e
                self.groups[name] = ranks
                desc = e.get("pg_desc")
                if isinstance(desc, str):
                    self.group_desc[name] = desc
        self.pg_entries = list(merged.values())

    def _pg_init_world(self) -> int | None:
        for name, ranks in self.groups.items():
            if name == "0" or self.group_desc.get(name) == "default_pg":
                return len(ranks) or None
        return None

    def _resolve_pg(self, f: CommFacts) -> None:
        """Give ``f`` a pg_name and its members; map group ranks (root, peer) to global ranks."""
        if f.pg_name is not None:
            if f.pg_ranks:
                self._add_group(f.pg_name, f.pg_ranks, f.pg_desc)
            elif f.pg_desc:
                self._add_group(f.pg_name, [], f.pg_desc)
        elif f.pg_size == 1 and not f.pg_ranks:
            # a group of one (e.g. Megatron's data-parallel group at DP=1): its only member is this
            # rank, and each rank's is a different group, so the name differs per rank
            f.pg_name = str(SINGLETON_PG_BASE + self.rank)
            self._add_group(f.pg_name, [self.rank], f.pg_desc)
        elif f.pg_ranks:
            same = next((k for k, v in self.groups.items() if v == f.pg_ranks), None)
            if same is None and self.world is not None and f.pg_ranks == list(range(self.world)):
                same = "0"
            f.pg_name = same if same is not None else self._new_pg_name()
            self._add_group(f.pg_name, f.pg_ranks, f.pg_desc)
        elif f.pg_size is None or self.world is None or f.pg_size == self.world:
            f.pg_name = "0"
            self.stats["pg_assumed_world"] += 1
            if f.pg_size is not None:
                self._add_group("0", list(range(f.pg_size)))
        else:
            key = f"size {f.pg_size}"
            f.pg_name = self.group_desc.get(key) or self._new_pg_name()
            self.group_desc[key] = f.pg_name
            self.stats["pg_unresolved"] += 1
        members = self.groups.get(f.pg_name)
        for attr, flag in (("peer", "peer_is_global"), ("root", "root_is_global")):
            value = getattr(f, attr)
            if value is not None and not getattr(f, flag) and members and 0 <= value < len(members):
                setattr(f, attr, members[value])

    def _new_pg_name(self) -> str:
        used = {int(k) for k in (*self.groups, *self.group_desc.values()) if k.isdecimal()}
        return str(max(used, default=0) + 1)

    # -- collectives ---------------------------------------------------------------------------
    def _records(self) -> dict[int, dict[str, Any]]:
        """Join collectives.json records, in order, with the ET's ``c10d::`` collectives it can see.

        The log cannot see functional collectives, nor c10d ops issued from inside another
        operator's kernel (below autograd; see :mod:`nbox_record.commlog`): those are left out of
        the join and keep the facts of their own inputs.
        """
        if self.log is None:
            return {}
        ops = [a for a in self.w.anchors if a.node.name.startswith("c10d::") and not a.in_op]
        records = self.log.records
        for i in range(max(len(ops), len(records))):
            if i >= len(ops) or i >= len(records):
                extra = (f"the log's #{i} is {records[i]['op']!r} (seq {records[i]['seq']}), absent from the host ET"
                         if i < len(records) else
                         f"the host ET's #{i} is {ops[i].node.name!r} (node id {ops[i].node.id}), absent from the log")
                raise InvalidInputError(
                    f"{self.log.path}: lists {len(records)} collectives but the host ET {self.et.path} has "
                    f"{len(ops)} c10d collective ops: {extra}")
            rec, op = records[i], ops[i]
            if short_op(rec["op"]) != short_op(op.node.name):
                raise InvalidInputError(
                    f"{self.log.path}: collective #{i} is {rec['op']!r} (seq {rec['seq']}) but the host ET "
                    f"{self.et.path} has {op.node.name!r} (node id {op.node.id}) there: the captures diverge")
        return {op.node.id: rec for op, rec in zip(ops, records, strict=True)}

    def _facts(self, a: Collective, rec: dict[str, Any] | None) -> CommFacts:
        f = facts_from_op_inputs(a.node, a.kind) if a.node.name != RPC_NAME else CommFacts(kind=a.kind)
        rpc = facts_from_rpc(a.rpc, kind_of_collective_name(rpc_collective_name(a.rpc) or "") or a.kind) \
            if a.rpc is not None else None
        if rpc is not None:
            f.overlay(rpc)
            f.op = short_op(a.node.name) if a.node.name != RPC_NAME else rpc.op
        if rec is not None:
            r = facts_from_record(rec)
            if rpc is None:
                f.kind, f.size, f.dtype, f.in_splits, f.out_splits = r.kind, r.size, r.dtype, r.in_splits, r.out_splits
                f.source = r.source
            for name in ("pg_name", "async_op", "issue_us", "wait_us", "done_us", "tag", "peer", "root"):
                if getattr(r, name) is not None:
                    setattr(f, name, getattr(r, name))
            f.peer_is_global = f.peer_is_global or r.peer_is_global
            f.root_is_global = f.root_is_global or r.root_is_global
        self._resolve_pg(f)
        return f

    def _comm_item(self, a: Collective, f: CommFacts) -> OutNode:
        n = a.node
        where = f"{self.et.path}: node id {n.id} ({n.name})"
        if f.kind in P2P_KINDS:
            node_type = pb.COMM_SEND_NODE if f.kind == "SEND" else pb.COMM_RECV_NODE
            if f.peer is None:  # recv_any_source_: the sender is known only at run time
                self.stats["p2p_unknown_peer"] += 1
        else:
            node_type = pb.COMM_COLL_NODE
        name = n.name if n.name != RPC_NAME else f"nccl:{f.op or f.kind.lower()}"
        node = pb.Node(name=name[:_MAX_NAME], type=node_type)
        _set(node, "is_cpu_op", False)
        if node_type == pb.COMM_COLL_NODE:
            _set(node, "comm_type", COLL_TYPES[f.kind])
        if f.size is None:
            self.stats["comm_size_unknown"] += 1
        _set(node, "comm_size", f.size if f.size is not None else 0)
        _set(node, "pg_name", f.pg_name or "0")
        if f.kind in P2P_KINDS:
            peer = f.peer if f.peer is not None else -1
            tag = f.tag if f.tag is not None else 0
            for value, what in ((peer, "peer rank"), (tag, "tag"), (self.rank, "rank")):
                if not in_int32(value):
                    raise InvalidInputError(f"{where}: {what} {value} does not fit comm_src/comm_dst/comm_tag (int32)")
            src, dst = (self.rank, peer) if f.kind == "SEND" else (peer, self.rank)
            _set(node, "comm_src", src)
            _set(node, "comm_dst", dst)
            _set(node, "comm_tag", tag)
        _set(node, "nbox_op", f.op or short_op(n.name))
        _set(node, "nbox_comm_source", f.source)
        if f.dtype:
            _set(node, "nbox_dtype", f.dtype)
        if f.async_op is not None:
            _set(node, "nbox_async", f.async_op)
        if f.root is not None:
            _set(node, "nbox_root", f.root)
        if f.kind == "ALL_TO_ALL":
            if f.in_splits:
                _set(node, "nbox_in_split_sizes", f.in_splits)
            if f.out_splits:
                _set(node, "nbox_out_split_sizes", f.out_splits)
        if f.seq is not None:
            _set(node, "nbox_seq", f.seq)
        if f.pg_desc:
            _set(node, "nbox_pg_desc", f.pg_desc)
        _set(node, "op_schema", n.op_schema)
        for attr in ("tid", "rf_id", "seq_id"):
            _set(node, attr, getattr(n, attr))
        _set(node, "nbox_et_id", n.id)
        if a.iteration is not None:
            _set(node, "nbox_iteration", a.iteration)
        _io(n, node)
        ev = self.ev(n)
        start = ev.ts if ev is not None else f.issue_us
        cpu_dur = ev.dur if ev is not None else None
        if cpu_dur is not None:
            _set(node, "nbox_cpu_duration_micros", max(0, round(cpu_dur)))
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
            _set(node, "nbox_untimed", True)
        return OutNode((n.order, 0, 0.0, 0), node, thread=n.tid, start=start,
                       end=None if start is None or cpu_dur is None else start + cpu_dur, comm=True, pg=f.pg_name,
                       sync=not f.async_op, wait_us=f.wait_us, reads=_storages(n.inputs.values),
                       writes=_storages(n.outputs.values))

    def _worker_span(self, a: Collective, anchor_ev: CpuEvent | None) -> float | None:
        """Duration of the marker that ran on another thread (gloo's worker), if any."""
        for m in a.markers:
            ev = self.ev(m)
            if ev is not None and (anchor_ev is None or ev.thread != anchor_ev.thread):
                return ev.dur
        return None

    def _internal_ops(self) -> set[int]:
        """Top-level ops that ran on a collective's worker thread inside its span (gloo's copies)."""
        if self.trace is None:
            return set()
        spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for a in self.w.anchors:
            anchor_ev = self.ev(a.node)
            for m in a.markers:
                ev = self.ev(m)
                if ev is not None and (anchor_ev is None or ev.thread != anchor_ev.thread):
                    spans.setdefault(ev.thread, []).append((ev.ts, ev.end))
        for found in spans.values():
            found.sort()
        out: set[int] = set()
        for n in self.w.tops:
            ev = self.ev(n)
            if ev is None or ev.thread not in spans:
                continue
            found = spans[ev.thread]
            k = bisect.bisect_right(found, (ev.ts, float("inf"))) - 1
            if k >= 0 and ev.end <= found[k][1]:
                out.add(n.id)
        return out

    # -- GPU -----------------------------------------------------------------------------------
    def _gpu_items(self, items: list[OutNode], item_of_et: dict[int, int]) -> list[OutNode]:
        trace = self.trace
        if trace is None or not trace.gpu:
            return []
        et_of_ev = {ci: nid for nid, ci in self.ev_of.items()}
        launcher = launching_events(trace, set(et_of_ev))
        timed = sorted((it.start, i) for i, it in enumerate(items) if it.start is not None)
        starts = [t for t, _ in timed]
        span_end = max((it.end for it in items if it.end is not None), default=0.0)
        out: list[OutNode] = []
        folded = unlinked = dropped = 0
        for gi, op in enumerate(trace.gpu):
            ci = launcher.get(gi)
            et_id = et_of_ev.get(ci) if ci is not None else None
            owner_et = self.w.owner.get(et_id) if et_id is not None else None
            owner = item_of_et.get(owner_et) if owner_et is not None else None
            if owner is not None and items[owner].node.type != pb.COMP_NODE:  # a collective's kernel
                comm = items[owner]
                if comm.stream is None:  # the comm now sits on its stream and starts with its kernel
                    comm.stream = op.stream
                    comm.node.duration_micros = 0
                    untimed = [x for x in comm.node.attr if x.name == "nbox_untimed"]
                    for x in untimed:
                        comm.node.attr.remove(x)
                    if comm.node.start_time_micros:
                        _set(comm.node, "nbox_cpu_start_micros", comm.node.start_time_micros)
                    comm.node.start_time_micros = max(0, round(op.ts))
                    _set(comm.node, "nbox_stream", op.stream)
                comm.node.duration_micros += max(0, round(op.dur))
                folded += 1
                continue
            if owner is not None and et_id is not None:
                key: Key = (self.et.nodes[et_id].order, 1, op.ts, gi)
            else:  # no known launcher: inside the host ET's time span, keep it in stream order by start time
                launch = trace.launches.get(op.correlation) if op.correlation is not None else None
                at = launch.ts if launch is not None else op.ts
                k = bisect.bisect_right(starts, at) - 1
                if k < 0 or at > span_end:
                    dropped += 1
                    continue
                key = (items[timed[k][1]].key[0], 1, op.ts, gi)
                unlinked += 1
            node = pb.Node(name=op.name[:_MAX_NAME] or op.cat, type=pb.COMP_NODE)
            _set(node, "is_cpu_op", False)
            _set(node, "nbox_stream", op.stream)
            _set(node, "nbox_gpu_kind", op.cat)
            if owner is not None:
                it_attr = next((x for x in items[owner].node.attr if x.name == "nbox_iteration"), None)
                if it_attr is not None:
                    node.attr.append(it_attr)
            node.start_time_micros = max(0, round(op.ts))
            node.duration_micros = max(0, round(op.dur))
            out.append(OutNode(key, node, stream=op.stream, start=op.ts, end=op.ts + op.dur, owner=owner))
        syncs = enclosing_events(trace, [(c.thread, c.ts) for c in trace.syncs], set(et_of_ev))
        for ci in syncs:
            holder = self.w.owner.get(et_of_ev[ci]) if ci is not None else None
            idx = item_of_et.get(holder) if holder is not None else None
            if idx is not None:
                items[idx].gpu_sync = True
        self.stats["gpu_ops_folded_into_comm"] = folded
        self.stats["gpu_unlinked"] = unlinked
        self.stats["gpu_dropped"] = dropped
        return out

    # -- assembly ------------------------------------------------------------------------------
    def run(self) -> RankConversion:
        w = self.w
        link_loose_markers(self.w)
        internal = self._internal_ops()
        records = self._records()
        items: list[OutNode] = []
        item_of_et: dict[int, int] = {}
        matched = 0
        for n in w.tops:
            if n.id in internal:
                continue
            ev = self.ev(n)
            matched += ev is not None
            item_of_et[n.id] = len(items)
            items.append(_comp_item(n, ev, w, self.et))
        sources: dict[str, int] = {}
        for a in w.anchors:
            f = self._facts(a, records.get(a.node.id))
            sources[f.source] = sources.get(f.source, 0) + 1
            matched += self.ev(a.node) is not None
            item_of_et[a.node.id] = len(items)
            items.append(self._comm_item(a, f))
        n_cpu = len(items)
        items += self._gpu_items(items, item_of_et)
        order = sorted(range(len(items)), key=lambda i: items[i].key)
        meta = self._metadata_node()
        first_id = 0 if meta is None else 1
        new_index = {old: pos for pos, old in enumerate(order)}
        items = [items[i] for i in order]
        for it in items:
            if it.owner is not None:
                it.owner = new_index[it.owner]
        self.stats.update(link(items))
        nodes: list[pb.Node] = [] if meta is None else [meta]
        dropped_deps = 0
        for pos, it in enumerate(items):
            it.node.id = first_id + pos
            deps = sorted({d for d in it.deps if d < pos})
            dropped_deps += len(set(it.deps)) - len(deps)
            it.node.data_deps.extend(first_id + d for d in deps)
            nodes.append(it.node)
        s = self.stats
        s.update(top_level_ops=sum(1 for it in items if it.node.type == pb.COMP_NODE and it.thread is not None),
                 comm_nodes=len(w.anchors), gpu_nodes=len(items) - n_cpu,
                 metadata_nodes=first_id, kineto_matched=matched, kineto_unmatched=n_cpu - matched,
                 dropped_markers=len(w.loose_markers), dropped_collective_internal=len(internal),
                 deps_dropped=dropped_deps, total_nodes=len(nodes))
        s["dropped"] = s["dropped_markers"] + s["dropped_collective_internal"] + s["unreachable_nodes"]
        for src in ("record_param_comms", "collectives.json", "host_et_inputs"):
            s["comm_source_" + src.replace(".", "_")] = sources.get(src, 0)
        summary = "+".join(k for k in ("record_param_comms", "collectives.json", "host_et_inputs") if sources.get(k)) \
            or "none"
        groups = {k: v for k, v in sorted(self.groups.items()) if v}
        return RankConversion(self.rank, self._metadata(summary), nodes, groups, s)

    def _metadata_node(self) -> pb.Node | None:
        entries = list(self.pg_entries)
        known = {str(e.get("pg_name", "")) for e in entries}
        for name, ranks in self.groups.items():
            if name not in known:
                entries.append({"pg_name": name, "pg_desc": self.group_desc.get(name, ""), "backend_config": "",
                                "ranks": ranks, "group_size": len(ranks), "group_count": len(self.groups)})
        if not entries:
            return None
        node = pb.Node(name=PG_INIT_NODE, type=pb.METADATA_NODE)
        node.inputs.CopyFrom(pb.IOInfo(values=_dumps(entries), shapes="[[]]", types='["String"]'))
        return node

    def _metadata(self, comm_source: str) -> pb.GlobalMetadata:
        meta = pb.GlobalMetadata(version=METADATA_VERSION)
        attrs: list[tuple[str, AttrValue]] = [
            ("schema", self.et.schema), ("nbox_producer", f"nbox {__version__} convert"), ("nbox_rank", self.rank),
            ("nbox_comm_source", comm_source), ("nbox_kineto_join", self.join_method),
        ]
        if self.world is not None:
            attrs.append(("nbox_world_size", self.world))
        meta.attr.extend(make_attr(k, v) for k, v in attrs)
        return meta


def convert_rank(host_et: Path, kineto: Path | None, *, rank: int, collectives: Path | None = None,
                 world_size: int | None = None, max_input_bytes: int = DEFAULT_MAX_JSON_BYTES) -> RankConversion:
    """Convert one rank's host ET (+ Kineto, + nbox's ``collectives.json``) to Chakra nodes.

    Args:
        host_et: ``ExecutionTraceObserver`` JSON (plain or gzip, sniffed by content).
        kineto: the Kineto trace of the same profiler session, or None (then no durations).
        rank: this rank's global rank.
        collectives: nbox's collective log (needed for gloo, which records no ``record_param_comms``).
        world_size: the job's world size if known (else taken from the inputs).
        max_input_bytes: cap on the (inflated) size of each input file.

    Raises:
        InputNotFoundError: an input file is missing.
        InvalidInputError: an input is malformed or over the cap, belongs to another rank, or the
            collective log and the host ET disagree; the message names the file and node id or key.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 1 << 31:
        raise InvalidInputError(f"rank {rank!r} is not a valid rank")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                   or world_size <= rank):
        raise InvalidInputError(f"world size {world_size!r} does not hold rank {rank}")
    et = read_host_et(host_et, max_bytes=max_input_bytes)
    trace = read_kineto(kineto, max_bytes=max_input_bytes) if kineto is not None else None
    if trace is not None and trace.rank is not None and trace.rank != rank:
        raise InvalidInputError(f"{kineto}: Kineto trace of rank {trace.rank} (its distributedInfo), "
                                f"converting rank {rank}")
    log = load_collective_log(collectives, rank=rank, max_bytes=max_input_bytes) if collectives is not None else None
    return _Converter(et, trace, log, rank, world_size).run()
