"""The ordering and deadline logic of a collective's delay held on the device.

On CUDA, NCCL runs a collective on the process group's stream after that stream
waits on an event of the caller's current stream (``async_op=True``), or on the
current stream itself otherwise; the host returns at once. An emulated
collective mirrors that: it enqueues, on the same stream NCCL would use, a hold
that

* stamps its start (the device's clock) into a host-visible slot: the
  collective's arrival as the device sees it;
* spins until a deadline the host writes into the slot once the answer is
  known (arrivals exchanged, then the network model);
* gives up after a device-side timeout, or when the host raises the slot's
  abort flag, so a dead peer ends in an error, never a hung device.

``wait()`` only makes the current stream wait on the hold's end event;
``get_future()`` is complete when the hold is enqueued, as NCCL's is. The host
blocks only where the script synchronizes.

Everything here is written against the small protocol below (device, stream,
event, slot) so it runs in CI against :class:`FakeDevice`; the thin CUDA
implementation lives in ``emulator_core._cuda_hold`` (imported lazily).

Device clock to host clock: :class:`ClockOffset` measures the offset at
start-up from bracketed reads (host, device, host; the narrowest bracket
wins) and re-measures on request to follow drift, so arrivals and deadlines
are on the host's reference timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from nbox_trace.errors import NboxError

UNSET_NS = -1
"""A slot's start or deadline before it is written."""

STATUS_PENDING = 0
STATUS_RELEASED = 1
STATUS_TIMED_OUT = 2
STATUS_ABORTED = 3

CAPTURE_REFUSED = (
    "nbox cannot emulate a collective inside CUDA graph capture: the hold's deadline is only known "
    "at run time; run the step eagerly (no torch.cuda.graph / torch.compile mode='reduce-overhead')"
)


class HoldError(NboxError):
    """A device-side hold ended without its deadline: timed out or aborted."""


class Slot(Protocol):
    """Host-visible memory shared with one hold (mapped pinned memory on CUDA)."""

    def read_start_ns(self) -> int: ...
    def read_status(self) -> int: ...
    def write_deadline_ns(self, deadline_device_ns: int) -> None: ...
    def write_abort(self) -> None: ...


class Event(Protocol):
    def query(self) -> bool: ...


class Stream(Protocol):
    def record_event(self) -> Event: ...
    def wait_event(self, event: Event) -> None: ...


class Device(Protocol):
    def current_stream(self) -> Stream: ...
    def is_capturing(self) -> bool: ...
    def device_now_ns(self) -> int: ...
    def new_slot(self) -> Slot: ...
    def enqueue_hold(self, stream: Stream, slot: Slot, timeout_ns: int) -> Event:
        """Enqueue the hold on ``stream``; return the event recorded right after it."""
        ...


