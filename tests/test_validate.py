"""Tests of nbox_trace.check: trace summaries, per-rank problems and cross-rank checks.

Three groups:

* real traces from other tools (``tests/data/samples``), with facts checked by reading the nodes
  independently of the validator (the samples are part of the repository);
* crafted traces written into ``tmp_path`` with the codec, one defect each;
* a long dependency chain (depth and critical path without recursion).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, deque
from pathlib import Path

import pytest

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import attr_map, make_attr
from nbox_trace.chakra.codec import EtWriter, encode_delimited, read_et, write_et
from nbox_trace.check import (
    MAX_PROBLEMS_PER_CODE,
    REPORT_SCHEMA,
    Problem,
    RankReport,
    TraceReport,
    inspect_rank,
    inspect_trace,
    iter_problem_lines,
)
from nbox_trace.contract import PG_INIT_NODE
from nbox_trace.errors import TraceDecodeError, TraceWriteError

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "samples"
CHAKRA_ET = SAMPLES / "chakra_et"
GLOO = SAMPLES / "cpu_gloo_official_pipeline"

#: The samples are part of the repository: a test that needs them fails, not skips, without them.
needs_samples = pytest.mark.usefixtures("samples")

ONE_MIB = 1 << 20


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

_UNSET = object()


def mk(nid: int, ntype: int = pb.COMP_NODE, *, name: str | None = None, dur: int = 0,
       data: tuple[int, ...] | list[int] = (), ctrl: tuple[int, ...] | list[int] = (),
       is_cpu_op: object = _UNSET, **attrs: object) -> pb.Node:
    """A node with contract-kind attributes. ``is_cpu_op`` defaults to the contract (True on COMP,
    False elsewhere); pass ``None`` to leave it out. Keyword attributes with value None are skipped."""
    node = pb.Node(id=nid, name=name if name is not None else f"n{nid}", type=ntype, duration_micros=dur)
    node.data_deps.extend(data)
    node.ctrl_deps.extend(ctrl)
    if is_cpu_op is _UNSET:
        is_cpu_op = ntype == pb.COMP_NODE
    if is_cpu_op is not None:
        node.attr.append(make_attr("is_cpu_op", is_cpu_op))  # type: ignore[arg-type]
    for key, value in attrs.items():
        if value is not None:
            node.attr.append(make_attr(key, value))  # type: ignore[arg-type]
    return node


def coll(nid: int, comm_type: int | None, size: int | None, *, pg: str | None = None, **kw: object) -> pb.Node:
    return mk(nid, pb.COMM_COLL_NODE, comm_type=comm_type, comm_size=size, pg_name=pg, **kw)


def send(nid: int, *, src: int | None, dst: int | None, tag: int | None, size: int | None, **kw: object) -> pb.Node:
    return mk(nid, pb.COMM_SEND_NODE, comm_src=src, comm_dst=dst, comm_tag=tag, comm_size=size, **kw)


def recv(nid: int, *, src: int | None, dst: int | None, tag: int | None, size: int | None, **kw: object) -> pb.Node:
    return mk(nid, pb.COMM_RECV_NODE, comm_src=src, comm_dst=dst, comm_tag=tag, comm_size=size, **kw)


META = pb.GlobalMetadata(version="1.0.0")


def write_rank(path: Path, nodes: list[pb.Node]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_et(path, META, nodes)


def write_raw(path: Path, messages: list[pb.Node | bytes]) -> Path:
    """GlobalMetadata then each node (or raw bytes) delimited, bypassing EtWriter's checks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = encode_delimited(META) + b"".join(m if isinstance(m, bytes) else encode_delimited(m) for m in messages)
    path.write_bytes(blob)
    return path


def write_ranks(directory: Path, per_rank: dict[int, list[pb.Node]], prefix: str = "t") -> Path:
    for rank, nodes in per_rank.items():
        write_rank(directory / f"{prefix}.{rank}.et", nodes)
    return directory


def inspect_one(tmp_path: Path, nodes: list[pb.Node]) -> RankReport:
    return inspect_rank(write_rank(tmp_path / "t.0.et", nodes), 0)


def codes(problems: list[Problem]) -> Counter[str]:
    """Occurrences per problem code (folded entries count for their ``count``)."""
    out: Counter[str] = Counter()
    for p in problems:
        out[p.code] += p.count
    return out


def of_code(problems: list[Problem], code: str) -> list[Problem]:
    return [p for p in problems if p.code == code]


def trace_dir(tmp_path: Path) -> Path:
    """A trace folder two levels inside tmp_path, so comm_group.json discovery (beside the traces,
    ../inputs/, ..) never looks outside this test's own directory."""
    d = tmp_path / "run" / "trace"
    d.mkdir(parents=True)
    return d


# ------------------------------------------------------------------------------------------------
# real traces
# ------------------------------------------------------------------------------------------------


def _problems_by_code(report: TraceReport) -> Counter[str]:
    return codes(report.all_problems())


