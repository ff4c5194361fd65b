"""One replayed rank of a live replay (``--clock real``), launched by :mod:`nbox_trace.launch`.

Run as ``python -m nbox_replay.live._worker CONFIG.json`` in each of N processes
(:func:`nbox_replay.live.run.replay_live`); process ``RANK`` replays global rank ``config.ranks[RANK]`` through the
``nbox`` backend, which the parent sets up (``NBOX_WORLD_SIZE`` = W, ``NBOX_REAL_RANKS``, ``NBOX_SCENARIO`` = the
scenario at W without its compute keys and the replayed ranks' stragglers, which the walk plays, so a straggler is
slowed once; ``NBOX_MOVE_DATA=0``: the ranks exchange arrival times only).

The walk (:class:`Replayer`) follows :mod:`nbox_replay.virtual`'s semantics on the real clock: nodes in node order; a
node that depends on a comm node waits on its work (a comm node on another comm node does not: the group orders them); a
compute node runs live (:mod:`nbox_replay.live.ops`) or waits its recorded duration (``compute="recorded"``, after its
recorded gap; and every fallback), times the rank's compute factor (``config.factors``: straggler slowdown over
``compute_scale``; a live node under a factor above 1 is held to factor x its measured time, the thread spinning through
it as through CPU work); a comm node is issued with ``async_op=True`` on buffers of the retargeted size
(:func:`nbox_replay.virtual.engine.retarget`), a blocking one waited on at once; with ``config.serialize`` every
outstanding collective is waited for before the next compute node. Warm-up repetitions first, then the timed ones. The
host-work pad or credit (``config.host_cpu_us``, ``config.host_credit``) is :mod:`nbox_replay.live.hostwork`'s; the heap
is held first (:mod:`nbox_replay.live.allocator`). On CUDA with live compute the walk is
:mod:`nbox_replay.live.streams`'s (the first repetition runs every node on one stream); with recorded compute on CUDA,
the walk above with a synchronize before each collective and at the end.

Output, ``<result_dir>/rank<R>.json`` (microseconds, per timed repetition, from its start on the rank's clock):

``iteration_us``       the repetition's wall time
``iteration_ends_us``  the end of each captured iteration (:func:`~nbox_replay.inputs.graph.captured_iterations`)
``compute_us``         compute time; ``wait_us``: time in waits; ``caught_up_us``: overshoot credited (``match``)
``spans``              ``compute``: ``[start, end]`` per compute node; ``comms``: ``[issue, start, end]`` per comm
                       node, the end moved later where the arrivals came in later than it (unless credited)
``host_pad``           the last timed repetition's :class:`~nbox_replay.live.hostwork.HostPad`; ``heap_not_held``
``coverage``           with ``fallbacks`` (nodes per operator name) and ``fallback_reasons``

On CUDA the compute spans and the captured iterations' ends but the last are host times, when the walk launched. On
any exception ``<result_dir>/error<R>.json`` names the rank, the phase, the node and the error, and the process exits
with 1. Why the pad and the credit work so: docs/design/host-work.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from emulator_core._autoload import register as register_nbox_backend
from emulator_core.backend import Clock, process_clock, sleep_until
from nbox_replay.inputs import (
    COLLECTIVE,
    COMPUTE,
    RECV,
    RankGraph,
    captured_iterations,
    correct_graphs,
    from_worker_doc,
    load_rank,
)
from nbox_replay.live.allocator import hold_heap
from nbox_replay.live.cudalanes import CudaLanes
from nbox_replay.live.hostwork import plan_pad
from nbox_replay.live.issues import Groups, Issue, NodeError, make_issue
from nbox_replay.live.ops import LiveOps, prepare
from nbox_replay.live.streams import StreamWalk, not_fallbacks, plan_streams
from nbox_replay.live.workerconfig import WorkerConfig
from nbox_trace.share import share_results
from nbox_trace.threadtime import thread_times_ns

__all__ = ["Groups", "Issue", "NodeError", "Replayer", "make_issue", "main"]


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # the ranks of a node all write every rank's result
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _records_of(pg: Any) -> Any:
    """The backend's answered-call records of a process group (None for a group that is not ``nbox``'s)."""
    records = getattr(pg, "records", None)
    if records is None:
        try:
            records = getattr(pg._get_backend(torch.device("cpu")), "records", None)
        except Exception:  # not an nbox group: nothing recorded
            records = None
    return records


def _booked_wait(rep: Any, deadline_ns: int, *, hold: bool) -> None:
    """Wait until ``deadline_ns`` (spinning all the way with ``hold``), booking the thread's CPU and host time to
    ``rep.wait_cpu_ns`` / ``rep.wait_host_ns``."""
    c0, h0 = time.thread_time_ns(), time.perf_counter_ns()
    if hold:
        sleep_until(deadline_ns, spin_ns=max(0, deadline_ns - h0))
    else:
        sleep_until(deadline_ns)
    rep.wait_cpu_ns += time.thread_time_ns() - c0
    rep.wait_host_ns += time.perf_counter_ns() - h0


class Replayer:
    """One rank's walk through its graph on the real clock (module docstring)."""

    def __init__(self, g: RankGraph, cfg: WorkerConfig, groups: Groups, factor: float,
                 clock: Clock | None = None) -> None:
        self.g = g
        # the rank's clock, shared with the backend: a factor below 1 credits its lag (module docstring)
        self.clock = clock if clock is not None else Clock()
        self.device = cfg.device
        self.live = cfg.compute == "live"
        self.serialize = cfg.serialize
        # a wait gives up before the parent's deadline, so the error file can name the node it was stuck on
        self.timeout = timedelta(seconds=max(1.0, 0.75 * cfg.timeout_s))
        self.factor = factor
        self.pad = 1.0  # the host work's stretch of live operators (nbox_replay.live.hostwork), set after the warm-up
        # replay.host_work=match in a timed repetition: a wait past the answered end is credited (module docstring)
        self.catch_up = False
        self.caught_up_ns = 0  # credited so (since the last reset)
        # live operators' own time, fallbacks' waits, the CPU time of the walk's waits (since the last reset)
        self.live_ns = self.fallback_ns = self.wait_cpu_ns = 0
        self.wait_host_ns = 0  # host time in waits: collectives, pads, recorded durations (since the last reset)
        self.gaps = g.gaps_us()
        self.iteration_of, self.captured, _ = captured_iterations(g)
        self.ops: LiveOps | None = prepare(g, self.device) if self.live else None
        self.issues: dict[int, Issue | None] = {}
        for i in range(len(g)):
            if COLLECTIVE <= g.kind[i] <= RECV:
                self.issues[i] = make_issue(g, i, groups, self.device)
        self.comm_deps = [[j for j in deps if COLLECTIVE <= g.kind[j] <= RECV] for deps in g.deps]
        self.node = -1  # the position being replayed (for errors)
        self.cuda = self.device.startswith("cuda")
        pgs = [dist.group.WORLD] + [pg for pg, _, _ in groups.by_name.values() if pg is not None]
        self.records: list[Any] = []
        for pg in pgs:
            rec = _records_of(pg)
            if rec is not None and all(rec is not r for r in self.records):
                self.records.append(rec)
        # the spans of the last repetition, microseconds from its start (module docstring)
        self.compute_spans: list[list[float]] = []
        self.comm_spans: list[list[float]] = []
        self.iteration_ends: list[float] = []  # when the last repetition ended each captured iteration
        # live compute on CUDA: each operator on its recorded stream (nbox_replay.live.streams), no host sync inside
        self.walk = StreamWalk(g, plan_streams(g), CudaLanes(self.device), self.serialize, self._now) \
            if self.cuda and self.ops is not None else None
        if self.walk is not None and self.ops is not None:  # GPU ops: re-launched by their operators
            not_fallbacks(self.walk.plan, g.names, self.ops.reasons, self.ops.fallbacks)
        self.walked = 0  # repetitions walked on the streams so far (the first on one stream)
        self.host_held: bool | None = None  # the collectives are held on the host (None: none issued yet)
        self._start = 0  # the streams' repetition: its start, captured iterations' ends, unpriced comms' spans
        self._ends: list[float] = []
        self._unpriced: list[list[float]] = []

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _wait(self, work: Any, i: int) -> None:
        if work is None:
            return
        try:
            work.wait(self.timeout)
        except Exception as err:
            raise NodeError(self.g.ids[i], self.g.names[i], f"waiting for comm node {self.g.ids[i]} "
                                                           f"({self.g.comm[i].collective}): {err}") from err

    def _wait_for(self, works: dict[int, Any], which: list[int]) -> int:
        """Wait for the works of comm nodes ``which`` (those still outstanding); the time it took on the rank's
        timeline, ns. The thread's CPU time meanwhile (the backend's wait spins its last microseconds, where the
        real thread blocks) is added to :attr:`wait_cpu_ns`. With :attr:`catch_up` a wait that ends past the
        answered end on the rank's timeline is credited the overshoot (:mod:`nbox_replay.live.hostwork`, "Both
        ways")."""
        t0, c0, lag0 = self._now(), time.thread_time_ns(), self.clock.lag_ns
        for j in which:
            w = works.pop(j, None)
            if w is not None:
                self.node = j
                began = self.clock.to_reference_ns(time.perf_counter_ns())
                self._wait(w, j)
                if self.catch_up:
                    self._catch_up(w, began)
        self.wait_cpu_ns += time.thread_time_ns() - c0
        took = self._now() - t0
        self.wait_host_ns += took + self.clock.lag_ns - lag0
        return took

    def _catch_up(self, work: Any, began_ns: int) -> None:
        """Credit the rank the time its wait for ``work`` (begun at ``began_ns`` on the reference timeline) ran past
        the answered end, or past its own start for a call that had ended before it, on its timeline: the answer
        (a peer's arrival time, the exchange's round trip, a peer whose own host clock runs behind by its credit)
        came late in host time, which is the emulator's own delay, not the modeled cluster's. The rank's timeline
        never runs backward: it ends the wait at the answered end or where the wait began, the later."""
        deadline = getattr(work, "deadline_ns", None)  # the nbox backend's works: the reference timeline
        if deadline is None:
            return
        late = self.clock.to_reference_ns(time.perf_counter_ns()) - max(int(deadline), began_ns)
        if late > 0:
            self.clock.credit(late)
            self.caught_up_ns += late

    def _idle_until(self, deadline_ns: int) -> None:
        """Wait until ``deadline_ns`` (``perf_counter_ns``); the CPU time its last spin takes goes to
        :attr:`wait_cpu_ns` (a padding or a recorded duration is time the rank's thread is not computing)."""
        _booked_wait(self, deadline_ns, hold=False)

    def _hold_until(self, deadline_ns: int) -> None:
        """Hold the CPU until ``deadline_ns``: a live operator's stretch (a straggler's slower CPU, the host work the
        replay does not re-run) is CPU work, so the thread spins through it instead of sleeping. On a node whose CPU
        is a quota share (a CPU node; a cgroup's ``cpu.cfs_quota_us``), a sleeping stretch hands its quota to the next
        operator, which then runs faster than under the real work. Its CPU time goes to :attr:`wait_cpu_ns`, as a
        wait's does. On CUDA the stretch is :meth:`launch`'s, after a synchronize."""
        _booked_wait(self, deadline_ns, hold=True)

    def _now(self) -> int:
        """The rank's own timeline, ns: ``perf_counter_ns`` less the lag credited so far (module docstring)."""
        return time.perf_counter_ns() - self.clock.lag_ns

    def _compute(self, i: int) -> None:
        """Run compute node ``i`` live, or wait its recorded duration (module docstring)."""
        clock = time.perf_counter_ns
        t0 = clock()
        ran = self.ops is not None and self.ops.run(i)
        if ran:
            stretch = self.factor * self.pad
            if stretch != 1.0:
                self._sync()
            t1 = clock()
            self.live_ns += t1 - t0
            if stretch > 1.0:
                self._hold_until(t0 + int((t1 - t0) * stretch))
            elif stretch < 1.0:  # replay.host_work=match: the replay's own excess, credited on the rank's clock
                self.clock.credit(int((t1 - t0) * (1.0 - stretch)))
        else:  # compute="recorded": the recorded gap before it too (the framework's work, the lean pass's figure)
            gap = 0.0 if self.live else self.gaps[i]
            self._idle_until(t0 + int((gap + self.g.duration_us[i]) * self.factor * 1000))
            self.fallback_ns += clock() - t0

    def repetition(self) -> tuple[float, float, float]:
        """Run the graph once; (wall time, time in compute nodes, time waiting for comm) in microseconds.

        Also keeps the repetition's compute intervals and comm spans (:attr:`compute_spans`, :attr:`comm_spans`)
        and when it ended each captured iteration (:attr:`iteration_ends`): captured iteration j ends when the
        walk reaches the first node of iteration j + 1, the last one when the repetition ends.
        """
        if self.walk is not None:
            return self._on_streams(self.walk)
        g = self.g
        clock = self._now  # the rank's timeline: credited time (replay.host_work=match) is not the rank's
        works: dict[int, Any] = {}
        compute_ns = wait_ns = 0
        marks = [len(r) for r in self.records]
        compute: list[list[float]] = []
        unpriced: list[list[float]] = []
        ends: list[float] = []
        start = clock()
        for i in range(len(g)):
            self.node = i
            while len(ends) < self.iteration_of[i]:
                ends.append((clock() - start) / 1000.0)
            k = g.kind[i]
            is_comm = COLLECTIVE <= k <= RECV
            if not is_comm:
                deps = list(works) if self.serialize and k == COMPUTE else self.comm_deps[i]
                if deps:  # most nodes wait for nothing: no call, no clock read
                    wait_ns += self._wait_for(works, deps)
                    self.node = i
            if k == COMPUTE:
                t0 = clock()
                self._compute(i)
                t1 = clock()
                compute_ns += t1 - t0
                compute.append([(t0 - start) / 1000.0, (t1 - start) / 1000.0])
            elif is_comm:
                issue = self.issues[i]
                if issue is None:  # unpriced: its recorded duration on this rank alone
                    t0 = clock()
                    self._idle_until(time.perf_counter_ns() + int(g.duration_us[i] * 1000))  # host time
                    at = (t0 - start) / 1000.0
                    unpriced.append([at, at, (clock() - start) / 1000.0])
                    continue
                self._sync()
                try:
                    work = issue()
                except Exception as err:
                    raise NodeError(g.ids[i], g.names[i], f"issuing {g.comm[i].collective}: {err}") from err
                if g.comm[i].blocking:
                    wait_ns += self._wait_for({i: work}, [i])
                else:
                    works[i] = work
        wait_ns += self._wait_for(works, list(works))
        t0 = clock()
        self._sync()
        end = clock()
        wait_ns += end - t0
        self.node = -1
        base_us = start / 1000.0
        comms = [[r.issue_us - base_us, r.start_us - base_us,  # caught up: the wait ended at the answered end
                  (r.end_us if self.catch_up else max(r.end_us, r.real_done_us)) - base_us]
                 for rec, m in zip(self.records, marks, strict=True) for r in list(rec)[m:]]
        self.compute_spans, self.comm_spans = compute, comms + unpriced
        wall = (end - start) / 1000.0
        self.iteration_ends = ends + [wall] * (self.captured - len(ends))
        return wall, compute_ns / 1000.0, wait_ns / 1000.0

    # -- live compute on CUDA: the walk of nbox_replay.live.streams, this rank as its Runner -------------------
    def _on_streams(self, walk: StreamWalk) -> tuple[float, float, float]:
        """:meth:`repetition` on CUDA: the host pad is :attr:`pad` as waits before launches; one synchronize, at the
        end (:mod:`nbox_replay.live.streams`)."""
        marks = [len(r) for r in self.records]
        self._ends, self._unpriced = [], []
        start = self._start = self._now()
        walk.pad = self.pad
        out = walk.repetition(self, one_stream=self.walked == 0)
        self.walked += 1
        self.node = -1  # the synchronize waits for every node's device work: it names none
        t0 = self._now()
        self._sync()
        end = self._now()
        base_us = start / 1000.0
        comms = [[r.issue_us - base_us, r.start_us - base_us, max(r.end_us, r.real_done_us) - base_us]
                 for rec, m in zip(self.records, marks, strict=True) for r in list(rec)[m:]]
        self.compute_spans = [[(a - start) / 1000.0, (b - start) / 1000.0] for a, b in out.compute]
        self.comm_spans = comms + self._unpriced
        wall = (end - start) / 1000.0
        self.iteration_ends = self._ends + [wall] * (self.captured - len(self._ends))
        return wall, out.compute_ns / 1000.0, (out.wait_ns + end - t0) / 1000.0

    def at(self, i: int) -> None:
        self.node = i
        while len(self._ends) < self.iteration_of[i]:
            self._ends.append((self._now() - self._start) / 1000.0)

    def launch(self, i: int) -> int:
        """Run compute node ``i`` live (its launches' host time, ns), or wait its recorded time with its GPU ops'
        (0); a straggler's live operator is stretched to factor x its device time (a synchronize)."""
        assert self.ops is not None and self.walk is not None
        t0 = time.perf_counter_ns()
        if self.walk.lanes.streams:  # freed memory is not reused before every lane's queued work is done
            CudaLanes.keep_for([self.ops.pool.tensors.get(t) for t in self.ops.release.get(i, ())],
                               [self.walk.lanes.main, *self.walk.lanes.streams])
        if self.ops.run(i):
            took = time.perf_counter_ns() - t0
            self.live_ns += took
            if self.factor > 1.0:
                self._sync()
                self._idle_until(t0 + int((time.perf_counter_ns() - t0) * self.factor))
            return took
        self._idle_until(t0 + int((self.g.duration_us[i] + self.walk.plan.device_us[i]) * self.factor * 1000))
        self.fallback_ns += time.perf_counter_ns() - t0
        return 0

    def issue(self, i: int) -> Any:
        issue = self.issues[i]
        if issue is None:  # unpriced: its recorded duration on this rank alone (host time)
            t0 = self._now()
            self._idle_until(time.perf_counter_ns() + int(self.g.duration_us[i] * 1000))
            at = (t0 - self._start) / 1000.0
            self._unpriced.append([at, at, (self._now() - self._start) / 1000.0])
            return None
        collective = self.g.kind[i] == COLLECTIVE
        if not collective or self.host_held is not False:  # a host-held call arrives at its issue: the device first
            self._sync()
        try:
            work = issue()
        except Exception as err:
            raise NodeError(self.g.ids[i], self.g.names[i], f"issuing {self.g.comm[i].collective}: {err}") from err
        if collective:  # the backend's device hold (HeldWork) carries its hold; the host hold does not
            self.host_held = getattr(work, "held", None) is None
        return work

    def wait(self, work: Any, i: int) -> int:
        return self._wait_for({i: work}, [i])

    def idle(self, ns: int) -> None:
        self._idle_until(time.perf_counter_ns() + ns)


