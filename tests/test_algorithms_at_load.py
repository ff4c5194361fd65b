"""Issue 13: "`--set algorithms.all_reduce=tree` validates in `scenario validate` and then crashes replay and
sweep with a 60-line `ValueError` traceback". Scenario values that name algorithms are checked against the
cost models when the scenario is built, so every command refuses them at load time, naming the key and
listing the valid names, before any replay or rank starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.network.netmodel import algorithms_for
from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.model import COLLECTIVES, ScenarioError

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = str(ROOT / "traces" / "ddp_mlp")
BAD = "algorithms.all_reduce=tree"


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_refuses_an_unknown_algorithm_and_lists_the_known_ones(collective: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(None, [f"algorithms.{collective}=tree"])
    assert e.value.key == f"algorithms.{collective}"
    assert f"known: auto, {', '.join(algorithms_for(collective))}" in str(e.value)
    for algo in ("auto", *algorithms_for(collective)):  # every name the cost models price is accepted
        assert load_scenario(None, [f"algorithms.{collective}={algo}"]).algorithm(collective) == algo


@pytest.mark.parametrize("command", [
    ["scenario", "validate", str(ROOT / "emulator_core" / "scenarios" / "loopback_cpu.toml")],
    ["scenario", "show"],
    ["scenario", "cost", "all_reduce", "--bytes", "1024"],
    ["replay", BUNDLE, "--clock", "virtual"],
    ["replay", BUNDLE, "--what-if", str(ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml"),
     "--world-size", "16"],
    ["sweep", BUNDLE, "--vary", "compute_scale=1,2"],
    ["emulate", "--world-size", "2"],
], ids=lambda c: " ".join(c[:2]))
def test_every_command_refuses_it_at_load_with_one_line(command: list[str], tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "nbox", *command, "--set", BAD], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "ValueError" not in r.stderr
    assert 'algorithms.all_reduce = "tree": no cost model for all_reduce; known: auto, ring' in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert not (tmp_path / "sweep").exists()  # nothing written
