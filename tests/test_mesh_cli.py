"""Mesh what-ifs through the commands: `nbox sweep --vary mesh.dp=...` (CSV + PNG), `nbox replay --mesh`,
`nbox bundle inspect` showing the recorded mesh."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_replay.inputs.source import open_source
from nbox_replay.sweep import SweepConfig, SweepError, SweepUsageError, run_sweep
from tests.test_mesh import DGX, tp_dp

ROOT = Path(__file__).resolve().parents[1]


def nbox(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def sweep_config(bundle: Path, vary: list[str], **kw: object) -> SweepConfig:
    source = open_source(bundle)
    return SweepConfig.build(dict(source.trace_set.files), source.groups, source.recorded_world, vary,
                             scenario=DGX, repetitions=1, mesh=source.mesh(), **kw)  # type: ignore[arg-type]


def test_a_mesh_dp_axis_is_a_weak_scaling_curve_at_the_mesh_world_sizes(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path)
    rows = run_sweep(sweep_config(bundle, ["mesh.dp=2,8,64,512"]))
    assert [r.world_size for r in rows] == [4, 16, 128, 1024]
    assert [r.world_size_source for r in rows] == ["--world-size"] * 4
    times = [r.iteration_us for r in rows]
    assert times == sorted(times) and times[0] < times[-1]  # the DP all-reduce grows with the DP degree
    jobs = run_sweep(sweep_config(bundle, ["mesh.dp=2,8,64,512"], jobs=2))
    assert [r.iteration_us for r in jobs] == times


def test_mesh_axes_are_checked_before_anything_runs(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path)
    with pytest.raises(SweepUsageError, match=r"--vary mesh.zz: unknown mesh dimension 'zz'"):
        sweep_config(bundle, ["mesh.zz=2"])
    with pytest.raises(SweepUsageError, match=r"the mesh makes the world size; vary one"):
        sweep_config(bundle, ["mesh.dp=2,4", "world_size=8"])
    with pytest.raises(SweepError, match=r"--vary mesh.tp: value 4 is not valid: .*keep tp=2"):
        sweep_config(bundle, ["mesh.tp=2,4"])


def test_nbox_sweep_writes_the_scaling_curve_as_csv_and_png(tmp_path: Path) -> None:
    proc = nbox("sweep", tp_dp(tmp_path), "--vary", "mesh.dp=2,8,64", "--what-if", DGX, "--out", tmp_path / "out",
                "--iterations", "1")
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "sweep.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["mesh.dp"], r["world_size"]) for r in table] == [("2", "4"), ("8", "16"), ("64", "128")]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "out" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nbox_replay_mesh_and_its_refusals(tmp_path: Path) -> None:
    bundle = tp_dp(tmp_path)
    proc = nbox("replay", bundle, "--clock", "virtual", "--mesh", "dp=8,tp=2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["what_if"]["world_size"] == 16 and doc["mesh"]["what_if"]["mesh"] == "dp=8 x tp=2"
    bad = nbox("replay", bundle, "--clock", "virtual", "--mesh", "dp=8,tp=4")
    assert bad.returncode == 2 and "tp=4" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_bundle_inspect_shows_the_recorded_mesh() -> None:
    proc = nbox("bundle", "inspect", "traces/fsdp2_transformer")
    assert proc.returncode == 0, proc.stderr
    assert "mesh: fsdp=2" in proc.stdout and "named by collectives (all_gather, reduce_scatter)" in proc.stdout
    doc = json.loads(nbox("bundle", "inspect", "traces/ddp_mlp", "--json").stdout)
    assert doc["mesh"]["mesh"] == "dp=2" and doc["mesh"]["dims"][0]["named_by"] == "collectives (all_reduce)"
