"""nccl-tests output: the parser on real files and hostile ones, the fit's round trip, the compare command."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator_core.calibration.nccl_calibrate import calibrate_from_curves, compare, fit_curve, notes
from emulator_core.network.nccl_tests import (
    MAX_FILE_BYTES,
    Curve,
    NcclTestsError,
    Point,
    parse_shape,
    read_curve,
    read_curve_text,
)
from emulator_core.pricing.nccl_curve import time_us
from emulator_core.pricing.pricer import datasheet_of, group_shape, make_pricer
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import ScenarioError
from emulator_core.scenario.nccl_fit import NcclFit
from emulator_core.scenario.tomltext import dump_toml, loads_scenario
from emulator_core.scenario.world import resize
from nbox_trace.errors import NboxError
from tests.test_no_traceback import check, run

ROOT = Path(__file__).resolve().parents[1]
VP = ROOT / "bench" / "data" / "nccl_tests" / "voltage_park_h100"
AR4 = VP / "multinode_nccl_allreduce_20260224_225706.txt"


def _rows(path: Path) -> str:
    """The bare data rows of a real file, as pasted into an issue."""
    return "\n".join(line for line in path.read_text().splitlines() if line.strip()[:1].isdigit()) + "\n"


def test_real_files_give_collective_and_shape_from_the_log() -> None:
    ar = read_curve(AR4)
    assert (ar.collective, ar.nodes, ar.gpus_per_node) == ("all_reduce", 4, 8)
    assert ar.said == {"collective", "shape"} and "H100" in ar.gpu
    assert ar.points[0].size_bytes == 8 and ar.points[-1].size_bytes == 8 << 30
    one = read_curve(VP / "singlenode_nccl_allreduce_.txt")  # one process driving 8 GPUs (-g 8)
    assert (one.nodes, one.gpus_per_node) == (1, 8)
    ag = read_curve(VP / "multinode_nccl_allgather_20260224_225706.txt")  # sizes rounding to 0 are skipped
    assert ag.collective == "all_gather" and ag.points[0].size_bytes > 0
    red = read_curve(VP / "multinode_nccl_reduce_20260225_221049.txt")  # root column = 0
    assert red.collective == "reduce" and len(red.points) == 31


def test_bare_rows_need_and_take_the_flags(tmp_path: Path) -> None:
    bare = tmp_path / "rows.txt"
    bare.write_text(_rows(AR4))
    with pytest.raises(NcclTestsError, match="--collective"):
        read_curve(bare, shape=(4, 8))
    with pytest.raises(NcclTestsError, match="--shape"):
        read_curve(bare, collective="all_reduce")
    c = read_curve(bare, collective="all_reduce", shape=(4, 8))
    assert c.said == frozenset() and c.points == read_curve(AR4).points
    # the bus factor catches a wrong shape or collective even on bare rows
    with pytest.raises(NcclTestsError, match="wrong collective or shape"):
        read_curve(bare, collective="all_reduce", shape=(1, 2))
    with pytest.raises(NcclTestsError, match="wrong collective or shape"):
        read_curve(bare, collective="all_gather", shape=(4, 8))


def test_a_log_contradicting_the_flags_is_refused() -> None:
    with pytest.raises(NcclTestsError, match="not --collective all_gather"):
        read_curve(AR4, collective="all_gather")
    with pytest.raises(NcclTestsError, match="not --shape 2x8"):
        read_curve(AR4, shape=(2, 8))
    assert read_curve(AR4, collective="all_reduce", shape=(4, 8)).nodes == 4


def test_column_variants(tmp_path: Path) -> None:
    """No redop/root columns (all_gather, alltoall in several versions), only the out-of-place group, N/A wrong
    counts, times in ms (old versions' units line)."""
    text = ("#       size         count      type     time   algbw   busbw  #wrong\n"
            "#        (B)    (elements)                (us)  (GB/s)  (GB/s)\n"
            "    33554432       8388608     float    400.0   83.89   78.65     N/A\n"
            "    67108864      16777216     float    700.0   95.87   89.88     N/A\n")
    c = read_curve_text(text, "t", collective="all_to_all", shape=(2, 8))
    assert [p.time_us for p in c.points] == [400.0, 700.0]
    old = text.replace("(us)", "(ms)").replace("400.0", "0.4").replace("700.0", "0.7")
    assert [p.time_us for p in read_curve_text(old, "t", collective="all_to_all", shape=(2, 8)).points] == \
        [400.0, 700.0]


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.replace("  8589934592    2147483648     float     sum      -1  50291.8",
                         "  8589934592    2147483648     float     sum      -1"), "truncated or malformed"),
    (lambda t: t.replace("50291.8", "nan"), "not a number"),
    (lambda t: t.replace("50291.8", "1e999"), "not finite"),
    (lambda t: t.replace("#  Rank  5 Group", "#  Rank  4 Group"), "listed twice"),
    (lambda t: t.replace("#  Rank  5 Group  0 Pid 156329 on       g138", "#  Rank  5 Group  0 Pid 1 on g999"),
     "different numbers of ranks"),
    (lambda t: t + t, "second"),
    (lambda t: t.replace("all_reduce_perf", "hypercube_perf", 1), "not one of"),
    (lambda t: t.replace("       0    38.27", "       3    38.27", 1), "wrong results"),
    (lambda t: t.replace("8589934592    2147483648", "8388608    2147483648"), "does not follow"),
    (lambda t: "x" * 5000 + "\n" + t, "longer than"),
])
def test_hostile_files_get_one_line_naming_file_and_line(tmp_path: Path, mutate: object, match: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(mutate(AR4.read_text()))  # type: ignore[operator]
    with pytest.raises(NcclTestsError, match=match) as info:
        read_curve(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_non_utf8_huge_missing_and_empty(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"# nThread 1\n\xff\xfe\n")
    with pytest.raises(NcclTestsError, match=r"raw.txt:2: not UTF-8"):
        read_curve(raw)
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(NcclTestsError, match="larger than"):
        read_curve(huge)
    with pytest.raises(NcclTestsError, match="cannot read"):
        read_curve(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(NcclTestsError, match="no nccl-tests rows"):
        read_curve(tmp_path / "empty.txt", collective="all_reduce", shape=(1, 2))


@pytest.mark.parametrize("text", ["4x8", " 2 X 8 ", "1*2"])
def test_parse_shape(text: str) -> None:
    assert parse_shape(text)[0] >= 1


@pytest.mark.parametrize("text", ["4", "0x8", "4x0", "axb", "4x8x2", "9" * 80])
def test_parse_shape_refuses(text: str) -> None:
    with pytest.raises(NcclTestsError, match="--shape"):
        parse_shape(text)


_REAL = AR4.read_text()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_parser_never_tracebacks(data: st.DataObject) -> None:
    """Byte-level and line-level mutations of a real file, and random text: a curve or an NboxError, nothing else."""
    lines = _REAL.splitlines()
    how = data.draw(st.sampled_from(["cut", "swap", "token", "random", "dup"]))
    if how == "cut":
        text = _REAL[:data.draw(st.integers(0, len(_REAL)))]
    elif how == "swap":
        i, j = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        text = "\n".join(lines)
    elif how == "token":
        i = data.draw(st.integers(0, len(lines) - 1))
        toks = lines[i].split() or [""]
        k = data.draw(st.integers(0, len(toks) - 1))
        toks[k] = data.draw(st.sampled_from(["", "-1", "N/A", "1e308", "0", "inf", "Rank", "#", "sum", "9" * 30,
                                             "\x00", "é"]))
        lines[i] = " ".join(toks)
        text = "\n".join(lines)
    elif how == "dup":
        i = data.draw(st.integers(0, len(lines) - 1))
        text = "\n".join(lines[:i] + [lines[i]] * data.draw(st.integers(2, 5)) + lines[i:])
    else:
        text = data.draw(st.text(max_size=400))
    coll = data.draw(st.sampled_from([None, "all_reduce", "broadcast"]))
    shape = data.draw(st.sampled_from([None, (4, 8), (1, 2)]))
    try:
        c = read_curve_text(text, "fuzz.txt", collective=coll, shape=shape)
    except NboxError as exc:
        assert "fuzz.txt" in str(exc) or "--" in str(exc)
        assert "\n" not in str(exc)
        return
    assert c.points and c.ranks >= 2


# ------------------------------------------------------------------------------------------- the fit and the CLI


AR1 = VP / "singlenode_nccl_allreduce_.txt"
BC4 = VP / "multinode_nccl_broadcast_20260224_225706.txt"
DGX = load_scenario(shipped_scenarios()["dgx_h100_400g"])


def test_fit_round_trip_and_errors() -> None:
    curves = [read_curve(AR4), read_curve(AR1), read_curve(BC4)]
    scenario, rows = calibrate_from_curves(curves, DGX)
    assert loads_scenario(dump_toml(scenario)) == scenario
    assert scenario.world_size == 32 and scenario.topology.dims[0].size == 8
    own = [r for r in rows if r.source == "fit"]
    assert len(own) == sum(len(c.points) for c in curves)
    assert max(abs(r.error) for r in own if r.size_bytes >= 1 << 20) < 1e-3  # the table passes through its points
    crossed = {r.source for r in rows if r.path == str(AR4)}
    assert crossed == {"fit", "from 1x8"}  # the 4-node curve predicted from the 1-node one


def test_fitted_scenario_prices_other_world_sizes() -> None:
    scenario, _ = calibrate_from_curves([read_curve(AR4)], DGX)
    priced = []
    for world in (32, 64, 256):
        sized = resize(scenario, world)
        name, t = make_pricer(sized, "all_reduce", group_shape(sized))(64 << 20)
        assert name == "nccl_fit"
        priced.append(t)
    assert priced[0] < priced[1] < priced[2]  # more nodes, more ring steps for the same buffer
    # a group inside one node has GPUs per node 8 over 1 node: the 4-node fit scales across the regime by NCCL's
    # ratio, and a group of 4 GPUs per node is not this fit's: the datasheet model prices it
    sized = resize(scenario, 64)
    name, _ = make_pricer(sized, "all_reduce", group_shape(sized, list(range(0, 64, 2))))(1 << 20)
    assert name != "nccl_fit"


def test_regime_factor_moves_with_the_datasheet() -> None:
    """Across regimes (here 4 nodes -> 1 node) the datasheet's NVLink figure scales the measured curve."""
    fit = fit_curve(read_curve(AR4))
    fast = datasheet_of(DGX)
    slow = type(fast)(fast.intra_bw_gbps / 4, fast.inter_bw_gbps, fast.nvls, fast.collnet)
    assert time_us(fit, 1 << 30, 1, slow) > time_us(fit, 1 << 30, 1, fast)
    assert time_us(fit, 1 << 30, 4, slow) == time_us(fit, 1 << 30, 4, fast)  # same regime: the measurement


def test_two_node_curve_above_line_rate_is_scaled_down_beyond_two_nodes() -> None:
    """The known trap: NVLink-assisted algorithms on 2 nodes beat the NICs' line rate; NCCL's regime ratio takes
    a 2-node curve back under it at 4 nodes."""
    rows = "".join(f"{1 << k} {(1 << k) // 4} float sum -1 {(1 << k) / 254.0e3:.2f} 254.00 476.25 0\n"
                   for k in range(26, 34))
    fit = fit_curve(read_curve_text(rows, "two.txt", collective="all_reduce", shape=(2, 8)))
    fabric = datasheet_of(DGX)
    t4 = time_us(fit, 8 << 30, 4, fabric)
    busbw4 = (8 << 30) * 2 * 31 / 32 / (t4 * 1e3)
    assert busbw4 < 476.25 * 0.9
    curve = read_curve_text(rows, "two.txt", collective="all_reduce", shape=(2, 8))
    assert any("NVLink-assisted" in n for n in notes([curve], DGX))
    assert not notes([read_curve(AR4)], DGX)


def test_nccl_fit_entries_are_validated() -> None:
    good = fit_curve(read_curve(AR4)).to_dict()
    for key, value, match in [("busbw", [[2.0, 1.0], [1.0, 2.0]], "increase"), ("busbw", [], "pairs"),
                              ("latency_us", -1, ">= 0"), ("collective", "barrier", "must be one of"),
                              ("nodes", 0, "nodes")]:
        with pytest.raises(ScenarioError, match=match):
            NcclFit.from_dict({**good, key: value})
    with pytest.raises(ScenarioError, match="unknown key"):
        NcclFit.from_dict({**good, "extra": 1})


def test_cli_calibrate_compare_and_refusals(tmp_path: Path) -> None:
    out = tmp_path / "fabric.toml"
    code, stdout, err = run("calibrate", "--nccl-tests", str(AR4), str(AR1), "-o", str(out))
    assert code == 0, err
    assert "from 1x8" in stdout and "median |error|" in stdout and out.exists()
    code, stdout, err = run("scenario", "cost", "all_reduce", "--bytes", str(64 << 20), "--world-size", "128",
                            "--what-if", str(out), "--json")
    assert code == 0, err and '"auto": "nccl_fit"' in stdout
    code, stdout, err = run("scenario", "cost", "all_reduce", "--compare", str(AR4), "--what-if", str(out))
    assert code == 0 and "nccl_fit" in stdout and "real us" in stdout, err
    bare = tmp_path / "rows.txt"
    bare.write_text(_rows(AR4))
    code, stdout, err = run("calibrate", "--nccl-tests", str(bare), "--collective", "all_reduce", "--shape", "4x8",
                            "-o", str(tmp_path / "bare.toml"), "--json")
    assert code == 0 and '"summary"' in stdout, err
    refusals = [
        (["calibrate", "--nccl-tests", str(bare), "-o", str(tmp_path / "x.toml")], 3, "--collective"),
        (["calibrate", "--nccl-tests", str(AR4), "--shape", "2x8", "-o", str(tmp_path / "x.toml")], 3, "2x8"),
        (["calibrate", "--nccl-tests", str(AR4), "-n", "4", "-o", str(tmp_path / "x.toml")], 2, "--nproc"),
        (["calibrate", "--shape", "4x8", "-o", str(tmp_path / "x.toml")], 2, "--shape"),
        (["calibrate", "--nccl-tests", "-o", str(tmp_path / "x.toml")], 2, "FILES"),
        (["calibrate", "--nccl-tests", str(AR4), str(tmp_path / "nope.txt"), "-o", str(tmp_path / "x.toml")], 3,
         "nope.txt"),
        (["scenario", "cost", "all_reduce", "--compare", str(AR4), "--bytes", "8"], 2, "--compare"),
        (["scenario", "cost", "all_gather", "--compare", str(AR4)], 3, "not --collective all_gather"),
        (["scenario", "cost", "all_reduce"], 2, "--bytes"),
    ]
    for args, expected, text in refusals:
        code, stdout, err = run(*args)
        check(args, code, stdout, err, expected, text)
    assert not (tmp_path / "x.toml").exists()  # nothing half-written


def test_compare_prices_every_size_on_the_curves_shape() -> None:
    curve = read_curve(AR4)
    rows = compare(DGX, curve)
    assert [r.size_bytes for r in rows] == [p.size_bytes for p in curve.points]
    assert all(r.model_us > 0 and r.nodes == 4 for r in rows)
    with pytest.raises(NcclTestsError, match="GPUs per node"):
        compare(DGX, read_curve_text(_rows(AR4), "r.txt", collective="all_reduce", shape=(8, 4)))


def test_a_log_pasted_through_markdown(tmp_path: Path) -> None:
    """A report's copy: '#' lost on the rank and test lines (Markdown headings), a code fence, the command line
    naming the binary, prose with numbers after the table."""
    lines = AR4.read_text().splitlines()
    pasted = ["## NCCL TEST RESULT", "", "> mpirun -np 32 ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 1", "```"]
    pasted += [ln.lstrip("#") if "Rank" in ln else ln for ln in lines if "Collective test starting" not in ln]
    pasted += ["```", "", "2 nodes were not used; the `all_reduce_perf` run above had 32 ranks.", "1. Summary"]
    md = tmp_path / "report.md"
    md.write_text("\n".join(pasted) + "\n")
    c = read_curve(md)
    assert (c.collective, c.nodes, c.gpus_per_node) == ("all_reduce", 4, 8)
    assert c.said == {"collective", "shape"} and c.points == read_curve(AR4).points
    with pytest.raises(NcclTestsError, match="command ran all_reduce"):
        read_curve(md, collective="broadcast")


def test_between_two_node_counts_the_fits_are_interpolated() -> None:
    """Curves at 4 and 16 nodes (scaled copies of one real curve, as if measured) price 8 nodes between them."""
    base = read_curve(AR4)
    far = Curve("far.txt", "all_reduce", 16, 8, tuple(Point(p.size_bytes, p.time_us * 1.5, p.algbw_gbps / 1.5,
                                                           p.busbw_gbps / 1.5) for p in base.points))
    scenario, _ = calibrate_from_curves([base, far], DGX)
    sized = resize(scenario, 64)
    name, t = make_pricer(sized, "all_reduce", group_shape(sized))(256 << 20)
    fabric = datasheet_of(sized)
    alone = sorted(time_us(f, 256 << 20, 8, fabric) for f in scenario.nccl_fit)
    assert name == "nccl_fit" and alone[0] < t < alone[1]


def test_old_rank_lines_without_group() -> None:
    """nccl-tests before groups: ``#   Rank  0 Pid  23196 on   dgx1 device  0 [0x06] Tesla V100-SXM2-16GB``."""
    ranks = "".join(f"#   Rank {r:2d} Pid {100 + r:6d} on {'a' if r < 4 else 'b':>6} device {r % 4:2d} [0x06] "
                    f"Tesla V100\n" for r in range(8))
    rows = "".join(f"{1 << k} {(1 << k) // 4} float sum {(1 << k) / 100.0e3:.2f} 100.00 175.00 0\n"
                   for k in range(24, 28))
    curve = read_curve_text("# Using devices\n" + ranks + rows, "old.txt", collective="all_reduce")
    assert (curve.nodes, curve.gpus_per_node, curve.gpu) == (2, 4, "Tesla V100")


def _with_times(curve: Curve, times: dict[int, float], factor: float = 1.0) -> Curve:
    """``curve`` with each size's time taken from ``times``, times ``factor``."""
    from dataclasses import replace

    return replace(curve, points=tuple(replace(p, time_us=times[p.size_bytes] * factor) for p in curve.points))


def test_regime_notes_name_the_size_bands_the_datasheet_model_cannot_reach() -> None:
    from emulator_core.calibration.nccl_calibrate import REGIME_RATIO, SIZE_BANDS, regime_notes

    base = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    curve = read_curve(AR4)
    model = {r.size_bytes: r.model_us for r in compare(base, curve)}
    assert regime_notes([_with_times(curve, model)], base) == []  # exactly as the model prices it
    bands = [name for name, lo, hi in SIZE_BANDS if any(lo <= s <= hi for s in model)]
    fast = regime_notes([_with_times(curve, model, 0.5)], base)
    slow = regime_notes([_with_times(curve, model, 2.0)], base)
    assert [next(b for b in bands if f": {b}: " in n) for n in fast] == bands
    assert [next(b for b in bands if f": {b}: " in n) for n in slow] == bands
    assert all("2.00x faster" in n and "regime the model does not reach" in n and AR4.name in n for n in fast)
    assert all("2.00x slower" in n and "does less than its datasheet" in n for n in slow)
    assert regime_notes([_with_times(curve, model, 0.99 / REGIME_RATIO * REGIME_RATIO ** 0.5)], base) == []


def test_cli_calibrate_says_which_bands_are_out_of_the_models_reach(tmp_path: Path) -> None:
    out = tmp_path / "fabric.toml"
    code, _, err = run("calibrate", "--nccl-tests", str(AR4), "-o", str(out),
                       "--set", "topology.dims.1.bandwidth_gbps=50")  # a datasheet 8x too slow
    assert code == 0, err
    assert "faster than the datasheet model" in err and "1-64 MiB" in err


def test_a_point_slower_than_the_next_larger_size_is_read_as_noise() -> None:
    from emulator_core.scenario.nccl_fit import monotone

    # the example: 317 us at 1 MiB above 227 us at 2 MiB (step times m / busbw, one rank's step = size)
    pts = ((1 << 20, (1 << 20) / 317.0), (2 << 20, (2 << 20) / 227.0), (4 << 20, (4 << 20) / 300.0))
    assert [m / b for m, b in monotone(pts)] == pytest.approx([227.0, 227.0, 300.0])
    fit = NcclFit("broadcast", 2, 8, 10.0, pts)
    times = [time_us(fit, s, 2, datasheet_of(load_scenario(shipped_scenarios()["dgx_h100_400g"])))
             for s in (1 << 20, 3 << 19, 2 << 20)]
    assert times[0] <= times[1] <= times[2]


def test_every_fitted_scenario_is_non_decreasing_in_size_from_1kib_to_8gib() -> None:
    """Every public curve of bench/data/nccl_tests fitted alone and per cluster and collective, priced at 1-64
    nodes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nccl_tests_fit", ROOT / "bench" / "nccl_tests_fit.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    sizes = [1 << e for e in range(10, 34)]
    groups = []
    for curves in bench.load().values():  # AWS p5 at 2-32 nodes, Voltage Park at 1 and 4
        groups += [[c] for c in curves]
        groups += [[c for c in curves if c.collective == k] for k in sorted({c.collective for c in curves})]
    for group in groups:
        scenario, _ = calibrate_from_curves(group, base)
        for nodes in (1, 2, 3, 4, 8, 16, 64):
            s = resize(scenario, 8 * nodes)
            pricer = make_pricer(s, group[0].collective, group_shape(s))
            per_rank = group[0].collective == "all_gather"
            times = [pricer(n / (8 * nodes) if per_rank else n)[1] for n in sizes]
            assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(times)), (group[0].path, nodes, times)


def test_notes_give_the_fit_in_datasheet_units_and_name_the_noise() -> None:
    noisy = read_curve(VP / "singlenode_nccl_broadcast_.txt")
    scenario, _ = calibrate_from_curves([noisy], load_scenario(shipped_scenarios()["dgx_h100_400g"]))
    said = notes([noisy], scenario)
    assert any("fitted latency floor" in n and " us " in n and "GB/s" in n for n in said)
    assert any("512 KiB took 879.36 us, more than 1 MiB's 156.97 us: noise" in n for n in said)
    clean = read_curve(AR4)
    scenario, _ = calibrate_from_curves([clean], load_scenario(shipped_scenarios()["dgx_h100_400g"]))
    assert not any("noise" in n for n in notes([clean], scenario))


def test_a_fitted_scenario_prices_with_its_curve_only_where_the_curve_measured() -> None:
    from dataclasses import replace

    base = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    scenario, _ = calibrate_from_curves([read_curve(AR4)], base)  # all_reduce on 4x8, 8 B - 8 GiB
    bare = replace(scenario, nccl_fit=())

    def price(s, world: int, nbytes: int) -> tuple[str, float]:  # type: ignore[no-untyped-def]
        r = resize(s, world)
        return make_pricer(r, "all_reduce", group_shape(r))(nbytes)

    assert price(scenario, 8, 64 << 20) == price(bare, 8, 64 << 20)  # one node: another regime, the datasheet
    assert price(scenario, 32, 64 << 20)[0] == "nccl_fit" and price(scenario, 128, 64 << 20)[0] == "nccl_fit"
    assert price(scenario, 32, 1 << 10)[0] == "nccl_fit"  # below the table, but the curve measured its floor
    # a curve that starts at 32 MiB (no floor): a 1 MiB call on 32 nodes steps below it, the datasheet prices it,
    # capped at the curve's smallest
    big = [p for p in read_curve(AR4).points if p.size_bytes >= 32 << 20]
    from_big, _ = calibrate_from_curves([replace(read_curve(AR4), points=tuple(big))], base)
    name, t = price(from_big, 256, 1 << 20)
    assert name != "nccl_fit" and t <= price(bare, 256, 1 << 20)[1]
    assert price(from_big, 256, 64 << 20)[0] != "nccl_fit"  # 256 KiB steps: below a 1 MiB step at 4x8
    assert price(from_big, 32, 64 << 20)[0] == "nccl_fit"
