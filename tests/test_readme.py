"""The README's two set-up commands are real: CI runs the test command verbatim, the main one works."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = _bash_blocks(readme)
    test_cmd = next(b for b in blocks if "pytest" in b)
    ci_lines = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines()]
    assert test_cmd in ci_lines, f"{test_cmd!r} is not a line of .ci/run"


def test_readme_installs_the_local_cpu_torch_first() -> None:
    for block in _bash_blocks((ROOT / "README.md").read_text())[:2]:
        assert "pip install torch==2.13.0" in block  # an open range would pull multi-GB CUDA wheels


@pytest.mark.integration
def test_readme_main_command_records_and_replays(tmp_path: Path) -> None:
    main_cmd = _bash_blocks((ROOT / "README.md").read_text())[0]
    steps = [shlex.split(part)[1:] for part in main_cmd.split("&&") if part.strip().startswith("nbox ")]
    assert [s[0] for s in steps] == ["record", "replay"]
    outputs = []
    for args in steps:  # run where a user would: a fresh directory, relative paths
        proc = subprocess.run([sys.executable, "-m", "nbox", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)  # issue 13: results (record's summary, replay's report) on stdout
    assert "wrote nbox-example.bundle" in outputs[0]  # it says where the bundle is
    report = outputs[1]  # the answer first, then the comparison: recorded, baseline, what-if
    first = report.splitlines()[0]
    assert first.startswith("what-if (") and " per iteration, " in first and "the baseline's" in first
    assert "recorded (observed, un-instrumented)" in report and "baseline (" in report
    # the README's copy is this command's output (bench/readme_example.py --write), line for line but for the numbers
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("<!-- example-output:start -->")[1].split("<!-- example-output:end -->")[0]
    shown_lines = [ln for ln in shown.strip().splitlines() if not ln.startswith("```")]
    assert _shapes(shown_lines) == _shapes(report.splitlines()), (shown_lines, report)
    record_lines = outputs[0].strip().splitlines()
    assert all(any(_shape(r) == _shape(ln) for ln in readme.splitlines()) for r in record_lines), record_lines


def _shape(line: str) -> str:
    """A line with its numbers (and their size units) replaced and its column padding collapsed, cut after 40
    characters: what a run of the same command keeps (a size is printed in B or KiB as its value falls)."""
    numbers = re.sub(r"[+-]?\d[\d.]*(?:\s*(?:[KMGT]iB|B)\b)?|(?<=\s)-(?=\s)", "#", line.strip())  # "-": none
    return re.sub(r"\s+", " ", numbers)[:40]


def _shapes(lines: list[str]) -> list[str]:
    """The shapes of a report's lines, notices aside (a notice depends on the machine's state, not the command). The
    rows of the top-collectives table are ranked by measured time, so their order is a run's: they are compared as
    a set (sorted)."""
    shapes = [_shape(ln) for ln in lines if ln.strip() and not ln.startswith("notice:")]
    top = next((i for i, s in enumerate(shapes) if s.startswith("top collectives")), None)
    if top is None:
        return shapes
    start = top + 2  # the table's title, then its header
    end = next((i for i in range(start, len(shapes)) if not shapes[i].startswith(("all_", "broadcast", "reduce",
                                                                                   "send", "recv", "barrier"))),
               len(shapes))
    return shapes[:start] + sorted(shapes[start:end]) + shapes[end:]


def test_shipped_synthetic_trace_is_strict_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "nbox", "trace", "inspect", "traces/synthetic_ddp_mlp", "--strict"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["ddp_mlp", "ddp_transformer", "fsdp2_transformer", "tp_dp_mlp"])
def test_shipped_recorded_bundles_verify_and_are_strict_clean(name: str) -> None:
    from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
    from nbox_trace.check import inspect_trace

    bundle = ROOT / "traces" / name
    manifest = read_manifest(bundle)
    world = manifest.job["world_size"]
    assert manifest.complete and manifest.job["ranks_recorded"] == list(range(world)) and world in (2, 4)
    assert verify_files(bundle, manifest) == []
    assert sum(f.bytes for f in manifest.files) < 2 * 1024 * 1024  # shipped bundles stay small
    assert inspect_trace(trace_prefix(bundle)).problem_count() == 0
    assert f"-o traces/{name} " in (ROOT / "traces" / "README.md").read_text()  # the command that made it
