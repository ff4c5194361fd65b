"""Tests of nbox_record.convert.assemble: host ET (+ Kineto, + collectives.json) -> Chakra ET nodes.

Facts are checked against the input JSON read independently here (plain ``json``), never against
the converter's own readers. Groups:

* the Megatron TP8 NCCL pair (record_param_comms, GPU kernels, order-based Kineto join);
* the CPU/gloo pipeline sample: fallback from the c10d ops' inputs (path 3) and nbox's own
  ``collectives.json`` (path 2, built here), including a log that disagrees with the ET;
* Chakra's own reader on the written files (subprocess: its protobuf package clashes with ours);
* crafted host ETs: nesting rules, dependencies, deep chains, bad input.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nbox_record.convert.assemble import RankConversion, convert_rank
from nbox_record.convert.groups import SINGLETON_PG_BASE
from nbox_record.sources.hostet import schema_arg_names
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import attr_map
from nbox_trace.chakra.codec import read_et, write_et
from nbox_trace.check import inspect_trace
from nbox_trace.errors import InputNotFoundError, InvalidInputError, NboxError

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "samples"
MEGATRON = SAMPLES / "pytorch_et" / "megatron_tp8_nccl"
GLOO = SAMPLES / "cpu_gloo_official_pipeline"
#: The samples are part of the repository: a test that needs them fails, not skips, without them.
needs_samples = pytest.mark.usefixtures("samples")


# -- helpers ----------------------------------------------------------------------------------------
def load(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def attrs(node: pb.Node) -> dict[str, Any]:
    return {k: v.value for k, v in attr_map(node.attr).items()}


def raw_attr(node: dict[str, Any], name: str) -> Any:
    """An attribute of a raw host-ET node in either layout (1.0.1 flat keys, or the attrs list)."""
    if name in node:
        return node[name]
    return next((a["value"] for a in node.get("attrs", []) if a["name"] == name), None)


def raw_inputs(node: dict[str, Any]) -> list[Any]:
    return node["inputs"]["values"] if isinstance(node["inputs"], dict) else node["inputs"]


def buffer_bytes(value: Any) -> int:
    """numel * itemsize summed over the tensor values ([id, storage, offset, numel, itemsize, device])."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[5], str):
        return int(value[3]) * int(value[4])
    return sum(buffer_bytes(v) for v in value) if isinstance(value, list) else 0


def comm_nodes(conv: RankConversion) -> list[pb.Node]:
    return [n for n in conv.nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]


