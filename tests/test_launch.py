"""The one launcher (nbox_trace.launch.launcher) without launching ranks: the command line, the environment, the
deadline, and how a failure is read. Each test pins a rule on which record, calibrate and live replay used to
disagree (issue 12)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from emulator_core.calibration import _worker as worker
from emulator_core.calibration import run as calibration_run
from emulator_core.calibration.spec import CalibrateConfig
from emulator_core.scenario.files import load_scenario
from nbox_record.handoff import rawformat as raw
from nbox_record.launch import launcher as record_launcher
from nbox_replay.live import run as live
from nbox_trace.launch import launcher as L

TORCHRUN_KILLED_RANK_1 = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_02:49:59
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 102)  (SIGKILL)
  error_file: <N/A>
============================================================
"""


def spec(tmp_path: Path, **kw: object) -> L.Launch:
    return L.Launch("pkg.worker", tmp_path / "logs", module=True, **kw)  # type: ignore[arg-type]


def test_every_caller_gets_the_same_command_line(tmp_path: Path) -> None:
    """Record used ``--master-port`` of a port probed in advance (another process can take it before torchrun
    binds it); calibrate and live used ``--standalone``. Then: ``--standalone`` unless an rdzv endpoint is given.
    Now: on one node every caller's ranks are started by nbox itself (nbox_trace.launch.localrun holds the store's
    port), across nodes by torchrun's c10d rendezvous."""
    rcfg = record_launcher.RecordConfig(out=tmp_path / "o.bundle")
    record = L.command(record_launcher.launch_spec(rcfg, tmp_path / "w", "gloo", tmp_path / "logs"))
    calib = L.command(calibration_run.launch_spec(CalibrateConfig(), tmp_path))
    assert record[0] == calib[0] == sys.executable and calib[1:3] == ["-m", "emulator_core.calibration._worker"]
    for cmd in (record, calib):
        assert "torch.distributed.run" not in cmd and "--master-port" not in cmd
    multi = L.command(spec(tmp_path, nnodes="2", node_rank=1, rdzv_endpoint="h:29400", args=("a",)))
    assert multi[1:3] == ["-m", "torch.distributed.run"] and multi[multi.index("--rdzv-backend") + 1] == "c10d"
    assert "--standalone" not in multi and multi[multi.index("--max-restarts") + 1] == "0"
    assert multi[multi.index("--redirects") + 1] == "3"
    assert multi[-3:] == ["-m", "pkg.worker", "a"]
    with pytest.raises(L.LaunchConfigError, match="nnodes"):
        spec(tmp_path, nnodes="2")  # several nodes cannot meet at a standalone (local) rendezvous


