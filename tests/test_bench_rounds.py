"""The benches' round design, with the testbed and every launch faked (no ranks, no namespaces, no torch).

What the flags promise: ``bench/fidelity.py --testbed`` records afresh every round (``--one-recording``: once) and
alternates which side runs first; ``bench/emulate_fidelity.py --testbed --max-of-nodes`` adds a diagnostic side
that runs on every node and carries no target; ``bench/gpu_check.py --lean`` records each workload again with a
lean pass, and ``--logs`` keeps each step's whole output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import emulate_fidelity_testbed as eft  # noqa: E402
import fidelity_testbed as ft  # noqa: E402
import gpu_check as gc  # noqa: E402


class FakeNode:
    def __init__(self, k: int) -> None:
        self.cpus = (k % 2,)
        self.addr = f"10.0.0.{k + 1}"


class FakeTestbed:
    def __init__(self, world: int, rate: str = "1gbit", gloo_loop_batch: bool = True) -> None:
        self.nodes = [FakeNode(k) for k in range(world)]

    def __enter__(self) -> FakeTestbed:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def fake_testbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import nbox_trace.testbed.namespaces

    monkeypatch.setattr(nbox_trace.testbed.namespaces, "Testbed", FakeTestbed)


def _replay_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh: bool,
                  modes: tuple[str, ...] = ("pad",)) -> tuple[list[str], dict[str, Any]]:
    events: list[str] = []
    made = iter(range(100))

    def record(tb: Any, where: Path, ex: str, warmup: int, iterations: int, capture: int,
               lean: int = 0) -> tuple[Path, float]:
        k = next(made)
        events.append(f"record{k}")
        return where / f"{ex}.{k}.bundle", 1000.0 + k

    def predict(bundle: Path, scenario: Path) -> dict[str, Any]:
        k = int(bundle.name.split(".")[1])
        return {"predicted_us": 1000.0 + 10 * k,
                "top_collectives": [{"collective": "all_reduce", "bytes": 1048576.0, "count": 2,
                                     "modeled_us": 2000.0 + 200 * k, "recorded_us": 1600.0, "exposed_us": 0.0}]}

    def plain_run(tb: Any, tmp: Path, ex: str, steps: int, warmup: int, rnd: int) -> tuple[list[float], list[Any]]:
        events.append(f"real{rnd}")
        return [1000.0, 1000.0], [[(500.0, 0.0)]]

    def live_replay(tb: Any, tmp: Path, bundle: Path, scenario: Path, rnd: int,
                    host_work: str = "pad") -> list[float]:
        events.append(f"live{rnd}" if host_work == "pad" else f"{host_work}{rnd}")
        return [1050.0 if host_work == "pad" else 990.0]

    cal = tmp_path / "cal.toml"
    monkeypatch.setattr(ft, "record", record)
    monkeypatch.setattr(ft, "predict", predict)
    monkeypatch.setattr(ft, "captured", lambda bundle: {})
    monkeypatch.setattr(ft, "plain_run", plain_run)
    monkeypatch.setattr(ft, "live_replay", live_replay)
    monkeypatch.setattr(ft, "calibrate", lambda *a: cal)
    rows, scenario = ft.run(["ddp_mlp"], 4, 13, 3, "1gbit", None, "4KiB..1MiB", "all_reduce", 0.2, tmp_path,
                            live=True, fresh=fresh, host_work=modes)
    assert scenario == cal and len(rows) == 1
    return events, rows[0]


def test_the_replay_bench_records_every_round_and_alternates_the_order(fake_testbed: None,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    events, row = _replay_bench(monkeypatch, tmp_path, fresh=True)
    assert events == ["real0", "record0", "live0", "record1", "live1", "real1",
                      "real2", "record2", "live2", "record3", "live3", "real3"]
    assert [r["predicted_us"] for r in row["rounds"]] == [1000.0, 1010.0, 1020.0, 1030.0]  # each round its own
    assert row["predicted_us"] == 1015.0 and row["fresh_recordings"] is True
    assert row["paired"]["rounds"] == 4 and row["paired"]["round_errors_pct"] == pytest.approx([0, 1, 2, 3])
    assert row["live_paired"]["mean_error_pct"] == pytest.approx(5.0)
    text = ft.format_rows([row])
    assert "a fresh recording every round" in text
    # the model against the recordings, per call: the median over the rounds' recordings (1150 and 800 us per call)
    assert [r["collectives"][0]["modeled_us"] for r in row["rounds"]] == [2000.0, 2200.0, 2400.0, 2600.0]
    assert ft.per_collective(row["rounds"]) == {("all_reduce", 1048576.0, 2): (1150.0, 800.0)}
    assert "modeled 1.15  recorded 0.80  model +43.8%" in text
    assert "all of them     per iteration   modeled 2.30  recorded 1.60  model +43.8%" in text


def test_one_recording_is_made_once_and_paired_with_every_round(fake_testbed: None,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    events, row = _replay_bench(monkeypatch, tmp_path, fresh=False)
    assert [e for e in events if e.startswith("record")] == ["record0"]
    assert [r["predicted_us"] for r in row["rounds"]] == [1000.0] * 4
    assert row["fresh_recordings"] is False
    assert "one recording for all rounds" in ft.format_rows([row])


def test_each_host_work_mode_is_replayed_every_round_its_order_turning(fake_testbed: None,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    events, row = _replay_bench(monkeypatch, tmp_path, fresh=True, modes=("pad", "match"))
    assert events == ["real0", "record0", "live0", "match0", "record1", "match1", "live1", "real1",
                      "real2", "record2", "live2", "match2", "record3", "match3", "live3", "real3"]
    assert row["live_host_work"] == "pad" and row["live_us"] == 1050.0  # the table's figure: the first mode's
    assert row["live_by_mode"]["match"]["live_paired"]["mean_error_pct"] == pytest.approx(-1.0)
    assert row["live_by_mode"]["pad"]["live_vs_recorder_paired"]["rounds"] == 4
    text = ft.format_rows([row])
    assert "--host-work pad" in text and "live, --host-work match 0.99 ms -1.0%" in text


def test_max_of_nodes_adds_a_diagnostic_side_on_every_node_without_a_target(fake_testbed: None,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    events: list[str] = []

    def plain_run(tb: Any, tmp: Path, ex: str, steps: int, warmup: int, rnd: int) -> tuple[list[float], list[Any]]:
        events.append(f"real{rnd}")
        return [1000.0] * 3, []

    def emulate_on(tb: Any, tmp: Path, tag: str, ex: str, world: int, nodes: int, scenario: Path, warmup: int,
                   iterations: int, sets: tuple[str, ...] = ()) -> list[float]:
        events.append(f"emulate{tag[-1]}")
        return [1000.0] * 3

    def max_of_nodes(tb: Any, tmp: Path, tag: str, ex: str, world: int, scenario: Path, warmup: int,
                     iterations: int) -> list[float]:
        events.append(f"max{tag[-1]}")
        return [1200.0] * 3

    cal = tmp_path / "cal.toml"
    cal.write_text("")
    monkeypatch.setattr(eft, "plain_run", plain_run)
    monkeypatch.setattr(eft, "emulate_on", emulate_on)
    monkeypatch.setattr(eft, "emulate_max_of_nodes", max_of_nodes)
    rows = eft.run(["ddp_transformer"], 2, 2, 13, 3, "1gbit", cal, "", "", 0.2, tmp_path, max_of_nodes=True)
    assert events == ["real0", "emulate0", "max0", "emulate1", "max1", "real1"]
    sides = rows[0]["sides"]
    assert sides[eft.MAX_OF_NODES]["error_pct"] == pytest.approx(20.0)
    assert sides["emulate -n 1"]["paired"]["mean_error_pct"] == pytest.approx(0.0)
    table = eft.format_rows(rows)
    assert "(no target: a diagnostic)" in table and " met" in table
    without = eft.run(["ddp_transformer"], 2, 1, 13, 3, "1gbit", cal, "", "", 0.2, tmp_path)
    assert list(without[0]["sides"]) == ["emulate -n 1"]


class FakeCheck(gc.Check):
    """gpu_check's Check with every nbox command answered here; remembers the commands."""

    def __init__(self, work: Path) -> None:
        super().__init__(work, 480.0)
        self.calls: list[tuple[object, ...]] = []

    def nbox(self, step: str, *args: object, timeout_s: float = 240) -> dict[str, Any] | None:
        self.calls.append(args)
        self.rows.append(gc.Row(step, "pass"))
        docs: dict[str, dict[str, Any]] = {
                "record": {"observed_iteration_median_us": 1000.0},
                "replay": {"baseline": {"iteration_us": {"median": 1100.0}}},
                "emulate": {"iteration_time_us": {"median": 900.0}, "world_size_seen": 8},
                "calibrate": {"fits": [{"collective": "all_reduce", "bandwidth_gbps": 10.0}]},
                "bundle": {}}
        return docs[str(args[0])]