def write_ranks(tmp: Path, convs: list[RankConversion]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    for conv in convs:
        write_et(tmp / f"trace.{conv.rank}.et", conv.metadata, conv.nodes)
    return tmp


def check_graph(conv: RankConversion) -> None:
    """Ids unique and increasing, every dependency an earlier node of the file, no empty node."""
    ids = [n.id for n in conv.nodes]
    assert ids == sorted(set(ids))
    seen: set[int] = set()
    for n in conv.nodes:
        assert n.name and n.type != pb.INVALID_NODE
        assert not n.ctrl_deps
        assert set(n.data_deps) <= seen, (n.id, n.name, list(n.data_deps))
        seen.add(n.id)


# -- Megatron TP8 (NCCL, schema 1.0.1) --------------------------------------------------------------
@pytest.fixture(scope="module")
def megatron() -> list[RankConversion]:
    return [convert_rank(MEGATRON / f"megatron_et_{r}.json.gz", MEGATRON / f"megatron_kineto_{r}.json.gz", rank=r)
            for r in (0, 1)]


def megatron_allreduces(rank: int) -> list[tuple[int, int]]:
    """(bytes, group size) of each c10d::allreduce_ in start order, read from the raw JSON."""
    nodes = load(MEGATRON / f"megatron_et_{rank}.json.gz")["nodes"]
    by_parent: dict[int, list[dict[str, Any]]] = {}
    for n in nodes:
        by_parent.setdefault(n["parent"], []).append(n)
    out = []
    for n in sorted((n for n in nodes if n["name"] == "c10d::allreduce_"), key=lambda n: n["rf_id"]):
        rpcs = [c for c in by_parent.get(n["id"], []) if c["name"] == "record_param_comms"]
        assert len(rpcs) == 1 and rpcs[0]["inputs"][4] == "allreduce"
        assert buffer_bytes(rpcs[0]["inputs"][0]) == buffer_bytes(n["inputs"][0])
        out.append((buffer_bytes(n["inputs"][0]), rpcs[0]["inputs"][-1]))  # last input: the group size
    return out


@needs_samples
@pytest.mark.parametrize("rank", [0, 1])
def test_megatron_85_allreduces_with_their_real_sizes_and_groups(megatron: list[RankConversion], rank: int) -> None:
    conv = megatron[rank]
    raw = load(MEGATRON / f"megatron_et_{rank}.json.gz")["nodes"]
    rpc_names = Counter(n["inputs"][4 if n["inputs"] and isinstance(n["inputs"][0], list) else 3]
                        for n in raw if n["name"] == "record_param_comms")
    assert rpc_names == {"allreduce": 85, "wait": 85}  # why 170: one wait per collective

    expected = megatron_allreduces(rank)
    comms = comm_nodes(conv)
    assert len(comms) == 85 == len(expected)
    assert all(n.type == pb.COMM_COLL_NODE and n.name == "c10d::allreduce_" for n in comms)
    a = [attrs(n) for n in comms]
    assert all(x["comm_type"] == pb.ALL_REDUCE and x["is_cpu_op"] is False for x in a)
    assert [x["comm_size"] for x in a] == [size for size, _ in expected]
    assert sum(x["comm_size"] for x in a) == 5435916288 + 4
    # the TP group is all 8 ranks (= the world): "0"; the one group of size 1 is this rank alone
    for x, (_, group_size) in zip(a, expected, strict=True):
        assert x["pg_name"] == ("0" if group_size == 8 else str(SINGLETON_PG_BASE + rank))
    assert conv.process_groups == {"0": list(range(8)), str(SINGLETON_PG_BASE + rank): [rank]}
    assert conv.stats["comm_source_record_param_comms"] == 85
    assert conv.stats["comm_nodes"] == 85
    assert {x["nbox_dtype"] for x in a} == {"float16", "float32"}
    meta = attrs_of_metadata(conv)
    assert meta["schema"] == "1.0.1" and meta["nbox_producer"].endswith(" convert")
    assert conv.metadata.version == "1.0.0"


def attrs_of_metadata(conv: RankConversion) -> dict[str, Any]:
    return {k: v.value for k, v in attr_map(conv.metadata.attr).items()}


@needs_samples
def test_megatron_written_traces_validate_clean_across_ranks(megatron: list[RankConversion], tmp_path: Path) -> None:
    for conv in megatron:
        check_graph(conv)
    report = inspect_trace(write_ranks(tmp_path, megatron))
    assert [p.to_dict() for p in report.all_problems()] == []
    for r in report.ranks:
        coll = {(c.pg_name, c.comm_type): c.count for c in r.collectives}
        assert coll == {("0", "ALL_REDUCE"): 84, (str(SINGLETON_PG_BASE + r.rank), "ALL_REDUCE"): 1}


@needs_samples
def test_megatron_host_ops_joined_to_kineto_and_top_level_only(megatron: list[RankConversion]) -> None:
    conv = megatron[0]
    assert attrs_of_metadata(conv)["nbox_kineto_join"] == "order"  # this Kineto has no Record function id
    assert conv.stats["kineto_unmatched"] == 0
    cpu = [n for n in conv.nodes if n.type == pb.COMP_NODE and attrs(n)["is_cpu_op"]]
    names = Counter(n.name for n in cpu)
    # aten::matmul, aten::t, aten::mm live inside the autograd Function wrapper: not top-level
    assert names["LinearWithGradAccumulationAndAsyncCommunication"] == 161
    assert not {"aten::mm", "aten::t", "record_param_comms", "nccl:all_reduce", "c10d::allreduce_"} & set(names)
    assert all(n.duration_micros > 0 or attrs(n).get("nbox_untimed") is None for n in cpu)


@needs_samples
def test_megatron_gpu_kernels_keep_stream_order_and_launchers(megatron: list[RankConversion]) -> None:
    conv = megatron[0]
    kineto = load(MEGATRON / "megatron_kineto_0.json.gz")["traceEvents"]
    gpu_events = [e for e in kineto if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    nccl = [e for e in gpu_events if e["name"].startswith("ncclDevKernel")]
    assert len(nccl) == 84 and {e["args"]["stream"] for e in nccl} == {24}
    gpu = [n for n in conv.nodes if n.type == pb.COMP_NODE and attrs(n)["is_cpu_op"] is False]
    assert len(gpu) == len(gpu_events) - len(nccl) == conv.stats["gpu_nodes"]  # NCCL kernels fold into comms
    comms = comm_nodes(conv)
    assert sum(1 for c in comms if attrs(c).get("nbox_stream") == 24) == 84
    by_id = {n.id: n for n in conv.nodes}
    last_on_stream: dict[int, int] = {}
    for n in conv.nodes:
        stream = attrs(n).get("nbox_stream")
        if stream is None:
            continue
        if stream in last_on_stream:
            assert last_on_stream[stream] in n.data_deps, f"node {n.id} does not follow stream {stream}'s previous op"
        last_on_stream[stream] = n.id
        if n.type == pb.COMP_NODE:  # a kernel: launched by a host operator
            assert any(attrs(by_id[d]).get("is_cpu_op") for d in n.data_deps), n.name
    # each stream's nodes are in start order
    for stream in (7, 24):
        starts = [n.start_time_micros for n in conv.nodes if attrs(n).get("nbox_stream") == stream]
        assert starts == sorted(starts)


# -- CPU / gloo sample --------------------------------------------------------------------------------
def gloo_c10d(rank: int) -> list[dict[str, Any]]:
    """The c10d:: nodes of the gloo host ET in start (rf_id) order."""
    nodes = load(GLOO / f"host.{rank}.json")["nodes"]
    return sorted((n for n in nodes if n["name"].startswith("c10d::")), key=lambda n: raw_attr(n, "rf_id"))


@pytest.fixture(scope="module")
def gloo() -> list[RankConversion]:
    return [convert_rank(GLOO / f"host.{r}.json", GLOO / f"device.{r}.json", rank=r) for r in (0, 1)]


@needs_samples
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_fallback_derives_collectives_from_c10d_inputs(gloo: list[RankConversion], rank: int) -> None:
    conv = gloo[rank]
    raw = gloo_c10d(rank)
    comms = comm_nodes(conv)
    assert [n.name for n in comms] == [n["name"] for n in raw]
    assert conv.stats["comm_source_host_et_inputs"] == len(raw) == 16
    assert attrs_of_metadata(conv)["nbox_comm_source"] == "host_et_inputs"
    allreduce = [n for n in comms if attrs(n).get("comm_type") == pb.ALL_REDUCE]
    expected = [buffer_bytes(raw_inputs(n)[0]) for n in raw if n["name"] == "c10d::allreduce_"]
    assert [attrs(n)["comm_size"] for n in allreduce] == expected == [164416 * 4, 1024 * 4] * 2
    # the DDP gradient all-reduces (async, inside autograd's AccumulateGrad) are among them
    ddp = [n for n in allreduce if attrs(n).get("nbox_async") is True]
    assert [attrs(n)["comm_size"] for n in ddp] == [164416 * 4] * 2
    for n in comms:
        a = attrs(n)
        assert a["is_cpu_op"] is False and a["pg_name"] == "0"
    # all-gather counts this rank's input shard (input_tensors), not the gathered output
    gathers = [attrs(n)["comm_size"] for n in comms if attrs(n).get("comm_type") == pb.ALL_GATHER]
    assert gathers == [1024 * 4] * 2
    p2p = [n for n in comms if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
    assert len(p2p) == 2
    for n in p2p:
        a = attrs(n)
        assert (a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]) == (0, 1, 0, 4096)
        assert n.type == (pb.COMM_SEND_NODE if rank == 0 else pb.COMM_RECV_NODE)
    assert conv.process_groups == {"0": [0, 1]}


@needs_samples
def test_gloo_keeps_top_level_operators_only(gloo: list[RankConversion]) -> None:
    conv = gloo[0]
    names = Counter(n.name for n in conv.nodes if n.type == pb.COMP_NODE)
    assert names["aten::linear"] == 4  # two layers, two iterations
    assert "aten::t" not in names and "aten::addmm" not in names  # children of aten::linear
    assert names["autograd::engine::evaluate_function: AddmmBackward0"] == 4
    assert not [n for n in names if n.startswith(("gloo:", "c10d::", "ProfilerStep", "[pytorch"))]
    assert "DistributedDataParallel.forward" not in names  # an annotation: looked into
    linear = next(n for n in conv.nodes if n.name == "aten::linear")
    a = attrs(linear)
    assert a["op_schema"].startswith("aten::linear(") and a["is_cpu_op"] is True
    assert a["nbox_annotation"] == "DistributedDataParallel.forward" and a["nbox_iteration"] == 1
    assert json.loads(linear.inputs.shapes)[0] == [32, 256] and json.loads(linear.inputs.types)[0] == "Tensor(float)"
    assert json.loads(a["nbox_input_strides"])[0] == [256, 1]
    assert len(json.loads(linear.inputs.values)[0]) == 6  # tensor id, storage id, offset, numel, itemsize, device
    meta = [n for n in conv.nodes if n.type == pb.METADATA_NODE]
    assert [n.name for n in meta] == ["## process_group:init ##"] and meta[0].id == 0
    assert json.loads(meta[0].inputs.values)[0]["pg_name"] == "0"
    # the gloo worker thread's copies inside the all-gathers are the collective's, not operators
    assert conv.stats["dropped_collective_internal"] == 12


@needs_samples
def test_gloo_worker_thread_is_found_from_kineto_markers_the_et_did_not_link(gloo: list[RankConversion],
                                                                            tmp_path: Path) -> None:
    # A recording of a DTensor script sometimes left one of gloo's two worker threads with no marker the ET
    # linked to a collective: its copies then counted as one rank's compute (16 per iteration, 4 runs in 25).
    # The same sample with every gloo: node taken out of the host ET: Kineto's markers alone name the thread.
    host = load(GLOO / "host.0.json")
    host["nodes"] = [n for n in host["nodes"] if not n["name"].startswith("gloo:")]
    stripped = tmp_path / "host.0.json"
    stripped.write_text(json.dumps(host))
    conv = convert_rank(stripped, GLOO / "device.0.json", rank=0)
    assert conv.stats["dropped_collective_internal"] == gloo[0].stats["dropped_collective_internal"] == 12
    compute = Counter(n.name for n in conv.nodes if n.type == pb.COMP_NODE)
    assert compute == Counter(n.name for n in gloo[0].nodes if n.type == pb.COMP_NODE)


@needs_samples
def test_gloo_durations_come_from_kineto(gloo: list[RankConversion]) -> None:
    for conv in gloo:
        matched, unmatched = conv.stats["kineto_matched"], conv.stats["kineto_unmatched"]
        assert matched / (matched + unmatched) >= 0.95
        cpu = [n for n in conv.nodes if n.type == pb.COMP_NODE]
        assert sum(1 for n in cpu if n.duration_micros > 0 and n.start_time_micros > 0) >= 0.9 * len(cpu)
        # the DDP all-reduce lasts as long as gloo's worker thread worked on it, not the CPU call
        ddp = next(n for n in comm_nodes(conv) if attrs(n).get("nbox_async") and attrs(n)["comm_type"] == pb.ALL_REDUCE)
        assert ddp.duration_micros > attrs(ddp)["nbox_cpu_duration_micros"]


@needs_samples
def test_gloo_written_traces_validate_clean(gloo: list[RankConversion], tmp_path: Path) -> None:
    for conv in gloo:
        check_graph(conv)
    report = inspect_trace(write_ranks(tmp_path, gloo))
    assert [p.to_dict() for p in report.all_problems()] == []
    assert report.ranks[0].p2p_sends == report.ranks[1].p2p_recvs == 2


@needs_samples
def test_async_allreduce_does_not_block_the_thread_but_its_reader_waits(gloo: list[RankConversion]) -> None:
    conv = gloo[0]
    nodes = conv.nodes
    i = next(k for k, n in enumerate(nodes) if attrs(n).get("nbox_async") is True and attrs(n)["comm_size"] > 4096)
    comm, before, after = nodes[i], nodes[i - 1], nodes[i + 1]
    assert before.name.endswith("AccumulateGrad") and before.id in comm.data_deps
    by_id = {n.id: n for n in nodes}
    # its other dependency: the previous collective of its group (one gloo worker runs them in order)
    others = [by_id[d] for d in comm.data_deps if d != before.id]
    assert [(n.type, attrs(n)["pg_name"]) for n in others] == [(pb.COMM_COLL_NODE, "0")]
    assert before.id in after.data_deps  # the thread went on after issuing
    assert comm.id in after.data_deps  # the next op touches the bucket: it waits for the all-reduce


# -- collectives.json (path 2) ------------------------------------------------------------------------
KIND = {"allreduce_": "ALL_REDUCE", "broadcast_": "BROADCAST", "allgather_": "ALL_GATHER",
        "alltoall_base_": "ALL_TO_ALL", "send": "SEND", "recv_": "RECV", "barrier": "BARRIER"}


def build_log(rank: int) -> dict[str, Any]:
    """A collectives.json as nbox's bootstrap would write it for the gloo sample (sizes read from the ET)."""
    records = []
    for seq, n in enumerate(gloo_c10d(rank)):
        op = n["name"].removeprefix("c10d::")
        vals = raw_inputs(n)
        inp = vals[1] if op in ("allgather_", "alltoall_base_") else vals[0]
        kind = KIND[op]
        peer = vals[2] if kind in ("SEND", "RECV") else None
        issue = 1.7e15 + 1000.0 * seq
        records.append({
            "seq": seq, "op": op, "comm_type": kind, "pg_name": "0", "dtype": "float32",
            "in_numel": buffer_bytes(inp) // 4, "out_numel": buffer_bytes(inp) // 4, "elem_bytes": 4,
            "comm_bytes": 0 if kind == "BARRIER" else buffer_bytes(inp), "in_split_sizes": [], "out_split_sizes": [],
            "peer": peer, "tag": 0 if peer is not None else None, "root": 0 if kind == "BROADCAST" else None,
            "async_op": bool(op in ("allreduce_", "broadcast_") and vals[4] is True),
            "issue_us": issue, "wait_us": None, "done_us": issue + 250.0 + seq,
        })
    return {"version": 1, "rank": rank, "world_size": 2,
            "process_groups": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1], "backend": "gloo"}],
            "collectives": records}


