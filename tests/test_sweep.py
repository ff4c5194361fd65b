"""What-if sweeps in virtual time: grid order, monotonic trends, determinism across runs and jobs, outputs."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from nbox_replay.sweep import Axis, SweepConfig, SweepError, SweepRow, parse_axis, run_sweep
from nbox_replay.sweep_outputs import format_table, write_csv, write_plot

ROOT = Path(__file__).resolve().parents[1]
TRACES = {r: ROOT / "traces" / "ddp_mlp" / "trace" / f"trace.{r}.et" for r in (0, 1)}
GROUPS = {"0": [0, 1]}
VARY = ["world_size=2,8,64", "topology.dims.0.bandwidth_gbps=10,100"]
BW = "topology.dims.0.bandwidth_gbps"


def _config(jobs: int = 1, vary: list[str] | None = None, scenario: Path | None = None,
            overrides: tuple[str, ...] = ()) -> SweepConfig:
    return SweepConfig.build(TRACES, GROUPS, 2, vary or VARY, jobs=jobs, repetitions=2, scenario=scenario,
                             overrides=overrides)


@pytest.fixture(scope="module")
def rows() -> list[SweepRow]:
    return run_sweep(_config())


def test_grid_order_and_fields(rows: list[SweepRow]) -> None:
    assert [r.values for r in rows] == [(("world_size", w), (BW, b)) for w in (2, 8, 64) for b in (10, 100)]
    assert [r.world_size for r in rows] == [2, 2, 8, 8, 64, 64]
    assert rows[0].speedup == 1.0
    for r in rows:
        assert r.iteration_us > 0 and r.compute_us > 0
        assert r.exposed_comm_us >= 0 and r.overlapped_comm_us >= 0
        assert r.speedup == pytest.approx(rows[0].iteration_us / r.iteration_us)
        assert r.slowest_rank in (0, 1)


def test_trends(rows: list[SweepRow]) -> None:
    it = {(dict(r.values)["world_size"], dict(r.values)[BW]): r.iteration_us for r in rows}
    for b in (10, 100):
        assert it[(2, b)] <= it[(8, b)] <= it[(64, b)]
    for w in (2, 8, 64):
        assert it[(w, 100)] <= it[(w, 10)]
    assert it[(64, 10)] > it[(2, 10)]  # the grid is not flat


def test_deterministic_across_runs_and_jobs(rows: list[SweepRow]) -> None:
    assert run_sweep(_config()) == rows
    seen: list[tuple[int, int]] = []
    parallel = run_sweep(_config(jobs=2), progress=lambda done, total: seen.append((done, total)))
    assert parallel == rows  # bit for bit
    assert seen == [(i, 6) for i in range(1, 7)]


def test_csv_and_png(rows: list[SweepRow], tmp_path: Path) -> None:
    out = write_csv(rows, tmp_path / "s.csv")
    with out.open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [(int(t["world_size"]), int(t[BW])) for t in table] == [(w, b) for w in (2, 8, 64) for b in (10, 100)]
    assert [float(t["iteration_us"]) for t in table] == [r.iteration_us for r in rows]
    assert list(table[0]) == ["world_size", BW, "iteration_us", "compute_us", "exposed_comm_us",
                              "overlapped_comm_us", "slowest_rank", "speedup"]
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(SweepError, match="matplotlib"):
            write_plot(rows, tmp_path / "plot" / "sweep.png")
        return
    png, csv_path = write_plot(rows, tmp_path / "plot" / "sweep.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert csv_path == tmp_path / "plot" / "sweep.csv" and csv_path.read_text() == out.read_text()
    assert sorted(p.name for p in (tmp_path / "plot").iterdir()) == ["sweep.csv", "sweep.png"]


def test_one_axis_and_categorical_plot(tmp_path: Path) -> None:
    rows = run_sweep(_config(vary=["algorithms.all_reduce=ring,double_binary_tree"], overrides=("world_size=64",)))
    assert [dict(r.values)["algorithms.all_reduce"] for r in rows] == ["ring", "double_binary_tree"]
    assert all(r.world_size == 64 for r in rows)
    if importlib.util.find_spec("matplotlib") is not None:
        png, _ = write_plot(rows, tmp_path / "alg.png")
        assert png.stat().st_size > 0


def test_format_table(rows: list[SweepRow]) -> None:
    text = format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[0].split()[:2] == ["world_size", BW]
    # Issue 13: '"11.0 ms" and "6467 us" share a column': each time column has one unit, named in its header.
    unit = lines[0].split("iteration ")[1].split()[0]
    assert unit in ("us", "ms", "s") and not any(" us" in b or " ms" in b for b in lines[2:])
    assert lines[2].split()[-1] == "1.00x"
    assert format_table([]) == "(no rows)\n"


def test_parse_axis() -> None:
    assert parse_axis("world_size=8, 64,512") == Axis("world_size", (8, 64, 512))
    assert parse_axis("compute_scale=1.0,2.5").values == (1.0, 2.5)
    assert parse_axis("algorithms.all_reduce=ring,auto").values == ("ring", "auto")
    for bad, match in (("world_size", "KEY=V1"), ("world_size=", "empty"), ("world_size=8,,16", "empty"),
                       ("world_size=0", "positive"), ("world_size=8,8", "twice"), ("world_size=2.5", "positive"),
                       ("=1,2", "KEY=V1")):
        with pytest.raises(SweepError, match=match):
            parse_axis(bad)


def test_bad_axis_key_is_named() -> None:
    with pytest.raises(SweepError, match=r"topology\.dims\.0\.bandwdth_gbps") as info:
        _config(vary=["world_size=2,8", "topology.dims.0.bandwdth_gbps=10,100"])
    assert info.value.exit_code == 3
    with pytest.raises(SweepError, match="no_such_key"):
        _config(vary=["no_such_key=1,2"])


def test_bad_axis_value_and_config_errors() -> None:
    with pytest.raises(SweepError, match=r"topology\.dims\.0\.bandwidth_gbps.*-3"):
        _config(vary=["topology.dims.0.bandwidth_gbps=10,-3"])
    with pytest.raises(SweepError, match="world_size"):  # 12 is no multiple of dgx's 8 GPUs per node
        _config(vary=["world_size=8,12"], scenario=ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml")
    with pytest.raises(SweepError, match="given twice"):
        _config(vary=["world_size=2", "world_size=8"])
    with pytest.raises(SweepError, match="nothing to vary"):
        SweepConfig.build(TRACES, GROUPS, 2, [])
    with pytest.raises(SweepError, match="jobs"):
        _config(jobs=0)
    with pytest.raises(SweepError, match="outside"):  # rank 1 cannot be replayed in a world of 1
        _config(vary=["world_size=1,2"])


def test_a_sweep_row_and_a_replay_report_of_the_same_scenario_say_the_same() -> None:
    """One run summary (nbox_replay.report.summary) for both commands: the same iteration time, breakdown, slowest
    rank and speed-up when the sweep's first point is the replay's baseline (loopback_cpu at W=2)."""
    from nbox_replay.replay import ReplayConfig, run_replay

    rows = run_sweep(SweepConfig.build(TRACES, GROUPS, 2, ["world_size=2,8"], repetitions=3))
    rep = run_replay(ReplayConfig(str(ROOT / "traces" / "ddp_mlp"), clock="virtual", world_size=8, iterations=3))
    for row, run in ((rows[0], rep.baseline), (rows[1], rep.what_if)):
        assert (row.world_size, row.iteration_us, row.compute_us, row.exposed_comm_us, row.overlapped_comm_us,
                row.slowest_rank) == (run.world_size, run.median_us, run.compute_us, run.exposed_comm_us,
                                      run.overlapped_comm_us, run.slowest_rank)
    assert rows[1].speedup == rep.speedup


def test_speedup_is_one_rule_zero_times_included() -> None:
    """Replay said inf for two zero iteration times (and "faster"), sweep said 1.0 for a zero-time row after a
    non-zero first row: now both use summary.speedup. Issue 13 ("infx (faster)", `Infinity` in `--json`): a
    ratio over a zero time is undefined, None (JSON null, n/a), where it was 1.0 for 0 vs 0 and inf for x vs 0."""
    from nbox_replay.report.summary import speedup

    assert speedup(200.0, 100.0) == 2.0 and speedup(100.0, 200.0) == 0.5
    assert speedup(0.0, 0.0) is None
    assert speedup(5.0, 0.0) is None
    assert speedup(0.0, 5.0) is None
