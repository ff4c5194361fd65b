"""Mesh-aware what-ifs (issue 17) on synthetic traces with hand-computed answers.

Each job is a bare Chakra ET written here: its process groups (with DeviceMesh descriptions where a framework would
write them), one compute node and a few collectives per rank. The recorded mesh must be read off the groups, and at
each target mesh every group's members and every collective's bytes must be the hand-computed ones: a collective's
modeled time must equal the price of exactly those bytes on exactly those members.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emulator_core.pricing.pricer import group_shape, price_group
from emulator_core.scenario.files import SCENARIOS_DIR
from emulator_core.scenario.mesh import MeshError, parse_mesh, parse_placement, plan_mesh
from emulator_core.scenario.world import load_what_if
from nbox_replay.inputs.graph import load_rank
from nbox_replay.inputs.meshing import plan_for
from nbox_replay.inputs.source import open_source
from nbox_replay.replay import ReplayConfig, ReplayConfigError, run_replay
from nbox_replay.virtual.engine import simulate
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et
from nbox_trace.contract import PG_INIT_NODE
from nbox_trace.errors import UsageError
from nbox_trace.mesh import MeshFacts, MeshNameError, infer_mesh, parse_names

DGX = SCENARIOS_DIR / "dgx_h100_400g.toml"
TRACES = Path(__file__).resolve().parents[1] / "traces"
AR, AG, A2A, RS = 0, 2, 6, 7
MiB = 1 << 20

Step = tuple[Any, ...]


def write_job(root: Path, world: int, groups: dict[str, tuple[list[int], str]], steps: dict[int, list[Step]]) -> Path:
    """One ``job.<rank>.et`` per rank: the groups' init node, then the rank's steps in order, one thread.

    Steps: ``("coll", comm_type, pg, bytes)``, ``("a2a", pg, bytes, splits)``, ``("send"|"recv", peer, bytes)``.
    """
    root.mkdir()
    entries = [{"pg_name": n, "pg_desc": d, "ranks": m, "group_size": len(m)} for n, (m, d) in groups.items()]
    for rank in range(world):
        init = pb.Node(id=1, name=PG_INIT_NODE, type=pb.METADATA_NODE)
        init.inputs.values = json.dumps(entries)
        nodes = [init, pb.Node(id=2, name="aten::mm", type=pb.COMP_NODE, duration_micros=100)]
        set_attr(nodes[-1], "tid", 1)
        for k, step in enumerate(steps[rank]):
            node = pb.Node(id=3 + k, name=f"{step[0]}#{k}", duration_micros=10)
            node.ctrl_deps.append(nodes[-1].id)
            if step[0] == "coll":
                node.type = pb.COMM_COLL_NODE
                attrs: dict[str, Any] = {"comm_type": step[1], "pg_name": step[2], "comm_size": step[3]}
            elif step[0] == "a2a":
                node.type = pb.COMM_COLL_NODE
                attrs = {"comm_type": A2A, "pg_name": step[1], "comm_size": step[2],
                         "nbox_in_split_sizes": json.dumps(step[3]), "nbox_out_split_sizes": json.dumps(step[3])}
            else:
                node.type = pb.COMM_SEND_NODE if step[0] == "send" else pb.COMM_RECV_NODE
                src, dst = (rank, step[1]) if step[0] == "send" else (step[1], rank)
                attrs = {"comm_src": src, "comm_dst": dst, "comm_tag": 0, "comm_size": step[2]}
            for key, value in {**attrs, "tid": 1}.items():
                set_attr(node, key, value)
            nodes.append(node)
        write_et(root / f"job.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes)
    return root / "job"


def tp_dp(tmp: Path, descs: bool = True) -> Path:
    """TP 2 x DP 2 on 4 ranks, TP innermost: a 64 KiB TP all-reduce, then a 1 MiB DP gradient all-reduce."""
    tp, dp = ("mesh_tp", "mesh_dp") if descs else ("", "")
    groups = {"0": ([0, 1, 2, 3], "default_pg"), "1": ([0, 1], tp), "2": ([2, 3], tp), "3": ([0, 2], dp),
              "4": ([1, 3], dp)}
    return write_job(tmp / "tp_dp", 4, groups, {r: [("coll", AR, "12"[r // 2], 64 << 10),
                                                    ("coll", AR, "34"[r % 2], MiB)] for r in range(4)})


def answers(bundle: Path, mesh: str, placement: str | None = None, ranks: list[int] | None = None,
            names: str | None = None) -> tuple[Any, Any, dict[tuple[str, str], list[Any]]]:
    """(plan, scenario, {(group, collective): answers}) of a virtual replay of ``bundle`` at ``mesh`` on the DGX."""
    source = open_source(bundle)
    replayed = ranks or source.ranks
    plan = plan_for(source.mesh(parse_names(names) if names else None), mesh, groups=source.groups,
                    replayed=replayed, placement=parse_placement(placement) if placement else None)
    scenario, _ = load_what_if(DGX, recorded_world=source.recorded_world, requested=plan.world)
    graphs = {r: load_rank(source.trace_set.files[r], r) for r in replayed}
    sim = simulate(graphs, scenario, groups=source.groups, recorded_world=source.recorded_world, mesh=plan)
    out: dict[tuple[str, str], list[Any]] = {}
    for a in sim.collectives:
        out.setdefault((a.pg, a.collective), []).append(a)
    return plan, scenario, out


def check_priced_on(scenario: Any, ans: Any, collective: str, nbytes: float, members: list[int]) -> None:
    """The answer moved ``nbytes`` and took what those bytes cost on exactly ``members``."""
    assert ans.nbytes == pytest.approx(nbytes)
    _, cost = price_group(scenario, collective, nbytes, group_shape(scenario, members))
    assert ans.end_us - ans.start_us == pytest.approx(cost)


# ---------------------------------------------------------------- inference


def test_tp_x_dp_is_read_off_the_groups_and_their_devicemesh_descriptions(tmp_path: Path) -> None:
    mesh = open_source(tp_dp(tmp_path)).mesh()
    assert mesh.describe() == "dp=2 x tp=2" and not mesh.guessed
    assert [(d.name, d.degree, d.stride, d.groups) for d in mesh.dims] == [("dp", 2, 2, ("3", "4")),
                                                                           ("tp", 2, 1, ("1", "2"))]
    assert mesh.dims[0].named_by == "description 'mesh_dp'"
    assert mesh.spanned([0, 1, 2, 3]) == ("dp", "tp") and mesh.spanned([0, 3]) is None


def test_without_descriptions_tp_and_dp_are_guessed_and_scaling_them_is_refused_until_named(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path, descs=False)
    mesh = open_source(bundle).mesh()
    assert mesh.describe() == "dp=2 x tp=2" and mesh.guessed and "--recorded-mesh" in mesh.notes[0]
    with pytest.raises(MeshError, match=r"names are guessed.*--recorded-mesh dp,tp"):
        answers(bundle, "dp=8")
    plan, _, _ = answers(bundle, "dp=8", names="dp,tp")
    assert plan.describe() == "dp=8 x tp=2"
    with pytest.raises(MeshNameError, match=r"2 name\(s\) for the 3"):
        infer_mesh(MeshFacts.build(8, {"a": [0, 1], "b": [0, 2]}), parse_names("dp,tp"))
    with pytest.raises(MeshNameError, match=r"tp=4: that dimension has 2 ranks"):
        open_source(bundle).mesh(parse_names("dp,tp=4"))


@pytest.mark.parametrize(("groups", "colls", "p2p", "expected"), [
    ({"0": None}, {"0": ["ALL_REDUCE"]}, [], "dp=8"),
    ({"0": None}, {"0": ["ALL_GATHER", "REDUCE_SCATTER"]}, [], "fsdp=8"),
    ({"0": None, "a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, {"a": ["ALL_TO_ALL"], "b": ["ALL_TO_ALL"]}, [], "dp=2 x ep=4"),
    ({"0": None, "a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, {"a": ["ALL_REDUCE"]}, [(0, 4), (1, 5), (2, 6), (3, 7)],
     "pp=2 x dp=4"),
])
def test_dimensions_are_named_by_what_runs_on_them(groups: dict[str, Any], colls: dict[str, Any],
                                                   p2p: list[tuple[int, int]], expected: str) -> None:
    assert infer_mesh(MeshFacts.build(8, groups, collectives=colls, p2p=p2p)).describe() == expected


def test_irregular_groups_are_named_and_a_non_mesh_is_said() -> None:
    mesh = infer_mesh(MeshFacts.build(4, {"0": None, "odd": [0, 3]}, collectives={"0": ["ALL_REDUCE"]}))
    assert mesh.irregular == ("odd",) and "'odd'" in mesh.notes[-1]
    bad = infer_mesh(MeshFacts.build(6, {"a": [0, 1, 2, 3], "b": [0, 4]}))
    assert not bad.ok and bad.notes[0] == "groups of 4 ranks at stride 1 do not divide the world size 6"
    with pytest.raises(MeshError, match="form no mesh"):
        plan_mesh(bad, parse_mesh("dp=12"), groups={}, replayed=[0])


# ---------------------------------------------------------------- scaling, hand-computed


def test_dp_only_the_gradient_all_reduce_keeps_its_bytes_on_a_world_of_the_dp_degree(tmp_path: Path) -> None:
    bundle = write_job(tmp_path / "dp", 4, {"0": ([0, 1, 2, 3], "default_pg")},
                       {r: [("coll", AR, "0", MiB)] for r in range(4)})
    for dp in (4, 16, 1024):
        plan, s, got = answers(bundle, f"dp={dp}")
        assert plan.world == dp and plan.groups["0"][0] == tuple(range(dp))
        check_priced_on(s, got[("0", "all_reduce")][0], "all_reduce", MiB, list(range(dp)))
        assert got[("0", "all_reduce")][0].rule.startswith(f"dp group 4 -> {dp} ranks" if dp != 4 else "dp group not")


@pytest.mark.parametrize(("mesh", "placement", "tp_group", "dp_group"), [
    ("dp=8,tp=2", None, [0, 1], list(range(0, 16, 2))),
    ("dp=512,tp=2", None, [0, 1], list(range(0, 1024, 2))),
    ("dp=4", "tp,dp", [0, 4], [0, 1, 2, 3]),  # dp innermost: a tp pair straddles the dp block
])
def test_tp_x_dp_dp_groups_grow_tp_groups_keep_two_and_both_keep_their_bytes(
        tmp_path: Path, mesh: str, placement: str | None, tp_group: list[int], dp_group: list[int]) -> None:
    plan, s, got = answers(tp_dp(tmp_path), mesh, placement)
    # rank 0's groups: '1' (tp) and '3' (dp)
    assert list(plan.groups["1"][0]) == tp_group and list(plan.groups["3"][0]) == dp_group
    check_priced_on(s, got[("1", "all_reduce")][0], "all_reduce", 64 << 10, tp_group)
    check_priced_on(s, got[("3", "all_reduce")][0], "all_reduce", MiB, dp_group)
    assert got[("1", "all_reduce")][0].rule == "tp group not resized (2 ranks): unchanged"
    assert got[("3", "all_reduce")][0].rule == (f"dp group 2 -> {len(dp_group)} ranks: data-parallel gradient "
                                                 "all-reduce keeps its bytes")


def test_placement_renumbers_the_replayed_ranks_and_decides_the_topology_a_group_spans(tmp_path: Path) -> None:
    plan, s, _ = answers(tp_dp(tmp_path), "dp=512", None)
    assert dict(plan.rank_map) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [d.name for _, d in group_shape(s, list(plan.groups["1"][0])).dims] == ["nvlink"]  # TP inside a node
    (tmp_path / "x").mkdir()
    plan, s, _ = answers(tp_dp(tmp_path / "x"), "dp=512", "tp,dp")
    assert dict(plan.rank_map) == {0: 0, 1: 512, 2: 1, 3: 513}
    assert [d.name for _, d in group_shape(s, list(plan.groups["1"][0])).dims] == ["ib"]  # TP across nodes


def hsdp(tmp: Path) -> Path:
    """HSDP on 4 ranks: replicate 2 x shard 2 (shard innermost); per layer a 1 MiB shard all-gathered and a
    4 MiB gradient reduce-scattered along the shard groups, then a 2 MiB all-reduce along the replicas."""
    groups = {"0": ([0, 1, 2, 3], "default_pg"), "s0": ([0, 1], "mesh_dp_shard"), "s1": ([2, 3], "mesh_dp_shard"),
              "r0": ([0, 2], "mesh_dp_replicate"), "r1": ([1, 3], "mesh_dp_replicate")}
    return write_job(tmp / "hsdp", 4, groups, {r: [("coll", AG, f"s{r // 2}", MiB), ("coll", RS, f"s{r // 2}", 4 * MiB),
                                                   ("coll", AR, f"r{r % 2}", 2 * MiB)] for r in range(4)})


@pytest.mark.parametrize(("mesh", "shard", "replica"), [
    ("fsdp=8", list(range(8)), [0, 8]),
    ("fsdp=4,dp=8", [0, 1, 2, 3], list(range(0, 32, 4))),
    ("dp=16", [0, 1], list(range(0, 32, 2))),
])
def test_fsdp_shards_shrink_with_the_shard_degree_only(tmp_path: Path, mesh: str, shard: list[int],
                                                       replica: list[int]) -> None:
    plan, s, got = answers(hsdp(tmp_path), mesh)
    assert open_source(tmp_path / "hsdp" / "job").mesh().describe() == "dp=2 x fsdp=2"
    assert list(plan.groups["s0"][0]) == shard and list(plan.groups["r0"][0]) == replica
    check_priced_on(s, got[("s0", "all_gather")][0], "all_gather", MiB * 2 / len(shard), shard)
    check_priced_on(s, got[("s0", "reduce_scatter")][0], "reduce_scatter", 4 * MiB, shard)
    check_priced_on(s, got[("r0", "all_reduce")][0], "all_reduce", 2 * MiB, replica)


def pp_dp(tmp: Path) -> Path:
    """PP 2 x DP 2: stage 0 = ranks 0, 1 sends a 256 KiB activation to stage 1 = ranks 2, 3, then each stage's
    DP pair all-reduces 1 MiB."""
    groups = {"0": ([0, 1, 2, 3], "default_pg"), "d0": ([0, 1], "mesh_dp"), "d1": ([2, 3], "mesh_dp")}
    steps: dict[int, list[Step]] = {r: [("send", r + 2, 256 << 10)] if r < 2 else [("recv", r - 2, 256 << 10)]
                                    for r in range(4)}
    for r in range(4):
        steps[r].append(("coll", AR, f"d{r // 2}", MiB))
    return write_job(tmp / "pp", 4, groups, steps)


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_pp_x_dp_activations_keep_their_size_and_cross_the_renumbered_stages(tmp_path: Path, dp: int) -> None:
    plan, s, got = answers(pp_dp(tmp_path), f"dp={dp}")
    assert open_source(tmp_path / "pp" / "job").mesh().describe() == "pp=2 x dp=2"
    assert dict(plan.rank_map) == {0: 0, 1: 1, 2: dp, 3: dp + 1}  # stage 1 starts after stage 0's dp ranks
    assert list(plan.groups["d1"][0]) == list(range(dp, 2 * dp))
    check_priced_on(s, got[("d1", "all_reduce")][0], "all_reduce", MiB, list(range(dp, 2 * dp)))
    p2p = got[(f"p2p:1->{dp + 1}:0", "send_recv")][0]
    check_priced_on(s, p2p, "send_recv", 256 << 10, [1, dp + 1])
    assert p2p.rule == "send/recv keeps its size (pipeline activations)"


def test_a_deeper_pipeline_and_another_tp_degree_are_refused_naming_the_dimension(tmp_path: Path) -> None:
    with pytest.raises(MeshError, match=r"--mesh pp=4,dp=2: pp=4: a deeper or shallower pipeline.*keep pp=2"):
        answers(pp_dp(tmp_path), "pp=4,dp=2")
    with pytest.raises(MeshError, match=r"tp=4: a different tensor-parallel degree.*keep tp=2"):
        answers(tp_dp(tmp_path), "dp=2,tp=4")


def ep_dp(tmp: Path, splits: list[list[int]] | None = None) -> Path:
    """DP 2 x EP 2: each rank all-to-alls a 512 KiB token buffer in its EP pair."""
    groups = {"0": ([0, 1, 2, 3], "default_pg"), "e0": ([0, 1], "mesh_ep"), "e1": ([2, 3], "mesh_ep"),
              "d0": ([0, 2], "mesh_dp"), "d1": ([1, 3], "mesh_dp")}
    return write_job(tmp / "ep", 4, groups, {r: [("a2a", f"e{r // 2}", 512 << 10, (splits or [[1, 1]] * 4)[r])]
                                             for r in range(4)})


@pytest.mark.parametrize("ep", [2, 4, 16])
def test_ep_all_to_all_keeps_each_ranks_buffer_and_its_splits_follow_the_ep_degree(tmp_path: Path, ep: int) -> None:
    plan, s, got = answers(ep_dp(tmp_path), f"ep={ep}")
    assert list(plan.groups["e0"][0]) == list(range(ep))
    ans = got[("e0", "all_to_all")][0]
    check_priced_on(s, ans, "all_to_all", 512 << 10, list(range(ep)))
    assert ep == 2 or f"splits follow the group (1/2 -> 1/{ep} of it)" in ans.rule


def test_uneven_ep_splits_are_priced_as_recorded_at_the_recorded_degree_and_uniform_once_resized(
        tmp_path: Path) -> None:
    bundle = ep_dp(tmp_path, [[3, 1], [1, 3], [3, 1], [1, 3]])
    assert answers(bundle, "ep=2,dp=8")[2][("e0", "all_to_all_v")][0].rule.startswith("priced from its recorded")
    ans = answers(bundle, "ep=8")[2][("e0", "all_to_all_v")][0]
    assert "priced as uniform" in ans.rule and ans.nbytes == 512 << 10


# ---------------------------------------------------------------- refusals and the command's surface


@pytest.mark.parametrize(("kw", "match"), [
    ({"mesh": "dp=8,zz=2"}, r"--mesh: unknown mesh dimension 'zz'"),
    ({"mesh": "dp=0"}, r"dp=0.*positive integer"),
    ({"mesh": "dp"}, r"expected NAME=DEGREE"),
    ({"mesh": "dp=8", "clock": "real"}, r"virtual time only"),
    ({"mesh": "dp=8", "placement": "dp,dp"}, r"'dp' is listed twice"),
])
def test_bad_mesh_options_are_usage_errors_naming_the_flag(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ReplayConfigError, match=match):
        ReplayConfig(str(TRACES / "ddp_mlp"), **{"clock": "virtual", **kw})


@pytest.mark.parametrize(("kw", "match"), [
    ({"mesh": "dp=8,tp=2", "world_size": 12}, r"has 16 ranks, but --world-size is 12"),
    ({"mesh": "dp=8,cp=2"}, r"the recording has no cp dimension \(recorded mesh: dp=2 x tp=2\)"),
    ({"mesh": "dp=1"}, r"dp=1: replayed rank 2 has dp coordinate 1"),
    ({"mesh": "dp=8", "placement": "dp"}, r"--placement dp: must list each dimension of the mesh once"),
    ({"placement": "tp,dp"}, r"--placement: places a what-if mesh; give --mesh \(or a \[mesh\] in the what-if\)"),
])
def test_meshes_that_cannot_be_played_are_refused_naming_the_dimension(tmp_path: Path, kw: dict[str, Any],
                                                                        match: str) -> None:
    with pytest.raises(UsageError, match=match):
        run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", **kw))


def test_a_smaller_mesh_plays_the_ranks_that_fit(tmp_path: Path) -> None:
    rep = run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", mesh="dp=1", ranks=(0, 1)))
    assert rep.what_if.world_size == 2


def test_the_report_names_the_meshes_the_topology_and_each_groups_rule(tmp_path: Path) -> None:
    rep = run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", what_if=DGX, mesh="dp=512,tp=2"))
    text = rep.format_text()
    assert "what-if world size: 1024, from --mesh dp=512,tp=2" in text
    assert "recorded mesh: dp=2 x tp=2 (outermost first)" in text
    assert "  tp: 2 -> 2 ranks, on topology nvlink(2)" in text
    assert "  dp: 2 -> 512 ranks, on topology nvlink(4) x ib(128)" in text
    assert "size rule: all_reduce: dp group 2 -> 512 ranks: data-parallel gradient all-reduce keeps its bytes" in text
    doc = rep.to_dict()["mesh"]
    assert doc["recorded"]["mesh"] == "dp=2 x tp=2" and doc["what_if"]["world_size"] == 1024
    assert doc["what_if"]["groups"]["3"] == {"dims": ["dp"], "recorded_size": 2, "size": 512}


def test_world_size_alone_on_a_multi_dimension_mesh_keeps_the_old_rule_and_says_so(tmp_path: Path) -> None:
    rep = run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", world_size=8))
    assert any("only the world group grows" in n for n in rep.notices)


@pytest.mark.parametrize(("name", "dim"), [("ddp_mlp", "dp"), ("fsdp2_transformer", "fsdp"), ("ddp_transformer", "dp")])
def test_a_one_dimension_mesh_is_the_world_size_rule_bit_for_bit(name: str, dim: str) -> None:
    old = run_replay(ReplayConfig(str(TRACES / name), clock="virtual", world_size=64)).to_dict()["what_if"]
    new = run_replay(ReplayConfig(str(TRACES / name), clock="virtual", mesh=f"{dim}=64")).to_dict()["what_if"]
    assert old["iteration_us"] == new["iteration_us"] and old["breakdown_us"] == new["breakdown_us"]


def test_the_shipped_2d_recording_is_dp_by_tp_and_scales_dp_only() -> None:
    """traces/tp_dp_mlp (tp_dp_mlp recorded at W=4): dp=2 x tp=2 named by DeviceMesh's descriptions; at dp=8 x tp=2
    each dp group is 8 ranks at stride 2, each tp group keeps its 2 neighbours, and the bytes keep their size."""
    src = open_source(str(TRACES / "tp_dp_mlp"))
    rep = run_replay(ReplayConfig(str(TRACES / "tp_dp_mlp"), clock="virtual", mesh="dp=8,tp=2"))
    doc = rep.to_dict()["mesh"]
    assert doc["recorded"]["mesh"] == "dp=2 x tp=2" and not doc["recorded"]["guessed"]
    assert [d["named_by"] for d in doc["recorded"]["dims"]] == ["description 'mesh_dp'", "description 'mesh_tp'"]
    groups = doc["what_if"]["groups"]
    for name, ranks in src.groups.items():
        if len(ranks) == 2 and ranks[1] - ranks[0] == 2:
            assert groups[name] == {"dims": ["dp"], "recorded_size": 2, "size": 8}
        elif len(ranks) == 2:
            assert groups[name] == {"dims": ["tp"], "recorded_size": 2, "size": 2}
    assert doc["what_if"]["rank_map"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    plan = plan_for(src.mesh(), "dp=8,tp=2", groups=src.groups, replayed=[0, 1, 2, 3], placement=None)
    members = {tuple(plan.members(g)[0]) for g in src.groups}
    assert {(0, 1), (2, 3), tuple(range(0, 16, 2)), tuple(range(1, 16, 2)), tuple(range(16))} == members
    text = rep.format_text()
    assert "size rule: all_reduce: dp group 2 -> 8 ranks: data-parallel gradient all-reduce keeps its bytes" in text
    assert "size rule: all_reduce: tp group not resized (2 ranks): unchanged" in text