@needs_samples
def test_collectives_json_is_joined_in_order(tmp_path: Path) -> None:
    convs = []
    for rank in (0, 1):
        log = build_log(rank)
        path = tmp_path / f"collectives.{rank}.json"
        path.write_text(json.dumps(log))
        conv = convert_rank(GLOO / f"host.{rank}.json", GLOO / f"device.{rank}.json", rank=rank, collectives=path)
        comms = comm_nodes(conv)
        assert conv.stats["comm_source_collectives_json"] == len(comms) == 16
        assert attrs_of_metadata(conv)["nbox_comm_source"] == "collectives.json"
        for n, rec in zip(comms, log["collectives"], strict=True):
            a = attrs(n)
            assert a["nbox_comm_source"] == "collectives.json" and a["nbox_op"] == rec["op"]
            assert a["comm_size"] == rec["comm_bytes"] and a["nbox_async"] == rec["async_op"]
        convs.append(conv)
        # without Kineto, times come from the log: issue time, done - issue
        bare = convert_rank(GLOO / f"host.{rank}.json", None, rank=rank, collectives=path)
        for n, rec in zip(comm_nodes(bare), log["collectives"], strict=True):
            assert n.start_time_micros == round(rec["issue_us"])
            assert n.duration_micros == round(rec["done_us"] - rec["issue_us"])
        assert bare.stats["kineto_matched"] == 0
    report = inspect_trace(write_ranks(tmp_path / "et", convs))
    assert [p.to_dict() for p in report.all_problems()] == []


