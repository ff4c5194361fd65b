"""An ``aten`` operator called on a tensor subclass (FSDP2's DTensor parameters in the optimizer step) is recorded at
the parameter's global shape, and what ran is the same operator on the rank's local shard, under the execution
trace's ``PythonSubclass`` node. The converter lists that local operator in ``nbox_children`` (nbox_record/
convertcomp.py) and live replay runs it, not the global one (nbox_replay/live/ops.py): run as recorded, every rank
computed the whole parameter's step. Unit tests on a hand-built host ET; nothing is timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from nbox_record.convert.assemble import convert_rank
from nbox_replay.inputs.graph import load_rank
from nbox_replay.live.ops import CompositeRunnable, Runnable, prepare
from nbox_trace.chakra.attrs import attr_map
from nbox_trace.chakra.codec import write_et

F = "Tensor(float)"
LERP_ = "aten::lerp_.Scalar(Tensor(a!) self, Tensor end, Scalar weight) -> Tensor(a!)"
SQRT = "aten::sqrt(Tensor self) -> Tensor"
GLOBAL, LOCAL = [8, 6], [4, 6]  # a parameter sharded over two ranks: the rank holds half its rows


def tv(tid: int, shape: list[int]) -> list[Any]:
    return [tid, tid + 1000, 0, shape[0] * shape[1], 4, "cpu"]


def host_node(nid: int, name: str, parent: int, rf: int, schema: str = "", ins: list[Any] | None = None,
              shape: list[int] | None = None, outs: list[Any] | None = None) -> dict[str, Any]:
    """A host ET node on thread 1 whose tensors all have ``shape`` (scalars: none)."""
    ins, outs = ins or [], outs or []
    shapes = [shape if isinstance(v, list) else [] for v in ins]
    return {"id": nid, "name": name, "ctrl_deps": parent,
            "inputs": {"values": ins, "shapes": shapes, "types": [F if isinstance(v, list) else "Double" for v in ins],
                       "strides": [[shape[1], 1] if isinstance(v, list) and shape else [] for v in ins]},
            "outputs": {"values": outs, "shapes": [shape] * len(outs), "types": [F] * len(outs),
                        "strides": [[shape[1], 1] if shape else []] * len(outs)},
            "attrs": [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "tid", "type": "uint64", "value": 1},
                      {"name": "scope", "type": "uint64", "value": 0},
                      {"name": "op_schema", "type": "string", "value": schema}]}


def _convert(tmp_path: Path, nodes: list[dict[str, Any]]) -> Any:
    bookkeeping = [host_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0),
                   host_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0)]
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": bookkeeping + nodes}))
    return convert_rank(host, None, rank=0, world_size=2)


def test_an_aten_operator_on_a_tensor_subclass_runs_its_local_operator(tmp_path: Path) -> None:
    conv = _convert(tmp_path, [
        # DTensor: the global op, its Python dispatch, the local op on the shard
        host_node(10, "aten::lerp_", 2, 1, LERP_, [tv(1, GLOBAL), tv(2, GLOBAL), 0.1], GLOBAL, [tv(1, GLOBAL)]),
        host_node(11, "PythonSubclass", 10, 2, "", [tv(1, GLOBAL), tv(2, GLOBAL), 0.1], GLOBAL),
        host_node(12, "aten::lerp_", 11, 3, LERP_, [tv(3, LOCAL), tv(4, LOCAL), 0.1], LOCAL, [tv(3, LOCAL)]),
        # a plain tensor's op, with the children of its own kernel: runs as recorded
        host_node(20, "aten::sqrt", 2, 4, SQRT, [tv(5, LOCAL)], LOCAL, [tv(6, LOCAL)]),
        host_node(21, "aten::empty_like", 20, 5, "aten::empty_like(Tensor self) -> Tensor", [tv(5, LOCAL)], LOCAL,
                  [tv(6, LOCAL)]),
    ])
    names = [n.name for n in conv.nodes]
    assert names[-2:] == ["aten::lerp_", "aten::sqrt"]
    lerp, sqrt = conv.nodes[-2:]
    kids = json.loads(str(attr_map(lerp.attr)["nbox_children"].value))
    assert [(k["name"], k["et_id"], k["inputs"]["shapes"][0]) for k in kids] == [("aten::lerp_", 12, LOCAL)]
    assert "nbox_children" not in attr_map(sqrt.attr)  # no subclass under it: its own kernel's ops are not listed

    ops = prepare(load_rank(write_et(tmp_path / "trace.0.et", conv.metadata, conv.nodes), 0, keep_nodes=True), "cpu")
    first = len(names) - 2
    local, plain = ops.runnables[first], ops.runnables[first + 1]
    assert isinstance(local, CompositeRunnable) and isinstance(plain, Runnable)
    assert [c.args[0].shape for c in local.children] == [tuple(LOCAL)]
    assert ops.run(first) and ops.run(first + 1)
    pool = ops.pool.tensors
    assert 3 in pool and pool[3].shape == torch.Size(LOCAL)  # the shard was updated
    assert 1 not in pool and 2 not in pool  # the global tensors were never made
