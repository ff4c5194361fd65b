"""The namespace testbed (nbox_trace.testbed.namespaces): settings refused up front; with root, the nodes, their shaped
link, their CPUs, and a tear-down that happens on close, on SIGTERM, and (for a run killed outright) by
cleanup_stale."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nbox_trace.errors import UsageError
from nbox_trace.testbed import namespaces as T

ROOT = Path(__file__).resolve().parents[1]

#: Sends for ``seconds`` to ``host``:5201 (send) or receives and prints Gbit/s (recv).
_BANDWIDTH = textwrap.dedent("""
    import socket, sys, time
    mode, host = sys.argv[1], sys.argv[2]
    if mode == "recv":
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, 5201)); s.listen(1)
        c, _ = s.accept(); n = 0; t0 = None
        while (b := c.recv(1 << 20)):
            t0 = t0 or time.perf_counter(); n += len(b)
        print(n * 8 / (time.perf_counter() - t0) / 1e9)
    else:
        for _ in range(100):
            try:
                s = socket.create_connection((host, 5201)); break
            except OSError:
                time.sleep(0.05)
        end = time.perf_counter() + float(sys.argv[3])
        while time.perf_counter() < end:
            s.sendall(b"x" * (1 << 20))
        s.close()
""")


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize(("kw", "match"), [
    ({"nodes": 1}, "nodes: an integer in 2..250"),
    ({"rate": "fast"}, "rate 'fast'"),
    ({"prefix": "Bad-Prefix"}, "prefix 'Bad-Prefix'"),
    ({"subnet": "192.168.0"}, "subnet '192.168.0'"),
    ({"cpus": [[0]]}, "1 CPU set"),
    ({"queue_ms": 0}, "queue_ms"),
])
def test_bad_settings_are_refused_before_anything_is_made(kw: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        T.Testbed(**kw)  # type: ignore[arg-type]


def test_a_node_runs_in_its_namespace_on_its_cpus_without_building() -> None:
    tb = T.Testbed(3, cpus=[[0], [0], [0]], subnet="10.9.8")
    assert [n.addr for n in tb.nodes] == ["10.9.8.1", "10.9.8.2", "10.9.8.3"]
    assert len({n.netns for n in tb.nodes} | {tb.switch}) == 4 and all(n.netns.startswith("nboxtb-") for n in tb.nodes)
    assert tb.wrap(1, ["echo", "hi"]) == ["ip", "netns", "exec", tb.nodes[1].netns, "taskset", "-c", "0", "echo", "hi"]
    assert tb.nodes[2].env() == {"GLOO_SOCKET_IFNAME": "tb2"}
    assert tb.burst == "125000b"  # 1 ms at 1 Gb/s
    # below about 0.55 Gb/s, 1 ms of the rate is shorter than a 64 KiB GSO packet with its segments' headers (about
    # 68 KB), which tbf would split into MTU frames: the bucket holds at least 96 KiB
    assert T.Testbed(2, rate="250mbit").burst == "98304b"
    assert T.Testbed(4, racks=2, uplink_rate="500mbit")._tbf("uplink")[4] == "98304b"
    with pytest.raises(T.TestbedError, match="needs a built testbed"):
        tb.run_on(0, ["true"])


def test_unavailable_is_one_line_or_none() -> None:
    why = T.unavailable()
    assert why is None or (why and "\n" not in why)


@pytest.mark.testbed
def test_two_nodes_talk_over_a_shaped_link_pinned_to_their_cpus() -> None:
    with T.Testbed(2, rate="500mbit") as tb:
        a, b = tb.nodes
        assert set(tb.namespaces) == {a.netns, b.netns} and a.netns in T._namespaces()
        addr = tb.run(0, ["ip", "-o", "-4", "addr", "show"]).stdout
        assert f"{a.addr}/24" in addr and "tb0" in addr and b.addr not in addr  # only its own interface
        qdisc = tb.run(1, ["tc", "qdisc", "show", "dev", "tb1"]).stdout
        assert "tbf" in qdisc and "500Mbit" in qdisc
        allowed = tb.run(1, ["grep", "Cpus_allowed_list", "/proc/self/status"]).stdout
        assert allowed.split()[-1] == ",".join(map(str, b.cpus))
        recv = tb.run_on(1, [sys.executable, "-c", _BANDWIDTH, "recv", b.addr], stdout=subprocess.PIPE)
        time.sleep(0.3)
        send = tb.run_on(0, [sys.executable, "-c", _BANDWIDTH, "send", b.addr, "1.5"])
        assert tb.wait_all([send, recv], timeout_s=60) == [0, 0]
        assert recv.stdout is not None
        gbps = float(recv.stdout.read())
        assert 0.2 < gbps < 0.55, gbps  # sanity only: the shaper holds the rate (about 0.48 here)
    assert not {a.netns, b.netns} & set(T._namespaces())


@pytest.mark.testbed
def test_three_nodes_meet_through_a_switch_and_close_stops_their_processes() -> None:
    with T.Testbed(3) as tb:
        assert tb.switch in T._namespaces()
        listen = tb.run_on(2, [sys.executable, "-c", "import socket,sys; s=socket.socket(); "
                               f"s.bind(('{tb.nodes[2].addr}', 5202)); s.listen(1); c,a=s.accept(); print(a[0])"],
                           stdout=subprocess.PIPE)
        time.sleep(0.3)
        hello = tb.run(0, [sys.executable, "-c", "import socket,time\nfor _ in range(50):\n try:\n"
                           f"  socket.create_connection(('{tb.nodes[2].addr}', 5202)); break\n"
                           " except OSError: time.sleep(0.05)"])
        assert hello.returncode == 0, hello.stderr
        assert listen.wait(timeout=30) == 0 and listen.stdout is not None
        assert listen.stdout.read().decode().strip() == tb.nodes[0].addr
        sleeper = tb.run_on(1, ["sleep", "600"])
        made = tb.namespaces
    assert sleeper.poll() is not None  # stopped by the tear-down
    assert not set(made) & set(T._namespaces())


_HOLD = textwrap.dedent("""
    import sys, time
    from nbox_trace.testbed.namespaces import Testbed
    tb = Testbed(2, prefix=sys.argv[1]).build()
    tb.run_on(0, ["sleep", "600"])
    print(" ".join(tb.namespaces), flush=True)
    time.sleep(600)