@needs_samples
def test_recorded_wait_makes_the_waiting_operator_depend_on_the_async_collective(tmp_path: Path) -> None:
    log, path = build_log(0), tmp_path / "collectives.json"
    path.write_text(json.dumps(log))
    first = convert_rank(GLOO / "host.0.json", GLOO / "device.0.json", rank=0, collectives=path)
    i = next(k for k, n in enumerate(first.nodes) if attrs(n).get("nbox_async") and attrs(n)["comm_size"] > 4096)
    comm, waiter = first.nodes[i], first.nodes[i + 6]
    assert comm.id not in waiter.data_deps and waiter.type == pb.COMP_NODE
    seq = next(k for k, n in enumerate(comm_nodes(first)) if n.id == comm.id)
    log["collectives"][seq]["wait_us"] = float(waiter.start_time_micros)
    path.write_text(json.dumps(log))
    again = convert_rank(GLOO / "host.0.json", GLOO / "device.0.json", rank=0, collectives=path)
    assert comm.id in again.nodes[waiter.id].data_deps and again.stats["wait_deps"] == 1
    assert all(comm.id not in n.data_deps for n in again.nodes[i + 2:i + 6])


@needs_samples
def test_collectives_json_that_disagrees_with_the_host_et_is_refused(tmp_path: Path) -> None:
    host, path = GLOO / "host.0.json", tmp_path / "collectives.json"
    log = build_log(0)
    log["collectives"][5]["op"] = "reduce_scatter_"
    path.write_text(json.dumps(log))
    with pytest.raises(InvalidInputError) as err:
        convert_rank(host, None, rank=0, collectives=path)
    text = str(err.value)
    et_name = gloo_c10d(0)[5]["name"]
    assert "reduce_scatter_" in text and et_name in text and str(path) in text and str(host) in text

    log = build_log(0)
    del log["collectives"][-1]
    path.write_text(json.dumps(log))
    with pytest.raises(InvalidInputError, match="absent from the log"):
        convert_rank(host, None, rank=0, collectives=path)

    log = build_log(0)
    log["collectives"][0]["comm_bytes"] = "lots"
    path.write_text(json.dumps(log))
    with pytest.raises(InvalidInputError, match=r"collectives\[0\]\.comm_bytes"):
        convert_rank(host, None, rank=0, collectives=path)

    path.write_text(json.dumps(build_log(1)))
    with pytest.raises(InvalidInputError, match="rank 1"):
        convert_rank(host, None, rank=0, collectives=path)


