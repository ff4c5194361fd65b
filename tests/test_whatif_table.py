"""bench/whatif_table.py's arithmetic (issue 59), on a synthetic launch log: each cell's absolute error, its ratio
error against the path's own base, the paired rounds, the live path's base (its pairs' baseline launches), and the
what-ifs' questions. Nothing is launched; no timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import whatif_table as W  # noqa: E402


def _log(tmp_path: Path) -> W.Log:
    log = W.Log(tmp_path / "launches.jsonl")
    for rnd, drift in ((0, 1.0), (1, 1.1)):  # the second round's machine 10% slower, on every side
        log.put("job", rnd, "base", "real", us=[1000.0 * drift] * 3)
        log.put("job", rnd, "nodes4", "real", us=[1500.0 * drift] * 3)
        log.put("job", rnd, "base", "virtual", us=[1100.0 * drift])  # 10% high at the base
        log.put("job", rnd, "nodes4", "virtual", us=[1650.0 * drift])  # 10% high, the ratio right
        log.put("job", rnd, "nodes4", "live", us=[1200.0 * drift], base_us=[1000.0 * drift])  # ratio 20% low
    return log


def test_a_cells_error_ratio_error_and_paired_rounds(tmp_path: Path) -> None:
    rows = {(r["setting"], r["path"]): r for r in W.cells(_log(tmp_path), ["job"], ["base", "nodes4"],
                                                          ["virtual", "live"])}
    v = rows[("nodes4", "virtual")]
    assert v["real_ratio"] == pytest.approx(1.5)
    assert v["ratio_error_pct"] == pytest.approx(0.0, abs=1e-9)  # high by the same 10% at both: the ratio holds
    assert v["paired"]["mean_error_pct"] == pytest.approx(10.0) and v["paired"]["rounds"] == 2
    live = rows[("nodes4", "live")]
    assert live["ratio_error_pct"] == pytest.approx((1.2 / 1.5 - 1) * 100)  # its base: the pairs' baselines
    base_live = rows[("base", "live")]  # the live path's base is every pair's baseline launch
    assert base_live["paired"]["mean_error_pct"] == pytest.approx(0.0, abs=1e-9)
    summary = {(c["setting"], c["path"]): c for c in W.summary(list(rows.values()))}
    assert summary[("nodes4", "live")]["worst_ratio_error_pct"] == pytest.approx(-20.0)
    assert summary[("base", "virtual")]["median_abs_ratio_error_pct"] is None  # the base has no ratio


def test_the_log_resumes_where_a_run_stopped(tmp_path: Path) -> None:
    _log(tmp_path)
    again = W.Log(tmp_path / "launches.jsonl")
    assert again.get("job", 1, "nodes4", "live") is not None and again.get("job", 2, "base", "real") is None


def test_each_what_if_asks_its_question_of_the_calibrated_scenario() -> None:
    s = W.SETTINGS
    assert s["base"].sets(1.2) == () and s["nodes8"].world == 8
    assert s["link4"].sets(1.2) == ("topology.dims.0.bandwidth_gbps=0.3",)
    assert s["racks4"].sets(1.2) == ("topology.dims.0.racks=2", "topology.dims.0.oversubscription=4")
    assert s["straggler"].sets(1.0) == ("stragglers.0.rank=1", "stragglers.0.slowdown=2")
    assert s["racks2"].describe("1gbit") == "4 nodes, 2 racks of 2, 4:1 uplink"


def test_a_log_is_remade_from_its_launches_rank_files_by_the_jobs_pace(tmp_path: Path) -> None:
    """A real launch logged under the largest rank's time per iteration, and an emulate N = 2 launch, are remade from
    their ranks' own files as the mean over ranks (warm-up left out); a launch without files keeps its times, and
    ten ranks' files (rank10 after rank9) are all read."""
    import json

    log = W.Log(tmp_path / "launches.jsonl")
    log.put("job", 0, "nodes4", "real", us=[130.0, 120.0])  # the largest rank's, as logged before
    log.put("job", 0, "nodes8", "emulate2", us=[120.0])  # the largest of its two real ranks
    log.put("job", 0, "link4", "real", us=[500.0])  # no files
    real = tmp_path / "job" / "r0" / "real-nodes4"
    real.mkdir(parents=True)
    per_rank = [[999.0, 80.0, 120.0], [999.0, 130.0, 80.0]] + [[999.0, 100.0, 100.0]] * 8
    for k, times in enumerate(per_rank):
        (real / f"plain-job-0.json.rank{k}").write_text(json.dumps(times))
    (real / "plain-job-0.json.rank0.split").write_text("[]")
    (tmp_path / "job" / "r0" / "emulate2-nodes8.n0.out").write_text(json.dumps(
        {"per_rank_iteration_us": {"0": [100.0], "1": [120.0]}}))
    assert log.refresh(tmp_path, warmup=1) == 2
    assert log.get("job", 0, "nodes4", "real")["us"] == pytest.approx([(80 + 130 + 800) / 10, (120 + 80 + 800) / 10])
    assert log.get("job", 0, "nodes8", "emulate2")["us"] == pytest.approx([110.0])
    assert log.get("job", 0, "link4", "real")["us"] == [500.0]
