"""The device hold's ordering and deadline logic against the pure-Python fake device (no GPU): the engine alone, the
clock offset, and the backend's held path end to end on one in-process real rank (no rank is launched)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from emulator_core.backend import devicecall
from emulator_core.backend.clocksync import Clock
from emulator_core.backend.delay import NboxWork
from emulator_core.backend.emulation_config import EmulationConfig, EmulationConfigError
from emulator_core.backend.process_group import NboxProcessGroup
from emulator_core.device.fake import FakeDevice
from emulator_core.device.hold import (
    CAPTURE_REFUSED,
    STATUS_ABORTED,
    STATUS_RELEASED,
    STATUS_TIMED_OUT,
    ClockOffset,
    HoldEngine,
    HoldError,
)
from emulator_core.pricing.answer import Fabric

# ------------------------------------------------------------------------------------------------ the engine alone


def _engine(timeout_ns: int = 10_000_000, host_offset_ns: int = 5_000) -> tuple[FakeDevice, HoldEngine]:
    dev = FakeDevice()
    clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns + host_offset_ns, samples=3)
    clock.measure()
    return dev, HoldEngine(dev, clock, timeout_ns)


def test_arrival_stamped_on_host_timeline_and_released_only_by_deadline() -> None:
    dev, eng = _engine()
    work, _ = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    assert work.hold.arrival_host_ns() is None
    dev.advance(0)
    assert work.hold.arrival_host_ns() == dev.now_ns + 5_000
    dev.advance(1_000_000)  # no deadline written yet: still held
    assert not work.is_completed()
    work.hold.release_at(dev.now_ns + 5_000 + 2_000)
    dev.advance(1_000)
    assert not work.is_completed()
    dev.advance(1_000)
    assert work.is_completed() and work.hold.late_ns() == 0
    with pytest.raises(HoldError, match="twice"):
        work.hold.release_at(0)


def test_a_busy_stream_delays_the_arrival_and_data_ops_run_between_stamp_and_hold() -> None:
    dev, eng = _engine()
    dev.current_stream().launch("forward", duration_ns=50_000)
    dev.advance(0)  # the stream starts the forward pass
    seen: list[str] = []
    work, got = eng.enqueue(async_op=False, group_stream=dev.stream("pg"),
                            data=lambda: seen.append(dev.current_stream().name) or 7)
    assert got == 7 and seen == ["default"]  # the data ops ran with the hold's stream current
    issued = dev.now_ns
    dev.advance(10_000)
    assert work.hold.arrival_host_ns() is None  # the stream is still busy with the forward pass
    dev.advance(40_000)
    assert work.hold.arrival_host_ns() == issued + 50_000 + 5_000


def test_stream_order_sync_and_async() -> None:
    dev, eng = _engine()
    w, _ = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    dev.current_stream().launch("after")
    dev.advance(0)
    assert dev.ran == []  # the later op waits for the hold
    w.hold.release_at(0)
    dev.advance(0)
    assert dev.ran == ["default:hold", "default:after"]

    dev2, eng2 = _engine()
    dev2.current_stream().launch("before")
    w2, _ = eng2.enqueue(async_op=True, group_stream=dev2.stream("pg"))
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
    w, _ = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    dev.advance(0)
    dev.advance(1_000)
    assert w.hold.slot.read_status() == STATUS_TIMED_OUT
    with pytest.raises(HoldError, match="timed out"):
        w.wait()
    dev, eng = _engine()
    w, _ = eng.enqueue(async_op=False, group_stream=dev.stream("pg"))
    w.hold.abort()
    dev.advance(0)
    with pytest.raises(HoldError, match="aborted"):
        w.is_completed()


def test_clock_offset_conversion_drift_and_a_wide_bracket_rejected() -> None:
    dev = FakeDevice()
    shift = [7_000]
    clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns + shift[0], samples=2, min_drift_span_ns=1_000_000)
    assert clock.measure() == 7_000
    assert clock.to_device_ns(clock.to_host_ns(123)) == 123
    dev.now_ns += 10_000_000
    shift[0] = 8_000  # the host clock gained 1 us in 10 ms on the device's: 100 ppm
    assert clock.measure() == 8_000
    assert clock.drift * 1e6 == pytest.approx(100.0)
    later = dev.now_ns + 10_000_000
    assert clock.to_host_ns(later) == later + 9_000  # followed between measurements too
    assert abs(clock.to_device_ns(clock.to_host_ns(later)) - later) <= 1

    reads = iter([0, 50_000])  # one read the host was descheduled in: a 50 us bracket
    clock.host_now_ns = lambda: dev.now_ns + next(reads, 0)
    clock.samples = 1
    assert clock.measure() == 8_000 and clock.rejected == 1


def test_capture_refused() -> None:
    dev, eng = _engine()
    dev.capturing = True
    with pytest.raises(HoldError, match="CUDA graph capture") as err:
        eng.enqueue(async_op=True, group_stream=dev.stream("pg"))
    assert "\n" not in str(err.value) and str(err.value) == CAPTURE_REFUSED


# --------------------------------------------------------------------- the backend's held path, one in-process rank

SKEW_NS = 987_654_321  # the fake device's timer has its own zero


@pytest.fixture
def fake() -> Iterator[FakeDevice]:
    dev = FakeDevice(host_clock=time.perf_counter_ns, skew_ns=SKEW_NS)
    dev.start()
    devicecall.register_factory("cpu", lambda _: dev)
    try:
        yield dev
    finally:
        devicecall.register_factory("cpu", None)
        dev.stop()


def _group(**env: str) -> NboxProcessGroup:
    config = EmulationConfig.from_env(1, {"NBOX_WORLD_SIZE": "8", **env})
    return NboxProcessGroup(config, Fabric(config.scenario), None, 0, dist.HashStore(), timedelta(seconds=30),
                            Clock())


def _opts(async_op: bool) -> Any:
    o = dist.AllreduceOptions()
    o.asyncOp = async_op
    return o


def test_an_all_reduce_is_held_on_the_device_from_its_device_arrival(fake: FakeDevice) -> None:
    pg = _group()
    try:
        t_busy_ns = time.perf_counter_ns()
        fake.current_stream().launch("forward", duration_ns=30_000_000)
        t = torch.ones(1024)
        work = pg.allreduce([t], _opts(False))
        assert isinstance(work, devicecall.HeldWork)
        assert torch.equal(t, torch.full((1024,), 8.0))  # the mirror copies ran (before the hold, on its stream)
        assert work.get_future().done()  # complete at enqueue, as NCCL's
        assert work.wait()  # orders the stream, returns at once
        fake.current_stream().launch("next op")
        fake.synchronize(fake.current_stream())
        slot = fake.slots[-1]
        rec = pg.records[-1]
        arrival_ns = slot.start_ns - SKEW_NS
        assert arrival_ns >= t_busy_ns + 30_000_000  # the device reached the call after the busy forward pass
        assert rec.start_us * 1000 >= arrival_ns - 1_000  # answered from the device's arrival, not the host's issue
        assert slot.deadline_writes and slot.deadline_writes[0] >= arrival_ns  # written only once the answer was
        assert abs(slot.deadline_ns - SKEW_NS - rec.end_us * 1000) < 2_000  # the answer's end, on the device clock
        assert slot.status == STATUS_RELEASED and slot.released_ns >= slot.deadline_ns
        assert fake.ran[-3:] == ["default:forward", "default:hold", "default:next op"]
    finally:
        pg.shutdown()


def test_async_op_runs_on_the_groups_stream_and_wait_orders_the_current_one(fake: FakeDevice) -> None:
    pg = _group()
    try:
        work = pg.allreduce([torch.ones(4)], _opts(True))
        group_stream = pg._group.stream
        assert group_stream is not None and group_stream is not fake.current_stream()
        work.wait()
        fake.current_stream().launch("consumer")
        fake.synchronize(fake.current_stream())
        assert fake.ran.index(f"{group_stream.name}:hold") < fake.ran.index("default:consumer")
    finally:
        pg.shutdown()


def test_coalesced_held_calls_wait_on_each_hold(fake: FakeDevice) -> None:
    pg = _group()
    try:
        pg._start_coalescing()
        a, b = torch.ones(4), torch.ones(8)
        pg.allreduce([a], _opts(True))
        pg.allreduce([b], _opts(True))
        work = pg._end_coalescing()
        assert isinstance(work, devicecall.CoalescedHeld)
        fut = work.get_future()
        assert fut.done() and [t.numel() for t in fut.value()] == [4, 8]
        work.wait()
        fake.current_stream().launch("consumer")
        fake.synchronize(fake.current_stream())
        holds = [i for i, r in enumerate(fake.ran) if r.endswith(":hold")]
        assert len(holds) == 2 and max(holds) < fake.ran.index("default:consumer")
    finally:
        pg.shutdown()


def test_a_failed_answer_aborts_the_hold_and_the_next_call_says_so(fake: FakeDevice,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pg = _group()
    try:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the peer is gone")
        monkeypatch.setattr(pg.fabric, "answer", broken)
        work = pg.allreduce([torch.ones(4)], _opts(True))
        fake.synchronize(fake.current_stream())
        deadline = time.monotonic() + 10
        while fake.slots[-1].status != STATUS_ABORTED and time.monotonic() < deadline:
            time.sleep(0.001)
        assert fake.slots[-1].status == STATUS_ABORTED and not fake.slots[-1].deadline_writes  # never a hung device
        with pytest.raises(HoldError, match="the peer is gone"):
            work.wait()
        with pytest.raises(HoldError, match="an earlier collective failed on the device: the peer is gone"):
            pg.allreduce([torch.ones(4)], _opts(True))
    finally:
        pg.shutdown()


def test_a_device_timeout_is_raised_by_the_next_call() -> None:
    dev = FakeDevice()
    clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns, samples=1)
    clock.measure()
    st = devicecall.DeviceState(dev, clock)
    held, _ = HoldEngine(dev, clock, 1_000).enqueue(False, dev.stream("pg"))
    st.watch.append(held)
    st.check()  # still pending: nothing to say
    dev.advance(0)
    dev.advance(1_000)
    with pytest.raises(HoldError, match="timed out on the device"):
        st.check()
    assert held.hold.slot.freed  # type: ignore[attr-defined]  # the slot went back once its hold ended


def test_graph_capture_is_refused_in_one_line(fake: FakeDevice) -> None:
    pg = _group()
    try:
        fake.capturing = True
        with pytest.raises(HoldError) as err:
            pg.allreduce([torch.ones(4)], _opts(False))
        assert str(err.value) == CAPTURE_REFUSED
    finally:
        pg.shutdown()


def test_the_setting_picks_the_hold_and_a_barrier_stays_on_the_host(fake: FakeDevice) -> None:
    pg = _group(NBOX_DEVICE_HOLD="off")
    try:
        assert isinstance(pg.allreduce([torch.ones(4)], _opts(False)), NboxWork)
    finally:
        pg.shutdown()
    pg = _group()
    try:
        assert isinstance(pg.allreduce([torch.ones(4)], _opts(False)), devicecall.HeldWork)
        assert isinstance(pg.barrier(), NboxWork)  # no tensor: the host hold, as NCCL's barrier blocks the host
    finally:
        pg.shutdown()


def test_a_timing_only_collective_is_held_on_the_device_and_moves_no_data(fake: FakeDevice) -> None:
    """A live replay's calls (NBOX_MOVE_DATA=0) on a device with a hold: held like emulate's, no data op."""
    pg = _group(NBOX_MOVE_DATA="0")
    try:
        t = torch.ones(1024)
        work = pg.allreduce([t], _opts(True))
        assert isinstance(work, devicecall.HeldWork)
        work.wait()
        fake.current_stream().launch("consumer")
        fake.synchronize(fake.current_stream())
        group_stream = pg._group.stream
        assert group_stream is not None
        assert fake.ran.index(f"{group_stream.name}:hold") < fake.ran.index("default:consumer")
        assert torch.equal(t, torch.ones(1024))  # no mirror copy: timing only
        assert fake.slots[-1].status == STATUS_RELEASED and pg.records[-1].end_us >= pg.records[-1].start_us
    finally:
        pg.shutdown()
    pg = _group(NBOX_MOVE_DATA="0", NBOX_DEVICE_HOLD="off")
    try:
        assert isinstance(pg.allreduce([torch.ones(4)], _opts(True)), NboxWork)
    finally:
        pg.shutdown()


def test_a_timing_only_collective_stays_on_the_host_where_no_device_can_hold_it() -> None:
    pg = _group(NBOX_MOVE_DATA="0")  # no fake device for CPU tensors, and no CUDA here
    try:
        assert not pg._hold_timing or torch.cuda.is_available()
        assert isinstance(pg.allreduce([torch.ones(4)], _opts(True)), NboxWork)
    finally:
        pg.shutdown()


def test_a_hold_that_cannot_be_built_falls_back_or_is_refused() -> None:
    def unavailable(_: torch.device) -> Any:
        raise HoldError("no NVRTC library")
    devicecall.register_factory("cpu", unavailable)
    try:
        pg = _group(NBOX_DEVICE_HOLD="on")
        with pytest.raises(HoldError, match="NBOX_DEVICE_HOLD=on: no device hold on cpu: no NVRTC library"):
            pg.allreduce([torch.ones(4)], _opts(False))
        pg.shutdown()
        pg = _group()
        with pytest.warns(RuntimeWarning, match="held on the host"):
            assert isinstance(pg.allreduce([torch.ones(4)], _opts(False)), NboxWork)
        pg.shutdown()
    finally:
        devicecall.register_factory("cpu", None)


@pytest.mark.integration
def test_ddp_s_reducer_gets_held_works_on_the_groups_stream_and_trains_as_the_real_ranks_do() -> None:
    """DDP's C++ reducer (allreduce with its default asyncOp, then get_future()) on one real rank of 4, its calls held
    on the fake device (tests/device_hold_ddp_worker.py): every bucket held on the group's stream and released at its
    deadline, the gradients those of the real rank alone (the mirror rule), one record per hold."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "NBOX_WORLD_SIZE": "4", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(root / "tests" / "device_hold_ddp_worker.py")], capture_output=True,
                          text=True, env=env, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["world"] == 4 and got["grads_match"]
    assert got["holds"] >= 4 and got["released"] == got["holds"] == got["records"]
    assert got["held_streams"] == ["s1"]  # the group's own stream, never the current one (asyncOp=True)


def test_the_device_hold_setting_is_validated() -> None:
    assert EmulationConfig.from_env(1, {}).device_hold == "auto"
    assert EmulationConfig.from_env(1, {"NBOX_DEVICE_HOLD": "OFF"}).device_hold == "off"
    with pytest.raises(EmulationConfigError, match="NBOX_DEVICE_HOLD: must be one of auto, on, off, got 'maybe'"):
        EmulationConfig.from_env(1, {"NBOX_DEVICE_HOLD": "maybe"})


def test_the_cuda_module_is_the_only_one_that_names_cuda_streams() -> None:
    """The kernels' source is plain CUDA C the torch wheel's NVRTC compiles: %globaltimer, the slot's words, a
    device-side timeout and an abort word (checked as text here; compiled and run only on a GPU)."""
    from emulator_core.device import _cuda as _cuda_hold

    src = _cuda_hold.KERNELS
    assert "%%globaltimer" in src and "timeout_ns" in src and "slot[2] != 0" in src
    assert 'extern "C" __global__ void nbox_hold' in src and 'extern "C" __global__ void nbox_clock' in src
