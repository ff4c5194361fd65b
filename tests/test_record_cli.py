"""`nbox record` end to end: real 2-rank gloo runs through the CLI, the bundle they leave, and faults.

Each test launches torchrun (about 6 s of start-up on this machine), so they are marked
``integration`` and kept to a few iterations. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbox_record.handoff import rawformat
from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import read_et
from nbox_trace.chakra.attrs import attr_map
from nbox_trace.check import inspect_trace

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def nbox(*args: object, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def comm_nodes(bundle: Path, rank: int) -> list[tuple[int, int, str]]:
    """(comm_type, comm_size, pg_name) of every collective of one rank, in file order."""
    _, nodes = read_et(bundle / "trace" / f"trace.{rank}.et")
    out = []
    for n in nodes:
        if n.type == pb.COMM_COLL_NODE:
            a = attr_map(n.attr)
            out.append((int(a["comm_type"].value), int(a["comm_size"].value), str(a["pg_name"].value)))  # type: ignore[arg-type]
    return out


def check_bundle(bundle: Path, iterations: int = 3) -> None:
    """A complete two-rank gloo bundle recorded with ``--iterations`` timed iterations and one captured."""
    manifest = read_manifest(bundle)
    assert manifest.complete and manifest.job["ranks_recorded"] == [0, 1] and manifest.job["world_size"] == 2
    assert verify_files(bundle, manifest) == []
    obs = manifest.observed["iteration_time_us"]
    assert obs["n"] == iterations and 0 < obs["p10"] <= obs["median"] <= obs["p90"]
    cpu = manifest.observed["thread_cpu_us"]  # clean vs captured thread CPU per rank (nbox_replay.inputs.profiler)
    assert sorted(cpu) == ["0", "1"]
    for figures in cpu.values():
        assert len(figures["clean"]) == iterations and len(figures["captured"]) == len(figures["captured_wall"]) == 1
        assert all(v > 0 for v in figures["clean"] + figures["captured"])
    assert manifest.producer["backend"] == "gloo" and manifest.producer["torch"]
    report = inspect_trace(trace_prefix(bundle))
    assert report.problem_count() == 0, [p.message for p in report.all_problems()][:5]  # --strict clean
    assert (bundle / "comm_group.json").is_file()


# The built-in examples' recordings (DDP: every gradient byte all-reduced once; FSDP2: shard-sized all-gathers and
# reduce-scatters), raw files and bundle from one `nbox record --keep-raw`, are checked in test_record_bootstrap.py.


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import os, sys, time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step():
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
    """) + textwrap.dedent(body))
    return path


