"""The device hold's ordering and deadline logic against the pure-Python fake device."""

from __future__ import annotations

import pytest

from emulator_core.device_hold import (
    CAPTURE_REFUSED,
    ClockOffset,
    FakeDevice,
    HoldEngine,
    HoldError,
)
from nbox_trace.errors import NboxError


def _engine(timeout_ns: int = 10_000_000, host_offset_ns: int = 5_000) -> tuple[FakeDevice, HoldEngine]:
    dev = FakeDevice()
    clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns + host_offset_ns, samples=3)
    clock.measure()
    return dev, HoldEngine(dev, clock, timeout_ns)


def test_arrival_stamped_on_host_timeline_and_released_only_by_deadline() -> None:
    dev, eng = _engine()
    work = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    assert work.hold.arrival_host_ns() is None
    dev.advance(0)
    assert work.hold.arrival_host_ns() == dev.now_ns + 5_000
    dev.advance(1_000_000)  # no deadline written yet: still held
    assert not work.is_completed()
    work.hold.release_at(dev.now_ns + 5_000 + 2_000)
    dev.advance(1_000)
    assert not work.is_completed()
    dev.advance(1_000)
    assert work.is_completed()
    with pytest.raises(NboxError):
        work.hold.release_at(0)


def test_stream_order_sync_and_async() -> None:
    dev, eng = _engine()
    w = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    dev.current_stream().launch("after")
    dev.advance(0)
    assert dev.ran == []  # the later op waits for the hold
    w.hold.release_at(0)
    dev.advance(0)
    assert dev.ran == ["default:hold", "default:after"]

    dev2, eng2 = _engine()
    dev2.current_stream().launch("before")
    w2 = eng2.enqueue(async_op=True, group_stream=dev2.stream("pg"))
    w2.wait()
    dev2.current_stream().launch("consumer")
    dev2.advance(0)
    assert dev2.ran == ["default:before"]  # consumer waits on the hold's end event
    w2.hold.release_at(0)
    dev2.advance(0)
    assert dev2.ran == ["default:before", "pg:hold", "default:consumer"]
    assert w2.future_done()


def test_timeout_and_abort_raise() -> None:
    dev, eng = _engine(timeout_ns=1_000)
    w = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    dev.advance(0)
    dev.advance(1_000)
    with pytest.raises(HoldError, match="timed out"):
        w.wait()
    dev, eng = _engine()
    w = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    w.hold.abort()
    dev.advance(0)
    with pytest.raises(HoldError, match="aborted"):
        w.is_completed()


def test_clock_offset_conversion_and_remeasure() -> None:
    dev = FakeDevice()
    shift = [7_000]
    clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns + shift[0], samples=2)
    assert clock.measure() == 7_000
    assert clock.to_device_ns(clock.to_host_ns(123)) == 123
    shift[0] = 9_000  # drift
    assert clock.measure() == 9_000


def test_capture_refused() -> None:
    dev, eng = _engine()
    dev.capturing = True
    with pytest.raises(NboxError, match="CUDA graph capture") as err:
        eng.enqueue(async_op=True, group_stream=dev.stream("pg"))
    assert "\n" not in str(err.value) and str(err.value) == CAPTURE_REFUSED