""")


def _holder(prefix: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, prefix], env={**os.environ, **_env()},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    names = proc.stdout.readline().split()
    assert len(names) == 2 and set(names) <= set(T._namespaces())
    return proc, names


@pytest.mark.testbed
def test_sigterm_tears_the_testbed_down() -> None:
    proc, names = _holder("nboxtbterm")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # the previous (default) handler ran after the tear-down
    assert not set(names) & set(T._namespaces())


@pytest.mark.testbed
def test_a_killed_runs_namespaces_are_removed_by_cleanup_stale_and_a_live_ones_are_not() -> None:
    live, live_names = _holder("nboxtbkill")
    dead, dead_names = _holder("nboxtbkill")
    try:
        dead.kill()
        dead.wait(timeout=30)
        assert set(dead_names) <= set(T._namespaces())  # SIGKILL: nothing could run
        assert sorted(T.cleanup_stale("nboxtbkill")) == sorted(dead_names)
        assert not set(dead_names) & set(T._namespaces())
        assert set(live_names) <= set(T._namespaces())
        assert T.cleanup_stale("nboxtbother") == []
    finally:
        live.terminate()
        live.wait(timeout=30)
    assert not set(live_names) & set(T._namespaces())


#: Initialises a 2-rank gloo group across the nodes (argv: rank, node 0's address), then prints the scheduling
#: policy of each of this process's threads named gloo_tcp_loop once the testbed had time to scan (1.5 s).
_GLOO_LOOP_POLICY = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    rank, master = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29511", rank=rank, world_size=2)
    time.sleep(1.5)
    tids = [int(t) for t in os.listdir("/proc/self/task")
            if open(f"/proc/self/task/{t}/comm").read().strip() == "gloo_tcp_loop"]
    print(sorted({os.sched_getscheduler(t) for t in tids}), os.sched_getscheduler(0))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.testbed
@pytest.mark.integration
@pytest.mark.parametrize("batch", [True, False])
def test_gloo_device_loop_threads_get_sched_batch_unless_asked_not_to(batch: bool) -> None:
    with T.Testbed(2, gloo_loop_batch=batch) as tb:
        master = tb.node(0).addr
        procs = [tb.run_on(k, [sys.executable, "-c", _GLOO_LOOP_POLICY, str(k), master],
                           {"OMP_NUM_THREADS": "1", **tb.node(k).env()}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE) for k in range(2)]
        assert tb.wait_all(procs, timeout_s=120) == [0, 0], [p.stderr.read() for p in procs if p.stderr]
        want = os.SCHED_BATCH if batch else os.SCHED_OTHER
        for proc in procs:
            assert proc.stdout is not None
            # the loop threads have the policy; the rank's main thread keeps the default
            assert proc.stdout.read().decode().split("\n")[0] == f"[{want}] {os.SCHED_OTHER}"


def _threads_that_rename(rename: threading.Event, done: threading.Event,
                         names: dict[str, str | None]) -> dict[str, int]:
    """Start one daemon thread per key of ``names``; once ``rename`` is set, each names itself as its value (None:
    keeps its name, as gloo names its loop thread just after it starts) and waits for ``done``. Their thread ids."""
    tids: dict[str, int] = {}

    def run(key: str) -> None:
        tids[key] = threading.get_native_id()
        rename.wait(10)
        if names[key] is not None:
            Path(f"/proc/self/task/{tids[key]}/comm").write_text(str(names[key]))
        done.wait(10)

    for key in names:
        threading.Thread(target=run, args=(key,), daemon=True).start()
    while len(tids) < len(names):
        time.sleep(0.01)
    deadline = time.monotonic() + 10  # with ``rename`` already set, return once the renames are visible (a loaded
    while rename.is_set() and time.monotonic() < deadline and any(  # machine may not have run them yet)
            Path(f"/proc/self/task/{tids[k]}/comm").read_text().strip() != v for k, v in names.items() if v):
        time.sleep(0.01)
    return tids


def test_thread_policy_gives_sched_batch_to_named_threads_of_processes_in_its_namespaces_only() -> None:
    # No root needed: this process's own network namespace, and its own threads (SCHED_OTHER -> SCHED_BATCH is
    # allowed to any user). A thread renames itself as gloo does; another keeps its name.
    from nbox_trace.testbed.threads import ThreadPolicy, netns_inode

    rename, done = threading.Event(), threading.Event()
    rename.set()
    tids = _threads_that_rename(rename, done, {"nboxtest_loop": "nboxtest_loop", "keep": None})
    try:
        elsewhere = ThreadPolicy([netns_inode("/proc/self/ns/net") + 1], names=("nboxtest_loop",))
        assert elsewhere.scan() == 0 and os.sched_getscheduler(tids["nboxtest_loop"]) == os.SCHED_OTHER
        here = ThreadPolicy([netns_inode("/proc/self/ns/net")], names=("nboxtest_loop",))
        assert here.scan() == 1 and here.scan() == 0  # once per thread
        assert os.sched_getscheduler(tids["nboxtest_loop"]) == os.SCHED_BATCH
        assert os.sched_getscheduler(tids["keep"]) == os.SCHED_OTHER
    finally:
        done.set()


def test_thread_policy_reads_a_name_while_the_thread_is_young_and_then_stops() -> None:
    # gloo names its loop thread as the thread starts: a scan may see it before it is named, so a young thread's
    # name is read again; an old one's is settled and not read at every scan (that cost 2% of a node's CPU)
    from nbox_trace.testbed import threads as testbed_threads
    from nbox_trace.testbed.threads import ThreadPolicy, netns_inode

    named, done = threading.Event(), threading.Event()
    tids = _threads_that_rename(named, done, {n: n for n in ("nboxtest_young", "nboxtest_old")})
    try:
        policy = ThreadPolicy([netns_inode("/proc/self/ns/net")], names=("nboxtest_young", "nboxtest_old"))
        assert policy.scan() == 0  # neither is named yet
        key_old = (os.getpid(), tids["nboxtest_old"])
        policy._seen[key_old] = time.monotonic() - 2 * testbed_threads._NAME_SETTLES_S  # seen long ago
        assert policy.scan() == 0 and policy._seen[key_old] is None  # settled: not read again
        named.set()
        while any(Path(f"/proc/self/task/{t}/comm").read_text().strip() != n for n, t in tids.items()):
            time.sleep(0.01)
        assert policy.scan() == 1  # the young one, named now
        assert os.sched_getscheduler(tids["nboxtest_young"]) == os.SCHED_BATCH
        assert os.sched_getscheduler(tids["nboxtest_old"]) == os.SCHED_OTHER
        assert policy.scan() == 0
    finally:
        named.set()
        done.set()


def test_thread_policy_refuses_a_scan_interval_that_is_not_positive() -> None:
    from nbox_trace.testbed.threads import ThreadPolicy

    with pytest.raises(UsageError, match="interval_s must be > 0, got 0"):
        ThreadPolicy([1], interval_s=0)
