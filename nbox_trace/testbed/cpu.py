"""A fixed CPU share per testbed node, enforced by a cgroup CPU quota (cgroup v1 ``cpu`` or v2 ``cpu.max``).

Role: many testbed nodes on few cores compute as separate machines would: a node of share ``s`` runs at most ``s`` of
one CPU per scheduling period, whatever the other nodes do.

* :class:`CpuQuota` makes one cgroup per node under the machine's cpu controller, named ``<tag>-n<k>``, and writes its
  quota: v1 ``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``, v2 ``cpu.max`` (``"<quota> <period>"``).
  :meth:`CpuQuota.set_share` changes a node's share between runs; :meth:`CpuQuota.join` is the command prefix that
  puts a process (and its children) in the node's group before it execs; :meth:`CpuQuota.mount_script` the shell that
  makes the controller visible inside the node, so a process there reads its own quota
  (``nbox_trace.threadtime.cpu_share``).
* Shares are fractions of one CPU, in (0, 1]; the quota is ``round(share x period_us)`` microseconds, at least 1000.
* :func:`cgroup_root` finds the controller (v1 ``/sys/fs/cgroup/cpu``, else v2 ``/sys/fs/cgroup`` listing ``cpu``), or
  None with the reason. :meth:`CpuQuota.close` removes the groups; :func:`cleanup_stale_groups` those of a gone maker.

It stands for a CPU node's own cores; on a GPU cluster, for the host CPU a rank's process gets. Imports no torch.
Why, and how close it comes: docs/design/testbed.md.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nbox_trace.errors import NboxError, UsageError

__all__ = ["CpuQuota", "CpuQuotaError", "cgroup_root", "cleanup_stale_groups"]

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
#: The kernel refuses a quota below 1 ms.
MIN_QUOTA_US = 1000
#: Default scheduling period (us): short, so that a throttled node is not stopped for long at a time (a node of
#: share 0.25 runs up to 2.5 ms and waits 7.5 ms), long enough that the quota's own bookkeeping stays small.
DEFAULT_PERIOD_US = 10_000


class CpuQuotaError(NboxError):
    """A cgroup could not be made or written: the message names the file and what the kernel said."""

    exit_code = 1


@dataclass(frozen=True)
class Root:
    """Where the cpu controller is: its directory and its version (1 or 2)."""

    path: Path
    version: int


def cgroup_root(v1: Path = V1_ROOT, v2: Path = V2_ROOT) -> tuple[Root | None, str]:
    """The cpu controller's root and ``""``, or None and one line saying why there is none."""
    if (v1 / "cpu.cfs_quota_us").exists():
        return Root(v1, 1), ""
    controllers = v2 / "cgroup.controllers"
    if controllers.exists():
        try:
            names = controllers.read_text().split()
        except OSError as e:
            return None, f"cannot read {controllers}: {e.strerror}"
        if "cpu" in names:
            return Root(v2, 2), ""
        return None, f"the cgroup v2 hierarchy at {v2} has no cpu controller ({controllers}: {' '.join(names)})"
    return None, f"no cgroup cpu controller: neither {v1}/cpu.cfs_quota_us (v1) nor {controllers} (v2)"