@dataclass
class ClockOffset:
    """host_ns = device_ns + offset_ns, measured from bracketed reads."""

    device: Device
    host_now_ns: Callable[[], int] = time.monotonic_ns
    samples: int = 16
    offset_ns: int = 0
    bracket_ns: int = 0

    def measure(self) -> int:
        """(Re-)measure the offset; the sample with the narrowest host bracket wins."""
        best: tuple[int, int] | None = None
        for _ in range(max(1, self.samples)):
            before = self.host_now_ns()
            dev = self.device.device_now_ns()
            after = self.host_now_ns()
            width = after - before
            if best is None or width < best[0]:
                best = (width, (before + after) // 2 - dev)
        assert best is not None
        self.bracket_ns, self.offset_ns = best
        return self.offset_ns

    def to_host_ns(self, device_ns: int) -> int:
        return device_ns + self.offset_ns

    def to_device_ns(self, host_ns: int) -> int:
        return host_ns - self.offset_ns


@dataclass
class Hold:
    """One enqueued hold: read its arrival, release it at a deadline, or abort it."""

    slot: Slot
    end_event: Event
    clock: ClockOffset
    released: bool = False

    def arrival_host_ns(self) -> int | None:
        """The device's start stamp on the host timeline; None until the hold has started."""
        start = self.slot.read_start_ns()
        return None if start == UNSET_NS else self.clock.to_host_ns(start)

    def release_at(self, deadline_host_ns: int) -> None:
        """Write the deadline (host timeline) once the answer is known; only once."""
        if self.released:
            raise NboxError("a device hold's deadline was written twice (internal error)")
        self.released = True
        self.slot.write_deadline_ns(self.clock.to_device_ns(deadline_host_ns))

    def abort(self) -> None:
        self.slot.write_abort()

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
    """The Work an emulated collective returns on a device: NCCL's semantics."""

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

    def enqueue(self, async_op: bool, group_stream: Stream) -> DeviceHoldWork:
        if self.device.is_capturing():
            raise NboxError(CAPTURE_REFUSED)
        current = self.device.current_stream()
        stream = current
        if async_op:
            group_stream.wait_event(current.record_event())
            stream = group_stream
        slot = self.device.new_slot()
        end = self.device.enqueue_hold(stream, slot, self.timeout_ns)
        return DeviceHoldWork(Hold(slot, end, self.clock), self.device)


# ---------------------------------------------------------------- fake device (CI)


@dataclass
class FakeSlot:
    start_ns: int = UNSET_NS
    deadline_ns: int = UNSET_NS
    abort: bool = False
    status: int = STATUS_PENDING

    def read_start_ns(self) -> int:
        return self.start_ns

    def read_status(self) -> int:
        return self.status

    def write_deadline_ns(self, deadline_device_ns: int) -> None:
        self.deadline_ns = deadline_device_ns

    def write_abort(self) -> None:
        self.abort = True


@dataclass
class FakeEvent:
    done: bool = False

    def query(self) -> bool:
        return self.done


@dataclass
class _Op:
    kind: str  # "hold", "wait", "record", "work"
    slot: FakeSlot | None = None
    event: FakeEvent | None = None
    timeout_ns: int = 0
    label: str = ""


@dataclass
class FakeStream:
    device: FakeDevice
    name: str
    ops: list[_Op] = field(default_factory=list)

    def record_event(self) -> FakeEvent:
        ev = FakeEvent()
        self.ops.append(_Op("record", event=ev))
        return ev

    def wait_event(self, event: Event) -> None:
        assert isinstance(event, FakeEvent)
        self.ops.append(_Op("wait", event=event))

    def launch(self, label: str) -> None:
        """A stand-in kernel (a later op on this stream)."""
        self.ops.append(_Op("work", label=label))


@dataclass
class FakeDevice:
    """A pure-Python device: streams run in order, time moves only by ``advance``."""

    now_ns: int = 1_000_000
    capturing: bool = False
    streams: dict[str, FakeStream] = field(default_factory=dict)
    current: str = "default"
    ran: list[str] = field(default_factory=list)

    def stream(self, name: str) -> FakeStream:
        if name not in self.streams:
            self.streams[name] = FakeStream(self, name)
        return self.streams[name]

    def current_stream(self) -> FakeStream:
        return self.stream(self.current)

    def is_capturing(self) -> bool:
        return self.capturing

    def device_now_ns(self) -> int:
        return self.now_ns

    def new_slot(self) -> FakeSlot:
        return FakeSlot()

    def enqueue_hold(self, stream: Stream, slot: Slot, timeout_ns: int) -> FakeEvent:
        assert isinstance(stream, FakeStream) and isinstance(slot, FakeSlot)
        stream.ops.append(_Op("hold", slot=slot, timeout_ns=timeout_ns, label="hold"))
        return stream.record_event()

    def advance(self, ns: int = 0) -> None:
        """Move time by ``ns`` then run every stream as far as it can go."""
        self.now_ns += ns
        progress = True
        while progress:
            progress = False
            for s in self.streams.values():
                while s.ops and self._step(s.name, s.ops[0]):
                    s.ops.pop(0)
                    progress = True

    def _step(self, stream: str, op: _Op) -> bool:
        if op.kind == "record":
            assert op.event is not None
            op.event.done = True
            return True
        if op.kind == "wait":
            assert op.event is not None
            return op.event.done
        if op.kind == "work":
            self.ran.append(f"{stream}:{op.label}")
            return True
        slot = op.slot
        assert slot is not None
        if slot.start_ns == UNSET_NS:
            slot.start_ns = self.now_ns
        if slot.abort:
            slot.status = STATUS_ABORTED
        elif slot.deadline_ns != UNSET_NS and self.now_ns >= slot.deadline_ns:
            slot.status = STATUS_RELEASED
        elif self.now_ns - slot.start_ns >= op.timeout_ns:
            slot.status = STATUS_TIMED_OUT
        else:
            return False
        self.ran.append(f"{stream}:hold")
        return True
