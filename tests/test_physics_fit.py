"""``nbox calibrate --nccl-tests --model physics``: the datasheet model's figures fitted to curves, robustly.

Synthetic curves are the model's own times at known figures (what the fit must recover); the real curves are the
public ones in bench/data/nccl_tests (their provenance beside them).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path

import pytest

from emulator_core.calibration.nccl_calibrate import NcclTestsConfig, calibrate_physics, compare
from emulator_core.calibration.physics_fit import carried, fit_physics, sized_base
from emulator_core.network.nccl_tests import Curve, NcclTestsError, Point, read_curve
from emulator_core.pricing.pricer import group_shape, make_pricer
from emulator_core.scenario import Scenario, toml_loads
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import ScenarioError
from emulator_core.scenario.topology import Dimension
from emulator_core.scenario.world import resize
from tests.test_no_traceback import check, run

ROOT = Path(__file__).resolve().parents[1]
VP = ROOT / "bench" / "data" / "nccl_tests" / "voltage_park_h100"
AR4 = VP / "multinode_nccl_allreduce_20260224_225706.txt"
AG4 = VP / "multinode_nccl_allgather_20260224_225706.txt"
SIZES = [1 << e for e in range(10, 34, 2)]  # 1 KiB .. 8 GiB


def _efa(**figures: float) -> Scenario:
    sets = ["topology.dims.1.fabric=efa", "network.host_cpu=amd"]
    sets += [f"topology.dims.1.{k}={v:g}" for k, v in figures.items()]
    return load_scenario(shipped_scenarios()["dgx_h100_400g"], tuple(sets))


def _model_curve(truth: Scenario, collective: str, nodes: int, *, name: str = "") -> Curve:
    """The model's own curve of ``collective`` on ``nodes`` x 8 under the scenario ``truth``."""
    blank = Curve(name or f"{collective}@{nodes}x8", collective, nodes, 8,
                  tuple(Point(s, 1.0, 1.0, 1.0) for s in SIZES))
    times = [r.model_us for r in compare(sized_base([blank], truth), blank)]
    pts = tuple(Point(s, t, s / t / 1e3, s / t / 1e3) for s, t in zip(SIZES, times, strict=True))
    return replace(blank, points=pts)


# ------------------------------------------------------------------------------------------ the scenario key


def test_net_latency_us_is_validated_and_round_trips() -> None:
    d = Dimension("net", 4, "switch", 400.0, 5.0, fabric="efa", net_latency_us=40.0)
    assert Dimension.from_dict(d.to_dict()) == d and d.to_dict()["net_latency_us"] == 40.0
    assert "net_latency_us" not in Dimension("net", 4, "switch", 400.0, 5.0, fabric="efa").to_dict()
    for kw, text in (({"net_latency_us": 40.0}, "fabric"), ({"fabric": "efa", "net_latency_us": -1.0}, ">= 0"),
                     ({"fabric": "nvlink", "net_latency_us": 1.0}, "network fabric"),
                     ({"fabric": "efa", "net_latency_us": 1e9}, "at most")):
        with pytest.raises(ScenarioError, match="net_latency_us") as e:
            Dimension("net", 4, "switch", 400.0, 5.0, **kw)
        assert text in str(e.value)


def test_net_latency_us_moves_the_datasheet_models_answer() -> None:
    """A larger latency per step slows a latency-bound all-reduce across nodes by its steps, a streaming one by a few
    percent."""
    def at(nbytes: int, latency: float) -> float:
        s = resize(_efa(net_latency_us=latency), 32)
        return make_pricer(s, "all_reduce", group_shape(s))(nbytes)[1]

    assert at(64 << 10, 300.0) > at(64 << 10, 75.0) + 200  # EFA's own figure is 75 us
    assert at(8 << 30, 300.0) == pytest.approx(at(8 << 30, 75.0), rel=0.05)


# ------------------------------------------------------------------------------------------ the fit


