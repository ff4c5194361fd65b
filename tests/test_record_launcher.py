"""nbox record's launcher without launching: config checks, the torchrun command, the env, and how
failures are reported from what ranks left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbox_record.handoff import rawformat as raw
from nbox_record.launch import launcher as L
from nbox_trace.errors import UsageError
from nbox_trace.launch.launcher import LaunchResult, command, environment, root_cause, root_error


def cfg(tmp_path: Path, **kw: object) -> L.RecordConfig:
    return L.RecordConfig(out=tmp_path / "out.bundle", **kw)  # type: ignore[arg-type]


def launch_command(c: L.RecordConfig, log_dir: Path) -> list[str]:
    return command(L.launch_spec(c, log_dir.parent / "work", "gloo", log_dir))


def launch_env(c: L.RecordConfig, work: Path, backend: str) -> dict[str, str]:
    return environment(L.launch_spec(c, work, backend, work / "logs"))


def failure(c: L.RecordConfig, work: Path, log_dir: Path, rc: int | None, timed_out: bool,
            torchrun_stderr: str = "") -> L.RecordError:
    """The record error of a run that ended so, with its logs in ``log_dir``."""
    return L._failure(c, work, LaunchResult(L.launch_spec(c, work, "gloo", log_dir), rc, timed_out, torchrun_stderr))


@pytest.mark.parametrize(("kw", "match"), [
    ({"nproc_per_node": 0}, "-n/--nproc-per-node"),
    ({"iterations": 0}, "--iterations"),
    ({"warmup": -1}, "--warmup"),
    ({"backend": "mpi"}, "--backend 'mpi'"),
    ({"example": "resnet"}, "--example 'resnet': unknown example"),
    ({"timeout_s": 0}, "--timeout"),
])
def test_config_names_the_bad_value(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    """Issue 13: "library errors escape as `ValueError` (`RecordConfig`, ...)" and "messages name flags as
    typed": a bad option is a UsageError (exit 2) naming the flag."""
    with pytest.raises(UsageError, match=match) as err:
        cfg(tmp_path, **kw)
    assert err.value.exit_code == 2


def test_launch_starts_the_script_per_rank_and_goes_through_torchrun_across_nodes(tmp_path: Path) -> None:
    c = cfg(tmp_path, nproc_per_node=3, script_args=("--lr", "0.1"))
    cmd = launch_command(c, tmp_path / "logs")
    assert L.launch_spec(c, tmp_path, "gloo", tmp_path / "logs").nproc_per_node == 3
    assert cmd[-5:] == [str(L._EXAMPLES_DIR / "ddp_convnet.py"), "--steps", str(3 + 10 + 1 + 2), "--lr", "0.1"]
    user = launch_command(cfg(tmp_path, script=Path(__file__), script_args=("--x",)), tmp_path)
    assert user[-2:] == [__file__, "--x"]  # a user's script gets its own arguments only
    multi = launch_command(cfg(tmp_path, nnodes="2", node_rank=1, rdzv_endpoint="h:29400"), tmp_path)
    assert multi[multi.index("--rdzv-endpoint") + 1] == "h:29400" and "--master-port" not in multi
    assert multi[multi.index("--node-rank") + 1] == "1" and multi[multi.index("--max-restarts") + 1] == "0"
    assert multi[1:3] == ["-m", "torch.distributed.run"]


def test_missing_script_is_not_found(tmp_path: Path) -> None:
    from nbox_trace.errors import InputNotFoundError

    with pytest.raises(InputNotFoundError, match=r"nope\.py"):
        L.script_path(cfg(tmp_path, script=tmp_path / "nope.py"))


