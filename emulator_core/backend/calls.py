"""One nbox process group's calls in flight: the answered-call record, a pending call, the group's shared state,
and the order its resolver thread takes them in (:mod:`emulator_core.backend`).

A call on a group with other real members is answered on the group's resolver thread once the real members'
arrival times are in. With timing only (``NBOX_MOVE_DATA=0``, the live replay) the caller only takes its issue time
and queues the call: the resolver starts its arrival exchange (:func:`start_exchange`), and before it waits on the
oldest call it starts the exchange of every call already queued (:func:`in_issue_order`), so that their exchanges
overlap as when the caller started them, and the group's inner gloo group carries collectives from one thread in
issue order. A call held on the device (:mod:`emulator_core.backend.devicecall`) arrives when the device reaches it,
so the resolver starts its exchange only once the device has stamped it. Why the resolver, not the caller, starts
the exchange: docs/design/emulated-world.md.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

from emulator_core.backend import mirror
from emulator_core.backend.delay import NboxWork
from emulator_core.pricing import ComputeBetween, FabricGroup

__all__ = ["MAX_RECORDS", "Answerable", "GroupState", "OpRecord", "Pending", "arrivals_of", "in_issue_order",
           "member_compute", "post_exchange", "start_exchange"]

#: Records kept per process group (older ones are dropped and counted).
MAX_RECORDS = 1 << 20


class OpRecord(NamedTuple):
    """One answered call. Times in microseconds on the rank's own timeline: ``time.perf_counter_ns()/1000`` less
    the clock's lag (:mod:`emulator_core.backend.clocksync`; no lag outside a live replay's
    ``replay.host_work=match``)."""

    call: str
    collective: str
    nbytes: float
    issue_us: float
    start_us: float
    end_us: float
    algorithm: str
    real_done_us: float

    @property
    def overrun_us(self) -> float:
        """How much later than modeled the real communication finished (0 when in time)."""
        return max(0.0, self.real_done_us - self.end_us)


class Answerable(Protocol):
    """What the resolver does to a call's work: :class:`NboxWork`, or a device-held one
    (:class:`emulator_core.backend.devicecall.HeldWork`)."""

    def resolve(self, deadline_ns: int) -> None: ...
    def fail(self, error: BaseException) -> None: ...


@dataclass
class Pending:
    """One call waiting for its answer on the group's resolver."""

    call: str
    work: NboxWork | Answerable
    ts_work: Any  # the real members' arrival-time exchange; None for point-to-point (own arrival only)
    ts: torch.Tensor | None  # None: the exchange is the resolver's to start (timing only: :func:`start_exchange`)
    works: list[Any]
    finish: Callable[[], None] | None
    collective: str
    nbytes: float
    issue_us: float
    pricing: Mapping[str, Any] | None = None
    ref_issue_ns: int = 0  # the issue time on the reference timeline (what a deferred exchange sends)
    held: bool = False  # held on the device: its arrival (so its exchange) waits for the device's stamp
    busy_ns: int = -1  # the issuing thread's time on or waiting for a CPU at the issue; -1: not read


@dataclass
class GroupState:
    """The state shared by one process group's calls: layout, fabric group, real backend, resolver."""

    layout: mirror.Layout
    fabric_group: FabricGroup
    inner: Any
    exchange: bool = True  # exchange arrival times among the real members (collectives, not p2p)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: queue.SimpleQueue[Pending | None] = field(default_factory=queue.SimpleQueue)
    resolver: threading.Thread | None = None
    stream: Any = None  # the group's own device stream, as NCCL's per group (emulator_core.backend.devicecall)
    busy_prev: list[tuple[float, float]] | None = None  # per real member: its previous (arrival, busy) in us


def post_exchange(g: GroupState, ref_issue_ns: int, busy_ns: int = -1) -> tuple[torch.Tensor, Any]:
    """Start the real members' arrival-time exchange of one call on the group's inner gloo group: (the tensor the
    arrivals land in, by inner position two int64 each: the reference-timeline issue in ns and the issuing
    thread's busy time in ns or -1 (:func:`member_compute`); the work to wait on)."""
    arrivals = torch.empty(2 * g.layout.n, dtype=torch.int64)
    return arrivals, g.inner._allgather_base(arrivals, torch.tensor([ref_issue_ns, busy_ns], dtype=torch.int64))


def arrivals_of(g: GroupState, values: list[int]) -> tuple[list[float], ComputeBetween | None]:
    """A call's exchanged values (:func:`post_exchange`'s pairs, or one issue time per member where no busy time
    was exchanged) as ``(arrivals in us, the members' compute for Fabric.answer or None)``."""
    n = len(g.fabric_group.real_positions)
    if len(values) != 2 * n:
        g.busy_prev = None
        return [v / 1000.0 for v in values], None
    arrivals = [v / 1000.0 for v in values[0::2]]
    busy = values[1::2]
    if any(b < 0 for b in busy):
        g.busy_prev = None
        return arrivals, None
    return arrivals, member_compute(g, arrivals, [b / 1000.0 for b in busy])


def member_compute(g: GroupState, arrivals_us: list[float], busy_us: list[float]) -> ComputeBetween | None:
    """Each real member's compute for :meth:`Fabric.answer` (``compute_us``), from the issuing thread's time on
    or waiting for a CPU at this call and at the group's previous one (``busy_us``: a node's CPU thread is busy
    when it computes, blocked when it waits for a collective): between a member's two arrivals its busy time is
    taken as spread evenly; a window before its previous arrival counts whole (the arrival rule). None at the
    group's first call. Every real member computes the same from the same exchanged values. CPU nodes only: the
    calls are read only where the calibration slows a call beside compute (``Fabric.slowed_beside_compute``)."""
    prev, g.busy_prev = g.busy_prev, list(zip(arrivals_us, busy_us, strict=True))
    if prev is None or len(prev) != len(arrivals_us):
        return None
    now = g.busy_prev

    def compute_us(k: int, t0: float, t1: float) -> float:
        (a0, b0), (a1, b1) = prev[k], now[k]
        before = max(0.0, min(t1, a0) - t0)
        inside = max(0.0, min(t1, a1) - max(t0, a0))
        span = a1 - a0
        share = max(0.0, min(1.0, (b1 - b0) / span)) if span > 0 else 1.0
        return before + inside * share

    return compute_us


def start_exchange(g: GroupState, item: Pending) -> None:
    """Start a deferred arrival exchange (``item.ts`` None); a failure fails the call's work (``item.ts`` stays
    None: the resolver then skips it)."""
    if item.ts is not None or item.ts_work is not None:
        return
    try:
        item.ts, item.ts_work = post_exchange(g, item.ref_issue_ns, item.busy_ns)
    except BaseException as err:  # handed to the script's wait(), never swallowed
        item.work.fail(err)


def in_issue_order(g: GroupState) -> Iterator[Pending]:
    """The group's calls in issue order until the queue's ``None``; each call's deferred exchange, and that of every
    call queued behind it so far, is started before the call is yielded (module docstring)."""
    ready: collections.deque[Pending] = collections.deque()
    stopping = False
    while True:
        if not ready:
            if stopping:
                return
            first = g.pending.get()
            if first is None:
                return
            if not first.held:
                start_exchange(g, first)
            ready.append(first)
        while not stopping:
            try:
                more = g.pending.get_nowait()
            except queue.Empty:
                break
            if more is None:
                stopping = True
            else:
                if not more.held:
                    start_exchange(g, more)
                ready.append(more)
        yield ready.popleft()
