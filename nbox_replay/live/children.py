"""Composite live operators: a recorded node that is not an operator itself but lists the ones it ran.

The backward pass is recorded as ``autograd::engine::evaluate_function: XBackward0`` nodes (and DDP's
``copy_bucket_to_grad``, FSDP's ``fsdp::`` ops, ...) that have no ``aten`` schema to run. The converter
(:mod:`nbox_record.convert`) lists the outermost ``aten`` operators under such a node, in execution
order, in its attribute ``nbox_children`` (JSON text): a list of ``{name, op_schema, inputs: {values,
shapes, types}, outputs: {values, shapes, types}[, input_strides]}``, the node's own IOInfo formats
parsed. :func:`child_nodes` turns each entry back into a compute node, built by
:func:`nbox_replay.live.ops.build_runnable` like any other; :class:`nbox_replay.live.ops.CompositeRunnable` runs them in
order on the rank's one tensor pool, so tensor ids chain across the children and the nodes around them.
"""

from __future__ import annotations

import json
from typing import Any

from nbox_trace.chakra import attr_map, make_attr
from nbox_trace.chakra import et_def_pb2 as pb

__all__ = ["CHILDREN_ATTR", "TRUNCATED_ATTR", "BuildError", "child_nodes"]

CHILDREN_ATTR = "nbox_children"
TRUNCATED_ATTR = "nbox_children_truncated"
#: Read caps (the converter writes at most 512 children and 256 KiB; a hand-made file may not).
MAX_CHILDREN = 4096
MAX_CHILDREN_BYTES = 4 << 20


class BuildError(ValueError):
    """A node cannot be turned into a runnable operator (the message says why)."""


def _io_text(entry: dict[str, Any], side: str, k: int) -> pb.IOInfo:
    io = entry.get(side, {})
    if not isinstance(io, dict):
        raise BuildError(f"{CHILDREN_ATTR}[{k}].{side} is not an object")
    out = pb.IOInfo()
    for key in ("values", "shapes", "types"):
        value = io.get(key, [])
        if not isinstance(value, list):
            raise BuildError(f"{CHILDREN_ATTR}[{k}].{side}.{key} is not a list")
        setattr(out, key, json.dumps(value, separators=(",", ":")))
    return out


def child_nodes(node: pb.Node) -> list[pb.Node] | None:
    """The compute nodes listed in ``node``'s ``nbox_children`` (None when it has none); BuildError if malformed.

    Each child gets the parent's id, the child's name, ``op_schema``, inputs, outputs and (when recorded)
    ``nbox_input_strides``: what :func:`nbox_replay.live.ops.build_runnable` reads.
    """
    attr = attr_map(node.attr).get(CHILDREN_ATTR)
    if attr is None:
        return None
    text = str(attr.value)
    if len(text) > MAX_CHILDREN_BYTES:
        raise BuildError(f"{CHILDREN_ATTR} is over {MAX_CHILDREN_BYTES} bytes")
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError):
        raise BuildError(f"{CHILDREN_ATTR} is not JSON: {text[:60]!r}") from None
    if not isinstance(entries, list) or not entries:
        raise BuildError(f"{CHILDREN_ATTR} is not a non-empty JSON list")
    if len(entries) > MAX_CHILDREN:
        raise BuildError(f"{CHILDREN_ATTR} lists {len(entries)} operators, over {MAX_CHILDREN}")
    out: list[pb.Node] = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise BuildError(f"{CHILDREN_ATTR}[{k}] is not an object")
        name, schema = entry.get("name", ""), entry.get("op_schema", "")
        if not isinstance(name, str) or not isinstance(schema, str):
            raise BuildError(f"{CHILDREN_ATTR}[{k}]: name and op_schema must be strings")
        child = pb.Node(id=node.id, name=name, type=pb.COMP_NODE)
        child.inputs.CopyFrom(_io_text(entry, "inputs", k))
        child.outputs.CopyFrom(_io_text(entry, "outputs", k))
        child.attr.append(make_attr("op_schema", schema))
        strides = entry.get("input_strides")
        if strides is not None:
            if not isinstance(strides, list):
                raise BuildError(f"{CHILDREN_ATTR}[{k}].input_strides is not a list")
            child.attr.append(make_attr("nbox_input_strides", json.dumps(strides, separators=(",", ":"))))
        out.append(child)
    return out