def test_a_rank_that_raises_is_named_and_no_bundle_is_written(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        for i in range(50):
            if rank == 1 and i == 1:
                raise RuntimeError("injected failure on rank 1")
            step()
    """)
    out = tmp_path / "x.bundle"
    proc = nbox("record", "-o", out, "--timeout", 120, "--", script)
    assert proc.returncode != 0
    assert "rank 1 failed" in proc.stderr and "injected failure on rank 1" in proc.stderr
    assert "Traceback" not in proc.stderr.split("nbox: error:")[-1]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_script_without_optimizer_steps_is_told_about_the_marker(tmp_path: Path) -> None:
    script = tmp_path / "nostep.py"
    script.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "x = torch.ones(4)\nfor _ in range(3):\n    dist.all_reduce(x)\n")
    proc = nbox("record", "-o", tmp_path / "x.bundle", "--timeout", 120, "--keep-raw", "--", script)
    assert proc.returncode != 0
    assert "nbox_record.step()" in proc.stderr
    (raw_dir,) = tmp_path.glob(".x.bundle.raw-*")  # --keep-raw: what each rank wrote
    for rank in (0, 1):
        error = json.loads((raw_dir / f"rank{rank}" / rawformat.ERROR).read_text())
        assert set(error) == {"rank", "type", "message", "traceback", "time_us"}
        assert error["rank"] == rank and error["type"] == "NoIterationBoundary"
        assert "nbox_record.step()" in error["message"]
        assert not (raw_dir / f"rank{rank}" / rawformat.TIMINGS).exists()


def test_a_script_that_exits_with_an_error_is_reported_as_its_own_failure(tmp_path: Path) -> None:
    """``raise SystemExit("boom")`` before the first iteration: the script's own exit comes first, with its last
    lines (not "no iteration boundary"); ``sys.exit(3)`` the same; a script that simply ends still hears about the
    marker (the test above)."""
    script = ROOT / "tests" / "record_scripts" / "exits_with_error.py"
    proc = nbox("record", "-o", tmp_path / "x.bundle", "--timeout", 120, "--keep-raw", "--", script)
    assert proc.returncode != 0
    error = proc.stderr.split("nbox: error:", 1)[1]
    assert error.lstrip().startswith(("rank 0 failed: ScriptExit: the script exited", "rank 1 failed: ScriptExit: "
                                                                                        "the script exited"))
    assert "before its first iteration boundary" in error and "NoIterationBoundary" not in proc.stderr
    assert "boom: the data set is missing" in error and "loading the data set" in error  # its last lines
    (raw_dir,) = tmp_path.glob(".x.bundle.raw-*")
    assert all(json.loads((raw_dir / f"rank{r}" / rawformat.ERROR).read_text())["type"] == "ScriptExit"
               for r in (0, 1))
    coded = nbox("record", "-o", tmp_path / "y.bundle", "--timeout", 120, "--", script, "--code", 3)
    assert coded.returncode != 0 and "ScriptExit: the script exited" in coded.stderr
    assert not (tmp_path / "x.bundle").exists() and not (tmp_path / "y.bundle").exists()


def test_the_marker_defines_iterations_for_a_script_without_optimizer(tmp_path: Path) -> None:
    script = tmp_path / "marked.py"
    script.write_text("import torch, torch.distributed as dist, nbox_record\ndist.init_process_group('gloo')\n"
                      "x = torch.ones(1024)\nfor _ in range(20):\n    y = (x * 2).sum()\n    dist.all_reduce(x)\n"
                      "    nbox_record.step()\n")
    out = tmp_path / "m.bundle"
    # --backend reaches a script only through NBOX_BACKEND, which this one does not read: the bundle names the
    # backend its ranks used (gloo), and a notice says the flag did not choose it
    proc = nbox("record", "--warmup", 2, "--iterations", 3, "--backend", "nccl", "--keep-raw", "-o", out, "--",
                script)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout  # issue 13: record's final summary is on stdout
    assert "--backend nccl: the ranks used gloo" in proc.stderr
    (raw_dir,) = tmp_path.glob(".m.bundle.raw-*")  # --keep-raw: the ranks' own files
    for rank in (0, 1):
        timings = json.loads((raw_dir / f"rank{rank}" / rawformat.TIMINGS).read_text())
        assert timings["boundary"] == "marker" and len(timings["iteration_us"]) == 3
        assert len(timings["iteration_cpu_us"]) == 3 and len(timings["capture_cpu_us"]) == 1
        records = json.loads((raw_dir / f"rank{rank}" / rawformat.COLLECTIVES).read_text())["collectives"]
        assert [(r["op"], r["comm_bytes"], r["async_op"]) for r in records] == [("allreduce_", 4096, False)]
        # A blocking collective is waited on by torch.distributed itself: completion is known.
        assert records[0]["done_us"] is not None and records[0]["wait_us"] is None
    assert read_manifest(out).producer["backend"] == "gloo"
    assert read_manifest(out).capture["boundary"] == "marker"
    assert [c[:2] for c in comm_nodes(out, 0)] == [(pb.ALL_REDUCE, 4096)]


def test_a_hung_rank_is_stopped_at_the_deadline_and_named(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        for i in range(1000):
            if rank == 1 and i == 4:
                time.sleep(3600)
            step()
    """)
    out = tmp_path / "h.bundle"
    proc = nbox("record", "--warmup", 2, "--iterations", 10, "-o", out, "--timeout", 10, "--", script, timeout=120)
    assert proc.returncode != 0
    assert "did not finish within 10 s" in proc.stderr
    assert "rank 1: last seen in phase" in proc.stderr
    assert not out.exists()


