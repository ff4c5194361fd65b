"""The live workers' held heap (nbox_replay.live.allocator): operators re-run without page faults of their own."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_replay.live import allocator
from nbox_replay.live.hostwork import HostPad, plan_pad
from nbox_replay.replay import host_work_doc

ROOT = Path(__file__).resolve().parents[1]

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Re-runs one rank's recorded operators the way the live worker does (its heap held first, or not), and prints
# the minor page faults each pass took: the steady passes must take none.
_PASSES = """
import json, resource, sys
from nbox_replay.live.allocator import hold_heap
why = hold_heap() if sys.argv[2] == "hold" else "not asked"
import torch
from nbox_replay.inputs.graph import COMPUTE, load_rank
from nbox_replay.live.ops import prepare
torch.set_num_threads(1)
torch.set_grad_enabled(False)
g = load_rank(sys.argv[1], 0, keep_nodes=True)
ops = prepare(g, "cpu")
nodes = [i for i in range(len(g)) if g.kind[i] == COMPUTE]
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in nodes:
        ops.run(i)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"why": why, "faults": faults}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt is what hold_heap sets")
def test_a_held_heap_lets_the_replayed_operators_run_without_page_faults() -> None:
    trace = ROOT / "traces" / "ddp_transformer" / "trace" / "trace.0.et"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([sys.executable, "-c", _PASSES, str(trace), "hold"], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    doc = json.loads(out.stdout)
    assert doc["why"] == ""
    faults = doc["faults"]
    assert faults[0] > 100  # the first pass makes the tensors (the check sees faults at all)
    steady = sorted(faults[4:])
    assert steady[len(steady) // 2] == 0, faults  # the operators' own time, not the kernel's page zeroing


def test_hold_heap_says_why_not_where_it_cannot_act(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert "another allocator is preloaded" in allocator.hold_heap()
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert allocator.hold_heap() == "the C library is not glibc (musl)"
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))

    def broken(name: object) -> object:
        raise RuntimeError("no symbols")

    monkeypatch.setattr(allocator.ctypes, "CDLL", broken)
    assert allocator.hold_heap() == "glibc's mallopt is not reachable: RuntimeError: no symbols"  # never raises


def test_a_heap_not_held_is_reported_with_the_pad() -> None:
    pad = plan_pad(10_000.0, [(6_000.0, 5_000.0)], 1)
    assert HostPad.from_dict(json.loads(json.dumps(pad.to_dict()))) == pad
    line = host_work_doc({0: pad}, "", {0: "the C library is not glibc"})["line"]
    assert line.endswith("the replay's 6.00 ms), its heap not held (the C library is not glibc)")
    held = host_work_doc({0: pad}, "")
    assert held["heap_not_held"] == {} and "heap" not in held["line"]


def test_a_heap_not_held_is_reported_without_a_pad_too() -> None:
    """--host-work off, CUDA, --warmup 0 or a bundle without the clean figures plan no pad; the worker's heap
    reason still reaches the report (the worker sends it on its own)."""
    doc = host_work_doc({}, "--host-work off", {1: "the C library is not glibc (musl)"})
    assert doc["line"] == ("live operators not padded for host work: --host-work off; rank 1's heap not held "
                           "(the C library is not glibc (musl))")
    assert doc["heap_not_held"] == {"1": "the C library is not glibc (musl)"}
    padded = host_work_doc({0: plan_pad(10_000.0, [(6_000.0, 5_000.0)], 1)}, "", {0: "mallopt refused"})
    assert padded["line"].endswith("its heap not held (mallopt refused)")
    assert host_work_doc({}, "--host-work off")["heap_not_held"] == {}


@pytest.mark.integration
def test_a_live_replay_says_when_its_workers_heap_was_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real workers, with no pad planned (--host-work off): a preloaded allocator (named in
    LD_PRELOAD; the loader ignores a missing file) leaves the heap alone, and the report says so per rank."""
    from nbox_replay.replay import ReplayConfig, run_replay

    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/libjemalloc.so.2")
    rep = run_replay(ReplayConfig(str(ROOT / "traces" / "ddp_mlp"), clock="real", compute="live", iterations=1,
                                  warmup=1, timeout_s=120.0, host_work="off")).to_dict()
    doc = rep["host_work"]
    assert set(doc["heap_not_held"]) == {"0", "1"}
    assert all("another allocator is preloaded" in why for why in doc["heap_not_held"].values())
    assert "rank 0's heap not held (another allocator is preloaded" in doc["line"]


@pytest.mark.integration
def test_a_virtual_replay_of_live_operators_says_when_its_measuring_heap_was_not_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--clock virtual --compute live measures the operators in one worker; it holds its heap like the live
    workers, and where it could not, the report's notices say so (its durations may carry page faults)."""
    from nbox_replay.replay import ReplayConfig, run_replay

    config = ReplayConfig(str(ROOT / "traces" / "ddp_mlp"), clock="virtual", compute="live", iterations=1,
                          warmup=1, timeout_s=120.0)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    held = run_replay(config).to_dict()
    assert not any("heap not held" in n for n in held["notices"])
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/libjemalloc.so.2")
    notices = [n for n in run_replay(config).to_dict()["notices"] if "measuring worker's heap not held" in n]
    assert len(notices) == 1 and "another allocator is preloaded" in notices[0], notices
