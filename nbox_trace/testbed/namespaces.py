"""A cluster on one machine, for tests and benches: N "nodes" as Linux network namespaces joined by shaped links.

Not a user command: tests (``@pytest.mark.testbed``) and ``bench/`` scripts build one with::

    with Testbed(nodes=2, rate="1gbit") as tb:
        a = tb.run_on(0, ["python", "-c", "..."])          # runs inside node 0's namespace, on node 0's CPUs
        b = tb.run_on(1, [...], env={"X": "1"})
        tb.wait_all([a, b], timeout_s=60)

What it builds (names ``<prefix>-<pid>-<random>-n<k>``, so two testbeds never collide and a stale one names the
process that made it):

* one network namespace per node, its loopback up and one interface ``tb<k>`` with the address
  ``<subnet>.<k+1>/24`` (addresses exist only inside namespaces the testbed made: the host's own network is never
  touched);
* two nodes: one veth pair between them (point to point); more: a switch namespace ``...-sw`` holding a Linux
  bridge, each node's veth joined to one of its ports;
* every link shaped with ``tc qdisc ... tbf rate R burst B latency Q`` on each egress (both ends of a point-to-point
  link; a node's uplink and its switch port's downlink). ``latency`` is tbf's bound on queueing, not an added
  delay: netem is not available on every kernel (not on the one this was written on). ``delay_ms`` asks for netem
  and is refused clearly where it is missing;
* each node's processes pinned with ``taskset`` to its CPU set (default: node k on CPU k mod the CPUs this process
  may use);
* gloo's TCP device-loop threads (``gloo_tcp_loop``) of every process in the nodes given ``SCHED_BATCH``
  (``gloo_loop_batch``, default on): on a one-CPU node the loop otherwise preempts the gloo worker that holds
  its lock and spins until the scheduler tick, making many calls milliseconds late, which a real node with a core per
  thread does not do (why: :mod:`nbox_trace.testbed.threads`; the measurements: docs/results.md).

Tear-down always happens: :meth:`Testbed.close` (the ``with`` block's end, also on an error) stops every process
started with :meth:`Testbed.run_on` (its whole process group: SIGTERM, then SIGKILL), then any process left in
the namespaces, then deletes the namespaces (which deletes their links). It is also registered with ``atexit``
and run on SIGINT and SIGTERM (then the previous handler runs). A run killed outright (SIGKILL) leaves its
namespaces behind: :func:`cleanup_stale` removes those whose maker is gone, and every new testbed calls it for its
prefix first.

Needs root (CAP_NET_ADMIN) and ``ip``, ``tc`` and ``taskset``: :func:`unavailable` says why not, in one line, so a
test can skip saying so. Imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from nbox_trace.errors import NboxError, UsageError
from nbox_trace.launch import stop_group
from nbox_trace.testbed.threads import ThreadPolicy, netns_inode

__all__ = ["DEFAULT_PREFIX", "Node", "Testbed", "TestbedError", "cleanup_stale", "unavailable"]

DEFAULT_PREFIX = "nboxtb"
NETNS_DIR = Path("/var/run/netns")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_SUBNET_RE = re.compile(r"^10\.(\d{1,3})\.(\d{1,3})$")
_CMD_TIMEOUT_S = 30.0
_GRACE_S = 5.0


class TestbedError(NboxError):
    """The testbed could not be built or used: the message names the command and what it said."""

    __test__ = False  # not a pytest test class
    exit_code = 1


@dataclass(frozen=True)
class Node:
    """One node: its namespace, its interface and address (no prefix length), and the CPUs it runs on."""

    index: int
    netns: str
    iface: str
    addr: str
    cpus: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """Variables a gloo job on this node needs: the interface gloo binds (``GLOO_SOCKET_IFNAME``)."""
        return {"GLOO_SOCKET_IFNAME": self.iface}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip``/``tc`` (the first arg names it); a failure is a TestbedError naming the command."""
    cmd = list(args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"testbed: `{' '.join(cmd)}` failed: {exc}") from None
    if check and proc.returncode != 0:
        raise TestbedError(f"testbed: `{' '.join(cmd)}` exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[:300]}")
    return proc


