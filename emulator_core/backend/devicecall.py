"""The backend's collectives held on the device (:mod:`emulator_core.device.hold` says how a hold works).

Which calls: those whose tensors live on a device with a hold implementation (CUDA:
:mod:`emulator_core.device._cuda`) when ``NBOX_DEVICE_HOLD`` is not ``off``: every call where the real members move
data (``nbox emulate``), and a timing-only collective (``NBOX_MOVE_DATA=0``: a live replay on CUDA, whose real members
exchange only arrival times: :func:`no_data` between the stamp and the hold, the exchange started by the resolver
once the device stamped the arrival). A timing-only send or receive keeps the host hold (its issue time travels to
the peer where its data would). A barrier carries no tensor and keeps the host hold (``wait()`` blocks the host, as
NCCL's barrier does).

For such a call the backend (:mod:`emulator_core.backend`):

1. on the calling thread, enqueues on the stream NCCL would use (the group's own stream after it waits on the
   current stream, for ``async_op=True``; the current stream otherwise; point to point on the pair's own stream)
   the arrival stamp, the call's data ops (the mirror rule's copies, the real members' gloo calls) and the hold,
   and returns a :class:`HeldWork` at once;
2. on the group's resolver thread, in issue order: waits for the device's arrival stamp, puts it on the reference
   timeline (:class:`emulator_core.device.hold.ClockOffset`, then :class:`emulator_core.backend.clocksync.Clock`),
   exchanges it with the other real members, answers the call with the network model, lets the real members'
   data land (on a stream of the resolver's, which it synchronizes) and only then writes the deadline.

The device-side timeout is twice the group's call timeout: the host's own timeouts fire first, with their
messages, and abort the hold; the device's is for a host that stopped answering. A failure is kept: the next
call on that device raises it (as NCCL's communicator is aborted after an error).
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from emulator_core.backend.calls import GroupState, Pending, start_exchange
from emulator_core.backend.clocksync import Clock
from emulator_core.backend.delay import run_finish
from emulator_core.device import (
    STATUS_TIMED_OUT,
    ClockOffset,
    Device,
    DeviceHoldWork,
    HoldEngine,
    HoldError,
    Stream,
)

__all__ = ["FOLLOW_S", "CoalescedHeld", "DeviceState", "HeldWork", "arrive", "async_op", "coalesced",
           "completed_future", "device_state", "enqueue", "land", "may_hold", "no_data", "register_factory"]

#: How often the device clock's offset to the host's is re-measured (drift followed).
FOLLOW_S = 1.0

Factory = Callable[[torch.device], Device]


def _cuda(dev: torch.device) -> Device:
    from emulator_core.device import CudaDevice

    return CudaDevice(dev.index if dev.index is not None else torch.cuda.current_device())


_FACTORIES: dict[str, Factory] = {"cuda": _cuda}


def register_factory(device_type: str, factory: Factory | None) -> None:
    """Hold the calls on ``device_type`` tensors with ``factory``'s device (None: no hold there); forgets the
    devices already built. Tests give ``cpu`` a fake device (:mod:`emulator_core.device.fake`)."""
    if factory is None:
        _FACTORIES.pop(device_type, None)
    else:
        _FACTORIES[device_type] = factory
    for key in [k for k in _STATES if k[0] == device_type]:
        st = _STATES.pop(key)
        if st is not None:
            st.clock.stop()


def may_hold() -> bool:
    """Whether a call in this process could be held on a device at all: a factory for a device type other than
    CUDA (a test's fake), or CUDA where it is available."""
    return any(t != "cuda" for t in _FACTORIES) or ("cuda" in _FACTORIES and torch.cuda.is_available())


def no_data(inner: Any) -> tuple[list[Any], None]:
    """A timing-only call's data ops: none (no tensor moves, not even the mirror copies)."""
    return [], None


def async_op(opts: Any) -> bool:
    """A call's ``asyncOp`` (C++ callers such as DDP's reducer leave it at its default, True)."""
    return True if opts is None else bool(getattr(opts, "asyncOp", True))


@dataclass
class DeviceState:
    """One device of this process: its clock offset, the holds it watches, the failure it keeps."""

    device: Device
    clock: ClockOffset
    watch: collections.deque[DeviceHoldWork] = field(default_factory=collections.deque)
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    local: threading.local = field(default_factory=threading.local)

    def check(self) -> None:
        """Free the slots of ended holds; raise the failure kept from an earlier call, or a device timeout."""
        with self.lock:
            while self.watch and self.watch[0].hold.ended():
                done = self.watch.popleft()
                if done.hold.slot.read_status() == STATUS_TIMED_OUT and self.error is None:
                    self.error = HoldError("an emulated collective timed out on the device waiting for its "
                                           "deadline (a peer rank died or stopped answering)")
                done.hold.slot.free()
            err = self.error
        if err is not None:
            raise HoldError(f"an earlier collective failed on the device: {err}")

    def side_stream(self) -> Stream:
        """A stream of the calling (resolver) thread's own, for the real members' data."""
        got: Stream | None = getattr(self.local, "stream", None)
        if got is None:
            got = self.local.stream = self.device.new_stream()
        return got


_STATES: dict[tuple[str, int | None], DeviceState | None] = {}
_STATES_LOCK = threading.Lock()


def device_state(tensors: Sequence[torch.Tensor], mode: str) -> DeviceState | None:
    """The device state a call on ``tensors`` is held on; None for the host hold (no tensor, no hold for their
    device, ``mode`` ``off``, or, with ``auto``, a hold that cannot be built here: said once as a warning)."""
    if mode == "off" or not tensors:
        return None
    dev = tensors[0].device
    factory = _FACTORIES.get(dev.type)
    if factory is None:
        return None
    key = (dev.type, dev.index)
    if key in _STATES:
        return _STATES[key]
    with _STATES_LOCK:
        if key in _STATES:
            return _STATES[key]
        st: DeviceState | None = None
        try:
            device = factory(dev)
            clock = ClockOffset(device)
            clock.measure()
            clock.follow(FOLLOW_S)
            st = DeviceState(device, clock)
        except HoldError as err:
            if mode == "on":
                raise HoldError(f"NBOX_DEVICE_HOLD=on: no device hold on {dev}: {err}") from None
            warnings.warn(f"nbox: emulated collectives on {dev} are held on the host (no device hold: {err})",
                          RuntimeWarning, stacklevel=2)
        _STATES[key] = st
        return st


class HeldWork(Work):
    """The ``Work`` of a call held on the device: NCCL's semantics (module docstring).

    ``wait()`` orders the current stream after the hold and returns at once; ``get_future()`` is complete when
    made, with the devices set, so its waiters' streams are ordered the same way (DDP's reducer, ``then()``).
    The call's tensors are kept until ``wait()``, as NCCL keeps them, so the caching allocator does not hand
    their memory out while the group's stream still uses it.
    """

    def __init__(self, call: Callable[[], str], result: list[torch.Tensor], held: DeviceHoldWork,
                 state: DeviceState, clock: Clock, stash: object) -> None:
        super().__init__()
        self._call, self._result, self.held, self.state = call, result, held, state
        self._clock = clock
        self._stash: object = stash
        self._error: BaseException | None = None
        self._future: Future[Any] | None = None

    # -- resolution (the group's resolver thread) ---------------------------------------------------------
    def resolve(self, deadline_ns: int) -> None:
        """Write the deadline (reference timeline, nanoseconds) into the hold's slot."""
        self.held.hold.release_at(self._clock.to_perf_ns(deadline_ns))
        self.state.watch.append(self.held)

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.held.hold.abort()
        with self.state.lock:
            self.state.error = self.state.error or error
        self.state.watch.append(self.held)

    # -- the Work API --------------------------------------------------------------------------------------
    def _raise(self) -> None:
        if self._error is not None:
            raise HoldError(f"{self._call()} failed: {self._error}") from self._error
        self.held.hold.check()

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._raise()
        self.held.wait()
        self._stash = None
        return True

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return self._error is None and self.held.is_completed()

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> Future[Any]:
        if self._future is None:
            self._future = completed_future(self.state.device, self.held.hold.stream, self._result)
        return self._future


def completed_future(device: Device, stream: Stream, value: list[torch.Tensor]) -> Future[Any]:
    """A future complete now whose waiters' streams are ordered after ``stream``'s work so far."""
    names, scope = device.future_scope(stream)
    devices: list[int | str | torch.device] = list(names)
    fut: Future[Any] = Future(devices=devices) if devices else Future()
    with scope:
        fut.set_result(value)
    return fut


class CoalescedHeld(Work):
    """Coalesced calls of which some are held on the device: ``wait()`` waits (orders) each."""

    def __init__(self, works: Sequence[Work]) -> None:
        super().__init__()
        self._works = list(works)

    def wait(self, timeout: timedelta | None = None) -> bool:
        for w in self._works:
            if timeout is None:
                w.wait()
            else:
                w.wait(timeout)
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def result(self) -> list[torch.Tensor]:
        return [t for w in self._works for t in w.result()]

    def get_future(self) -> Future[Any]:
        held = [w for w in self._works if isinstance(w, HeldWork)]
        last = held[-1]
        others = [w for w in self._works if not isinstance(w, HeldWork)]
        for w in others:  # a host-held call among them: its deadline, on the host
            w.wait()
        side = last.state.side_stream()
        for w in held:
            side.wait_event(w.held.hold.end_event)
        return completed_future(last.state.device, side, self.result())


def coalesced(works: Sequence[Work]) -> Work | None:
    """The work of coalesced calls when some were held on the device; None when none was."""
    return CoalescedHeld(works) if any(isinstance(w, HeldWork) for w in works) else None


# ------------------------------------------------------------------------------------ the two halves of a call

def enqueue(st: DeviceState, g: GroupState, timeout_s: float, call: Callable[[], str], result: list[torch.Tensor],
            real: Callable[[Any], Any], run_async: bool, clock: Clock) -> tuple[HeldWork, list[Any], Any]:
    """The calling thread's half: the stamp, the data ops and the hold on NCCL's stream; (the work, the real
    members' works and the copy-out to finish on the resolver)."""
    st.check()
    if g.stream is None:
        g.stream = st.device.new_stream()
    inner = g.inner

    def data() -> tuple[list[Any], Any]:
        with torch.no_grad():  # buffers only, as on the host path
            works, finish = real(inner)
        if inner is None:  # the mirror copies alone: done on the stream, before the hold ends
            run_finish(finish)
            return [], None
        return works, finish

    engine = HoldEngine(st.device, st.clock, int(2 * timeout_s * 1e9))
    held, got = engine.enqueue(run_async, g.stream, data)
    works, finish = got if got is not None else ([], None)
    return HeldWork(call, result, held, st, clock, (real, result)), works, finish


def arrive(g: GroupState, item: Pending, clock: Clock, timeout_s: float) -> None:
    """The resolver's first step for a held call: its device arrival (reference timeline) as the call's arrival;
    the exchange with the other real members started with it, or the arrivals set from it alone."""
    work = item.work
    assert isinstance(work, HeldWork)
    perf_ns = work.held.hold.wait_arrival_host_ns(timeout_s)
    item.ref_issue_ns = ref = clock.to_reference_ns(perf_ns)
    if g.exchange and g.inner is not None:
        start_exchange(g, item)
        return
    item.ts = torch.tensor([ref] * len(g.fabric_group.real_positions), dtype=torch.int64)


def land(item: Pending, limit: timedelta) -> None:
    """The resolver's last step before the deadline is written: the real members' data in and the mirror
    copy-out done, on the resolver's stream, synchronized (the hold must not end before they have)."""
    work = item.work
    assert isinstance(work, HeldWork)
    if not item.works and item.finish is None:
        return
    st = work.state
    side = st.side_stream()
    with st.device.use_stream(side):
        for w in item.works:
            w.wait(limit)
        run_finish(item.finish)
    st.device.synchronize(side)