def test_the_fit_recovers_the_figures_a_curve_was_made_with() -> None:
    truth = _efa(bandwidth_gbps=240.0, net_latency_us=30.0)  # 30 GB/s a GPU
    curves = [_model_curve(truth, "all_reduce", 4), _model_curve(truth, "all_gather", 4)]
    scenario, fit = fit_physics(curves, _efa())
    assert fit.network_fitted and not fit.nvlink_fitted
    # NCCL's graph runs a Hopper channel at 30 GB/s for any NIC in [30, 40) (search.cc's speed array): every figure
    # there prices alike, and the fit keeps the one nearest the datasheet's 50
    assert 30.0 <= fit.nic_gbps < 40.0
    assert fit.net_latency_us == pytest.approx(30.0, abs=3.0)
    assert fit.datasheet_nic_gbps == 50.0 and fit.datasheet_latency_us == 75.0
    assert not scenario.nccl_fit and scenario.topology.dims[-1].net_latency_us == fit.net_latency_us
    assert all(abs(r.residual) < 0.03 for r in fit.residuals) and not any(r.outlier for r in fit.residuals)


def test_an_outlier_is_named_and_hardly_moves_the_figures() -> None:
    truth = _efa(bandwidth_gbps=240.0, net_latency_us=30.0)
    clean = _model_curve(truth, "all_reduce", 4)
    pts = list(clean.points)
    pts[9] = replace(pts[9], time_us=pts[9].time_us * 2)  # 256 MiB twice too slow (still faster than 1 GiB)
    bad = replace(clean, points=tuple(pts))
    _, fit = fit_physics([bad, _model_curve(truth, "all_gather", 4)], _efa())
    flagged = [r for r in fit.residuals if r.outlier]
    assert [(r.path, r.size_bytes) for r in flagged] == [(bad.path, SIZES[9])] and not flagged[0].noise
    assert 30.0 <= fit.nic_gbps < 40.0 and fit.net_latency_us == pytest.approx(30.0, abs=6.0)
    # without the cap (squares everywhere) the same point pulls the bandwidth further: the cap is what acts
    import emulator_core.calibration.physics_fit as pf

    old = pf.HUBER_DELTA
    try:
        pf.HUBER_DELTA = 1e9
        _, squares = fit_physics([bad, _model_curve(truth, "all_gather", 4)], _efa())
    finally:
        pf.HUBER_DELTA = old
    assert abs(squares.net_latency_us - 30) > 3 * abs(fit.net_latency_us - 30) + 0.1  # deterministic: 0.36 vs 0.03


def test_a_point_slower_than_the_next_larger_size_is_noise_left_out() -> None:
    truth = _efa(bandwidth_gbps=240.0, net_latency_us=30.0)
    clean = _model_curve(truth, "all_reduce", 4)
    pts = list(clean.points)
    pts[8] = replace(pts[8], time_us=pts[9].time_us * 1.5)
    _, fit = fit_physics([replace(clean, points=tuple(pts))], _efa())
    noise = [r for r in fit.residuals if r.noise]
    assert [r.size_bytes for r in noise] == [SIZES[8]] and not noise[0].outlier
    assert 30.0 <= fit.nic_gbps < 40.0 and fit.net_latency_us == pytest.approx(30.0, abs=3.0)


def test_a_node_count_is_predicted_from_the_figures_fitted_to_the_others() -> None:
    truth = _efa(bandwidth_gbps=240.0, net_latency_us=30.0)
    curves = [_model_curve(truth, "all_reduce", n) for n in (2, 4, 8)]
    got = carried(curves, _efa())
    assert [(c.nodes, label) for c, label, _ in got] == [(2, "from 4x8,8x8"), (4, "from 2x8,8x8"),
                                                       (8, "from 2x8,4x8")]
    for c, _, times in got:
        assert all(t == pytest.approx(pt.time_us, rel=0.05) for pt, t in zip(c.points, times, strict=True))


def test_every_physics_fit_of_the_public_curves_is_non_decreasing_from_1kib_to_8gib() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("nccl_tests_fit", ROOT / "bench" / "nccl_tests_fit.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sizes = [1 << e for e in range(10, 34)]
    for cluster, curves in bench.load().items():
        scenario, fit = fit_physics(curves, bench.cluster_base(cluster, fabric=True))
        assert 1 < fit.nic_gbps < 200 and 0 <= fit.net_latency_us < 2000
        for collective in sorted({c.collective for c in curves}):
            for nodes in (1, 2, 3, 4, 8, 16, 64):
                s = resize(scenario, 8 * nodes)
                pricer = make_pricer(s, collective, group_shape(s))
                per_rank = collective == "all_gather"
                times = [pricer(n / (8 * nodes) if per_rank else n)[1] for n in sizes]
                assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(times)), (cluster, collective, nodes)


