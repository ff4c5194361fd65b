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
    from emulator_core.backend import eager

    assert eager.AVAILABLE  # the torch this project pins has Dynamo's per-code hooks


@pytest.mark.integration
def test_compiled_ddp_model_runs_at_world_8_on_one_rank() -> None:
    # Issue 16: Dynamo compiled NboxProcessGroup.broadcast (called by DDP's reducer from the compiled
    # forward) and failed with "UnsafeScriptObjectError ... OpaqueObject".
    doc = emulate("ddp_compile.py", "--steps", 8)
    rows = {(r["collective"], r["bytes"]): r["count"] for r in doc["collectives"]}
    # per step: one gradient bucket (Linear(16,32) + BatchNorm1d(32) + Linear(32,4) = 740 float32), and the
    # BatchNorm buffers broadcast from inside the compiled forward (running stats 64 float32, the counter)
    assert rows == {("all_reduce", 740 * 4.0): 3, ("broadcast", 64 * 4.0): 3, ("broadcast", 8.0): 3}, rows


def test_object_refusal_names_the_peer_and_the_real_ranks_to_use() -> None:
    from emulator_core.backend.objectp2p import refusal

    msg = refusal(1, 0, (0,))
    assert "rank 1 is emulated" in msg and "--real-ranks 0,1" in msg and "\n" not in msg


@pytest.mark.integration
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_schedule_with_one_real_pipeline_at_world_8(schedule: str) -> None:
    # ranks 0 and 1 (the two stages of pipeline 0) are real; pipelines 1..3 are emulated
    doc = emulate("pipeline_schedule.py", "--schedule", schedule, "--steps", 8, n=2)
    rows = {(r["collective"], r["bytes"]): r["count"] for r in doc["collectives"]}
    # per iteration and rank: 4 micro-batches of activations (2 x 16 float32) one way, gradients back
    assert rows[("send_recv", 2 * 16 * 4.0)] == 8 * 3
    # the stages' gradients averaged over their data-parallel groups (4 members, 3 of them emulated)
    assert {b for c, b in rows if c == "all_reduce"} == {16 * 8 * 4.0, 16 * 4.0, 16 * 16 * 4.0, 4.0}


@pytest.mark.integration
def test_pipeline_stage_whose_neighbour_is_emulated_is_refused_by_name() -> None:
    # Issue 16: "EOFError: Ran out of input" (the stage unpickled the zeros an emulated peer "sent")
    cmd = [sys.executable, "-m", "nbox", "emulate", "--world-size", "8", "-n", "1", "--warmup", "1",
           "--iterations", "2", "--timeout", "90", "--", str(WORKLOADS / "pipeline_schedule.py"), "--steps", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "EmulatedPeerObjectError: recv_object_list on rank 0 from rank 1: rank 1 is emulated" in proc.stderr
    assert "--real-ranks 0,1" in proc.stderr and "EOFError" not in proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("n", [1, 2])
def test_eval_under_inference_mode_and_object_collectives_at_world_8(n: int) -> None:
    # the workload raises if an object does not decode or the evaluation's all_reduce is not a world's sum
    doc = emulate("eval_objects.py", "--steps", 8, n=n)
    found = {(r["collective"], r["bytes"]) for r in doc["collectives"]}
    assert found == {("all_reduce", 644.0), ("all_reduce", 8.0), ("all_gather", 8.0), ("all_gather", 55.0),
                     ("broadcast", 8.0), ("broadcast", 39.0)}, found
    assert all(r["count"] == 3 for r in doc["collectives"])


@pytest.mark.integration
def test_compiled_fsdp2_model_runs_at_world_8_on_one_rank() -> None:
    doc = emulate("fsdp2_compile.py", "--steps", 8)
    rows = {(r["collective"], r["bytes"]): r["count"] for r in doc["collectives"]}
    # per iteration: each of the 2 blocks (272 float32, 34 per rank of 8) all-gathered for its forward and
    # again for its backward, its gradient reduce-scattered; the root's Linear(16, 1) once each way
    assert rows == {("all_gather", 34 * 4.0): 4 * 3, ("reduce_scatter", 272 * 4.0): 2 * 3,
                    ("all_gather", 17 * 4.0): 3, ("reduce_scatter", 17 * 8 * 4.0): 3}, rows


SCATTER_FROM_EMULATED_ROOT = """
import torch.distributed as dist
dist.init_process_group("gloo")
world, rank = dist.get_world_size(), dist.get_rank()
got = [None] * world if rank == world - 1 else None
dist.gather_object({"rank": rank}, got, dst=world - 1)  # to an emulated root: nothing comes back, no error
assert got is None
out = [None]
dist.scatter_object_list(out, [{"to": r} for r in range(world)] if rank == world - 1 else None, src=world - 1)
"""


@pytest.mark.integration
def test_scatter_object_list_from_an_emulated_root_is_refused_by_name(tmp_path: Path) -> None:
    script = tmp_path / "scatter_objects.py"
    script.write_text(SCATTER_FROM_EMULATED_ROOT)
    cmd = [sys.executable, "-m", "nbox", "emulate", "--world-size", "8", "-n", "1", "--timeout", "60", "--",
           str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("EmulatedPeerObjectError: scatter_object_list on rank 0 from rank 7: rank 7 is emulated"
            in proc.stderr), proc.stderr[-3000:]
    assert "--real-ranks 0,7" in proc.stderr and "EOFError" not in proc.stderr