# -- Chakra's own reader -----------------------------------------------------------------------------
_CHAKRA = importlib.util.find_spec("chakra")
CHAKRA_COUNT = r"""
import json, sys
from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
out = {}
for path in json.load(sys.stdin):
    f = openFileRd(path)
    decodeMessage(f, GlobalMetadata())
    n = 0
    types = {}
    while True:
        node = Node()
        if not decodeMessage(f, node):
            break
        n += 1
        types[node.type] = types.get(node.type, 0) + 1
    f.close()
    out[path] = {"nodes": n, "types": types}
json.dump(out, sys.stdout)
"""


@needs_samples
@pytest.mark.skipif(_CHAKRA is None, reason="mlc-chakra is not installed")
def test_chakra_reader_decodes_the_converted_files(megatron: list[RankConversion], gloo: list[RankConversion],
                                                   tmp_path: Path) -> None:
    write_ranks(tmp_path / "meg", megatron)
    write_ranks(tmp_path / "gloo", gloo)
    paths = sorted(str(p) for p in tmp_path.rglob("*.et"))
    proc = subprocess.run([sys.executable, "-I", "-c", CHAKRA_COUNT], input=json.dumps(paths), capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    for conv, sub in [(c, "meg") for c in megatron] + [(c, "gloo") for c in gloo]:
        got = seen[str(tmp_path / sub / f"trace.{conv.rank}.et")]
        assert got["nodes"] == len(conv.nodes)
        assert got["types"] == {str(t): k for t, k in Counter(n.type for n in conv.nodes).items()}


# -- crafted host ETs ---------------------------------------------------------------------------------
def et_node(nid: int, name: str, parent: int, *, rf: int, tid: int = 1, scope: int = 0, schema: str = "",
            inputs: list[Any] | None = None, types: list[str] | None = None, outputs: list[Any] | None = None,
            extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ins = inputs or []
    outs = outputs or []
    return {
        "id": nid, "name": name, "ctrl_deps": parent,
        "inputs": {"values": ins, "shapes": [[]] * len(ins), "types": types or ["Int"] * len(ins),
                   "strides": [[]] * len(ins)},
        "outputs": {"values": outs, "shapes": [[]] * len(outs), "types": ["Tensor(float)"] * len(outs),
                    "strides": [[]] * len(outs)},
        "attrs": [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "tid", "type": "uint64", "value": tid},
                  {"name": "scope", "type": "uint64", "value": scope},
                  {"name": "op_schema", "type": "string", "value": schema}, *(extra or [])],
    }


def write_host(path: Path, nodes: list[dict[str, Any]]) -> Path:
    base = [et_node(1, "[pytorch|profiler|execution_trace|process]", 1, rf=0, scope=7),
            et_node(2, "[pytorch|profiler|execution_trace|thread]", 1, rf=0, scope=7),
            et_node(3, "[pytorch|profiler|execution_trace|thread]", 1, rf=0, tid=2, scope=7)]
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": base + nodes}))
    return path


T = [7, 8, 0, 16, 4, "cpu"]  # a tensor: id 7, storage 8, 16 floats
BARRIER_SCHEMA = "c10d::barrier(Tensor tensor, ProcessGroup process_group, int[] device_ids, bool asyncOp, int timeout)"


def test_crafted_nesting_threads_and_outermost_record_param_comms(tmp_path: Path) -> None:
    nodes = [
        et_node(10, "ProfilerStep#4", 2, rf=1, scope=7),
        et_node(11, "aten::add_", 10, rf=2, schema="aten::add_(Tensor self, Tensor other)", inputs=[T, T],
                types=["Tensor(float)"] * 2, outputs=[T]),
        et_node(12, "aten::mul", 11, rf=3, schema="aten::mul(Tensor self, Tensor other)"),  # child: not top-level
        # a barrier that NCCL implements as an all-reduce: two nested record_param_comms, one collective
        et_node(13, "c10d::barrier", 10, rf=4, schema=BARRIER_SCHEMA, inputs=[[9, 9, 0, 1, 1, "cpu"], "<Object>",
                [], False, -1], types=["Tensor(unsigned char)", "Object", "GenericList[]", "Bool", "Int"]),
        et_node(14, "record_param_comms", 13, rf=5, inputs=[[[9, 9, 0, 1, 1, "cpu"]], 3, ["5", "tp"], 0, "barrier",
                [], [], 0, 2, 2], types=["GenericList[Tensor(unsigned char)]", "Int", "Tuple[String,String]", "Int",
                "String", "GenericList[]", "GenericList[]", "Int", "Int", "Int"]),
        et_node(15, "record_param_comms", 14, rf=6, inputs=[[[9, 9, 0, 1, 1, "cpu"]], 4, ["5", "tp"], 0,
                "allreduce", [], [], 0, 2, 2], types=["GenericList[Tensor(unsigned char)]", "Int",
                "Tuple[String,String]", "Int", "String", "GenericList[]", "GenericList[]", "Int", "Int", "Int"]),
        et_node(16, "record_param_comms", 10, rf=7, inputs=[3, ["", ""], 0, "wait", [], [], -1, -1, 1],
                types=["Int", "Tuple[String,String]", "Int", "String", "GenericList[]", "GenericList[]", "Int",
                       "Int", "Int"]),
        # the backward thread: its first op follows the forward's last one; it reads tensor storage 8
        et_node(20, "autograd::engine::evaluate_function: MulBackward0", 3, rf=8, tid=2),
        et_node(21, "aten::sum", 3, rf=9, tid=2, schema="aten::sum(Tensor self)", inputs=[T],
                types=["Tensor(float)"]),
        et_node(30, "aten::copy_", 10, rf=10, schema="aten::copy_(Tensor self, Tensor src)"),
    ]
    conv = convert_rank(write_host(tmp_path / "host.json", nodes), None, rank=0, world_size=4)
    check_graph(conv)
    names = [n.name for n in conv.nodes]
    assert names == ["## process_group:init ##", "aten::add_", "c10d::barrier",
                     "autograd::engine::evaluate_function: MulBackward0", "aten::sum", "aten::copy_"]
    by = {n.name: n for n in conv.nodes}
    barrier = attrs(by["c10d::barrier"])
    assert barrier["comm_type"] == pb.BARRIER and barrier["comm_size"] == 0
    assert barrier["pg_name"] == "5" and barrier["nbox_pg_desc"] == "tp" and barrier["nbox_seq"] == 3
    assert conv.process_groups == {"5": [0, 2]}  # rank start 0, stride 2, size 2
    assert attrs(by["aten::add_"])["nbox_iteration"] == 4
    assert attrs(by["aten::add_"])["nbox_untimed"] is True and by["aten::add_"].duration_micros == 0
    bwd, fwd_last = by["autograd::engine::evaluate_function: MulBackward0"], by["c10d::barrier"]
    assert list(bwd.data_deps) == [fwd_last.id]  # the thread switch
    assert by["aten::add_"].id in by["aten::sum"].data_deps  # reads what the other thread wrote
    assert by["aten::sum"].id in by["aten::copy_"].data_deps  # back to the first thread
    assert conv.stats["top_level_ops"] == 4 and conv.stats["comm_nodes"] == 1


A2A_SCHEMA = ("c10d::alltoall_base_(Tensor output, Tensor input, ProcessGroup process_group, int[] output_split_sizes, "
              "int[] input_split_sizes, bool asyncOp=True, int timeout=-1) -> Work")


def test_crafted_all_to_all_from_record_param_comms_attributes_and_any_source_recv(tmp_path: Path) -> None:
    out_t, in_t = [20, 21, 0, 16, 4, "cpu"], [22, 23, 0, 16, 4, "cpu"]
    rpc_attrs = [{"name": k, "type": "string" if isinstance(v, str) else "uint64", "value": v} for k, v in {
        "collective_name": "all_to_allv", "dtype": "Float", "in_msg_nelems": 16, "out_msg_nelems": 16,
        "in_split_size": "[1, 3]", "out_split_size": "[2, 2]", "global_rank_start": 0, "global_rank_stride": 1,
        "pg_name": "3", "pg_desc": "ep", "pg_size": 2}.items()]
    nodes = [
        et_node(10, "c10d::alltoall_base_", 2, rf=1, schema=A2A_SCHEMA,
                inputs=[out_t, in_t, "<Object>", [2, 2], [1, 3], False, -1],
                types=["Tensor(float)", "Tensor(float)", "Object", "GenericList[Int,Int]", "GenericList[Int,Int]",
                       "Bool", "Int"]),
        et_node(11, "record_param_comms", 10, rf=2, inputs=[[in_t], 7, ["3", "ep"], 0, "all_to_allv", [1, 3], [2, 2],
                0, 1, 2], types=["GenericList[Tensor(float)]", "Int", "Tuple[String,String]", "Int", "String",
                "GenericList[Int,Int]", "GenericList[Int,Int]", "Int", "Int", "Int"], extra=rpc_attrs),
        et_node(12, "c10d::recv_any_source_", 2, rf=3,
                schema="c10d::recv_any_source_(Tensor[] tensors, ProcessGroup process_group, int tag) -> Work",
                inputs=[[out_t], "<Object>", 5], types=["GenericList[Tensor(float)]", "Object", "Int"]),
    ]
    conv = convert_rank(write_host(tmp_path / "h.json", nodes), None, rank=1)
    check_graph(conv)
    a2a, recv = comm_nodes(conv)
    a = attrs(a2a)
    assert a["comm_type"] == pb.ALL_TO_ALL and a["comm_size"] == 64 and a["pg_name"] == "3"
    assert a["nbox_in_split_sizes"] == [4, 12] and a["nbox_out_split_sizes"] == [8, 8]  # rows -> elements
    assert a["nbox_dtype"] == "float32" and a["nbox_async"] is False and a["nbox_comm_source"] == "record_param_comms"
    assert conv.process_groups == {"3": [0, 1]}
    r = attrs(recv)
    assert recv.type == pb.COMM_RECV_NODE and (r["comm_src"], r["comm_dst"], r["comm_tag"]) == (-1, 1, 5)
    assert r["comm_size"] == 64 and conv.stats["p2p_unknown_peer"] == 1


def test_crafted_iterations_from_nbox_boundary_markers(tmp_path: Path) -> None:
    mark = "## nbox:iteration_boundary ##"
    nodes = [et_node(10, "aten::zeros", 2, rf=1), et_node(11, mark, 2, rf=2, scope=7),
             et_node(12, "aten::mm", 2, rf=3), et_node(13, "aten::relu", 2, rf=4), et_node(14, mark, 2, rf=5, scope=7),
             et_node(15, "aten::mm", 2, rf=6), et_node(16, mark, 2, rf=7, scope=7)]
    conv = convert_rank(write_host(tmp_path / "h.json", nodes), None, rank=0)
    assert [(n.name, attrs(n)["nbox_iteration"]) for n in conv.nodes] == [
        ("aten::zeros", 0), ("aten::mm", 1), ("aten::relu", 1), ("aten::mm", 2)]


def test_crafted_deep_parent_chain_needs_no_recursion(tmp_path: Path) -> None:
    depth = 30_000
    nodes = [et_node(10, "aten::outer", 2, rf=1, schema="aten::outer(Tensor self) -> Tensor")]
    nodes += [et_node(11 + i, "aten::inner", 10 + i, rf=2 + i) for i in range(depth)]
    conv = convert_rank(write_host(tmp_path / "deep.json", nodes), None, rank=0)
    assert [n.name for n in conv.nodes] == ["aten::outer"]
    assert conv.stats["host_nodes"] == depth + 4


def test_schema_argument_names() -> None:
    assert schema_arg_names("c10d::alltoall_base_(Tensor output, Tensor input, __torch__.torch.classes.c10d."
                            "ProcessGroup process_group, int[] output_split_sizes, int[] input_split_sizes, "
                            "bool asyncOp=True, int timeout=-1) -> __torch__.torch.classes.c10d.Work") == [
        "output", "input", "process_group", "output_split_sizes", "input_split_sizes", "asyncOp", "timeout"]
    assert schema_arg_names("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor") == [
        "self", "other", "alpha"]
    assert schema_arg_names("aten::split(Tensor(a -> *) self, SymInt[] split_size, int dim=0) -> Tensor(a)[]") == [
        "self", "split_size", "dim"]
    assert schema_arg_names("") == []


# -- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("content", "message"), [
    (b"{nope", "not valid JSON"),
    (b"[1, 2]", "top level is a list"),
    (b'{"schema": "1.1.1"}', "no 'nodes' list"),
    (b'{"nodes": [{"name": "aten::add"}]}', "node index 0: missing or invalid 'id'"),
    (b'{"nodes": [{"id": 3, "name": "x", "attrs": 5}]}', "node id 3: 'attrs' must be a list"),
    (b'{"nodes": [{"id": 3, "name": "x", "ctrl_deps": "p"}]}', "node id 3: parent"),
    (b'{"nodes": [{"id": 3, "name": "x"}, {"id": 3, "name": "y"}]}', "node id 3: appears twice"),
    (b'{"nodes": [{"id": 3, "name": "x", "inputs": {"values": 7}}]}', "node id 3: 'inputs.values' must be a list"),
    (b"\x1f\x8b\x08\x00garbage", "cannot read"),
    (b'{"nodes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
])
def test_bad_host_et_is_refused_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "host.json"
    path.write_bytes(content)
    with pytest.raises(InvalidInputError) as err:
        convert_rank(path, None, rank=0)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_oversized_input_is_refused_before_parsing(tmp_path: Path) -> None:
    doc = json.dumps({"nodes": [], "pad": "x" * (4 << 20)}).encode()
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(doc))
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(InvalidInputError, match=r"inflates to more than the cap of 1048576 bytes") as err:
        convert_rank(bomb, None, rank=0, max_input_bytes=1 << 20)
    assert str(err.value).startswith(str(bomb))
    plain = tmp_path / "big.json"
    plain.write_bytes(doc)
    with pytest.raises(InvalidInputError, match="over the cap"):
        convert_rank(plain, None, rank=0, max_input_bytes=1 << 20)
    assert convert_rank(bomb, None, rank=0).nodes == []  # under the default cap it reads (and is empty)


