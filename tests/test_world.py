"""emulator_core.world: one resize and one world-size rule, the same through every command's path.

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

from emulator_core.scenario import ScenarioError
from emulator_core.scenario_files import SCENARIOS_DIR, load_scenario
from emulator_core.scenario_toml import loads_scenario
from emulator_core.world import resize, sets_world_size, what_if_world

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


def test_what_if_world_prefers_the_request_then_a_world_size_override_then_the_recording() -> None:
    s = load_scenario(None, ["world_size=16"])
    assert what_if_world(s, ["world_size=16"], 2, 64) == 64
    assert what_if_world(s, [" world_size = 16"], 2) == 16  # spaces around the key still set it
    assert what_if_world(s, ["compute_scale=2"], 2) == 2
    assert sets_world_size(["world_size=4"]) and not sets_world_size(["topology.dims.0.size=4"])


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
    from emulator_core.backend import EmulationConfig

    cfg = EmulationConfig.from_env(2, {"NBOX_SCENARIO": str(DGX)})
    assert cfg.world_size == 2 and _sizes(cfg.scenario) == [2, 1]


def test_w2_on_an_8_gpu_node_scenario_through_emulate(tmp_path: Path) -> None:
    from nbox_record.emulate import EmulateConfig, _scenario_toml

    out = tmp_path / "scenario.toml"
    _scenario_toml(EmulateConfig(world_size=2, nproc=2, scenario=DGX), out)
    assert _sizes(loads_scenario(out.read_text())) == [2, 1]


def test_w2_on_an_8_gpu_node_scenario_through_sweep_and_replay() -> None:
    from nbox_replay.replay import baseline_scenario
    from nbox_replay.source import open_source
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
