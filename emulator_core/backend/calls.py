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
from emulator_core.pricing import FabricGroup

__all__ = ["MAX_RECORDS", "Answerable", "GroupState", "OpRecord", "Pending", "in_issue_order", "post_exchange",
           "start_exchange"]

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


def post_exchange(g: GroupState, ref_issue_ns: int) -> tuple[torch.Tensor, Any]:
    """Start the real members' arrival-time exchange of one call on the group's inner gloo group: (the tensor the
    arrivals land in, reference-timeline nanoseconds by inner position; the work to wait on)."""
    arrivals = torch.empty(g.layout.n, dtype=torch.int64)
    return arrivals, g.inner._allgather_base(arrivals, torch.tensor([ref_issue_ns], dtype=torch.int64))


def start_exchange(g: GroupState, item: Pending) -> None:
    """Start a deferred arrival exchange (``item.ts`` None); a failure fails the call's work (``item.ts`` stays
    None: the resolver then skips it)."""
    if item.ts is not None or item.ts_work is not None:
        return
    try:
        item.ts, item.ts_work = post_exchange(g, item.ref_issue_ns)
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
