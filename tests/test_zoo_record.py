"""Issue 16's zoo under ``nbox record``: an evaluation under ``torch.inference_mode()`` with collectives, and
object collectives (``all_gather_object``, ``broadcast_object_list``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import read_et
from nbox_trace.chakra.attrs import attr_map

ROOT = Path(__file__).resolve().parents[1]
ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER = pb.ALL_REDUCE, pb.ALL_GATHER, pb.BROADCAST, pb.REDUCE_SCATTER
# per iteration and rank (tests/workloads/eval_objects.py): the DDP gradient bucket (161 float32), the
# evaluation's all_reduce under inference_mode (2 float32), all_gather_object (an int64 size, then the
# 55-byte pickle), broadcast_object_list (an int64 size, then the 39-byte pickle)
PER_ITERATION = sorted([(ALL_REDUCE, 644), (ALL_REDUCE, 8), (ALL_GATHER, 8), (ALL_GATHER, 55), (BROADCAST, 8),
                        (BROADCAST, 39)])

LOGGER_IN_INFERENCE_MODE = """
    import torch, torch.distributed as dist
    from nbox_record.capture.commlog import CollectiveLogger
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    logger = CollectiveLogger()
    logger.start()
    dist.all_reduce(torch.ones(2))
    with torch.inference_mode():
        dist.all_reduce(torch.ones(3))
        dist.broadcast(torch.ones(5), src=0)
    with torch.no_grad():
        dist.all_reduce(torch.ones(7))
    records = logger.stop()
    dist.all_reduce(torch.ones(11))  # after stop: not logged
    print([(r["op"], r["comm_bytes"]) for r in records], logger.errors)
    dist.destroy_process_group()  # gloo's threads left running at exit abort the process now and then
"""


def test_the_collective_log_sees_calls_inside_inference_mode_once_each() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(LOGGER_IN_INFERENCE_MODE)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("[('allreduce_', 8), ('allreduce_', 12), ('broadcast_', 20), "
                                   "('allreduce_', 28)] []")


@pytest.mark.integration
def test_eval_under_inference_mode_and_object_collectives_are_recorded(tmp_path: Path) -> None:
    bundle = tmp_path / "eval.bundle"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "2", "--warmup", "2", "--iterations", "2",
                           "--capture", "2", "-o", str(bundle), "--", "tests/workloads/eval_objects.py"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        _, nodes = read_et(bundle / "trace" / f"trace.{rank}.et")
        per_iter: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for n in nodes:
            if n.type == pb.COMM_COLL_NODE:
                a = attr_map(n.attr)
                # every collective joined to its log record (the inference-mode one fell back to the ET)
                assert a["nbox_comm_source"].value == "collectives.json", (rank, n.name, a["comm_size"].value)
                per_iter[int(a["nbox_iteration"].value)].append(  # type: ignore[arg-type]
                    (int(a["comm_type"].value), int(a["comm_size"].value)))  # type: ignore[arg-type]
        assert len(per_iter) == 2, dict(per_iter)
        for it, found in per_iter.items():
            assert sorted(found) == PER_ITERATION, (rank, it, found)
    verify = subprocess.run([sys.executable, "-m", "nbox", "bundle", "verify", str(bundle)], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env=env)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]


def _recorded_collectives(tmp_path: Path, script: str) -> dict[int, list[tuple[int, int]]]:
    """``nbox record`` 2 ranks of ``script`` (1 captured iteration); per rank, its sorted (comm_type, comm_size)."""
    bundle = tmp_path / "zoo.bundle"
    done = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "2", "--warmup", "2", "--iterations", "2",
                           "--capture", "1", "-o", str(bundle), "--", f"tests/workloads/{script}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    out = {}
    for rank in (0, 1):
        _, nodes = read_et(bundle / "trace" / f"trace.{rank}.et")
        out[rank] = sorted((int(attr_map(n.attr)["comm_type"].value), int(attr_map(n.attr)["comm_size"].value))  # type: ignore[arg-type]
                           for n in nodes if n.type == pb.COMM_COLL_NODE)
    return out


@pytest.mark.integration
def test_compiled_ddp_model_is_recorded(tmp_path: Path) -> None:
    for rank, found in _recorded_collectives(tmp_path, "ddp_compile.py").items():
        # the BatchNorm buffers' broadcasts (issued inside the compiled forward) and the gradient bucket
        assert found == sorted([(BROADCAST, 256), (BROADCAST, 8), (ALL_REDUCE, 2960)]), (rank, found)


@pytest.mark.integration
def test_compiled_fsdp2_model_is_recorded(tmp_path: Path) -> None:
    for rank, found in _recorded_collectives(tmp_path, "fsdp2_compile.py").items():
        # 2 ranks: each block (272 float32, 136 per rank) all-gathered before its forward and its backward,
        # its gradient reduce-scattered; the root's Linear(16, 1) once each way (its 1-row weight padded)
        assert found == sorted([(ALL_GATHER, 544)] * 4 + [(REDUCE_SCATTER, 1088)] * 2
                               + [(ALL_GATHER, 68), (REDUCE_SCATTER, 136)]), (rank, found)
