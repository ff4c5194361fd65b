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
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ThreadTimes", "thread_times_ns"]

_SCHEDSTAT = "/proc/thread-self/schedstat"


class ThreadTimes(NamedTuple):
    """Cumulative nanoseconds of the calling thread: on a CPU, and runnable but waiting for one."""

    on_cpu_ns: int
    run_queue_ns: int


def thread_times_ns() -> ThreadTimes | None:
    """The calling thread's :class:`ThreadTimes`, or ``None`` where the kernel does not expose them."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            fields = f.read(256).split()
        return ThreadTimes(int(fields[0]), int(fields[1]))
    except (OSError, ValueError, IndexError):
        return None
