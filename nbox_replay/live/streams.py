"""A CUDA live replay's walk: each recorded operator on its recorded stream, ordered by events, not by the host.

What the recording says (:mod:`nbox_record.convert.deps`, ``nbox_stream``): each GPU op is a compute node on
``stream:<n>`` that depends on the host operator that launched it, on the previous op of its stream and, across
streams, on a synchronous collective before it; a collective with a kernel sits on NCCL's stream after the last GPU
op launched before it; a host operator that synchronized depends on the last GPU op of every stream.
:class:`StreamPlan` reads that once per rank:

* a **device node** (a GPU op) is not run, nor counted as a fallback: its host operator re-launches it;
* a host operator's **lane** is the recorded stream of the first GPU op it launched: the busiest recorded compute
  stream (NCCL's left out) is the replay's current stream, every other one a stream of its own (:class:`Lanes`); an
  operator that launched nothing runs on the current stream;
* a **cross-lane dependency** becomes an event recorded on the producer's lane after it ran and waited on by the
  consumer's lane (``wait_event``, never a host synchronize); within a lane the stream orders it;
* a dependency on a **collective** waits on its work with the operator's lane current (a device hold orders the lane
  after the hold, :mod:`emulator_core.backend.devicecall`; a host hold blocks until the modeled end);
* a **collective** is issued asynchronously with the lane of its latest producer current, after that lane waited on
  its producers' events on other lanes.

:class:`StreamWalk` plays one repetition against the :class:`Streams` protocol, which the CUDA objects
(:mod:`nbox_replay.live.cudalanes`) and the fake device (:mod:`emulator_core.device.fake`) both satisfy. The host
synchronizes only where an operator does (``aten::item``), for an operator stretched by a compute factor above 1
(its device time is measured), before a call held on the host, and once at the end. The host-work pad
(:mod:`nbox_replay.live.hostwork`) is a wait on the host before the next launch or collective: ``(factor - 1) x``
each live operator's launch time. Why the walk is built so: docs/design/live-replay.md.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from nbox_replay.inputs import COLLECTIVE, COMPUTE, RECV, RankGraph

__all__ = ["Event", "Lanes", "Runner", "Stream", "StreamPlan", "StreamWalk", "Streams", "WalkResult", "not_fallbacks",
           "plan_streams"]


class Event(Protocol):
    def query(self) -> bool: ...


class Stream(Protocol):
    def record_event(self) -> Event: ...
    def wait_event(self, event: Event) -> None: ...


class Streams(Protocol):
    """The device's streams as the walk uses them (``torch.cuda`` through :mod:`nbox_replay.live.cudalanes`, or the
    fake device)."""

    def current_stream(self) -> Stream: ...
    def new_stream(self) -> Stream: ...
    def use_stream(self, stream: Stream) -> ContextManager[None]: ...


def _stream_id(resource: str) -> int | None:
    if not resource.startswith("stream:"):
        return None
    try:
        return int(resource[7:])
    except ValueError:
        return None


@dataclass(frozen=True)
class StreamPlan:
    """Where each node of one rank goes on the device (module docstring). Per graph position:

    Attributes:
        device_node: a GPU op, launched by its host operator (not run by the walk).
        owner: a device node's launching host operator (-1: none known), else the node itself.
        lane: the lane a host operator or a collective is issued on (-1: the current stream).
        event_waits: the operators (on other lanes) whose events this node's lane waits on first.
        comm_waits: the collectives whose works this node waits on first (with its lane current).
        record: record an event after this operator (a node of another lane waits on it).
        device_us: a host operator's GPU ops' recorded time (what a fallback waits beside its own).
        lane_streams: the recorded stream each lane plays (lane k plays ``lane_streams[k]``).
        main_stream: the recorded stream the current stream plays (None: no GPU op in the trace).
    """

    device_node: list[bool]
    owner: list[int]
    lane: list[int]
    event_waits: list[tuple[int, ...]]
    comm_waits: list[tuple[int, ...]]
    record: list[bool]
    device_us: list[float]
    lane_streams: list[int]
    main_stream: int | None


def plan_streams(g: RankGraph) -> StreamPlan:
    """The :class:`StreamPlan` of one rank's graph (module docstring)."""
    n = len(g)
    stream_of_res = [_stream_id(r) for r in g.resources]
    node_stream = [stream_of_res[g.resource[i]] if g.resource else None for i in range(n)]
    is_comm = [COLLECTIVE <= g.kind[i] <= RECV for i in range(n)]
    device_node = [g.kind[i] == COMPUTE and node_stream[i] is not None for i in range(n)]
    host_op = [g.kind[i] == COMPUTE and not device_node[i] for i in range(n)]
    owner = list(range(n))
    launched: dict[int, list[int]] = {}
    comm_streams = {node_stream[i] for i in range(n) if is_comm[i] and node_stream[i] is not None}
    busy: dict[int, float] = {}
    for i in range(n):
        if not device_node[i]:
            continue
        hosts = [d for d in g.deps[i] if d < i and host_op[d]]
        owner[i] = max(hosts) if hosts else -1
        if owner[i] >= 0:
            launched.setdefault(owner[i], []).append(i)
        s = node_stream[i]
        assert s is not None
        if s not in comm_streams:
            busy[s] = busy.get(s, 0.0) + g.duration_us[i]
    main = max(sorted(busy), key=lambda s: busy[s]) if busy else None
    lane_streams: list[int] = []
    lane = [-1] * n
    device_us = [0.0] * n
    for i, kids in launched.items():
        s = node_stream[kids[0]]
        device_us[i] = sum(g.duration_us[k] for k in kids)
        if s is not None and s != main:
            if s not in lane_streams:
                lane_streams.append(s)
            lane[i] = lane_streams.index(s)
    for i in range(n):
        if device_node[i] and owner[i] >= 0:
            lane[i] = lane[owner[i]]
    event_waits: list[tuple[int, ...]] = [()] * n
    comm_waits: list[tuple[int, ...]] = [()] * n
    record = [False] * n
    for i in range(n):
        if not (host_op[i] or is_comm[i]):
            continue
        # the node's own dependencies and those of the GPU ops it launched, on earlier nodes only
        deps = [(d, i) for d in g.deps[i]] + [(d, k) for k in launched.get(i, ()) for d in g.deps[k]]
        producers: list[int] = []  # (collectives) the operators it was recorded after, device ones last
        gpu_producers: list[int] = []
        ev: list[int] = []
        cw: list[int] = []
        for d, via in deps:
            if d >= i or d in launched.get(i, ()):
                continue
            if is_comm[d]:
                if not is_comm[i]:  # a group orders its own collectives
                    cw.append(d)
                continue
            o = owner[d]
            if o < 0 or o == i:
                continue
            if is_comm[i]:
                (gpu_producers if device_node[d] else producers).append(o)
            elif device_node[d] or device_node[via]:  # a device-level order: host program order adds nothing
                ev.append(o)
        if is_comm[i]:
            ps = gpu_producers or producers
            if ps:
                lane[i] = lane[max(ps)]
            ev = gpu_producers
        mine = lane[i]
        ev = sorted({o for o in ev if lane[o] != mine})
        for o in ev:
            record[o] = True
        event_waits[i] = tuple(ev)
        comm_waits[i] = tuple(sorted(set(cw)))
    return StreamPlan(device_node, owner, lane, event_waits, comm_waits, record, device_us, lane_streams, main)