def test_gpu_check_lean_records_each_workload_again_with_a_lean_pass(tmp_path: Path) -> None:
    plain = FakeCheck(tmp_path)
    gc.pipeline(plain, "cpu", 0, "", lean=False)
    lean = FakeCheck(tmp_path)
    gc.pipeline(lean, "cpu", 0, "", lean=True)
    records = [c for c in lean.calls if c[0] == "record"]
    # each workload's variants, then one fresh launch of it that no replay saw
    assert [c[2] for c in records] == ["ddp_mlp"] * 3 + ["ddp_transformer"] * 3 + ["fsdp2_transformer"] * 2
    assert ["--lean-iterations" in c for c in records] == [False, True, False, False, True, False, True, False]
    assert all(c[c.index("--capture") + 1] == 3 for c in records if "--lean-iterations" in c)
    assert len([c for c in plain.calls if c[0] == "record"]) == 4
    assert len({c[c.index("-o") + 1] for c in records}) == 8  # one bundle each
    fresh = next(r for r in lean.rows if r.step == "fresh run ddp_mlp (a launch no replay saw)")
    assert fresh.figures == {"fresh_ms": 1.0, "default_recorded_pct": 0.0, "default_virtual_pct": 10.0,
                             "default_live_pct": 10.0, "lean_recorded_pct": 0.0, "lean_virtual_pct": 10.0,
                             "lean_live_pct": 10.0}
    assert [r.step for r in lean.rows if r.step.startswith("lean replay ddp_mlp")] == [
        "lean replay ddp_mlp virtual", "lean replay ddp_mlp live (cpu)"]


