"""Live replay: recorded operators re-executed (nbox_replay.live.ops) and whole bundles replayed on real ranks
with the ``nbox`` backend answering collectives (nbox_replay.live.run). Unit tests build nodes by hand; the
integration tests replay the shipped ``traces/ddp_mlp`` bundle. Timing is only checked for sanity."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.world import resize
from nbox_record.convert import comp as convertcomp
from nbox_record.convert.assemble import convert_rank
from nbox_replay.inputs.graph import RankGraph, load_rank
from nbox_replay.live.ops import BuildError, CompositeRunnable, TensorSpec, parse_dtype, prepare
from nbox_replay.live.run import LiveConfig, LiveConfigError, LiveReplayError, replay_live
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import attr_map, set_attr
from nbox_trace.chakra.codec import write_et
from nbox_trace.errors import NboxError

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "traces" / "ddp_mlp"


def tv(tid: int, numel: int, itemsize: int = 4) -> list[Any]:
    """A recorded tensor value: [tensor_id, storage_id, offset, numel, itemsize, device]."""
    return [tid, tid + 1000, 0, numel, itemsize, "cpu"]


def op_node(nid: int, name: str, schema: str, ins: list[Any], shapes: list[Any], types: list[str],
            outs: list[Any] | None = None, out_shapes: list[Any] | None = None, out_types: list[str] | None = None,
            strides: list[Any] | None = None, dur: int = 10) -> pb.Node:
    node = pb.Node(id=nid, name=name, type=pb.COMP_NODE, duration_micros=dur)
    node.inputs.values, node.inputs.shapes, node.inputs.types = json.dumps(ins), json.dumps(shapes), json.dumps(types)
    node.outputs.values = json.dumps(outs or [])
    node.outputs.shapes = json.dumps(out_shapes or [])
    node.outputs.types = json.dumps(out_types or [])
    if nid > 1:
        node.data_deps.append(nid - 1)
    set_attr(node, "is_cpu_op", True)
    set_attr(node, "op_schema", schema)
    if strides is not None:
        set_attr(node, "nbox_input_strides", json.dumps(strides))
    return node


def graph_of(tmp_path: Path, nodes: list[pb.Node], name: str = "trace.0.et") -> RankGraph:
    path = write_et(tmp_path / name, pb.GlobalMetadata(version="1.0.0"), nodes)
    return load_rank(path, 0, keep_nodes=True)


F = "Tensor(float)"


# ------------------------------------------------------------------------------------------ ops: unit tests
def test_parse_dtype_reads_the_observer_names() -> None:
    assert parse_dtype("Tensor(float)") == torch.float32
    assert parse_dtype("Tensor(c10::BFloat16)") == torch.bfloat16
    assert parse_dtype("Tensor(long int)") == torch.int64
    assert parse_dtype("Tensor(c10::Half)") == torch.float16
    assert parse_dtype("Tensor(bool)") == torch.bool
    with pytest.raises(BuildError, match="unknown tensor dtype"):
        parse_dtype("Tensor(quux)")


def test_tensors_are_reused_by_id_and_an_in_place_output_is_its_input(tmp_path: Path) -> None:
    g = graph_of(tmp_path, [
        op_node(1, "aten::mul", "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
                [tv(1, 6), tv(2, 6)], [[2, 3], [2, 3]], [F, F], [tv(3, 6)], [[2, 3]], [F]),
        op_node(2, "aten::add_", "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
                [tv(3, 6), tv(1, 6), 2.0], [[2, 3], [2, 3], []], [F, F, "Double"], [tv(3, 6)], [[2, 3]], [F]),
        op_node(3, "aten::sum", "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
                [tv(3, 6), "<None>"], [[2, 3], []], [F, "None"], [tv(4, 1)], [[]], [F]),
    ])
    ops = prepare(g, "cpu")
    assert all(r is not None for r in ops.runnables) and not ops.fallbacks
    assert ops.run(0)
    pool = ops.pool.tensors
    a, b, product = pool[1], pool[2], pool[3]
    assert torch.equal(product, a * b)
    assert ops.run(1)
    assert pool[3] is product  # the in-place op's output is the same tensor object
    assert torch.allclose(product, a * b + 2.0 * a)
    assert ops.run(2)
    assert 3 not in pool and 4 not in pool  # made by the graph: dropped after their last use
    assert pool[1] is a and pool[2] is b  # inputs from outside the graph (parameters) are kept
    ops.run(0)
    assert ops.pool.tensors[1] is a  # the next repetition reuses them
    assert ops.coverage() == pytest.approx(1.0)


def test_an_input_no_operator_made_is_a_view_of_the_live_output_on_its_storage(tmp_path: Path) -> None:
    # A linear's saved input in backward: the producer's output (tensor 3, storage 1003) reached the next
    # operators as views made inside other operators (tensors 5 and 6, same storage, offsets 0 and 4), so no
    # recorded operator produced them. Replayed, they must be that memory (as the real run read it: hot in
    # cache), not new tensors; a view that cannot fit the storage gets a new tensor.
    mul = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
    neg = "aten::neg(Tensor self) -> Tensor"
    add_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
    g = graph_of(tmp_path, [
        op_node(1, "aten::mul", mul, [tv(1, 8), tv(2, 8)], [[2, 4], [2, 4]], [F, F], [tv(3, 8)], [[2, 4]], [F]),
        op_node(2, "aten::neg", neg, [[5, 1003, 0, 4, 4, "cpu"]], [[4]], [F], [tv(7, 4)], [[4]], [F]),
        op_node(3, "aten::add_", add_, [[6, 1003, 4, 4, 4, "cpu"], tv(7, 4), 1], [[4], [4], []], [F, F, "Int"],
                [[6, 1003, 4, 4, 4, "cpu"]], [[4]], [F]),
        op_node(4, "aten::neg", neg, [[8, 1003, 6, 4, 4, "cpu"]], [[4]], [F], [tv(9, 4)], [[4]], [F]),
        op_node(5, "aten::neg", neg, [[10, 1003, 0, 4, 8, "cpu"]], [[4]], ["Tensor(double)"], [tv(11, 4, 8)],
                [[4]], ["Tensor(double)"]),
    ])
    ops = prepare(g, "cpu")
    assert ops.pool.aliases == {5: (3, 0), 6: (3, 4), 8: (3, 6), 10: (3, 0)}
    for i in range(5):
        assert ops.run(i)
    pool = ops.pool.tensors
    product = ops.pool.tensors.get(3)
    assert product is None  # made by the graph, dropped after its last use: the views kept it alive until then
    ops.run(0)
    product = pool[3].clone()
    ops.run(1)
    negated = pool[7]
    assert torch.equal(negated, -product.flatten()[:4])  # read through the view of tensor 3's memory
    base = pool[3]
    ops.run(2)  # in place through the view at offset 4: the base's second row changes
    assert torch.equal(base[1], product[1] + negated) and torch.equal(base[0], product[0])
    assert 6 not in pool  # a view is made on use, never pooled
    # offset 6 + 4 elements runs past the 8-element storage, a double view of a float storage: new tensors,
    # made once (the first pass) and pooled like any outside input
    ops.run(3)
    ops.run(4)
    assert ops.pool.created == 4  # tensors 1 and 2, and those two
    assert pool[8].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert pool[10].dtype == torch.float64


def test_the_inline_pool_lookup_keeps_views_and_mismatched_tensors_on_the_checked_path(tmp_path: Path) -> None:
    """Runnable.bind plans each argument once: a view (an aliased tensor id) is still made on use, and a pooled
    tensor whose shape or dtype is not the recorded one is still replaced (the inline lookup checks both)."""
    from nbox_replay.live.ops import Runnable

    neg = "aten::neg(Tensor self) -> Tensor"
    mul = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
    g = graph_of(tmp_path, [
        op_node(1, "aten::mul", mul, [tv(1, 8), tv(2, 8)], [[2, 4], [2, 4]], [F, F], [tv(3, 8)], [[2, 4]], [F]),
        op_node(2, "aten::neg", neg, [[5, 1003, 4, 4, 4, "cpu"]], [[4]], [F], [tv(7, 4)], [[4]], [F]),
    ])
    ops = prepare(g, "cpu")
    mul_op, neg_op = ops.runnables
    assert isinstance(mul_op, Runnable) and isinstance(neg_op, Runnable)
    assert [step[0] for step in mul_op._plan] == [0, 0] and [step[0] for step in neg_op._plan] == [2]
    ops.release.clear()  # keep the graph's own tensors to look at
    assert ops.run(0) and ops.run(1)
    assert torch.equal(ops.pool.tensors[7], -ops.pool.tensors[3].flatten()[4:])  # read through the view
    ops.pool.tensors[1] = torch.zeros(3, dtype=torch.float64)  # a stale tensor under the id: replaced, not used
    assert ops.run(0)
    assert ops.pool.tensors[1].shape == (2, 4) and ops.pool.tensors[1].dtype == torch.float32


def test_recorded_strides_dtype_and_valid_indices(tmp_path: Path) -> None:
    long_t = "Tensor(long int)"
    g = graph_of(tmp_path, [
        op_node(1, "aten::embedding", "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, "
                "bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
                [tv(1, 40), tv(2, 12, 8), -1, False, False], [[10, 4], [4, 3], [], [], []],
                [F, long_t, "Int", "Bool", "Bool"], [tv(3, 48)], [[4, 3, 4]], [F]),
        op_node(2, "aten::index_select", "aten::index_select(Tensor self, int dim, Tensor index) -> Tensor",
                [tv(4, 12), 0, tv(5, 5, 8)], [[4, 3], [], [5]], [F, "Int", long_t], [tv(6, 15)], [[5, 3]], [F],
                strides=[[1, 4], [], [1]]),
        op_node(3, "aten::cat", "aten::cat(Tensor[] tensors, int dim=0) -> Tensor",
                [[tv(1, 40), tv(7, 8, 2)], 0], [[[10, 4], [2, 4]], []], ["GenericList[Tensor(float),Tensor(float)]",
                                                                       "Int"], [tv(8, 48)], [[12, 4]], [F]),
        op_node(4, "aten::ones", "aten::ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
                "Device? device=None, bool? pin_memory=None) -> Tensor",
                [[2, 2], 15, "<None>", "cuda:0", "<None>"], [[[], []], [], [], [], []],
                ["GenericList[Int,Int]", "Int", "None", "Device", "None"], [tv(9, 4, 2)], [[2, 2]],
                ["Tensor(c10::BFloat16)"]),
    ])
    ops = prepare(g, "cpu")
    assert [ops.run(i) for i in range(4)] == [True, True, True, True], ops.reasons
    pool = ops.pool.tensors
    assert pool[2].dtype == torch.int64 and not pool[2].any()  # indices: zeros, always valid
    assert pool[4].stride() == (1, 4) and pool[4].shape == (4, 3)  # the recorded strides
    assert pool[1].dtype == torch.float32 and pool[1].abs().max() <= 1.0  # floats in [-1, 1)
    assert not ops.fallbacks


def test_fallbacks_are_counted_per_operator_and_never_raise(tmp_path: Path) -> None:
    g = graph_of(tmp_path, [
        op_node(1, "autograd::engine::evaluate_function: AddmmBackward0", "", [], [], [], dur=100),
        op_node(2, "aten::no_such_operator", "aten::no_such_operator(Tensor self) -> Tensor", [tv(1, 4)], [[4]], [F],
                dur=50),
        op_node(3, "fsdp::chunk_cat", "fsdp::chunk_cat(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) "
                "-> ()", [], [], [], dur=25),
        op_node(4, "aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor", [tv(2, 6), tv(3, 6)],
                [[2, 3], [2, 3]], [F, F], [tv(4, 4)], [[2, 2]], [F], dur=20),  # shapes do not match: raises
        op_node(5, "aten::relu", "aten::relu(Tensor self) -> Tensor", [tv(5, 4)], [[4]], ["Tensor(quux)"], dur=5),
        op_node(6, "autograd::engine::evaluate_function: AddmmBackward0", "", [], [], [], dur=100),
        op_node(7, "aten::relu", "aten::relu(Tensor self) -> Tensor", [tv(6, 4)], [[4]], [F], dur=200),
    ])
    ops = prepare(g, "cpu")
    assert ops.runnables[0] is None and ops.reasons[0] == "no op_schema"
    assert "unknown operator" in ops.reasons[1]
    assert "not an aten operator" in ops.reasons[2]
    assert "unknown tensor dtype" in ops.reasons[4]
    assert ops.runnables[3] is not None  # builds, fails when it runs
    results = [ops.run(i) for i in range(len(g))]
    assert results == [False, False, False, False, False, False, True]
    assert "RuntimeError" in ops.reasons[3]
    assert ops.fallbacks == {"autograd::engine::evaluate_function: AddmmBackward0": 2, "aten::no_such_operator": 1,
                             "fsdp::chunk_cat": 1, "aten::mm": 1, "aten::relu": 1}
    assert ops.coverage() == pytest.approx(200 / 500)
    assert not ops.run(3)  # stays a fallback, counted once
    assert ops.fallbacks["aten::mm"] == 1


MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


def child(name: str, schema: str, ins: list[Any], shapes: list[Any], types: list[str], outs: list[Any],
          out_shapes: list[Any]) -> dict[str, Any]:
    """One ``nbox_children`` entry, as the converter writes it."""
    return {"name": name, "op_schema": schema, "inputs": {"values": ins, "shapes": shapes, "types": types},
            "outputs": {"values": outs, "shapes": out_shapes, "types": [F] * len(outs)},
            "input_strides": [[3, 1] if isinstance(v, list) else [] for v in ins]}


def composite_node(nid: int, kids: list[dict[str, Any]], dur: int = 100) -> pb.Node:
    node = op_node(nid, "autograd::engine::evaluate_function: MulBackward0", "", [], [], [], dur=dur)
    set_attr(node, "nbox_children", json.dumps(kids))
    return node


def test_a_schemaless_node_runs_its_children_in_order_and_chains_tensors(tmp_path: Path) -> None:
    g = graph_of(tmp_path, [
        composite_node(1, [child("aten::mul", MUL, [tv(1, 6), tv(2, 6)], [[2, 3], [2, 3]], [F, F], [tv(3, 6)],
                                 [[2, 3]]),
                           child("aten::add", ADD, [tv(3, 6), tv(1, 6), 2.0], [[2, 3], [2, 3], []], [F, F, "Double"],
                                 [tv(4, 6)], [[2, 3]])]),
        op_node(2, "aten::relu_", "aten::relu_(Tensor(a!) self) -> Tensor(a!)", [tv(4, 6)], [[2, 3]], [F], [tv(4, 6)],
                [[2, 3]], [F], dur=50),
    ])
    ops = prepare(g, "cpu")
    r = ops.runnables[0]
    assert isinstance(r, CompositeRunnable) and [c.name for c in r.children] == ["aten::mul", "aten::add"]
    assert not ops.fallbacks and ops.coverage() == pytest.approx(1.0)
    assert ops.run(0)
    pool = ops.pool.tensors
    a, b, out = pool[1], pool[2], pool[4]
    assert torch.allclose(out, a * b + 2.0 * a)  # the second child read the first one's output
    assert 3 not in pool  # made and last used inside the node: dropped after it
    expected = torch.relu(out)
    assert ops.run(1)
    assert torch.equal(out, expected)  # the next node worked in place on the composite's output tensor
    assert 4 not in pool and pool[1] is a and pool[2] is b


def test_a_child_that_cannot_be_built_makes_the_whole_node_fall_back(tmp_path: Path) -> None:
    g = graph_of(tmp_path, [
        composite_node(1, [child("aten::mul", MUL, [tv(1, 6), tv(2, 6)], [[2, 3], [2, 3]], [F, F], [tv(3, 6)],
                                 [[2, 3]]),
                           child("aten::no_such_operator", "aten::no_such_operator(Tensor self) -> Tensor",
                                 [tv(3, 6)], [[2, 3]], [F], [tv(4, 6)], [[2, 3]])], dur=100),
        op_node(2, "aten::relu", "aten::relu(Tensor self) -> Tensor", [tv(5, 6)], [[2, 3]], [F], dur=50),
    ])
    ops = prepare(g, "cpu")
    assert ops.runnables[0] is None and ops.reasons[0].startswith("child 1 (aten::no_such_operator): unknown operator")
    assert ops.fallbacks == {"autograd::engine::evaluate_function: MulBackward0": 1}
    assert not ops.run(0) and ops.run(1)
    assert 3 not in ops.pool.tensors and ops.pool.created == 1  # no child ran; relu made its input
    assert ops.coverage() == pytest.approx(50 / 150)


def test_a_composite_child_that_raises_falls_back_the_node_once(tmp_path: Path) -> None:
    mm = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
    g = graph_of(tmp_path, [composite_node(1, [child("aten::mm", mm, [tv(1, 6), tv(2, 6)], [[2, 3], [2, 3]], [F, F],
                                                     [tv(3, 4)], [[2, 2]])])])
    ops = prepare(g, "cpu")
    assert isinstance(ops.runnables[0], CompositeRunnable)
    assert not ops.run(0) and "RuntimeError" in ops.reasons[0] and not ops.run(0)
    assert ops.fallbacks == {"autograd::engine::evaluate_function: MulBackward0": 1} and ops.coverage() == 0.0


def _host_node(nid: int, name: str, parent: int, rf: int, schema: str = "", ins: list[Any] | None = None,
               shapes: list[Any] | None = None, types: list[str] | None = None, outs: list[Any] | None = None,
               scope: int = 0) -> dict[str, Any]:
    ins, outs = ins or [], outs or []
    return {"id": nid, "name": name, "ctrl_deps": parent,
            "inputs": {"values": ins, "shapes": shapes or [[]] * len(ins), "types": types or [],
                       "strides": [[3, 1] if isinstance(v, list) else [] for v in ins]},
            "outputs": {"values": outs, "shapes": [[2, 3]] * len(outs), "types": [F] * len(outs),
                        "strides": [[3, 1]] * len(outs)},
            "attrs": [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "tid", "type": "uint64", "value": 1},
                      {"name": "scope", "type": "uint64", "value": scope},
                      {"name": "op_schema", "type": "string", "value": schema}]}


def test_converter_lists_the_outermost_aten_children_and_live_replay_runs_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t1, t2, t3, t4 = (tv(k, 6) for k in (1, 2, 3, 4))
    nodes = [
        _host_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0, scope=7),
        _host_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0, scope=7),
        _host_node(10, "autograd::engine::evaluate_function: MulBackward0", 2, 1),
        _host_node(11, "MulBackward0", 10, 2),  # the autograd node: looked into
        _host_node(12, "aten::mul", 11, 3, MUL, [t1, t2], [[2, 3], [2, 3]], [F, F], [t3]),
        _host_node(13, "aten::empty", 12, 4, "aten::empty.memory_format(SymInt[] size) -> Tensor"),  # under an aten op
        _host_node(14, "c10d::allreduce_", 10, 5, "c10d::allreduce_(Tensor[] tensors) -> Tensor[]",
                   [[t3]], [[[2, 3]]], ["GenericList[Tensor(float)]"]),  # a collective: hoisted, not a child
        _host_node(15, "aten::copy_", 14, 6, "aten::copy_(Tensor(a!) self, Tensor src) -> Tensor(a!)"),
        _host_node(16, "aten::add", 10, 7, ADD, [t3, t1, 2.0], [[2, 3], [2, 3], []], [F, F, "Double"], [t4]),
        _host_node(20, "aten::relu", 2, 8, "aten::relu(Tensor self) -> Tensor", [t4], [[2, 3]], [F], [tv(5, 6)]),
    ]
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    conv = convert_rank(host, None, rank=0, world_size=2)
    names = [n.name for n in conv.nodes]
    assert names[-3:] == ["autograd::engine::evaluate_function: MulBackward0", "c10d::allreduce_", "aten::relu"]
    first = len(names) - 3  # after the process-group node, if any
    bwd = conv.nodes[first]
    kids = json.loads(attr_value(bwd, "nbox_children"))
    assert [k["name"] for k in kids] == ["aten::mul", "aten::add"]
    assert kids[0] == {"name": "aten::mul", "op_schema": MUL, "et_id": 12,
                       "inputs": {"values": [t1, t2], "shapes": [[2, 3], [2, 3]], "types": [F, F]},
                       "outputs": {"values": [t3], "shapes": [[2, 3]], "types": [F]},
                       "input_strides": [[3, 1], [3, 1]]}
    assert all(attr_value(n, "nbox_children") is None for n in conv.nodes[first + 1:])  # aten and comm: none
    et = write_et(tmp_path / "trace.0.et", conv.metadata, conv.nodes)
    ops = prepare(load_rank(et, 0, keep_nodes=True), "cpu")
    assert isinstance(ops.runnables[first], CompositeRunnable)
    assert [ops.run(i) for i in (first, first + 2)] == [True, True]
    assert ops.pool.created == 2  # only the inputs 1 and 2 were made: 3 and 4 came from the children

    monkeypatch.setattr(convertcomp, "MAX_CHILDREN", 1)  # over the cap: left out, flagged, falls back
    bwd = convert_rank(host, None, rank=0, world_size=2).nodes[first]
    assert attr_value(bwd, "nbox_children") is None and attr_value(bwd, "nbox_children_truncated") is True
    g = graph_of(tmp_path, [bwd], "trace.1.et")
    assert "nbox_children_truncated" in prepare(g, "cpu").reasons[0]


def attr_value(node: pb.Node, name: str) -> Any:
    found = attr_map(node.attr).get(name)
    return None if found is None else found.value


def test_pool_makes_overlapping_strides() -> None:
    from nbox_replay.live.ops import TensorPool

    t = TensorPool("cpu").make(TensorSpec(1, (3, 4), (0, 1), torch.float32))  # an expanded tensor
    assert t.shape == (3, 4) and t.stride() == (0, 1)


def test_every_shipped_bundle_prepares_with_coverage() -> None:
    for bundle in ("ddp_mlp", "ddp_transformer", "fsdp2_transformer"):
        g = load_rank(ROOT / "traces" / bundle / "trace" / "trace.0.et", 0, keep_nodes=True)
        ops = prepare(g, "cpu")
        for i in range(len(g)):
            ops.run(i)
        # the backward runs live through its recorded aten children (nbox_children): only nodes with no
        # aten operator under them (AddBackward0, a pass-through) fall back
        assert 0.8 < ops.coverage() <= 1.0, (bundle, ops.coverage(), ops.reasons_by_op())
        assert any(isinstance(r, CompositeRunnable) for r in ops.runnables), bundle
        assert not [r for i, r in ops.reasons.items() if g.names[i].startswith("aten::")], ops.reasons


# ----------------------------------------------------------------------------------- config validation
def _config(tmp_path: Path | None = None, **kw: Any) -> LiveConfig:
    world = kw.pop("world", 2)
    ranks = kw.pop("ranks", (0, 1))
    args: dict[str, Any] = {"files": {r: MLP / "trace" / f"trace.{r}.et" for r in ranks},
                            "groups": {"0": [0, 1]}, "recorded_world": 2,
                            "scenario": resize(load_scenario(None), world),
                            "warmup": 1, "iterations": 3, "timeout_s": 90.0}
    args.update(kw)
    return LiveConfig(**args)


def test_live_config_is_validated() -> None:
    assert _config().compute == "live"
    with pytest.raises(LiveConfigError, match="compute"):
        _config(compute="fast")
    with pytest.raises(LiveConfigError, match="device"):
        _config(device="tpu")
    with pytest.raises(LiveConfigError, match="outside the what-if world"):
        _config(files={5: MLP / "trace" / "trace.0.et"})
    with pytest.raises(LiveConfigError, match="iterations"):
        _config(iterations=0)
    with pytest.raises(LiveConfigError, match="timeout_s"):
        _config(timeout_s=0)
    with pytest.raises(NboxError, match="not found"):
        _config(files={0: MLP / "nope.et"})


# --------------------------------------------------------------------------------------- integration tests
def _sane(times: list[float]) -> bool:
    return bool(times) and all(math.isfinite(t) and t > 0 for t in times)


@pytest.mark.integration
def test_ddp_mlp_two_ranks_live() -> None:
    res = replay_live(_config())
    assert res.world_size == 2 and set(res.rank_end_us) == {0, 1}
    assert len(res.iteration_us) == 3 and _sane(res.iteration_us)
    assert all(_sane(v) for v in res.rank_end_us.values())
    assert res.iteration_us == [max(res.rank_end_us[r][k] for r in (0, 1)) for k in range(3)]
    assert 0.8 < res.coverage <= 1.0  # the backward runs live through its recorded children
    assert "torch.distributed.ddp.reducer::copy_bucket_to_grad" not in res.fallbacks


@pytest.mark.integration
def test_one_replayed_rank_at_world_size_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without torch's entry-point autoload, as where nbox runs from a checkout on PYTHONPATH (not installed):
    # the worker registers the backend itself (seen on the first GPU machine: "Unknown backend type nbox").
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    res = replay_live(_config(ranks=(0,), world=8))
    assert res.world_size == 8 and set(res.rank_end_us) == {0}
    assert _sane(res.iteration_us) and res.coverage > 0


@pytest.mark.integration
def test_recorded_compute_runs_no_operator() -> None:
    res = replay_live(_config(compute="recorded"))
    assert _sane(res.iteration_us) and res.coverage == 0.0 and res.fallbacks == {}
    recorded = load_rank(MLP / "trace" / "trace.0.et", 0).compute_us()
    assert min(res.rank_compute_us[0]) >= recorded * 0.95  # compute nodes wait their recorded durations


def _p2p_trace(tmp_path: Path, peer: int, compute_us: int = 10) -> Path:
    comp = op_node(1, "aten::relu", "aten::relu(Tensor self) -> Tensor", [tv(1, 4)], [[4]], [F], dur=compute_us)
    send = pb.Node(id=2, name="c10d::send", type=pb.COMM_SEND_NODE, duration_micros=5)
    send.data_deps.append(1)
    for k, v in (("is_cpu_op", False), ("comm_size", 64), ("comm_src", 0), ("comm_dst", peer), ("comm_tag", 0)):
        set_attr(send, k, v)
    return write_et(tmp_path / "trace.0.et", pb.GlobalMetadata(version="1.0.0"), [comp, send])


@pytest.mark.integration
def test_a_failing_node_names_rank_and_node(tmp_path: Path) -> None:
    cfg = _config(files={0: _p2p_trace(tmp_path, peer=7)}, ranks=(0,), groups={})
    with pytest.raises(LiveReplayError, match=r"rank 0 failed at node 2 \(c10d::send\).*peer 7"):
        replay_live(cfg)


@pytest.mark.integration
def test_a_run_past_its_deadline_is_stopped(tmp_path: Path) -> None:
    cfg = _config(files={0: _p2p_trace(tmp_path, peer=1, compute_us=120_000_000)}, ranks=(0,),
                  groups={}, compute="recorded", timeout_s=8.0)
    with pytest.raises(LiveReplayError, match=r"did not finish within 8 s.*\[0\]"):
        replay_live(cfg)


@pytest.mark.integration
def test_live_iterations_of_a_multi_iteration_capture_are_its_captured_iterations(tmp_path: Path) -> None:
    # A live pass runs every captured iteration; each is timed on its own and the report's iteration is the
    # median of them, as the virtual run's (a whole pass reported 101 ms live against 17.7 ms observed for a
    # 5-iteration capture of ddp_mlp; then its k-th, a mean beside the observed median)
    import subprocess
    import sys

    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    bundle = tmp_path / "b"
    rec = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "2", "--warmup", "2", "--iterations", "3",
                          "--capture", "4", "-o", str(bundle), "--", str(ROOT / "nbox_record" / "examples" /
                                                                         "ddp_mlp.py"), "--steps", "12"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert rec.returncode == 0, rec.stderr[-2000:]
    docs = {}
    for clock in ("virtual", "real"):
        run = subprocess.run([sys.executable, "-m", "nbox", "replay", str(bundle), "--clock", clock, "--compute",
                              "recorded", "--iterations", "2", "--warmup", "1", "--json"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        docs[clock] = json.loads(run.stdout)["baseline"]
    assert docs["real"]["iterations"]["captured_per_pass"] == 4
    assert docs["real"]["iterations"]["count"] == 8  # 2 launches (pairs) x 4 captured iterations
    assert "timed whole" not in docs["real"]["iterations"]["note"]
    live = docs["real"]["iteration_us"]["median"]  # its size is timing (not asserted)
    parts = docs["real"]["breakdown_us"]
    assert parts["compute"] + parts["exposed_comm"] + parts["waiting_for_peers"] + parts["idle"] == pytest.approx(
        live, rel=0.02)


def _worker_doc(ends: list[list[float]], compute: list[list[list[float]]]) -> dict[str, Any]:
    return {"iteration_us": [e[-1] for e in ends], "iteration_ends_us": ends, "compute_us": [0.0] * len(ends),
            "wait_us": [0.0] * len(ends), "spans": [{"compute": c, "comms": []} for c in compute]}


def test_live_iterations_are_the_job_windows_of_each_repetition() -> None:
    """Each rank reports when it ended each captured iteration (its own clock from the repetition's start); the
    job's iterations are the windows of job_windows per repetition (iteration j ends when its last rank ends
    it), each rank's parts sum to every window, and the rank shown is the one that ended the median iteration
    last."""
    from types import SimpleNamespace

    from nbox_replay.live.run import _collect
    from nbox_replay.replay import _apply_live
    from nbox_replay.report.summary import RunSummary

    cfg = SimpleNamespace(scenario=SimpleNamespace(world_size=2), compute="recorded")
    rank0 = _worker_doc([[100.0, 250.0, 330.0], [90.0, 200.0, 300.0]],
                        [[[0.0, 80.0], [110.0, 240.0], [260.0, 320.0]], [[0.0, 85.0], [95.0, 190.0], [210.0, 290.0]]])
    rank1 = _worker_doc([[120.0, 230.0, 320.0], [95.0, 210.0, 310.0]],
                        [[[0.0, 110.0], [125.0, 220.0], [240.0, 310.0]], [[0.0, 90.0], [100.0, 185.0], [200.0, 300.0]]])
    res = _collect(cfg, {0: rank0, 1: rank1}, 1.0)  # type: ignore[arg-type]
    assert res.per_repetition == 3
    assert res.iteration_us == pytest.approx([120.0, 130.0, 80.0, 95.0, 115.0, 100.0])
    assert res.rank_end_us[1] == [120.0, 230.0, 320.0, 95.0, 210.0, 310.0]
    for r in (0, 1):
        assert len(res.rank_breakdown[r]) == 6
        for b, t in zip(res.rank_breakdown[r], res.iteration_us, strict=True):
            assert b.compute_us + b.exposed_comm_us + b.waiting_us + b.idle_us == pytest.approx(t)
    assert res.rank_breakdown[0][1].compute_us == pytest.approx(120.0)  # window [120, 250): 120-240 of [110, 240]
    summary = RunSummary("baseline", "s", 2, "virtual", [1.0] * 3, [], 0, captured=3,
                         iterations_note="3 captured iteration(s) per pass")
    _apply_live(summary, res)
    assert summary.iteration_us == res.iteration_us and summary.median_us == 100.0  # the lower middle of six
    assert summary.rank == 1 and summary.breakdowns[5] is res.rank_breakdown[1][5]  # rank 1 ended it at 310
    assert summary.iterations_note == "3 captured iteration(s) per pass" and summary.modeled_iteration_us == 1.0
    # ranks that disagree on their captured iterations: each repetition is one iteration, and the note says so
    odd = _worker_doc([[100.0, 300.0], [90.0, 310.0]], [[[0.0, 50.0]], [[0.0, 60.0]]])
    res = _collect(cfg, {0: rank0, 1: odd}, 1.0)  # type: ignore[arg-type]
    assert res.per_repetition == 1 and res.iteration_us == [330.0, 310.0]
    _apply_live(summary, res)
    assert "timed whole" in summary.iterations_note

