"""The answer first: a replay or emulate report opens with one line that answers the question, its ratio in words
and its what-if labelled by what was changed; the JSON document carries the same facts under ``answer``."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.question import compare, describe_changes, describe_override, share_words
from nbox_record.launch.emulation import EmulateResult, format_text
from nbox_replay.replay import ReplayConfig, run_replay

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "traces" / "ddp_mlp"


@pytest.mark.parametrize(("time_us", "reference_us", "direction", "words"), [
    (56_900.0, 4_740.0, "slower", "12.0x slower than"),
    (1_000.0, 1_800.0, "faster", "1.80x faster than"),
    (1_000.0, 1_005.0, "same", "about the same as"),
    (1_011.0, 1_000.0, "slower", "1.01x slower than"),
    (250.0, 1_000.0, "faster", "4.0x faster than"),
])
def test_a_ratio_is_said_in_words(time_us: float, reference_us: float, direction: str, words: str) -> None:
    cmp = compare(time_us, reference_us)
    assert cmp is not None and cmp.direction == direction and cmp.words == words
    assert cmp.ratio == pytest.approx(time_us / reference_us)


def test_no_ratio_over_a_zero_time() -> None:
    assert compare(0.0, 1.0) is None and compare(1.0, 0.0) is None and compare(float("inf"), 1.0) is None
    assert share_words(1.0, 0.0, "x") is None
    assert share_words(89.0, 100.0, "exposed communication") == "89% of it exposed communication"


def test_what_changed_in_words() -> None:
    dgx = load_scenario("dgx-h100")
    assert describe_override("topology.dims.0.bandwidth_gbps=10") == "10 Gb/s"
    assert describe_override("topology.dims.1.bandwidth_gbps=200", dgx) == "200 Gb/s ib"
    assert describe_override("topology.dims.1.latency_us=3", dgx) == "3 us latency ib"
    assert describe_override("topology.dims.0.size=16", dgx) == "nvlink size 16"
    assert describe_override("compute_scale=2") == "compute x2"
    assert describe_override("mesh.dp=512") == "dp=512"
    assert describe_override("overlap=serialize") == "overlap=serialize"
    assert describe_override("world_size=64") is None and describe_override("replay.host_work=off") is None
    loop = load_scenario(None, ["world_size=64"])
    assert describe_changes(None, ["world_size=64", "topology.dims.0.bandwidth_gbps=10"], loop) == \
        ["64 ranks", "10 Gb/s"]
    assert describe_changes("dgx-h100", [], dgx, "dp=512,tp=2") == ["dgx-h100", "1024 ranks", "mesh dp=512,tp=2"]


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+) (us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def test_a_replay_report_opens_with_the_answer() -> None:
    rep = run_replay(ReplayConfig(str(MLP), clock="virtual", world_size=64,
                                  overrides=("topology.dims.0.bandwidth_gbps=10",)))
    text = rep.format_text()
    first = text.splitlines()[0]
    m = re.fullmatch(r"what-if \(64 ranks, 10 Gb/s\): ([\d.]+ \w+) per iteration, ([\d.]+)x (slower|faster) than "
                     r"the baseline's ([\d.]+ \w+); (\d+)% of it exposed communication", first)
    assert m is not None, first
    wi, base = rep.what_if.median_us / 1e3, rep.baseline.median_us / 1e3
    assert _ms(m.group(1)) == pytest.approx(wi, rel=0.01) and _ms(m.group(4)) == pytest.approx(base, rel=0.01)
    assert m.group(3) == "slower" and wi > base  # a 10 Gb/s network at 64 ranks: slower than 2 ranks on loopback
    assert float(m.group(2)) == pytest.approx(wi / base, rel=0.02)
    assert int(m.group(5)) == round(100 * rep.what_if.exposed_comm_us / rep.what_if.median_us)
    assert any(line.startswith("what-if (64 ranks, 10 Gb/s) ") for line in text.splitlines()[1:])  # the row
    assert "W=64 (loopback_cpu" not in text
    doc = rep.to_dict()["answer"]
    assert doc["line"] == first and doc["changes"] == ["64 ranks", "10 Gb/s"] and doc["direction"] == "slower"
    assert doc["ratio"] == pytest.approx(rep.what_if.median_us / rep.baseline.median_us)
    assert doc["what_if_iteration_us"] == rep.what_if.median_us and "speedup" in rep.to_dict()  # old keys kept


def test_the_answer_moves_with_the_question() -> None:
    """A faster network answers "faster" (or about the same), a slower one "slower": the line follows the run."""
    fast = run_replay(ReplayConfig(str(MLP), clock="virtual", overrides=("topology.dims.0.bandwidth_gbps=4000",
                                                                         "topology.dims.0.latency_us=1")))
    slow = run_replay(ReplayConfig(str(MLP), clock="virtual", overrides=("topology.dims.0.bandwidth_gbps=0.1",)))
    assert fast.answer()["direction"] in ("faster", "same") and " slower than " not in fast.answer()["line"]
    assert slow.answer()["direction"] == "slower" and " slower than " in slow.answer()["line"]
    assert slow.answer()["line"].startswith("what-if (2 ranks, 0.1 Gb/s): ")


def test_replay_json_on_the_command_line_carries_the_answer() -> None:
    proc = subprocess.run([sys.executable, "-m", "nbox", "replay", str(MLP), "--clock", "virtual", "--what-if",
                           "dgx-h100", "--world-size", "1024", "--json"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)["answer"]
    assert answer["changes"] == ["dgx-h100", "1024 ranks"]
    assert answer["line"].startswith("what-if (dgx-h100, 1024 ranks): ")


def _emulated(breakdown: dict[str, float] | None) -> EmulateResult:
    return EmulateResult(64, (0, 1), 64, [10_000.0, 12_000.0, 11_000.0], {0: [10_000.0], 1: [12_000.0]}, [],
                         "loopback_cpu with topology.dims.0.bandwidth_gbps=10; world size 64", 1.0, breakdown,
                         changes=("64 ranks", "10 Gb/s"))


def test_an_emulate_report_opens_with_the_answer() -> None:
    b = {"iteration_us": 11_000.0, "compute_us": 2_000.0, "exposed_comm_us": 8_800.0, "cpu_contention_us": 200.0}
    result = _emulated(b)
    first = format_text(result).splitlines()[0]
    assert first == "emulated (64 ranks, 10 Gb/s): 11.00 ms per iteration with 2 real ranks; 80% of it exposed " \
                    "communication"
    doc = result.to_json()["answer"]
    assert doc["line"] == first and doc["iteration_us"] == 11_000.0 and doc["exposed_share"] == pytest.approx(0.8)
    assert format_text(_emulated(None)).splitlines()[0] == ("emulated (64 ranks, 10 Gb/s): 11.00 ms per iteration "
                                                            "with 2 real ranks")


def test_an_emulate_report_says_the_peak_memory_beside_the_time() -> None:
    """Will it fit: the first line carries the largest real rank's peak, and each rank's is listed with its source."""
    result = dataclasses.replace(_emulated(None), peak_memory={
        0: {"device": "cpu", "bytes": 3 << 30, "source": "process peak resident set"},
        1: {"device": "cpu", "bytes": 1 << 30, "source": "process peak resident set"}})
    lines = format_text(result).splitlines()
    assert lines[0] == ("emulated (64 ranks, 10 Gb/s): 11.00 ms per iteration with 2 real ranks; peak memory "
                        "3.0 GiB per rank")
    assert any(ln.startswith("peak memory per real rank: rank 0 3.0 GiB (cpu: process peak resident set), "
                             "rank 1 1.0 GiB") for ln in lines), lines
    doc = result.to_json()
    assert doc["answer"]["peak_memory_bytes"] == 3 << 30 and doc["peak_memory"]["1"]["bytes"] == 1 << 30
    assert _emulated(None).to_json()["answer"]["peak_memory_bytes"] is None  # not measured: not said


def test_a_live_answer_inside_the_machines_noise_says_so_instead_of_a_ratio() -> None:
    """Issue 61: on the real clock, when the paired repetitions' p10-p90 of the what-if over the baseline holds 1.0,
    the answer line says there is no difference beyond this machine's noise; outside it, the ratio as before."""
    rep = run_replay(ReplayConfig(str(MLP), clock="virtual", world_size=64,
                                  overrides=("topology.dims.0.bandwidth_gbps=10",)))
    rep.paired_speedups = [0.93, 1.02, 1.08, 0.97, 1.05]
    line = rep.answer()["line"]
    assert "no difference from the baseline's" in line and "beyond this machine's noise" in line
    assert " slower than " not in line and rep.answer()["direction"] == "within noise"
    rep.paired_speedups = [0.52, 0.55, 0.50]
    assert " slower than the baseline's" in rep.answer()["line"] and rep.answer()["direction"] == "slower"
    rep.paired_speedups = [1.0]  # one pair: no spread to judge by
    assert "noise" not in rep.answer()["line"]