@needs_samples
def test_chakra_converter_old_dangling_deps_match_independent_count() -> None:
    path = CHAKRA_ET / "chakra_converter_old" / "chakra.0.et"
    _, nodes = read_et(path)
    ids = {n.id for n in nodes}
    # Validator order: per node in file order, data_deps first, then ctrl_deps.
    expected = [(n.id, which, d) for n in nodes
                for which, deps in (("data_deps", n.data_deps), ("ctrl_deps", n.ctrl_deps))
                for d in deps if d not in ids]
    assert len(expected) > MAX_PROBLEMS_PER_CODE  # the sample is known to have many (so folding kicks in)
    assert {which for _, which, _ in expected} == {"ctrl_deps"}  # MANIFEST: ctrl_deps point at absent ids

    report = inspect_trace(path)
    assert [r.rank for r in report.ranks] == [0]
    rank = report.ranks[0]
    dangling = of_code(rank.problems, "dangling-dep")
    assert codes(rank.problems)["dangling-dep"] == len(expected)
    listed = [p for p in dangling if p.node_id is not None]
    assert len(listed) == MAX_PROBLEMS_PER_CODE
    for p, (nid, which, dep) in zip(listed, expected[:MAX_PROBLEMS_PER_CODE], strict=True):
        assert p.node_id == nid
        assert p.severity == "error"
        assert f"node id {nid}" in p.message and which in p.message and f"names id {dep}" in p.message
    folded = [p for p in dangling if p.node_id is None]
    assert len(folded) == 1 and folded[0].count == len(expected) - MAX_PROBLEMS_PER_CODE
    # A known instance, checked by hand: node 216's ctrl_deps name id 3, absent from the file.
    assert 3 not in ids and any(n.id == 216 and 3 in n.ctrl_deps for n in nodes)
    assert any(p.node_id == 216 and "names id 3" in p.message for p in listed)


@needs_samples
def test_chakra_converter_old_counts_and_cycles() -> None:
    path = CHAKRA_ET / "chakra_converter_old" / "chakra.0.et"
    _, nodes = read_et(path)
    rank = inspect_trace(path).ranks[0]
    assert rank.node_count == 3664
    assert rank.nodes_by_type == {"COMP_NODE": 3643, "COMM_COLL_NODE": 21}
    # MANIFEST: only 7 of the 21 collectives carry comm_type/comm_size (5 ALL_REDUCE, 2 BROADCAST).
    stats = {(c.pg_name, c.comm_type): c.count for c in rank.collectives}
    assert stats == {("", "ALL_REDUCE"): 5, ("", "BROADCAST"): 2}
    assert codes(rank.problems)["comm-missing-attr"] == 14

    # Independent cycle count: every self-dependency entry, plus one report if the graph without
    # self-edges and dangling edges still has a cycle (checked with our own Kahn pass).
    ids = {n.id for n in nodes}
    self_refs = sum(1 for n in nodes for d in (*n.data_deps, *n.ctrl_deps) if d == n.id)
    preds = {n.id: {d for d in (*n.data_deps, *n.ctrl_deps) if d in ids and d != n.id} for n in nodes}
    indeg = {k: len(v) for k, v in preds.items()}
    succ: dict[int, list[int]] = {k: [] for k in preds}
    for k, ps in preds.items():
        for p in ps:
            succ[p].append(k)
    queue = deque(k for k, d in indeg.items() if d == 0)
    done = 0
    while queue:
        u = queue.popleft()
        done += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    multi_node_cycle = done < len(nodes)
    assert self_refs > 0
    assert codes(rank.problems)["cycle"] == self_refs + int(multi_node_cycle)


@needs_samples
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_pipeline_dangling_ctrl_deps_and_pg_init(rank: int) -> None:
    report = inspect_trace(GLOO / "chakra_trace")
    assert [r.rank for r in report.ranks] == [0, 1]
    r = report.ranks[rank]
    assert r.node_count == 425
    assert r.nodes_by_type == {"METADATA_NODE": 2, "COMP_NODE": 423}
    assert r.collectives == [] and r.p2p_sends == 0 and r.p2p_recvs == 0
    dangling = of_code(r.problems, "dangling-dep")
    assert sorted(p.node_id for p in dangling) == [1, 199]  # type: ignore[type-var]
    for p in dangling:
        assert "ctrl_deps names id 0" in p.message and p.rank == rank
    assert codes(r.problems) == Counter({"dangling-dep": 2})
    # independently: exactly those two ctrl_deps entries name an absent id, and it is 0
    _, nodes = read_et(GLOO / f"chakra_trace.{rank}.et")
    ids = {n.id for n in nodes}
    assert sorted((n.id, d) for n in nodes for d in n.ctrl_deps if d not in ids) == [(1, 0), (199, 0)]
    # process groups come from the '## process_group:init ##' METADATA nodes (no comm_group.json there)
    assert PG_INIT_NODE in report.process_groups_source
    assert "0" in report.process_groups
    assert r.pg_init == {"0": []}
    assert report.problems == []


@needs_samples
def test_typetest_wrong_attr_kinds_still_counted() -> None:
    path = GLOO / "typetest.0.et"
    rank = inspect_trace(path).ranks[0]
    wrong = of_code(rank.problems, "wrong-attr-kind")
    assert {p.node_id for p in wrong} == {1}
    by_attr = {name: p for p in wrong for name in ("comm_size", "is_cpu_op") if repr(name) in p.message}
    assert set(by_attr) == {"comm_size", "is_cpu_op"}
    assert "uint64_val" in by_attr["comm_size"].message and "int64_val" in by_attr["comm_size"].message
    assert "int32_val" in by_attr["is_cpu_op"].message and "bool_val" in by_attr["is_cpu_op"].message
    assert all(p.severity == "warning" for p in wrong)
    assert codes(rank.problems) == Counter({"wrong-attr-kind": 2})

    # Independent reading of the sizes, whatever integer kind they were written with.
    _, nodes = read_et(path)
    expected: Counter[tuple[str, int]] = Counter()
    totals: Counter[str] = Counter()
    for n in nodes:
        a = attr_map(n.attr)
        name = pb.CollectiveCommType.Name(int(a["comm_type"].value))  # type: ignore[arg-type]
        expected[(name, 1)] += 1
        totals[name] += int(a["comm_size"].value)  # type: ignore[arg-type]
    assert totals == Counter({"ALL_REDUCE": ONE_MIB, "ALL_GATHER": 2 * ONE_MIB})
    got = {c.comm_type: (c.count, c.total_bytes) for c in rank.collectives}
    assert got == {"ALL_REDUCE": (1, ONE_MIB), "ALL_GATHER": (1, 2 * ONE_MIB)}


