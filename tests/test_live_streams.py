"""The CUDA live replay's walk on recorded streams (nbox_replay.live.streams; issue 49 item 3), against the
pure-Python fake device: no GPU, no rank launched."""

from __future__ import annotations

from typing import Any

import pytest

from emulator_core.device.fake import FakeDevice, FakeStream
from emulator_core.device.hold import ClockOffset, DeviceHoldWork, HoldEngine
from nbox_replay.inputs import COLLECTIVE, COMPUTE, CommInfo, RankGraph
from nbox_replay.live.streams import StreamWalk, not_fallbacks, plan_streams

H = "thread:1"


def _graph(nodes: list[tuple[int, str, tuple[int, ...], float]], blocking: tuple[int, ...] = ()) -> RankGraph:
    """(kind, resource, deps, duration_us) per node; comm nodes are all-reduces (``blocking``: synchronous)."""
    g = RankGraph(0, "<streams>")
    for i, (kind, res, deps, dur) in enumerate(nodes):
        if res not in g.resources:
            g.resources.append(res)
        g.ids.append(i)
        g.names.append(f"n{i}")
        g.kind.append(kind)
        g.duration_us.append(dur)
        g.resource.append(g.resources.index(res))
        g.deps.append(deps)
        g.iteration.append(0)
        if kind == COLLECTIVE:
            g.comm[i] = CommInfo("all_reduce", 1024, "", blocking=i in blocking)
    return g


def _fsdp_like() -> RankGraph:
    """A copy-in on a side stream (20), the all-gather after it on NCCL's (30), compute on the main stream (7)
    that waits for the all-gather (a synchronous collective) and, through a kernel, for the copy-in."""
    return _graph([
        (COMPUTE, H, (), 5.0),                   # 0 copy-in op, launches 1 on the side stream
        (COMPUTE, "stream:20", (0,), 10.0),      # 1
        (COLLECTIVE, "stream:30", (0, 1), 50.0),  # 2 the all-gather: after the copy-in's kernel
        (COMPUTE, H, (0,), 5.0),                 # 3 launches 4 on the main stream
        (COMPUTE, "stream:7", (3, 2), 100.0),    # 4 waits for the all-gather
        (COMPUTE, H, (3,), 5.0),                 # 5 launches 6
        (COMPUTE, "stream:7", (5, 4, 1), 100.0),  # 6 same stream as 4; across streams after 1
        (COMPUTE, H, (5,), 5.0),                 # 7 launches 8
        (COMPUTE, "stream:7", (7, 6), 100.0),    # 8
    ])


def test_the_plan_puts_operators_on_their_recorded_streams_and_only_cross_stream_orders_on_events() -> None:
    p = plan_streams(_fsdp_like())
    assert p.main_stream == 7 and p.lane_streams == [20]  # the busiest compute stream is the current one
    assert p.device_node == [False, True, False, False, True, False, True, False, True]
    assert [p.lane[i] for i in (0, 3, 5, 7)] == [0, -1, -1, -1]
    assert p.lane[2] == 0  # the collective is issued on its producer's lane (the copy-in's)
    assert p.comm_waits[3] == (2,)  # the main-stream kernel that needs the all-gather: its launcher waits on it
    assert p.event_waits[5] == (0,) and p.record[0]  # a kernel after the side stream's: an event, recorded after 0
    assert p.event_waits[7] == () and p.event_waits[3] == ()  # same stream or host order: nothing
    assert p.event_waits[2] == ()  # its producer is on its own lane
    assert p.device_us[0] == 10.0 and p.device_us[3] == 100.0


def test_gpu_ops_are_not_counted_as_fallbacks_on_the_streams() -> None:
    from collections import Counter

    g = _fsdp_like()
    g.names[4] = g.names[6] = g.names[8] = "gemm_kernel"
    g.names[7] = "fsdp::copy"
    reasons = {1: "no op_schema", 4: "no op_schema", 6: "no op_schema", 7: "not an aten operator", 8: "no op_schema"}
    fallbacks = Counter({"n1": 1, "gemm_kernel": 3, "fsdp::copy": 1})
    not_fallbacks(plan_streams(g), g.names, reasons, fallbacks)
    assert reasons == {7: "not an aten operator"} and fallbacks == Counter({"fsdp::copy": 1})


