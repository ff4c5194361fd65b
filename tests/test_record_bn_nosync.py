"""Issue 16: DDP + BatchNorm (buffer broadcasts) + no_sync() accumulation + a user broadcast, recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import read_et
from nbox_trace.chakra.attrs import attr_map

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
BROADCAST, ALL_REDUCE = pb.BROADCAST, pb.ALL_REDUCE
# per optimizer step (pg "0"): the no_sync forward's buffer broadcasts (float32 running stats of the two
# BatchNorm2d(8): 32 elements; int64 num_batches_tracked: 2), the sync backward's gradient all-reduce (930
# float32 parameters, one bucket), the user's learning-rate broadcast (1 float32). The sync forward
# broadcasts no buffers: DDP skips them after a no_sync() forward.
PER_ITERATION = sorted([(BROADCAST, 128, "0"), (BROADCAST, 16, "0"), (ALL_REDUCE, 3720, "0"), (BROADCAST, 4, "0")])


def test_bn_nosync_broadcast_records_each_iteration(tmp_path: Path) -> None:
    bundle = tmp_path / "bn.bundle"
    done = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "2", "--warmup", "2", "--iterations", "3",
                           "--capture", "2", "-o", str(bundle), "--", "tests/workloads/ddp_bn_nosync.py"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        _, nodes = read_et(bundle / "trace" / f"trace.{rank}.et")
        per_iter: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
        for n in nodes:
            if n.type == pb.COMM_COLL_NODE:
                a = attr_map(n.attr)
                it = int(a["nbox_iteration"].value) if "nbox_iteration" in a else -1  # type: ignore[arg-type]
                per_iter[it].append((int(a["comm_type"].value), int(a["comm_size"].value),  # type: ignore[arg-type]
                                     str(a["pg_name"].value)))
        assert len(per_iter) == 2, dict(per_iter)
        for it, found in per_iter.items():
            assert sorted(found) == PER_ITERATION, (rank, it, found)
