"""The ordering and deadline logic of a collective's delay held on the device (no torch, no CUDA here).

An emulated collective on CUDA enqueues, on the stream NCCL would use (the process group's stream after an event of
the caller's current stream with ``async_op=True``, else the current stream), a hold that

* stamps its start (the device's clock) into a host-visible slot: the collective's arrival as the device sees it;
* spins until a deadline the host writes into the slot once the answer is known (the real members' arrivals
  exchanged, then the network model: :mod:`emulator_core.backend`'s resolver);
* gives up after a device-side timeout, or when the host raises the slot's abort word, so a dead peer ends in an
  error, never a hung device.

With data to move (the mirror rule's copies, :mod:`emulator_core.backend.mirror`) the arrival is stamped first, the
data ops run on the same stream, then the hold. ``wait()`` only makes the current stream wait on the hold's end
event; ``get_future()`` is complete when the hold is enqueued. Everything is written against a small protocol
(:class:`Device`, :class:`Stream`, :class:`Event`, :class:`Slot`), which :class:`emulator_core.device.fake.FakeDevice`
and :mod:`emulator_core.device._cuda` implement. :class:`ClockOffset` puts the device's timer on the host's
``perf_counter_ns`` timeline: ``host - device`` from bracketed reads (host, device, host; the narrowest bracket wins),
re-measured on request (:meth:`ClockOffset.follow`, periodically on a thread), with the drift rate from the last two
accepted measurements. Times are nanoseconds. Why: docs/design/device-hold.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from nbox_trace.errors import NboxError

__all__ = ["CAPTURE_REFUSED", "STATUS_ABORTED", "STATUS_PENDING", "STATUS_RELEASED", "STATUS_TIMED_OUT",
           "UNSET_NS", "ClockOffset", "Device", "DeviceHoldWork", "Event", "Hold", "HoldEngine", "HoldError",
           "Slot", "Stream"]

UNSET_NS = -1
"""A slot's start, deadline or release before it is written."""

STATUS_PENDING = 0
STATUS_RELEASED = 1
STATUS_TIMED_OUT = 2
STATUS_ABORTED = 3

#: How often the resolver looks for a hold's arrival stamp at first, and at most once it has waited a while
#: (a sleep releases the GIL; the stamp's value does not depend on when it is read, only the deadline's write does).
POLL_FIRST_S, POLL_MAX_S, POLL_GROW_AFTER_S = 20e-6, 200e-6, 2e-3

CAPTURE_REFUSED = (
    "nbox cannot emulate a collective inside CUDA graph capture: the hold's deadline is only known "
    "at run time; run the step eagerly (no torch.cuda.graph / torch.compile mode='reduce-overhead')"
)

R = TypeVar("R")


class HoldError(NboxError):
    """A device-side hold ended without its deadline (timed out or aborted), or never started."""


class Slot(Protocol):
    """Host-visible memory shared with one hold (pinned host memory on CUDA)."""

    def read_start_ns(self) -> int: ...
    def read_status(self) -> int: ...
    def read_released_ns(self) -> int: ...
    def write_deadline_ns(self, deadline_device_ns: int) -> None: ...
    def write_abort(self) -> None: ...
    def free(self) -> None:
        """Give the slot back for reuse (only once the hold has ended: status is not pending)."""
        ...


class Event(Protocol):
    def query(self) -> bool: ...


class Stream(Protocol):
    def record_event(self) -> Event: ...
    def wait_event(self, event: Event) -> None: ...


class Device(Protocol):
    def current_stream(self) -> Stream: ...
    def new_stream(self) -> Stream: ...
    def use_stream(self, stream: Stream) -> ContextManager[None]:
        """Make ``stream`` the current one inside the block (the data ops of a call run there)."""
        ...
    def synchronize(self, stream: Stream) -> None:
        """Block the calling host thread until ``stream``'s work so far is done."""
        ...
    def is_capturing(self) -> bool: ...
    def clock_samples(self, n: int, host_now_ns: Callable[[], int]) -> list[tuple[int, int, int]]:
        """``n`` bracketed reads ``(host before, device timer, host after)``, nanoseconds."""
        ...
    def new_slot(self) -> Slot: ...
    def stamp(self, stream: Stream, slot: Slot) -> None:
        """Enqueue the arrival stamp alone on ``stream`` (before a call's data ops)."""
        ...
    def enqueue_hold(self, stream: Stream, slot: Slot, timeout_ns: int) -> Event:
        """Enqueue the hold on ``stream`` (it stamps the arrival when no stamp went first); return the event
        recorded right after it."""
        ...
    def future_scope(self, stream: Stream) -> tuple[list[str], ContextManager[None]]:
        """The devices a completed future names and the block to complete it in (``stream`` current), so that
        its waiters order their streams after the hold (empty and a no-op where there is no such thing)."""
        ...