@needs_samples
def test_multi_pg_t3d_groups_from_comm_group_json() -> None:
    folder = CHAKRA_ET / "multi_pg_T3D"
    groups = json.loads((folder / "inputs" / "comm_group.json").read_text())
    report = inspect_trace(folder / "trace")
    assert [r.rank for r in report.ranks] == list(range(8))
    assert Path(report.process_groups_source) == folder / "inputs" / "comm_group.json"
    for key, ranks in groups.items():
        assert report.process_groups[key] == ranks
    for r in report.ranks:
        assert r.nodes_by_type == {"COMP_NODE": 2, "COMM_COLL_NODE": 3}
        assert all(c.comm_type == "ALL_REDUCE" and c.count == 1 for c in r.collectives)
        pgs = {c.pg_name for c in r.collectives}
        assert len(pgs) == 3
        assert pgs == {k for k, members in groups.items() if r.rank in members}
    assert {c.pg_name for c in report.ranks[2].collectives} == {"1", "4", "10"}
    assert report.problem_count() == 0
    assert report.all_problems() == []


@needs_samples
def test_multi_pg_t3d_membership_violation_with_explicit_comm_group(tmp_path: Path) -> None:
    folder = CHAKRA_ET / "multi_pg_T3D"
    groups = json.loads((folder / "inputs" / "comm_group.json").read_text())
    groups["1"] = [3]  # rank 2 no longer a member of group "1"
    cg = tmp_path / "cg.json"
    cg.write_text(json.dumps(groups))
    report = inspect_trace(folder / "trace", comm_group=cg)
    assert report.process_groups_source == str(cg)
    bad = of_code(report.problems, "pg-membership")
    assert [p.rank for p in bad] == [2]
    assert "'1'" in bad[0].message


def _ring_dir() -> Path:
    return CHAKRA_ET / "astra-sim_custom_ring_allreduce_8npus_1MB"


@needs_samples
def test_custom_ring_sends_and_receives_pair_up() -> None:
    report = inspect_trace(_ring_dir())
    assert [r.rank for r in report.ranks] == list(range(8))
    sent: Counter[tuple[int, int, int, int]] = Counter()
    received: Counter[tuple[int, int, int, int]] = Counter()
    for r in report.ranks:
        assert (r.p2p_sends, r.p2p_recvs) == (14, 14)
        assert r.nodes_by_type == {"COMP_NODE": 7, "COMM_SEND_NODE": 14, "COMM_RECV_NODE": 14}
        assert r.comp_duration_us == 7 * 7
        # independent pairing from the raw nodes (missing end = this rank, as consumers do)
        _, nodes = read_et(r.path)
        for n in nodes:
            a = {k: v.value for k, v in attr_map(n.attr).items()}
            if n.type == pb.COMM_SEND_NODE:
                sent[(a.get("comm_src", r.rank), a["comm_dst"], a["comm_tag"], a["comm_size"])] += 1  # type: ignore[index]
            elif n.type == pb.COMM_RECV_NODE:
                received[(a["comm_src"], a.get("comm_dst", r.rank), a["comm_tag"], a["comm_size"])] += 1  # type: ignore[index]
        assert r.p2p_bytes_sent == sum(
            k[3] * v for k, v in sent.items() if k[0] == r.rank)  # type: ignore[misc]
    assert sent == received
    assert of_code(report.all_problems(), "p2p-mismatch") == []
    assert {p.code for p in report.all_problems()} <= {"missing-is-cpu-op", "p2p-missing-end"}


@needs_samples
def test_custom_ring_size_change_is_a_p2p_mismatch(tmp_path: Path) -> None:
    out = trace_dir(tmp_path)
    for f in _ring_dir().glob("*.et"):
        shutil.copy(f, out / f.name)
    meta, nodes = read_et(out / "custom_allreduce.1.et")
    first_recv = next(n for n in nodes if n.type == pb.COMM_RECV_NODE)
    for a in first_recv.attr:
        if a.name == "comm_size":
            a.int64_val += 1
    (out / "custom_allreduce.1.et").unlink()
    write_et(out / "custom_allreduce.1.et", meta, nodes)
    mism = of_code(inspect_trace(out).problems, "p2p-mismatch")
    assert len(mism) == 1
    assert mism[0].rank == 1 and mism[0].node_id == first_recv.id


def _microbench_dirs() -> list[Path]:
    root = CHAKRA_ET / "astra-sim_microbenchmarks"
    return sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []


@needs_samples
def test_microbenchmark_folders_present() -> None:
    assert len(_microbench_dirs()) == 12
    assert sum(len(list(d.glob("*.et"))) for d in _microbench_dirs()) == 112


