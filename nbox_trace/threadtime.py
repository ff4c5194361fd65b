"""Where a thread's wall time went: on a CPU, waiting for one, or blocked.

Linux keeps, per thread, the time it ran on a CPU and the time it waited in a run queue while runnable
(``/proc/thread-self/schedstat``: "time spent on the cpu", "time spent waiting on a runqueue", in
nanoseconds; see the kernel's Documentation/scheduler/sched-stats.rst). Over an interval of wall time
``wall``, the rest, ``wall - on_cpu - run_queue``, is time the thread was *blocked*: asleep by its own
choice, waiting for a lock, a condition, a future or I/O.

``nbox emulate`` samples the training thread at every iteration boundary. In an emulated run on a CPU,
that thread blocks while it waits for a collective (the ``nbox`` backend sleeps until the modeled end,
or the autograd engine waits on the collective's future), so per iteration:
``compute = on_cpu``, ``exposed communication = blocked``, ``CPU contention = run_queue``.
One bias: ``Work.wait()`` spins the last ~200 us before a deadline on the CPU, which counts as compute.

The time on a CPU is read from ``CLOCK_THREAD_CPUTIME_ID`` (``time.thread_time_ns``), not from schedstat's
first field: the kernel brings that field up to date only at a scheduler tick or a context switch, so a thread
that reads its own while running sees a figure up to one tick old (measured here, kernel 6.18, 250 Hz: a 0.5 ms
spin read as 3.5 ms, a 1.5 ms one as 0.13 ms, a 20 ms one as 16.3 ms; ``thread_time_ns`` read 0.58 / 1.60 /
20.17 ms). The run-queue field is exact when read by the thread itself: the kernel adds a wait to it when the
thread gets its CPU back, and a thread reading it is running.

A process confined by a cgroup CPU quota (a container's CPU limit, a node of the quota testbed) waits in the run
queue while its group is throttled: there the run-queue time is the node's own speed, not contention.
:func:`cpu_share` reads the quota (cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, v2 ``cpu.max``, the
smallest over the process's group and its ancestors) as a fraction of one CPU.
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