def test_the_environment_is_built_one_way(tmp_path: Path) -> None:
    """OMP_NUM_THREADS: calibrate and live forced 1, record kept the user's; now the user's wins everywhere.
    Inherited NBOX_RECORD_DIR / NBOX_SCENARIO_SET: only live dropped them; now every launch does.
    PYTHONPATH: record skipped an installed package root, the others always added it; now one rule."""
    base = {"OMP_NUM_THREADS": "4", "NBOX_RECORD_DIR": "/elsewhere", "NBOX_SCENARIO_SET": "x=1",
            "PYTHONPATH": "/user", "KEEP": "1"}
    env = L.environment(spec(tmp_path, env={"NBOX_WORLD_SIZE": "8"}, pythonpath=("/first",)), base)
    assert env["OMP_NUM_THREADS"] == "4" and env["KEEP"] == "1" and env["NBOX_WORLD_SIZE"] == "8"
    assert "NBOX_RECORD_DIR" not in env and "NBOX_SCENARIO_SET" not in env
    root = str(Path(L.__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep) == ["/first", root, "/user"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert L.environment(spec(tmp_path), {})["OMP_NUM_THREADS"] == "1"
    calib = L.environment(calibration_run.launch_spec(CalibrateConfig(), tmp_path), base)
    assert calib["OMP_NUM_THREADS"] == "4" and "NBOX_RECORD_DIR" not in calib


def test_live_replay_launches_its_worker_with_the_what_if_world(tmp_path: Path) -> None:
    trace = tmp_path / "r.et"
    trace.write_bytes(b"")
    cfg = live.LiveConfig(files={3: trace}, groups={}, recorded_world=2, scenario=load_scenario(None, ["world_size=8"]))
    launch = live.launch_spec(cfg, tmp_path, tmp_path / "c.json", tmp_path / "s.toml")
    assert L.command(launch) == [sys.executable, "-m", "nbox_replay.live._worker", str(tmp_path / "c.json")]
    env = L.environment(launch, {"NBOX_RECORD_DIR": "/x"})
    assert (env["NBOX_WORLD_SIZE"], env["NBOX_REAL_RANKS"]) == ("8", "3") and "NBOX_RECORD_DIR" not in env


def test_stdout_is_discarded_and_a_deadline_stops_the_group(capfd: pytest.CaptureFixture[str]) -> None:
    """Record and emulate let torchrun's stdout through (record silenced it only with --run-to-end), calibrate
    and live discarded it; a command's stdout is its --json document, so it is discarded everywhere."""
    rc, timed_out, err = L._run_with_deadline([sys.executable, "-c", "print('out'); import sys; "
                                               "sys.stderr.write('err')"], dict(os.environ), 30)
    assert (rc, timed_out, err) == (0, False, "err")
    assert "out" not in capfd.readouterr().out
    started = time.monotonic()
    rc, timed_out, err = L._run_with_deadline([sys.executable, "-c", "import time; time.sleep(60)"],
                                              dict(os.environ), 0.5)
    assert (rc, timed_out) == (None, True) and time.monotonic() - started < 20


def _error(path: Path, message: str, time_us: float | None = None, **extra: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"type": "RuntimeError", "message": message, **extra}
    if time_us is not None:
        doc["time_us"] = time_us
    path.write_text(json.dumps(doc))


def test_a_rank_torchrun_saw_die_first_is_the_root_cause_for_every_caller(tmp_path: Path) -> None:
    """Record named the rank torchrun saw die first (it left no error file: SIGKILL) before its peers'
    "Connection closed" errors; live used torchrun's verdict only when no rank wrote an error file, and
    calibrate never did, so both named the peer's consequence. Now all three name the killed rank."""
    cfg = CalibrateConfig()
    _error(worker.error_file(tmp_path, 0), "Connection closed by peer", 1e15, collective="all_reduce", nbytes=4)
    result = L.LaunchResult(calibration_run.launch_spec(cfg, tmp_path), 1, False, TORCHRUN_KILLED_RANK_1)
    assert str(calibration_run._failure(cfg, tmp_path, result)).startswith(
        "rank 1 exited with code -9 (SIGKILL) (then rank(s) [0] failed too)")

    trace = tmp_path / "r.et"
    trace.write_bytes(b"")
    lcfg = live.LiveConfig(files={2: trace, 5: trace}, groups={}, recorded_world=2,
                           scenario=load_scenario(None, ["world_size=8"]))
    work = tmp_path / "live"
    _error(work / "error2.json", "Connection closed by peer", 1e15, rank=2, phase="replaying")
    result = L.LaunchResult(live.launch_spec(lcfg, work, work / "c.json", work / "s.toml"), 1, False,
                            TORCHRUN_KILLED_RANK_1)
    assert str(live._failure(lcfg, work, result)) == \
        "live replay: rank 5 exited with code -9 (SIGKILL) (then rank(s) [2] failed too)"  # torchrun rank 1 = 5


def test_an_undated_error_file_is_dated_by_its_mtime(tmp_path: Path) -> None:
    """An error file without a time: record dated it by the file's mtime, calibrate and live by 0 (so it
    always won, even over an earlier cause). Now by its mtime; and an unreadable one (a rank killed while
    writing it) is skipped, where record used to fail the failure report itself."""
    _error(tmp_path / "rank0" / raw.ERROR, "boom first", time.time() * 1e6 - 60e6)
    _error(tmp_path / "rank1" / raw.ERROR, "later, undated")
    (tmp_path / "rank2").mkdir()
    (tmp_path / "rank2" / raw.ERROR).write_text("{trunc")
    result = L.LaunchResult(spec(tmp_path), 1, False, "")
    f = result.failure({r: tmp_path / f"rank{r}" / raw.ERROR for r in range(3)})
    assert f.root_rank == 0 and f.root_error is not None and f.root_error.message == "boom first"
    assert f.others == [1]


def test_messages_are_capped_and_tails_come_from_the_ranks_first(tmp_path: Path) -> None:
    """Record kept whole messages, calibrate 500 characters, live 600: now 500. Tails: record and calibrate
    read the ranks' stderr.log (6 lines; calibrate then torchrun's), live only torchrun's (8 lines); now each
    rank's last 8 lines, the launcher's when no rank wrote any."""
    _error(tmp_path / "e0.json", "x" * 2000, 1.0)
    log = tmp_path / "logs" / "run" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(f"line {i}" for i in range(20)))
    result = L.LaunchResult(spec(tmp_path), 1, False, "torchrun said")
    f = result.failure({0: tmp_path / "e0.json"})
    assert f.root_error is not None and len(f.root_error.message) == L.MESSAGE_CHARS == 500
    assert f.stderr_tails == {1: "\n".join(f"line {i}" for i in range(12, 20))}
    assert "last lines of local rank 1's stderr:\n    line 12" in f.tail_text()
    log.write_text("")
    assert "last lines of the launcher's stderr:\n    torchrun said" in result.failure({}).tail_text()


def test_a_deadline_reads_the_same_for_every_caller(tmp_path: Path) -> None:
    """Record wrote the deadline with ``:.0f`` ("within 0 s" for half a second), calibrate and live with ``:g``."""
    cfg = record_launcher.RecordConfig(out=tmp_path / "o.bundle", timeout_s=0.5)
    result = L.LaunchResult(record_launcher.launch_spec(cfg, tmp_path, "gloo", tmp_path / "logs"), None, True, "")
    assert "did not finish within 0.5 s (--timeout)" in str(record_launcher._failure(cfg, tmp_path, result))
    assert L.seconds_text(900.0) == "900"


def test_a_node_of_several_tells_torchrun_its_address_and_whether_it_hosts_the_store(tmp_path: Path) -> None:
    """Issue 15: in a network namespace torchrun's hostname-based guesses fail (no node hosts the rendezvous store,
    workers advertise an address the other node cannot reach: a hang), so nbox says both."""
    here = L.settle(spec(tmp_path, nnodes="2", node_rank=0, rdzv_endpoint="127.0.0.1:29400"), base_env={})
    assert (here.local_addr, here.rdzv_host, here.env.get("GLOO_SOCKET_IFNAME")) == ("127.0.0.1", True, "lo")
    cmd = L.command(here)
    assert cmd[cmd.index("--rdzv-conf") + 1] == "is_host=1" and cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"
    other = L.settle(spec(tmp_path, nnodes="2", node_rank=1, rdzv_endpoint="localhost:29400"), base_env={})
    assert other.rdzv_host is False and L.command(other)[L.command(other).index("--rdzv-conf") + 1] == "is_host=0"
    # what the caller says wins: its own address, host or not, and a GLOO_SOCKET_IFNAME it set
    told = L.settle(spec(tmp_path, nnodes="2", node_rank=1, rdzv_endpoint="127.0.0.1:1", local_addr="127.0.0.2",
                         rdzv_host=True), base_env={"GLOO_SOCKET_IFNAME": "eth9"})
    assert (told.local_addr, told.rdzv_host, "GLOO_SOCKET_IFNAME" in told.env) == ("127.0.0.2", True, False)
    # an endpoint that is not this machine's: torchrun decides (a client), and single-node runs are left alone
    away = L.settle(spec(tmp_path, nnodes="2", rdzv_endpoint="192.0.2.1:29400"), base_env={})
    assert away.rdzv_host is None and "--rdzv-conf" not in L.command(away)
    single = spec(tmp_path)
    assert L.settle(single) is single and "--local-addr" not in L.command(single)


@pytest.mark.parametrize(("endpoint", "parsed"), [("h:1", ("h", 1)), ("10.0.0.1", ("10.0.0.1", 29400)),
                                                  ("[::1]:5", ("::1", 5))])
def test_endpoints_parse(endpoint: str, parsed: tuple[str, int]) -> None:
    assert L.parse_endpoint(endpoint) == parsed


@pytest.mark.parametrize("endpoint", ["h:0", "h:99999", "a:b:c", ""])
def test_a_bad_endpoint_is_refused(tmp_path: Path, endpoint: str) -> None:
    with pytest.raises(L.LaunchConfigError, match="rdzv_endpoint"):
        L.parse_endpoint(endpoint)


def test_addresses_of_this_machine() -> None:
    assert L.is_local_address("127.0.0.1") and not L.is_local_address("192.0.2.1")
    assert L.route_source("127.0.0.1") == "127.0.0.1" and L.interface_of("127.0.0.1") == "lo"
    assert L.interface_of("192.0.2.1") is None


FAULT_LOG = """some output of the script
Fatal Python error: Segmentation fault

Thread 0x00007f9bf607b6c0 (most recent call first):
  File "/x/recordwatch.py", line 38 in report_progress
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f9bf7836b80 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/tmp/train.py", line 18 in crash_here
  File "/tmp/train.py", line 21 in <module>

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


def test_a_crashed_ranks_tail_is_the_fault_and_the_crashing_threads_frames(tmp_path: Path) -> None:
    """Python's fault handler prints every thread, the crashing one last but for "Extension modules": the last 8
    lines would miss the fault's name and keep module names. The excerpt is the fault line and the "Current
    thread" block only; a log without a fault keeps its last lines."""
    log = tmp_path / "logs" / "run" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text(FAULT_LOG)
    tail = L.rank_tails(tmp_path / "logs")[1]
    assert tail.splitlines() == ["Fatal Python error: Segmentation fault",
                                 "Current thread 0x00007f9bf7836b80 (most recent call first):",
                                 '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
                                 '  File "/tmp/train.py", line 18 in crash_here',
                                 '  File "/tmp/train.py", line 21 in <module>']
    plain = "\n".join(f"line {i}" for i in range(20))
    log.write_text(plain)
    assert L.rank_tails(tmp_path / "logs")[1] == "\n".join(f"line {i}" for i in range(12, 20))


NATIVE_ABORT_LOG = """step 3 done
terminate called after throwing an instance of 'gloo::IoException'
  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.77.0.2]:48610
Fatal Python error: Aborted

Thread 0x00007faeb3ac56c0 (most recent call first):
  File "/x/recordwatch.py", line 38 in report_progress
  File "/usr/lib/python3.11/threading.py", line 982 in run

Extension modules: torch._C (total: 1)
"""


def test_a_native_abort_keeps_its_reason_and_quotes_no_bystander_thread(tmp_path: Path) -> None:
    """A thread without Python frames (gloo's, the profiler's) aborted: the excerpt keeps the reason printed
    before the fault line (libstdc++'s terminate and what()), and says the crashing thread has no Python frames
    instead of quoting the idle progress thread (stop 25's CI excerpt showed only that thread)."""
    log = tmp_path / "logs" / "run" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text(NATIVE_ABORT_LOG)
    assert L.rank_tails(tmp_path / "logs")[0].splitlines() == [
        "terminate called after throwing an instance of 'gloo::IoException'",
        "  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.77.0.2]:48610",
        "Fatal Python error: Aborted",
        "(no Python frames on the crashing thread: a native thread failed)"]


def test_the_root_ranks_own_tail_is_found_by_its_local_rank(tmp_path: Path) -> None:
    """On node 1 of a 2 x 2 run, torchrun's rank 3 is local rank 1: its log, not local rank 0's, is quoted."""
    for local, text in ((0, "rank 2 said nothing useful"), (1, FAULT_LOG)):
        log = tmp_path / "logs" / "run" / "attempt_0" / str(local) / "stderr.log"
        log.parent.mkdir(parents=True)
        log.write_text(text)
    launch = L.Launch("train.py", tmp_path / "logs", nproc_per_node=2, nnodes="2", node_rank=1,
                      rdzv_endpoint="10.0.0.1:29400")
    f = L.LaunchResult(launch, 1, False, "").failure({})
    f = dataclasses.replace(f, root_rank=3)
    assert f.root_tail_text().startswith("\n  last lines of its stderr:\n    Fatal Python error: Segmentation fault")
    assert "crash_here" in f.root_tail_text() and "rank 2 said" not in f.root_tail_text()
    assert dataclasses.replace(f, root_rank=None).root_tail_text() == ""