def test_keep_partial_marks_the_bundle_incomplete(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        for i in range(12):
            step()
        if rank == 1:
            sys.exit(3)
    """)
    out = tmp_path / "p.bundle"
    args = ("record", "--warmup", 2, "--iterations", 3, "--run-to-end", "-o", out)
    failed = nbox(*args, "--", script)
    assert failed.returncode != 0 and not out.exists()
    kept = nbox(*args, "--keep-partial", "--", script)
    assert kept.returncode == 1, kept.stderr
    assert "INCOMPLETE" in kept.stdout
    assert read_manifest(out).complete is False


def test_a_rank_killed_by_a_signal_is_named(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        import signal
        for i in range(50):
            if rank == 1 and i == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            step()
    """)
    out = tmp_path / "k.bundle"
    proc = nbox("record", "-o", out, "--timeout", 120, "--", script)
    assert proc.returncode != 0
    assert "rank 1 exited with code -9 (SIGKILL)" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()


def test_a_rank_that_crashes_in_native_code_is_named_with_its_stack(tmp_path: Path) -> None:
    """A rank killed by SIGSEGV (a crash in native code: here a read of address 0) used to be reported as only
    "exited with code -11": it writes no error file and nothing to stderr by itself. Now the ranks run with
    Python's fault handler and the report quotes the dead rank's own stderr: the fault and the Python frame."""
    script = _script(tmp_path, """
        import ctypes

        def crash_here():
            ctypes.string_at(0)

        for i in range(50):
            if rank == 1 and i == 2:
                crash_here()
            step()
    """)
    out = tmp_path / "s.bundle"
    proc = nbox("record", "-o", out, "--timeout", 120, "--", script)
    assert proc.returncode != 0
    assert "rank 1 exited with code -11 (SIGSEGV)" in proc.stderr, proc.stderr[-2000:]
    assert "Fatal Python error: Segmentation fault" in proc.stderr and "crash_here" in proc.stderr, \
        proc.stderr[-2000:]
    assert not out.exists()


def test_the_lean_pass_times_the_captured_operators_and_the_replay_plays_them(tmp_path: Path) -> None:
    """``--lean-iterations 2``: every captured host operator of ddp_mlp found in the lean iterations carries the
    lean median (its profiled duration kept beside it) and the gap before it; the manifest says how many; the
    replay reports the lean coverage, and a named rule sets the lean figures aside (the knob moves the answer)."""
    from nbox_replay.replay import ReplayConfig, run_replay

    out = tmp_path / "lean.bundle"
    r = nbox("record", "--example", "ddp_mlp", "-n", 2, "--warmup", 1, "--iterations", 2, "--capture", 2,
             "--lean-iterations", 2, "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lean 2" in r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no raw capture left behind
    assert read_manifest(out).capture["iterations_lean"] == 2
    for rank in (0, 1):
        _, nodes = read_et(out / "trace" / f"trace.{rank}.et")
        host = [n for n in nodes if n.type == pb.COMP_NODE and "tid" in attr_map(n.attr)]
        lean = [n for n in host if "nbox_profiled_duration_micros" in attr_map(n.attr)]
        assert len(lean) >= 0.9 * len(host) > 0, (rank, len(lean), len(host))
        assert all("nbox_gap_micros" in attr_map(n.attr) for n in lean)
        # a CPU rank runs its backward on the caller's thread: no timeline is joined with another thread's
        assert not any("nbox_gap_joined" in attr_map(n.attr) for n in nodes)
        assert sum(n.duration_micros for n in lean) != sum(
            attr_map(n.attr)["nbox_profiled_duration_micros"].value for n in lean)
    on = run_replay(ReplayConfig(str(out), clock="virtual", iterations=1))
    assert on.profiler is not None and "timed by the lean pass" in on.profiler.describe()
    named = run_replay(ReplayConfig(str(out), clock="virtual", iterations=1, profiler_correction="proportional"))
    assert named.baseline.iteration_us != on.baseline.iteration_us
    none = tmp_path / "none.bundle"
    r = nbox("record", "--example", "ddp_mlp", "-n", 2, "--warmup", 1, "--iterations", 2, "-o", none)
    assert r.returncode == 0, r.stderr[-2000:]
    _, nodes = read_et(none / "trace" / "trace.0.et")
    assert not any("nbox_profiled_duration_micros" in attr_map(n.attr) for n in nodes)
    assert read_manifest(none).capture["iterations_lean"] == 0