@pytest.mark.parametrize(
    "folder", [pytest.param(d, id=f"{d.parent.name}/{d.name}") for d in _microbench_dirs()])
def test_microbenchmarks_have_no_problems(folder: Path) -> None:
    report = inspect_trace(folder)
    npus = int(folder.name.split("npus")[0])
    assert [r.rank for r in report.ranks] == list(range(npus))
    assert report.all_problems() == []
    assert report.problem_count() == 0
    for r in report.ranks:
        assert r.nodes_by_type == {"COMM_COLL_NODE": 1}
        assert [(c.pg_name, c.comm_type, c.count, c.total_bytes) for c in r.collectives] == [
            ("", folder.parent.name.upper(), 1, ONE_MIB)]
        assert r.version == "0.0.4"


@needs_samples
def test_tutorial_mlp_model_parallel_counts() -> None:
    report = inspect_trace(CHAKRA_ET / "tutorial_mlp_model_parallel")
    assert [r.rank for r in report.ranks] == [0, 1]
    for r in report.ranks:
        assert r.node_count == 29
        assert r.nodes_by_type == {"COMP_NODE": 18, "COMM_COLL_NODE": 11}
        stats = {c.comm_type: c.count for c in r.collectives}
        assert stats == {"ALL_GATHER": 6, "ALL_REDUCE": 5}
        # no is_cpu_op anywhere: one tallied warning covering all 29 nodes
        missing = of_code(r.problems, "missing-is-cpu-op")
        assert len(missing) == 1 and missing[0].count == 29 and missing[0].severity == "warning"
    assert report.problems == []


# ------------------------------------------------------------------------------------------------
# crafted traces: one rank
# ------------------------------------------------------------------------------------------------


def test_clean_crafted_trace_has_no_problems(tmp_path: Path) -> None:
    nodes = [mk(1, dur=3), coll(2, pb.ALL_REDUCE, 1024, data=[1]), mk(3, dur=4, data=[2], ctrl=[1])]
    r = inspect_one(tmp_path, nodes)
    assert r.problems == []
    assert r.node_count == 3 and r.roots == 1 and r.depth == 3 and r.critical_path_us == 7
    assert r.comp_duration_us == 7
    assert r.version == "1.0.0" and r.schema is None and r.compressed is False
    assert r.file_bytes == (tmp_path / "t.0.et").stat().st_size


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "t.0.et", [mk(1), mk(2, data=[1]), mk(2, data=[1])])
    with pytest.raises(TraceWriteError):  # EtWriter refuses it (that's why the file is written raw)
        write_et(tmp_path / "w.0.et", META, [mk(1), mk(2), mk(2)])
    r = inspect_rank(path, 0)
    dup = of_code(r.problems, "duplicate-id")
    assert len(dup) == 1 and dup[0].node_id == 2 and dup[0].severity == "error"
    assert "node index 2" in dup[0].message
    assert r.node_count == 3


def test_dangling_data_and_ctrl_deps_named(tmp_path: Path) -> None:
    r = inspect_one(tmp_path, [mk(1), mk(2, data=[1, 77]), mk(3, ctrl=[88], data=[2])])
    dangling = of_code(r.problems, "dangling-dep")
    assert [(p.node_id, p.message) for p in dangling] == [
        (2, "node id 2: data_deps names id 77, not a node of this file"),
        (3, "node id 3: ctrl_deps names id 88, not a node of this file"),
    ]
    assert codes(r.problems) == Counter({"dangling-dep": 2})
    # the dangling edges are dropped, the real ones kept
    assert r.depth == 3 and r.roots == 1


def test_three_node_cycle_lists_its_ids(tmp_path: Path) -> None:
    nodes = [mk(1), mk(10, data=[1, 30]), mk(20, data=[10]), mk(30, ctrl=[20]), mk(40, data=[30])]
    r = inspect_one(tmp_path, nodes)
    cycles = of_code(r.problems, "cycle")
    assert len(cycles) == 1
    msg = cycles[0].message
    assert cycles[0].node_id in (10, 20, 30)
    for nid in ("10", "20", "30"):
        assert f" {nid} " in msg or f" {nid};" in msg
    # the cycle in dependency order, closed: 10 -> 20 -> 30 -> 10 (any rotation)
    rotations = ["10 -> 20 -> 30 -> 10", "20 -> 30 -> 10 -> 20", "30 -> 10 -> 20 -> 30"]
    assert any(rot in msg for rot in rotations), msg
    assert "4 node(s)" in msg  # 10, 20, 30 on the cycle and 40 behind it
    assert r.roots == 1 and r.depth == 1  # only node 1 can ever run


def test_self_dependency_is_a_cycle(tmp_path: Path) -> None:
    r = inspect_one(tmp_path, [mk(1), mk(2, data=[1], ctrl=[2]), mk(3, data=[2])])
    cycles = of_code(r.problems, "cycle")
    assert [(p.node_id, p.message) for p in cycles] == [(2, "node id 2 depends on itself")]
    assert r.depth == 3  # the self-edge is dropped, the rest still runs


