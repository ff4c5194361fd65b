"""Issue 16's zoo under ``nbox emulate``: patterns users train, run on N real gloo ranks as a world of 8."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "tests" / "workloads"


def emulate(script: str, *args: object, n: int = 1, world: int = 8, timeout: float = 150) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "nbox", "emulate", "--json", "--world-size", str(world), "-n", str(n),
           "--warmup", "2", "--iterations", "3", "--timeout", str(timeout - 30), "--", str(WORKLOADS / script),
           *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["world_size_seen"] == world
    assert doc["iteration_time_us"]["count"] == 3
    return doc


def test_backend_code_is_never_traced_by_dynamo() -> None:
    from emulator_core import eager

    assert eager.AVAILABLE  # the torch this project pins has Dynamo's per-code hooks


@pytest.mark.integration
def test_compiled_ddp_model_runs_at_world_8_on_one_rank() -> None:
    # Issue 16: Dynamo compiled NboxProcessGroup.broadcast (called by DDP's reducer from the compiled
    # forward) and failed with "UnsafeScriptObjectError ... OpaqueObject".
    doc = emulate("ddp_compile.py", "--steps", 8)
    rows = {r["collective"]: r for r in doc["collectives"]}
    assert set(rows) == {"all_reduce"}, rows
    # one gradient bucket per step: Linear(16,32) + Linear(32,4) = 676 float32 parameters
    assert rows["all_reduce"]["bytes"] == 676 * 4
