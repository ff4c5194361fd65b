"""emulator_core.scenario.world: one resize and one world-size rule, the same through every command's path.

Issue 13 ("World size from four places"): ``--world-size``, else ``--set world_size``, else the what-if file's
``world_size``, else the recorded one, for replay, sweep and emulate; dependent values (stragglers) checked after.

Before, ``nbox replay`` resized with a fallback (a world no larger than the innermost dimension keeps only
that dimension) that ``nbox scenario cost``, ``nbox sweep``, ``nbox emulate`` and the backend lacked (they
refused W=2 on an 8-GPU-per-node scenario), and ``nbox sweep`` ignored ``--set world_size`` (it always
played the recorded world size) where ``nbox replay`` honoured it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario
from emulator_core.scenario.model import ScenarioError
from emulator_core.scenario.tomltext import loads_scenario
from emulator_core.scenario.world import WhatIfWorld, load_what_if, resize, sets_world_size, what_if_world

ROOT = Path(__file__).resolve().parents[1]
DGX = SCENARIOS_DIR / "dgx_h100_400g.toml"
TRACES = {r: ROOT / "traces" / "ddp_mlp" / "trace" / f"trace.{r}.et" for r in (0, 1)}


def _sizes(scenario: object) -> list[int]:
    return [d.size for d in scenario.topology.dims]  # type: ignore[attr-defined]


def test_resize_grows_the_outermost_dimension_or_keeps_the_innermost_for_a_small_world() -> None:
    s = load_scenario(DGX)
    assert _sizes(resize(s, 64)) == [8, 8] and resize(s, 64).world_size == 64
    assert _sizes(resize(s, 2)) == [2, 1] and resize(s, 2).world_size == 2
    assert _sizes(resize(s, 8)) == [8, 1]
    assert resize(s, 1024) is s
    for bad in (12, 0):
        with pytest.raises(ScenarioError, match=f"world_size = {bad}: must be a positive multiple of 8"):
            resize(s, bad)


def test_what_if_world_prefers_the_request_then_a_world_size_override_then_the_file_then_the_recording() -> None:
    """Issue 13, "World size from four places": one precedence, and each answer says where it came from."""
    assert what_if_world(requested=64, set_world=16, file_world=8, recorded_world=2) == WhatIfWorld(64, "--world-size")
    assert what_if_world(set_world=16, file_world=8, recorded_world=2) == WhatIfWorld(16, "--set world_size")
    assert what_if_world(file_world=8, recorded_world=2, file_name="x.toml") == WhatIfWorld(8, "what-if file", "x.toml")
    assert what_if_world(recorded_world=2) == WhatIfWorld(2, "recorded")
    with pytest.raises(ScenarioError, match="no world size"):
        what_if_world()
    assert sets_world_size(["world_size=4"]) and sets_world_size([" world_size = 16"])
    assert not sets_world_size(["topology.dims.0.size=4"])


def test_load_what_if_follows_the_rule_and_a_default_file_does_not_count() -> None:
    """Issue 13: `--what-if dgx_h100_400g.toml` (world_size = 1024 in the file) replayed at the recorded size."""
    s, w = load_what_if(DGX, recorded_world=2)
    assert (s.world_size, w.source) == (1024, "what-if file") and "dgx_h100_400g.toml" in w.describe()
    s, w = load_what_if(None, recorded_world=2, default=DGX)  # the baseline's file, not named by the user
    assert (s.world_size, w.source, _sizes(s)) == (2, "recorded", [2, 1])
    s, w = load_what_if(DGX, ["world_size=64"], recorded_world=2)  # fixed 8 x 128 dims: resized, not refused
    assert (s.world_size, w.source, _sizes(s)) == (64, "--set world_size", [8, 8])
    s, w = load_what_if(DGX, ["world_size=64"], recorded_world=2, requested=2)
    assert (s.world_size, w.source, _sizes(s)) == (2, "--world-size", [2, 1])
    s, w = load_what_if(None, recorded_world=None)  # nbox emulate without a recording: the default file's size
    assert (s.world_size, w.source) == (8, "what-if file")


def test_a_straggler_rank_is_checked_against_the_settled_world_size() -> None:
    """Issue 13: "a straggler rank is checked against the base file before resizing" (rank 40 on an 8-rank
    file was refused even with --world-size 64)."""
    slow = ["stragglers.0.rank=40", "stragglers.0.slowdown=2"]
    s, w = load_what_if(None, slow, recorded_world=2, requested=64)
    assert s.slowdown(40) == 2.0 and w.size == 64
    with pytest.raises(ScenarioError, match=r"stragglers\[0\]\.rank = 40: must be < world_size \(16\) \(the world "
                                            r"size is 16, from --world-size\)"):
        load_what_if(None, slow, recorded_world=2, requested=16)
    with pytest.raises(ScenarioError, match=r"world_size = 12: must be a positive multiple of 8.*from --world-size"):
        load_what_if(DGX, recorded_world=2, requested=12)


def _replay_doc(*args: str) -> dict[str, object]:
    r = _nbox("replay", str(ROOT / "traces" / "ddp_mlp"), "--clock", "virtual", "--iterations", "1", "--json", *args)
    assert r.returncode == 0, r.stderr
    doc: dict[str, object] = json.loads(r.stdout)
    return doc


def test_replay_plays_the_what_if_files_world_size_and_says_where_it_came_from() -> None:
    """Issue 13: `--what-if dgx_h100_400g.toml` replayed at the recorded size; `--world-size 2` on it must work."""
    doc = _replay_doc("--what-if", str(DGX))
    assert doc["what_if"]["world_size"] == 1024 and doc["baseline"]["world_size"] == 2  # type: ignore[index]
    assert doc["what_if_world"] == {"world_size": 1024, "source": "what-if file", "detail": "dgx_h100_400g.toml"}
    doc = _replay_doc("--what-if", str(DGX), "--world-size", "2")
    assert doc["what_if_world"]["source"] == "--world-size"  # type: ignore[index]
    assert doc["what_if"]["world_size"] == 2  # type: ignore[index]
    assert _replay_doc()["what_if_world"]["source"] == "recorded"  # type: ignore[index]
    text = _nbox("replay", str(ROOT / "traces" / "ddp_mlp"), "--clock", "virtual", "--iterations", "1",
                 "--set", "world_size=64")
    assert text.returncode == 0 and "what-if world size: 64, from --set world_size" in text.stdout + text.stderr


def test_sweep_plays_the_same_world_size_as_replay_with_its_source(tmp_path: Path) -> None:
    """Issue 13: one world-size rule for replay, sweep and emulate (`--set world_size` and the what-if file)."""
    from nbox_replay.sweep import SweepConfig, run_sweep

    cfg = SweepConfig.build(TRACES, {"0": [0, 1]}, 2, ["compute_scale=1.0"], scenario=DGX, repetitions=1)
    (row,) = run_sweep(cfg)
    assert (row.world_size, row.to_dict()["world_size_source"]) == (1024, "what-if file")
    cfg = SweepConfig.build(TRACES, {"0": [0, 1]}, 2, ["compute_scale=1.0"], overrides=["world_size=64"],
                            repetitions=1)
    assert [(r.world_size, r.world_size_source) for r in run_sweep(cfg)] == [(64, "--set world_size")]
    r = _nbox("sweep", str(ROOT / "traces" / "ddp_mlp"), "--vary", "compute_scale=1,2", "--set", "world_size=64",
              "--iterations", "1", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    assert {(row["world_size"], row["world_size_source"]) for row in json.loads(r.stdout)["rows"]} == {
        (64, "--set world_size")}


def test_emulate_takes_its_world_size_from_the_same_rule() -> None:
    """Issue 13: `nbox emulate` required --world-size; now --set world_size, else the file's, as replay."""
    from nbox_record.launch.emulation import EmulateConfig

    assert (EmulateConfig(scenario=DGX).world_size, EmulateConfig(scenario=DGX).world_from) == (
        1024, "1024, from the what-if file dgx_h100_400g.toml")
    assert EmulateConfig(overrides=("world_size=16",)).world_size == 16
    assert EmulateConfig(world_size=4, overrides=("world_size=16",)).world_from == "4, from --world-size"


