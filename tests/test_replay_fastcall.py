"""nbox_replay.live.fastcall: a replayed operator is called through torch's generated binding only where that binding
dispatches the same overloads as the resolved ``OpOverload`` (checked on meta copies), else through ``_op``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nbox_replay.inputs.graph import load_rank
from nbox_replay.live.fastcall import _trace, bindings, choose
from nbox_replay.live.ops import prepare
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et

aten = torch.ops.aten


def test_bindings_are_found_by_name_and_a_method_only_for_self() -> None:
    assert torch._C._VariableFunctions.mm in bindings(aten.mm.default)
    assert torch.Tensor.view in bindings(aten.view.default)  # no torch.view: the method
    assert torch._C._nn.gelu in bindings(aten.gelu.default)
    assert bindings(aten.empty.memory_format) == [torch._C._VariableFunctions.empty]  # no self: no method
    assert bindings(torch.ops.c10d.barrier.default) == []  # not aten
    assert bindings(lambda x: x) == []


def test_a_binding_that_runs_the_same_overload_is_chosen_and_computes_the_same() -> None:
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    entry = choose(aten.mm.default, aten.mm.default._op, (a, b), {})
    assert entry is torch._C._VariableFunctions.mm
    assert torch.equal(entry(a, b), aten.mm.default(a, b))
    t = torch.randn(2, 6)
    view = choose(aten.view.default, aten.view.default._op, (t, [3, 4]), {})
    assert view is torch.Tensor.view and view(t, [3, 4]).shape == (3, 4)
    kw = {"dtype": None, "layout": None, "device": None, "pin_memory": None, "memory_format": None}
    ones = choose(aten.ones_like.default, aten.ones_like.default._op, (t,), kw)
    assert ones is torch._C._VariableFunctions.ones_like and torch.equal(ones(t, **kw), torch.ones_like(t))


def test_a_binding_that_picks_another_overload_or_rejects_the_arguments_is_not_used() -> None:
    t = torch.randn(2, 3)
    slow = aten.add.Scalar._op
    # torch.add(t, 2.0) dispatches aten.add.Tensor (the scalar wrapped), not aten.add.Scalar
    seen = _trace(torch._C._VariableFunctions.add, (t, 2.0), {})
    assert seen is not None and seen[0] == [aten.add.Tensor]
    assert choose(aten.add.Scalar, slow, (t, 2.0), {}) is slow
    assert choose(aten.add.Scalar, slow, (t, 2.0, 1), {}) is slow  # the binding reads (input, alpha, other)


def test_the_check_touches_no_real_tensor_and_allocates_nothing_for_a_factory_with_a_device() -> None:
    t = torch.zeros(3)
    version = t._version
    entry = choose(aten.add_.Tensor, aten.add_.Tensor._op, (t, torch.ones(3)), {"alpha": 1})
    assert entry is torch.Tensor.add_
    assert t._version == version and torch.equal(t, torch.zeros(3))  # the in-place check ran on meta copies
    kw = {"dtype": torch.float32, "layout": None, "device": torch.device("cpu"), "pin_memory": None,
          "memory_format": None}
    assert choose(aten.empty.memory_format, aten.empty.memory_format._op, ([1 << 40],), kw) \
        is torch._C._VariableFunctions.empty  # 4 TiB: only a meta tensor can be that
    no_device = {**kw, "device": None}
    slow = aten.empty.memory_format._op
    assert choose(aten.empty.memory_format, slow, ([2],), no_device) is slow  # it would allocate: not checked


def test_a_live_operator_gets_its_entry_when_it_is_prepared(tmp_path: Path) -> None:
    node = pb.Node(id=1, name="aten::mm", type=pb.COMP_NODE, duration_micros=10)
    node.inputs.values = json.dumps([[1, 1001, 0, 20, 4, "cpu"], [2, 1002, 0, 15, 4, "cpu"]])
    node.inputs.shapes, node.inputs.types = json.dumps([[4, 5], [5, 3]]), json.dumps(["Tensor(float)"] * 2)
    node.outputs.values, node.outputs.shapes = json.dumps([[3, 1003, 0, 12, 4, "cpu"]]), json.dumps([[4, 3]])
    node.outputs.types = json.dumps(["Tensor(float)"])
    set_attr(node, "is_cpu_op", True)
    set_attr(node, "op_schema", "aten::mm(Tensor self, Tensor mat2) -> Tensor")
    path = write_et(tmp_path / "trace.0.et", pb.GlobalMetadata(version="1.0.0"), [node])
    ops = prepare(load_rank(path, 0, keep_nodes=True), "cpu")
    r = ops.runnables[0]
    assert r is not None and not hasattr(r, "children")
    assert r._call is torch._C._VariableFunctions.mm  # chosen on meta tensors, before any run
    assert ops.run(0)
    a, b = ops.pool.tensors[1], ops.pool.tensors[2]
    assert ops.run(0) and not ops.fallbacks and a is ops.pool.tensors[1] and b is ops.pool.tensors[2]


def test_the_check_does_not_import_dynamo() -> None:
    # a dispatch mode's __torch_dispatch__ is wrapped in a dynamo-disable that imports torch._dynamo on its first
    # call (3-6 s of a live worker's start on this VM); the check's mode opts out
    import subprocess
    import sys

    code = ("import sys, torch\nfrom nbox_replay.live.fastcall import choose\n"
            "a, b = torch.randn(4, 5), torch.randn(5, 3)\n"
            "e = choose(torch.ops.aten.mm.default, torch.ops.aten.mm.default._op, (a, b), {})\n"
            "print(e is torch._C._VariableFunctions.mm, 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]