def check_share(where: str, share: object) -> float:
    """``share`` as a float in (0, 1]; a UsageError naming ``where`` otherwise."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < float(share) <= 1:
        raise UsageError(f"{where} {share!r}: a fraction of one CPU in (0, 1], e.g. 0.25")
    return float(share)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise CpuQuotaError(f"testbed cpu quota: cannot write {text.strip()!r} to {path}: {e.strerror}") from None


class CpuQuota:
    """One cgroup per node, each with its CPU share (module docstring).

    Args:
        tag: the testbed's tag (``<prefix>-<pid>-<random>``); group k is ``<tag>-n<k>``.
        shares: per node, its fraction of one CPU.
        period_us: the scheduling period (1000 .. 1000000 us).
        root: the controller (default: :func:`cgroup_root`'s).
    """

    def __init__(self, tag: str, shares: Sequence[float], *, period_us: int = DEFAULT_PERIOD_US,
                 root: Root | None = None) -> None:
        if isinstance(period_us, bool) or not isinstance(period_us, int) or not 1000 <= period_us <= 1_000_000:
            raise UsageError(f"testbed cpu period_us {period_us!r}: an integer in 1000..1000000")
        self.shares = [check_share(f"testbed cpu_share of node {k}", s) for k, s in enumerate(shares)]
        if root is None:
            root, why = cgroup_root()
            if root is None:
                raise CpuQuotaError(f"testbed cpu quota: {why}")
        self.root, self.period_us, self.tag = root, period_us, tag
        self.groups = [root.path / f"{tag}-n{k}" for k in range(len(self.shares))]
        self._made: list[Path] = []

    def build(self) -> CpuQuota:
        """Make the groups and write their quotas."""
        if self.root.version == 2:
            self._enable_v2()
        for k, group in enumerate(self.groups):
            try:
                group.mkdir()
            except OSError as e:
                raise CpuQuotaError(f"testbed cpu quota: cannot make {group}: {e.strerror}") from None
            self._made.append(group)
            self.set_share(k, self.shares[k])
        return self

    def _enable_v2(self) -> None:
        """v2: the cpu controller must be enabled for the root's children (``+cpu`` in its subtree_control)."""
        control = self.root.path / "cgroup.subtree_control"
        with contextlib.suppress(OSError):
            if "cpu" in control.read_text().split():
                return
        _write(control, "+cpu")

    def quota_us(self, share: float) -> int:
        """The quota (us per period) of ``share``."""
        return max(MIN_QUOTA_US, round(share * self.period_us))

    def set_share(self, k: int, share: float) -> None:
        """Give node ``k`` the fraction ``share`` of one CPU from now on (its running processes included)."""
        if not 0 <= k < len(self.groups):
            raise UsageError(f"testbed node {k}: this testbed has nodes 0..{len(self.groups) - 1}")
        share = check_share(f"testbed cpu_share of node {k}", share)
        group, quota = self.groups[k], self.quota_us(share)
        if self.root.version == 1:
            # the period first would be refused where the old quota exceeds it; the quota first where the new one
            # exceeds the old period: -1 (no limit) in between is accepted whatever the two are
            _write(group / "cpu.cfs_quota_us", "-1")
            _write(group / "cpu.cfs_period_us", str(self.period_us))
            _write(group / "cpu.cfs_quota_us", str(quota))
        else:
            _write(group / "cpu.max", f"{quota} {self.period_us}")
        self.shares[k] = share

    def join(self, k: int) -> list[str]:
        """The prefix of a command that runs in node ``k``'s group: a shell that moves itself into the group and
        execs the rest (its children stay in the group)."""
        procs = self.groups[k] / "cgroup.procs"
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]

    def mount_script(self, mountinfo: str = "/proc/self/mountinfo") -> str:
        """Shell commands that mount the cpu controller where it is on this machine, inside a private mount namespace
        whose ``/sys`` was remounted (``ip netns exec``): a tmpfs on ``/sys/fs/cgroup`` and the hierarchy on
        ``root``, with this machine's mount options; ``""`` where the controller is not under ``/sys/fs/cgroup``.
        Failures are silent (the quota still holds; only a process's view of it is lost)."""
        path = str(self.root.path)
        if not path.startswith("/sys/fs/cgroup"):
            return ""
        if self.root.version == 2:
            return "mount -t cgroup2 nboxcg /sys/fs/cgroup 2>/dev/null"
        options = "cpu"
        try:
            with open(mountinfo) as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 4 and fields[4] == path and " - cgroup " in line:
                        supers = line.split(" - ", 1)[1].split()[-1].split(",")
                        options = ",".join(o for o in supers if o not in ("rw", "ro")) or "cpu"
        except OSError:
            pass
        return (f"{{ mount -t tmpfs nboxcg /sys/fs/cgroup && mkdir -p {path} && "
                f"mount -t cgroup -o {options} nboxcg {path}; }} 2>/dev/null")

    def members(self, k: int) -> list[int]:
        """The process ids in node ``k``'s group now."""
        try:
            return [int(p) for p in (self.groups[k] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def throttled(self, k: int) -> tuple[int, int, float] | None:
        """Node ``k``'s quota so far, from its ``cpu.stat``: (periods, periods throttled, time throttled in us); None
        where the file cannot be read."""
        try:
            stat = dict(line.split(" ", 1) for line in (self.groups[k] / "cpu.stat").read_text().splitlines()
                        if " " in line)
            if self.root.version == 1:
                return int(stat["nr_periods"]), int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e3
            return int(stat["nr_periods"]), int(stat["nr_throttled"]), float(stat["throttled_usec"])
        except (OSError, KeyError, ValueError):
            return None

    def close(self) -> None:
        """Remove the groups (their processes must be gone; a group still holding one is left, and
        :func:`cleanup_stale_groups` removes it later). Idempotent."""
        for group in reversed(self._made):
            with contextlib.suppress(OSError):
                group.rmdir()
        self._made.clear()


def cleanup_stale_groups(prefix: str, alive: object) -> list[str]:
    """Remove the groups a testbed with ``prefix`` left behind whose maker (the pid in the name) is gone; ``alive``
    is a callable ``pid -> bool``. Returns the names removed."""
    root, _ = cgroup_root()
    if root is None or not callable(alive):
        return []
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-[0-9a-f]+-n\d+$")
    gone = []
    try:
        entries = list(root.path.iterdir())
    except OSError:
        return []
    for group in entries:
        m = pattern.match(group.name)
        if m is None or alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError, ValueError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), 9)
        with contextlib.suppress(OSError):
            group.rmdir()
            gone.append(group.name)
    return gone
