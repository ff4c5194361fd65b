"""Replay in virtual time: recorded compute durations, collectives answered by the emulator core, no torch.

Every replayed rank walks its graph in node order; a node starts when its resource (thread or stream) is free and
its dependencies are met:

* a **compute** node needs its dependencies' ends and runs ``duration / compute_scale``, times the rank's straggler
  slowdown and, with a what-if mesh at a fixed global batch,
  :attr:`emulator_core.scenario.mesh.MeshPlan.compute_factor`;
* a **collective** or **send/recv** is issued on its thread once its dependencies are met (a dependency on another
  comm node counts from that node's issue: the fabric orders a group's collectives), costs the thread ``issue_us``,
  holds it until completion when blocking, and completes when
  :meth:`emulator_core.pricing.answer.Fabric.answer` says, from the issue times of its group's replayed members
  (matched by process group and position in the group's sequence; emulated members mirror them);
* a recorded **gap** (``nbox_gap_micros``) first holds the node's thread for the gap, times the same factor, counted
  as compute; a joined gap (``nbox_gap_joined``) only from when its dependencies on another host thread have ended
  (:func:`_handoff_deps`);
* when no rank can advance and some are unfinished, :class:`ReplayDeadlock` names the collectives they wait for.

The ranks run on one event core (:class:`nbox_replay.virtual.events.EventQueue`), one event per rank run until it
must wait; its rounds fix the order in which floats are summed, so the same graphs and scenario give the same times,
bit for bit. World-size retargeting: the world group grows to the target world size and sizes follow the
collective's semantics (:func:`retarget`), other groups keep their members; with a what-if mesh
(:class:`emulator_core.scenario.mesh.MeshPlan`) groups follow their mesh dimensions, each replayed rank plays the
target rank of its coordinates, and sizes follow their group's rule. Times are microseconds of virtual time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from emulator_core.pricing import Fabric, FabricGroup, Pricer, make_pricer
from emulator_core.scenario import MeshPlan, Scenario
from nbox_replay.inputs import (
    COLLECTIVE,
    COMPUTE,
    RECV,
    SEND,
    CommInfo,
    RankGraph,
    RecordedStreams,
    captured_iterations,
    recorded_time_us,
    relabel,
)
from nbox_replay.virtual.breakdown import CommSpan
from nbox_replay.virtual.events import EventQueue
from nbox_replay.virtual.results import CollectiveAnswer, RankResult, SimResult
from nbox_trace.errors import InvalidInputError

__all__ = ["RankResult", "ReplayDeadlock", "SimResult", "retarget", "simulate"]

#: How a collective's size changes when the world grows from W_rec to W (design.md, "Replay semantics").
RULES = {
    "all_reduce": ("keep", "data-parallel all-reduce: the gradient bucket keeps its size"),
    "all_gather": ("shard", "FSDP all-gather: the per-rank shard shrinks as W_rec/W (the parameter is fixed)"),
    "reduce_scatter": ("keep", "FSDP reduce-scatter: the unsharded input keeps its size (its shards shrink)"),
    "all_to_all": ("keep", "data-parallel all-to-all: each rank's buffer keeps its size, per-peer splits "
                           "shrink as W_rec/W"),
    "all_to_all_v": ("keep", "data-parallel all-to-all-v: each rank's buffer keeps its size; its recorded "
                             "per-peer splits name the recorded peers, so it is priced as uniform"),
}


class ReplayDeadlock(InvalidInputError):
    """The replayed ranks wait for each other forever (mismatched collectives or send/recv)."""


def retarget(comm: CommInfo, recorded_world: int, world: int, group_grows: bool) -> tuple[float, str]:
    """The size (bytes, costmodels' convention) at world size ``world``, and the rule that gave it."""
    if not group_grows or world == recorded_world:
        return float(comm.nbytes), "unchanged (group not resized)"
    how, text = RULES.get(comm.collective, ("keep", "its size is kept"))
    if how == "shard":
        return comm.nbytes * recorded_world / world, text
    return float(comm.nbytes), text


@dataclass
class _Pending:
    comm: CommInfo
    nbytes: float
    rule: str
    arrivals: dict[int, float] = field(default_factory=dict)
    member_comms: dict[int, CommInfo] = field(default_factory=dict)  # each replayed member's own facts
    recorded_us: dict[int, float] = field(default_factory=dict)  # each replayed member's own recorded time
    answer: CollectiveAnswer | None = None
    blocked: list[_Rank] = field(default_factory=list)  # ranks parked until it is answered


class _Sim:
    def __init__(self, graphs: Mapping[int, RankGraph], scenario: Scenario, groups: Mapping[str, Sequence[int]],
                 recorded_world: int, repetitions: int, mesh: MeshPlan | None = None) -> None:
        self.mesh = mesh
        self.graphs = dict(sorted(graphs.items()))
        self.scenario = scenario
        self.fabric = Fabric(scenario)
        self.world = scenario.world_size
        self.recorded_world = recorded_world
        self.reps = repetitions
        self.replayed = sorted(self.graphs)
        self.groups: dict[str, tuple[list[int], bool]] = {}
        self.recorded_groups = {name: sorted(members) for name, members in groups.items()}
        for name, members in groups.items():
            ms = sorted(members)
            grows = ms == list(range(recorded_world)) and self.world != recorded_world
            self.groups[name] = (list(range(self.world)) if grows else ms, grows) if mesh is None \
                else mesh.members(name)
        self.fabric_groups: dict[str, FabricGroup] = {}
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.ranks: dict[int, _Rank] = {}  # set by simulate
        self.collectives: list[CollectiveAnswer] = []
        self.unpriced = 0
        self._replayed_members: dict[str, list[int]] = {}
        self.events = EventQueue()
        self.serialize = scenario.overlap == "serialize"
        self._a2av_pricers: dict[str, Pricer] = {}
        self.iteration_of, self.captured, self.iterations_note = _iterations(self.graphs)

    def wake(self, rank: _Rank) -> None:
        """Run ``rank`` again at its next turn: later in this round if it comes after the running rank."""
        events = self.events
        events.schedule(events.now if rank.g.rank > events.priority else events.now + 1, rank.g.rank, rank.step)

    def members(self, pg: str) -> tuple[list[int], bool]:
        found = self.groups.get(pg)
        if found is None:  # not declared anywhere: the world, like torch's default group
            found = self.groups[pg] = (list(range(self.world)), self.world != self.recorded_world) \
                if self.mesh is None else self.mesh.members(pg)
        return found

    def replayed_members(self, pg: str) -> list[int]:
        """The replayed ranks that are members of ``pg`` (cached)."""
        found = self._replayed_members.get(pg)
        if found is None:
            members = set(self.members(pg)[0])
            found = self._replayed_members[pg] = [r for r in self.replayed if r in members]
        return found

    def busiest_splits(self, fg: FabricGroup, p: _Pending) -> tuple[list[float] | None, list[float] | None]:
        """An all-to-all-v's per-peer bytes (send, receive; p - 1 each, costmodels' order) of the replayed
        member it takes longest, priced by the fabric's own pricer; ``(None, None)`` (uniform) when the
        recorded splits do not describe the group (missing, wrong length, or no elements)."""
        members, _ = self.members(p.comm.pg)
        size = len(members)
        pos = {r: j for j, r in enumerate(members)}
        pricer = self._a2av_pricers.get(p.comm.pg)
        if pricer is None:
            pricer = self._a2av_pricers[p.comm.pg] = make_pricer(self.scenario, "all_to_all_v", fg.shape)
        best: tuple[float, list[float], list[float]] | None = None
        for rank, comm in sorted(p.member_comms.items()):
            ins, outs = comm.in_splits, comm.out_splits
            if not ins or not outs or len(ins) != size or len(outs) != size or sum(ins) <= 0 or rank not in pos:
                return None, None
            unit = comm.nbytes / sum(ins)  # bytes per element (comm_size is this rank's input buffer)
            me = pos[rank]
            send = [ins[(me + k) % size] * unit for k in range(1, size)]
            recv = [outs[(me - k) % size] * unit for k in range(1, size)]
            cost = pricer(p.nbytes, send_bytes=send, recv_bytes=recv)[1]
            if best is None or cost > best[0]:
                best = (cost, send, recv)
        return (best[1], best[2]) if best is not None else (None, None)

    def fabric_group(self, pg: str) -> FabricGroup:
        fg = self.fabric_groups.get(pg)
        if fg is None:
            members, _ = self.members(pg)
            real = [r for r in self.replayed if r in set(members)]
            if not real:
                raise InvalidInputError(f"process group {pg!r} has no replayed member")
            fg = self.fabric_groups[pg] = self.fabric.group(members if members != list(range(self.world)) else None,
                                                            real, real_stragglers=False)
        return fg


def _iterations(graphs: Mapping[int, RankGraph]) -> tuple[dict[int, list[int]], int, str]:
    """Per rank, each node's captured iteration (0-based); how many per repetition; how they were found.

    The recorder's marks (:func:`nbox_replay.inputs.graph.captured_iterations`) are used when every replayed rank
    with nodes carries the same number of marked iterations; otherwise one iteration is one pass over the
    whole capture, and the note says why.
    """
    found = {r: captured_iterations(g) for r, g in graphs.items()}
    counts = {k for r, (_, k, marked) in found.items() if marked and len(graphs[r])}
    unmarked = [r for r, (_, _, marked) in found.items() if not marked and len(graphs[r])]
    if len(counts) == 1 and not unmarked:
        k = counts.pop()
        return {r: idx for r, (idx, _, _) in found.items()}, k, f"{k} captured iteration(s) per pass, as marked " \
            "by the recorder"
    why = ("the trace marks no iteration boundaries" if not counts else
           f"the ranks mark different numbers of iterations ({sorted(counts)}, unmarked: {unmarked})")
    return {r: [0] * len(g) for r, g in graphs.items()}, 1, f"{why}: one iteration = one pass over the whole capture"


def simulate(graphs: Mapping[int, RankGraph], scenario: Scenario, *, groups: Mapping[str, Sequence[int]],
             recorded_world: int, repetitions: int = 1, mesh: MeshPlan | None = None) -> SimResult:
    """Replay ``graphs`` (replayed rank -> graph) on ``scenario`` in virtual time (module docstring).

    Args:
        groups: process group name -> its members' global ranks at the recorded world size.
        recorded_world: the world size the trace was recorded at.
        repetitions: how many times each rank's graph runs back to back (collectives keep their order).
        mesh: a what-if mesh (its world size is the scenario's); the result's ranks are then the target ranks
            the replayed ones play (``mesh.rank_map``).

    Raises:
        ReplayDeadlock: the ranks cannot all finish (names each stuck rank, node and collective).
        InvalidInputError: a replayed rank is outside the world, or a group has no replayed member.
    """
    if repetitions < 1:
        raise InvalidInputError(f"repetitions must be >= 1, got {repetitions}")
    if mesh is not None:
        if mesh.world != scenario.world_size:
            raise InvalidInputError(f"the mesh {mesh.describe()} has {mesh.world} ranks, the scenario "
                                    f"{scenario.world_size}")
        graphs = relabel(graphs, mesh)
    bad = [r for r in graphs if not 0 <= r < scenario.world_size]
    if bad:
        raise InvalidInputError(f"replayed rank {bad[0]} is outside the what-if world of {scenario.world_size} ranks")
    sim = _Sim(graphs, scenario, groups, recorded_world, repetitions, mesh)
    ranks = sim.ranks = {r: _Rank(sim, g) for r, g in sim.graphs.items()}
    for rank in ranks.values():
        if not rank.done:
            sim.events.schedule(0, rank.g.rank, rank.step)
    sim.events.run()
    stuck = [rank for rank in ranks.values() if not rank.done]
    if stuck:
        raise ReplayDeadlock("the replayed ranks wait for each other forever:\n" + "\n".join(
            rank.stuck_message() for rank in stuck))
    return SimResult(scenario.world_size, {r: rank.result for r, rank in ranks.items()}, sim.collectives,
                     sim.unpriced, sum(len(g) for g in sim.graphs.values()) * repetitions, sim.captured,
                     sim.iterations_note)


def _handoff_deps(g: RankGraph, gap: Sequence[float]) -> list[tuple[int, ...]]:
    """Per node whose gap the recorder measured on a joined timeline (``nbox_gap_joined``: the caller of a backward
    pass that the autograd engine ran on its device thread, nbox_record/sources/leantiming.py): its dependencies that
    are compute on another host thread. Its gap starts once they have ended: the thread waited for them before doing
    that work. Any other gap was measured on its own thread's timeline and already holds such waits, so it
    starts when the thread is free (a CPU rank's FSDP2 gap before ``aten::chunk``, say). A dependency on a GPU
    stream never holds a gap back: the host runs ahead of its kernels."""
    host = [name.startswith("thread:") for name in g.resources]
    res, kind, deps, joined = g.resource, g.kind, g.deps, g.gap_joined_flags()
    return [tuple(j for j in deps[i] if kind[j] == COMPUTE and host[res[j]] and res[j] != res[i])
            if gap[i] > 0 and joined[i] and host[res[i]] else () for i in range(len(g))]


class _Rank:
    """One replayed rank: a process on the event core that walks its graph (module docstring).

    Its walk (:meth:`_walk`) is a generator that runs until it must wait and then yields what it waits
    for: a :class:`_Pending` collective (:meth:`step` parks the rank on it; the answer wakes it), or
    ``None`` at the end of a repetition (it goes on in the next round). Where it is in its graph lives in
    the generator's frame only.
    """

    def __init__(self, sim: _Sim, g: RankGraph) -> None:
        self.sim, self.g = sim, g
        self.result = RankResult(g.rank)
        self.free = [0.0] * len(g.resources)  # per resource (thread, stream): when it is next free, us
        # per resource, its compute intervals (in time order: a resource runs one node at a time) and the running
        # sum of their lengths, for :meth:`compute_between`
        self.busy: list[tuple[list[float], list[float], list[float]]] = [([], [], [0.0]) for _ in g.resources]
        self.seq: dict[str, int] = {}
        self.p2p_seq: dict[tuple[int, int, int], int] = {}
        self.comm_positions = [i for i, k in enumerate(g.kind) if COLLECTIVE <= k <= RECV]
        self.factor = sim.scenario.slowdown(g.rank) / sim.scenario.compute_scale
        if sim.mesh is not None:  # a fixed global batch: the per-rank batch's ratio (emulator_core.scenario.mesh)
            self.factor *= sim.mesh.compute_factor
        self.done = len(g) == 0
        self.at = 0  # the node the walk stopped at (for :meth:`stuck_message`)
        self.recorded = RecordedStreams()
        self.rec_start = g.start_us if len(g.start_us) == len(g) else [0.0] * len(g)
        self._new_rep()
        if self.done:
            self.result.iteration_us = [0.0] * sim.reps
            self.result.iteration_end_us = [0.0] * (sim.reps * sim.captured)
        self._walker = self._walk()

    def _new_rep(self) -> None:
        n = len(self.g)
        self.end: list[float | None] = [None] * n
        self.start: list[float] = [0.0] * n
        self.issued: list[float | None] = [None] * n
        self.keys: dict[int, tuple[str, int]] = {}
        self.recorded.reset()

    def _computed(self, res: int, s: float, e: float) -> None:
        """Resource ``res`` computed over ``[s, e]``: for the breakdown and :meth:`compute_between`."""
        self.result.intervals.compute.append((s, e))
        starts, ends, total = self.busy[res]
        starts.append(s)
        ends.append(e)
        total.append(total[-1] + (e - s))

    def compute_between(self, t0: float, t1: float) -> float:
        """The rank's compute placed so far within ``[t0, t1]`` (us), summed over its threads and streams and at
        most ``t1 - t0``: what the fabric's beside-compute answer counts (``Fabric.answer``'s ``compute_us``)."""
        if t1 <= t0:
            return 0.0
        done = 0.0
        for starts, ends, total in self.busy:
            lo = bisect.bisect_right(ends, t0)  # the first interval ending after t0
            hi = bisect.bisect_left(starts, t1)  # past the last one starting before t1
            if lo < hi:
                done += (total[hi] - total[lo] - max(0.0, t0 - starts[lo]) - max(0.0, ends[hi - 1] - t1))
        return min(done, t1 - t0)

    def step(self) -> None:
        """The rank's event: walk until it must wait, then park on the collective or come back next round."""
        waits = next(self._walker, False)  # False: the walk ended (done, or stuck for good)
        if waits is None:
            self.sim.events.schedule(self.sim.events.now + 1, self.g.rank, self.step)
        elif isinstance(waits, _Pending):
            waits.blocked.append(self)

    def stuck_message(self) -> str:
        i = self.at
        g = self.g
        waiting = [j for j in g.deps[i] if self.end[j] is None] if i < len(g) else []
        j = waiting[0] if waiting else i
        key = self.keys.get(j)
        what = f"node {g.ids[j]} ({g.names[j][:50]})"
        if key is not None:
            p = self.sim.pending[key]
            members, _ = self.sim.members(key[0])
            missing = [r for r in self.sim.replayed if r in set(members) and r not in p.arrivals]
            what += f", {p.comm.collective} #{key[1]} on process group {key[0]!r}, never issued by rank(s) {missing}"
        return f"  rank {g.rank}: stopped at node {g.ids[i] if i < len(g) else '-'} waiting for {what}"

    def _waits_for(self, j: int) -> _Pending | None:
        """The collective comm node ``j`` waits for, None if no collective can complete it."""
        key = self.keys.get(j)
        return self.sim.pending[key] if key is not None else None

    def _resolve(self, j: int) -> float | None:
        """The end of comm node ``j`` if its collective has been answered (by whichever rank came last)."""
        e = self.end[j]
        if e is None:
            p = self._waits_for(j)
            if p is not None and p.answer is not None:
                e = self._complete(j, p.answer)
        return e

    def _walk(self) -> Iterator[_Pending | None]:
        """Place every node of every repetition; yield what it waits for (class docstring).

        With the scenario's ``overlap = "serialize"`` a rank's communication and compute never overlap: a
        communication is issued only after every compute node placed before it has ended, and a compute
        node starts only after every communication issued before it has completed (it waits for them as
        for dependencies).
        """
        g, sim, result = self.g, self.sim, self.result
        kind, deps, dur, res_of, issue_us = g.kind, g.deps, g.duration_us, g.resource, g.issue_us
        gap = g.gaps_us()
        free, factor, n = self.free, self.factor, len(g)
        handed = _handoff_deps(g, gap)
        comm_node = [COLLECTIVE <= k <= RECV for k in kind]
        compute_kind = COMPUTE
        neg_inf = -math.inf
        serialize = sim.serialize
        it_of, captured = sim.iteration_of[g.rank], sim.captured
        rep_start = 0.0
        compute_floor = comm_floor = 0.0  # serialize: when the rank's compute / communication last ended
        pending: list[int] = []  # serialize: comm nodes issued since a compute node last waited for them
        for _rep in range(sim.reps):
            end, start, issued = self.end, self.start, self.issued
            for i in range(n):
                is_comm = comm_node[i]
                res = res_of[i]
                s_other = free[res]  # resource and non-comm dependencies
                if gap[i] > 0:  # the framework's work on the thread before the node (recorded by the lean pass)
                    for j in handed[i]:  # the thread waited for another thread's work (a backward pass) first
                        e = end[j]
                        if e is not None and e > s_other:
                            s_other = e
                    g_end = s_other + gap[i] * factor
                    self._computed(res, s_other, g_end)
                    s_other = free[res] = g_end
                s_comm = neg_inf  # comm dependencies (waits)
                binding = -1
                node_deps = deps[i]
                drains = serialize and bool(pending) and kind[i] == compute_kind
                if drains:
                    node_deps = (*node_deps, *pending)
                    pending = []
                for j in node_deps:
                    if is_comm:
                        e = issued[j]
                        if e is not None:  # a comm after a comm: ordered by its issue (the group's stream)
                            if e > s_other:
                                s_other = e
                            continue
                    e = end[j]
                    while e is None:
                        e = self._resolve(j)
                        if e is None:
                            self.at = i
                            p = self._waits_for(j)
                            if p is None:
                                return
                            yield p
                    if comm_node[j]:
                        if e > s_comm:
                            s_comm, binding = e, j
                    elif e > s_other:
                        s_other = e
                if drains and s_comm > comm_floor:
                    comm_floor = s_comm
                if s_comm > s_other:
                    result.waited_on[i] = binding
                    s_other = s_comm
                if not is_comm:
                    if kind[i] == compute_kind:
                        if serialize:
                            s_other = max(s_other, comm_floor)
                        d = dur[i] * factor
                        e = s_other + d
                        if d > 0:
                            self._computed(res, s_other, e)
                        if e > compute_floor:
                            compute_floor = e
                    else:
                        e = s_other
                    start[i] = s_other
                    end[i] = e
                    free[res] = e
                    continue
                comm = g.comm[i]
                t = max(s_other, free[res], compute_floor) if serialize else max(s_other, free[res])
                start[i] = t
                if comm.collective == "unpriced":
                    sim.unpriced += 1
                    end[i] = issued[i] = free[res] = t + dur[i]
                    result.intervals.comms.append(CommSpan(t, t, t + dur[i]))
                    result.comm_answers.append(None)
                    comm_floor = max(comm_floor, t + dur[i])
                    continue
                issued[i] = free[res] = result.issue_end_us[i] = t + issue_us[i]
                if serialize:
                    pending.append(i)
                p = self._issue(i, comm, t)
                if comm.blocking:  # it holds the thread until it completes
                    while p.answer is None:
                        self.at = i
                        yield p
                    if end[i] is None:
                        self._complete(i, p.answer)
                elif p.answer is not None:
                    self._complete(i, p.answer)
            for j in self.comm_positions:  # every node placed: the repetition ends when its last comm completes
                while self._resolve(j) is None:
                    self.at = j
                    p = self._waits_for(j)
                    if p is None:
                        return
                    yield p
            ends = cast(list[float], end)  # every node has ended by now
            if serialize:
                comm_floor = max([comm_floor, *(ends[j] for j in pending)])
                pending = []
            it_end = [rep_start] * captured
            for i in range(n):
                k = it_of[i]
                if ends[i] > it_end[k]:
                    it_end[k] = ends[i]
            for k in range(1, captured):  # an iteration ends once everything up to it has ended
                it_end[k] = max(it_end[k], it_end[k - 1])
            result.iteration_end_us.extend(it_end)
            rep_end = it_end[-1]
            result.iteration_us.append(rep_end - rep_start)
            result.start_us, result.end_us = list(start), [e if e is not None else math.nan for e in end]
            rep_start = rep_end
            if _rep + 1 < sim.reps:
                self._new_rep()
                yield None
        self.done = True

    def _issue(self, i: int, comm: CommInfo, t: float) -> _Pending:
        """Record comm node ``i``'s arrival at ``t`` on its collective (answering it if it is the last)."""
        sim = self.sim
        key = self._key(i, comm)
        self.keys[i] = key
        p = sim.pending.get(key)
        if p is None:
            if sim.mesh is not None:
                nbytes, rule = sim.mesh.size(comm.collective, comm.pg, comm.nbytes)
            else:
                _, grows = sim.members(comm.pg) if comm.collective != "send_recv" else ([], False)
                nbytes, rule = retarget(comm, sim.recorded_world, sim.world, grows)
            p = sim.pending[key] = _Pending(comm, nbytes, rule)
        p.arrivals[self.g.rank] = t
        p.member_comms[self.g.rank] = comm
        if comm.collective != "send_recv":
            p.recorded_us[self.g.rank] = self.recorded.own_us(comm.pg, self.rec_start[i], self.g.duration_us[i])
        self._try_answer(key, p)
        return p

    def _key(self, i: int, comm: CommInfo) -> tuple[str, int]:
        if comm.collective == "send_recv":
            me, peer = self.g.rank, comm.peer if comm.peer is not None else -1
            src, dst = (me, peer) if self.g.kind[i] == SEND else (peer, me)
            pair = (src, dst, comm.tag)
            n = self.p2p_seq.get(pair, 0)
            self.p2p_seq[pair] = n + 1
            return f"p2p:{src}->{dst}:{comm.tag}", n
        n = self.seq.get(comm.pg, 0)
        self.seq[comm.pg] = n + 1
        return comm.pg, n

    def _try_answer(self, key: tuple[str, int], p: _Pending) -> None:
        sim = self.sim
        if p.comm.collective == "send_recv":
            src, dst = (int(x) for x in key[0][4:].split(":")[0].split("->"))
            needed = [r for r in (src, dst) if r in sim.graphs]
            if any(r not in p.arrivals for r in needed):
                return
            pg_key = f"pair:{min(src, dst)}:{max(src, dst)}"
            fg = sim.fabric_groups.get(pg_key)
            if fg is None:
                if not (0 <= src < sim.world and 0 <= dst < sim.world):
                    raise InvalidInputError(f"send/recv between ranks {src} and {dst} outside a world of {sim.world}")
                fg = sim.fabric_groups[pg_key] = sim.fabric.group(sorted({src, dst}), needed, real_stragglers=False)
            arrivals = [p.arrivals[r] for r in sorted(needed)]
            recorded = None  # a send may end before its receive does: no member's time is the transfer's
        else:
            needed = sim.replayed_members(p.comm.pg)
            if any(r not in p.arrivals for r in needed):
                return
            fg = sim.fabric_group(p.comm.pg)
            arrivals = [p.arrivals[r] for r in needed]
            recorded = recorded_time_us(sim.recorded_groups.get(p.comm.pg, range(sim.recorded_world)),
                                        p.recorded_us)
        send = recv = None
        if p.comm.collective == "all_to_all_v" and not sim.members(p.comm.pg)[1]:
            send, recv = sim.busiest_splits(fg, p)
        ranks = [sim.ranks[r] for r in (sorted(needed) if p.comm.collective == "send_recv" else needed)]
        ans = sim.fabric.answer(fg, p.comm.collective, p.nbytes, arrivals, send_bytes=send, recv_bytes=recv,
                                compute_us=lambda k, t0, t1: ranks[k].compute_between(t0, t1))
        rule = "priced from its recorded per-peer splits (the busiest member)" if send is not None else p.rule
        p.answer = CollectiveAnswer(key[0], key[1], p.comm.collective, p.nbytes, rule, ans.algorithm,
                                    ans.start_us, ans.end_us, recorded)
        sim.collectives.append(p.answer)
        for rank in p.blocked:
            sim.wake(rank)
        p.blocked.clear()

    def _complete(self, i: int, ans: CollectiveAnswer) -> float:
        """Comm node ``i`` completes with ``ans``; a blocking one held its thread from its issue's end. Its end."""
        self.end[i] = ans.end_us
        self.result.intervals.comms.append(CommSpan(self.start[i], ans.start_us, ans.end_us))
        self.result.comm_answers.append(ans)
        if self.g.comm[i].blocking:
            res = self.g.resource[i]
            self.free[res] = max(self.free[res], ans.end_us)
        return ans.end_us
