"""Live replay's made-up tensor values (nbox_replay.live.values through nbox_replay.live.ops): a tensor no recorded
operator produced gets values on which the kernels run as they did in the real run. The inputs of domain-restricted math
(``sqrt``, ``log``, powers, a fused Adam's second moments) are made positive and a recorded Python number (a
0-dimensional tensor) is 1, so an optimizer step computes no NaN: with a negative ``exp_avg_sq`` (made negative, or
multiplied by a made-up negative ``beta2``), CPU ``sqrt`` took a slow path and a GPT-2-class model's live replay
computed far more than its recording. Unit tests on hand-built nodes; nothing is timed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from nbox_replay.inputs.graph import RankGraph, load_rank
from nbox_replay.live.ops import CompositeRunnable, TensorSpec, prepare
from nbox_replay.live.values import POSITIVE, POSITIVE_RANGE, ZERO
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et

F = "Tensor(float)"
FL = "GenericList[Tensor(float)]"
D = "Tensor(double)"  # a Python float an operator received, as the trace records it: a 0-dimensional tensor
N = 256  # elements per tensor: a negative one among them is certain under the zero-mean fill


def tv(tid: int, numel: int = N, itemsize: int = 4) -> list[Any]:
    """A recorded tensor value: [tensor_id, storage_id, offset, numel, itemsize, device]."""
    return [tid, tid + 1000, 0, numel, itemsize, "cpu"]


def sv(tid: int) -> list[Any]:
    """A recorded Python float (a wrapped number): a 0-dimensional double tensor."""
    return tv(tid, 1, 8)


def op(nid: int, schema: str, ins: list[Any], types: list[str], outs: list[Any]) -> pb.Node:
    """A recorded ``aten`` compute node on tensors of N floats (scalars' shapes empty)."""
    name = schema.split("(", 1)[0].split(".", 1)[0]
    node = pb.Node(id=nid, name=name, type=pb.COMP_NODE, duration_micros=10)
    shapes = [[N] if t in (F, "Tensor(long int)") else [[N]] * len(v) if t.startswith("GenericList") else []
              for v, t in zip(ins, types, strict=True)]
    node.inputs.values, node.inputs.shapes, node.inputs.types = json.dumps(ins), json.dumps(shapes), json.dumps(types)
    node.outputs.values = json.dumps(outs)
    node.outputs.shapes = json.dumps([[N]] * len(outs))
    node.outputs.types = json.dumps([F] * len(outs))
    if nid > 1:
        node.data_deps.append(nid - 1)
    set_attr(node, "is_cpu_op", True)
    set_attr(node, "op_schema", schema)
    return node


def graph_of(tmp_path: Path, nodes: list[pb.Node]) -> RankGraph:
    return load_rank(write_et(tmp_path / "trace.0.et", pb.GlobalMetadata(version="1.0.0"), nodes), 0,
                     keep_nodes=True)


MUL_ = "aten::mul_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)"
ADDCMUL_ = ("aten::addcmul_(Tensor(a!) self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor(a!)")
SQRT = "aten::sqrt(Tensor self) -> Tensor"
DIV = "aten::div.Tensor(Tensor self, Tensor other) -> Tensor"
ADD_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
ADDCDIV_ = ("aten::addcdiv_(Tensor(a!) self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor(a!)")
MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"


def adamw_step(first: int = 1) -> list[pb.Node]:
    """One parameter's ``torch.optim.AdamW`` step (foreach off, as on CPU) as its execution trace records it (a
    GPT-2 recording's, ids renumbered): ``exp_avg_sq`` (id 10) is first met by ``mul_``; the gradient (11),
    ``exp_avg`` (15) and the parameter (14) come from outside the graph too; ``beta2`` (20), the bias correction
    (21), ``eps`` (22) and the weight-decay factor (23) are Python floats, recorded as 0-dimensional tensors."""
    return [
        op(first, MUL_, [tv(14), sv(23)], [F, D], [tv(14)]),
        op(first + 1, MUL_, [tv(10), sv(20)], [F, D], [tv(10)]),
        op(first + 2, ADDCMUL_, [tv(10), tv(11), tv(11), 0.001], [F, F, F, "Double"], [tv(10)]),
        op(first + 3, SQRT, [tv(10)], [F], [tv(12)]),
        op(first + 4, DIV, [tv(12), sv(21)], [F, D], [tv(13)]),
        op(first + 5, ADD_, [tv(13), sv(22), 1], [F, D, "Int"], [tv(13)]),
        op(first + 6, ADDCDIV_, [tv(14), tv(15), tv(13), -0.001], [F, F, F, "Double"], [tv(14)]),
    ]


def test_adamw_second_moments_are_made_positive_and_the_step_computes_no_nan(tmp_path: Path) -> None:
    ops = prepare(graph_of(tmp_path, adamw_step()), "cpu")
    assert not ops.fallbacks, ops.reasons
    seen: dict[int, torch.Tensor] = {}
    for _ in range(3):  # repetitions: the pooled tensors carry their values into the next one
        for i in range(len(ops.runnables)):
            assert ops.run(i)
            seen.update(ops.pool.tensors)
    pool = ops.pool.tensors
    lo, hi = POSITIVE_RANGE
    assert all(bool(torch.isfinite(t).all()) for t in seen.values())  # sqrt's output, the denominator, the param
    assert ops.pool.rules == {10: POSITIVE}  # sqrt's input: the rule follows the tensor id to where it is made
    assert float(pool[10].min()) > 0  # made in [0.5, 1), kept positive by the step's own math
    assert all(float(pool[t]) == 1.0 for t in (20, 21, 22, 23))  # the Python numbers: 1
    assert float(pool[11].min()) < 0 < float(pool[11].max())  # other made tensors stay zero-mean in [-1, 1)
    assert float(pool[14].abs().max()) > 0.5  # the weight decay left the parameter's scale alone
    assert lo > 0 and hi <= 1


def test_the_rule_covers_every_domain_operator_its_lists_and_a_composite_child(tmp_path: Path) -> None:
    fused = ("aten::_fused_adamw_(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, "
             "Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs, Tensor[] state_steps, *, float lr, "
             "float beta1, float beta2, float weight_decay, float eps, bool amsgrad, bool maximize, "
             "Tensor? grad_scale=None, Tensor? found_inf=None) -> ()")
    nodes = [
        op(1, "aten::log(Tensor self) -> Tensor", [tv(1)], [F], [tv(2)]),
        op(2, "aten::rsqrt_(Tensor(a!) self) -> Tensor(a!)", [tv(3)], [F], [tv(3)]),
        op(3, "aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor", [tv(4), 0.5], [F, "Double"],
           [tv(5)]),
        op(4, "aten::_foreach_sqrt(Tensor[] self) -> Tensor[]", [[tv(6), tv(7)]], [f"GenericList[{F},{F}]"], []),
        op(5, fused, [[tv(20)], [tv(21)], [tv(22)], [tv(23)], [tv(24)], [tv(25)], 1e-3, 0.9, 0.999, 0.01, 1e-8,
                      True, False, tv(26, 1), tv(27, 1)], [FL] * 6 + ["Double"] * 5 + ["Bool", "Bool", F, F], []),
        op(6, MUL, [tv(30), tv(31)], [F, F], [tv(32)]),  # not domain-restricted: left zero-mean
    ]
    composite = pb.Node(id=7, name="autograd::engine::evaluate_function: SqrtBackward0", type=pb.COMP_NODE,
                        duration_micros=10)
    set_attr(composite, "nbox_children", json.dumps([{
        "name": "aten::sqrt", "op_schema": SQRT, "et_id": 70,
        "inputs": {"values": [tv(40)], "shapes": [[N]], "types": [F]},
        "outputs": {"values": [tv(41)], "shapes": [[N]], "types": [F]}}]))
    ops = prepare(graph_of(tmp_path, [*nodes, composite]), "cpu")
    assert isinstance(ops.runnables[6], CompositeRunnable)
    pool = ops.pool.tensors
    for i in (0, 1, 2, 3, 5, 6):
        assert ops.run(i), ops.reasons
        assert all(bool(torch.isfinite(t).all()) for t in pool.values())  # log's, pow's, sqrt's outputs too
    positive = {1, 3, 4, 6, 7, 23, 24, 25, 40}  # fused: exp_avg_sqs, max_exp_avg_sqs, state_steps
    assert ops.pool.rules == {**{t: POSITIVE for t in positive}, 27: ZERO}  # found_inf: 0, the step runs
    scalar = TensorSpec(27, (), (), torch.float32)  # as the fused step would make them
    assert float(ops.pool.make(scalar)) == 0.0 and float(ops.pool.make(replace(scalar, tid=26))) == 1.0
    assert all(float(pool[t].min()) > 0 for t in (1, 4, 6, 7))
    assert float(pool[30].min()) < 0  # an ordinary input keeps the zero-mean fill


@pytest.mark.parametrize("schema", [SQRT, "aten::sqrt_(Tensor(a!) self) -> Tensor(a!)"])
def test_an_integer_input_of_a_domain_operator_keeps_its_zero_fill(tmp_path: Path, schema: str) -> None:
    node = op(1, "aten::sqrt", [tv(1, itemsize=8)], ["Tensor(long int)"], [])
    set_attr(node, "op_schema", schema)
    ops = prepare(graph_of(tmp_path, [node]), "cpu")
    assert ops.pool.rules == {1: POSITIVE}
    ops.run(0)
    assert 1 in ops.pool.tensors and not ops.pool.tensors[1].any()  # integers hold zeros whatever the rule
