"""Completing work at a modeled time: sleep then spin, work objects, and the timer for futures.

A collective answered by the emulator completes at a deadline on ``time.perf_counter_ns()`` (CLOCK_MONOTONIC
on Linux: one clock for every process on a host, which is what lets real ranks compare arrival times).

* :func:`sleep_until` is the precise path: the thread that waits sleeps (GIL released) until
  ``spin_ns`` before the deadline, then spins on the clock. Precision is the clock read, a few hundred ns,
  unless the OS preempts the spinner; ``bench/emulator.py`` measures it.
* :class:`FutureTimer` completes ``torch.futures.Future`` objects (what DDP's reducer and ``then()``
  callbacks wait on) from one background thread that sleeps until :data:`TIMER_SPIN_NS` before the
  earliest deadline and spins the rest (a short spin: that thread holds the GIL while it spins). The
  waiter then wakes through torch's condition variable, which adds the OS's wake-up latency.
* :class:`NboxWork` is the ``Work`` the script gets: ``wait()`` waits for the real communication, then
  sleeps-and-spins to the deadline; ``get_future()`` gives a future the timer completes at the deadline.
  A work given the process's :class:`emulator_core.backend.clocksync.Clock` holds its deadline on the reference
  timeline and turns it into ``perf_counter_ns`` when it is waited for, so a rank credited time after the call
  was answered (a live replay's ``replay.host_work=match``) waits that much longer in host time; a future's deadline
  is turned when the future is made.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from emulator_core.backend.clocksync import Clock
from emulator_core.backend.emulation_config import DEFAULT_SPIN_NS

__all__ = ["DEFAULT_SPIN_NS", "FutureTimer", "NboxWork", "sleep_until"]

#: Spin the last 200 us before a deadline (above Linux's default 50 us timer slack plus wake-up latency).
#: The future timer spins only the last 100 us (it holds the GIL while it spins; whoever waits on the
#: future has released it, but other Python threads of the script have not).
TIMER_SPIN_NS = 100_000


def not_completed(limit_s: float) -> str:
    """The one wording of a call whose real part did not finish in time (a work's own wait, or the real
    communication's timeout, whichever fires first)."""
    return (f"did not complete within {limit_s:.1f} s: a real member did not join it (a deadlock among the real "
            f"ranks, or a rank stuck or gone), or the real communication hung")


def sleep_until(deadline_ns: int, spin_ns: int = DEFAULT_SPIN_NS) -> None:
    """Return at ``deadline_ns`` (``time.perf_counter_ns()``): sleep until ``spin_ns`` before it, then spin."""
    clock = time.perf_counter_ns
    remaining = deadline_ns - clock()
    if remaining > spin_ns:
        time.sleep((remaining - spin_ns) / 1e9)
    while clock() < deadline_ns:
        pass


class FutureTimer:
    """One daemon thread that completes futures at their deadlines (earliest first, then issue order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Future[Any], Any]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def complete_at(self, deadline_ns: int, future: Future[Any], value: Any) -> None:
        """Set ``future``'s result to ``value`` at ``deadline_ns`` (at once when it is past)."""
        if time.perf_counter_ns() >= deadline_ns:
            future.set_result(value)
            return
        with self._cv:
            heapq.heappush(self._heap, (deadline_ns, next(self._seq), future, value))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nbox-future-timer", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        clock = time.perf_counter_ns
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                deadline = self._heap[0][0]
                remaining = deadline - clock()
                if remaining > TIMER_SPIN_NS:
                    self._cv.wait((remaining - TIMER_SPIN_NS) / 1e9)  # woken early by an earlier deadline
                    continue
            while clock() < deadline:  # the last TIMER_SPIN_NS, outside the lock
                pass
            with self._cv:
                _, _, fut, value = heapq.heappop(self._heap)
            fut.set_result(value)


TIMER = FutureTimer()


class NboxWork(Work):
    """A collective's work object: done when the real communication is and the modeled deadline passed.

    ``deadline_ns`` is known at issue time when this process is the group's only real member (then the work
    carries no lock or event: the cheap path); otherwise the group's resolver thread sets it
    (:meth:`resolve`) once the real members' arrival times are in. It is on ``clock``'s reference timeline
    (``perf_counter_ns`` when ``clock`` is None), turned into host time when waited for (module docstring).
    ``call`` is a zero-argument function that names the call for error messages (formatted only when one is
    raised).
    """

    def __init__(self, call: Callable[[], str], result: list[torch.Tensor], timeout_s: float, spin_ns: int,
                 deadline_ns: int | None = None, clock: Clock | None = None) -> None:
        super().__init__()
        self._call = call
        self._result = result
        self._timeout_s = timeout_s
        self._spin_ns = spin_ns
        self._clock = clock
        self.deadline_ns = deadline_ns
        self._error: BaseException | None = None
        self._future: Future[Any] | None = None
        self._resolved: threading.Event | None = None
        self._lock: threading.Lock | None = None
        if deadline_ns is None:
            self._resolved = threading.Event()
            self._lock = threading.Lock()

    def _host_ns(self, deadline_ns: int) -> int:
        """A deadline as ``perf_counter_ns`` now (the clock's lag may have grown since it was answered)."""
        return deadline_ns if self._clock is None else self._clock.to_perf_ns(deadline_ns)

    @property
    def call(self) -> str:
        """What was called, by whom, on which group."""
        return self._call()

    # -- resolution (resolver thread) --------------------------------------------------------------------
    def resolve(self, deadline_ns: int) -> None:
        assert self._lock is not None and self._resolved is not None, "resolve() on a work resolved at issue"
        with self._lock:
            self.deadline_ns = deadline_ns
            self._resolved.set()
            fut = self._future
        if fut is not None:
            TIMER.complete_at(self._host_ns(deadline_ns), fut, self._result)

    def fail(self, error: BaseException) -> None:
        assert self._lock is not None and self._resolved is not None, "fail() on a work resolved at issue"
        with self._lock:
            self._error = error
            self._resolved.set()
            fut = self._future
        if fut is not None:
            fut.set_exception(error)

    # -- the Work API --------------------------------------------------------------------------------------
    def _await_resolution(self, timeout: timedelta | None) -> int:
        if self._resolved is not None:
            limit = timeout.total_seconds() if timeout else self._timeout_s
            if not self._resolved.wait(limit):
                raise RuntimeError(f"nbox: {self.call} {not_completed(limit)}")
            if self._error is not None:
                raise RuntimeError(f"nbox: {self.call} failed: {self._error}") from self._error
        assert self.deadline_ns is not None
        return self.deadline_ns

    def wait(self, timeout: timedelta | None = None) -> bool:
        sleep_until(self._host_ns(self._await_resolution(timeout)), self._spin_ns)
        return True

    def is_completed(self) -> bool:
        deadline = self.deadline_ns
        return self._error is None and deadline is not None and time.perf_counter_ns() >= self._host_ns(deadline)

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def get_future(self) -> Future[Any]:
        if self._lock is None:  # resolved at issue: no other thread touches this work
            if self._future is None:
                self._future = Future()
                assert self.deadline_ns is not None
                TIMER.complete_at(self._host_ns(self.deadline_ns), self._future, self._result)
            return self._future
        with self._lock:
            if self._future is None:
                self._future = Future()
                if self._error is not None:
                    self._future.set_exception(self._error)
                elif self.deadline_ns is not None:
                    TIMER.complete_at(self._host_ns(self.deadline_ns), self._future, self._result)
            return self._future

    def synchronize(self) -> None:
        self.wait()


def run_finish(finish: Callable[[], None] | None) -> None:
    """Run a mirror rule's copy-out, outside autograd (also on the resolver thread, where grad mode is on)."""
    if finish is not None:
        with torch.no_grad():
            finish()