def not_fallbacks(plan: StreamPlan, names: Sequence[str], reasons: dict[int, str], fallbacks: Counter[str]) -> None:
    """Take the plan's device nodes out of a rank's fallbacks (``LiveOps.reasons`` and ``.fallbacks``, in place):
    their operators re-launch them, so nothing falls back to a recorded duration for them."""
    gone = [i for i, d in enumerate(plan.device_node) if d and reasons.pop(i, None) is not None]
    fallbacks -= Counter(names[i] for i in gone)


class Lanes:
    """The streams a rank's lanes run on: the current stream for lane -1, a new stream for each other lane
    (made once), and the events recorded on them in the current repetition."""

    def __init__(self, device: Streams, count: int) -> None:
        self.device = device
        self.main = device.current_stream()
        self.streams = [device.new_stream() for _ in range(count)]
        self.events: dict[int, Event] = {}

    def stream(self, lane: int) -> Stream:
        return self.main if lane < 0 else self.streams[lane]

    @contextlib.contextmanager
    def on(self, lane: int, waits: Sequence[int]) -> Iterator[Stream]:
        """``lane``'s stream current, after it waited on the events of the nodes ``waits``."""
        s = self.stream(lane)
        for j in waits:
            ev = self.events.get(j)
            if ev is not None:  # not recorded: that operator did not run this repetition (it raised)
                s.wait_event(ev)
        with self.device.use_stream(s):
            yield s