def test_env_injects_the_bootstrap_and_one_thread_per_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/user/path")
    env = launch_env(cfg(tmp_path, warmup=2, iterations=7, capture=2), tmp_path / "work", "gloo")
    from nbox_record.handoff.env import inject_dir

    inject = inject_dir()
    assert env["PYTHONPATH"].split(":") == [str(inject), str(inject.parents[1]), "/user/path"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert (env["NBOX_WARMUP"], env["NBOX_ITERATIONS"], env["NBOX_CAPTURE"]) == ("2", "7", "2")
    assert env["NBOX_RECORD_DIR"] == str((tmp_path / "work").resolve()) and env["NBOX_RUN_TO_END"] == "0"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert launch_env(cfg(tmp_path), tmp_path, "gloo")["OMP_NUM_THREADS"] == "4"  # the user's choice wins


def _rank(work: Path, r: int, **files: object) -> None:
    d = work / f"rank{r}"
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (d / name).write_text(json.dumps(content))


def test_failure_names_the_rank_that_raised(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _rank(work, 0, **{raw.ERROR: {"rank": 0, "type": "RuntimeError", "message": "Connection closed by peer",
                                  "time_us": 2e15}})
    _rank(work, 1, **{raw.ERROR: {"rank": 1, "type": "RuntimeError", "message": "boom in step 3",
                                  "time_us": 1e15}})
    err = failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False)
    assert "rank 1 failed: RuntimeError: boom in step 3 (then rank(s) [0] failed too)" in str(err)
    assert err.exit_code != 0


def test_a_peers_connection_closed_is_not_the_root_cause_even_when_written_first(tmp_path: Path) -> None:
    # A rank whose call timed out closes its gloo sockets before it writes its own error: the peer's
    # "Connection closed by peer" lands first (seen in CI), yet the timeout is the cause.
    work = tmp_path / "work"
    _rank(work, 0, **{raw.ERROR: {"rank": 0, "type": "RuntimeError", "time_us": 1e15, "message":
                                  "recv from 5 failed: [pair.cc:553] Connection closed by peer [127.0.0.1]:40674"}})
    _rank(work, 1, **{raw.ERROR: {"rank": 1, "type": "RuntimeError", "time_us": 1e15 + 3000,
                                  "message": "recv did not complete within 4.0 s: a deadlock"}})
    err = failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False)
    assert "rank 1 failed: RuntimeError: recv did not complete within 4.0 s" in str(err), str(err)
    # When every error is a consequence, the earliest is still named.
    _rank(work, 1, **{raw.ERROR: {"rank": 1, "type": "RuntimeError", "time_us": 1e15 + 3000,
                                  "message": "Connection reset by peer"}})
    assert "rank 0 failed" in str(failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False))


def test_root_error_orders_causes_before_consequences_then_by_time_then_rank() -> None:
    assert root_error([(5.0, 0, "a"), (5.0, 1, "b")]) == 0
    assert root_error([(5.0, 1, "x"), (4.0, 0, "Broken pipe")]) == 0
    assert root_error([(9.0, 3, "ncclRemoteError: remote process exited"), (8.0, 2, "Connection closed by peer")]) == 1
    with pytest.raises(ValueError):
        root_error([])


def test_timeout_names_unfinished_ranks_and_their_last_phase(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _rank(work, 0, **{raw.TIMINGS: {}})
    _rank(work, 1, **{"progress.json": {"phase": "timing", "iteration": 4}})
    err = failure(cfg(tmp_path, timeout_s=30), work, tmp_path / "logs", None, timed_out=True)
    text = str(err)
    assert "within 30 s" in text and "rank 1: last seen in phase 'timing' at iteration 4" in text
    assert "rank 0:" not in text


def test_dead_rank_without_error_file_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _rank(work, 0, **{raw.TIMINGS: {}})
    log = tmp_path / "logs" / "run" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("line\nKilled by signal 9\n")
    err = failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False)
    assert "exited with code 1" in str(err) and "[1]" in str(err) and "Killed by signal 9" in str(err)


TORCHRUN_FAILURE = """
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_02:50:00
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 101)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_02:49:59
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 102)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 102
============================================================
"""


def test_a_rank_killed_by_a_signal_is_named_from_torchruns_root_cause(tmp_path: Path) -> None:
    assert root_cause(TORCHRUN_FAILURE) == (1, "rank 1 exited with code -9 (SIGKILL)")
    assert root_cause("no summary here") is None
    work = tmp_path / "work"
    _rank(work, 0, **{raw.ERROR: {"rank": 0, "type": "RuntimeError", "message": "Connection closed by peer"}})
    err = failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False, torchrun_stderr=TORCHRUN_FAILURE)
    assert str(err) == "rank 1 exited with code -9 (SIGKILL) (then rank(s) [0] failed too)"


