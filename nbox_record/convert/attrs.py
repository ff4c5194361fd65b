"""How every converted node is written: attributes, IOInfo JSON text, names, times and storages."""

from __future__ import annotations

import json
from typing import Any

from nbox_record.sources import CpuEvent, EtNode, iter_tensors
from nbox_trace.chakra import AttrValue, make_attr
from nbox_trace.chakra import et_def_pb2 as pb

#: Longest node name written (characters); longer ones are cut.
MAX_NAME = 2048


def dumps(value: Any) -> str:
    """Compact JSON text (the IOInfo strings and JSON-valued attributes)."""
    return json.dumps(value, separators=(",", ":"))


def set_attr(node: pb.Node, name: str, value: AttrValue) -> None:
    """Append one attribute to ``node``."""
    node.attr.append(make_attr(name, value))


def storages(value: Any) -> list[int]:
    """The tensor storage ids (> 0) in an IOInfo values list, sorted."""
    return sorted({t[1] for t in iter_tensors(value) if t[1] > 0})


def write_io(n: EtNode, node: pb.Node) -> None:
    """The ET node's inputs and outputs as JSON text in ``node``'s IOInfo (+ strides as attributes)."""
    node.inputs.CopyFrom(pb.IOInfo(values=dumps(n.inputs.values), shapes=dumps(n.inputs.shapes),
                                   types=dumps(n.inputs.types)))
    node.outputs.CopyFrom(pb.IOInfo(values=dumps(n.outputs.values), shapes=dumps(n.outputs.shapes),
                                    types=dumps(n.outputs.types)))
    if n.inputs.strides is not None:
        set_attr(node, "nbox_input_strides", dumps(n.inputs.strides))
    if n.outputs.strides is not None:
        set_attr(node, "nbox_output_strides", dumps(n.outputs.strides))


#: A lean-timed node's duration as the profiled capture recorded it (us); its ``duration_micros`` is the lean
#: pass's (:mod:`nbox_record.sources.leantiming`).
PROFILED_ATTR = "nbox_profiled_duration_micros"
#: The framework's time on the node's thread before it, from the previous top-level operator (lean pass, us).
GAP_ATTR = "nbox_gap_micros"
#: True where that gap was measured on a timeline joined with another thread's (a CUDA backward on the autograd
#: engine's device thread, sources/leantiming.py): the replay starts it after that thread's work it waited for.
GAP_JOINED_ATTR = "nbox_gap_joined"


def write_times(node: pb.Node, ev: CpuEvent | None) -> None:
    """Start and duration (microseconds, rounded) from the Kineto event; ``nbox_untimed`` without one."""
    if ev is None:
        set_attr(node, "nbox_untimed", True)
        return
    node.start_time_micros = max(0, round(ev.ts))
    node.duration_micros = max(0, round(ev.dur))
