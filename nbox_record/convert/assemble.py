"""Convert one rank's raw capture (host ET JSON + Kineto + optional ``collectives.json``) to Chakra ET nodes.

:func:`convert_rank` is the entry point; node ids are 0.. in recorded order, and what comes out is:

* first, a ``METADATA_NODE`` ``## process_group:init ##`` whose ``inputs.values`` is the JSON list of process groups
  (:mod:`nbox_record.convert.groups`: the ET's own, merged with those learnt from the collectives; a collective whose
  group the trace does not name goes on the world, or on this rank alone for a group of one);
* one ``COMP_NODE`` per top-level operator of the host ET (:mod:`nbox_record.convert.toplevel`): ``is_cpu_op`` true,
  ``op_schema``, inputs/outputs as JSON text in the IOInfo strings (strides in ``nbox_input_strides`` /
  ``nbox_output_strides``), ``tid``, ``rf_id``, ``seq_id``, ``fw_parent``, ``fw_tid``, ``scope``, ``nbox_et_id``,
  ``nbox_iteration``, ``nbox_annotation``, and start/duration from Kineto (:mod:`nbox_record.sources.kineto`;
  unknown to Kineto: duration 0 and ``nbox_untimed``). One without an ``aten`` schema lists the outermost ``aten``
  operators under it, in execution order, in ``nbox_children`` (JSON: ``{name, op_schema, et_id, inputs, outputs[,
  input_strides]}``, :func:`nbox_record.convert.attrs.write_io`'s formats), or sets ``nbox_children_truncated`` past
  :data:`~nbox_record.convert.comp.MAX_CHILDREN` operators or :data:`~nbox_record.convert.comp.MAX_CHILDREN_BYTES`;
* one ``COMM_COLL_NODE`` / ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` per collective, in place of its ``c10d::<op>``
  operator (hoisted out of, and after, an operator that issued it inside): ``is_cpu_op`` false, ``comm_type`` and
  ``comm_size`` (int64; bytes, per-rank input: :mod:`nbox_record.sources.comms`), ``pg_name``, ``comm_src`` /
  ``comm_dst`` / ``comm_tag`` (int32, p2p), and ``nbox_op``, ``nbox_comm_source``, ``nbox_dtype``, ``nbox_async``,
  ``nbox_root``, ``nbox_in_split_sizes`` / ``nbox_out_split_sizes``, ``nbox_seq``, ``nbox_pg_desc``, ``nbox_stream``,
  ``nbox_cpu_duration_micros``. Its duration: the NCCL kernel(s) it launched (the node then sits on that stream),
  else gloo's worker-thread span (``gloo:<op>``), else done - issue from ``collectives.json``, else the CPU call;
* GPU work from Kineto (kernels, memcpy, memset) as ``COMP_NODE`` with ``is_cpu_op`` false, ``nbox_stream`` and
  ``nbox_gpu_kind``; GPU ops launched outside the host ET's span are dropped.

Dependencies (:mod:`nbox_record.convert.deps`) are in ``data_deps`` and point to earlier nodes only: the graph is
acyclic by construction. Dropped and counted in ``stats``: top-level ``gloo:`` / ``nccl:`` markers, a gloo worker
thread's work inside a collective, nodes unreachable from the roots. The parts live in
:mod:`~nbox_record.convert.inputs`, :mod:`~nbox_record.convert.comp`, :mod:`~nbox_record.convert.comm`,
:mod:`~nbox_record.convert.gpu` and :mod:`~nbox_record.convert.meta`; this module assembles them. The inputs are
untrusted: size-capped, parsed without recursion, never evaluated; every error is an
:class:`~nbox_trace.errors.InvalidInputError` naming the file. Times are microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nbox_record.convert.attrs import GAP_ATTR, GAP_JOINED_ATTR, set_attr
from nbox_record.convert.comm import CommNodes
from nbox_record.convert.comp import comp_item
from nbox_record.convert.deps import OutNode, link
from nbox_record.convert.device import DeviceFacts, device_facts
from nbox_record.convert.gpu import gpu_items
from nbox_record.convert.groups import ProcessGroups
from nbox_record.convert.inputs import RankInputs
from nbox_record.convert.meta import global_metadata, pg_init_node
from nbox_record.convert.toplevel import link_loose_markers
from nbox_record.sources import load_collective_log, read_host_et, read_kineto
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import InvalidInputError
from nbox_trace.jsonio import DEFAULT_MAX_JSON_BYTES

#: The sources of collective facts, in the order the ``nbox_comm_source`` summary names them.
COMM_SOURCES = ("record_param_comms", "collectives.json", "host_et_inputs")


@dataclass(frozen=True)
class RankConversion:
    """One rank converted: ``nodes`` have unique increasing ids and are ready for ``EtWriter``."""

    rank: int
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]
    process_groups: dict[str, list[int]]  # pg_name -> global ranks (for comm_group.json)
    stats: dict[str, int]
    device: DeviceFacts = field(default_factory=DeviceFacts)  # what the traces say about the rank's device


def _process_groups(inputs: RankInputs, world_size: int | None, stats: dict[str, int]) -> ProcessGroups:
    """The ET's own groups and the log's, and the world size: given, else the log's, Kineto's or the ET's."""
    pgs = ProcessGroups(inputs.rank, stats)
    pgs.read_pg_init(inputs.et.path, inputs.w.pg_nodes)
    log, trace = inputs.log, inputs.trace
    if log is not None:
        for name, (desc, ranks) in log.groups.items():
            pgs.add(name, ranks, desc)
    pgs.world = world_size or (log.world_size if log else None) or (trace.world_size if trace else None) \
        or pgs.pg_init_world()
    return pgs