def test_collective_without_type_and_size(tmp_path: Path) -> None:
    r = inspect_one(tmp_path, [coll(5, None, None, name="ar"), coll(6, pb.ALL_REDUCE, None), coll(7, None, 8)])
    missing = of_code(r.problems, "comm-missing-attr")
    assert [p.node_id for p in missing] == [5, 6, 7]
    assert "comm_type and comm_size" in missing[0].message and "'ar'" in missing[0].message
    assert "without comm_size" in missing[1].message and "comm_type" not in missing[1].message.split("without")[1]
    assert "without comm_type" in missing[2].message
    assert r.collectives == []


def test_comm_type_out_of_range_is_bad_enum(tmp_path: Path) -> None:
    bad_node = coll(1, None, 100)
    bad_node.attr.append(pb.AttributeProto(name="comm_type", int64_val=42))  # make_attr refuses 42
    r = inspect_one(tmp_path, [bad_node, coll(2, pb.BARRIER, 0)])
    bad = of_code(r.problems, "bad-enum")
    assert len(bad) == 1 and bad[0].node_id == 1 and "42" in bad[0].message
    assert [(c.comm_type, c.count) for c in r.collectives] == [("BARRIER", 1)]


def test_p2p_missing_attrs(tmp_path: Path) -> None:
    nodes = [
        send(1, src=0, dst=None, tag=None, size=10),
        recv(2, src=None, dst=0, tag=3, size=10),
        send(3, src=0, dst=1, tag=3, size=10),
    ]
    r = inspect_one(tmp_path, nodes)
    missing = of_code(r.problems, "p2p-missing-attr")
    assert [p.node_id for p in missing] == [1, 2]
    assert "send without comm_dst, comm_tag" in missing[0].message
    assert "recv without comm_src" in missing[1].message and "comm_tag" not in missing[1].message
    assert (r.p2p_sends, r.p2p_recvs, r.p2p_bytes_sent) == (1, 0, 10)


def test_comm_node_with_is_cpu_op_true(tmp_path: Path) -> None:
    r = inspect_one(tmp_path, [coll(1, pb.ALL_REDUCE, 8, is_cpu_op=True), coll(2, pb.ALL_REDUCE, 8),
                               mk(3, is_cpu_op=True)])
    bad = of_code(r.problems, "comm-is-cpu-op")
    assert [p.node_id for p in bad] == [1] and bad[0].severity == "error"


def test_zero_length_message_reported_and_later_nodes_counted(tmp_path: Path) -> None:
    nodes = [mk(1, dur=2), mk(2, dur=3, data=[1]), mk(3, dur=5, data=[2])]
    offset = len(encode_delimited(META)) + len(encode_delimited(nodes[0]))
    path = write_raw(tmp_path / "t.0.et", [nodes[0], b"\x00", nodes[1], nodes[2]])
    r = inspect_rank(path, 0)
    zero = of_code(r.problems, "zero-length-message")
    assert len(zero) == 1 and zero[0].severity == "error"
    assert f"byte offset {offset}" in zero[0].message
    assert "node index 1" in zero[0].message
    assert r.node_count == 3  # nothing after the empty message is dropped
    assert r.comp_duration_us == 10 and r.depth == 3 and r.critical_path_us == 10


def test_invalid_vs_unknown_node_type(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "t.0.et", [mk(1), mk(2, ntype=0), mk(3, ntype=9)])
    r = inspect_rank(path, 0)
    invalid = of_code(r.problems, "invalid-node-type")
    unknown = of_code(r.problems, "unknown-node-type")
    assert [(p.node_id, p.severity) for p in invalid] == [(2, "error")]
    assert [(p.node_id, p.severity) for p in unknown] == [(3, "warning")]
    assert "9" in unknown[0].message
    assert r.nodes_by_type == {"INVALID_NODE": 1, "COMP_NODE": 1, "NODE_TYPE_9": 1}


def test_node_type_beyond_any_schema_is_a_decode_error(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "t.0.et", [mk(1), mk(2, ntype=11)])
    with pytest.raises(TraceDecodeError) as info:
        inspect_rank(path, 0)
    assert info.value.node_index == 1


def test_diamond_depth_and_critical_path(tmp_path: Path) -> None:
    # a(10) -> b(5), c(20) -> d(1): depth 3 nodes, critical path a+c+d = 31 us, one root
    nodes = [mk(1, name="a", dur=10), mk(2, name="b", dur=5, data=[1]), mk(3, name="c", dur=20, ctrl=[1]),
             mk(4, name="d", dur=1, data=[2], ctrl=[3])]
    r = inspect_one(tmp_path, nodes)
    assert (r.depth, r.critical_path_us, r.roots) == (3, 31, 1)
    assert r.comp_duration_us == 36
    assert r.problems == []


def test_depth_and_critical_path_take_different_chains(tmp_path: Path) -> None:
    # long-by-count chain of 4 x 1 us vs one 100 us node: depth 4, critical 100, 2 roots
    nodes = [mk(1, dur=1), mk(2, dur=1, data=[1]), mk(3, dur=1, data=[2]), mk(4, dur=1, data=[3]), mk(5, dur=100)]
    r = inspect_one(tmp_path, nodes)
    assert (r.depth, r.critical_path_us, r.roots) == (4, 100, 2)


