"""The what-if mesh as a scenario key (issue 17): ``[mesh]`` and ``mesh_placement`` in the TOML, ``--set mesh.dp=N``,
played by ``nbox replay`` and ``nbox sweep`` when ``--mesh`` is not given, and refused where it cannot apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulator_core.backend.live_policy import live_unsupported
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import Scenario, ScenarioError
from emulator_core.scenario.tomltext import dump_toml, loads_scenario
from emulator_core.scenario.world import scenario_mesh
from nbox_replay.replay import ReplayConfig, run_replay
from nbox_replay.sweep import SweepConfig, SweepUsageError, run_sweep
from tests.test_mesh import DGX, tp_dp
from tests.test_mesh_cli import nbox, sweep_config

TRACES = Path(__file__).resolve().parents[1] / "traces"
DGX_TEXT = DGX.read_text()


def what_if(tmp: Path, mesh: str = "", placement: str = "") -> Path:
    """The shipped DGX scenario with a ``[mesh]`` table (``"dp = 8\\ntp = 2"``) and a ``mesh_placement`` line."""
    path = tmp / "mesh.toml"
    top = f"mesh_placement = {placement}\n" if placement else ""
    path.write_text(top + DGX_TEXT + (f"\n[mesh]\n{mesh}\n" if mesh else ""))
    return path


def whatif_doc(config: ReplayConfig) -> dict[str, Any]:
    doc: dict[str, Any] = run_replay(config).to_dict()
    return doc


# ---------------------------------------------------------------- the keys


def test_mesh_and_placement_parse_into_the_scenario_and_round_trip_through_toml(tmp_path: Path) -> None:
    s = load_scenario(what_if(tmp_path, "dp = 512\nshard = 2\ntp = 2", '["pp", "dp", "fsdp", "tp"]'))
    assert s.mesh == (("dp", 512), ("fsdp", 2), ("tp", 2))  # canonical names (shard -> fsdp), in the order given
    assert s.mesh_placement == ("pp", "dp", "fsdp", "tp")
    text = dump_toml(s)
    assert "\n[mesh]\ndp = 512\nfsdp = 2\ntp = 2\n" in text and 'mesh_placement = ["pp", "dp", "fsdp", "tp"]' in text
    assert loads_scenario(text) == s
    assert Scenario.from_dict(s.to_dict()) == s


def test_scenarios_without_a_mesh_are_written_as_before() -> None:
    for path in shipped_scenarios().values():
        s = load_scenario(path)
        assert s.mesh == () and s.mesh_placement == ()
        assert "mesh" not in s.to_dict() and "mesh" not in dump_toml(s)


def test_set_mesh_dim_and_placement() -> None:
    s = load_scenario(DGX, ["mesh.dp=512", "mesh.tp=2", "mesh_placement=tp,dp"])
    assert s.mesh == (("dp", 512), ("tp", 2)) and s.mesh_placement == ("tp", "dp")


@pytest.mark.parametrize(("sets", "match"), [
    (["mesh.dp=0"], r"mesh: dp=0: the degree must be a positive integer"),
    (["mesh.dp=2.5"], r"mesh: dp=2.5: the degree must be a positive integer"),
    (["mesh.zz=2"], r"mesh.zz: unknown key in --set mesh.zz=2 \(allowed: pp, dp, fsdp"),
    (["mesh.shard=2", "mesh.fsdp=4"], r"mesh: dimension 'fsdp' is given twice"),
    (["mesh_placement=dp,tp"], r"mesh_placement: places a what-if mesh: give the \[mesh\] table"),
    (["mesh.dp=8", "mesh_placement=dp,dp"], r"mesh_placement: dimension 'dp' is listed twice"),
    (["mesh.dp=8", "mesh_placement=dp,zz"], r"mesh_placement: unknown mesh dimension 'zz'"),
    (["mesh=8"], r"mesh: --set mesh=8: is a table or array; set one of its keys"),
])
def test_bad_mesh_keys_are_refused_naming_the_key(sets: list[str], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        load_scenario(DGX, sets)


def test_a_mesh_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("mesh = 8\n" + DGX_TEXT)
    with pytest.raises(ScenarioError, match=r"bad.toml: mesh = 8: must be a table of dimension = degree"):
        load_scenario(path)


def test_scenario_mesh_says_where_it_came_from(tmp_path: Path) -> None:
    assert scenario_mesh(None) is None and scenario_mesh(DGX, ["world_size=8"]) is None
    asked = scenario_mesh(None, ["mesh.dp=8"])
    assert asked is not None and asked.degrees == (("dp", 8),) and asked.text == "--set mesh.dp=8"
    assert asked.set_dims == {"dp"}
    asked = scenario_mesh(what_if(tmp_path, "dp = 8\ntp = 2", '["tp", "dp"]'), ["mesh.dp=16"])
    assert asked is not None and asked.degrees == (("dp", 16), ("tp", 2)) and asked.placement == ("tp", "dp")
    assert asked.text == "[mesh] of mesh.toml with --set mesh.dp=16"


def test_the_live_emulation_refuses_a_mesh() -> None:
    why = live_unsupported(load_scenario(None, ["mesh.dp=4"]))
    assert why is not None and why.startswith("mesh dp=4: a what-if mesh is played by nbox replay --clock virtual")


# ---------------------------------------------------------------- nbox replay


def test_a_scenario_mesh_replays_as_the_same_mesh_flag_bit_for_bit(tmp_path: Path) -> None:
    bundle = str(tp_dp(tmp_path))
    flag = whatif_doc(ReplayConfig(bundle, clock="virtual", what_if=DGX, mesh="dp=512,tp=2", placement="tp,dp"))
    by_set = whatif_doc(ReplayConfig(bundle, clock="virtual", what_if=DGX,
                                     overrides=("mesh.dp=512", "mesh_placement=tp,dp")))
    by_file = whatif_doc(ReplayConfig(bundle, clock="virtual", what_if=what_if(tmp_path, "dp = 512", '["tp", "dp"]')))
    for doc in (by_set, by_file):
        assert doc["what_if"]["iteration_us"] == flag["what_if"]["iteration_us"]
        assert doc["what_if"]["breakdown_us"] == flag["what_if"]["breakdown_us"]
        assert doc["mesh"]["what_if"]["groups"] == flag["mesh"]["what_if"]["groups"]
        assert doc["mesh"]["what_if"]["rank_map"] == {"0": 0, "1": 512, "2": 1, "3": 513}
    assert by_set["what_if_world"] == {"world_size": 1024, "source": "--world-size",
                                       "detail": "--set mesh.dp=512 --set mesh_placement=tp,dp"}
    assert by_file["what_if_world"]["detail"] == "[mesh] of mesh.toml"


def test_the_shipped_2d_recording_at_a_scenario_mesh() -> None:
    rep = run_replay(ReplayConfig(str(TRACES / "tp_dp_mlp"), clock="virtual", overrides=("mesh.dp=8",)))
    text = rep.format_text()
    assert "what-if world size: 16, from --set mesh.dp=8" in text
    assert "what-if mesh: dp=8 x tp=2 (placement outermost first, from --set mesh.dp=8)" in text


def test_mesh_flag_replaces_the_scenario_mesh_and_says_so(tmp_path: Path) -> None:
    rep = run_replay(ReplayConfig(str(tp_dp(tmp_path)), clock="virtual", what_if=what_if(tmp_path, "dp = 512"),
                                  mesh="dp=8"))
    assert rep.what_if.world_size == 16
    assert "--mesh dp=8 replaces the what-if scenario's mesh ([mesh] of mesh.toml)" in rep.notices


@pytest.mark.parametrize(("kw", "match"), [
    ({"overrides": ("mesh.dp=8", "world_size=64")}, r"--set mesh.dp=8: the mesh dp=8 x tp=2 has 16 ranks, but "
                                                    r"--set world_size is 64"),
    ({"overrides": ("mesh.dp=8",), "world_size": 64}, r"has 16 ranks, but --world-size is 64"),
    ({"overrides": ("mesh.tp=4",)}, r"--set mesh.tp=4: tp=4: .*keep tp=2"),
    ({"overrides": ("mesh.dp=8", "mesh_placement=dp")}, r"mesh_placement dp: must list each dimension of the mesh"),
    ({"mesh": "dp=8", "world_size": 16, "overrides": ("world_size=64",)}, r"but --set world_size is 64"),
])
def test_scenario_meshes_that_cannot_be_played_are_refused(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(Exception, match=match) as info:
        run_replay(ReplayConfig(str(tp_dp(tmp_path)), **{"clock": "virtual", **kw}))
    assert info.type.__module__.split(".")[0] in ("nbox_replay", "emulator_core", "nbox_trace")


def test_nbox_replay_takes_set_mesh_on_the_command_line(tmp_path: Path) -> None:
    proc = nbox("replay", tp_dp(tmp_path), "--clock", "virtual", "--set", "mesh.dp=8")
    assert proc.returncode == 0, proc.stderr
    assert "what-if world size: 16, from --set mesh.dp=8" in proc.stdout
    # a live replay is refused before any rank starts
    proc = nbox("replay", TRACES / "tp_dp_mlp", "--set", "mesh.dp=8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--set mesh.dp=8: a what-if mesh is replayed in virtual time only; add --clock virtual" in proc.stderr


# ---------------------------------------------------------------- nbox sweep


def test_a_sweep_plays_the_scenario_mesh_at_every_point(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path)
    rows = run_sweep(sweep_config(bundle, ["topology.dims.1.bandwidth_gbps=100,400"], overrides=("mesh.dp=64",)))
    assert [r.world_size for r in rows] == [128, 128]
    assert rows[0].iteration_us > rows[1].iteration_us  # the dp all-reduce crosses the slower network


def test_a_mesh_axis_replaces_the_files_degree_and_keeps_its_other_dimensions(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path)
    plain = run_sweep(sweep_config(bundle, ["mesh.dp=2,8,64"], placement=("tp", "dp")))
    source_cfg = sweep_config(bundle, ["mesh.dp=2,8,64"])
    with_file = run_sweep(SweepConfig.build(dict(source_cfg.traces), dict(source_cfg.groups), 4, ["mesh.dp=2,8,64"],
                                            scenario=what_if(tmp_path, "dp = 512\ntp = 2", '["tp", "dp"]'),
                                            repetitions=1, mesh=source_cfg.mesh))
    assert [r.world_size for r in with_file] == [4, 16, 128]
    assert [r.iteration_us for r in with_file] == [r.iteration_us for r in plain]  # the file's placement applies


@pytest.mark.parametrize(("vary", "sets", "match"), [
    (["mesh.dp=2,8"], ("mesh.dp=4",), r"--vary mesh.dp and --set mesh.dp: both give the dp degree; drop one"),
    (["mesh.shard=2,8"], ("mesh.fsdp=4",), r"--vary mesh.shard and --set mesh.fsdp: both give the fsdp degree"),
    (["world_size=4,8"], ("mesh.dp=4",), r"--vary world_size and the what-if's mesh \(--set mesh.dp=4\): the mesh "
                                         r"makes the world size; vary mesh.<dim> instead"),
])
def test_a_sweep_refuses_two_sources_for_one_degree(tmp_path: Path, vary: list[str], sets: tuple[str, ...],
                                                     match: str) -> None:
    with pytest.raises(SweepUsageError, match=match):
        sweep_config(tp_dp(tmp_path), vary, overrides=sets)


def test_nbox_sweep_refuses_the_clash_with_a_usage_exit(tmp_path: Path) -> None:
    proc = nbox("sweep", tp_dp(tmp_path), "--vary", "mesh.dp=2,8", "--set", "mesh.dp=4", "--out", tmp_path / "o")
    assert proc.returncode == 2
    assert "--vary mesh.dp and --set mesh.dp: both give the dp degree; drop one" in proc.stderr
