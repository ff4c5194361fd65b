"""Give named threads of the processes inside a testbed's network namespaces a scheduling policy.

:class:`ThreadPolicy` is a daemon thread that scans ``/proc`` every ``interval_s`` seconds: each process whose network
namespace is one of the testbed's, each of its threads named in ``names``, gets ``SCHED_BATCH``
(``sched_setscheduler(2)`` on the thread id). The testbed uses it for gloo's TCP device loop (``gloo_tcp_loop``),
which on a one-CPU node otherwise preempts the gloo worker holding its lock and spins until the scheduler tick;
``SCHED_BATCH`` stops its wakeup preemption and keeps its fair share of the CPU.

The threads appear at ``init_process_group``, before any timed iteration. A thread's name is read only while the
thread is young (:data:`_NAME_SETTLES_S`: gloo names its loop thread as it starts); a thread that got the policy, or
kept another name that long, is not read again, so the scan's own CPU cost does not grow with a run's threads.
Another user's threads need root (the testbed runs as root). Imports no torch. How the spin was found and what the
policy changes: docs/design/testbed.md.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from nbox_trace.errors import UsageError

__all__ = ["GLOO_LOOP_THREAD", "ThreadPolicy", "netns_inode"]

#: The name gloo gives its TCP transport's device-loop thread (``gloo::transport::tcp::Loop``).
GLOO_LOOP_THREAD = "gloo_tcp_loop"
_PROC = Path("/proc")
_RECHECK_S = 1.0  # seconds before a process found outside the namespaces is looked at again
#: Seconds a thread's name is read again after it is first seen (a thread names itself just after it starts).
_NAME_SETTLES_S = 1.0


def netns_inode(path: str | os.PathLike[str]) -> int:
    """The inode that identifies a network namespace, from ``/var/run/netns/NAME`` or ``/proc/PID/ns/net``."""
    return os.stat(path).st_ino


class ThreadPolicy:
    """While running, gives every thread named in ``names`` of the processes in the network namespaces
    ``netns_inodes`` the ``SCHED_BATCH`` policy. :meth:`start`, then :meth:`stop`.

    Args:
        netns_inodes: the namespaces' inodes (:func:`netns_inode`).
        names: thread names (``/proc/PID/task/TID/comm``, at most 15 characters).
        interval_s: seconds between two scans (> 0).
    """

    def __init__(self, netns_inodes: Iterable[int], names: Iterable[str] = (GLOO_LOOP_THREAD,),
                 interval_s: float = 0.1) -> None:
        if not interval_s > 0:
            raise UsageError(f"ThreadPolicy interval_s must be > 0, got {interval_s!r}")
        self.netns_inodes = frozenset(netns_inodes)
        self.names = frozenset(names)
        self.interval_s = interval_s
        #: (pid, thread id) of the threads given the policy so far (of processes still running).
        self.applied: set[tuple[int, int]] = set()
        #: (pid, thread id) -> when first seen (monotonic s); None once it is settled (named otherwise for long enough)
        self._seen: dict[tuple[int, int], float | None] = {}
        # pid -> (inside one of the namespaces, when a first "no" was given; None once final)
        self._ours: dict[int, tuple[bool, float | None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadPolicy:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nbox-thread-policy", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval_s)

    def _inside(self, pid: int, now_s: float) -> bool:
        """Whether ``pid`` runs in one of the namespaces. A "no" is asked once more after :data:`_RECHECK_S` (``ip
        netns exec`` forks first and enters the namespace a moment later, under the same pid), then is final: a
        process does not move into a namespace later, and asking every process on the machine again every second
        was most of the scan's cost."""
        known = self._ours.get(pid)
        if known is None or (known[1] is not None and now_s - known[1] > _RECHECK_S):
            try:
                inside = netns_inode(f"/proc/{pid}/ns/net") in self.netns_inodes
            except OSError:  # gone (then forgotten at the next scan), or a kernel thread: not ours
                self._ours[pid] = (False, None)
                return False
            # asked first: ask a "no" again later; asked again (or a "yes"): final (None)
            known = self._ours[pid] = (inside, now_s if known is None and not inside else None)
        return known[0]

    def scan(self) -> int:
        """One pass over ``/proc``; returns how many threads got the policy in it."""
        try:
            pids = {int(p) for p in os.listdir(_PROC) if p.isdigit()}
        except OSError:
            return 0
        gone = self._ours.keys() - pids
        for pid in gone:  # a pid may be reused by a process elsewhere
            del self._ours[pid]
        if gone:
            self.applied = {(pid, tid) for pid, tid in self.applied if pid in pids}
            self._seen = {key: at for key, at in self._seen.items() if key[0] in pids}
        count, now_s = 0, time.monotonic()
        for pid in pids:
            if not self._inside(pid, now_s):
                continue
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                key = (pid, tid)
                first_s = self._seen.setdefault(key, now_s)
                if first_s is None or key in self.applied:
                    continue
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    if comm in self.names:
                        os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                        self.applied.add(key)
                        self._seen[key] = None
                        count += 1
                    elif now_s - first_s > _NAME_SETTLES_S:
                        self._seen[key] = None  # named otherwise for long enough: not read again
        return count
