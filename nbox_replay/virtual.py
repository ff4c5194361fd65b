"""Replay in virtual time: recorded compute durations, collectives answered by the emulator core, no torch.

Every replayed rank walks its graph in node order (the recorded order: a thread or stream runs its nodes
in that order). A node starts when its resource (thread or stream) is free and its dependencies are met:

* a **compute** node needs its dependencies' ends; it runs for ``duration / compute_scale`` (times the
  rank's straggler slowdown);
* a **collective** or **send/recv** is *issued* on its thread once its dependencies are met, where a
  dependency on another comm node counts from that node's issue (collectives of one group are ordered
  on the group's stream by the fabric, not by the thread). Issuing costs the thread ``issue_us``; a
  blocking (synchronous) one holds the thread until it completes. It completes when the fabric says:
  :meth:`emulator_core.answer.Fabric.answer` with the issue times of the replayed members of its group
  (matched by process group and position in that group's sequence); emulated members mirror them;
* a node whose dependency has not completed yet stops its rank until it does, so ranks advance in turn;
  when no rank can advance and some are unfinished, the collectives they wait for can never complete
  (:class:`ReplayDeadlock` names them).

World-size retargeting (design.md): the world group grows to the target world size, sizes follow the
collective's semantics (:func:`retarget`), other groups keep their members. Everything is deterministic:
the same graphs and scenario give the same times, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from emulator_core.answer import Fabric, FabricGroup
from emulator_core.scenario import Scenario
from nbox_replay.graph import COLLECTIVE, COMPUTE, RECV, SEND, CommInfo, RankGraph
from nbox_trace.errors import InvalidInputError

__all__ = ["RankResult", "ReplayDeadlock", "SimResult", "retarget", "simulate"]

#: How a collective's size changes when the world grows from W_rec to W (design.md, "Replay semantics").
RULES = {
    "all_reduce": ("keep", "data-parallel all-reduce: the gradient bucket keeps its size"),
    "all_gather": ("shard", "FSDP all-gather: the per-rank shard shrinks as W_rec/W (the parameter is fixed)"),
    "reduce_scatter": ("keep", "FSDP reduce-scatter: the unsharded input keeps its size (its shards shrink)"),
    "all_to_all": ("keep", "data-parallel all-to-all: each rank's buffer keeps its size, per-peer splits "
                           "shrink as W_rec/W"),
    "all_to_all_v": ("keep", "data-parallel all-to-all-v: each rank's buffer keeps its size"),
}


class ReplayDeadlock(InvalidInputError):
    """The replayed ranks wait for each other forever (mismatched collectives or send/recv)."""


def retarget(comm: CommInfo, recorded_world: int, world: int, group_grows: bool) -> tuple[float, str]:
    """The size (bytes, costmodels' convention) at world size ``world``, and the rule that gave it."""
    if not group_grows or world == recorded_world:
        return float(comm.nbytes), "unchanged (group not resized)"
    how, text = RULES.get(comm.collective, ("keep", f"{comm.collective}: size kept"))
    if how == "shard":
        return comm.nbytes * recorded_world / world, text
    return float(comm.nbytes), text


@dataclass
class RankResult:
    """One replayed rank. Times in microseconds of virtual time; lists per repetition of the graph."""

    rank: int
    iteration_us: list[float] = field(default_factory=list)
    compute_us: float = 0.0
    exposed_comm_us: float = 0.0
    comm_us: float = 0.0  # sum of the modeled durations of its collectives (start to end)
    start_us: list[float] = field(default_factory=list)  # per node of the last repetition
    end_us: list[float] = field(default_factory=list)
    issue_end_us: dict[int, float] = field(default_factory=dict)  # comm node -> when its issue finished
    waited_on: dict[int, int] = field(default_factory=dict)  # node -> the comm node it waited for

    @property
    def overlapped_comm_us(self) -> float:
        return max(0.0, self.comm_us - self.exposed_comm_us)


@dataclass
class CollectiveAnswer:
    """One answered collective (the same for every member)."""

    pg: str
    seq: int
    collective: str
    nbytes: float
    rule: str
    algorithm: str
    start_us: float
    end_us: float
    exposed_us: float = 0.0  # summed over the replayed ranks that waited for it


@dataclass
class SimResult:
    """The outcome of one virtual replay."""

    world_size: int
    ranks: dict[int, RankResult]
    collectives: list[CollectiveAnswer]
    unpriced: int
    nodes_replayed: int

    def iteration_us(self) -> list[float]:
        """Per repetition, the slowest replayed rank's iteration time."""
        reps = len(next(iter(self.ranks.values())).iteration_us)
        return [max(r.iteration_us[k] for r in self.ranks.values()) for k in range(reps)]


@dataclass
class _Pending:
    comm: CommInfo
    nbytes: float
    rule: str
    arrivals: dict[int, float] = field(default_factory=dict)
    waiters: dict[int, int] = field(default_factory=dict)  # rank -> node position
    answer: CollectiveAnswer | None = None


class _Sim:
    def __init__(self, graphs: Mapping[int, RankGraph], scenario: Scenario, groups: Mapping[str, Sequence[int]],
                 recorded_world: int, repetitions: int) -> None:
        self.graphs = dict(sorted(graphs.items()))
        self.scenario = scenario
        self.fabric = Fabric(scenario)
        self.world = scenario.world_size
        self.recorded_world = recorded_world
        self.reps = repetitions
        self.replayed = sorted(self.graphs)
        self.groups: dict[str, tuple[list[int], bool]] = {}
        for name, members in groups.items():
            ms = sorted(members)
            grows = ms == list(range(recorded_world)) and self.world != recorded_world
            self.groups[name] = (list(range(self.world)) if grows else ms, grows)
        self.fabric_groups: dict[str, FabricGroup] = {}
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.collectives: list[CollectiveAnswer] = []
        self.unpriced = 0
        self._replayed_members: dict[str, list[int]] = {}

    def members(self, pg: str) -> tuple[list[int], bool]:
        found = self.groups.get(pg)
        if found is None:  # not declared anywhere: the world, like torch's default group
            found = self.groups[pg] = (list(range(self.world)), self.world != self.recorded_world)
        return found

    def replayed_members(self, pg: str) -> list[int]:
        """The replayed ranks that are members of ``pg`` (cached)."""
        found = self._replayed_members.get(pg)
        if found is None:
            members = set(self.members(pg)[0])
            found = self._replayed_members[pg] = [r for r in self.replayed if r in members]
        return found

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


def simulate(graphs: Mapping[int, RankGraph], scenario: Scenario, *, groups: Mapping[str, Sequence[int]],
             recorded_world: int, repetitions: int = 1) -> SimResult:
    """Replay ``graphs`` (replayed rank -> graph) on ``scenario`` in virtual time (module docstring).

    Args:
        groups: process group name -> its members' global ranks at the recorded world size.
        recorded_world: the world size the trace was recorded at.
        repetitions: how many times each rank's graph runs back to back (collectives keep their order).

    Raises:
        ReplayDeadlock: the ranks cannot all finish (names each stuck rank, node and collective).
        InvalidInputError: a replayed rank is outside the world, or a group has no replayed member.
    """
    if repetitions < 1:
        raise InvalidInputError(f"repetitions must be >= 1, got {repetitions}")
    bad = [r for r in graphs if not 0 <= r < scenario.world_size]
    if bad:
        raise InvalidInputError(f"replayed rank {bad[0]} is outside the what-if world of {scenario.world_size} ranks")
    sim = _Sim(graphs, scenario, groups, recorded_world, repetitions)
    runners = {r: _Runner(sim, g) for r, g in sim.graphs.items()}
    while True:
        progressed = False
        for runner in runners.values():
            progressed |= runner.run()
        if all(r.done for r in runners.values()):
            break
        if not progressed:
            raise ReplayDeadlock("the replayed ranks wait for each other forever:\n" + "\n".join(
                r.stuck_message() for r in runners.values() if not r.done))
    ranks = {r: runner.result for r, runner in runners.items()}
    return SimResult(scenario.world_size, ranks, sim.collectives, sim.unpriced,
                     sum(len(g) for g in sim.graphs.values()) * repetitions)


class _Runner:
    """One rank's walk through its graph (see the module docstring)."""

    def __init__(self, sim: _Sim, g: RankGraph) -> None:
        self.sim, self.g = sim, g
        self.result = RankResult(g.rank)
        self.free = [0.0] * len(g.resources)
        self.rep = 0
        self.cursor = 0
        self.done = len(g) == 0
        self.rep_start = 0.0
        self.rep_end = 0.0
        self.seq: dict[str, int] = {}
        self.p2p_seq: dict[tuple[int, int, int], int] = {}
        self.comm_node = [COLLECTIVE <= k <= RECV for k in g.kind]
        self.comm_positions = [i for i, c in enumerate(self.comm_node) if c]
        scale = sim.scenario.compute_scale
        slow = sim.scenario.slowdown(g.rank)
        self.factor = slow / scale
        self._new_rep()
        if self.done:
            self.result.iteration_us = [0.0] * sim.reps

    def _new_rep(self) -> None:
        n = len(self.g)
        self.end: list[float | None] = [None] * n
        self.start: list[float] = [0.0] * n
        self.issued: list[float | None] = [None] * n
        self.keys: dict[int, tuple[str, int]] = {}
        self.blocked_at = -1

    def stuck_message(self) -> str:
        i = self.cursor
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

    def _resolve(self, j: int) -> float | None:
        """The end of comm node ``j`` if its collective has been answered (by whichever rank came last)."""
        e = self.end[j]
        if e is None:
            key = self.keys.get(j)
            if key is not None:
                ans = self.sim.pending[key].answer
                if ans is not None:
                    self._complete(j, ans, blocking=False)
                    e = self.end[j]
        return e

    def run(self) -> bool:
        """Advance as far as possible; True if any node was placed or completed."""
        if self.done:
            return False
        g = self.g
        kind, deps, dur, res_of = g.kind, g.deps, g.duration_us, g.resource
        end, start, issued, free = self.end, self.start, self.issued, self.free
        comm_node = self.comm_node
        factor = self.factor
        result = self.result
        moved = False
        n = len(g)
        compute_kind = COMPUTE
        neg_inf = -math.inf
        compute_us = 0.0
        rep_end = self.rep_end
        cursor = self.cursor
        try:
            while cursor < n:
                i = cursor
                if self.blocked_at == i:  # a blocking collective issued earlier: has it completed?
                    if self._resolve(i) is None:
                        return moved
                    self.blocked_at = -1
                    moved = True
                    cursor += 1
                    continue
                is_comm = comm_node[i]
                res = res_of[i]
                s_other = free[res]  # resource and non-comm dependencies
                s_comm = neg_inf  # comm dependencies (waits)
                binding = -1
                for j in deps[i]:
                    if is_comm:
                        e = issued[j]
                        if e is not None:  # a comm after a comm: ordered by its issue (the group's stream)
                            if e > s_other:
                                s_other = e
                            continue
                    e = end[j]
                    if e is None:
                        self.cursor, self.rep_end = cursor, rep_end
                        e = self._resolve(j)
                        rep_end = self.rep_end
                        if e is None:
                            return moved
                    if comm_node[j]:
                        if e > s_comm:
                            s_comm, binding = e, j
                    elif e > s_other:
                        s_other = e
                moved = True
                if s_comm > s_other:
                    wait = s_comm - s_other
                    result.exposed_comm_us += wait
                    result.waited_on[i] = binding
                    key = self.keys.get(binding)
                    if key is not None and (ans := self.sim.pending[key].answer) is not None:
                        ans.exposed_us += wait
                    s_other = s_comm
                if is_comm:
                    self.cursor, self.rep_end = cursor, rep_end
                    ok = self._issue(i, s_other)
                    rep_end = self.rep_end
                    if not ok:
                        self.blocked_at = i
                        return moved
                else:
                    if kind[i] == compute_kind:
                        d = dur[i] * factor
                        e = s_other + d
                        compute_us += d
                    else:
                        e = s_other
                    start[i] = s_other
                    end[i] = e
                    free[res] = e
                    if e > rep_end:
                        rep_end = e
                cursor += 1
        finally:
            self.cursor = cursor
            self.rep_end = max(self.rep_end, rep_end)
            result.compute_us += compute_us
        for j in self.comm_positions:  # every node placed: the repetition ends when its last comm completes
            if end[j] is None and self._resolve(j) is None:
                return moved
        result.iteration_us.append(self.rep_end - self.rep_start)
        result.start_us, result.end_us = list(start), [e if e is not None else math.nan for e in end]
        self.rep += 1
        if self.rep >= self.sim.reps:
            self.done = True
            return True
        self.rep_start = self.rep_end
        self.cursor = 0
        self._new_rep()
        return True

    def _issue(self, i: int, ready: float) -> bool:
        """Issue comm node ``i`` at ``ready`` (thread permitting); False when it must wait (blocking comm)."""
        g, sim = self.g, self.sim
        comm = g.comm[i]
        res = g.resource[i]
        t = max(ready, self.free[res])
        self.start[i] = t
        if comm.collective == "unpriced":
            sim.unpriced += 1
            done = t + g.duration_us[i]
            self.end[i] = self.issued[i] = self.free[res] = done
            self.rep_end = max(self.rep_end, done)
            return True
        issue_end = t + g.issue_us[i]
        self.issued[i] = issue_end
        self.result.issue_end_us[i] = issue_end
        self.free[res] = issue_end
        key = self._key(i, comm)
        self.keys[i] = key
        p = sim.pending.get(key)
        if p is None:
            _, grows = sim.members(comm.pg) if comm.collective != "send_recv" else ([], False)
            nbytes, rule = retarget(comm, sim.recorded_world, sim.world, grows)
            p = sim.pending[key] = _Pending(comm, nbytes, rule)
        p.arrivals[g.rank] = t
        p.waiters[g.rank] = i
        self._try_answer(key, p)
        if p.answer is not None:
            self._complete(i, p.answer, blocking=comm.blocking)
            return True
        return not comm.blocking  # a blocking one holds the thread: re-visited until answered

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
        else:
            needed = sim.replayed_members(p.comm.pg)
            if any(r not in p.arrivals for r in needed):
                return
            fg = sim.fabric_group(p.comm.pg)
            arrivals = [p.arrivals[r] for r in needed]
        ans = sim.fabric.answer(fg, p.comm.collective, p.nbytes, arrivals)
        p.answer = CollectiveAnswer(key[0], key[1], p.comm.collective, p.nbytes, p.rule, ans.algorithm,
                                    ans.start_us, ans.end_us)
        sim.collectives.append(p.answer)

    def _complete(self, i: int, ans: CollectiveAnswer, blocking: bool) -> None:
        self.end[i] = ans.end_us
        self.result.comm_us += ans.end_us - ans.start_us
        self.rep_end = max(self.rep_end, ans.end_us)
        if blocking or self.g.comm[i].blocking:  # the thread waited from the end of the issue to completion
            res = self.g.resource[i]
            issue_end = self.issued[i] or 0.0
            wait = max(0.0, ans.end_us - issue_end)
            self.result.exposed_comm_us += wait
            ans.exposed_us += wait
            self.free[res] = max(self.free[res], ans.end_us)
