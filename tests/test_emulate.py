"""`nbox emulate` end to end: unmodified scripts on N real gloo ranks that see a world of W.

Each test launches torchrun (several seconds of start-up), so they are marked ``integration`` and kept
to a few iterations. No timing is asserted beyond "finite and positive".
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from nbox_record.launch.emulation import SCHEMA, EmulateConfig, _quantile
from nbox_trace.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def nbox(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def emulate_json(*args: object) -> dict[str, Any]:
    proc = nbox("emulate", "--json", "--warmup", 2, "--iterations", 4, "--timeout", 90, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["schema"] == SCHEMA
    return doc


def check_run(doc: dict[str, Any], world: int, real: list[int], collectives: set[str]) -> None:
    assert doc["world_size"] == world and doc["real_ranks"] == real
    assert doc["world_size_seen"] == world  # what get_world_size() returned inside the script
    times = doc["iteration_time_us"]
    assert times["count"] == 4 and all(math.isfinite(t) and t > 0 for t in times["values"])
    assert times["p10"] <= times["median"] <= times["p90"]
    assert sorted(doc["per_rank_iteration_us"]) == sorted(str(r) for r in real)
    rows = doc["collectives"]
    assert {r["collective"] for r in rows} >= collectives, rows
    assert all(r["count"] > 0 and r["modeled_us"] > 0 and r["bytes"] > 0 for r in rows)
    assert [r["modeled_us"] for r in rows] == sorted((r["modeled_us"] for r in rows), reverse=True)
    # will it fit: each real rank's peak memory at the emulated world size (a CPU run: the process's peak RSS)
    peaks = doc["peak_memory"]
    assert sorted(peaks) == sorted(str(r) for r in real)
    assert all(m["device"] == "cpu" and m["bytes"] > 1 << 20 for m in peaks.values()), peaks
    assert doc["answer"]["peak_memory_bytes"] == max(m["bytes"] for m in peaks.values())
    assert "peak memory" in doc["answer"]["line"]


# ----------------------------------------------------------------------------------------- unit tests

def test_config_is_validated_at_construction() -> None:
    cfg = EmulateConfig(world_size=8, nproc=2)
    assert cfg.real_ranks == (0, 1)
    assert EmulateConfig(world_size=8, nproc=2, real_ranks=(3, 7)).real_ranks == (3, 7)
    # Issue 13: "library errors escape as `ValueError` (... `EmulateConfig` ...)": a UsageError naming the flag.
    with pytest.raises(UsageError, match="--real-ranks: real rank 8"):
        EmulateConfig(world_size=8, nproc=2, real_ranks=(0, 8))
    with pytest.raises(UsageError, match="not distinct"):
        EmulateConfig(world_size=8, nproc=2, real_ranks=(1, 1))
    with pytest.raises(UsageError, match="nproc is 3"):
        EmulateConfig(world_size=8, nproc=3, real_ranks=(0, 1))
    with pytest.raises(UsageError, match=r"-n/--nproc-per-node .*1\.\.world_size 2"):
        EmulateConfig(world_size=2, nproc=3)
    with pytest.raises(UsageError, match="--example 'nope': unknown example"):
        EmulateConfig(world_size=8, example="nope")


def test_quantile_interpolates() -> None:
    assert _quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert _quantile([10.0, 0.0], 0.1) == pytest.approx(1.0)
    assert math.isnan(_quantile([], 0.5))


# ----------------------------------------------------------------------------------------- integration

@pytest.mark.integration
def test_ddp_mlp_one_real_rank_sees_eight() -> None:
    check_run(emulate_json("--world-size", 8, "-n", 1), 8, [0], {"all_reduce"})


@pytest.mark.integration
def test_ddp_mlp_two_real_ranks_human_report() -> None:
    proc = nbox("emulate", "--world-size", 8, "--real-ranks", "0,4", "--warmup", 2, "--iterations", 4)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Issue 13: the final summary is the result, on stdout (it was asserted on stderr, the bug).
    assert "get_world_size() = 8" in proc.stdout and "all_reduce" in proc.stdout
    assert "real rank(s) [0, 4]" in proc.stdout


@pytest.mark.integration
def test_fsdp2_transformer_two_real_ranks() -> None:
    doc = emulate_json("--world-size", 8, "-n", 2, "--example", "fsdp2_transformer")
    check_run(doc, 8, [0, 1], {"all_gather", "reduce_scatter"})


HARD_CODED_GLOO = """
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
sub = dist.new_group([0, 1, 2, 3], backend="gloo")
model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.randn(4, 32)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if dist.get_rank() < 4:
        dist.all_reduce(torch.ones(3), group=sub)
    opt.step()