@pytest.mark.parametrize(("kw", "match"), [
    ({"nnodes": "2"}, r"--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    ({"nnodes": "two", "rdzv_endpoint": "h:1"}, r"--nnodes 'two': expected a node count"),
    ({"nnodes": "2", "rdzv_endpoint": "h:0"}, r"--rdzv-endpoint 'h:0': expected HOST:PORT"),
    ({"local_addr": "10.0.0.1"}, r"--local-addr applies to a multi-node run"),
])
def test_multi_node_flags_are_usage_errors_before_anything_starts(tmp_path: Path, kw: dict[str, object],
                                                                  match: str) -> None:
    """Issue 15: `--nnodes 2` without an endpoint reached torchrun's launcher (exit 3 after "launching"); now a
    usage error (exit 2) naming the flags."""
    with pytest.raises(UsageError, match=match) as err:
        cfg(tmp_path, **kw)
    assert err.value.exit_code == 2


def test_the_cli_refuses_nnodes_without_an_endpoint_at_once(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbox", "record", "--nnodes", "2", "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2 and "--nnodes 2 needs --rdzv-endpoint" in proc.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "o").exists()


def test_a_node_bundle_says_which_run_and_node_it_is(tmp_path: Path) -> None:
    c = cfg(tmp_path, nproc_per_node=1, nnodes="2", node_rank=1, rdzv_endpoint="10.0.0.1:29400")
    timings = {1: {"hostname": "n1", "job": {"job_id": "j", "run_id": "none", "group_rank": 1}}}
    facts = L._node_facts(c, timings, "10.0.0.2")
    assert facts == {"rdzv_endpoint": "10.0.0.1:29400", "job_id": "j", "run_id": "none",
                     "nodes": [{"node_rank": 1, "group_rank": 1, "ranks": [1], "hostname": "n1",
                                "local_addr": "10.0.0.2"}]}
    assert L._node_facts(cfg(tmp_path), timings, None) == {}
    cmd = launch_command(cfg(tmp_path, nnodes="2", rdzv_endpoint="h:1", local_addr="10.0.0.2", rdzv_host=False),
                         tmp_path)
    assert cmd[cmd.index("--local-addr") + 1] == "10.0.0.2" and cmd[cmd.index("--rdzv-conf") + 1] == "is_host=0"


GLOO_RESET = ("[pair.cc:537] Read error [10.77.0.2]:19637: Connection reset by peer. This is typically caused by "
              "a remote worker hanging")
PEERS = {"0": {"addr": "10.77.0.1", "group_rank": 0, "hostname": "vm"},
         "1": {"addr": "10.77.0.2", "group_rank": 1, "hostname": "vm"}}


def test_a_node_that_went_away_is_named_with_its_ranks(tmp_path: Path) -> None:
    """Issue 15: a node killed mid-run ends the job with an error naming the node and rank. The surviving node's
    rank only sees its socket reset; peers.json (every rank's node) turns the peer's address into node and ranks."""
    work = tmp_path / "work"
    multi = cfg(tmp_path, nproc_per_node=1, nnodes="2", rdzv_endpoint="10.77.0.1:29400", local_addr="10.77.0.1")
    _rank(work, 0, **{raw.ERROR: {"rank": 0, "type": "RuntimeError", "message": GLOO_RESET, "time_us": 1e15},
                      raw.PEERS: PEERS})
    err = str(failure(multi, work, tmp_path / "logs", 1, timed_out=False))
    assert err.startswith("rank 0 on node 0 (10.77.0.1) failed because node 1 (10.77.0.2, rank(s) [1]) went away "
                          "first (that node, or its rank, failed): RuntimeError: [pair.cc:537]"), err
    (work / "rank0" / raw.PEERS).unlink()  # killed before the ranks told each other their nodes
    err = str(failure(multi, work, tmp_path / "logs", 1, timed_out=False))
    assert "failed because the node at 10.77.0.2 went away first" in err
    # the node whose rank died says so; a silent node ends at the deadline, and the message says what it may be
    dead = tmp_path / "dead"
    node1 = cfg(tmp_path, nproc_per_node=1, nnodes="2", node_rank=1, rdzv_endpoint="10.77.0.1:29400",
                local_addr="10.77.0.2")
    _rank(dead, 1, **{raw.PEERS: PEERS})
    err = str(failure(node1, dead, tmp_path / "logs", 1, timed_out=False, torchrun_stderr=TORCHRUN_FAILURE))
    assert err == "rank 1 on node 1 (10.77.0.2) exited with code -9 (SIGKILL)"
    err = str(failure(node1, dead, tmp_path / "logs", None, timed_out=True))
    assert "unfinished ranks: rank 1 on node 1 (10.77.0.2): no progress reported (a multi-node run: a node that " \
           "went silent" in err
    # one node: the messages stay as they were
    assert "rank 0 failed: RuntimeError" in str(failure(cfg(tmp_path), work, tmp_path / "logs", 1, timed_out=False))


def test_peers_are_read_from_any_rank_folder_and_never_fail_a_run(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from nbox_record.handoff import peers as recordpeers

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / raw.PEERS).write_text("not json")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / raw.PEERS).write_text(json.dumps(PEERS))
    assert recordpeers.read_peers([tmp_path / "a", tmp_path / "b"])[1]["addr"] == "10.77.0.2"
    assert recordpeers.read_peers([tmp_path / "none"]) == {}
    monkeypatch.delenv(recordpeers.ENV_NODE_ADDR, raising=False)
    recordpeers.announce(0)  # one node: nothing to do, nothing imported
    assert recordpeers.collect(tmp_path, 2) is False
    monkeypatch.setenv(recordpeers.ENV_NODE_ADDR, "10.0.0.1")
    assert recordpeers.collect(tmp_path, 2) is False  # no process group: nothing written, nothing raised


