"""The README's two set-up commands are real: CI runs the test command verbatim, the main one works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_readme_main_command_runs_on_the_shipped_trace() -> None:
    main_cmd = _bash_blocks((ROOT / "README.md").read_text())[0]
    inspect_part = main_cmd.split("&& nbox ", 1)[1]
    args = inspect_part.split()
    proc = subprocess.run([sys.executable, "-m", "nbox", *args, "--strict"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no problems found" in proc.stderr