def _nbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_w2_on_an_8_gpu_node_scenario_through_scenario_cost() -> None:
    r = _nbox("scenario", "cost", "all_reduce", "--bytes", "1048576", "--world-size", "2", "--what-if", str(DGX),
              "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["world_size"] == 2


def test_w2_on_an_8_gpu_node_scenario_through_the_backend_config() -> None:
    pytest.importorskip("torch")
    from emulator_core.backend.process_group import EmulationConfig

    cfg = EmulationConfig.from_env(2, {"NBOX_SCENARIO": str(DGX)})
    assert cfg.world_size == 2 and _sizes(cfg.scenario) == [2, 1]


def test_w2_on_an_8_gpu_node_scenario_through_emulate(tmp_path: Path) -> None:
    from nbox_record.launch.emulation import EmulateConfig, _scenario_toml

    out = tmp_path / "scenario.toml"
    _scenario_toml(EmulateConfig(world_size=2, nproc=2, scenario=DGX), out)
    assert _sizes(loads_scenario(out.read_text())) == [2, 1]


def test_w2_on_an_8_gpu_node_scenario_through_sweep_and_replay() -> None:
    from nbox_replay.inputs.source import open_source
    from nbox_replay.replay import baseline_scenario
    from nbox_replay.sweep import SweepConfig

    cfg = SweepConfig.build(TRACES, {"0": [0, 1]}, 2, ["world_size=2,16"], scenario=DGX)
    assert [_sizes(cfg.point_scenario(p)) for p in cfg.grid()] == [[2, 1], [8, 2]]
    source = open_source(str(ROOT / "traces" / "ddp_mlp"))
    assert _sizes(baseline_scenario(source, DGX)[0]) == [2, 1]


def test_sweep_without_a_world_axis_plays_what_replay_plays() -> None:
    from nbox_replay.sweep import SweepConfig

    recorded = SweepConfig.build(TRACES, {"0": [0, 1]}, 2, ["compute_scale=1.0,2.0"])
    assert recorded.point_scenario(recorded.grid()[0]).world_size == 2  # the recording's, not the file's 8
    overridden = SweepConfig.build(TRACES, {"0": [0, 1]}, 2, ["compute_scale=1.0,2.0"], overrides=["world_size=16"])
    assert overridden.point_scenario(overridden.grid()[0]).world_size == 16
