"""Answering a collective: when does it complete, given when its real participants arrived?

For one collective on a process group (microseconds on the caller's clock: ``time.perf_counter_ns() / 1000`` in the
live backend, simulated time in a virtual replay):

* **arrivals**: each real member reports when it issued the call; an emulated member mirrors real member
  ``j mod n`` (:func:`mirror_member`) and arrives with it. A straggler (``[[stragglers]]``) arrives late:
  ``arrival' = free + (arrival - free) * slowdown``, ``free`` the group's previous completion; a call its mirror
  issues while the group's previous one still runs (DDP's buckets during the backward pass) is its previous
  ``arrival'`` plus the mirror's compute since its previous issue, stretched: ``prev' + (arrival - prev) *
  slowdown`` (the straggler computes on without waiting for the running call).
* **start** ``= max(free, last arrival)``: a group's collectives run one after another, in issue order.
* **end** ``= start + cost``, ``cost`` the group's price for the collective and size
  (:func:`emulator_core.pricing.pricer.make_pricer`); a call queued behind the previous one pays its own price.
* **beside compute**: a call issued while the group's previous collective still runs adds
  ``overlap * (1 - 1 / r)`` to its cost, ``overlap`` the members' compute since that collective's start (or the
  previous such call's arrival) and ``r = min(s, 1 + delay x calls / cost)`` (:func:`busy_rate`: s the
  calibration's ``busy_slowdown``, ``calls`` and ``cost`` the stream's so far). Where the caller knows each real
  member's compute (``compute_us``: the virtual replay's compute intervals; the live backend's issuing threads' time
  on or waiting for a CPU, exchanged with the arrivals), ``overlap`` is the busiest member's compute in that window,
  each counted up to its own arrival (a member that waited, as FSDP's ranks wait for a prefetched all-gather, slowed
  nothing); without it the whole window is taken as compute. With ``compute_us`` a call that
  arrives after the running stream's end ``free`` is also queued when that stream, slowed so, would still run:
  it starts at ``T = free + c (1 - 1 / r)``, ``c`` the busiest member's compute from the stream's start (or the
  previous counted arrival) to ``min(T, arrival)``, the fixed point (DDP's middle bucket slowed by the backward
  pass beside it, still running when the last bucket is issued). ``delay`` is the calibration's
  ``busy_delay_us`` times the algorithm's steps on the group over those on the calibrated ranks (a file without it:
  ``(s - 1)`` times the price of a ``busy_nbytes`` call, :data:`BUSY_CALL_MAX_US` long without that); a straggler's
  group of compute slowdown k uses ``1 + (s - 1) k`` and ``k x delay``. This effect belongs to CPU nodes (gloo's
  threads share the node's cores with the training step): on GPUs NCCL's kernels hold their own SMs through a
  collective, it has no counterpart there, and ``nbox calibrate`` measures it on CPU ranks only.

The answer depends only on the arguments and the group's previous answers, so real ranks fed the same arrivals
compute the same end, bit for bit. Cost: a dictionary lookup once a (collective, size) is priced on a group; O(real
members + stragglers) otherwise, never O(world size). Why queued and busy calls are answered so:
docs/design/beside-compute.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from emulator_core.network import netmodel as nm
from emulator_core.pricing.pricer import GroupShape, Pricer, calibration_for, group_shape, make_pricer
from emulator_core.scenario import Calibration, Scenario

__all__ = ["Answer", "ComputeBetween", "Fabric", "FabricGroup", "mirror_member", "mirror_weights"]


#: The longest call ``nbox calibrate --busy`` measures ``busy_slowdown`` on (us; ``_calibrate_worker``'s
#: ``BUSY_CALL_MAX_US``: it times the largest size whose call took at most this long): the call whose loss sets the
#: delay per call where the calibration does not record its size.
BUSY_CALL_MAX_US = 20_000.0


def algorithm_steps(collective: str, algorithm: str, p: int) -> float:
    """The steps of ``algorithm`` for ``collective`` on ``p`` ranks (``netmodel.algorithm_terms``; ``p - 1`` for an
    algorithm without a step form), at least 1."""
    try:
        return max(1.0, float(sum(t.steps for t in nm.algorithm_terms(collective, algorithm, p))))
    except ValueError:
        return float(max(1, p - 1))


def busy_rate(slowdown: float, delay_us: float, calls: int, stream_us: float) -> float:
    """How many times slower a stream of ``calls`` collectives that cost ``stream_us`` together progresses beside
    compute, when each call loses ``delay_us`` there and none more than ``slowdown`` times its cost (module
    docstring, "beside compute"): ``min(slowdown, 1 + delay_us * calls / stream_us)``."""
    if slowdown <= 1:
        return 1.0
    if stream_us <= 0:
        return slowdown
    return min(slowdown, 1.0 + delay_us * max(calls, 1) / stream_us)


#: ``compute_us(k, t0, t1)``: real member ``k``'s compute time within ``[t0, t1]``, microseconds.
ComputeBetween = Callable[[int, float, float], float]


def _busiest(t0: float, t1: float, arrivals_us: Sequence[float], compute_us: ComputeBetween) -> float:
    """The most compute any real member did within ``[t0, t1]``, each counted up to its own arrival only (what
    its arrival shows), at most ``t1 - t0``."""
    if t1 <= t0:
        return 0.0
    most = 0.0
    for k, a in enumerate(arrivals_us):
        if a > t0:
            most = max(most, compute_us(k, t0, min(t1, a)))
    return min(most, t1 - t0)


def _slowed_end(free: float, since: float, rate: float, arrivals_us: Sequence[float],
                compute_us: ComputeBetween) -> float:
    """When the running stream ends once slowed by its members' compute: ``T = free + c(since, T) (1 - 1 / rate)``,
    ``c`` the busiest member's compute (:func:`_busiest`), counted up to the members' arrivals at this call. The
    iteration from ``T = free`` rises to the fixed point; it stops within 1 us or after 32 rounds."""
    if rate <= 1.0:
        return free
    loss = 1.0 - 1.0 / rate
    end = free
    for _ in range(32):
        nxt = free + _busiest(since, end, arrivals_us, compute_us) * loss
        if nxt - end < 1.0:
            return max(end, nxt)
        end = nxt
    return end


class Answer(NamedTuple):
    """One answered collective (microseconds on the caller's clock)."""

    start_us: float
    end_us: float
    cost_us: float
    algorithm: str


def mirror_member(j: int, real_positions: Sequence[int]) -> int:
    """The index (into ``real_positions``) of the real member that group member ``j`` mirrors.

    ``real_positions`` are the group positions of the real members, ascending. A real member mirrors
    itself; an emulated member ``j`` mirrors real member ``j mod n``.
    """
    n = len(real_positions)
    if n == 0:
        raise ValueError("a group without real members has no mirrors")
    for k, pos in enumerate(real_positions):
        if pos == j:
            return k
    return j % n


def mirror_weights(group_size: int, real_positions: Sequence[int]) -> list[int]:
    """How many group members each real member stands for (itself included), in O(real members).

    ``weights[k] = 1 + #{emulated j in 0..p-1 : j mod n == k}``; they sum to ``group_size``. An
    average all-reduce over the group then equals the weighted average of the real members' values
    (the plain average when every real member stands for ``p / n`` members).
    """
    n, p = len(real_positions), group_size
    if n == 0:
        raise ValueError("a group without real members has no mirrors")
    if len(set(real_positions)) != n or any(not 0 <= pos < p for pos in real_positions):
        raise ValueError(f"real member positions {list(real_positions)[:16]} must be distinct and in 0..{p - 1}")
    weights = []
    for k in range(n):
        congruent = (p - k + n - 1) // n  # j in [0, p) with j % n == k
        real_congruent = sum(1 for pos in real_positions if pos % n == k)
        weights.append(1 + congruent - real_congruent)
    return weights


@dataclass
class FabricGroup:
    """One process group as the fabric sees it; mutable: ``free_us`` is when its last collective ended.

    Attributes:
        shape: where the group lies on the topology.
        real_positions: group positions of the real members, ascending.
        stragglers: ``(slowdown, index of the real member it mirrors)`` for each straggling member.
        free_us: completion time of the previous collective on this group (``-inf`` before the first).
    """

    shape: GroupShape
    real_positions: tuple[int, ...]
    stragglers: tuple[tuple[float, int], ...]
    free_us: float = -math.inf
    answered: int = 0
    slowest: float = 1.0  # the largest compute slowdown among the members (real or emulated stragglers)

    def __post_init__(self) -> None:
        self._prices: dict[tuple[str, float], tuple[str, float]] = {}
        self._pricers: dict[str, Pricer] = {}
        self._cal: dict[str, Calibration | None] = {}  # collective -> its calibration on this group's shape
        # the running stream beside compute: its start, the latest arrival counted, its busy_slowdown, the delay
        # one of its calls gets beside compute (us), and its calls' count and summed cost so far (us)
        self._busy: tuple[float, float, float, float, int, float] = (-math.inf, -math.inf, 1.0, 0.0, 0, 0.0)
        # per straggler (its index in ``stragglers``): its mirror's previous arrival and its own, stretched
        self._straggled: dict[int, tuple[float, float]] = {}


class Fabric:
    """The emulated network of one scenario: prices and orders the collectives of its groups."""

    def __init__(self, scenario: Scenario) -> None:
        if not isinstance(scenario, Scenario):
            raise ValueError(f"scenario must be a Scenario, got {scenario!r}")
        self.scenario = scenario

    def group(self, ranks: Sequence[int] | None, real_ranks: Sequence[int], *,
              real_stragglers: bool = True) -> FabricGroup:
        """A group of global ``ranks`` (``None``: all ranks, in order) of which ``real_ranks`` are real.

        ``real_stragglers=False``: a real member listed as a straggler is not stretched here, because the
        caller already slows its compute (virtual replay); emulated stragglers always are.

        Raises:
            ValueError: a rank out of range or repeated, or a real rank that is not a member.
        """
        s = self.scenario
        shape = group_shape(s, ranks)
        members = range(s.world_size) if ranks is None else list(ranks)
        if len(set(real_ranks)) != len(real_ranks):
            raise ValueError(f"real ranks {list(real_ranks)[:16]} list a rank twice")
        if ranks is None:
            positions = sorted(real_ranks)
            bad = [r for r in positions if not 0 <= r < s.world_size]
        else:
            index = {g: j for j, g in enumerate(members)}
            bad = [r for r in real_ranks if r not in index]
            positions = sorted(index[r] for r in real_ranks if r in index)
        if bad:
            raise ValueError(f"real rank {bad[0]} is not a member of the group")
        if not positions:
            raise ValueError("a group needs at least one real member")
        stragglers: list[tuple[float, int]] = []
        real_set = set(real_ranks)
        member_set = None if ranks is None else set(members)
        slowest = max([st.slowdown for st in s.stragglers if member_set is None or st.rank in member_set],
                      default=1.0)
        for st in s.stragglers:
            if not real_stragglers and st.rank in real_set:
                continue
            if ranks is None:
                j = st.rank
            else:
                j = index.get(st.rank, -1)
                if j < 0:
                    continue
            stragglers.append((st.slowdown, mirror_member(j, positions)))
        return FabricGroup(shape, tuple(positions), tuple(stragglers), slowest=slowest)

    def price(self, group: FabricGroup, collective: str, nbytes: float) -> tuple[str, float]:
        """``(algorithm, cost_us)`` of ``collective`` on ``nbytes`` over ``group``, cached per group."""
        key = (collective, nbytes)
        hit = group._prices.get(key)
        if hit is None:
            hit = self._pricer(group, collective)(nbytes)
            if len(group._prices) < 65536:
                group._prices[key] = hit
        return hit

    def _calibration(self, group: FabricGroup, collective: str) -> Calibration | None:
        """``collective``'s calibration for ``group``'s shape (:func:`calibration_for`), None without one or for a
        one-rank group; looked up once per group and collective."""
        if collective not in group._cal:
            found = calibration_for(self.scenario, collective, group.shape) if group.shape.size > 1 else None
            group._cal[collective] = found[1] if found is not None else None
        return group._cal[collective]

    def slowed_beside_compute(self, group: FabricGroup, collective: str) -> bool:
        """Whether ``collective`` on ``group`` is slowed beside its members' compute (a CPU node's calibration with
        ``busy_slowdown`` > 1): where a caller's ``compute_us`` can move the answer."""
        return self._slowdown_of(group, collective)[0] > 1.0

    def _slowdown_of(self, group: FabricGroup, collective: str) -> tuple[float, float]:
        """``(busy_slowdown, delay_us)`` of ``collective``'s calibration on ``group``: the cap (1 without one) and
        the time one call loses beside compute (module docstring). The delay is the calibration's ``busy_delay_us``
        times the algorithm's steps on the group over those on the calibrated ranks; in a file without it,
        ``(s - 1)`` times the calibration's call at the size the factor was measured at (:data:`BUSY_CALL_MAX_US`
        where the file does not say). A group with a straggler of compute slowdown k (its CPU k times slower: a CPU
        node's straggler) loses k times as much, cap and delay."""
        cal = self._calibration(group, collective)
        if cal is None or cal.busy_slowdown <= 1:
            return 1.0, 0.0
        k = group.slowest
        if cal.busy_delay_us is not None:
            delay = cal.busy_delay_us * (algorithm_steps(collective, cal.algorithm, group.shape.size)
                                         / algorithm_steps(collective, cal.algorithm, cal.ranks))
        else:
            measured_us = self.price(group, collective, cal.busy_nbytes)[1] if cal.busy_nbytes else BUSY_CALL_MAX_US
            delay = (cal.busy_slowdown - 1.0) * measured_us
        return 1.0 + (cal.busy_slowdown - 1.0) * k, delay * k

    def _pricer(self, group: FabricGroup, collective: str) -> Pricer:
        pricer = group._pricers.get(collective)
        if pricer is None:
            pricer = group._pricers[collective] = make_pricer(self.scenario, collective, group.shape)
        return pricer

    def answer(self, group: FabricGroup, collective: str, nbytes: float, arrivals_us: Sequence[float],
               *, send_bytes: Sequence[float] | None = None,
               recv_bytes: Sequence[float] | None = None,
               compute_us: ComputeBetween | None = None) -> Answer:
        """Answer one collective and advance the group's stream (see the module docstring).

        Args:
            group: from :meth:`group`.
            collective: a costmodels collective name (``all_reduce``, ``all_gather``, ...).
            nbytes: the size in costmodels' convention (the per-rank input; see costmodels' table).
            arrivals_us: issue time of each real member, in ``group.real_positions`` order.
            send_bytes, recv_bytes: per-peer sizes of an ``all_to_all_v`` (p - 1 each), else ``None``.
            compute_us: ``compute_us(k, t0, t1)``, real member ``k``'s compute time within ``[t0, t1]`` (us), where
                the caller knows it (the virtual replay; the live backend on CPU nodes); ``None``: a member
                computed from its previous arrival to this one (module docstring, "beside compute").

        Raises:
            ValueError: wrong number of arrivals, a non-finite arrival, an unknown collective.
        """
        if len(arrivals_us) != len(group.real_positions):
            raise ValueError(f"{collective}: {len(arrivals_us)} arrival times for "
                             f"{len(group.real_positions)} real members")
        free = group.free_us
        if not all(math.isfinite(a) for a in arrivals_us):
            raise ValueError(f"{collective}: arrival times must be finite, got {list(arrivals_us)[:16]}")
        last = max(arrivals_us)
        if group.stragglers:
            base = free if free > -math.inf else min(arrivals_us)
            for i, (slowdown, k) in enumerate(group.stragglers):
                a = arrivals_us[k]
                prev = group._straggled.get(i)
                if prev is not None and a < free and a > prev[0]:  # queued behind the running call: its compute
                    late = max(a, prev[1] + (a - prev[0]) * slowdown)  # since its previous issue, stretched
                else:
                    late = base + (a - base) * slowdown if a > base else a
                group._straggled[i] = (a, late)
                last = max(last, late)
        start = max(free, last)
        if send_bytes is not None or recv_bytes is not None:
            algorithm, cost = self._pricer(group, collective)(nbytes, send_bytes=send_bytes, recv_bytes=recv_bytes)
        else:
            algorithm, cost = self.price(group, collective, nbytes)
        run_start, counted, slowdown, delay, calls, stream_us = group._busy
        spill = free
        if last >= free and compute_us is not None and slowdown > 1 and free > -math.inf:
            spill = _slowed_end(free, max(run_start, counted), busy_rate(slowdown, delay, calls, stream_us),
                                arrivals_us, compute_us)
        if last >= free and spill <= last:  # this call starts the stream anew: the one its successors may find running
            group._busy = (start, last, *self._slowdown_of(group, collective), 1, cost)
        elif last >= free:  # the running stream, slowed by its members' compute, still runs: queued behind it
            start = spill
            group._busy = (run_start, last, slowdown, delay, calls + 1, stream_us + cost)
        elif slowdown > 1:  # queued: the running stream was slowed by its members' compute until now
            rate = busy_rate(slowdown, delay, calls, stream_us)
            group._busy = (run_start, last, slowdown, delay, calls + 1, stream_us + cost)
            since = max(run_start, counted)
            overlap = last - since if compute_us is None else _busiest(since, last, arrivals_us, compute_us)
            cost += max(0.0, overlap) * (1.0 - 1.0 / rate)
        end = start + cost
        group.free_us = end
        group.answered += 1
        return Answer(start, end, cost, algorithm)