def test_gpu_check_logs_keep_each_steps_command_and_output(tmp_path: Path) -> None:
    chk = gc.Check(tmp_path, 480.0, tmp_path / "logs")
    chk.keep_log("record ddp_mlp (1 x cuda, nccl)", ["python", "-m", "nbox", "record"], 1, "out", "boom")
    (f,) = (tmp_path / "logs").iterdir()
    assert f.name == "00-record-ddp-mlp--1-x-cuda--nccl-.txt"
    assert f.read_text() == "$ python -m nbox record\nexit 1\n--- stdout\nout\n--- stderr\nboom\n"
    assert gc._text(b"partial \xff") == "partial \ufffd" and gc._text(None) == ""
    gc.Check(tmp_path, 480.0).keep_log("x", [], 0, "", "")  # without --logs: nothing written
    assert len(list((tmp_path / "logs").iterdir())) == 1


def test_gpu_check_paired_rounds_interleave_the_real_launch_and_pair_each_prediction(tmp_path: Path) -> None:
    chk = FakeCheck(tmp_path)
    reals = iter([1000.0, 1250.0, 800.0] * 3)

    def nbox(step: str, *args: object, timeout_s: float = 240) -> dict[str, Any] | None:
        chk.calls.append(args)
        chk.rows.append(gc.Row(step, "pass"))
        if args[0] == "record":
            lean_pass = "--lean-iterations" in args
            return {"observed_iteration_median_us": 1100.0 if lean_pass else next(reals)}
        return FakeCheck.nbox(chk, step, *args)

    chk.nbox = nbox  # type: ignore[method-assign]
    gc.paired_rounds(chk, "cpu", 0, 3, lean=True)
    steps = [r.step for r in chk.rows]
    first = [s for s in steps if s.startswith("round ") and "ddp_mlp" in s]
    # the real launch first in the first round, last in the second (as bench/fidelity.py pairs them)
    assert first[0] == "round 1 real ddp_mlp" and first[1].startswith("round 1 record ddp_mlp")
    assert [s for s in first if s.startswith("round 2")][-1] == "round 2 real ddp_mlp"
    rows = {r.step: r for r in chk.rows if r.step.startswith("paired rounds")}
    assert list(rows) == [f"paired rounds {wl} (lean, 3 of 3)" for wl in
                          ("ddp_mlp", "ddp_transformer", "fsdp2_transformer")]
    row = rows["paired rounds ddp_mlp (lean, 3 of 3)"]
    assert row.status == "pass" and row.figures["real_ms"] == 1.0 and row.figures["live_ms"] == 1.1
    # live 1100 us against 1000 / 1250 / 800: +10%, -12%, +37.5%; geometric mean +10% (1.25 x 0.8 = 1)
    assert row.figures["live_paired"].startswith("+10.0% (90% CI -24.5..+60.2%, 3 rounds)")
    assert "3 rounds" in row.figures["recorded_paired"]
    records = [c for c in chk.calls if c[0] == "record"]
    assert sum("--lean-iterations" in c for c in records) == 9 and len(records) == 18


