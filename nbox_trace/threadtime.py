"""Where a thread's wall time went: on a CPU, waiting for one, or blocked.

Per thread, Linux keeps the time it ran on a CPU and the time it waited in a run queue while runnable
(``/proc/thread-self/schedstat``, nanoseconds; the kernel's Documentation/scheduler/sched-stats.rst). Over a wall
interval ``wall`` the rest, ``wall - on_cpu - run_queue``, is time the thread was blocked (asleep, on a lock, a
future or I/O). :func:`thread_times_ns` reads the time on a CPU from ``CLOCK_THREAD_CPUTIME_ID``
(``time.thread_time_ns``), which is current, not from schedstat's first field, which the kernel updates only at a
tick or a context switch; the run-queue field is exact when the thread reads its own.

``nbox emulate`` samples the training thread at every iteration boundary. In an emulated run on a CPU that thread
blocks while it waits for a collective, so per iteration: ``compute = on_cpu``, ``exposed communication =
blocked``, ``CPU contention = run_queue`` (``Work.wait()`` spins the last ~200 us before a deadline, counted as
compute).

Under a cgroup CPU quota (a container's limit, a node of the quota testbed) the run-queue time while the group is
throttled is the node's own speed, not contention: :func:`cpu_share` reads the quota (v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, v2 ``cpu.max``; the smallest over the process's group and its ancestors) as a fraction of
one CPU. Why the CPU time is not read from schedstat: docs/design/thread-time.md.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

__all__ = ["ThreadTimes", "ThreadTimesReader", "cpu_share", "thread_times_ns"]

_SCHEDSTAT = "/proc/thread-self/schedstat"
_CGROUP_FS = "/sys/fs/cgroup"


class ThreadTimes(NamedTuple):
    """Cumulative nanoseconds of the calling thread: on a CPU, and runnable but waiting for one."""

    on_cpu_ns: int
    run_queue_ns: int


def thread_times_ns() -> ThreadTimes | None:
    """The calling thread's :class:`ThreadTimes` (its CPU time from ``time.thread_time_ns``, its run-queue time
    from schedstat: module docstring), or ``None`` where the kernel does not expose the run-queue time."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            fields = f.read(256).split()
        run_queue_ns = int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    return ThreadTimes(time.thread_time_ns(), run_queue_ns)


class ThreadTimesReader:
    """:func:`thread_times_ns` for one thread, read often: the schedstat file stays open (``pread``, no open and
    close per read), so a read costs a system call. Opened on the thread it reads; :meth:`read` returns None on any
    other thread (the CPU clock is the calling thread's) or where the kernel does not expose the run-queue time."""

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        try:
            self._fd: int | None = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def read(self) -> ThreadTimes | None:
        if self._fd is None or threading.get_ident() != self.ident:
            return None
        try:
            run_queue_ns = int(os.pread(self._fd, 256, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return ThreadTimes(time.thread_time_ns(), run_queue_ns)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _quota_v1(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota = int(f.read().strip())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v2(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.max")) as f:
            quota, _, period = f.read().strip().partition(" ")
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def cpu_share(cgroup_file: str = "/proc/self/cgroup", root: str = _CGROUP_FS) -> float | None:
    """The calling process's CPU quota as a fraction of one CPU (0.25: a quarter of a core; 2.0: two cores), the
    smallest over its cgroup and the cgroup's ancestors; None without a quota (or where it cannot be read)."""
    try:
        with open(cgroup_file) as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return None
    shares: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2 unified hierarchy
            base, read = root, _quota_v2
        elif "cpu" in controllers.split(","):
            base, read = os.path.join(root, controllers), _quota_v1
            if not os.path.isdir(base):
                base = os.path.join(root, "cpu")
        else:
            continue
        rel = path.strip("/")
        while True:
            share = read(os.path.join(base, rel) if rel else base)
            if share is not None:
                shares.append(share)
            if not rel:
                break
            rel = os.path.dirname(rel)
    return min(shares) if shares else None