class _Runner:
    """The worker's part, on the fake device: a live operator launches a stand-in kernel on the current stream, a
    collective is held on NCCL's stream the way the backend's device path holds it."""

    def __init__(self, dev: FakeDevice, g: RankGraph, step_ns: int = 1_000) -> None:
        self.dev, self.g = dev, g
        self.now = 0
        self.step_ns = step_ns
        self.log: list[str] = []
        clock = ClockOffset(dev, host_now_ns=lambda: dev.now_ns, samples=2)
        clock.measure()
        self.engine = HoldEngine(dev, clock, 10**12)
        self.works: dict[int, DeviceHoldWork] = {}

    def clock(self) -> int:
        return self.now

    def at(self, i: int) -> None:
        pass

    def launch(self, i: int) -> int:
        self.now += self.step_ns
        self.dev.current_stream().launch(f"n{i}")
        self.log.append(f"launch {i}")
        return self.step_ns

    def issue(self, i: int) -> Any:
        work, _ = self.engine.enqueue(True, self.dev.stream("nccl"))
        self.works[i] = work
        self.log.append(f"issue {i}")
        return work

    def wait(self, work: Any, i: int) -> int:
        work.wait()
        self.log.append(f"wait {i}")
        return 0

    def idle(self, ns: int) -> None:
        self.now += ns
        self.log.append(f"idle {ns}")


def _current(dev: FakeDevice) -> FakeStream:
    return dev.current_stream()


def test_a_repetition_orders_streams_by_events_and_never_waits_for_the_device_on_the_host() -> None:
    g = _fsdp_like()
    dev = FakeDevice()
    walk = StreamWalk(g, plan_streams(g), dev)
    runner = _Runner(dev, g)
    walk.repetition(runner)  # returns with the all-gather still held: nothing waited for the device on the host
    ag = runner.works[2]
    assert not ag.is_completed() and dev.ran == []
    side = walk.lanes.streams[0]
    assert isinstance(side, FakeStream) and side.name != "default"
    dev.advance(0)
    assert dev.ran == [f"{side.name}:n0"]  # the main stream waits for the all-gather's hold
    ag.hold.release_at(dev.now_ns + 10)
    dev.advance(10)
    assert dev.ran == [f"{side.name}:n0", "nccl:hold", "default:n3", "default:n5", "default:n7"]
    main_ops = [op.kind for op in _current(dev).ops]
    assert main_ops == []
    # what was enqueued where: the main stream waited twice (the hold's end, the copy-in's event), no more
    assert runner.log == ["launch 0", "issue 2", "wait 2", "launch 3", "launch 5", "launch 7"]


def test_the_collective_is_ordered_after_its_producer_on_another_stream() -> None:
    g = _fsdp_like()
    dev = FakeDevice()
    walk = StreamWalk(g, plan_streams(g), dev)
    runner = _Runner(dev, g)
    nccl = dev.stream("nccl")
    walk.repetition(runner)
    assert [op.kind for op in nccl.ops][:2] == ["wait", "hold"]  # NCCL's stream waits on the issuing lane first
    side = walk.lanes.streams[0]
    assert isinstance(side, FakeStream)
    assert [op.kind for op in side.ops] == ["work", "record", "record"]  # the copy-in, its event, the issue's event
    main = [op.kind for op in _current(dev).ops]
    assert main == ["wait", "work", "wait", "work", "work"]  # hold end, n3, copy-in's event, n5, n7


def test_serialize_waits_every_outstanding_collective_before_the_next_operator() -> None:
    g = _graph([(COMPUTE, H, (), 5.0), (COLLECTIVE, H, (0,), 5.0), (COMPUTE, H, (0,), 5.0)])
    logs = []
    for serialize in (False, True):
        dev = FakeDevice()
        runner = _Runner(dev, g)
        StreamWalk(g, plan_streams(g), dev, serialize=serialize).repetition(runner)
        logs.append(runner.log)
    assert logs[0] == ["launch 0", "issue 1", "launch 2", "wait 1"]  # overlapped, waited at the end
    assert logs[1] == ["launch 0", "issue 1", "wait 1", "launch 2"]


def test_the_host_pad_waits_on_the_host_before_the_next_launch() -> None:
    g = _fsdp_like()
    dev = FakeDevice()
    walk = StreamWalk(g, plan_streams(g), dev)
    runner = _Runner(dev, g, step_ns=1_000)
    walk.clock = runner.clock
    walk.pad = 1.5
    out = walk.repetition(runner)
    # each live launch owes half its host time, paid before the next launch or issue, the last one at the end
    assert runner.log == ["launch 0", "idle 500", "issue 2", "wait 2", "launch 3", "idle 500", "launch 5", "idle 500",
                          "launch 7", "idle 500"]
    assert out.pad_ns == 2_000 and out.compute_ns == 4_000
    assert all(op.kind != "work" or op.label.startswith("n") for s in dev.streams.values() for op in s.ops)
    unpadded = _Runner(FakeDevice(), g)
    StreamWalk(g, plan_streams(g), unpadded.dev).repetition(unpadded)
    assert not any(x.startswith("idle") for x in unpadded.log)