def test_calibrate_physics_rows_and_notes_on_a_real_curve() -> None:
    curves = [read_curve(AR4), read_curve(AG4)]
    scenario, rows, said = calibrate_physics(curves, load_scenario(shipped_scenarios()["dgx_h100_400g"]))
    assert {r.source for r in rows} == {"physics"} and len(rows) == sum(len(c.points) for c in curves)
    assert said[0].startswith("physics fit: NVLink 450.0 GB/s per GPU (not fitted")
    assert "GB/s per GPU (datasheet 50.0)" in said[0] and "us per step (infiniband: 0)" in said[0]
    assert scenario.topology.dims[-1].net_latency_us is not None and not scenario.nccl_fit


def test_the_model_option_is_validated() -> None:
    with pytest.raises(NcclTestsError, match="--model 'table'"):
        NcclTestsConfig((AR4,), model="table")
    dgx = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    dims = dgx.topology.dims
    plain = replace(dgx, topology=replace(dgx.topology, dims=(dims[0], replace(dims[1], fabric=""))))
    with pytest.raises(NcclTestsError, match="fabric"):
        fit_physics([read_curve(AR4)], plain)


def test_cli_physics_writes_the_fitted_figures_and_refuses_what_does_not_apply(tmp_path: Path) -> None:
    out = tmp_path / "fabric.toml"
    plain = tmp_path / "plain.toml"  # the shipped scenario without its network's kind
    plain.write_text(re.sub(r'(?m)^fabric = "infiniband".*\n', "", shipped_scenarios()["dgx_h100_400g"].read_text()))
    code, stdout, err = run("calibrate", "--nccl-tests", str(AR4), "--model", "physics", "-o", str(out))
    assert code == 0, err
    assert "model: physics" in stdout and "median |error|" in stdout
    assert "physics fit: NVLink" in err and "us per step" in err and "the physics fit's figures" in err
    doc = toml_loads()(out.read_text())
    assert "nccl_fit" not in doc and "net_latency_us" in doc["topology"]["dims"][1]
    code, stdout, err = run("scenario", "cost", "all_reduce", "--compare", str(AR4), "--what-if", str(out))
    assert code == 0 and "real us" in stdout, err
    for args, expected, text in (
            (["calibrate", "--model", "physics", "-o", str(tmp_path / "x.toml")], 2, "--model"),
            (["calibrate", "--nccl-tests", str(AR4), "--model", "table", "-o", str(tmp_path / "x.toml")], 3, "table"),
            (["calibrate", "--nccl-tests", str(AR4), "--model", "physics", "--what-if", str(plain),
              "-o", str(tmp_path / "x.toml")], 3, "fabric")):
        code, stdout, err = run(*args)
        check(args, code, stdout, err, expected, text)
    assert not (tmp_path / "x.toml").exists()


def test_a_held_out_clusters_node_counts_from_one_fit() -> None:
    """bench/data/nccl_tests/heldout/h100_ib_issue309 (its PROVENANCE.md): all-reduce at 2, 4 and 8 nodes of one
    H100 InfiniBand cluster. Fitted at 4 nodes, the streaming sizes (1 GiB and up) of 2 and 8 nodes are priced
    within 10% (results.md has every size)."""
    folder = ROOT / "bench" / "data" / "nccl_tests" / "heldout" / "h100_ib_issue309"
    curves = {n: read_curve(folder / f"all_reduce_{n}x8.txt", collective="all_reduce") for n in (2, 4, 8)}
    assert all(c.nodes == n and c.gpus_per_node == 8 for n, c in curves.items())
    scenario, fit = fit_physics([curves[4]], load_scenario(shipped_scenarios()["dgx_h100_400g"]))
    assert fit.network_fitted and 10 < fit.nic_gbps < 60
    for n in (2, 8):
        big = [r for r in compare(scenario, curves[n]) if r.size_bytes >= 1 << 30]
        assert big and all(abs(r.error) < 0.10 for r in big), [(r.size_bytes, r.error) for r in big]
