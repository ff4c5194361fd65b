"""Write ``traces/synthetic_ddp_mlp/trace.{0,1}.et``: a hand-modelled 2-rank DDP iteration.

This is NOT a recording: ``nbox record`` does not exist yet. It is what nbox's own writer makes of a
plausible data-parallel MLP step (Linear(512,1024) - ReLU - Linear(1024,512), batch 64, fp32, SGD,
gloo), with the gradient all-reduce split in two DDP buckets that overlap the backward pass. Its
collective sizes are exact for that model; its durations are illustrative. The main command of the
README inspects it. Recorded bundles replace it when the record issue lands.

Run from the repository root:  python traces/make_synthetic_ddp.py
"""

from __future__ import annotations

import json
from pathlib import Path

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import write_et
from nbox_trace.chakra.attrs import make_attr

OUT = Path(__file__).resolve().parent / "synthetic_ddp_mlp"
BATCH, D_IN, D_HID = 64, 512, 1024
FP32 = 4
# DDP buckets fill in reverse parameter order: fc2 (weight + bias) then fc1 (weight + bias).
BUCKET_FC2_BYTES = (D_HID * D_IN + D_IN) * FP32
BUCKET_FC1_BYTES = (D_IN * D_HID + D_HID) * FP32
ITERATIONS = 2

# (name, op_schema, input shapes, input types, duration_us) of the top-level operators per iteration.
FORWARD = [
    ("aten::linear", "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
     f"[[{BATCH},{D_IN}],[{D_HID},{D_IN}],[{D_HID}]]", "['Tensor(float)','Tensor(float)','Tensor(float)']", 412),
    ("aten::relu", "aten::relu(Tensor self) -> Tensor", f"[[{BATCH},{D_HID}]]", "['Tensor(float)']", 38),
    ("aten::linear", "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
     f"[[{BATCH},{D_HID}],[{D_IN},{D_HID}],[{D_IN}]]", "['Tensor(float)','Tensor(float)','Tensor(float)']", 405),
    ("aten::mse_loss", "aten::mse_loss(Tensor self, Tensor target, int reduction=1) -> Tensor",
     f"[[{BATCH},{D_IN}],[{BATCH},{D_IN}],[]]", "['Tensor(float)','Tensor(float)','Int']", 21),
]
BACKWARD_FC2 = [
    ("autograd::engine::evaluate_function: MseLossBackward0", "", "[]", "[]", 30),
    ("autograd::engine::evaluate_function: AddmmBackward0", "", "[]", "[]", 820),
]
BACKWARD_FC1 = [
    ("autograd::engine::evaluate_function: ReluBackward0", "", "[]", "[]", 45),
    ("autograd::engine::evaluate_function: AddmmBackward0", "", "[]", "[]", 790),
]
OPTIMIZER = ("Optimizer.step#SGD.step", "", "[]", "[]", 160)


def _comp(nid: int, start_us: int, deps: list[int], spec: tuple[str, str, str, str, int], rank: int) -> pb.Node:
    name, schema, shapes, types, dur = spec
    dur += 7 * rank  # ranks are never identical
    node = pb.Node(id=nid, name=name, type=pb.COMP_NODE, data_deps=deps, start_time_micros=start_us,
                   duration_micros=dur)
    node.inputs.shapes = shapes
    node.inputs.types = types
    node.attr.append(make_attr("is_cpu_op", True))
    if schema:
        node.attr.append(make_attr("op_schema", schema))
    node.attr.append(make_attr("tid", 1))
    return node


def _allreduce(nid: int, start_us: int, deps: list[int], size: int, bucket: int) -> pb.Node:
    node = pb.Node(id=nid, name=f"c10d::allreduce_ (DDP bucket {bucket})", type=pb.COMM_COLL_NODE,
                   data_deps=deps, start_time_micros=start_us, duration_micros=0)
    for key, value in (("is_cpu_op", False), ("comm_type", pb.ALL_REDUCE), ("comm_size", size),
                       ("pg_name", "0"), ("nbox_dtype", "float32"), ("nbox_async", True)):
        node.attr.append(make_attr(key, value))
    return node


def build(rank: int) -> list[pb.Node]:
    nodes: list[pb.Node] = []
    pg = pb.Node(id=1, name="## process_group:init ##", type=pb.METADATA_NODE)
    pg.inputs.values = json.dumps([{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
                                    "ranks": [], "group_size": 2, "group_count": 1}])
    pg.attr.append(make_attr("is_cpu_op", True))
    nodes.append(pg)
    nid, now, last = 2, 0, 1
    for _ in range(ITERATIONS):
        for spec in FORWARD + BACKWARD_FC2:
            nodes.append(_comp(nid, now, [last], spec, rank))
            now += nodes[-1].duration_micros
            last = nid
            nid += 1
        ar2 = nid
        nodes.append(_allreduce(ar2, now, [last], BUCKET_FC2_BYTES, 0))  # overlaps the fc1 backward
        nid += 1
        for spec in BACKWARD_FC1:
            nodes.append(_comp(nid, now, [last], spec, rank))
            now += nodes[-1].duration_micros
            last = nid
            nid += 1
        ar1 = nid
        nodes.append(_allreduce(ar1, now, [last], BUCKET_FC1_BYTES, 1))
        nid += 1
        now += 900  # waiting for the second bucket
        nodes.append(_comp(nid, now, [last, ar2, ar1], OPTIMIZER, rank))
        now += nodes[-1].duration_micros
        last = nid
        nid += 1
    return nodes


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        meta = pb.GlobalMetadata(version="1.0.0")
        meta.attr.append(make_attr("schema", "1.0.0-chakra.0.0.4"))
        meta.attr.append(make_attr("nbox_producer", "nbox traces/make_synthetic_ddp.py (synthetic, not recorded)"))
        print(write_et(OUT / f"trace.{rank}.et", meta, build(rank)))


if __name__ == "__main__":
    main()