dist.destroy_process_group()
"""


@pytest.mark.integration
def test_a_script_that_hard_codes_gloo_reaches_nbox(tmp_path: Path) -> None:
    script = tmp_path / "hard_gloo.py"
    script.write_text(textwrap.dedent(HARD_CODED_GLOO))
    doc = emulate_json("--world-size", 16, "--real-ranks", "2,9", "--", script, 20)
    check_run(doc, 16, [2, 9], {"all_reduce"})
    sizes = {r["bytes"] for r in doc["collectives"]}
    assert {32 * 8 * 4.0, 8 * 4.0, 3 * 4.0} <= sizes  # weight and bias grads; the sub-group's (rank 2 only)


def test_the_removed_compute_noise_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """`compute_noise` (emulated ranks replaying their mirror's earlier iterations) and its `noise_seed` are no
    longer modeled: `nbox emulate --set` of either is refused in one line naming the key (exit 3), before a launch."""
    for kv in ("compute_noise=mirror_history", "noise_seed=3"):
        proc = nbox("emulate", "--world-size", 8, "-n", 1, "--set", kv, "--", tmp_path / "never_run.py", timeout=60)
        assert proc.returncode == 3 and kv.split("=")[0] in proc.stderr and "removed key" in proc.stderr, \
            proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_rank_that_raises_is_named_and_the_run_fails(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(30):
            model(torch.randn(2, 4)).sum().backward()
            dist.all_reduce(model.weight.grad)
            opt.step()
            if step == 4 and dist.get_rank() == 5:
                raise RuntimeError("boom at step 4")
    """))
    started = time.monotonic()
    proc = nbox("emulate", "--world-size", 8, "--real-ranks", "0,5", "--timeout", 60, "--", script)
    assert time.monotonic() - started < 75
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rank 1 failed: RuntimeError: boom at step 4" in proc.stderr, proc.stderr[-3000:]
    assert "real rank 1 = global rank 5" in proc.stderr


@pytest.mark.integration
def test_scenario_keys_the_live_emulation_cannot_apply_are_refused_before_any_rank_starts() -> None:
    proc = nbox("emulate", "--world-size", 8, "--set", "compute_scale=2", "--set", "overlap=serialize", timeout=60)
    assert proc.returncode == 3, proc.stderr[-2000:]  # invalid input, like any other bad scenario
    assert 'compute_scale = 2 and overlap = "serialize"' in proc.stderr and "nbox replay" in proc.stderr
    assert "launching" not in proc.stderr


@pytest.mark.integration
def test_a_real_rank_outside_the_world_is_a_usage_error() -> None:
    proc = nbox("emulate", "--world-size", 8, "--real-ranks", "0,8", timeout=60)
    assert proc.returncode == 2
    assert "real rank 8" in proc.stderr and "0..7" in proc.stderr


@pytest.mark.integration
def test_init_device_mesh_without_init_process_group_reaches_nbox(tmp_path: Path) -> None:
    script = tmp_path / "mesh.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (8,))  # creates the default group itself (torch imported it early)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(20):
            model(torch.randn(2, 4)).sum().backward()
            dist.all_reduce(model.weight.grad, group=mesh.get_group())
            opt.step()
    """))
    check_run(emulate_json("--world-size", 8, "-n", 2, "--", script), 8, [0, 1], {"all_reduce"})


FAULT_PREAMBLE = """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        model(torch.randn(2, 4)).sum().backward()
        dist.all_reduce(model.weight.grad)
        opt.step()
