"""nbox_trace.bundle.diff: what differs between two bundles, and which differences explain the time."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from nbox_trace.bundle.diff import DIFF_SCHEMA, diff_bundles, op_family
from nbox_trace.bundle.manifest import read_manifest, write_bundle
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import find_attr
from nbox_trace.chakra.codec import EtReader, EtWriter
from nbox_trace.errors import InputNotFoundError, InvalidInputError

TRACES = Path(__file__).resolve().parents[1] / "traces"
MLP, TRANSFORMER = TRACES / "ddp_mlp", TRACES / "ddp_transformer"


def _names(bundle: Path) -> set[str]:
    out = set()
    for et in sorted((bundle / "trace").glob("trace.*.et")):
        with EtReader(et) as reader:
            out |= {n.name for n in reader if n.type != pb.METADATA_NODE}
    return out


def _rewrite(src: Path, out: Path, edit: Callable[[int, pb.Node], None], *, ranks: tuple[int, ...] = (0, 1),
             **manifest_changes: object) -> Path:
    """Copy bundle ``src`` to ``out`` keeping ``ranks``, with ``edit(rank, node)`` applied, via write_bundle."""
    m = read_manifest(src)
    work = out.parent / f"{out.name}.work"
    work.mkdir()
    files: dict[str, Path | bytes] = {}
    for entry in m.files:
        if entry.path.startswith("trace/"):
            rank = int(entry.path.split(".")[-2])
            if rank not in ranks:
                continue
            dest = work / Path(entry.path).name
            with EtReader(src / entry.path) as reader, EtWriter(dest, reader.metadata) as writer:
                for node in reader:
                    edit(rank, node)
                    writer.write(node)
            files[entry.path] = dest
        else:
            files[entry.path] = src / entry.path
    write_bundle(out, dataclasses.replace(m, **manifest_changes), files)  # type: ignore[arg-type]
    return out


def test_op_family() -> None:
    assert op_family("aten::addmm") == op_family("aten::linear") == "matmul"
    assert op_family("aten::scaled_dot_product_attention") == "attention"
    assert op_family("aten::layer_norm") == "normalization"
    assert op_family("aten::_foreach_add_") == op_family("Optimizer.step#SGD.step") == "optimizer"
    assert op_family("autograd::engine::evaluate_function: AddmmBackward0") == "backward"
    assert op_family("aten::view") == op_family("aten::copy_") == "copy/view"
    assert op_family("aten::relu") == op_family("aten::add_") == "elementwise"
    assert op_family("c10d::allreduce_", pb.COMM_COLL_NODE) == "comm"
    assert op_family("f3a9c1") == "other"


def test_diff_with_itself_is_empty() -> None:
    d = diff_bundles(MLP, MLP)
    assert d.identical
    assert d.iteration_time.ratio == 1.0 and d.iteration_time.median_delta_us == 0
    assert not (d.environment or d.operators_added or d.operators_removed or d.operators_count_changed)
    assert not (d.collective_counts or d.collectives_resized or d.collectives_added or d.collectives_removed)
    assert all(f.delta_us == 0 for f in d.families)
    assert json.loads(json.dumps(d.to_dict()))["identical"] is True


def test_mlp_vs_transformer() -> None:
    d = diff_bundles(MLP, TRANSFORMER)
    a, b = _names(MLP), _names(TRANSFORMER)
    assert set(d.operators_added) == b - a and set(d.operators_removed) == a - b
    assert d.operators_added and d.operators_removed
    assert {c.key: (c.a, c.b) for c in d.environment}["job.script"] == \
           ("nbox example ddp_mlp", "nbox example ddp_transformer")
    ma, mb = (read_manifest(p).observed["iteration_time_us"]["median"] for p in (MLP, TRANSFORMER))
    assert d.iteration_time.median_delta_us == pytest.approx(mb - ma)
    assert d.iteration_time.ratio == pytest.approx(mb / ma)
    # the MLP's two gradient buckets become the transformer's one
    assert [(c.pg_name, c.position, c.comm_type, c.a_bytes, c.b_bytes, c.ranks) for c in d.collectives_resized] == \
           [("0", 0, "ALL_REDUCE", 1181952, 793088, (0, 1))]
    assert [(c.position, c.a_bytes, c.b_bytes) for c in d.collectives_removed] == [(1, 526336, None)]
    assert not d.collectives_added
    assert {(c.size_bytes, c.a_count, c.b_count) for c in d.collective_counts} == \
           {(1181952, 1, 0), (526336, 1, 0), (793088, 0, 1)}
    assert [(c.comm_type, c.a_bytes, c.b_bytes) for c in d.comm_bytes] == [("ALL_REDUCE", 1708288, 793088)]
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["schema"] == DIFF_SCHEMA and doc["identical"] is False
    text = "\n".join(d.lines())
    assert "job.script" in text and "resized pg '0' #0 ALL_REDUCE" in text and "B is slower" in text


def test_controlled_edit_is_found(tmp_path: Path) -> None:
    state = {"resized": False}

    def edit(rank: int, node: pb.Node) -> None:
        if rank != 0:
            return
        if node.name in ("aten::addmm", "aten::linear"):  # this trace records aten::linear (addmm folded in)
            node.duration_micros *= 2
        if node.type == pb.COMM_COLL_NODE and not state["resized"]:
            size = find_attr(node, "comm_size")
            assert size is not None
            size.int64_val = 4096
            state["resized"] = True

    edited = _rewrite(MLP, tmp_path / "edited", edit)
    d = diff_bundles(MLP, edited)
    assert [(c.pg_name, c.position, c.comm_type, c.a_bytes, c.b_bytes, c.ranks) for c in d.collectives_resized] == \
           [("0", 0, "ALL_REDUCE", 1181952, 4096, (0,))]
    assert not d.collectives_added and not d.collectives_removed
    assert not d.operators_added and not d.operators_removed and not d.operators_count_changed
    top = d.operators[0]
    assert top.name == "aten::linear" and top.family == "matmul" and top.delta_us > 0
    assert [o.name for o in d.operators if o.delta_us] == ["aten::linear"]
    assert d.families[0].family == "matmul" and d.families[0].delta_us == pytest.approx(top.delta_us)
    assert any("matmul compute" in v for v in d.verdict)
    assert {c.key for c in d.environment} <= {"version"}  # rewritten at the current manifest version


def test_different_world_size_and_anonymized(tmp_path: Path) -> None:
    m = read_manifest(MLP)
    job = {**m.job, "world_size": 1, "ranks_recorded": [0], "process_groups": {"0": [0]}}
    one = _rewrite(MLP, tmp_path / "one", lambda rank, node: None, ranks=(0,), job=job,
                   anonymized={"level": "names", "key_id": "k"})
    d = diff_bundles(MLP, one)
    keys = {c.key for c in d.environment}
    assert {"job.world_size", "job.ranks_recorded", "job.process_groups.0", "anonymized.level"} <= keys
    assert any("anonymized" in v for v in d.verdict)
    assert not d.collectives_resized and not d.collectives_added and not d.collectives_removed
    # rank 0 alone vs the average of ranks 0 and 1: pg size 2 -> 1 moves every collective to a new key
    assert {(c.pg_size, c.a_count, c.b_count) for c in d.collective_counts} == {(2, 1, 0), (1, 0, 1)}
    json.dumps(d.to_dict())
    assert d.lines()


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="synthetic_ddp_mlp"):
        diff_bundles(MLP, TRACES / "synthetic_ddp_mlp")
    with pytest.raises(InputNotFoundError, match="nope"):
        diff_bundles(tmp_path / "nope", MLP)
    root = shutil.copytree(MLP, tmp_path / "bad")
    et = root / "trace" / "trace.0.et"
    data = bytearray(et.read_bytes())
    data[300:340] = b"\xff" * 40
    et.write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match=r"trace\.0\.et"):
        diff_bundles(MLP, root)