def test_gpu_check_paired_rounds_need_two_complete_rounds(tmp_path: Path) -> None:
    chk = FakeCheck(tmp_path)
    gc.paired_rounds(chk, "cpu", 0, 1, lean=False)
    (row,) = [r for r in chk.rows if r.step.startswith("paired rounds ddp_mlp")]
    assert row.status == "skipped" and row.note == "one round: no interval"
    assert row.figures["virtual_paired"] == "+10.0% (1 round: no interval)"


def test_gpu_check_rounds_flags_pick_the_steps_and_are_refused_when_meaningless(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran: list[tuple[str, object]] = []
    monkeypatch.setattr(gc, "environment", lambda: (gc.Row("environment", "pass"), {"cuda": False}))
    monkeypatch.setattr(gc, "pipeline", lambda chk, device, gpus, label, lean=False: ran.append(("pipeline", device)))
    monkeypatch.setattr(gc, "paired_rounds", lambda chk, device, gpus, rounds, lean: ran.append(("rounds", rounds)))
    monkeypatch.setattr(gc, "gpu_tests", lambda chk, cuda: ran.append(("gpu tests", cuda)))

    def main(*argv: str) -> int:
        ran.clear()
        monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--workdir", str(tmp_path), *argv])
        return gc.main()

    assert main() == 0 and ran == [("pipeline", "cpu"), ("gpu tests", False)]
    assert main("--rounds", "3") == 0 and ran == [("pipeline", "cpu"), ("rounds", 3), ("gpu tests", False)]
    assert main("--rounds", "2", "--only-rounds") == 0 and ran == [("rounds", 2)]
    for bad in (("--only-rounds",), ("--rounds", "-1")):
        with pytest.raises(SystemExit) as exc:
            main(*bad)
        assert exc.value.code == 2 and ran == []


def test_the_replay_bench_refuses_host_work_modes_it_cannot_replay(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/fidelity.py --testbed --host-work``: unknown or repeated modes, and modes without ``--live`` (where
    no live replay would use them), end with exit 2 before any node is made."""
    import fidelity as fb

    for argv, why in ((["--live", "--host-work", "pad,squeeze"], "give distinct modes"),
                      (["--live", "--host-work", "pad,pad"], "give distinct modes"),
                      (["--host-work", "match"], "add --live")):
        monkeypatch.setattr(sys, "argv", ["fidelity.py", "--testbed", *argv])
        assert fb.main() == 2
        assert why in capsys.readouterr().err