"""


@pytest.mark.integration
def test_a_deadlock_among_real_ranks_names_the_call_within_the_call_timeout(tmp_path: Path) -> None:
    script = tmp_path / "deadlock.py"
    script.write_text(textwrap.dedent(FAULT_PREAMBLE) + textwrap.indent(textwrap.dedent("""
        if step == 4:  # each real rank waits for the other to send: a deadlock
            dist.recv(torch.zeros(3), src=5 if dist.get_rank() == 0 else 0)
    """), "    "))
    started = time.monotonic()
    proc = nbox("emulate", "--world-size", 8, "--real-ranks", "0,5", "--timeout", 60, "--call-timeout", 4,
                "--", script)
    assert time.monotonic() - started < 50  # the call timeout, not the run's deadline, ended it
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "did not complete within 4.0 s" in proc.stderr and "deadlock" in proc.stderr, proc.stderr[-3000:]
    assert "recv from" in proc.stderr
    assert "(rank 5, group 0)" in proc.stderr or "(rank 0, group 0)" in proc.stderr


@pytest.mark.integration
def test_a_call_the_emulator_cannot_answer_is_named(tmp_path: Path) -> None:
    script = tmp_path / "anysource.py"
    script.write_text(textwrap.dedent(FAULT_PREAMBLE) + textwrap.indent(textwrap.dedent("""
        if step == 4:
            dist.recv(torch.zeros(3))  # from any source: which emulated rank would send?
    """), "    "))
    proc = nbox("emulate", "--world-size", 8, "-n", 1, "--timeout", 60, "--", script)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rank 0 failed" in proc.stderr and "recv" in proc.stderr and "any source" in proc.stderr, \
        proc.stderr[-3000:]


@pytest.mark.integration
def test_o_writes_a_bundle_of_the_emulated_run_that_verifies_and_replays(tmp_path: Path) -> None:
    from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
    from nbox_trace.check import inspect_trace

    out = tmp_path / "emulated.bundle"
    doc = emulate_json("--world-size", 8, "--real-ranks", "0,4", "-o", out)
    check_run(doc, 8, [0, 4], {"all_reduce"})
    b = doc["breakdown_us"]
    assert b is not None and b["compute_us"] > 0 and b["exposed_comm_us"] >= 0 and b["cpu_contention_us"] >= 0
    assert math.isclose(b["compute_us"] + b["exposed_comm_us"] + b["cpu_contention_us"], b["iteration_us"],
                        rel_tol=1e-6)
    assert doc["bundle"] == str(out)
    manifest = read_manifest(out)
    assert manifest.kind == "emulated" and verify_files(out, manifest) == []
    assert manifest.job["world_size"] == 8 and manifest.job["ranks_recorded"] == [0, 4]
    assert manifest.extra["emulation"]["real_ranks"] == [0, 4]
    assert sorted(p.name for p in (out / "trace").iterdir()) == ["trace.0.et", "trace.4.et"]
    report = inspect_trace(trace_prefix(out), comm_group=out / "comm_group.json")
    assert report.problem_count() == 0, [p.to_dict() for p in report.all_problems()][:5]
    assert report.process_groups["0"] == list(range(8))
    # the ConvNet's gradients fit one DDP bucket (one all_reduce per step); DDP's start broadcasts the module state
    kinds = [{c.comm_type: c.count for c in r.collectives} for r in report.ranks]
    assert all(k.get("ALL_REDUCE") == 1 and set(k) <= {"ALL_REDUCE", "BROADCAST"} for k in kinds), kinds
    proc = nbox("replay", out, "--clock", "virtual", "--compute", "recorded", "--world-size", 64, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    replay = json.loads(proc.stdout)
    assert replay["what_if"]["world_size"] == 64


@pytest.mark.integration
def test_the_environment_shows_the_emulated_world_and_explicit_rank_world_size_still_work(tmp_path: Path) -> None:
    script = tmp_path / "env_world.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, torch, torch.distributed as dist
        seen = {{"RANK": os.environ["RANK"], "WORLD_SIZE": os.environ["WORLD_SIZE"]}}
        # the common pattern: pass what the environment says (the emulated world)
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        seen.update(rank=dist.get_rank(), world=dist.get_world_size())
        with open(os.path.join({str(tmp_path)!r}, f"seen{{dist.get_rank()}}.json"), "w") as f:
            json.dump(seen, f)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            model(torch.randn(2, 4)).sum().backward()
            dist.all_reduce(model.weight.grad)
            opt.step()
    """))
    doc = emulate_json("--world-size", 32, "--real-ranks", "3,17", "--", script)
    check_run(doc, 32, [3, 17], {"all_reduce"})
    for rank in (3, 17):
        seen = json.loads((tmp_path / f"seen{rank}.json").read_text())
        assert seen == {"RANK": str(rank), "WORLD_SIZE": "32", "rank": rank, "world": 32}
