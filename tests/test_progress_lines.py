"""Progress on long work: the library reports steps through a callback (nbox_trace.progress), the command line
renders them on stderr; here the plain-line form a log or a pipe gets, and the steps the library reads."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from emulator_core.calibration.run import measure_step
from emulator_core.calibration.spec import CalibrateConfig
from nbox.cli.progress import ProgressLines
from nbox_record.launch.launcher import rank_step
from nbox_trace.progress import Step, watch


def _lines(steps: list[str | Step], every_s: float = 3600.0) -> list[str]:
    out = io.StringIO()
    with ProgressLines("record", out, live=False, every_s=every_s) as say:
        for s in steps:
            say(s)
    return out.getvalue().splitlines()


def test_plain_lines_say_what_and_how_far_once_per_change() -> None:
    lines = _lines(["launching 2 rank(s)",
                    Step("recording, warm-up", 0, 14, "iterations"), Step("recording, warm-up", 1, 14, "iterations"),
                    Step("recording, warm-up", 2, 14, "iterations"),
                    Step("recording, timed iterations", 3, 14, "iterations"),
                    Step("recording, timed iterations", 9, 14, "iterations"),
                    Step("recording, capture", 14, 14, "iterations"), "converting the capture to Chakra ET"])
    assert lines == ["nbox record: launching 2 rank(s)",
                     "nbox record: recording, warm-up: 0/14 iterations",
                     "nbox record: recording, timed iterations: 3/14 iterations",
                     "nbox record: recording, capture: 14/14 iterations",
                     "nbox record: converting the capture to Chakra ET"]
    assert not any("\r" in line or "\x1b" in line for line in lines)  # no terminal control in a log


def test_plain_lines_repeat_a_step_at_most_every_so_often() -> None:
    steps: list[str | Step] = [Step("sweep", i, 10, "points") for i in range(1, 11)]
    assert _lines(steps, every_s=3600.0) == ["nbox record: sweep: 1/10 points", "nbox record: sweep: 10/10 points"]
    assert len(_lines(steps, every_s=0.0)) == 10
    detail = [Step("calibrating, round 0", 1, 8, "measurements", "all_reduce of 1.0 KiB"),
              Step("calibrating, round 0", 2, 8, "measurements", "all_gather of 1.0 KiB")]
    assert _lines(detail) == ["nbox record: calibrating, round 0 (all_reduce of 1.0 KiB): 1/8 measurements"]


def test_the_rank_step_is_the_least_advanced_rank(tmp_path: Path) -> None:
    assert rank_step(tmp_path, 14, "recording") is None
    for rank, (phase, it) in enumerate((("timing", 7), ("warmup", 2))):
        (tmp_path / f"rank{rank}").mkdir()
        (tmp_path / f"rank{rank}" / "progress.json").write_text(json.dumps({"phase": phase, "iteration": it}))
    assert rank_step(tmp_path, 14, "recording") == Step("recording, warm-up", 2, 14, "iterations")


def test_the_calibration_step_counts_passes_over_the_points(tmp_path: Path) -> None:
    cfg = CalibrateConfig(collectives=("all_reduce", "barrier"), sizes=(1024, 4096), rounds=3)
    assert measure_step(tmp_path, cfg) is None
    (tmp_path / "progress.json").write_text(json.dumps({"phase": "round 1", "collective": "barrier", "nbytes": 0}))
    step = measure_step(tmp_path, cfg)
    assert step is not None and (step.done, step.total) == (2 * 3 + 2, 4 * 3) and step.what == "calibrating, round 1"


def test_watch_reports_each_new_step_and_stops() -> None:
    seen: list[Step] = []
    values = iter([None, Step("a", 1, 2), Step("a", 1, 2), Step("a", 2, 2)])
    done = threading.Event()

    def read() -> Step | None:
        try:
            return next(values)
        except StopIteration:
            done.set()
            return None

    with watch(read, seen.append, period_s=0.01):
        assert done.wait(5)
    assert seen == [Step("a", 1, 2), Step("a", 2, 2)]


def test_sweep_on_a_pipe_prints_plain_progress_lines(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "nbox", "sweep", str(root / "traces" / "ddp_mlp"), "--vary",
                           "world_size=2,4,8", "--out", str(tmp_path / "sw")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "evaluating the grid" in line]
    assert lines[0].startswith("nbox sweep: evaluating the grid: ") and lines[-1].endswith(": 3/3 points")
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
