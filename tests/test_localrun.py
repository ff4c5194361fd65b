"""nbox's own single-node launcher (nbox_trace.launch.localrun), with real processes that do not import torch: what the
ranks see, where their output goes, the first failure stops the rest (and their children), the deadline, an
interrupted caller, and the store's port held for rank 0. The launches of real torch ranks go through it in every
integration test (record, emulate, calibrate, live replay)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from nbox_trace.launch import launcher as L
from nbox_trace.launch import localrun

ENV_SCRIPT = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "EXTRA"]
out = sys.argv[1]
with open(os.path.join(out, os.environ["RANK"] + ".json"), "w") as f:
    ids = {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}
    json.dump({k: os.environ.get(k) for k in keys} | ids, f)
print("hello from", os.environ["RANK"])
print("to stderr", file=sys.stderr)
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(text)
    return path


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie that its parent, or a container's PID 1, has not reaped counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_each_rank_gets_torchruns_environment_and_its_own_logs(tmp_path: Path) -> None:
    """The variables torchrun's agent gives a worker (torch 2.13 local_elastic_agent.py), one store port for all,
    each rank's output in torchrun's log layout, each rank in a session of its own (as torchrun starts them)."""
    out = tmp_path / "out"
    out.mkdir()
    launch = L.Launch(str(_script(tmp_path, ENV_SCRIPT)), tmp_path / "logs", args=(str(out),), nproc_per_node=3,
                      env={"EXTRA": "x"}, timeout_s=60)
    result = L.run(launch)
    assert result.ok and result.first_failures == (), result.stderr
    seen = [json.loads((out / f"{r}.json").read_text()) for r in range(3)]
    ports = {s["MASTER_PORT"] for s in seen}
    assert len(ports) == 1 and int(ports.pop()) > 0
    assert {s["TORCHELASTIC_RUN_ID"] for s in seen} == {seen[0]["TORCHELASTIC_RUN_ID"]}
    for r, s in enumerate(seen):
        assert (s["RANK"], s["LOCAL_RANK"], s["ROLE_RANK"]) == (str(r), str(r), str(r))
        assert (s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["GROUP_RANK"], s["GROUP_WORLD_SIZE"]) == ("3", "3", "0", "1")
        assert (s["MASTER_ADDR"], s["TORCHELASTIC_USE_AGENT_STORE"], s["TORCHELASTIC_MAX_RESTARTS"]) == \
            ("127.0.0.1", "False", "0")
        assert (s["ROLE_NAME"], s["ROLE_WORLD_SIZE"], s["TORCHELASTIC_RESTART_COUNT"]) == ("default", "3", "0")
        assert s["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert s["pgid"] == s["sid"] == s["pid"] != os.getsid(0)
        assert (s["OMP_NUM_THREADS"], s["EXTRA"]) == ("1", "x")  # launch.environment's rules still apply
        log_dir = Path(s["TORCHELASTIC_ERROR_FILE"]).parent
        assert log_dir.name == str(r) and log_dir.parent.name == "attempt_0"
        assert (log_dir / "stdout.log").read_text() == f"hello from {r}\n"
        assert (log_dir / "stderr.log").read_text() == "to stderr\n"
    assert "started 3 rank(s)" in (tmp_path / "logs" / "launcher.log").read_text()


FAIL_SCRIPT = """
import os, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(sys.argv[1], f"{rank}.pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
if rank == int(sys.argv[2]):
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


@pytest.mark.parametrize("failing", [0, 1])
def test_the_first_rank_to_fail_stops_the_others_and_their_children(tmp_path: Path, failing: int) -> None:
    """A rank killed by a signal leaves no error file: the launcher names it (torchrun's verdict did), and stops
    the other ranks and every child of theirs at once, not at the deadline. Rank 0 failing too: it leads the
    process group, which must still reach the others."""
    out = tmp_path / "out"
    out.mkdir()
    launch = L.Launch(str(_script(tmp_path, FAIL_SCRIPT)), tmp_path / "logs", args=(str(out), str(failing)),
                      nproc_per_node=2, timeout_s=100)
    started = time.monotonic()
    result = L.run(launch)
    assert time.monotonic() - started < 30
    assert (result.returncode, result.timed_out) == (1, False)
    assert result.first_failures == ((failing, "exited with code -9 (SIGKILL)"),)
    f = result.failure({})
    assert (f.root_rank, f.exit_text) == (failing, "exited with code -9 (SIGKILL)")
    pids = [int(p) for r in range(2) for p in (out / f"{r}.pids").read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the orphaned children are reaped by init, not by us
    assert all(_gone(p) for p in pids)
    assert "rank(s) failed: rank" in result.stderr


def test_a_rank_error_file_beats_the_exit_order(tmp_path: Path) -> None:
    """The first rank seen to exit non-zero is the root cause only when it left no error file (the rule of
    LaunchResult.failure, as with torchrun's verdict): rank 1 exits first, but only reports its peer's loss, which
    rank 0's earlier error explains."""
    script = _script(tmp_path, """
import json, os, sys, time
rank = int(os.environ["RANK"])
out = sys.argv[1]
def report(msg):
    with open(os.path.join(out, f"e{rank}.tmp"), "w") as f:
        json.dump({"type": "RuntimeError", "message": msg, "time_us": time.time() * 1e6}, f)
    os.replace(os.path.join(out, f"e{rank}.tmp"), os.path.join(out, f"e{rank}.json"))
if rank == 0:
    report("boom")
    time.sleep(5)
else:
    while not os.path.exists(os.path.join(out, "e0.json")):
        time.sleep(0.01)
    report("Connection closed by peer")
sys.exit(1)
""")
    result = L.run(L.Launch(str(script), tmp_path / "logs", args=(str(tmp_path),), nproc_per_node=2, timeout_s=60))
    assert result.first_failures == ((1, "exited with code 1"),)
    f = result.failure({r: tmp_path / f"e{r}.json" for r in range(2)})
    assert f.root_rank == 0 and f.root_error is not None and f.root_error.message == "boom"
    assert f.failed_ranks == (0, 1)


def test_failures_seen_in_one_poll_put_a_killed_rank_first(tmp_path: Path) -> None:
    """Rank 1 killed by SIGSEGV and rank 0 exiting on the lost connection within one poll: the killed rank is the
    root cause, not the lower rank that wrote an error file."""
    assert localrun._failures([1, -11, None, 0, 2]) == ((1, "exited with code -11 (SIGSEGV)"),
                                                        (0, "exited with code 1"), (4, "exited with code 2"))
    _write = tmp_path / "e0.json"
    _write.write_text(json.dumps({"type": "RuntimeError", "message": "Connection closed by peer", "time_us": 1.0}))
    result = L.LaunchResult(L.Launch("x.py", tmp_path / "logs", nproc_per_node=2), 1, False, "",
                            localrun._failures([1, -11]))
    f = result.failure({0: _write})
    assert (f.root_rank, f.exit_text, f.failed_ranks) == (1, "exited with code -11 (SIGSEGV)", (0, 1))


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    script = _script(tmp_path, """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    time.sleep(0.3)
    sys.exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(120)
""")
    started = time.monotonic()
    run = localrun.run_local([sys.executable, str(script)], dict(os.environ), 2, tmp_path / "logs", 100, grace_s=1.0)
    assert run.failures == ((1, "exited with code 3"),) and run.returncode == 1
    assert time.monotonic() - started < 15


def test_a_rank_that_cannot_be_started_stops_those_that_were(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, FAIL_SCRIPT)
    real_popen = localrun.subprocess.Popen
    started: list[int] = []

    def popen(*args: object, **kwargs: object) -> object:
        if started:
            while not (out / "0.pids").exists():  # rank 0 is up and running
                time.sleep(0.02)
            raise OSError(24, "Too many open files")
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(proc.pid)
        return proc

    monkeypatch.setattr(localrun.subprocess, "Popen", popen)
    with pytest.raises(L.LaunchError, match="Too many open files"):
        L.run(L.Launch(str(script), tmp_path / "logs", args=(str(out), "-1"), nproc_per_node=2, timeout_s=100))
    monkeypatch.undo()
    pids = [int(p) for p in (out / "0.pids").read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)


def test_the_deadline_stops_every_rank(tmp_path: Path) -> None:
    script = _script(tmp_path, "import time; time.sleep(120)\n")
    started = time.monotonic()
    result = L.run(L.Launch(str(script), tmp_path / "logs", nproc_per_node=2, timeout_s=0.5))
    assert (result.returncode, result.timed_out, result.first_failures) == (None, True, ())
    assert time.monotonic() - started < 20 and "deadline of 0.5 s" in result.stderr


def test_an_interrupted_caller_stops_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in nbox (a KeyboardInterrupt while it watches) stops the ranks before it propagates."""
    out = tmp_path / "out"
    out.mkdir()
    script = _script(tmp_path, FAIL_SCRIPT)
    real_sleep = time.sleep
    raised = []

    def interrupted(seconds: float) -> None:  # time.sleep everywhere (subprocess's wait too): interrupt once
        if raised:
            return real_sleep(seconds)
        while len(list(out.glob("*.pids"))) < 2:
            real_sleep(0.02)
        raised.append(True)
        raise KeyboardInterrupt

    monkeypatch.setattr(localrun.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        localrun.run_local([sys.executable, str(script), str(out), "-1"], dict(os.environ), 2, tmp_path / "logs", 100)
    monkeypatch.undo()
    ranks = [int((out / f"{r}.pids").read_text().split()[0]) for r in range(2)]
    assert all(_gone(p) for p in ranks)


def test_the_stores_port_is_held_for_a_socket_that_reuses_it_and_refused_to_others() -> None:
    """Rank 0's store binds the held port (it sets SO_REUSEADDR); a plain bind by anyone else is refused."""
    with localrun.reserved_port() as port:
        plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with pytest.raises(OSError), plain:
            plain.bind(("", port))
        store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with store:
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("", port))
            store.listen()


@pytest.mark.parametrize("use_libuv", [True, False])
def test_torchs_store_binds_the_held_port(use_libuv: bool) -> None:
    """What rank 0's init_process_group does with MASTER_PORT, with both of torch's store servers."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    with localrun.reserved_port() as port:
        store = TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10), use_libuv=use_libuv)
        store.set("k", "v")
        assert store.get("k") == b"v" and store.port == port
        del store


def test_exit_text_names_the_signal() -> None:
    assert localrun.exit_text(-int(signal.SIGKILL)) == "exited with code -9 (SIGKILL)"
    assert localrun.exit_text(3) == "exited with code 3" and localrun.exit_text(-999) == "exited with code -999"


def test_a_launch_the_system_refuses_is_an_nbox_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library raises only NboxError: a Python that cannot be executed, a log folder that cannot be made."""
    script = _script(tmp_path, "pass\n")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(L.LaunchError, match=r"could not start .*no-such-python.*No such file"):
        L.run(L.Launch(str(script), tmp_path / "logs", nproc_per_node=2, timeout_s=30))
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(L.LaunchError, match="Not a directory"):
        L.run(L.Launch(str(script), tmp_path / "file" / "logs", timeout_s=30))


class _FakeStore:
    """A dict with torch.distributed.Store's set/get/check/add/wait; wait raises at once for a missing key."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.waited: list[tuple[list[str], float]] = []

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def wait(self, keys: list[str], timeout: object) -> None:
        self.waited.append((keys, timeout.total_seconds()))  # type: ignore[attr-defined]
        if not self.check(keys):
            raise TimeoutError(f"{keys} not set")


def test_rank_0_leaves_the_store_last() -> None:
    """Rank 0's process hosts the store on one node (no agent store): after sharing results it waits until every
    rank has read them; the others do not wait; a rank that never reads costs rank 0 the timeout, not an error."""
    from nbox_trace.share import leave_last, share_results

    store = _FakeStore()
    for rank in (1, 2):
        store.set(f"p/{rank}", json.dumps({"r": rank}))
    store.set("p/0", json.dumps({"r": 0}))
    for rank in (1, 2):  # they read and go
        assert share_results(store, "p", rank, 3, {"r": rank}, 5.0)[0] == {"r": 0}
    assert store.waited and all(keys != ["p/read/all"] for keys, _ in store.waited)
    assert share_results(store, "p", 0, 3, {"r": 0}, 5.0) == {0: {"r": 0}, 1: {"r": 1}, 2: {"r": 2}}
    assert store.waited[-1] == (["p/read/all"], 5.0) and store.check(["p/read/all"])
    lonely = _FakeStore()
    leave_last(lonely, "k", 0, 2, 1.5)  # rank 1 never arrives: waited for, suppressed
    assert lonely.waited == [(["k/all"], 1.5)] and not lonely.check(["k/all"])
