"""The GPU kit's issue-49 steps (bench/gpu_check.py --hold, bench/gpu_hold.py) and the Llama-3 job they run
(bench/llama3_fsdp2.py), checked on CPU: the plan, the tiny run end to end, the model's size, the published row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _kit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--hold", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def test_the_dry_run_plans_the_plain_and_emulated_launches_and_the_llama_job() -> None:
    proc = _kit("--cpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum("torch.distributed.run" in ln for ln in lines) == 2  # the plain runs
    emulated = [ln for ln in lines if " emulate --world-size 2 " in ln]
    assert len(emulated) == 3 and all("zero_cost.toml" in ln for ln in emulated)
    (llama,) = [ln for ln in lines if " emulate --world-size 8 -n 1 " in ln]
    assert "llama3_fsdp2.py" in llama and "--config tiny" in llama


def test_cpu_and_dry_run_need_hold() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--cpu"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "--cpu and --dry-run go with --hold" in proc.stderr


def test_the_published_row_and_the_model_are_the_ones_named() -> None:
    row = json.loads((BENCH / "data" / "torchtitan_t1a.json").read_text())
    assert (row["tokens_per_s_per_gpu"], row["peak_memory_gib"], row["seq_len"], row["local_batch"]) == (
        5762, 82.4, 8192, 2)
    assert "torchtitan" in row["source"]
    sys.path.insert(0, str(BENCH))
    try:
        import llama3_fsdp2 as llama
    finally:
        sys.path.remove(str(BENCH))
    import torch

    with torch.device("meta"):
        model = llama.Llama(llama.CONFIGS["8b"], 8192, "op")
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # Llama 3 8B's parameter count


@pytest.mark.integration
def test_the_kit_runs_its_steps_tiny_on_cpu() -> None:
    """Every step that does not need CUDA runs (the precision step is skipped, saying why); the Llama job reports
    tokens/s and a peak memory beside the published ones."""
    proc = _kit("--cpu", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["step"]: r for r in json.loads(proc.stdout)["rows"]}
    assert rows["hold precision (1,000 holds)"]["status"] == "skipped"
    ddp = rows["ddp zero-cost: emulate W=2 -n 1 vs plain (1 device)"]
    assert ddp["status"] == "pass" and {"plain_ms", "device_hold_ms", "host_hold_ms"} <= set(ddp["figures"])
    llama = rows["llama3-8b fsdp2: emulate W=8 -n 1 (tiny, cpu)"]["figures"]
    assert llama["tokens_per_s_per_gpu"] > 0 and llama["peak_gib"] > 0 and llama["published_tokens_per_s"] == 5762


def test_the_hold_kernels_compile_where_nvrtc_is_found() -> None:
    """Compiled (not run) with whatever NVRTC library this machine has; skipped where it has none (CI)."""
    from emulator_core.device import _cuda as _cuda_hold

    try:
        _cuda_hold._nvrtc_library()
    except _cuda_hold.CudaHoldUnavailable:
        pytest.skip("no NVRTC library here")
    for cc in ((8, 0), (9, 0)):
        assert _cuda_hold._compile(*cc)[:4] in (b"\x7fELF", b"//\n/")  # a cubin, or PTX where NVRTC is older
