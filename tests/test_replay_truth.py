"""``nbox replay --truth`` (issue 59): a prediction from a small recording set against a recording made at the
what-if's world size: the absolute error, the scaling's error and the two breakdowns; bad truths refused in one
line, before anything runs.

The vectors are the shipped bundles (``traces/``): ``ddp_mlp`` at world size 2 stands for the small recording and
``tp_dp_mlp`` at 4 for the large one (another job: the test checks the comparison's mechanics, not nbox's error).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_replay.replay import ReplayConfig, run_replay
from nbox_replay.settings import ReplayConfigError
from nbox_replay.truth import TruthError
from nbox_trace.bundle import OBSERVED_RULE, job_iterations_us, observed_iteration_us

ROOT = Path(__file__).resolve().parents[1]
SMALL, BIG = ROOT / "traces" / "ddp_mlp", ROOT / "traces" / "tp_dp_mlp"


def _observed(bundle: Path) -> dict[str, float]:
    """The bundle's observed iterations under this version's rule (the shipped ones predate it: remade from their
    ranks' times)."""
    found = observed_iteration_us(json.loads((bundle / "manifest.json").read_text())["observed"])
    assert found is not None
    return found


def test_a_bundle_written_under_the_old_rule_is_read_under_the_jobs_pace() -> None:
    """Bundles written before the mean over ranks took the slowest rank per iteration: the replay and --truth
    read them remade from their ranks' own times, and say which rule the stored figure had; a manifest whose rule
    is this version's, or whose ranks' times are not whole, is read as stored."""
    observed = json.loads((BIG / "manifest.json").read_text())["observed"]
    assert observed["rule"] != OBSERVED_RULE
    remade = observed_iteration_us(observed)
    assert remade is not None and remade["remade_from"] == observed["rule"]
    job = job_iterations_us({int(r): v for r, v in observed["per_rank_us"].items()})
    assert remade["median"] == pytest.approx(statistics.median(job))
    assert remade["median"] < observed["iteration_time_us"]["median"]  # the slowest rank's is above the pace
    assert observed_iteration_us({**observed, "rule": OBSERVED_RULE}) == observed["iteration_time_us"]
    for bad in ({"0": []}, {"0": [1.0, float("nan")]}, {"x": [1.0]}, {"0": [True]}, [], {"0": "1"}):
        assert observed_iteration_us({**observed, "per_rank_us": bad}) == observed["iteration_time_us"]
    assert observed_iteration_us({"per_rank_us": {"0": [1.0]}}) is None
    rep = run_replay(ReplayConfig(str(SMALL), clock="virtual", world_size=4, truth=BIG, iterations=1))
    assert rep.truth is not None and rep.truth.observed["median"] == remade["median"]


def test_the_prediction_is_set_against_the_truths_observed_iterations_and_its_own_breakdown() -> None:
    rep = run_replay(ReplayConfig(str(SMALL), clock="virtual", world_size=4, truth=BIG, iterations=1))
    truth = rep.truth
    assert truth is not None and truth.world_size == 4
    big, small = _observed(BIG), _observed(SMALL)
    assert truth.observed["median"] == big["median"] and truth.observed["n"] == big["n"]
    assert truth.predicted_us == rep.what_if.median_us
    assert truth.error_pct == pytest.approx((rep.what_if.median_us / big["median"] - 1) * 100)
    assert truth.real_ratio == pytest.approx(big["median"] / small["median"])
    assert truth.ratio_error_pct == pytest.approx(
        (rep.what_if.median_us / rep.baseline.median_us) / (big["median"] / small["median"]) * 100 - 100)
    assert truth.own is not None and truth.own.world_size == 4 and truth.own.breakdown is not None
    assert truth.own.median_us > 0 and truth.own.median_us != truth.predicted_us  # another job's own replay
    text = rep.format_text()
    assert f"truth: {BIG}, recorded at world size 4: observed" in text and "scaling from the recorded setting" in text
    assert "the truth's recording under the what-if" in text
    doc = rep.to_dict()["truth"]
    assert doc["error_pct"] == pytest.approx(truth.error_pct) and doc["breakdown_truth_recording_us"]["compute"] > 0


def test_the_truths_own_compute_is_not_slowed_again_by_a_what_if_straggler() -> None:
    """The truth recorded its compute at the what-if; a straggler of the what-if is not applied to it again."""
    plain = run_replay(ReplayConfig(str(SMALL), clock="virtual", world_size=4, truth=BIG, iterations=1))
    slow = run_replay(ReplayConfig(str(SMALL), clock="virtual", world_size=4, truth=BIG, iterations=1,
                                   overrides=("stragglers.0.rank=1", "stragglers.0.slowdown=3")))
    assert plain.truth is not None and slow.truth is not None and slow.truth.own is not None
    assert slow.what_if.median_us > plain.what_if.median_us  # the prediction takes the straggler
    assert plain.truth.own is not None and slow.truth.own.median_us == pytest.approx(plain.truth.own.median_us)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"world_size": 8}, "recorded at world size 4, the what-if plays 8; give --world-size 4"),
    ({"world_size": 2}, "recorded at world size 4, the what-if plays 2"),
])
def test_a_truth_of_another_world_size_is_refused_naming_both(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(TruthError, match=match):
        run_replay(ReplayConfig(str(SMALL), clock="virtual", truth=BIG, **kwargs))  # type: ignore[arg-type]


def test_a_bare_et_a_missing_path_and_a_mesh_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TruthError, match="a bare Chakra ET has no observed iterations"):
        run_replay(ReplayConfig(str(SMALL), clock="virtual", truth=ROOT / "traces" / "synthetic_ddp_mlp"))
    with pytest.raises(TruthError, match=re.escape(f"--truth {tmp_path / 'nope'}")):
        run_replay(ReplayConfig(str(SMALL), clock="virtual", world_size=4, truth=tmp_path / "nope"))
    with pytest.raises(ReplayConfigError, match=r"--truth .* with --mesh"):
        ReplayConfig(str(SMALL), clock="virtual", truth=BIG, mesh="dp=4")


def test_the_cli_prints_the_truth_and_exits_2_on_a_bad_one() -> None:
    cmd = [sys.executable, "-m", "nbox", "replay", str(SMALL), "--clock", "virtual", "--iterations", "1"]
    ok = subprocess.run([*cmd, "--world-size", "4", "--truth", str(BIG), "--json"], capture_output=True, text=True,
                        cwd=ROOT, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["truth"]["world_size"] == 4
    bad = subprocess.run([*cmd, "--truth", str(BIG)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1].endswith("give --world-size 4 (or a truth recorded at 2)")