def test_problems_fold_beyond_the_per_code_limit(tmp_path: Path) -> None:
    extra = 7
    n = MAX_PROBLEMS_PER_CODE + extra
    nodes = [mk(i + 1, data=[10_000 + i]) for i in range(n)]
    r = inspect_one(tmp_path, nodes)
    dangling = of_code(r.problems, "dangling-dep")
    assert len(dangling) == MAX_PROBLEMS_PER_CODE + 1
    assert [p.count for p in dangling[:-1]] == [1] * MAX_PROBLEMS_PER_CODE
    assert [p.node_id for p in dangling[:-1]] == list(range(1, MAX_PROBLEMS_PER_CODE + 1))
    folded = dangling[-1]
    assert folded.count == extra and folded.node_id is None and str(extra) in folded.message
    assert codes(r.problems)["dangling-dep"] == n
    report = inspect_trace(tmp_path / "t.0.et")
    assert report.problem_count() == n
    assert report.to_dict()["problem_count"] == n


def test_report_to_dict_is_json_and_versioned(tmp_path: Path) -> None:
    write_rank(tmp_path / "t.0.et", [mk(1, dur=4), coll(2, pb.ALL_GATHER, 64, data=[1], pg="0")])
    report = inspect_trace(tmp_path / "t.0.et")
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema"] == REPORT_SCHEMA
    assert doc["rank_ids"] == [0]
    assert doc["ranks"][0]["collectives"] == [
        {"pg_name": "0", "comm_type": "ALL_GATHER", "count": 1, "total_bytes": 64}]
    assert doc["ranks"][0]["critical_path_us"] == 4
    assert doc["problem_count"] == 0 and doc["cross_rank_problems"] == []


def test_problem_lines_name_rank_node_and_code(tmp_path: Path) -> None:
    write_rank(tmp_path / "t.3.et", [mk(1, data=[9])])
    lines = list(iter_problem_lines(inspect_trace(tmp_path / "t.3.et")))
    assert lines == ["rank 3 node 1: [error dangling-dep] node id 1: data_deps names id 9, not a node of this file"]