def _assemble(inputs: RankInputs, world_size: int | None) -> RankConversion:
    """Host operators, comm nodes and GPU ops in recorded order, linked, numbered, with their metadata."""
    et, w = inputs.et, inputs.w
    stats: dict[str, int] = dict.fromkeys(
        ("host_nodes", "pg_assumed_world", "pg_unresolved", "comm_size_unknown", "p2p_unknown_peer",
         "gpu_ops_folded_into_comm", "gpu_unlinked", "gpu_dropped"), 0)
    stats["host_nodes"] = len(et.nodes)
    stats["unreachable_nodes"] = len(et.nodes) - w.visited
    stats["nesting_repaired"] = inputs.nesting_repaired
    pgs = _process_groups(inputs, world_size, stats)
    comms = CommNodes(inputs, pgs, stats)
    link_loose_markers(w)
    internal = comms.internal_ops()
    records = comms.records()
    items: list[OutNode] = []
    item_of_et: dict[int, int] = {}
    matched = lean_timed = 0
    for n in w.tops:
        if n.id in internal:
            continue
        ev = inputs.ev(n)
        matched += ev is not None
        item_of_et[n.id] = len(items)
        lean = inputs.lean_of(n)
        lean_timed += lean is not None
        items.append(comp_item(n, ev, w, et, lean))
    sources: dict[str, int] = {}
    for a in w.anchors:
        f = comms.facts(a, records.get(a.node.id))
        sources[f.source] = sources.get(f.source, 0) + 1
        matched += inputs.ev(a.node) is not None
        item_of_et[a.node.id] = len(items)
        comm = comms.item(a, f)
        lean = inputs.lean_of(a.node)
        if lean is not None:
            set_attr(comm.node, GAP_ATTR, max(0, round(lean.gap_us)))
            if lean.joined:
                set_attr(comm.node, GAP_JOINED_ATTR, True)
        items.append(comm)
    n_cpu = len(items)
    items += gpu_items(inputs, items, item_of_et, stats)
    order = sorted(range(len(items)), key=lambda i: items[i].key)
    meta = pg_init_node(pgs)
    first_id = 0 if meta is None else 1
    new_index = {old: pos for pos, old in enumerate(order)}
    items = [items[i] for i in order]
    for it in items:
        if it.owner is not None:
            it.owner = new_index[it.owner]
    stats.update(link(items))
    nodes: list[pb.Node] = [] if meta is None else [meta]
    dropped_deps = 0
    for pos, it in enumerate(items):
        it.node.id = first_id + pos
        deps = sorted({d for d in it.deps if d < pos})
        dropped_deps += len(set(it.deps)) - len(deps)
        it.node.data_deps.extend(first_id + d for d in deps)
        nodes.append(it.node)
    s = stats
    s.update(top_level_ops=sum(1 for it in items if it.node.type == pb.COMP_NODE and it.thread is not None),
             comm_nodes=len(w.anchors), gpu_nodes=len(items) - n_cpu,
             metadata_nodes=first_id, kineto_matched=matched, kineto_unmatched=n_cpu - matched,
             lean_timed=lean_timed, lean_iterations=inputs.lean_iterations,
             dropped_markers=len(w.loose_markers), dropped_collective_internal=len(internal),
             deps_dropped=dropped_deps, total_nodes=len(nodes))
    s["dropped"] = s["dropped_markers"] + s["dropped_collective_internal"] + s["unreachable_nodes"]
    for src in COMM_SOURCES:
        s["comm_source_" + src.replace(".", "_")] = sources.get(src, 0)
    summary = "+".join(k for k in COMM_SOURCES if sources.get(k)) or "none"
    groups = {k: v for k, v in sorted(pgs.groups.items()) if v}
    metadata = global_metadata(et.schema, inputs.rank, summary, inputs.join_method, pgs.world)
    return RankConversion(inputs.rank, metadata, nodes, groups, s, device_facts(et, inputs.trace))


def convert_rank(host_et: Path, kineto: Path | None, *, rank: int, collectives: Path | None = None,
                 world_size: int | None = None, max_input_bytes: int = DEFAULT_MAX_JSON_BYTES,
                 lean_kineto: Path | None = None) -> RankConversion:
    """Convert one rank's host ET (+ Kineto, + nbox's ``collectives.json``) to Chakra nodes.

    Args:
        host_et: ``ExecutionTraceObserver`` JSON (plain or gzip, sniffed by content).
        kineto: the Kineto trace of the same profiler session, or None (then no durations).
        rank: this rank's global rank.
        collectives: nbox's collective log (needed for gloo, which records no ``record_param_comms``).
        world_size: the job's world size if known (else taken from the inputs).
        max_input_bytes: cap on the (inflated) size of each input file.
        lean_kineto: the lean pass's Kineto trace (:mod:`nbox_record.sources.leantiming`): the captured top-level
            operators found in it take its median durations (the recorded ones kept as
            ``nbox_profiled_duration_micros``) and carry the gap before them (``nbox_gap_micros``).

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
    lean = read_kineto(lean_kineto, max_bytes=max_input_bytes) if lean_kineto is not None and trace is not None \
        else None
    return _assemble(RankInputs.join(et, trace, log, rank, lean), world_size)
