"""The ``nbox`` torch.distributed backend: a world of W ranks played by N >= 1 real processes.

``init_process_group(backend="nbox")`` (registered when torch is imported, through the ``torch.backends`` entry point,
:mod:`emulator_core._autoload`), launched like any torch.distributed job with N processes. The emulated world comes
from the environment (:class:`EmulationConfig`):

=============================  ===========================================================================
``NBOX_WORLD_SIZE``            W, the world size the script sees (default: N, nothing emulated)
``NBOX_REAL_RANKS``            the global ranks of the real processes, comma-separated, in real-rank
                               order (default ``0,1,...,N-1``)
``NBOX_SCENARIO``              the what-if scenario TOML (default: the shipped ``loopback_cpu``)
``NBOX_SCENARIO_SET``          overrides, one ``key=value`` per line (as ``--set``)
``NBOX_SPIN_US``               how long before a deadline a waiting thread stops sleeping and spins (200)
``NBOX_MOVE_DATA``             1 (default): the real members' tensors move for real; 0: timing only, the
                               real members exchange arrival times and nothing else (``nbox replay --clock
                               real``, whose buffers carry no information)
``NBOX_DEVICE_HOLD``           ``auto`` (default): a call on CUDA tensors is held on the device where the hold
                               kernel builds, else on the host (said once); ``on``: refuse to run without it;
                               ``off``: the host hold everywhere
=============================  ===========================================================================

``get_world_size()`` is W and ``get_rank()`` the chosen global rank. Every collective is priced by
:class:`emulator_core.pricing.answer.Fabric` from the real members' arrival times, and its work completes at the
modeled time (:mod:`emulator_core.backend.delay`), or when the real communication does if that is later (the overrun
is recorded in :attr:`NboxProcessGroup.records`). Data moves among the real members (gloo on CPU, NCCL on CUDA) and
emulated members mirror real ones (:mod:`emulator_core.backend.mirror`). With ``NBOX_MOVE_DATA=0`` no tensor moves:
members exchange arrival times (a send carries its issue time to the receiver), the group's resolver thread starts
each exchange (:mod:`emulator_core.backend.calls`), and the work completes at the modeled time whatever the real
network's speed. On CUDA a call with tensors is held on the device, on the stream NCCL would use
(:mod:`emulator_core.backend.devicecall`, :mod:`emulator_core.device.hold`); a barrier and a timing-only send or
receive keep the host hold. Times are microseconds. Why: docs/design/emulated-world.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from emulator_core.backend import devicecall, mirror
from emulator_core.backend.calls import (
    MAX_RECORDS,
    GroupState,
    OpRecord,
    Pending,
    arrivals_of,
    in_issue_order,
    post_exchange,
)
from emulator_core.backend.clocksync import Clock, deliberate_skew_ns, host_key
from emulator_core.backend.delay import NboxWork, not_completed, run_finish
from emulator_core.backend.eager import never_compiled
from emulator_core.backend.emulation_config import EmulationConfig, EmulationConfigError
from emulator_core.backend.objectp2p import guard_recv_object_list
from emulator_core.pricing import Fabric
from nbox_trace.threadtime import thread_times_ns

__all__ = ["EmulationConfig", "EmulationConfigError", "NboxProcessGroup", "OpRecord", "Observer", "add_observer",
           "clock_report", "create_process_group", "process_clock", "remove_observer"]

def _nbytes(ts: Sequence[torch.Tensor]) -> int:
    return ts[0].nbytes if len(ts) == 1 else sum(t.nbytes for t in ts)


#: An observer of the collectives: ``fn(process_group, method, args)``, called on the calling thread just before
#: ``NboxProcessGroup.<method>(*args)`` runs (``method`` is the canonical name, also when an alias such as
#: ``_allgather_base`` was called). ``nbox emulate -o`` logs the collectives of its capture this way
#: (:mod:`nbox_record.capture.emulated_tap`): they reach this Python class straight from the C++ ``ProcessGroup``,
#: never through the dispatcher's ``c10d::<op>`` operators. An observer must not raise.
Observer = Callable[["NboxProcessGroup", str, tuple[Any, ...]], None]
_OBSERVERS: list[Observer] = []


def add_observer(fn: Observer) -> None:
    """Call ``fn`` with every collective and point-to-point call any process group issues from now on."""
    if fn not in _OBSERVERS:
        _OBSERVERS.append(fn)


def remove_observer(fn: Observer) -> None:
    """Stop calling ``fn`` (nothing happens when it is not registered)."""
    if fn in _OBSERVERS:
        _OBSERVERS.remove(fn)


def _observed(method: Callable[..., NboxWork]) -> Callable[..., NboxWork]:
    """``method`` announced to the observers first (see :data:`Observer`)."""
    name = method.__name__
    params = tuple(method.__code__.co_varnames[1:method.__code__.co_argcount])  # after self, in order

    def observed(self: NboxProcessGroup, *args: Any, **kwargs: Any) -> NboxWork:
        if _OBSERVERS:  # observers see every argument by position, however torch passed it (opts=...)
            full = args + tuple(kwargs.get(p) for p in params[len(args):]) if kwargs else args
            for fn in tuple(_OBSERVERS):
                fn(self, name, full)
        return method(self, *args, **kwargs)

    observed.__name__, observed.__qualname__, observed.__doc__ = name, method.__qualname__, method.__doc__
    return observed


class NboxProcessGroup(dist.ProcessGroup):
    """A process group whose size is the emulated group's; see the module docstring."""

    def __init__(self, config: EmulationConfig, fabric: Fabric, members: Sequence[int] | None, global_rank: int,
                 store: Any, timeout: timedelta, clock: Clock | None = None) -> None:
        size = config.world_size if members is None else len(members)
        me = global_rank if members is None else list(members).index(global_rank)
        super().__init__(me, size)  # type: ignore[call-arg]  # the (rank, size) overload exists at run time
        self.config = config
        self.fabric = fabric
        self.clock = clock if clock is not None else Clock()
        self.members = None if members is None else tuple(members)
        self.global_rank = global_rank
        self.timeout_s = min(timeout.total_seconds(), config.call_timeout_s)
        self._store = store
        real = [r for r in config.real_ranks if members is None or r in members]
        positions = sorted(real if members is None else [list(members).index(r) for r in real])
        self.layout = mirror.Layout(size, me, tuple(positions))
        self._group = GroupState(self.layout, fabric.group(members, real), self._make_inner(store, "main"))
        self._pairs: dict[int, GroupState] = {}
        self.records: list[OpRecord] = []
        self.dropped_records = 0
        self._coalescing: list[NboxWork] | None = None
        self._name = ""
        self._desc = ""
        #: timing only (a live replay): a collective on a device with a hold is held there too; decided once, so a
        #: process that can hold on no device pays nothing per call for it
        self._hold_timing = not config.move_data and config.device_hold != "off" and devicecall.may_hold()

    # -- identity ---------------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "nbox"

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return (f"NboxProcessGroup(rank {self.layout.me} of {self.layout.size}, real members "
                f"{list(self.layout.real_positions)[:8]}, name {self._name!r})")

    # -- plumbing ---------------------------------------------------------------------------------------
    def _make_inner(self, store: Any, tag: str) -> Any:
        lay = self.layout
        if lay.n == 1:
            return None
        prefixed = PrefixStore(f"nbox_inner/{tag}/", store)
        return ProcessGroupGloo(prefixed, lay.inner_index, lay.n, timedelta(seconds=self.timeout_s))

    def _local_us(self, reference_us: float) -> float:
        """A reference-timeline time on this rank's own timeline, microseconds (``perf_counter`` less the clock's
        lag: what records hold)."""
        return reference_us - self.clock.correction_ns / 1000.0

    def synchronize_clock(self) -> None:
        """Estimate this process's clock correction with the other real ranks (:mod:`emulator_core.backend.clocksync`);
        the default group calls it once, collectively, when created."""
        inner = self._group.inner
        if inner is None:
            return
        send, recv = _gloo_transport(inner, self.timeout_s)
        self.clock.synchronize(self.layout.inner_index, self.layout.n, send, recv, host_key(self.clock.skew_ns))

    def _record(self, rec: OpRecord) -> None:
        if len(self.records) >= MAX_RECORDS:
            del self.records[: MAX_RECORDS // 2]
            self.dropped_records += MAX_RECORDS // 2
        self.records.append(rec)

    def _call(self, call: str, collective: str, nbytes: float, result: list[torch.Tensor],
              real: Callable[[Any], mirror.Result], group: GroupState | None = None,
              pricing: Mapping[str, Any] | None = None, p2p: tuple[bool, int, int] | None = None,
              opts: Any = None) -> NboxWork:
        """Issue one call: start the real part, answer it (now, or on the resolver once arrivals are in); a call
        held on the device is answered on the resolver once the device reached it (:mod:`emulator_core.backend.calls`).

        ``p2p`` is (is it a send, the peer's group position, the tag) for a send or a receive."""
        g = group or self._group
        clock = self.clock
        t_issue_ns = time.perf_counter_ns()
        issue_us = clock.local_ns(t_issue_ns) / 1000.0  # records are on the rank's own timeline (its lag off)
        ref_issue_ns = clock.to_reference_ns(t_issue_ns)  # arrivals and answers live on the reference timeline

        def what() -> str:
            return f"{call} (rank {self.global_rank}, group {self._name or 'default'})"
        n_real = len(g.fabric_group.real_positions)
        busy_ns = self._busy_ns(g, collective, p2p)
        hold = self.config.move_data or (self._hold_timing and p2p is None)  # timing-only p2p: the host's (below)
        st = devicecall.device_state(result, self.config.device_hold) if hold else None
        if st is not None:
            held, works, finish = devicecall.enqueue(st, g, self.timeout_s, what, result,
                                                     real if self.config.move_data else devicecall.no_data,
                                                     devicecall.async_op(opts), clock)
            self._start_resolver(g)
            g.pending.put(Pending(call, held, None, None, works, finish, collective, nbytes, issue_us, pricing,
                                  ref_issue_ns, held=True))
            if self._coalescing is not None:
                self._coalescing.append(held)  # type: ignore[arg-type]  # a Work, as NboxWork is
            return held  # type: ignore[return-value]  # a Work, as NboxWork is (C++ sees only Work)
        if g.inner is None:
            if self.config.move_data:  # the mirror copies; timing only skips them (they would cost the rank CPU)
                with torch.no_grad():  # buffers only: a functional collective's output is a no_grad view
                    works, finish = real(None)
                run_finish(finish)
            with g.lock:
                arrivals_us, compute = arrivals_of(g, [ref_issue_ns, busy_ns] * n_real)
                ans = self.fabric.answer(g.fabric_group, collective, nbytes, arrivals_us, compute_us=compute,
                                         **(pricing or {}))
            done_us = clock.local_ns(time.perf_counter_ns()) / 1000.0
            start_us, end_us = self._local_us(ans.start_us), self._local_us(ans.end_us)
            self._record(OpRecord(call, collective, nbytes, issue_us, start_us, end_us, ans.algorithm, done_us))
            work = NboxWork(what, result, self.timeout_s, self.config.spin_ns, int(ans.end_us * 1000.0), clock)
        else:
            move = self.config.move_data
            arrivals: torch.Tensor | None
            if g.exchange and not move:
                arrivals, ts_work = None, None  # timing only: the resolver starts the exchange (calls.py)
            elif g.exchange:
                arrivals, ts_work = post_exchange(g, ref_issue_ns, busy_ns)
            else:
                arrivals, ts_work = torch.full((n_real,), ref_issue_ns, dtype=torch.int64), None
                if not move and p2p is not None:  # timing only: the send's issue time goes where its data would
                    is_send, peer, tag = p2p
                    inner_peer = g.layout.real_positions.index(peer)
                    ts_work = (g.inner.send([arrivals[:1].clone()], inner_peer, tag) if is_send else
                               g.inner.recv([arrivals[1:2]], inner_peer, tag))
            if move:
                with torch.no_grad():
                    works, finish = real(g.inner)
            else:
                works, finish = [], None
            work = NboxWork(what, result, self.timeout_s, self.config.spin_ns, clock=clock)
            if g.resolver is None:
                self._start_resolver(g)
            g.pending.put(Pending(call, work, ts_work, arrivals, works, finish, collective, nbytes, issue_us, pricing,
                                  ref_issue_ns, busy_ns=busy_ns))
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _busy_ns(self, g: GroupState, collective: str, p2p: tuple[bool, int, int] | None) -> int:
        """The issuing thread's time on or waiting for a CPU (ns, ``nbox_trace.threadtime``), read only where the
        calibration slows ``collective`` beside compute (a CPU node) and the call's arrivals are exchanged or its
        own: what the fabric's ``compute_us`` is made of (:func:`emulator_core.backend.calls.member_compute`);
        -1 elsewhere (the arrival rule)."""
        if p2p is not None or not (g.exchange or g.inner is None):
            return -1
        if not self.fabric.slowed_beside_compute(g.fabric_group, collective):
            return -1
        times = thread_times_ns()
        return -1 if times is None else times.on_cpu_ns + times.run_queue_ns

    def _start_resolver(self, g: GroupState) -> None:
        if g.resolver is None:
            g.resolver = threading.Thread(target=self._resolve_loop, args=(g,), daemon=True,
                                          name=f"nbox-resolver-{self._name or 'default'}")
            g.resolver.start()

    def _resolve_loop(self, g: GroupState) -> None:
        """Resolve a group's calls in issue order: arrivals in, answer, real data done, finish
        (:func:`emulator_core.backend.calls.in_issue_order` starts the deferred exchanges)."""
        limit = timedelta(seconds=self.timeout_s)
        for item in in_issue_order(g):
            try:
                if item.held:  # its arrival is the device's: known once the device reached it
                    devicecall.arrive(g, item, self.clock, self.timeout_s)
                if item.ts_work is not None:
                    item.ts_work.wait(limit)
                if item.ts is None:  # its exchange could not start: calls.start_exchange failed the work
                    continue
                arrivals, compute = arrivals_of(g, item.ts.tolist())
                ans = self.fabric.answer(g.fabric_group, item.collective, item.nbytes, arrivals, compute_us=compute,
                                         **(item.pricing or {}))
                if item.held:
                    devicecall.land(item, limit)
                else:
                    for w in item.works:
                        w.wait(limit)
                    run_finish(item.finish)
                done_us = self.clock.local_ns(time.perf_counter_ns()) / 1000.0
                self._record(OpRecord(item.call, item.collective, item.nbytes, item.issue_us,
                                      self._local_us(ans.start_us), self._local_us(ans.end_us), ans.algorithm,
                                      done_us))
                item.work.resolve(int(ans.end_us * 1000.0))
            except BaseException as err:  # handed to the script's wait(), never swallowed
                if "timed out" in str(err).lower():  # the real communication's own timeout fired first
                    err = RuntimeError(f"{not_completed(self.timeout_s)} ({err})")
                item.work.fail(err)

    def _pair(self, peer: int) -> GroupState:
        """The two-member group {me, peer} (group positions) that a send/recv is priced and ordered on.

        Its arrivals are this process's own issue time (no exchange with the peer: the real receive cannot
        finish before the real send anyway); its real data goes over this group's real backend.
        """
        if isinstance(peer, bool) or not 0 <= peer < self.layout.size or peer == self.layout.me:
            raise mirror.UnsupportedCollective(f"send/recv peer {peer} is not another member of a group of "
                                               f"{self.layout.size} (rank {self.global_rank})")
        hit = self._pairs.get(peer)
        if hit is None:
            m = self.members
            pair = [self.layout.me, peer] if m is None else [m[self.layout.me], m[peer]]
            real = [r for r in pair if r in self.config.real_ranks]
            inner = self._group.inner if peer in self.layout.real_positions else None
            hit = GroupState(self.layout, self.fabric.group(pair, real), inner, exchange=False)
            self._pairs[peer] = hit
        return hit

    # -- collectives ------------------------------------------------------------------------------------
    @_observed
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.AllreduceOptions()
        return self._call("all_reduce", "all_reduce", _nbytes(tensors), tensors,
                          lambda inner: mirror.all_reduce(self.layout, inner, tensors, o), opts=o)

    @_observed
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._call("all_reduce_coalesced", "all_reduce", _nbytes(tensors), tensors,
                          lambda inner: mirror.all_reduce(self.layout, inner, tensors, o), opts=o)

    @_observed
    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any = None) -> NboxWork:
        def real(inner: Any) -> mirror.Result:
            return _each([mirror.all_gather(self.layout, inner, o, i) for o, i in zip(outs, ins, strict=True)])
        return self._call("all_gather", "all_gather", _nbytes(ins), [t for o in outs for t in o], real, opts=opts)

    @_observed
    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> NboxWork:
        return self._call("all_gather_into_tensor", "all_gather", _nbytes([inp]), [out],
                          lambda inner: mirror.all_gather_single(self.layout, inner, out, inp), opts=opts)

    _allgather_base = all_gather_single

    @_observed
    def all_gather_single_coalesced(self, outs: list[torch.Tensor], ins: list[torch.Tensor],
                                    opts: Any = None) -> NboxWork:
        def real(inner: Any) -> mirror.Result:
            return _each([mirror.all_gather_single(self.layout, inner, o, i) for o, i in zip(outs, ins, strict=True)])
        return self._call("all_gather_into_tensor_coalesced", "all_gather", _nbytes(ins), outs, real, opts=opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_observed
    def reduce_scatter(self, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.ReduceScatterOptions()

        def real(inner: Any) -> mirror.Result:
            return _each([mirror.reduce_scatter(self.layout, inner, out, i, o)
                          for out, i in zip(outs, ins, strict=True)])
        return self._call("reduce_scatter", "reduce_scatter", _nbytes([t for i in ins for t in i]), outs, real,
                          opts=o)

    @_observed
    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.ReduceScatterOptions()
        return self._call("reduce_scatter_tensor", "reduce_scatter", _nbytes([inp]), [out],
                          lambda inner: mirror.reduce_scatter_single(self.layout, inner, out, inp, o), opts=o)

    _reduce_scatter_base = reduce_scatter_single

    @_observed
    def reduce_scatter_single_coalesced(self, outs: list[torch.Tensor], ins: list[torch.Tensor],
                                        opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.ReduceScatterOptions()

        def real(inner: Any) -> mirror.Result:
            return _each([mirror.reduce_scatter_single(self.layout, inner, out, i, o)
                          for out, i in zip(outs, ins, strict=True)])
        return self._call("reduce_scatter_tensor_coalesced", "reduce_scatter", _nbytes(ins), outs, real, opts=o)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_observed
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> NboxWork:
        root = opts.rootRank if opts is not None else 0
        return self._call("broadcast", "broadcast", _nbytes(tensors), tensors,
                          lambda inner: mirror.broadcast(self.layout, inner, tensors, root), opts=opts)

    @_observed
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NboxWork:
        o = opts if opts is not None else dist.ReduceOptions()
        return self._call("reduce", "reduce", _nbytes(tensors), tensors,
                          lambda inner: mirror.reduce(self.layout, inner, tensors, o.rootRank, o), opts=o)

    @_observed
    def gather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any = None) -> NboxWork:
        root = opts.rootRank if opts is not None else 0
        out = outs[0] if outs else []
        return self._call("gather", "gather", _nbytes(ins), out,
                          lambda inner: mirror.gather(self.layout, inner, out, ins[0], root), opts=opts)

    @_observed
    def scatter(self, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any = None) -> NboxWork:
        root = opts.rootRank if opts is not None else 0
        pieces = ins[0] if ins else []
        return self._call("scatter", "scatter", _nbytes(outs), outs,
                          lambda inner: mirror.scatter(self.layout, inner, outs[0], pieces, root), opts=opts)

    @_observed
    def alltoall(self, outs: list[torch.Tensor], ins: list[torch.Tensor], opts: Any = None) -> NboxWork:
        sizes = [_nbytes([t]) for t in ins]
        pricing = None
        if len(set(sizes)) > 1:
            me = self.layout.me
            pricing = {"send_bytes": [s for j, s in enumerate(sizes) if j != me],
                       "recv_bytes": [_nbytes([t]) for j, t in enumerate(outs) if j != me]}
        return self._call("all_to_all", "all_to_all_v" if pricing else "all_to_all", sum(sizes), outs,
                          lambda inner: mirror.all_to_all(self.layout, inner, outs, ins), pricing=pricing, opts=opts)

    @_observed
    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                          opts: Any = None) -> NboxWork:
        pricing = None
        if in_splits or out_splits:
            row = math.prod(inp.shape[1:]) * inp.element_size()  # bytes per row of dim 0 (split unit)
            me = self.layout.me
            pricing = {"send_bytes": [s * row for j, s in enumerate(in_splits) if j != me],
                       "recv_bytes": [s * row for j, s in enumerate(out_splits) if j != me]}
        return self._call("all_to_all_single", "all_to_all_v" if pricing else "all_to_all", _nbytes([inp]), [out],
                          lambda inner: mirror.all_to_all_single(self.layout, inner, out, inp, out_splits, in_splits),
                          pricing=pricing, opts=opts)

    alltoall_base = all_to_all_single

    @_observed
    def barrier(self, opts: Any = None) -> NboxWork:
        return self._call("barrier", "barrier", 0, [], lambda inner: mirror.barrier(self.layout, inner))

    @_observed
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> NboxWork:
        return self._call(f"send to {dst}", "send_recv", _nbytes(tensors), tensors,
                          lambda inner: mirror.send(self.layout, inner, tensors, dst, tag), group=self._pair(dst),
                          p2p=(True, dst, tag))

    @_observed
    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> NboxWork:
        return self._call(f"recv from {src}", "send_recv", _nbytes(tensors), tensors,
                          lambda inner: mirror.recv(self.layout, inner, tensors, src, tag), group=self._pair(src),
                          p2p=(False, src, tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> NboxWork:
        raise mirror.UnsupportedCollective(f"recv from any source (rank {self.global_rank}): the emulator cannot "
                                           f"tell which emulated peer sends; name the source rank")

    # -- coalescing (batch_isend_irecv, coalescing managers) ---------------------------------------------
    def _start_coalescing(self, device: Any = None) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any = None) -> NboxWork:
        works, self._coalescing = self._coalescing or [], None
        return devicecall.coalesced(works) or _CoalescedWork(works, self.timeout_s,  # type: ignore[return-value]
                                                             self.config.spin_ns, self.clock)

    def shutdown(self) -> None:
        """Stop the resolver threads (after the calls already issued), then the real backend."""
        groups = (self._group, *self._pairs.values())
        for g in groups:
            if g.resolver is not None:
                g.pending.put(None)
        for g in groups:
            if g.resolver is not None:
                g.resolver.join(self.timeout_s)
                g.resolver = None
        if self._group.inner is not None:
            self._group.inner.shutdown()
            self._group.inner = None

    def abort(self) -> None:
        self.shutdown()


def _each(results: list[mirror.Result]) -> mirror.Result:
    works = [w for ws, _ in results for w in ws]
    finishes = [f for _, f in results if f is not None]

    def finish() -> None:
        for f in finishes:
            f()
    return works, (finish if finishes else None)


class _CoalescedWork(NboxWork):
    """Done when every coalesced work is (its deadline is the latest of theirs)."""

    def __init__(self, works: list[NboxWork], timeout_s: float, spin_ns: int, clock: Clock) -> None:
        super().__init__(lambda: "coalesced calls", [t for w in works for t in w._result], timeout_s, spin_ns,
                         clock=clock)
        self._works = works
        if not works:
            self.resolve(clock.to_reference_ns(time.perf_counter_ns()))
        else:
            threading.Thread(target=self._join, daemon=True, name="nbox-coalesced").start()

    def _join(self) -> None:
        try:
            self.resolve(max(w._await_resolution(None) for w in self._works))
        except BaseException as err:
            self.fail(err)


def _gloo_transport(pg: Any, timeout_s: float) -> tuple[Callable[[int, int], None], Callable[[int], int]]:
    """``send`` / ``recv`` of one int64 over a real process group, for :meth:`Clock.synchronize`."""
    limit = timedelta(seconds=min(timeout_s, 300.0))
    tag = 0x6E62  # "nb"

    def send(peer: int, value: int) -> None:
        pg.send([torch.tensor([value], dtype=torch.int64)], peer, tag).wait(limit)

    def recv(peer: int) -> int:
        buf = torch.empty(1, dtype=torch.int64)
        pg.recv([buf], peer, tag).wait(limit)
        return int(buf.item())

    return send, recv


# C++ calls these back, also from inside a compiled module's forward/backward: never let Dynamo trace them
# (:mod:`emulator_core.backend.eager` says why). The observed wrapper is one code object shared by every collective.
never_compiled(NboxProcessGroup, NboxWork, _CoalescedWork, devicecall.HeldWork, devicecall.CoalescedHeld)

_CONFIG: EmulationConfig | None = None
_FABRIC: Fabric | None = None
_CLOCK: Clock | None = None


def process_clock() -> Clock | None:
    """This process's clock (every nbox group of the process shares it), None before the default group exists: a
    live replay's worker credits its rank's lag on it (:mod:`emulator_core.backend.clocksync`)."""
    return _CLOCK


def clock_report() -> dict[str, float] | None:
    """This process's clock correction (:meth:`Clock.describe`), None before the default group exists."""
    return None if _CLOCK is None else _CLOCK.describe()


# An object received point to point from an emulated peer is refused by name (emulator_core.backend.objectp2p says why).
guard_recv_object_list(lambda: None if _CONFIG is None else _CONFIG.real_ranks)


def create_process_group(opts: Any, backend_options: Any = None) -> NboxProcessGroup:
    """The creator registered with ``torch.distributed.Backend.register_backend`` (extended API).

    The default group is created with the real rank and real world size from the launcher; every other
    group with the global ranks of its members (torch passes those).
    """
    global _CONFIG, _FABRIC, _CLOCK
    members = list(opts.global_ranks_in_group)
    if not members:  # the default group: group_rank / group_size are the real rank and real world size
        _CONFIG = EmulationConfig.from_env(opts.group_size)
        _FABRIC = Fabric(_CONFIG.scenario)
        _CLOCK = Clock(deliberate_skew_ns(opts.group_rank))
        global_rank = _CONFIG.real_ranks[opts.group_rank]
        pg = NboxProcessGroup(_CONFIG, _FABRIC, None, global_rank, opts.store, opts.timeout, _CLOCK)
        pg.synchronize_clock()  # real ranks may sit on hosts whose clocks differ (emulator_core.backend.clocksync)
        return pg
    if _CONFIG is None or _FABRIC is None or _CLOCK is None:
        raise RuntimeError("nbox: a sub-group was created before the default process group")
    global_rank = members[opts.group_rank]
    return NboxProcessGroup(_CONFIG, _FABRIC, members, global_rank, opts.store, opts.timeout, _CLOCK)