@needs_samples
def test_bad_kineto_and_mixed_up_ranks_are_refused(tmp_path: Path) -> None:
    host = GLOO / "host.0.json"
    bad = tmp_path / "kineto.json"
    bad.write_text(json.dumps({"schemaVersion": 1}))
    with pytest.raises(InvalidInputError, match="no 'traceEvents' list") as err:
        convert_rank(host, bad, rank=0)
    assert str(err.value).startswith(str(bad))
    with pytest.raises(InvalidInputError, match="Kineto trace of rank 1"):
        convert_rank(host, GLOO / "device.1.json", rank=0)
    with pytest.raises(InputNotFoundError):
        convert_rank(tmp_path / "missing.json", None, rank=0)
    with pytest.raises(NboxError):
        convert_rank(host, None, rank=-1)
    # malformed events are skipped, not fatal
    events = load(GLOO / "device.0.json")
    events["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": 5, "ts": "x"}, 7, {"ph": "X", "cat": "kernel"}]
    fine = tmp_path / "device.0.json"
    fine.write_text(json.dumps(events))
    assert convert_rank(host, fine, rank=0).stats["kineto_matched"] > 90


def test_written_conversion_round_trips_through_the_codec(tmp_path: Path) -> None:
    nodes = [et_node(10, "aten::relu", 2, rf=1, schema="aten::relu(Tensor self) -> Tensor", inputs=[T],
                     types=["Tensor(float)"], outputs=[T])]
    conv = convert_rank(write_host(tmp_path / "h.json", nodes), None, rank=3)
    path = write_et(tmp_path / "t.3.et", conv.metadata, conv.nodes)
    meta, back = read_et(path)
    assert meta == conv.metadata and back == conv.nodes
    assert attrs_of_metadata(conv)["nbox_rank"] == 3


