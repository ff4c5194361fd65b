"""`nbox record` on CUDA + NCCL: one GPU, one rank. Skipped cleanly without CUDA (CI has none).

Checks the GPU half of the capture: NCCL's record_param_comms become comm nodes, CUDA kernels
become COMP nodes (is_cpu_op false) with their stream, ordered per stream after their launching op.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_one_gpu_nccl_recording(tmp_path: Path) -> None:
    from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
    from nbox_trace.chakra import et_def_pb2 as pb
    from nbox_trace.chakra import read_et
    from nbox_trace.chakra.attrs import attr_map
    from nbox_trace.check import inspect_trace

    out = tmp_path / "gpu.bundle"
    proc = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "1", "--backend", "nccl",
                           "--warmup", "2", "--iterations", "5", "-o", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(out)
    assert manifest.producer["backend"] == "nccl" and manifest.producer["cuda"]
    assert str(manifest.hardware["device"]).startswith("cuda")
    assert verify_files(out, manifest) == []
    report = inspect_trace(trace_prefix(out))
    assert not [p for p in report.all_problems() if p.severity == "error"]
    _, nodes = read_et(out / "trace" / "trace.0.et")
    gpu = [n for n in nodes if n.type == pb.COMP_NODE and attr_map(n.attr).get("is_cpu_op") is not None
           and not attr_map(n.attr)["is_cpu_op"].value]
    assert gpu, "no GPU kernel nodes"
    assert all("nbox_stream" in attr_map(n.attr) for n in gpu)
    assert all(n.duration_micros > 0 for n in gpu[:50])
