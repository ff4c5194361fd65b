"""A pure-Python device for the hold's CI tests: streams that run in order, events, a clock, slots.

It plays what :mod:`emulator_core.device._cuda` does on a GPU, with the same protocol
(:mod:`emulator_core.device.hold`): a stream's operations run one after the other; a hold stamps its start,
then ends when its slot's deadline has passed on the device clock, when its timeout has, or when the slot is
aborted; a stand-in kernel (:meth:`FakeStream.launch`) can take time, so a hold's arrival lags its enqueue as a
real one does behind a busy stream.

Time moves in two ways: by :meth:`FakeDevice.advance` (a test steps it by hand, deterministic), or, with
``host_clock`` given, on the host's clock plus ``skew_ns``, with :meth:`FakeDevice.start` running the streams on a
background thread (what the backend's tests use: the resolver thread polls and writes slots as it would on CUDA).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from emulator_core.device.hold import (
    STATUS_ABORTED,
    STATUS_PENDING,
    STATUS_RELEASED,
    STATUS_TIMED_OUT,
    UNSET_NS,
    Event,
    Slot,
    Stream,
    no_scope,
)

__all__ = ["FakeDevice", "FakeEvent", "FakeSlot", "FakeStream"]


@dataclass
class FakeSlot:
    start_ns: int = UNSET_NS
    deadline_ns: int = UNSET_NS
    abort: bool = False
    status: int = STATUS_PENDING
    released_ns: int = UNSET_NS
    deadline_writes: list[int] = field(default_factory=list)  # host time of each deadline write (tests)
    freed: bool = False

    def read_start_ns(self) -> int:
        return self.start_ns

    def read_status(self) -> int:
        return self.status

    def read_released_ns(self) -> int:
        return self.released_ns

    def write_deadline_ns(self, deadline_device_ns: int) -> None:
        self.deadline_writes.append(time.perf_counter_ns())
        self.deadline_ns = deadline_device_ns

    def write_abort(self) -> None:
        self.abort = True

    def free(self) -> None:
        self.freed = True


@dataclass
class FakeEvent:
    done: bool = False

    def query(self) -> bool:
        return self.done


@dataclass
class _Op:
    kind: str  # "hold", "stamp", "wait", "record", "work"
    slot: FakeSlot | None = None
    event: FakeEvent | None = None
    timeout_ns: int = 0
    label: str = ""
    duration_ns: int = 0
    started_ns: int | None = None


@dataclass
class FakeStream:
    device: FakeDevice
    name: str
    ops: list[_Op] = field(default_factory=list)

    def record_event(self) -> FakeEvent:
        ev = FakeEvent()
        with self.device.lock:
            self.ops.append(_Op("record", event=ev))
        return ev

    def wait_event(self, event: Event) -> None:
        assert isinstance(event, FakeEvent)
        with self.device.lock:
            self.ops.append(_Op("wait", event=event))

    def launch(self, label: str, duration_ns: int = 0) -> None:
        """A stand-in kernel that runs ``duration_ns`` once the stream reaches it."""
        with self.device.lock:
            self.ops.append(_Op("work", label=label, duration_ns=duration_ns))


@dataclass
class FakeDevice:
    """A pure-Python device (module docstring)."""

    now_ns: int = 1_000_000
    capturing: bool = False
    host_clock: Callable[[], int] | None = None
    skew_ns: int = 0
    streams: dict[str, FakeStream] = field(default_factory=dict)
    current: str = "default"
    ran: list[str] = field(default_factory=list)
    slots: list[FakeSlot] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _new: int = 0
    _local: threading.local = field(default_factory=threading.local)  # the current stream is per thread, as CUDA's

    def stream(self, name: str) -> FakeStream:
        with self.lock:
            if name not in self.streams:
                self.streams[name] = FakeStream(self, name)
            return self.streams[name]

    # -- the Device protocol -------------------------------------------------------------------------------
    def current_stream(self) -> FakeStream:
        return self.stream(getattr(self._local, "name", self.current))

    def new_stream(self) -> FakeStream:
        with self.lock:
            self._new += 1
            return self.stream(f"s{self._new}")

    @contextlib.contextmanager
    def use_stream(self, stream: Stream) -> Iterator[None]:
        assert isinstance(stream, FakeStream)
        before = getattr(self._local, "name", None)
        self._local.name = stream.name
        try:
            yield
        finally:
            if before is None:
                del self._local.name
            else:
                self._local.name = before

    def synchronize(self, stream: Stream) -> None:
        assert isinstance(stream, FakeStream)
        while True:
            with self.lock:
                if self._thread is None:
                    self.advance(0)
                if not stream.ops:
                    return
                if self._thread is None:
                    raise RuntimeError(f"fake device: stream {stream.name} cannot finish without time moving")
            time.sleep(20e-6)

    def is_capturing(self) -> bool:
        return self.capturing

    def device_now_ns(self) -> int:
        if self.host_clock is not None:
            return self.host_clock() + self.skew_ns
        return self.now_ns

    def clock_samples(self, n: int, host_now_ns: Callable[[], int]) -> list[tuple[int, int, int]]:
        reads = []
        for _ in range(n):
            before = host_now_ns()
            dev = self.device_now_ns()
            reads.append((before, dev, host_now_ns()))
        return reads

    def new_slot(self) -> FakeSlot:
        slot = FakeSlot()
        self.slots.append(slot)
        return slot

    def stamp(self, stream: Stream, slot: Slot) -> None:
        assert isinstance(stream, FakeStream) and isinstance(slot, FakeSlot)
        with self.lock:
            stream.ops.append(_Op("stamp", slot=slot, label="stamp"))

    def enqueue_hold(self, stream: Stream, slot: Slot, timeout_ns: int) -> FakeEvent:
        assert isinstance(stream, FakeStream) and isinstance(slot, FakeSlot)
        with self.lock:
            stream.ops.append(_Op("hold", slot=slot, timeout_ns=timeout_ns, label="hold"))
            return stream.record_event()

    def future_scope(self, stream: Stream) -> tuple[list[str], contextlib.AbstractContextManager[None]]:
        return [], no_scope()

    # -- running -------------------------------------------------------------------------------------------
    def advance(self, ns: int = 0) -> None:
        """Move time by ``ns`` (by hand; with ``host_clock``, time is the host's) then run every stream as far
        as it can go."""
        with self.lock:
            self.now_ns += ns
            progress = True
            while progress:
                progress = False
                for s in list(self.streams.values()):
                    while s.ops and self._step(s.name, s.ops[0]):
                        s.ops.pop(0)
                        progress = True

    def start(self, period_s: float = 20e-6) -> None:
        """Run the streams on a background thread (needs ``host_clock``) until :meth:`stop`."""
        assert self.host_clock is not None, "a background device runs on the host's clock"

        def run() -> None:
            while not self._stop.wait(period_s):
                self.advance(0)

        self._thread = threading.Thread(target=run, name="fake-device", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _step(self, stream: str, op: _Op) -> bool:
        now = self.device_now_ns()
        if op.kind == "record":
            assert op.event is not None
            op.event.done = True
            return True
        if op.kind == "wait":
            assert op.event is not None
            return op.event.done
        if op.kind == "work":
            if op.started_ns is None:
                op.started_ns = now
            if now - op.started_ns < op.duration_ns:
                return False
            self.ran.append(f"{stream}:{op.label}")
            return True
        slot = op.slot
        assert slot is not None
        if slot.start_ns == UNSET_NS:
            slot.start_ns = now
        if op.kind == "stamp":
            return True
        if op.started_ns is None:
            op.started_ns = now
        if slot.abort:
            slot.status = STATUS_ABORTED
        elif slot.deadline_ns != UNSET_NS and now >= slot.deadline_ns:
            slot.released_ns = now
            slot.status = STATUS_RELEASED
        elif now - op.started_ns >= op.timeout_ns:
            slot.status = STATUS_TIMED_OUT
        else:
            return False
        self.ran.append(f"{stream}:hold")
        return True
