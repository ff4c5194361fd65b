"""``nbox_trace.bundle.anonymize``: names hashed consistently, replay unchanged, planted secrets gone (no torch, no
ranks)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from nbox_replay.replay import ReplayConfig, run_replay
from nbox_trace.bundle.anonymize import LEVELS, AnonymizeConfig, AnonymizeError, anonymize_bundle, find_strings
from nbox_trace.bundle.manifest import Manifest, read_manifest, trace_prefix, verify_files, write_bundle
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import attr_map, set_attr
from nbox_trace.chakra.codec import EtWriter, read_et
from nbox_trace.check import inspect_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SHIPPED = ["ddp_mlp", "ddp_transformer", "fsdp2_transformer"]
KEY = b"k" * 32
STANDARD_NS = ("aten::", "c10d::", "fsdp::", "prim::")


def _tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _predicted_us(bundle: Path) -> tuple[float, float]:
    rep = run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", iterations=1)).to_dict()
    return rep["baseline"]["iteration_us"]["median"], rep["what_if"]["iteration_us"]["median"]


def _problems(bundle: Path) -> int:
    return inspect_trace(trace_prefix(bundle), comm_group=bundle / "comm_group.json").problem_count()


def _standard_ops(bundle: Path) -> list[tuple[str, str]]:
    """(name, op_schema) of every standard operator, nodes and nbox_children alike, in file order."""
    out = []
    for rank in (0, 1):
        _, nodes = read_et(trace_prefix(bundle).with_name(f"trace.{rank}.et"))
        for n in nodes:
            attrs = attr_map(n.attr)
            if n.name.startswith(STANDARD_NS):
                out.append((n.name, str(attrs["op_schema"].value) if "op_schema" in attrs else ""))
            if "nbox_children" in attrs:
                for c in json.loads(str(attrs["nbox_children"].value)):
                    if c["name"].startswith(STANDARD_NS):
                        out.append((c["name"], c["op_schema"]))
    return out


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_bundle_anonymizes_and_replays_identically(tmp_path: Path, name: str, level: str) -> None:
    src = TRACES / name
    before = _tree_digest(src)
    out = tmp_path / "anon"
    res = anonymize_bundle(src, out, AnonymizeConfig(level=level, key=KEY))
    assert _tree_digest(src) == before  # the input is never modified
    assert res.out == out and res.level == level and res.dropped_shapes == (level == "strict")
    assert res.key_id == hashlib.sha256(KEY).hexdigest()[:12] and KEY.hex() not in (out / "manifest.json").read_text()
    manifest = read_manifest(out)
    assert verify_files(out, manifest) == []
    assert _problems(out) <= _problems(src)
    assert manifest.anonymized == {"level": level, "key_id": res.key_id, "nbox": "0.1.0"}
    assert manifest.kind == read_manifest(src).kind
    assert (manifest.extra.get("replay_compute") == "recorded") == (level == "strict")
    assert _predicted_us(out) == _predicted_us(src)
    original = read_manifest(src)
    secrets = [original.hardware["hostname"], original.job["script"]]
    assert find_strings(src, secrets)  # they were there ...
    assert find_strings(out, secrets) == []  # ... and are gone
    assert _standard_ops(out) == _standard_ops(src)  # names and schemas, at both levels
    if level == "names" and name.startswith("ddp_"):  # nothing in a DDP trace is user-named: not a byte changes
        assert all((out / f).read_bytes() == (src / f).read_bytes() for f in ("trace/trace.0.et", "trace/trace.1.et"))
    assert res.kept_operators > 0


def test_the_same_key_gives_byte_identical_output_and_another_key_other_tokens(tmp_path: Path) -> None:
    src = TRACES / "fsdp2_transformer"
    a = anonymize_bundle(src, tmp_path / "a", AnonymizeConfig(key=KEY)).out
    b = anonymize_bundle(src, tmp_path / "b", AnonymizeConfig(key=KEY)).out
    c = anonymize_bundle(src, tmp_path / "c", AnonymizeConfig(key=b"z" * 32)).out
    assert _tree_digest(a) == _tree_digest(b)
    ma, mc = read_manifest(a), read_manifest(c)
    assert ma.hardware["hostname"].startswith("anon_") and mc.hardware["hostname"].startswith("anon_")
    assert ma.hardware["hostname"] != mc.hardware["hostname"] and ma.job["script"] != mc.job["script"]
    assert (a / "trace" / "trace.0.et").read_bytes() != (c / "trace" / "trace.0.et").read_bytes()  # module paths
    r1 = anonymize_bundle(src, tmp_path / "r1")
    r2 = anonymize_bundle(src, tmp_path / "r2")
    assert r1.key_id != r2.key_id  # no key: a random one each time


# -- a synthetic bundle with planted secrets ------------------------------------------------------

SECRETS = ["secretco", "fused_attention_v7", "ProjectNightingale", "Nightingale", "nightingale", "block3",
           "/home/alice", "secret_weights", "alice", "sk-SECRET123", "gpu-node-alice-17"]
SCHEMA = "secretco::fused_attention_v7(Tensor q, str weights_path, int heads=8) -> Tensor"
LINEAR = "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"
MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"


def _n(nid: int, name: str, ntype: int = pb.COMP_NODE, deps: tuple[int, ...] = (), dur: int = 100,
       io: tuple[str, str, str] = ("", "", ""), **attrs: Any) -> pb.Node:
    node = pb.Node(id=nid, name=name, type=ntype, duration_micros=dur)  # type: ignore[arg-type]
    node.data_deps.extend(deps)
    node.inputs.values, node.inputs.shapes, node.inputs.types = io
    out = node.outputs
    out.values, out.shapes, out.types = '[[9,9,0,64,4,"cpu"]]', "[[8,8]]", '["Tensor(float)"]'
    for k, v in attrs.items():
        set_attr(node, k, v)
    return node


def _synthetic(root: Path) -> Path:
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "ranks": [], "group_size": 2,
            "group_count": 2},
           {"pg_name": "tp_group_nightingale", "pg_desc": "nightingale_tp", "backend_config": "cpu:gloo",
            "ranks": [0, 1], "group_size": 2, "group_count": 2}]
    tensor = '[1,2,0,64,4,"cpu"]'
    children = [{"name": "secretco::fused_attention_v7", "op_schema": SCHEMA, "et_id": 40,
                 "inputs": {"values": [[1, 2, 0, 64, 4, "cpu"], "/home/alice/secret_weights.bin", 8],
                            "shapes": [[8, 8], [], []], "types": ["Tensor(float)", "String", "Int"]},
                 "outputs": {"values": [], "shapes": [], "types": []}, "input_strides": [[8, 1], [], []]},
                {"name": "aten::mm", "op_schema": MM, "et_id": 41,
                 "inputs": {"values": [[1, 2, 0, 64, 4, "cpu"], [3, 4, 0, 64, 4, "cpu"]], "shapes": [[8, 8], [8, 8]],
                            "types": ["Tensor(float)", "Tensor(float)"]},
                 "outputs": {"values": [], "shapes": [], "types": []}, "input_strides": [[8, 1], [8, 1]]}]
    (root / "src" / "trace").mkdir(parents=True)
    files: dict[str, Path | bytes] = {}
    for rank in (0, 1):
        nodes = [
            _n(0, "## process_group:init ##", pb.METADATA_NODE, io=(json.dumps(pgs), "[[]]", '["String"]')),
            _n(1, "aten::linear", deps=(0,), io=(f"[{tensor},{tensor},\"<None>\"]", "[[8,8],[8,8],[]]",
                                                 '["Tensor(float)","Tensor(float)","None"]'),
               op_schema=LINEAR, nbox_input_strides="[[8,1],[8,1],[]]", nbox_output_strides="[[8,1]]",
               nbox_annotation="ProjectNightingale/block3", nbox_iteration=1),
            _n(2, "profiler::_record_function_enter_new", deps=(1,), dur=1,
               io=('["ProjectNightingale","<None>"]', "[[],[]]", '["String","None"]'),
               op_schema="profiler::_record_function_enter_new(str name, str? args=None) -> "
                         "__torch__.torch.classes.profiler._RecordFunction"),
            _n(3, "secretco::fused_attention_v7", deps=(2,),
               io=(f'[{tensor},"/home/alice/secret_weights.bin",8]', "[[8,8],[],[]]",
                   '["Tensor(float)","String","Int"]'),
               op_schema=SCHEMA, nbox_input_strides="[[8,1],[],[]]", nbox_output_strides="[[8,1]]",
               nbox_annotation="ProjectNightingale/block3/Optimizer.step#SGD.step", nbox_iteration=1),
            _n(4, "NightingaleFn", deps=(3,), io=(f"[{tensor}]", "[[8,8]]", '["Tensor(float)"]'), op_schema=""),
            _n(5, "c10d::allreduce_", pb.COMM_COLL_NODE, deps=(4,), dur=50,
               io=(f'[[{tensor}],"<Object>"]', "[[[8,8]],[]]", '["GenericList[Tensor(float)]","Object"]'),
               is_cpu_op=False, comm_type=0, comm_size=4096, pg_name="tp_group_nightingale", nbox_op="allreduce_",
               nbox_pg_desc="nightingale_tp", nbox_dtype="float32",
               op_schema="c10d::allreduce_(Tensor[] tensors) -> ()"),
            _n(6, "autograd::engine::evaluate_function: NightingaleFnBackward", deps=(5,),
               io=(f"[{tensor}]", "[[8,8]]", '["Tensor(float)"]'), op_schema="",
               nbox_children=json.dumps(children), nbox_note="written by alice on gpu-node-alice-17"),
            _n(7, "autograd::engine::evaluate_function: AddmmBackward0", deps=(6,),
               io=(f"[{tensor}]", "[[8,8]]", '["Tensor(float)"]'), op_schema=""),
            _n(8, "c10d::allreduce_", pb.COMM_COLL_NODE, deps=(7,), dur=50,
               io=(f'[[{tensor}],"<Object>"]', "[[[8,8]],[]]", '["GenericList[Tensor(float)]","Object"]'),
               is_cpu_op=False, comm_type=0, comm_size=8192, pg_name="0", nbox_op="allreduce_"),
            _n(9, "aten::from_file", deps=(8,), io=('["/home/alice/secret_weights.bin",true,64]', "[[],[],[]]",
                                                    '["String","Bool","Int"]'),
               op_schema="aten::from_file(str filename, bool? shared=None, int? size=0) -> Tensor"),
        ]
        meta = pb.GlobalMetadata(version="1.0.0")
        set_attr(meta, "nbox_rank", rank)
        set_attr(meta, "nbox_host", "gpu-node-alice-17")
        path = root / "src" / "trace" / f"trace.{rank}.et"
        with EtWriter(path, meta) as w:
            w.write_all(nodes)
        files[f"trace/trace.{rank}.et"] = path
    groups = {"0": [0, 1], "tp_group_nightingale": [0, 1]}
    files["comm_group.json"] = json.dumps(groups).encode()
    manifest = Manifest(
        producer={"nbox": "0.1.0", "torch": "2.13.0+cpu", "backend": "gloo", "python": "3.11.7",
                  "converted_from": ["/home/alice/nightingale/host_et.0.json"]},
        hardware={"hostname": "gpu-node-alice-17", "machine": "x86_64", "device": "cpu", "cpu_count": 2},
        job={"world_size": 2, "ranks_recorded": [0, 1], "process_groups": groups,
             "script": "/home/alice/nightingale/train.py", "args": ["--api-key=sk-SECRET123"],
             "env": {"NIGHTINGALE_TOKEN": "sk-SECRET123"}},
        observed={"iteration_time_us": {"median": 1000.0, "p10": 900.0, "p90": 1100.0, "n": 1}, "rule": "test"},
        capture={"boundary": "optimizer_step", "note": "run by alice for ProjectNightingale"},
    )
    return write_bundle(root / "bundle", manifest, files)


@pytest.mark.parametrize("level", LEVELS)
def test_planted_secrets_are_gone_and_standard_ops_stay(tmp_path: Path, level: str) -> None:
    src = _synthetic(tmp_path)
    assert {s for _, s in find_strings(src, SECRETS)} == set(SECRETS)  # every secret was planted
    out = anonymize_bundle(src, tmp_path / "anon", AnonymizeConfig(level=level, key=KEY))
    assert find_strings(out.out, SECRETS) == []
    assert verify_files(out.out, read_manifest(out.out)) == []
    assert _problems(out.out) <= _problems(src)
    assert _predicted_us(out.out) == _predicted_us(src)
    assert {"operator", "annotation", "process_group", "path", "host", "arg", "string_value"} <= set(out.replaced)

    tensor = '[1,2,0,64,4,"cpu"]'
    _, nodes = read_et(out.out / "trace" / "trace.0.et")
    by_id = {n.id: n for n in nodes}
    attrs = {n.id: attr_map(n.attr) for n in nodes}
    assert by_id[1].name == "aten::linear" and attrs[1]["op_schema"].value == LINEAR
    assert by_id[2].name == "profiler::_record_function_enter_new"
    assert by_id[5].name == by_id[8].name == "c10d::allreduce_"
    assert by_id[7].name == "autograd::engine::evaluate_function: AddmmBackward0"
    assert by_id[9].name == "aten::from_file" and str(attrs[9]["op_schema"].value).startswith("aten::from_file(")
    custom = by_id[3].name
    assert custom.startswith("anon_") and attrs[3]["op_schema"].value == custom  # the schema is the same token
    assert by_id[6].name.startswith("autograd::engine::evaluate_function: anon_")
    assert by_id[4].name.startswith("anon_")
    children = json.loads(str(attrs[6]["nbox_children"].value))
    assert children[0]["name"] == children[0]["op_schema"] == custom  # same token in nbox_children
    assert children[1]["name"] == "aten::mm" and children[1]["op_schema"] == MM
    ann = str(attrs[3]["nbox_annotation"].value).split("/")
    assert ann[0].startswith("anon_") and ann[1].startswith("anon_") and ann[2] == "Optimizer.step#SGD.step"
    assert str(attrs[1]["nbox_annotation"].value) == "/".join(ann[:2])
    pg = str(attrs[5]["pg_name"].value)
    assert pg.startswith("anon_") and attrs[8]["pg_name"].value == "0"
    assert set(json.loads((out.out / "comm_group.json").read_text())) == {"0", pg}
    manifest = read_manifest(out.out)
    assert set(manifest.job["process_groups"]) == {"0", pg}
    assert json.loads(by_id[0].inputs.values)[1]["pg_name"] == pg
    assert attrs[5]["comm_size"].value == 4096 and attrs[8]["comm_size"].value == 8192
    assert by_id[1].duration_micros == 100 and list(by_id[8].data_deps) == [7]
    assert by_id[1].inputs.types == '["Tensor(float)","Tensor(float)","None"]'
    if level == "strict":
        assert manifest.extra["replay_compute"] == "recorded" and out.dropped_shapes
        for n in nodes[1:]:
            assert n.inputs.shapes == n.inputs.values == n.outputs.shapes == n.outputs.values == ""
            assert "nbox_input_strides" not in attr_map(n.attr) and "nbox_output_strides" not in attr_map(n.attr)
        assert all(c["inputs"]["shapes"] == [] and c["inputs"]["values"] == [] and "input_strides" not in c
                   for c in children)
        assert children[1]["inputs"]["types"] == ["Tensor(float)", "Tensor(float)"]
    else:
        assert by_id[1].inputs.shapes == "[[8,8],[8,8],[]]"
        assert attrs[1]["nbox_input_strides"].value == "[[8,1],[8,1],[]]"
        assert json.loads(by_id[3].inputs.values)[1].startswith("anon_")
        assert json.loads(by_id[2].inputs.values) == [ann[0], "<None>"]  # a record_function name: its scope token
        assert json.loads(by_id[9].inputs.values)[0].startswith("anon_")  # a path, even for an aten operator
        assert by_id[5].inputs.values == f'[[{tensor}],"<Object>"]'
        assert by_id[1].outputs.values == '[[9,9,0,64,4,"cpu"]]'


def test_a_bundle_that_does_not_verify_or_bad_options_are_refused(tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(TRACES / "ddp_mlp", copy)
    et = copy / "trace" / "trace.0.et"
    data = bytearray(et.read_bytes())
    data[-1] ^= 0xFF
    et.write_bytes(bytes(data))
    with pytest.raises(AnonymizeError, match=r"does not verify.*trace/trace\.0\.et"):
        anonymize_bundle(copy, tmp_path / "out", AnonymizeConfig(key=KEY))
    assert not (tmp_path / "out").exists()
    with pytest.raises(AnonymizeError, match="level 'loose'"):
        AnonymizeConfig(level="loose")
    with pytest.raises(AnonymizeError, match="at least 16 bytes"):
        AnonymizeConfig(key=b"short")
    with pytest.raises(AnonymizeError, match="must not be the input"):
        anonymize_bundle(TRACES / "ddp_mlp", TRACES / "ddp_mlp", overwrite=True)
