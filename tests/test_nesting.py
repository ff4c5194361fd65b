"""The host ET's nesting repaired by Kineto's clock (nbox_record/sources/nesting.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nbox_record.convert.toplevel import walk
from nbox_record.sources.hostet import read_host_et
from nbox_record.sources.kineto import join_host_ops, read_kineto
from nbox_record.sources.nesting import repair_nesting


def _node(nid: int, name: str, parent: int, rf_id: int, schema: str = "") -> dict[str, Any]:
    empty = {"values": [], "shapes": [], "types": []}
    return {"id": nid, "name": name, "ctrl_deps": parent, "inputs": empty, "outputs": empty,
            "attrs": [{"name": "rf_id", "type": "uint64", "value": rf_id},
                      {"name": "tid", "type": "uint64", "value": 1},
                      {"name": "op_schema", "type": "string", "value": schema}]}


def _event(name: str, rf_id: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Record function id": rf_id}}


def test_an_operator_that_started_after_its_parent_returned_is_moved_up(tmp_path: Path) -> None:
    # As ddp_static_graph.py's rank 1 had it: the optimizer's operators written under the backward's
    # AccumulateGrad (which had issued the all-reduce and returned), one of them with a child of its own
    acc = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    nodes = [_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0),
             _node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0),
             _node(10, acc, 2, 100),
             _node(11, "aten::add_", 10, 101, "aten::add_(...)"),          # inside: 2-5 in 0-10
             _node(12, "gloo:all_reduce", 10, 102),                         # starts inside, ends after: stays
             _node(20, "aten::select", 10, 103, "aten::select(...)"),      # 12-14: after AccumulateGrad ended
             _node(21, "aten::as_strided", 20, 104, "aten::as_strided(...)"),  # inside the select: stays there
             _node(30, "aten::item", 11, 105, "aten::item(...)"),           # 20-21: after both ancestors
             _node(40, "autograd::engine::evaluate_function: AddmmBackward0", 2, 106),  # 22-30
             _node(41, "aten::sum", 10, 107, "aten::sum(...)"),             # 25: written under AccumulateGrad
             _node(50, "aten::mul", 12, 108, "aten::mul(...)")]             # 8: under the gloo marker, its thread
    events = [_event(acc, 100, 0, 10), _event("aten::add_", 101, 2, 3), _event("gloo:all_reduce", 102, 6, 30),
              _event("aten::select", 103, 12, 2), _event("aten::as_strided", 104, 12.5, 0.5),
              _event("aten::item", 105, 20, 1),
              _event("autograd::engine::evaluate_function: AddmmBackward0", 106, 22, 8),
              _event("aten::sum", 107, 25, 1), _event("aten::mul", 108, 8, 1)]
    (tmp_path / "et.json").write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    (tmp_path / "k.json").write_text(json.dumps({"traceEvents": events}))
    et, trace = read_host_et(tmp_path / "et.json"), read_kineto(tmp_path / "k.json")
    ev_of, method = join_host_ops(sorted(et.nodes.values(), key=lambda n: n.order), trace)
    assert method == "rf_id"
    fixed, moved = repair_nesting(et, ev_of, trace)
    assert moved == 4
    # the sum goes into the operator that was running when it started (the gloo marker, still running too, never
    # takes it: it ends on gloo's worker thread); the mul, written under that marker though it ran inside it in
    # time, goes to the operator of its thread that was running: AccumulateGrad
    assert {nid: n.parent for nid, n in fixed.nodes.items()} == {1: None, 2: 1, 10: 2, 11: 10, 12: 10, 20: 2,
                                                                   21: 20, 30: 2, 40: 2, 41: 40, 50: 10}
    assert [n.name for n in walk(fixed).tops] == [acc, "aten::select", "aten::item",
                                                  "autograd::engine::evaluate_function: AddmmBackward0"]
    # as written, the optimizer's operators were lost inside AccumulateGrad
    assert [n.name for n in walk(et).tops] == [acc, "autograd::engine::evaluate_function: AddmmBackward0"]
    unchanged, none = repair_nesting(fixed, ev_of, trace)
    assert none == 0 and unchanged is fixed


def test_a_parent_cycle_in_untrusted_input_ends(tmp_path: Path) -> None:
    nodes = [_node(5, "aten::a", 6, 1, "aten::a(...)"), _node(6, "aten::b", 5, 2, "aten::b(...)"),
             _node(7, "aten::c", 5, 3, "aten::c(...)")]
    (tmp_path / "et.json").write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    (tmp_path / "k.json").write_text(json.dumps({"traceEvents": [
        _event("aten::a", 1, 0, 1), _event("aten::b", 2, 2, 1), _event("aten::c", 3, 10, 1)]}))
    et, trace = read_host_et(tmp_path / "et.json"), read_kineto(tmp_path / "k.json")
    ev_of, _ = join_host_ops(sorted(et.nodes.values(), key=lambda n: n.order), trace)
    fixed, _ = repair_nesting(et, ev_of, trace)
    assert fixed.nodes[7].parent == 5  # no ancestor holds it, and the chain never ends: left where it was

