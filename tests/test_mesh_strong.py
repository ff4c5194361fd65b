"""Strong scaling at a what-if mesh (``--global-batch fixed``, issue 17 item 4), with hand-computed answers.

The rule (emulator_core.scenario.mesh): the global batch B x D_rec stays, each rank's batch becomes B x D_rec / D_target
(D: the product of the dp and fsdp degrees), every compute node's recorded duration and every activation
collective's bytes (groups along tp/cp/ep/pp only, send/recv) are scaled by that per-rank batch's ratio; parameter
and gradient collectives (along dp or fsdp) keep their bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulator_core.scenario.mesh import GlobalBatch, MeshError, plan_mesh
from emulator_core.scenario.world import load_what_if
from nbox_replay.inputs.graph import load_rank
from nbox_replay.inputs.meshing import plan_for
from nbox_replay.inputs.source import open_source
from nbox_replay.replay import ReplayConfig, ReplayConfigError, run_replay
from nbox_replay.sweep import SweepUsageError, run_sweep
from nbox_replay.virtual.engine import simulate
from nbox_trace.mesh import MeshFacts, infer_mesh
from tests.test_mesh import DGX, MiB, check_priced_on, tp_dp
from tests.test_mesh_cli import nbox, sweep_config


def test_the_per_rank_batch_and_its_ratio() -> None:
    b = GlobalBatch(per_rank=32, dp_recorded=2, dp_target=8)
    assert (b.target_per_rank, b.ratio) == (8, 0.25)
    assert b.describe() == ("global batch fixed at 64 = 32 x 2: per-rank batch 32 -> 8 over 8 data-parallel ranks; "
                            "compute and activation collectives x 0.25")
    assert b.to_dict() == {"per_rank_recorded": 32, "per_rank": 8, "dp_recorded": 2, "dp": 8, "global": 64,
                           "ratio": 0.25}


def plan(bundle: Path, mesh: str, batch: int | None) -> Any:
    source = open_source(bundle)
    return plan_for(source.mesh(), mesh, groups=source.groups, replayed=source.ranks, placement=None,
                    batch_size=batch)


def test_activation_collectives_follow_the_per_rank_batch_and_gradients_keep_their_bytes(tmp_path: Path) -> None:
    p = plan(tp_dp(tmp_path), "dp=8,tp=2", 32)  # tp groups '1', '2'; dp groups '3', '4'; the world '0'
    assert p.compute_factor == 0.25
    nbytes, rule = p.size("all_reduce", "1", 64 << 10)
    assert nbytes == 16 << 10 and rule.endswith("; activations x 0.25 (per-rank batch 32 -> 8)")
    assert p.size("all_reduce", "3", MiB) == (MiB, "dp group 2 -> 8 ranks: data-parallel gradient all-reduce keeps "
                                                   "its bytes")
    assert p.size("all_reduce", "0", 4)[0] == 4  # the world group spans dp: a loss or a flag, kept
    assert p.size("send_recv", "", 1000)[0] == 250  # pipeline activations
    (tmp_path / "w").mkdir()
    weak = plan(tp_dp(tmp_path / "w"), "dp=8,tp=2", None)
    assert weak.compute_factor == 1.0 and weak.size("all_reduce", "1", 64 << 10)[0] == 64 << 10


def test_compute_and_the_tp_all_reduce_shrink_in_the_virtual_replay(tmp_path: Path) -> None:
    """Each rank: one 100 us compute node, a 64 KiB tp all-reduce, a 1 MiB dp all-reduce. At dp=2 -> 8 with a fixed
    global batch of 2 x 4: compute 25 us, the tp all-reduce 16 KiB on its 2 ranks, the dp one 1 MiB on 8."""
    bundle = tp_dp(tmp_path)
    p = plan(bundle, "dp=8,tp=2", 4)
    source = open_source(bundle)
    scenario, _ = load_what_if(DGX, recorded_world=4, requested=16)
    graphs = {r: load_rank(source.trace_set.files[r], r) for r in source.ranks}
    sim = simulate(graphs, scenario, groups=source.groups, recorded_world=4, mesh=p)
    for r in sim.ranks.values():
        assert [e - s for s, e in r.intervals.compute] == pytest.approx([25.0])
    by = {(a.pg, a.collective): a for a in sim.collectives}
    check_priced_on(scenario, by[("1", "all_reduce")], "all_reduce", 16 << 10, [0, 1])
    check_priced_on(scenario, by[("3", "all_reduce")], "all_reduce", MiB, list(range(0, 16, 2)))
    doc = run_replay(ReplayConfig(str(bundle), clock="virtual", what_if=DGX, mesh="dp=8", global_batch="fixed",
                                  batch_size=4)).to_dict()
    assert doc["mesh"]["what_if"]["global_batch"] == {"per_rank_recorded": 4, "per_rank": 1, "dp_recorded": 2,
                                                      "dp": 8, "global": 8, "ratio": 0.25}


def test_hsdp_counts_dp_and_fsdp_together() -> None:
    """dp=2 x fsdp=2 recorded (data-parallel degree 4), played at dp=4 x fsdp=4 (16): 8 per rank -> 2."""
    groups = {"0": list(range(4)), "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    mesh = infer_mesh(MeshFacts.build(4, groups, descriptions={"1": "mesh_fsdp", "2": "mesh_fsdp",
                                                                "3": "mesh_dp", "4": "mesh_dp"}))
    assert mesh.describe() == "dp=2 x fsdp=2"
    p = plan_mesh(mesh, [("dp", 4), ("fsdp", 4)], groups=groups, replayed=[0, 1, 2, 3], batch_size=8)
    assert p.batch == GlobalBatch(8, 4, 16) and p.compute_factor == 0.25
    assert p.size("all_gather", "1", 1000)[0] == 500  # the fsdp shard shrinks 2/4, not by the batch


@pytest.mark.parametrize(("mesh", "batch", "match"), [
    ("dp=128,tp=2", 32, r"the global batch 64 \(32 per rank x 2 data-parallel ranks\) does not split into whole "
                        r"per-rank batches over 128 data-parallel ranks \(dp=128\)"),
    ("dp=8,tp=2", 3, r"the global batch 6 .* over 8 data-parallel ranks"),
])
def test_a_global_batch_that_does_not_split_is_refused(tmp_path: Path, mesh: str, batch: int, match: str) -> None:
    with pytest.raises(MeshError, match=match):
        plan(tp_dp(tmp_path), mesh, batch)


def test_a_mesh_without_a_data_parallel_dimension_is_refused() -> None:
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}  # tp groups; the pipeline stages send and receive
    mesh = infer_mesh(MeshFacts.build(4, groups, descriptions={"1": "mesh_tp", "2": "mesh_tp"}, p2p=[(0, 2), (1, 3)]))
    assert mesh.describe() == "pp=2 x tp=2"
    with pytest.raises(MeshError, match=r"--global-batch fixed: the recorded mesh \(pp=2 x tp=2\) has no "
                                        r"data-parallel dimension \(dp or fsdp\)"):
        plan_mesh(mesh, [], groups=groups, replayed=[0, 1, 2, 3], batch_size=8)


@pytest.mark.parametrize(("kw", "match"), [
    ({"global_batch": "fixed"}, r"--global-batch fixed: name the recorded per-rank batch with --batch-size B"),
    ({"batch_size": 8}, r"--batch-size: only with --global-batch fixed"),
    ({"global_batch": "strong"}, r"--global-batch 'strong': must be one of weak, fixed"),
    ({"global_batch": "fixed", "batch_size": 0}, r"--batch-size must be >= 1, got 0"),
    ({"global_batch": "fixed", "batch_size": 8, "compute": "live", "mesh": "dp=8"},
     r"--global-batch fixed with --compute live: re-executing the operators at a smaller batch is not built"),
])
def test_bad_global_batch_options_are_usage_errors(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ReplayConfigError, match=match):
        ReplayConfig("traces/ddp_mlp", **{"clock": "virtual", **kw})


def test_a_fixed_global_batch_needs_a_mesh(tmp_path: Path) -> None:
    with pytest.raises(ReplayConfigError, match=r"--global-batch fixed: strong scaling changes the data-parallel "
                                                 r"degree of a mesh; give --mesh"):
        run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", global_batch="fixed", batch_size=8))
    (tmp_path / "tp_dp").rename(tmp_path / "old")
    with pytest.raises(SweepUsageError, match=r"--global-batch fixed: .* vary mesh.<dim>"):
        sweep_config(tp_dp(tmp_path), ["topology.dims.1.bandwidth_gbps=100,400"], batch_size=8)


def test_a_strong_scaling_sweep_divides_compute_by_the_data_parallel_growth(tmp_path: Path) -> None:
    rows = run_sweep(sweep_config(tp_dp(tmp_path), ["mesh.dp=2,4,8"], batch_size=8))
    assert [r.world_size for r in rows] == [4, 8, 16]
    assert [r.compute_us for r in rows] == pytest.approx([100.0, 50.0, 25.0])


def test_nbox_replay_global_batch_fixed_on_the_shipped_2d_recording() -> None:
    proc = nbox("replay", "traces/tp_dp_mlp", "--clock", "virtual", "--mesh", "dp=8", "--global-batch", "fixed",
                "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    assert ("  global batch fixed at 64 = 32 x 2: per-rank batch 32 -> 8 over 8 data-parallel ranks; compute and "
            "activation collectives x 0.25") in proc.stdout
    assert "tp group not resized (2 ranks): unchanged; activations x 0.25 (per-rank batch 32 -> 8)" in proc.stdout