def _busy_ns() -> int:
    """The thread's time on a CPU and waiting for one (:mod:`nbox_trace.threadtime`; where the kernel does not say,
    its CPU time alone), nanoseconds: what :mod:`nbox_replay.live.hostwork` compares with the real thread's."""
    tt = thread_times_ns()
    return time.thread_time_ns() if tt is None else tt.on_cpu_ns + tt.run_queue_ns


def main(argv: list[str]) -> int:
    cfg = WorkerConfig.read(argv[1])
    local = int(os.environ["RANK"])
    rank = cfg.ranks[local]
    out = Path(cfg.result_dir)
    where: dict[str, Any] = {"phase": "start", "node": None}
    replayer: Replayer | None = None
    heap = hold_heap()  # before any tensor: operators re-run without page faults the real run did not take
    try:
        if os.environ.get("OMP_NUM_THREADS") == "1":
            torch.set_num_threads(1)
        torch.set_grad_enabled(False)  # replayed operators build no autograd graph (LiveOps.run then needs no context)
        where["phase"] = "loading the trace"
        g = load_rank(cfg.traces[rank], rank, keep_nodes=True)
        g = correct_graphs({rank: g}, from_worker_doc(cfg.profiler))[rank]  # the parent's rule and figures
        factor = cfg.factors[rank]
        where["phase"] = "init_process_group"
        # `import torch` registers the backend through nbox's entry point, which exists only where nbox is
        # installed; from a checkout on PYTHONPATH (bench/gpu_check.py on a GPU machine) it does not.
        register_nbox_backend()
        dist.init_process_group("nbox", timeout=timedelta(seconds=cfg.timeout_s))
        if dist.get_rank() != rank or dist.get_world_size() != cfg.world:
            raise RuntimeError(f"the nbox backend gave rank {dist.get_rank()} of {dist.get_world_size()}, "
                               f"expected rank {rank} of {cfg.world}")
        where["phase"] = "creating process groups"
        groups = Groups({k: list(v) for k, v in cfg.groups.items()}, cfg.recorded_world, cfg.world)
        where["phase"] = "preparing the nodes"
        replayer = Replayer(g, cfg, groups, factor, process_clock())
        iteration_us: list[float] = []
        ends_us: list[list[float]] = []
        compute_us: list[float] = []
        wait_us: list[float] = []
        caught_up_us: list[float] = []  # per timed repetition, the waits' overshoot credited (replay.host_work=match)
        spans: list[dict[str, Any]] = []
        host_clean = cfg.host_cpu_us  # asked: the real thread's CPU per iteration (nbox_replay.live.hostwork)
        history: list[tuple[float, float]] = []  # every repetition's (replay, live) time so far, for the pad
        busy_history: list[float] = []  # and its thread's busy time (the replay figure without match)
        credit = cfg.host_credit  # replay.host_work=match
        pad = None
        for rep in range(cfg.warmup + cfg.iterations):
            where["phase"] = f"repetition {rep}"
            if rep >= cfg.warmup and host_clean is not None:
                pad = plan_pad(host_clean.get(rank), history, replayer.captured, both_ways=credit,
                               busy_history=busy_history)
                replayer.pad = pad.factor
                replayer.catch_up = credit
            replayer.live_ns = replayer.fallback_ns = replayer.wait_cpu_ns = replayer.caught_up_ns = 0
            replayer.wait_host_ns = 0
            cpu0, host0 = _busy_ns(), time.perf_counter_ns()
            wall, comp, waited = replayer.repetition()
            busy = (_busy_ns() - cpu0 + replayer.fallback_ns - replayer.wait_cpu_ns) / 1000.0
            # outside its waits: the host time the rank spent on anything but a wait (a fallback's recorded
            # duration counts as spent), what replay.host_work=match holds to the real thread's
            # (nbox_replay.live.hostwork)
            outside = (time.perf_counter_ns() - host0 - replayer.wait_host_ns + replayer.fallback_ns) / 1000.0
            history.append((outside if credit else busy, replayer.live_ns / 1000.0))
            busy_history.append(busy)
            if rep >= cfg.warmup:
                iteration_us.append(wall)
                ends_us.append(replayer.iteration_ends)
                compute_us.append(comp)
                wait_us.append(waited)
                caught_up_us.append(replayer.caught_up_ns / 1000.0)
                spans.append({"compute": replayer.compute_spans, "comms": replayer.comm_spans})
        ops = replayer.ops
        if pad is not None and caught_up_us:  # the last timed repetition's, per captured iteration, like its pad
            pad = replace(pad, caught_up_us=caught_up_us[-1] / max(1, replayer.captured))
        mine = {
            "rank": rank, "iteration_us": iteration_us, "iteration_ends_us": ends_us, "compute_us": compute_us,
            "wait_us": wait_us, "caught_up_us": caught_up_us,
            "spans": spans, "recorded_compute_us": g.compute_us(),
            "live_compute_us": ops.live_us() if ops is not None else 0.0,
            "coverage": ops.coverage() if ops is not None else 0.0,
            "fallbacks": dict(ops.fallbacks) if ops is not None else {},
            "fallback_reasons": ops.reasons_by_op() if ops is not None else {},
            "host_pad": pad.to_dict() if pad is not None else None,
            "heap_not_held": heap or None,  # why not held (nbox_replay.replay.host_work_doc reports it)
            "nodes": len(g)}
        where["phase"] = "sharing the results"  # every node's launcher reports the whole job (nbox_trace.share)
        every = share_results(dist.distributed_c10d._get_default_store(), "nbox_live/result", local,
                              len(cfg.ranks), mine, min(120.0, cfg.timeout_s))
        for real, doc in every.items():
            _write_json(out / f"rank{cfg.ranks[real]}.json", doc)
    except BaseException as err:  # every failure becomes an error file naming the rank and node
        node_id, node_name = None, None
        if isinstance(err, NodeError):
            node_id, node_name = err.node_id, err.name
        elif replayer is not None and replayer.node >= 0:
            node_id, node_name = replayer.g.ids[replayer.node], replayer.g.names[replayer.node]
        _write_json(out / f"error{rank}.json", {
            "rank": rank, "phase": where["phase"], "node_id": node_id, "node_name": node_name,
            "type": type(err).__name__, "message": str(err)[:2000], "time_us": time.time() * 1e6,
            "traceback": traceback.format_exc()[-4000:]})
        return 1
    try:
        dist.destroy_process_group()
    except Exception as err:  # the results are written; a teardown hiccup is only reported
        print(f"nbox live worker rank {rank}: destroy_process_group: {err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
