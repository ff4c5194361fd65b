"""The ``COMP_NODE`` of one top-level host operator, with ``nbox_children`` for live replay.

An operator without an ``aten`` schema lists the outermost ``aten`` operators under it (never those of a
collective hoisted out of it) in ``nbox_children``, unless they are over :data:`MAX_CHILDREN` operators or
:data:`MAX_CHILDREN_BYTES` of text: then ``nbox_children_truncated`` is true instead. So does an ``aten``
operator called on a tensor subclass that dispatches in Python (a child named :data:`SUBCLASS_NODE`): FSDP2's
parameters are DTensors, and the optimizer's ``aten::lerp_``, ``aten::sqrt``, ... are recorded with the
parameter's global shape, while what ran is the same operator on the rank's local shard under that child. Run
as recorded, a live replay computed the whole parameter's step on every rank, the world size times its share.
"""

from __future__ import annotations

from typing import Any

from nbox_record.convert.attrs import (
    GAP_ATTR,
    GAP_JOINED_ATTR,
    MAX_NAME,
    PROFILED_ATTR,
    dumps,
    set_attr,
    storages,
    write_io,
    write_times,
)
from nbox_record.convert.deps import OutNode
from nbox_record.convert.toplevel import Walk, op_namespace, runnable_descendants
from nbox_record.sources import CpuEvent, EtNode, HostEt, LeanTime
from nbox_trace.chakra import et_def_pb2 as pb

#: The execution trace's node for a tensor subclass's ``__torch_dispatch__`` (DTensor, ...), under the operator.
SUBCLASS_NODE = "PythonSubclass"
#: Caps of ``nbox_children`` (per node): operators listed, and bytes of its JSON text.
MAX_CHILDREN = 512
MAX_CHILDREN_BYTES = 256 * 1024


def _child(c: EtNode) -> dict[str, Any]:
    """One entry of ``nbox_children``: the IOInfo lists of :func:`write_io` (parsed, not JSON text)."""
    entry: dict[str, Any] = {
        "name": c.name[:MAX_NAME], "op_schema": c.op_schema, "et_id": c.id,
        "inputs": {"values": c.inputs.values, "shapes": c.inputs.shapes, "types": c.inputs.types},
        "outputs": {"values": c.outputs.values, "shapes": c.outputs.shapes, "types": c.outputs.types}}
    if c.inputs.strides is not None:
        entry["input_strides"] = c.inputs.strides
    return entry


def _children(n: EtNode, et: HostEt, w: Walk, node: pb.Node) -> None:
    """``nbox_children`` of a top-level operator live replay cannot run as recorded (no aten schema, or an aten
    operator on a tensor subclass: module docstring)."""
    if op_namespace(n.op_schema) == "aten" and all(et.nodes[c].name != SUBCLASS_NODE for c in et.children(n.id)):
        return
    found = runnable_descendants(et, w, n)
    if not found:
        return
    text = dumps([_child(c) for c in found[:MAX_CHILDREN]]) if len(found) <= MAX_CHILDREN else ""
    if not text or len(text.encode()) > MAX_CHILDREN_BYTES:
        set_attr(node, "nbox_children_truncated", True)
        return
    set_attr(node, "nbox_children", text)


def comp_item(n: EtNode, ev: CpuEvent | None, w: Walk, et: HostEt, lean: LeanTime | None = None) -> OutNode:
    """The top-level operator ``n`` (Kineto event ``ev``, if matched) as a CPU ``COMP_NODE``; with its lean
    figures (:mod:`nbox_record.sources.leantiming`) their duration (the recorded one kept as
    ``nbox_profiled_duration_micros``) and the gap before it (``nbox_gap_micros``)."""
    node = pb.Node(name=n.name[:MAX_NAME], type=pb.COMP_NODE)
    set_attr(node, "is_cpu_op", True)
    set_attr(node, "op_schema", n.op_schema)
    for attr in ("tid", "rf_id", "seq_id", "fw_parent", "fw_tid", "scope"):
        set_attr(node, attr, getattr(n, attr))
    set_attr(node, "nbox_et_id", n.id)
    if n.id in w.iteration:
        set_attr(node, "nbox_iteration", w.iteration[n.id])
    if n.id in w.annotation:
        set_attr(node, "nbox_annotation", w.annotation[n.id])
    write_io(n, node)
    _children(n, et, w, node)
    write_times(node, ev)
    if ev is not None and lean is not None:
        set_attr(node, PROFILED_ATTR, node.duration_micros)
        node.duration_micros = max(0, round(lean.duration_us))
        set_attr(node, GAP_ATTR, max(0, round(lean.gap_us)))
        if lean.joined:
            set_attr(node, GAP_JOINED_ATTR, True)
    return OutNode((n.order, 0, 0.0, 0), node, thread=n.tid, start=None if ev is None else ev.ts,
                   end=None if ev is None else ev.end, reads=storages(n.inputs.values),
                   writes=storages(n.outputs.values))
