"""bench/seeds_table.py without launches: a fake runner's rounds are interleaved (the real launch first in even
rounds, last in odd ones), each side's row is its pooled median against the real one, and the CSV and PNG are
written."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import seeds_table as st  # noqa: E402


def fake_runner(calls: list[str], emulate_us: float) -> st.Runner:
    def real(model: str, rnd: int) -> list[float]:
        calls.append(f"real{rnd}")
        return [1000.0 + rnd, 1010.0 + rnd, 990.0 + rnd]

    def record(model: str, rnd: int) -> Path:
        calls.append(f"record{rnd}")
        return Path(f"/nowhere/{model}.{rnd}.bundle")

    def live(bundle: Path, rnd: int) -> list[float]:
        calls.append(f"live{rnd}")
        return [1100.0, 1100.0]

    def emulate(model: str, rnd: int) -> list[float]:
        calls.append(f"emulate{rnd}")
        return [emulate_us, emulate_us]

    return st.Runner(real, record, live, emulate, None, "fake: no launches")


def test_rounds_interleave_and_each_side_is_held_against_the_real_launches(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    monkeypatch.setattr(st, "virtual", lambda bundle, scenario: [980.0])
    calls: list[str] = []
    row = st.run_model(fake_runner(calls, 1000.0), "bert", 2)
    assert calls == ["real0", "emulate0", "record0", "live0", "record1", "live1", "emulate1", "real1"]
    assert row["real"]["median_us"] == pytest.approx(1000.5) and row["real"]["n"] == 6
    assert row["live"]["error_pct"] == pytest.approx((1100 / 1000.5 - 1) * 100)
    assert row["virtual"]["error_pct"] == pytest.approx((980 / 1000.5 - 1) * 100)
    assert row["emulate"]["met"] and not row["live"]["met"]  # +10%: outside 2% and outside the real p10-p90
    assert row["seeds"]["observed_ms"] == 628.0 and row["live"]["paired"]["rounds"] == 2
    slower = st.run_model(fake_runner([], 1050.0), "bert", 2)  # the emulated time moves its error and verdict
    assert slower["emulate"]["error_pct"] > row["emulate"]["error_pct"] and not slower["emulate"]["met"]
    st.write_csv([row, slower], tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    assert [ln["model"] for ln in lines] == ["bert", "bert"] and float(lines[1]["emulate_err_pct"]) > 4
    st.write_png([row], tmp_path / "t.png", "fake")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert "NOT met" in st.format_table([row]) and "628±1.1 vs 629±3.0" in st.format_table([row])


def test_the_bench_refuses_what_it_cannot_run() -> None:
    for argv in ([], ["--testbed", "--device", "cuda"], ["--testbed", "--models", "gpt2"],
                 ["--testbed", "--rounds", "1"]):
        with pytest.raises(SystemExit) as e:
            st.main(argv)
        assert e.value.code == 2


def test_a_recordings_run_queue_wait_is_read_from_its_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recording's training-thread wait for a CPU (what marks a recording made beside another busy process)
    is the median over its ranks' clean iterations, in ms; a bundle without the figure gives nan."""
    from types import SimpleNamespace

    from nbox_trace.bundle import manifest as B

    lists = {"0": {"clean_run_queue": [1000.0, 3000.0, 240000.0]}, "1": {"clean_run_queue": [2000.0]}}
    monkeypatch.setattr(B, "read_manifest", lambda _p: SimpleNamespace(observed={B.THREAD_CPU_KEY: lists}))
    assert st.recorded_wait_ms(Path("x.bundle")) == 2.5
    monkeypatch.setattr(B, "read_manifest", lambda _p: SimpleNamespace(observed={}))
    assert st.recorded_wait_ms(Path("x.bundle")) != st.recorded_wait_ms(Path("x.bundle"))  # nan


def test_a_users_script_runs_through_the_same_commands_and_its_row_has_no_seeds(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """``--script PATH``: the launches name the script after ``--`` (nbox record / emulate) or run it (the plain
    launch) with ``--script-args``; its row, named by the script's stem, has no seeds' figures, and the table, CSV
    and PNG still come out."""
    import fidelity_testbed as ft

    script = tmp_path / "my_model.py"
    script.write_text("")
    name, tail, argv = ft.workload(str(script), ("--layers", "2"))
    assert (name, tail, argv) == ("my_model", ["--", str(script), "--layers", "2"], [str(script), "--layers", "2"])
    name, tail, argv = ft.workload("bert", ("--layers", "2"))
    assert name == "bert" and tail == ["--example", "bert", "--", "--layers", "2"]
    assert argv == [str(ROOT / "nbox_record" / "examples" / "bert.py"), "--layers", "2"]
    assert ft.workload("bert")[1] == ["--example", "bert"]

    monkeypatch.setattr(st, "virtual", lambda bundle, scenario: [980.0])
    row = st.run_model(fake_runner([], 1000.0), str(script), 2)
    assert row["model"] == "my_model" and row["seeds"] is None
    assert "my_model" in st.format_table([row])
    st.write_csv([row], tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as f:
        (line,) = list(csv.DictReader(f))
    assert line["model"] == "my_model" and line["seeds_observed_ms"] == ""
    st.write_png([row], tmp_path / "t.png", "fake")
    for argv in (["--testbed", "--script", str(tmp_path / "none.py")], ["--testbed", "--script-args", "--x 1"]):
        with pytest.raises(SystemExit) as e:
            st.main(argv)
        assert e.value.code == 2