# -- joining the collective log and the host ET by identity ---------------------------------------------------
def test_align_pairs_in_order_and_skips_only_nested_ops_the_log_did_not_see() -> None:
    from nbox_record.convert.comm import align

    assert align(["allreduce_", "allreduce_"], [False, False], ["allreduce_", "allreduce_"]) == [(0, 0), (1, 1)]
    # a nested op the log did not see is skipped; one it did see is paired (emulate's observer sees all)
    assert align(["allreduce_", "broadcast_", "allreduce_"], [False, True, False],
                 ["allreduce_", "allreduce_"]) == [(0, 0), (2, 1)]
    assert align(["allreduce_", "allreduce_"], [False, True], ["allreduce_", "allreduce_"]) == [(0, 0), (1, 1)]
    # prefer skipping a nested op when both choices pair: the top-level twin later takes the record
    assert align(["allreduce_", "allreduce_"], [True, False], ["allreduce_"]) == [(1, 0)]
    assert align(["allreduce_"], [False], ["allreduce_", "allreduce_"]) is None  # a record the ET lacks
    assert align(["allreduce_", "allreduce_"], [False, False], ["allreduce_"]) is None  # a top-level op unlogged
    assert align(["broadcast_"], [False], ["allreduce_"]) is None
    assert align([], [], []) == []