_UNAVAILABLE: list[str | None] = []


def unavailable() -> str | None:
    """None when a testbed can be built here, else one line saying why not (not root, a tool missing, namespaces
    refused). Checked once per process by creating and deleting a throwaway namespace."""
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    why: str | None = None
    missing = [t for t in ("ip", "tc", "taskset") if shutil.which(t) is None]
    if missing:
        why = f"the testbed needs {', '.join(missing)} (iproute2, util-linux), not found on PATH"
    elif os.geteuid() != 0:
        why = "the testbed needs root (CAP_NET_ADMIN) to make network namespaces; running as uid " \
              f"{os.geteuid()}"
    else:
        probe = f"{DEFAULT_PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
        proc = _ip("ip", "netns", "add", probe, check=False)
        if proc.returncode != 0:
            why = f"cannot create a network namespace (`ip netns add`): {proc.stderr.strip()[:200]}"
        else:
            _ip("ip", "netns", "del", probe, check=False)
    _UNAVAILABLE.append(why)
    return why


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    proc = _ip("ip", "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _kill_inside(netns: str) -> None:
    """SIGKILL every process still in ``netns`` (``ip netns pids``)."""
    proc = _ip("ip", "netns", "pids", netns, check=False)
    for pid in proc.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete the namespaces (and with them their links) that a testbed with ``prefix`` left behind: those whose
    maker's pid (in the name) is no longer alive. Processes still inside are killed first. Returns the names
    deleted; namespaces of a live testbed, or of another prefix, are left alone."""
    _check_prefix(prefix)
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-[0-9a-f]+-(?:n\d+|sw)$")
    gone = []
    for name in _namespaces():
        m = pattern.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        _kill_inside(name)
        _ip("ip", "netns", "del", name, check=False)
        gone.append(name)
    return gone


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise UsageError(f"testbed prefix {prefix!r}: 1-12 lowercase letters or digits, starting with a letter")


# ------------------------------------------------------------------------------------------- tear-down on signals

_LIVE: set[Testbed] = set()
_LOCK = threading.Lock()
_PREVIOUS: dict[int, Any] = {}


def _close_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for tb in live:
        tb.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _close_all()
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit and close() still apply
    for signum in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(signum)
        if current is not _on_signal:
            _PREVIOUS[signum] = current
            signal.signal(signum, _on_signal)


atexit.register(_close_all)


# ------------------------------------------------------------------------------------------- the testbed


def _parse_cpus(cpus: Sequence[Sequence[int]] | None, nodes: int) -> list[tuple[int, ...]]:
    allowed = sorted(os.sched_getaffinity(0))
    if cpus is None:
        return [(allowed[k % len(allowed)],) for k in range(nodes)]
    if len(cpus) != nodes:
        raise UsageError(f"testbed cpus: {len(cpus)} CPU set(s) for {nodes} node(s)")
    out = []
    for k, cs in enumerate(cpus):
        bad = [c for c in cs if c not in allowed]
        if not cs or bad:
            raise UsageError(f"testbed cpus[{k}] = {list(cs)}: each node needs CPUs this process may use {allowed}")
        out.append(tuple(sorted(set(cs))))
    return out


class Testbed:
    """N nodes as network namespaces with shaped links (see the module docstring).

    Args:
        nodes: how many nodes (>= 2).
        rate: tbf rate of every link, each direction (tc syntax: ``1gbit``, ``100mbit``).
        burst: tbf bucket (tc syntax); default: 1 ms at ``rate``, at least 64 KiB (a GSO segment fits).
        queue_ms: tbf ``latency``: how long a packet may wait in the shaper's queue before it is dropped.
        delay_ms: added one-way delay per link (netem); 0: none. Refused where netem is missing.
        cpus: per node, the CPUs its processes are pinned to (default: node k on CPU k mod the usable CPUs).
        subnet: the first three octets ``10.A.B`` of the nodes' /24 (node k is ``10.A.B.(k+1)``).
        prefix: first part of every namespace name (lowercase, <= 12 characters); :func:`cleanup_stale` uses it.
        gloo_loop_batch: give the nodes' ``gloo_tcp_loop`` threads ``SCHED_BATCH`` while the testbed is up
            (:class:`nbox_trace.testbed.threads.ThreadPolicy`); False keeps the kernel's default policy.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, nodes: int = 2, *, rate: str = "1gbit", burst: str | None = None, queue_ms: float = 50.0,
                 delay_ms: float = 0.0, cpus: Sequence[Sequence[int]] | None = None, subnet: str = "10.77.0",
                 prefix: str = DEFAULT_PREFIX, gloo_loop_batch: bool = True) -> None:
        _check_prefix(prefix)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2 or nodes > 250:
            raise UsageError(f"testbed nodes: an integer in 2..250, got {nodes!r}")
        bits = _rate_bits(rate)
        if not (queue_ms > 0 and delay_ms >= 0):
            raise UsageError(f"testbed queue_ms {queue_ms!r} must be > 0 and delay_ms {delay_ms!r} >= 0")
        m = _SUBNET_RE.match(subnet)
        if m is None or not all(int(g) < 256 for g in m.groups()):
            raise UsageError(f"testbed subnet {subnet!r}: expected 10.A.B (the nodes' /24)")
        self.rate, self.rate_bits = rate, bits
        self.burst = burst or f"{max(64 * 1024, bits // 8 // 1000)}b"
        self.queue_ms, self.delay_ms = queue_ms, delay_ms
        self.prefix = prefix
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.nodes = [Node(k, f"{self.tag}-n{k}", f"tb{k}", f"{subnet}.{k + 1}", c)
                      for k, c in enumerate(_parse_cpus(cpus, nodes))]
        self.switch = f"{self.tag}-sw" if nodes > 2 else None
        self.gloo_loop_batch = bool(gloo_loop_batch)
        self._policy: ThreadPolicy | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []
        self._closed = False
        self._built = False

    # ----------------------------------------------------------------------------------- building

    def __enter__(self) -> Testbed:
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> Testbed:
        """Make the namespaces, links, addresses and shapers; on any failure, tear down and raise TestbedError."""
        if self._built:
            return self
        why = unavailable()
        if why is not None:
            raise TestbedError(f"testbed unavailable: {why}")
        cleanup_stale(self.prefix)
        with _LOCK:
            _LIVE.add(self)
        _install_handlers()
        self._built = True
        try:
            self._build()
            if self.gloo_loop_batch:
                self._policy = ThreadPolicy(netns_inode(NETNS_DIR / node.netns) for node in self.nodes).start()
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _ip("ip", "netns", "add", name)
        self._made.append(name)
        _ip("ip", "-n", name, "link", "set", "lo", "up")

    def _shape(self, netns: str, dev: str) -> None:
        tbf = ["tbf", "rate", self.rate, "burst", self.burst, "latency", f"{self.queue_ms:g}ms"]
        if self.delay_ms <= 0:
            _ip("tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)
            return
        proc = _ip("tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                   f"{self.delay_ms:g}ms", check=False)
        if proc.returncode != 0:
            raise TestbedError(f"testbed: delay_ms={self.delay_ms:g} needs netem, which this kernel refuses "
                               f"({proc.stderr.strip()[:160]}); tbf shapes the rate only")
        _ip("tc", "-n", netns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)

    def _build(self) -> None:
        for node in self.nodes:
            self._add_ns(node.netns)
        if self.switch is None:
            a, b = self.nodes
            _ip("ip", "link", "add", a.iface, "netns", a.netns, "type", "veth", "peer", "name", b.iface,
                "netns", b.netns)
        else:
            self._add_ns(self.switch)
            _ip("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("ip", "-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes:
                port = f"p{node.index}"
                _ip("ip", "link", "add", node.iface, "netns", node.netns, "type", "veth", "peer", "name", port,
                    "netns", self.switch)
                _ip("ip", "-n", self.switch, "link", "set", port, "master", "br0")
                _ip("ip", "-n", self.switch, "link", "set", port, "up")
                self._shape(self.switch, port)
        for node in self.nodes:
            _ip("ip", "-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", node.iface)
            _ip("ip", "-n", node.netns, "link", "set", node.iface, "up")
            self._shape(node.netns, node.iface)

    # ----------------------------------------------------------------------------------- running

    def node(self, k: int) -> Node:
        if not 0 <= k < len(self.nodes):
            raise UsageError(f"testbed node {k}: this testbed has nodes 0..{len(self.nodes) - 1}")
        return self.nodes[k]

    def wrap(self, k: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as it runs on node ``k``: inside its namespace, pinned to its CPUs."""
        node = self.node(k)
        return ["ip", "netns", "exec", node.netns, "taskset", "-c", ",".join(map(str, node.cpus)), *cmd]

    def run_on(self, k: int, cmd: Sequence[str], env: Mapping[str, str] | None = None, *,
               cwd: str | os.PathLike[str] | None = None, stdout: Any = None,
               stderr: Any = None) -> subprocess.Popen[Any]:
        """Start ``cmd`` on node ``k`` (its namespace, its CPUs), in a new session, with this process's environment
        plus ``env``. The testbed stops it (its whole process group) when it is torn down."""
        if not self._built or self._closed:
            raise TestbedError("testbed: run_on needs a built testbed that is not torn down (use `with Testbed()`)")
        full = {**os.environ, **(env or {})}
        proc = subprocess.Popen(self.wrap(k, cmd), env=full, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, start_new_session=True)
        self._procs.append(proc)
        return proc

    def run(self, k: int, cmd: Sequence[str], env: Mapping[str, str] | None = None, *,
            timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on node ``k`` to its end (stdout and stderr captured as text); past ``timeout_s`` it is
        stopped and a TestbedError says so."""
        proc = self.run_on(k, cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TestbedError(f"testbed: `{' '.join(cmd)}` on node {k} did not finish within {timeout_s:g} s") \
                from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(errors="replace"),
                                           err.decode(errors="replace"))

    def wait_all(self, procs: Sequence[subprocess.Popen[Any]], timeout_s: float,
                 on_timeout: Callable[[], None] | None = None) -> list[int]:
        """Wait for every process in ``procs`` (one deadline for all); past it, stop them all and raise
        TestbedError naming the nodes' processes still running. Returns their exit codes."""
        import time

        deadline = time.monotonic() + timeout_s
        codes = []
        for i, p in enumerate(procs):
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if on_timeout is not None:
                    on_timeout()
                running = [j for j, q in enumerate(procs) if q.poll() is None]
                for q in procs:
                    _stop(q)
                raise TestbedError(f"testbed: process(es) {running} still running after {timeout_s:g} s "
                                   f"(first waited on: #{i}); all were stopped") from None
        return codes

    # ----------------------------------------------------------------------------------- tear-down

    def close(self) -> None:
        """Stop every process started here, then anything left in the namespaces, then delete the namespaces.
        Idempotent; safe from a signal handler or atexit."""
        if self._closed:
            return
        self._closed = True
        with _LOCK:
            _LIVE.discard(self)
        if self._policy is not None:
            self._policy.stop()
        for proc in self._procs:
            _stop(proc)
        for name in reversed(self._made):
            _kill_inside(name)
            _ip("ip", "netns", "del", name, check=False)
        self._made.clear()

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this testbed made and has not deleted yet."""
        return list(self._made)


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM ``proc``'s process group, wait up to a grace period, then SIGKILL it (its children may outlive it)."""
    stop_group([proc], _GRACE_S)


_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def _rate_bits(rate: str) -> int:
    """Bits per second of a tc rate (``1gbit``, ``250mbit``)."""
    m = _RATE_RE.match(rate.strip().lower()) if isinstance(rate, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise UsageError(f"testbed rate {rate!r}: expected a tc rate such as 1gbit or 250mbit")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])