class Runner(Protocol):
    """What the walk asks of the worker (or of a test)."""

    def at(self, i: int) -> None:
        """The walk reached node ``i`` (errors name it; captured iterations end here)."""
        ...

    def launch(self, i: int) -> int:
        """Run compute node ``i`` (live, or its fallback wait); the host time its live launch took, ns (0: it
        fell back)."""
        ...

    def issue(self, i: int) -> Any:
        """Issue comm node ``i`` on the current stream; its work (None: nothing to wait on)."""
        ...

    def wait(self, work: Any, i: int) -> int:
        """Wait on comm node ``i``'s work with the current stream (ordering it, or blocking on the host hold); the
        host time it took, ns."""
        ...

    def idle(self, ns: int) -> None:
        """Wait ``ns`` on the host (the host-work pad)."""
        ...


@dataclass
class WalkResult:
    """One repetition's host-side figures (nanoseconds) and compute spans (``[start, end]`` on the walk's clock)."""

    compute_ns: int = 0
    wait_ns: int = 0
    pad_ns: int = 0
    compute: list[list[int]] = field(default_factory=list)


class StreamWalk:
    """One rank's repetitions on its lanes (module docstring). ``pad``: the host-work factor (1: none; see
    :mod:`nbox_replay.live.hostwork`); ``serialize``: every outstanding collective is waited on before the next
    operator (the scenario's ``overlap = "serialize"``)."""

    def __init__(self, g: RankGraph, plan: StreamPlan, device: Streams, serialize: bool = False,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.g, self.plan = g, plan
        self.lanes = Lanes(device, len(plan.lane_streams))
        self.serialize = serialize
        self.clock = clock
        self.pad = 1.0

    def repetition(self, runner: Runner, one_stream: bool = False) -> WalkResult:
        """Walk the graph once, issuing everything; the caller synchronizes the device after it. ``one_stream``:
        every node on the current stream (a worker's first repetition, which makes the tensors its operators keep:
        made in stream order, none is read on another stream before it is filled)."""
        g, p, lanes, clock = self.g, self.plan, self.lanes, self.clock
        lanes.events.clear()
        works: dict[int, Any] = {}
        waited: set[tuple[int, int]] = set()  # (collective, lane): already ordered
        out = WalkResult()
        owed = 0  # host-work pad owed, paid before the next launch
        for i in range(len(g)):
            runner.at(i)
            k = g.kind[i]
            if p.device_node[i] or not (k == COMPUTE or COLLECTIVE <= k <= RECV):
                continue
            lane = -1 if one_stream else p.lane[i]
            comm_waits = list(works) if self.serialize and k == COMPUTE else p.comm_waits[i]
            if owed:
                t0 = clock()
                runner.idle(owed)
                out.pad_ns += clock() - t0
                owed = 0
            with lanes.on(lane, () if one_stream else p.event_waits[i]):
                for c in comm_waits:
                    w = works.get(c)
                    if w is not None and (c, lane) not in waited:
                        waited.add((c, lane))
                        out.wait_ns += runner.wait(w, c)
                if k == COMPUTE:
                    t0 = clock()
                    took = runner.launch(i)
                    t1 = clock()
                    out.compute_ns += t1 - t0
                    out.compute.append([t0, t1])
                    if p.record[i] and not one_stream:
                        lanes.events[i] = lanes.stream(lane).record_event()
                    if self.pad > 1.0 and took > 0:
                        owed = int(took * (self.pad - 1.0))
                    continue
                work = runner.issue(i)
                if work is not None:
                    if g.comm[i].blocking:
                        out.wait_ns += runner.wait(work, i)
                    else:
                        works[i] = work
        if owed:
            t0 = clock()
            runner.idle(owed)
            out.pad_ns += clock() - t0
        with lanes.on(-1, ()):  # the rest, on the current stream (the caller synchronizes after)
            for c, w in works.items():
                if (c, -1) not in waited:
                    out.wait_ns += runner.wait(w, c)
        return out
