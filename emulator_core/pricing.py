"""Price one collective on a what-if scenario: which algorithm runs, and its modeled time.

:func:`make_pricer` is the one algorithm choice: ``nbox scenario cost`` (:func:`price`), the replay and the
``nbox`` backend (``answer.Fabric``) and sweeps all price through it, so they name the same algorithm.

How a scenario becomes cost-model links (``costmodels.Link``):

* **flat algorithms** (ring, double binary tree, ...) over ranks that span several topology
  dimensions run at the pace of the slowest dimension they cross: the lowest bandwidth and the
  highest latency among the dimensions of size > 1. (A ring over 8 GPUs x 128 nodes crosses the NIC
  on every inter-node hop, so the NIC bounds it.)
* **hierarchical** all-reduce uses every dimension of size > 1, innermost first: reduce-scatter
  within dimension 0, all-reduce across the rest, all-gather within dimension 0
  (``costmodels.hierarchical_all_reduce``).

**calibration**: when a group spans exactly one dimension (or spans none and the topology has exactly
one dimension of size > 1, or only one dimension) and the scenario holds a ``[[calibration]]`` for
(collective, that dimension), the collective runs on that dimension's figures times the calibration's
factors, with its efficiency curve: ``Link(latency_us * latency_factor,
bandwidth_bytes_per_us * bandwidth_factor, Efficiency(points))``; and ``auto`` means the calibrated
algorithm (what the measured library runs) instead of a choice by modeled time.

Otherwise ``auto`` picks the fastest of NCCL's own algorithm set (ring, double binary tree), plus hierarchical
for an all-reduce over more than one dimension. The optimistic ``direct`` models (all p-1 messages at
once) are never chosen for a collective that has a ring or tree model; for those that have none (all-to-all,
all-to-all-v, gather, scatter: NCCL runs them as grouped point-to-point to every peer at once, i.e. direct)
``auto`` takes the fastest of the modeled ones, direct included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from emulator_core import costmodels as cm
from emulator_core.bandwidth import algorithm_bandwidth_gbps, bus_bandwidth_gbps
from emulator_core.scenario import AUTO, Calibration, Dimension, Scenario
from nbox_trace.errors import InvalidInputError, UsageError


class PricingError(InvalidInputError):
    """A collective that cannot be priced on the scenario: an unknown collective or algorithm, or a process
    group whose ranks are not in the scenario's world (the message names them). Exit code 3."""


@dataclass(frozen=True)
class Price:
    """One algorithm's modeled time (us) and nccl-tests bandwidths (GB/s = 1e9 bytes/s)."""

    algorithm: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class GroupShape:
    """Where a process group lies on the topology.

    Attributes:
        size: ranks in the group.
        dims: ``(ranks along it, dimension)`` for every dimension along which the group's members differ,
            innermost first. The count is the number of distinct coordinates the members have on that
            dimension (for a regular group, e.g. "GPU 0 of every node", that is the group's extent there).
    """

    size: int
    dims: tuple[tuple[int, Dimension], ...]