@dataclass
class ClockOffset:
    """``host_ns = device_ns + offset_ns + drift * (device_ns - at_device_ns)``, from bracketed reads.

    A measurement is accepted when its bracket is at most :attr:`accept_factor` times the narrowest seen so far
    (plus :attr:`accept_slack_ns`): a read the host was descheduled in does not move the offset. ``drift`` (a
    rate, host ns per device ns less 1) comes from the last two accepted measurements when they are at least
    :attr:`min_drift_span_ns` apart.
    """

    device: Device
    host_now_ns: Callable[[], int] = time.perf_counter_ns
    samples: int = 16
    accept_factor: float = 4.0
    accept_slack_ns: int = 2_000
    min_drift_span_ns: int = 200_000_000
    offset_ns: int = 0
    bracket_ns: int = 0
    at_device_ns: int = 0
    drift: float = 0.0
    measured: int = 0
    rejected: int = 0
    best_bracket_ns: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event | None = field(default=None, repr=False)

    def measure(self) -> int:
        """(Re-)measure the offset (the narrowest of :attr:`samples` brackets); return the offset in force."""
        reads = self.device.clock_samples(max(1, self.samples), self.host_now_ns)
        if not reads:
            raise HoldError("the device clock could not be read (no calibration sample)")
        width, offset, dev = min(((a - b, (b + a) // 2 - d, d) for b, d, a in reads), key=lambda s: s[0])
        with self._lock:
            best = width if self.best_bracket_ns is None else min(self.best_bracket_ns, width)
            if self.measured and width > self.accept_factor * best + self.accept_slack_ns:
                self.rejected += 1
                return self.offset_ns
            if self.measured and dev - self.at_device_ns >= self.min_drift_span_ns:
                self.drift = (offset - self.offset_ns) / (dev - self.at_device_ns)
            self.best_bracket_ns = best
            self.offset_ns, self.bracket_ns, self.at_device_ns = offset, width, dev
            self.measured += 1
            return offset

    def to_host_ns(self, device_ns: int) -> int:
        with self._lock:
            return device_ns + self.offset_ns + round(self.drift * (device_ns - self.at_device_ns))

    def to_device_ns(self, host_ns: int) -> int:
        with self._lock:
            guess = host_ns - self.offset_ns  # the first-order inverse: drift is parts per million
            return guess - round(self.drift * (guess - self.at_device_ns))

    def follow(self, period_s: float) -> None:
        """Re-measure every ``period_s`` on a daemon thread until :meth:`stop` (a failed read keeps the offset
        in force and counts as rejected)."""
        if self._stop is not None:
            return
        stop = self._stop = threading.Event()

        def run() -> None:
            while not stop.wait(period_s):
                try:
                    self.measure()
                except Exception:  # a busy device missed one re-measurement: counted in rejected, offset kept
                    with self._lock:
                        self.rejected += 1

        threading.Thread(target=run, name="nbox-device-clock", daemon=True).start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def describe(self) -> dict[str, float]:
        """For reports: the offset's bracket, the drift (parts per million) and the measurement counts."""
        with self._lock:
            return {"bracket_us": self.bracket_ns / 1000.0, "drift_ppm": self.drift * 1e6,
                    "measured": float(self.measured), "rejected": float(self.rejected)}


@dataclass
class Hold:
    """One enqueued hold: read its arrival, release it at a deadline, or abort it."""

    slot: Slot
    end_event: Event
    clock: ClockOffset
    stream: Stream
    released: bool = False
    deadline_device_ns: int = UNSET_NS

    def arrival_host_ns(self) -> int | None:
        """The device's start stamp on the host timeline; None until the hold (or its stamp) has run."""
        start = self.slot.read_start_ns()
        return None if start == UNSET_NS else self.clock.to_host_ns(start)

    def wait_arrival_host_ns(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
        """Poll until the arrival is stamped (sleeping between reads); HoldError past ``timeout_s`` or when the
        hold was aborted first."""
        t0 = time.monotonic()
        pause = POLL_FIRST_S
        while True:
            got = self.arrival_host_ns()
            if got is not None:
                return got
            waited = time.monotonic() - t0
            if self.slot.read_status() == STATUS_ABORTED:
                raise HoldError("an emulated collective was aborted before it reached the device")
            if waited > timeout_s:
                raise HoldError(f"an emulated collective did not reach the device within {timeout_s:.1f} s (the "
                                f"stream it was enqueued on is stuck behind other work)")
            if waited > POLL_GROW_AFTER_S:
                pause = POLL_MAX_S
            sleep(pause)

    def release_at(self, deadline_host_ns: int) -> None:
        """Write the deadline (host timeline) once the answer is known; only once."""
        if self.released:
            raise HoldError("a device hold's deadline was written twice (internal error)")
        self.released = True
        self.deadline_device_ns = self.clock.to_device_ns(deadline_host_ns)
        self.slot.write_deadline_ns(self.deadline_device_ns)

    def abort(self) -> None:
        self.slot.write_abort()

    def ended(self) -> bool:
        """The hold's kernel is done (released, timed out or aborted): its slot may be freed."""
        return self.slot.read_status() != STATUS_PENDING

    def late_ns(self) -> int | None:
        """How long after its deadline the hold let go (device clock); None until it was released."""
        if self.slot.read_status() != STATUS_RELEASED or self.deadline_device_ns == UNSET_NS:
            return None
        return self.slot.read_released_ns() - self.deadline_device_ns

    def check(self) -> None:
        """Raise HoldError when the device reported a timeout or an abort."""
        status = self.slot.read_status()
        if status == STATUS_TIMED_OUT:
            raise HoldError("an emulated collective timed out on the device waiting for its deadline "
                            "(a peer rank died or stopped answering)")
        if status == STATUS_ABORTED:
            raise HoldError("an emulated collective was aborted on the device (a peer rank failed)")


@dataclass
class DeviceHoldWork:
    """NCCL's Work semantics over a hold (the torch ``Work`` the backend returns wraps one of these)."""

    hold: Hold
    device: Device

    def wait(self, timeout: object = None) -> bool:
        """Order, do not block: the current stream waits on the hold's end event."""
        self.hold.check()
        self.device.current_stream().wait_event(self.hold.end_event)
        return True

    def is_completed(self) -> bool:
        self.hold.check()
        return self.hold.end_event.query()

    def future_done(self) -> bool:
        """``get_future()`` completes when the hold is enqueued (as NCCL's does)."""
        return True


@dataclass
class HoldEngine:
    """Enqueues holds on the stream NCCL would use."""

    device: Device
    clock: ClockOffset
    timeout_ns: int

    def enqueue(self, async_op: bool, group_stream: Stream,
                data: Callable[[], R] | None = None) -> tuple[DeviceHoldWork, R | None]:
        """One call: the stream NCCL would use (``group_stream`` after it waited on the current stream's event
        when ``async_op``, else the current stream); there the arrival stamp, ``data()`` (the call's data ops,
        run with that stream current; its result is returned) and the hold."""
        if self.device.is_capturing():
            raise HoldError(CAPTURE_REFUSED)
        current = self.device.current_stream()
        stream = current
        if async_op:
            group_stream.wait_event(current.record_event())
            stream = group_stream
        slot = self.device.new_slot()
        got: R | None = None
        if data is not None:
            self.device.stamp(stream, slot)
            with self.device.use_stream(stream):
                got = data()
        end = self.device.enqueue_hold(stream, slot, self.timeout_ns)
        return DeviceHoldWork(Hold(slot, end, self.clock, stream), self.device), got


@contextlib.contextmanager
def no_scope() -> Iterator[None]:
    """A block that changes nothing (a device without streams to make current)."""
    yield
