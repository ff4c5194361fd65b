"""A cluster on one machine, for tests and benches: N "nodes" as Linux network namespaces joined by shaped links.

Not a user command: tests (``@pytest.mark.testbed``) and ``bench/`` scripts build one with::

    with Testbed(nodes=2, rate="1gbit") as tb:
        a = tb.run_on(0, ["python", "-c", "..."])          # runs inside node 0's namespace, on node 0's CPUs
        b = tb.run_on(1, [...], env={"X": "1"})
        tb.wait_all([a, b], timeout_s=60)

What it builds (names ``<prefix>-<pid>-<random>-n<k>``: two testbeds never collide, a stale one names its maker):

* per node a network namespace with its loopback and one interface ``tb<k>``, address ``<subnet>.<k+1>/24`` (the
  host's own network is never touched); two nodes: one veth pair; more: a switch namespace ``...-sw`` with a bridge;
  ``racks=2``: two switches, nodes ``0 .. N/2-1`` on the first, joined by one uplink shaped at ``uplink_rate``;
* every egress shaped with ``tc qdisc ... tbf rate R burst B latency Q`` (``latency`` bounds queueing, it adds no
  delay; ``delay_ms`` needs netem and is refused clearly without it); :meth:`Testbed.set_rate` changes rates between
  runs;
* each node's processes pinned with ``taskset`` to its CPU set (default: node k on CPU k mod the usable CPUs);
  ``cpu_share``: a cgroup CPU quota per node, a fraction of one CPU (:mod:`nbox_trace.testbed.cpu`;
  :meth:`Testbed.set_share` makes a straggler); ``gloo_loop_batch`` (default on): gloo's ``gloo_tcp_loop`` threads get
  ``SCHED_BATCH`` (:mod:`nbox_trace.testbed.threads`).

Tear-down always happens: :meth:`Testbed.close` (the ``with`` block's end, also on an error, ``atexit``, SIGINT and
SIGTERM) stops every process started with :meth:`Testbed.run_on` (its process group: SIGTERM, then SIGKILL), then any
left in the namespaces, then deletes the namespaces and their links. After a SIGKILL, :func:`cleanup_stale` removes
the namespaces whose maker is gone; every new testbed calls it first. Needs root (CAP_NET_ADMIN) and ``ip``, ``tc``
and ``taskset``: :func:`unavailable` says why not, in one line. Imports no torch. Why: docs/design/testbed.md.
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
from nbox_trace.testbed.cpu import DEFAULT_PERIOD_US, CpuQuota, check_share, cleanup_stale_groups
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
    rack: int = 0

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
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-[0-9a-f]+-(?:n\d+|sw\d?)$")
    gone = []
    for name in _namespaces():
        m = pattern.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        _kill_inside(name)
        _ip("ip", "netns", "del", name, check=False)
        gone.append(name)
    return gone + cleanup_stale_groups(prefix, _alive)


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
        burst: tbf bucket (tc syntax); default: 1 ms at ``rate``, at least 96 KiB (a whole GSO packet fits: a smaller
            bucket makes tbf split it into MTU frames, a CPU cost the receiving node would not pay behind a NIC).
        queue_ms: tbf ``latency``: how long a packet may wait in the shaper's queue before it is dropped.
        uplink_queue_ms: the same bound on the racks' uplink (default: ``queue_ms``): a switch's buffer, where a
            queue builds when the uplink is slower than the links feeding it.
        delay_ms: added one-way delay per link (netem); 0: none. Refused where netem is missing.
        cpus: per node, the CPUs its processes are pinned to (default: node k on CPU k mod the usable CPUs).
        subnet: the first three octets ``10.A.B`` of the nodes' /24 (node k is ``10.A.B.(k+1)``).
        prefix: first part of every namespace name (lowercase, <= 12 characters); :func:`cleanup_stale` uses it.
        gloo_loop_batch: give the nodes' ``gloo_tcp_loop`` threads ``SCHED_BATCH`` while the testbed is up
            (:class:`nbox_trace.testbed.threads.ThreadPolicy`); False keeps the kernel's default policy.
        cpu_share: each node's fraction of one CPU (one figure, or one per node), enforced by a cgroup quota
            (:mod:`nbox_trace.testbed.cpu`); None: no quota (the nodes share their CPUs as the scheduler likes).
        cpu_period_us: the quota's scheduling period (us).
        racks: 1 (every node behind one switch, or two nodes point to point) or 2 (two switches joined by an
            uplink; the nodes split in two equal halves).
        uplink_rate: the racks' uplink's tbf rate, each direction (default: ``rate``); only with ``racks=2``.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, nodes: int = 2, *, rate: str = "1gbit", burst: str | None = None, queue_ms: float = 50.0,
                 delay_ms: float = 0.0, cpus: Sequence[Sequence[int]] | None = None, subnet: str = "10.77.0",
                 prefix: str = DEFAULT_PREFIX, gloo_loop_batch: bool = True,
                 cpu_share: float | Sequence[float] | None = None, cpu_period_us: int = DEFAULT_PERIOD_US,
                 racks: int = 1, uplink_rate: str | None = None, uplink_queue_ms: float | None = None) -> None:
        _check_prefix(prefix)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2 or nodes > 250:
            raise UsageError(f"testbed nodes: an integer in 2..250, got {nodes!r}")
        bits = _rate_bits(rate)
        if racks not in (1, 2) or isinstance(racks, bool):
            raise UsageError(f"testbed racks {racks!r}: 1 (one switch) or 2 (two switches joined by an uplink)")
        if racks == 2 and nodes % 2:
            raise UsageError(f"testbed racks=2 with {nodes} nodes: the racks hold equal halves (an even node count)")
        if uplink_rate is not None and racks == 1:
            raise UsageError(f"testbed uplink_rate {uplink_rate!r}: an uplink joins two racks (racks=2)")
        self.racks = racks
        self.uplink_rate = uplink_rate or rate
        self.uplink_bits = _rate_bits(self.uplink_rate)
        if not (queue_ms > 0 and delay_ms >= 0):
            raise UsageError(f"testbed queue_ms {queue_ms!r} must be > 0 and delay_ms {delay_ms!r} >= 0")
        m = _SUBNET_RE.match(subnet)
        if m is None or not all(int(g) < 256 for g in m.groups()):
            raise UsageError(f"testbed subnet {subnet!r}: expected 10.A.B (the nodes' /24)")
        self.rate, self.rate_bits = rate, bits
        self._burst_given = burst
        self.burst = burst or _burst(bits)
        self.queue_ms, self.delay_ms = queue_ms, delay_ms
        if uplink_queue_ms is not None and not uplink_queue_ms > 0:
            raise UsageError(f"testbed uplink_queue_ms {uplink_queue_ms!r} must be > 0")
        self.uplink_queue_ms = queue_ms if uplink_queue_ms is None else float(uplink_queue_ms)
        self.prefix = prefix
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        per_rack = nodes // racks
        self.nodes = [Node(k, f"{self.tag}-n{k}", f"tb{k}", f"{subnet}.{k + 1}", c, k // per_rack)
                      for k, c in enumerate(_parse_cpus(cpus, nodes))]
        self.switches = [f"{self.tag}-sw{r}" for r in range(racks)] if racks > 1 else (
            [f"{self.tag}-sw"] if nodes > 2 else [])
        self.switch = self.switches[0] if self.switches else None
        self.quota: CpuQuota | None = None
        if cpu_share is not None:
            shares = _parse_shares(cpu_share, nodes)
            _check_cpu_load(self.nodes, shares)
            self.quota = CpuQuota(self.tag, shares, period_us=cpu_period_us, root=_QUOTA_ROOT_FOR_TESTS or None)
        #: every shaped egress: (namespace, device, "node" | "port" | "uplink")
        self._shaped: list[tuple[str, str, str]] = []
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
            if self.quota is not None:
                self.quota.build()
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

    def _tbf(self, role: str) -> list[str]:
        rate, burst = (self.uplink_rate, self._burst_given or _burst(self.uplink_bits)) if role == "uplink" else (
            self.rate, self.burst)
        queue = self.uplink_queue_ms if role == "uplink" else self.queue_ms
        return ["tbf", "rate", rate, "burst", burst, "latency", f"{queue:g}ms"]

    def _shape(self, netns: str, dev: str, role: str = "node") -> None:
        self._shaped.append((netns, dev, role))
        tbf = self._tbf(role)
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
            for sw in self.switches:
                self._add_ns(sw)
                _ip("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
                _ip("ip", "-n", sw, "link", "set", "br0", "up")
            for node in self.nodes:
                sw, port = self.switches[node.rack], f"p{node.index}"
                _ip("ip", "link", "add", node.iface, "netns", node.netns, "type", "veth", "peer", "name", port,
                    "netns", sw)
                _ip("ip", "-n", sw, "link", "set", port, "master", "br0")
                _ip("ip", "-n", sw, "link", "set", port, "up")
                self._shape(sw, port)
            if self.racks == 2:  # the uplink: a veth pair between the two bridges, shaped both ways
                left, right = self.switches
                _ip("ip", "link", "add", "up0", "netns", left, "type", "veth", "peer", "name", "up1", "netns", right)
                for sw, end in ((left, "up0"), (right, "up1")):
                    _ip("ip", "-n", sw, "link", "set", end, "master", "br0")
                    _ip("ip", "-n", sw, "link", "set", end, "up")
                    self._shape(sw, end, "uplink")
        for node in self.nodes:
            _ip("ip", "-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", node.iface)
            _ip("ip", "-n", node.netns, "link", "set", node.iface, "up")
            self._shape(node.netns, node.iface)

    # ----------------------------------------------------------------------------------- changing between runs

    def set_rate(self, rate: str, *, uplink: bool = False) -> None:
        """Change every node link's tbf rate (both directions), or with ``uplink`` the racks' uplink's, without
        rebuilding; the burst follows the rate unless it was given. Runs in progress see the change at once."""
        bits = _rate_bits(rate)
        if uplink and self.racks != 2:
            raise UsageError("testbed set_rate(uplink=True): this testbed has no uplink (racks=1)")
        if not self._built or self._closed:
            raise TestbedError("testbed: set_rate needs a built testbed that is not torn down")
        if uplink:
            self.uplink_rate, self.uplink_bits = rate, bits
        else:
            self.rate, self.rate_bits = rate, bits
            self.burst = self._burst_given or _burst(bits)
        parent = ["parent", "1:1", "handle", "10:"] if self.delay_ms > 0 else ["root", "handle", "1:"]
        for netns, dev, role in self._shaped:
            if (role == "uplink") == uplink:
                _ip("tc", "-n", netns, "qdisc", "change", "dev", dev, *parent, *self._tbf(role))

    def set_share(self, k: int, share: float) -> None:
        """Give node ``k`` the fraction ``share`` of one CPU from now on (a straggler: half its peers' share); needs a
        testbed built with ``cpu_share``. The nodes pinned to one CPU may still share at most all of it."""
        if self.quota is None:
            raise UsageError("testbed set_share: this testbed has no CPU quota (build it with cpu_share)")
        node = self.node(k)
        shares = list(self.quota.shares)
        shares[node.index] = check_share(f"testbed cpu_share of node {k}", share)
        _check_cpu_load(self.nodes, shares)
        self.quota.set_share(node.index, share)

    def share(self, k: int) -> float | None:
        """Node ``k``'s CPU share (None without a quota)."""
        return None if self.quota is None else self.quota.shares[self.node(k).index]

    # ----------------------------------------------------------------------------------- running

    def node(self, k: int) -> Node:
        if not 0 <= k < len(self.nodes):
            raise UsageError(f"testbed node {k}: this testbed has nodes 0..{len(self.nodes) - 1}")
        return self.nodes[k]

    def wrap(self, k: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as it runs on node ``k``: inside its namespace, pinned to its CPUs."""
        node = self.node(k)
        pin = ["taskset", "-c", ",".join(map(str, node.cpus))]
        if self.quota is None:
            return ["ip", "netns", "exec", node.netns, *pin, *cmd]
        # in the node's group; the group's controller mounted again inside (ip netns exec remounts /sys)
        mount = self.quota.mount_script()
        inner = ["sh", "-c", f'{mount}; exec "$@"', "sh"] if mount else []
        return [*self.quota.join(k), "ip", "netns", "exec", node.netns, *inner, *pin, *cmd]

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
        if self.quota is not None:
            import time

            deadline = time.monotonic() + _GRACE_S
            while True:  # a process outside the namespaces that joined a node's group; the dying leave it slowly
                left = [pid for k in range(len(self.nodes)) for pid in self.quota.members(k)]
                if not left or time.monotonic() > deadline:
                    break
                for pid in left:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
            self.quota.close()

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this testbed made and has not deleted yet."""
        return list(self._made)


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM ``proc``'s process group, wait up to a grace period, then SIGKILL it (its children may outlive it)."""
    stop_group([proc], _GRACE_S)


#: Tests only: a fake cgroup root (nbox_trace.testbed.cpu.Root) the quota writes to instead of the machine's.
_QUOTA_ROOT_FOR_TESTS: Any = None


#: The smallest default tbf bucket (bytes). tbf splits a GSO packet longer than its bucket into MTU frames, and a
#: 64 KiB TCP GSO packet counts as its payload plus every segment's headers (about 68 KB): a smaller bucket (the floor
#: was 64 KiB) split every packet on links under about 550 Mb/s, and the receiving node paid from its own CPU share
#: for frames a NIC's segmentation offload and GRO never hand a real host one by one (docs/design/testbed.md,
#: "tbf's bucket and GSO"; ``bench/probes/tbf_gso.py`` measures it).
MIN_BURST_BYTES = 96 * 1024


def _burst(bits: int) -> str:
    """The default tbf bucket at ``bits`` per second: 1 ms of it, at least :data:`MIN_BURST_BYTES` (a whole GSO
    packet passes unsplit)."""
    return f"{max(MIN_BURST_BYTES, bits // 8 // 1000)}b"


def _parse_shares(share: float | Sequence[float], nodes: int) -> list[float]:
    if isinstance(share, (list, tuple)):
        if len(share) != nodes:
            raise UsageError(f"testbed cpu_share: {len(share)} share(s) for {nodes} node(s)")
        return [check_share(f"testbed cpu_share[{k}]", s) for k, s in enumerate(share)]
    return [check_share("testbed cpu_share", share)] * nodes


def _check_cpu_load(nodes: Sequence[Node], shares: Sequence[float]) -> None:
    """The nodes pinned to one CPU may share at most all of it (a node on several CPUs counts on each, split
    evenly); past that they would wait for each other, which the quota is there to prevent."""
    load: dict[int, float] = {}
    for node, s in zip(nodes, shares, strict=True):
        for c in node.cpus:
            load[c] = load.get(c, 0.0) + s / len(node.cpus)
    over = {c: x for c, x in load.items() if x > 1.0 + 1e-9}
    if over:
        c, x = min(over.items())
        on = [n.index for n in nodes if c in n.cpus]
        raise UsageError(f"testbed cpu_share: nodes {on} on CPU {c} would need {x:.2f} of it; their shares may sum "
                         f"to at most 1 (give each less, or the nodes more CPUs)")


_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def _rate_bits(rate: str) -> int:
    """Bits per second of a tc rate (``1gbit``, ``250mbit``)."""
    m = _RATE_RE.match(rate.strip().lower()) if isinstance(rate, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise UsageError(f"testbed rate {rate!r}: expected a tc rate such as 1gbit or 250mbit")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])
