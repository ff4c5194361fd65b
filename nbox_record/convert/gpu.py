"""GPU work from Kineto (kernels, memcpy, memset) in one rank's conversion.

A GPU op launched by a collective is folded into its comm node: the node then sits on that stream, starts
with its first kernel and lasts as long as its kernels together (the CPU start is kept as
``nbox_cpu_start_micros``). Every other GPU op becomes a ``COMP_NODE`` with ``is_cpu_op`` false,
``nbox_stream`` and ``nbox_gpu_kind``, placed after the host operator that launched it; one with no
known launcher is placed by its launch time (``stats["gpu_unlinked"]``), and dropped when that lies
outside the host ET's span (``stats["gpu_dropped"]``). A host operator that synchronized with the device
is flagged ``gpu_sync``.
"""

from __future__ import annotations

import bisect

from nbox_record.convert.attrs import MAX_NAME, set_attr
from nbox_record.convert.deps import Key, OutNode
from nbox_record.convert.inputs import RankInputs
from nbox_record.sources import GpuOp, enclosing_events, launching_events
from nbox_trace.chakra import et_def_pb2 as pb


def _fold_into_comm(comm: OutNode, op: GpuOp) -> None:
    """A collective's kernel: the comm node moves onto its stream (first kernel) and adds its duration."""
    if comm.stream is None:  # the comm now sits on its stream and starts with its kernel
        comm.stream = op.stream
        comm.node.duration_micros = 0
        untimed = [x for x in comm.node.attr if x.name == "nbox_untimed"]
        for x in untimed:
            comm.node.attr.remove(x)
        if comm.node.start_time_micros:
            set_attr(comm.node, "nbox_cpu_start_micros", comm.node.start_time_micros)
        comm.node.start_time_micros = max(0, round(op.ts))
        set_attr(comm.node, "nbox_stream", op.stream)
    comm.node.duration_micros += max(0, round(op.dur))


def gpu_items(inputs: RankInputs, items: list[OutNode], item_of_et: dict[int, int],
              stats: dict[str, int]) -> list[OutNode]:
    """The GPU nodes to add to the host ``items`` (``item_of_et``: ET id -> index in ``items``); folds
    collectives' kernels into their comm nodes in place; counts the gpu_* stats."""
    trace, w = inputs.trace, inputs.w
    if trace is None or not trace.gpu:
        return []
    et_of_ev = {ci: nid for nid, ci in inputs.ev_of.items()}
    launcher = launching_events(trace, set(et_of_ev))
    timed = sorted((it.start, i) for i, it in enumerate(items) if it.start is not None)
    starts = [t for t, _ in timed]
    span_end = max((it.end for it in items if it.end is not None), default=0.0)
    out: list[OutNode] = []
    folded = unlinked = dropped = 0
    for gi, op in enumerate(trace.gpu):
        ci = launcher.get(gi)
        et_id = et_of_ev.get(ci) if ci is not None else None
        owner_et = w.owner.get(et_id) if et_id is not None else None
        owner = item_of_et.get(owner_et) if owner_et is not None else None
        if owner is not None and items[owner].node.type != pb.COMP_NODE:  # a collective's kernel
            _fold_into_comm(items[owner], op)
            folded += 1
            continue
        if owner is not None and et_id is not None:
            key: Key = (inputs.et.nodes[et_id].order, 1, op.ts, gi)
        else:  # no known launcher: inside the host ET's time span, keep it in stream order by start time
            launch = trace.launches.get(op.correlation) if op.correlation is not None else None
            at = launch.ts if launch is not None else op.ts
            k = bisect.bisect_right(starts, at) - 1
            if k < 0 or at > span_end:
                dropped += 1
                continue
            key = (items[timed[k][1]].key[0], 1, op.ts, gi)
            unlinked += 1
        node = pb.Node(name=op.name[:MAX_NAME] or op.cat, type=pb.COMP_NODE)
        set_attr(node, "is_cpu_op", False)
        set_attr(node, "nbox_stream", op.stream)
        set_attr(node, "nbox_gpu_kind", op.cat)
        if owner is not None:
            it_attr = next((x for x in items[owner].node.attr if x.name == "nbox_iteration"), None)
            if it_attr is not None:
                node.attr.append(it_attr)
        node.start_time_micros = max(0, round(op.ts))
        node.duration_micros = max(0, round(op.dur))
        out.append(OutNode(key, node, stream=op.stream, start=op.ts, end=op.ts + op.dur, owner=owner))
    syncs = enclosing_events(trace, [(c.thread, c.ts) for c in trace.syncs], set(et_of_ev))
    for ci in syncs:
        holder = w.owner.get(et_of_ev[ci]) if ci is not None else None
        idx = item_of_et.get(holder) if holder is not None else None
        if idx is not None:
            items[idx].gpu_sync = True
    stats["gpu_ops_folded_into_comm"] = folded
    stats["gpu_unlinked"] = unlinked
    stats["gpu_dropped"] = dropped
    return out