def group_shape(scenario: Scenario, ranks: Sequence[int] | None = None) -> GroupShape:
    """The shape of the group of global ``ranks`` (``None``: every rank) on ``scenario``'s topology.

    Global rank ``r`` has coordinate ``(r // stride_i) % size_i`` on dimension ``i`` (innermost first).
    O(len(ranks) x dimensions); callers cache it per group.

    Raises:
        PricingError: a rank outside ``0 .. world_size - 1``, or a rank listed twice.
    """
    dims = scenario.topology.dims
    if ranks is None:
        return GroupShape(scenario.world_size, tuple((d.size, d) for d in dims if d.size > 1))
    members = list(ranks)
    if len(set(members)) != len(members):
        raise PricingError(f"process group ranks {members[:16]} list a rank twice")
    bad = [r for r in members if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < scenario.world_size]
    if bad:
        raise PricingError(f"process group rank {bad[0]!r} is outside 0..{scenario.world_size - 1} (world size "
                         f"{scenario.world_size})")
    spanned: list[tuple[int, Dimension]] = []
    stride = 1
    for d in dims:
        distinct = len({(r // stride) % d.size for r in members})
        if distinct > 1:
            spanned.append((distinct, d))
        stride *= d.size
    return GroupShape(len(members), tuple(spanned))


def dimension_link(dim: Dimension) -> cm.Link:
    """The cost-model link of one topology dimension (bandwidth converted from Gb/s to bytes/us)."""
    return cm.Link(dim.latency_us, dim.bandwidth_bytes_per_us)


def _spanned(scenario: Scenario, shape: GroupShape) -> list[Dimension]:
    return [d for _, d in shape.dims] or [d for d in scenario.topology.dims if d.size > 1] \
        or list(scenario.topology.dims)


def calibration_for(scenario: Scenario, collective: str, shape: GroupShape) -> tuple[Dimension, Calibration] | None:
    """The dimension and calibration that apply to ``collective`` over a group of ``shape``, if any: the group
    spans exactly one dimension (or none, and the topology has one dimension of size > 1, or one dimension)
    and ``scenario.calibrated(collective, that_dimension.name)`` exists."""
    dims = _spanned(scenario, shape)
    if len(dims) != 1:
        return None
    cal = scenario.calibrated(collective, dims[0].name)
    return (dims[0], cal) if cal is not None else None


def link_for(scenario: Scenario, collective: str, shape: GroupShape) -> cm.Link:
    """The link a flat algorithm of ``collective`` over a group of ``shape`` runs at.

    With a calibration (see :func:`calibration_for`): the dimension's latency (us) and bandwidth (bytes/us)
    times the calibration's factors, with its efficiency curve. Otherwise the slowest dimension it crosses
    (lowest bandwidth, highest latency among the spanned dimensions; all dimensions of size > 1 when the
    group spans none, e.g. one rank), efficiency 1.
    """
    found = calibration_for(scenario, collective, shape)
    if found is not None:
        dim, cal = found
        return cm.Link(dim.latency_us * cal.latency_factor, dim.bandwidth_bytes_per_us * cal.bandwidth_factor,
                       cal.curve)
    dims = _spanned(scenario, shape)
    bandwidth = min(d.bandwidth_bytes_per_us for d in dims)
    latency = max(d.latency_us for d in dims)
    return cm.Link(latency, bandwidth)


Pricer = Callable[..., tuple[str, float]]
#: The all-reduce over every spanned dimension (``costmodels.hierarchical_all_reduce``).
HIERARCHICAL = "hierarchical"


def make_pricer(scenario: Scenario, collective: str, shape: GroupShape, algorithm: str | None = None) -> Pricer:
    """:func:`price_group` for one (collective, group) with everything but the size resolved once.

    The one place an algorithm is chosen: the replay, the backend (through ``answer.Fabric``), sweeps and
    ``nbox scenario cost`` all come here. ``algorithm``: the scenario's for ``collective`` when ``None``.
    ``auto`` is, in order: the calibrated algorithm when a calibration applies (:func:`calibration_for`:
    what the measured library runs); else the fastest by modeled time of NCCL's set (ring, double binary
    tree) plus ``hierarchical`` for an all-reduce over more than one dimension; for a collective with
    neither (all-to-all, gather, ...: NCCL runs them as grouped point-to-point) the fastest of its modeled
    ones, ``direct`` included. Ties go to the earlier in that order (ring first); on a one-rank group
    every algorithm costs 0, so ``auto`` names the first.

    Returns ``pricer(nbytes, **kw) -> (algorithm, time_us)``: the link, the dimensions, the algorithm or
    ``auto``'s candidates are fixed here, so a call only evaluates closed forms (what the emulator does per
    collective it answers). ``kw`` is ``send_bytes``/``recv_bytes`` for all_to_all_v.

    Raises:
        PricingError: unknown collective, or an algorithm not modeled for ``collective``.
    """
    known = _algorithms_for(collective)
    algorithm = scenario.algorithm(collective) if algorithm is None else algorithm
    found = calibration_for(scenario, collective, shape) if algorithm == AUTO else None
    if found is not None:
        algorithm = found[1].algorithm
    if algorithm != AUTO and algorithm not in known:
        raise PricingError(f"unknown algorithm {algorithm!r} for {collective}; known: {', '.join(known)}, auto")
    p = shape.size
    link = link_for(scenario, collective, shape)
    multi = [(n, dimension_link(d)) for n, d in shape.dims]
    if algorithm == HIERARCHICAL:
        if len(multi) < 2:  # over one dimension hierarchical is the flat ring (see costmodels)
            ring = cm.COST_MODELS[("all_reduce", "ring")]
            return lambda nbytes, **kw: (algorithm, ring(nbytes, p, link))
        return lambda nbytes, **kw: (algorithm, cm.hierarchical_all_reduce(nbytes, multi))
    if algorithm != AUTO:
        model = cm.COST_MODELS[(collective, algorithm)]
        return lambda nbytes, **kw: (algorithm, model(nbytes, p, link, **kw))
    nccl = [a for a in cm.NCCL_ALGORITHMS if a in known]
    names = nccl or [a for a in known if a != HIERARCHICAL]
    if p <= 1:
        return lambda nbytes, **kw: (names[0], 0.0)
    models = [(a, cm.COST_MODELS[(collective, a)]) for a in names]
    hierarchical = collective == "all_reduce" and len(multi) > 1

    def pricer(nbytes: float, **kw: Any) -> tuple[str, float]:
        best_name, best = "", math.inf
        for name, model in models:
            t = model(nbytes, p, link, **kw)
            if t < best:
                best_name, best = name, t
        if hierarchical:
            t = cm.hierarchical_all_reduce(nbytes, multi)
            if t < best:
                best_name, best = HIERARCHICAL, t
        return best_name, best
    return pricer


def _algorithms_for(collective: str) -> tuple[str, ...]:
    try:
        return tuple(cm.algorithms_for(collective))
    except ValueError as exc:
        raise PricingError(str(exc)) from None


def price_group(scenario: Scenario, collective: str, nbytes: float, shape: GroupShape,
                **kw: Any) -> tuple[str, float]:
    """The algorithm the scenario uses for ``collective`` on a group of ``shape``, and its time (us).

    The scenario's algorithm for the collective, or ``auto``: the fastest of NCCL's set (ring, double
    binary tree) plus hierarchical for an all-reduce over more than one dimension (a collective with
    neither, e.g. all-to-all: the fastest modeled one). ``hierarchical`` over a group that spans one
    dimension is the flat ring (they are equal, see costmodels). ``kw`` goes to the model
    (``send_bytes``/``recv_bytes`` for all_to_all_v). A one-rank group costs 0. With a calibration (see
    :func:`calibration_for`), ``auto`` is the calibrated algorithm. See :func:`make_pricer` to price many
    sizes on one group.

    Raises:
        PricingError: the scenario names an algorithm not modeled for ``collective``.
    """
    return make_pricer(scenario, collective, shape)(nbytes, **kw)


def price(scenario: Scenario, collective: str, nbytes: int, algorithm: str = "all") -> tuple[list[Price], str]:
    """Modeled time of ``collective`` on ``nbytes`` (the per-rank input, costmodels' convention) over all
    ranks of ``scenario``: one Price per algorithm (or the one named; ``auto``: the chosen one), and the
    algorithm the scenario runs (:func:`make_pricer`'s choice, the one a replay of it uses). ``hierarchical``
    is listed for an all-reduce over more than one dimension, or when the scenario runs it.

    Raises:
        UsageError: unknown collective or ``algorithm`` (the message lists the known ones).
    """
    p = scenario.world_size
    shape = group_shape(scenario)
    try:
        known = cm.algorithms_for(collective)
    except ValueError:
        raise UsageError(f"collective {collective!r}: unknown; known: {', '.join(cm.collectives())}") from None
    if algorithm not in ("all", AUTO) and algorithm not in known:
        raise UsageError(f"--algorithm {algorithm!r}: not modeled for {collective}; known: {', '.join(known)}, "
                         f"auto, all")
    chosen = make_pricer(scenario, collective, shape)(nbytes)[0]
    names = [chosen] if algorithm == AUTO else list(known) if algorithm == "all" else [algorithm]
    prices = []
    for name in names:
        if name == HIERARCHICAL and len(shape.dims) < 2 and name != chosen:
            continue
        t = make_pricer(scenario, collective, shape, name)(nbytes)[1]
        prices.append(Price(name, t, algorithm_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0,
                            bus_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0))
    return prices, chosen