def test_pg_init_metadata_node_is_parsed(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    groups = [{"pg_name": "0", "ranks": [], "group_size": 2}, {"pg_name": "5", "ranks": [1], "group_size": 1}]
    init = pb.Node(id=1, name=PG_INIT_NODE, type=pb.METADATA_NODE)
    init.inputs.values = repr([json.dumps(groups)])  # Chakra's converter wraps the JSON in a literal list
    write_ranks(d, {0: [init, coll(2, pb.ALL_REDUCE, 8, pg="5")], 1: [init, coll(2, pb.ALL_REDUCE, 8, pg="5")]})
    report = inspect_trace(d)
    assert PG_INIT_NODE in report.process_groups_source
    assert report.process_groups["5"] == [1]
    bad = of_code(report.problems, "pg-membership")
    assert [p.rank for p in bad] == [0]


def test_unreadable_pg_init_is_a_warning(tmp_path: Path) -> None:
    init = pb.Node(id=1, name=PG_INIT_NODE, type=pb.METADATA_NODE)
    init.inputs.values = "not json ]["
    r = inspect_one(tmp_path, [init])
    bad = of_code(r.problems, "bad-pg-init")
    assert [(p.node_id, p.severity) for p in bad] == [(1, "warning")]


def test_negative_comm_size_is_bad_value(tmp_path: Path) -> None:
    r = inspect_one(tmp_path, [coll(1, pb.ALL_REDUCE, -8)])
    bad = of_code(r.problems, "bad-value")
    assert [p.node_id for p in bad] == [1] and "-8" in bad[0].message
    assert r.collectives == []


def test_missing_is_cpu_op_and_missing_p2p_end_are_tallied_once(tmp_path: Path) -> None:
    nodes = [mk(i, is_cpu_op=None) for i in range(1, 31)]
    nodes.append(send(31, src=None, dst=1, tag=0, size=4))
    nodes.append(recv(32, src=1, dst=None, tag=0, size=4))
    nodes.append(pb.Node(id=33, name="meta", type=pb.METADATA_NODE))  # METADATA nodes need no is_cpu_op
    r = inspect_one(tmp_path, nodes)
    missing = of_code(r.problems, "missing-is-cpu-op")
    assert [(p.count, p.node_id, p.severity) for p in missing] == [(30, 1, "warning")]
    ends = of_code(r.problems, "p2p-missing-end")
    assert [(p.count, p.node_id) for p in ends] == [(2, 31)]
    assert codes(r.problems) == Counter({"missing-is-cpu-op": 30, "p2p-missing-end": 2})


def test_gzip_trace_gives_the_same_report(tmp_path: Path) -> None:
    nodes = [mk(1, dur=10), mk(2, dur=5, data=[1, 99]), coll(3, pb.ALL_GATHER, 512, data=[2])]
    raw = inspect_rank(write_et(tmp_path / "raw.0.et", META, nodes), 0)
    gz = inspect_rank(write_et(tmp_path / "gz.0.et", META, nodes, compress=True), 0)
    assert (raw.compressed, gz.compressed) == (False, True)
    for attr in ("node_count", "nodes_by_type", "collectives", "depth", "critical_path_us", "roots"):
        assert getattr(raw, attr) == getattr(gz, attr)
    assert [p.message for p in raw.problems] == [p.message for p in gz.problems]
    assert (gz.depth, gz.critical_path_us) == (3, 15)


def test_metadata_only_trace(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "t.0.et", [])
    r = inspect_rank(path, 0)
    assert (r.node_count, r.roots, r.depth, r.critical_path_us, r.problems) == (0, 0, 0, 0, [])


def test_schema_attribute_is_reported(tmp_path: Path) -> None:
    meta = pb.GlobalMetadata(version="")
    meta.attr.append(make_attr("schema", "1.1.1-chakra.0.0.4"))
    r = inspect_rank(write_et(tmp_path / "t.0.et", meta, [mk(1)]), 0)
    assert (r.version, r.schema) == ("", "1.1.1-chakra.0.0.4")


def test_undecodable_rank_in_a_set_names_that_file(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_rank(d / "t.0.et", [mk(1)])
    (d / "t.1.et").write_bytes(encode_delimited(META) + b"\x05\x08")
    with pytest.raises(TraceDecodeError) as info:
        inspect_trace(d)
    assert info.value.path == str(d / "t.1.et")
    assert info.value.node_index == 0


def test_deeply_nested_pg_init_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    init = pb.Node(id=1, name=PG_INIT_NODE, type=pb.METADATA_NODE)
    init.inputs.values = "[" * 100_000 + "]" * 100_000
    r = inspect_one(tmp_path, [init])
    assert [p.code for p in r.problems] == ["bad-pg-init"]


@pytest.mark.parametrize("text", [
    pytest.param("[" * 100_000 + "]" * 100_000, id="deep-nesting"),
    pytest.param('{"1": [' + "1" * 5000 + "]}", id="huge-integer"),
])
def test_comm_group_json_hostile_content_is_invalid_input(tmp_path: Path, text: str) -> None:
    from nbox_trace.check import load_comm_groups
    from nbox_trace.errors import InvalidInputError

    cg = tmp_path / "cg.json"
    cg.write_text(text)
    with pytest.raises(InvalidInputError):
        load_comm_groups(cg)


def test_missing_comm_group_file_is_input_not_found(tmp_path: Path) -> None:
    from nbox_trace.errors import InputNotFoundError

    write_rank(tmp_path / "t.0.et", [mk(1)])
    with pytest.raises(InputNotFoundError):
        inspect_trace(tmp_path / "t.0.et", comm_group=tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------------
# crafted traces: across ranks
# ------------------------------------------------------------------------------------------------


def test_world_collective_sequences_diverge_at_position_2(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [coll(1, pb.ALL_REDUCE, 100), coll(2, pb.ALL_REDUCE, 200), coll(3, pb.ALL_REDUCE, 300)],
        1: [coll(11, pb.ALL_REDUCE, 100), coll(12, pb.ALL_REDUCE, 200), coll(13, pb.ALL_GATHER, 300)],
    })
    report = inspect_trace(d)
    assert all(r.problems == [] for r in report.ranks)
    mism = of_code(report.problems, "collective-mismatch")
    assert len(mism) == 1
    p = mism[0]
    assert p.rank == 1 and p.node_id == 13 and p.severity == "error"
    assert "process group ''" in p.message
    assert "#2" in p.message
    assert "rank 0" in p.message and "rank 1" in p.message
    assert "ALL_REDUCE of 300 B (node id 3)" in p.message and "ALL_GATHER of 300 B (node id 13)" in p.message
    assert report.problem_count() == 1


def test_one_rank_issues_one_more_collective(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [coll(1, pb.ALL_REDUCE, 100), coll(2, pb.BROADCAST, 50, pg="0")],
        1: [coll(1, pb.ALL_REDUCE, 100)],
        2: [coll(1, pb.ALL_REDUCE, 100)],
    })
    mism = of_code(inspect_trace(d).problems, "collective-mismatch")
    # "" and "0" both mean all ranks, but each process group is compared on its own: the world
    # all-reduces agree, the extra broadcast on "0" is missing on ranks 1 and 2.
    assert len(mism) == 2
    assert {p.rank for p in mism} == {1, 2}
    for p in mism:
        assert "'0'" in p.message and "#0" in p.message and "has none" in p.message
        assert "BROADCAST of 50 B (node id 2)" in p.message and p.node_id == 2


def test_extra_collective_at_the_end_names_position(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [coll(1, pb.ALL_REDUCE, 100), coll(2, pb.ALL_REDUCE, 100)],
        1: [coll(1, pb.ALL_REDUCE, 100), coll(2, pb.ALL_REDUCE, 100), coll(3, pb.ALL_REDUCE, 100)],
    })
    mism = of_code(inspect_trace(d).problems, "collective-mismatch")
    assert len(mism) == 1
    assert mism[0].node_id == 3 and "#2" in mism[0].message
    assert "rank 0 issues 2, rank 1 issues 3" in mism[0].message


def test_collective_sizes_differ(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {0: [coll(1, pb.REDUCE_SCATTER, 4096)], 1: [coll(1, pb.REDUCE_SCATTER, 2048)]})
    mism = of_code(inspect_trace(d).problems, "collective-mismatch")
    assert len(mism) == 1
    assert "4096 B" in mism[0].message and "2048 B" in mism[0].message and "#0" in mism[0].message