def test_a_blocking_collective_is_waited_at_once_and_a_fallback_owes_no_pad() -> None:
    g = _graph([(COMPUTE, H, (), 5.0), (COMPUTE, "stream:7", (0,), 10.0), (COLLECTIVE, H, (0,), 5.0),
                (COMPUTE, H, (2,), 5.0)], blocking=(2,))
    p = plan_streams(g)
    assert p.lane == [-1, -1, -1, -1] and p.comm_waits[3] == (2,)
    dev = FakeDevice()
    runner = _Runner(dev, g)

    def fall_back(i: int) -> int:
        runner.log.append(f"fallback {i}")
        return 0

    runner.launch = fall_back  # type: ignore[method-assign]
    walk = StreamWalk(g, p, dev)
    walk.pad = 2.0
    walk.repetition(runner)
    assert runner.log == ["fallback 0", "issue 2", "wait 2", "fallback 3"]


@pytest.mark.parametrize("deps", [(0,), ()])
def test_a_cpu_trace_has_no_lanes(deps: tuple[int, ...]) -> None:
    g = _graph([(COMPUTE, H, (), 5.0), (COLLECTIVE, H, deps, 5.0), (COMPUTE, H, (1,), 5.0)])
    p = plan_streams(g)
    assert p.main_stream is None and p.lane_streams == [] and set(p.lane) == {-1}
    assert not any(p.device_node) and not any(p.record) and p.comm_waits[2] == (1,)


class _Ops:
    """LiveOps' part the walk uses: node 7 falls back, the others launch a stand-in kernel on the current stream."""

    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev
        self.release: dict[int, list[int]] = {0: [1]}
        self.pool = type("Pool", (), {"tensors": {1: object()}})()

    def run(self, i: int) -> bool:
        if i == 7:
            return False
        self.dev.current_stream().launch(f"n{i}")
        return True


def test_the_worker_walks_its_first_repetition_on_one_stream_then_on_the_recorded_ones() -> None:
    """The worker as the walk's Runner (nbox_replay.live._worker): launches, fallbacks with their GPU ops' recorded
    time, the collective issued and ordered, spans and captured iterations, the pad as host waits."""
    from emulator_core.backend.clocksync import Clock
    from nbox_replay.inputs import captured_iterations
    from nbox_replay.live._worker import Replayer

    g = _fsdp_like()
    g.iteration[:] = [1] * 5 + [2] * 4
    dev = FakeDevice()
    r = Replayer.__new__(Replayer)  # no process group: the parts the streams' walk uses
    engine = _Runner(dev, g).engine
    r.g, r.factor, r.pad, r.cuda, r.catch_up, r.clock = g, 1.0, 1.0, False, False, Clock()
    r.ops = _Ops(dev)  # type: ignore[assignment]

    class Held:  # the backend's HeldWork as the worker sees it: a wait that orders, the hold it carries
        def __init__(self) -> None:
            self.held = engine.enqueue(True, dev.stream("nccl"))[0]

        def wait(self, timeout: object = None) -> bool:
            return self.held.wait()

    r.issues = {2: Held}
    syncs: list[int] = []
    r._sync = lambda: syncs.append(r.node)  # type: ignore[method-assign]
    r.records, r.walked, r.node, r.host_held = [], 0, -1, None
    r.live_ns = r.fallback_ns = r.wait_cpu_ns = r.wait_host_ns = r.caught_up_ns = 0
    r.iteration_of, r.captured, _ = captured_iterations(g)
    r.timeout = None  # type: ignore[assignment]
    r.walk = StreamWalk(g, plan_streams(g), dev, clock=r._now)
    side = r.walk.lanes.streams[0]
    assert isinstance(side, FakeStream)
    wall, compute, waited = r.repetition()
    assert side.ops == [] and [op.label for op in _current(dev).ops if op.kind == "work"] == ["n0", "n3", "n5"]
    assert r.fallback_ns >= (5 + 100) * 1000  # node 7 and its kernel's recorded time, waited on the host
    assert len(r.compute_spans) == 4 and len(r.iteration_ends) == 2 == r.captured
    assert r.iteration_ends[0] <= r.iteration_ends[1] == wall and compute <= wall and waited >= 0
    # no synchronize but the repetition's last, and one before the first collective (is it held on the host?)
    assert syncs == [2, -1] and r.host_held is False
    r.pad, host0, live0 = 3.0, r.wait_host_ns, r.live_ns
    r.repetition()
    assert [op.label for op in side.ops if op.kind == "work"] == ["n0"]  # the copy-in on its own stream now
    # the pad: host waits of (3 - 1) x each launch's host time, beside the fallback's
    assert r.walked == 2 and r.wait_host_ns - host0 >= 2 * (r.live_ns - live0) + (5 + 100) * 1000
    assert syncs == [2, -1, -1]  # the device hold is known now: nothing before the collective
    r.issues = {2: lambda: NotHeld()}

    class NotHeld:  # the host hold: it arrives at its issue, so the device must have reached it first
        def wait(self, timeout: object = None) -> bool:
            return True

    r.repetition()
    r.repetition()
    assert r.host_held is True and syncs[3:] == [-1, 2, -1]