def test_a_negative_lean_iteration_count_is_refused_by_its_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--lean-iterations must be >= 0, got -1"):
        cfg(tmp_path, lean=-1)


def test_the_bundle_names_the_backend_the_ranks_used_and_auto_is_resolved_in_the_rank(tmp_path: Path) -> None:
    """`--backend auto` reaches the ranks as NBOX_BACKEND=auto (the built-in examples resolve it; resolving it in
    nbox record's own process meant importing torch, 2.5-3.5 s before any rank started); the manifest names the
    backend the ranks' process group used, and a flag the script did not follow gets a notice."""
    assert launch_env(cfg(tmp_path), tmp_path / "work", "auto")["NBOX_BACKEND"] == "auto"
    gloo = {0: {"backend": "gloo"}, 1: {"backend": "gloo"}}
    assert L.recorded_backend("auto", gloo) == L.recorded_backend("nccl", gloo) == "gloo"
    assert L.recorded_backend("nccl", {0: {}}) == "nccl" and L.recorded_backend("auto", {0: {}}) is None
    assert L.recorded_backend("auto", {0: {"backend": "nccl"}, 1: {"backend": "gloo"}}) == "gloo,nccl"
    assert L.backend_notice("auto", gloo) is None and L.backend_notice("gloo", gloo) is None
    notice = L.backend_notice("nccl", gloo)
    assert notice is not None and notice.startswith("--backend nccl: the ranks used gloo")


def test_the_examples_resolve_auto_where_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from nbox_record.examples import ddp_mlp, ddp_transformer, fsdp2_transformer, tp_dp_mlp

    here = "nccl" if torch.cuda.is_available() else "gloo"
    for module in (ddp_mlp, ddp_transformer, fsdp2_transformer, tp_dp_mlp):
        monkeypatch.setenv("NBOX_BACKEND", "auto")
        assert module.default_backend() == here
        monkeypatch.setenv("NBOX_BACKEND", "gloo")
        assert module.default_backend() == "gloo"