def test_subgroup_from_comm_group_json_non_member(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    cg = tmp_path / "groups.json"
    cg.write_text(json.dumps({"3": [0, 1]}))
    write_ranks(d, {r: [coll(1, pb.ALL_REDUCE, 64, pg="3")] for r in range(3)})
    report = inspect_trace(d, comm_group=cg)
    assert report.process_groups["3"] == [0, 1]
    assert report.process_groups_source == str(cg)
    bad = of_code(report.problems, "pg-membership")
    assert [p.rank for p in bad] == [2]
    assert "'3'" in bad[0].message and "[0, 1]" in bad[0].message
    assert of_code(report.problems, "collective-mismatch") == []
    # Without the membership file, a group's members are the ranks that use it: no problem.
    assert inspect_trace(d).problems == []


def test_comm_group_json_beside_traces_is_found(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    (d / "comm_group.json").write_text(json.dumps({"3": [0, 1]}))
    write_ranks(d, {r: [coll(1, pb.ALL_REDUCE, 64, pg="3")] for r in range(3)})
    report = inspect_trace(d)
    assert Path(report.process_groups_source) == d / "comm_group.json"
    assert [p.rank for p in of_code(report.problems, "pg-membership")] == [2]


def test_subgroup_members_compare_only_among_themselves(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    cg = tmp_path / "groups.json"
    cg.write_text(json.dumps({"1": [0, 1], "2": [2, 3]}))
    write_ranks(d, {
        0: [coll(1, pb.ALL_REDUCE, 64, pg="1")], 1: [coll(1, pb.ALL_REDUCE, 64, pg="1")],
        2: [coll(1, pb.ALL_GATHER, 8, pg="2")], 3: [coll(1, pb.ALL_GATHER, 16, pg="2")],
    })
    mism = of_code(inspect_trace(d, comm_group=cg).problems, "collective-mismatch")
    assert len(mism) == 1 and mism[0].rank == 3 and "'2'" in mism[0].message


def test_p2p_size_mismatch(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [send(1, src=0, dst=1, tag=7, size=100)],
        1: [recv(5, src=0, dst=1, tag=7, size=200)],
    })
    report = inspect_trace(d)
    assert [(r.p2p_sends, r.p2p_recvs) for r in report.ranks] == [(1, 0), (0, 1)]
    assert report.ranks[0].p2p_bytes_sent == 100
    mism = of_code(report.problems, "p2p-mismatch")
    assert len(mism) == 1
    p = mism[0]
    assert p.message.startswith("0 -> 1 tag 7:")
    assert "100 B" in p.message and "200 B" in p.message
    assert p.rank == 1 and p.node_id == 5


def test_p2p_matching_pairs_and_unmatched_send(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [send(1, src=0, dst=1, tag=7, size=100), send(2, src=0, dst=1, tag=8, size=4)],
        1: [recv(1, src=0, dst=1, tag=7, size=100)],
    })
    mism = of_code(inspect_trace(d).problems, "p2p-mismatch")
    assert len(mism) == 1
    assert mism[0].message.startswith("0 -> 1 tag 8:") and "never receives" in mism[0].message
    assert mism[0].rank == 0 and mism[0].node_id == 2


def test_all_to_all_with_split_sizes_is_not_a_mismatch(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [coll(1, pb.ALL_TO_ALL, 300, nbox_in_split_sizes=[100, 200])],
        1: [coll(1, pb.ALL_TO_ALL, 700, nbox_in_split_sizes=[300, 400])],
    })
    report = inspect_trace(d)
    assert report.all_problems() == []
    # control: the same sizes without the split attribute are a mismatch
    d2 = trace_dir(tmp_path / "control")
    write_ranks(d2, {0: [coll(1, pb.ALL_TO_ALL, 300)], 1: [coll(1, pb.ALL_TO_ALL, 700)]})
    assert len(of_code(inspect_trace(d2).problems, "collective-mismatch")) == 1


def test_split_sizes_do_not_excuse_a_type_mismatch(tmp_path: Path) -> None:
    d = trace_dir(tmp_path)
    write_ranks(d, {
        0: [coll(1, pb.ALL_TO_ALL, 300, nbox_in_split_sizes=[100, 200])],
        1: [coll(1, pb.ALL_GATHER, 300)],
    })
    assert len(of_code(inspect_trace(d).problems, "collective-mismatch")) == 1


# ------------------------------------------------------------------------------------------------
# long chains: no recursion
# ------------------------------------------------------------------------------------------------


def _write_chain(path: Path, n: int) -> Path:
    cpu = make_attr("is_cpu_op", True)

    def nodes():  # type: ignore[no-untyped-def]
        for i in range(n):
            node = pb.Node(id=i, name="c", type=pb.COMP_NODE, duration_micros=1)
            if i:
                node.data_deps.append(i - 1)
            node.attr.append(cpu)
            yield node

    with EtWriter(path, META) as writer:
        writer.write_all(nodes())
    return path


def _check_chain(tmp_path: Path, n: int) -> None:
    r = inspect_rank(_write_chain(tmp_path / "chain.0.et", n), 0)
    assert r.node_count == n
    assert r.depth == n
    assert r.critical_path_us == n
    assert r.comp_duration_us == n
    assert r.roots == 1
    assert r.problems == []


def test_long_chain_1m(tmp_path: Path) -> None:
    # node i depends on node i-1, 1 us each: depth and critical path are both 1,000,000, and the
    # graph pass must not recurse (a recursive DFS would hit RecursionError here).
    _check_chain(tmp_path, 1_000_000)


def test_long_chain_through_ctrl_deps_with_a_fork(tmp_path: Path) -> None:
    # 50,000-node chain on ctrl_deps plus one 60,000 us side node: depth and critical path differ
    n = 50_000
    nodes = [mk(i, dur=1, ctrl=[i - 1] if i else []) for i in range(n)]
    nodes.append(mk(n, dur=60_000, data=[0]))
    r = inspect_one(tmp_path, nodes)
    assert (r.depth, r.critical_path_us, r.roots) == (n, 60_001, 1)