def test_a_logged_collective_nested_under_an_operator_left_open_by_another_thread_is_joined(tmp_path: Path) -> None:
    """`nbox emulate -o` failed intermittently under load: "lists 2 collectives but the host ET has 1 c10d collective
    ops: the log's #1 is 'allreduce_' (seq 1), absent from the host ET". The ET observer had nested the second
    all-reduce under an operator that another thread's record function left open, so the positional join, which
    counted top-level collectives only, lost it although the log (which sees every call) had it."""
    schema = ("c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, "
              "__torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? sparse_indices, int timeout) -> "
              "(Tensor[], __torch__.torch.classes.c10d.Work)")
    nodes = [
        et_node(10, "aten::mul", 2, rf=1, schema="aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"),
        et_node(11, "c10d::allreduce_", 2, rf=2, schema=schema),
        et_node(12, "aten::add_", 2, rf=3, schema="aten::add_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)"),
        et_node(13, "c10d::allreduce_", 12, rf=4, schema=schema),  # nested under the open add_
    ]
    host = write_host(tmp_path / "host.json", nodes)
    records = [{"seq": s, "op": "allreduce_", "comm_type": "ALL_REDUCE", "pg_name": "0", "dtype": "float32",
                "in_numel": 16, "out_numel": 16, "elem_bytes": 4, "comm_bytes": 64 * (s + 1), "in_split_sizes": [],
                "out_split_sizes": [], "peer": None, "tag": None, "root": None, "async_op": True,
                "issue_us": 1e15 + s, "wait_us": None, "done_us": 1e15 + s + 10} for s in range(2)]
    log = tmp_path / "collectives.json"
    log.write_text(json.dumps({"version": 1, "rank": 0, "world_size": 2, "collectives": records,
                               "process_groups": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1],
                                                   "backend": "gloo"}]}))
    conv = convert_rank(host, None, rank=0, collectives=log)
    assert [attrs(n)["comm_size"] for n in comm_nodes(conv)] == [64, 128]
    assert all(attrs(n)["nbox_comm_source"] == "collectives.json" for n in comm_nodes(conv))
    records.pop()  # the log did not see the nested one (recording: it was issued below autograd): left out
    log.write_text(json.dumps({"version": 1, "rank": 0, "world_size": 2, "collectives": records,
                               "process_groups": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1],
                                                   "backend": "gloo"}]}))
    conv = convert_rank(host, None, rank=0, collectives=log)
    assert [attrs(n).get("nbox_comm_source") for n in comm_nodes(conv)][:1] == ["collectives.json"]


def test_functional_all_to_all_gets_its_output_splits_from_the_input_rows() -> None:
    # _c10d_functional::all_to_all_single has no output argument; its output rows have the input's row size.
    # Without out splits, a live replay of the MoE zoo workload sent 2048 bytes where the peer expected 1536 and
    # gloo aborted the rank (SIGABRT).
    from nbox_record.sources.comms import facts_from_op_inputs
    from nbox_record.sources.hostet import IO, EtNode

    schema = ("_c10d_functional::all_to_all_single(Tensor input, SymInt[] output_split_sizes, "
              "SymInt[] input_split_sizes, str group_name) -> Tensor")
    node = EtNode(id=5, name="_c10d_functional::all_to_all_single", parent=None, rf_id=1, tid=1, scope=0,
                  op_schema=schema, fw_parent=0, seq_id=-1, fw_tid=0,
                  inputs=IO([[7, 8, 0, 24 * 32, 4, "cpu"], [10, 16], [10, 14], "0"], [[24, 32], [], [], []],
                            ["Tensor(float)", "GenericList[Int]", "GenericList[Int]", "String"], None),
                  outputs=IO([], [], [], None), attrs={})
    f = facts_from_op_inputs(node, "ALL_TO_ALL")
    assert f.in_splits == [320, 448] and f.out_splits == [320, 512] and f.size == 24 * 32 * 4
