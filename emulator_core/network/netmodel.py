"""Collective algorithms as sequences of steps on the topology: the time of one collective on one group.

Each algorithm over ``p`` ranks of one dimension is a list of :class:`Term` s, ``count`` steps of a ``wiring``
pattern with messages of ``fraction * n`` bytes; :func:`wiring.step_cost` prices a step on the dimension's wiring,
so the whole collective is ``latency_us + coefficient * n / (b * e(size))`` (:class:`Linear`), ``b`` the dimension's
bandwidth (bytes/us), ``e`` its efficiency at the collective's nccl-tests size, ``n`` in ``costmodels``' convention.

* ``ring``: reduce-scatter ``p-1`` x SHIFT(1) of n/p; all-gather ``p-1`` x SHIFT(1) of n; all-reduce both;
  all-to-all (ASTRA-sim's ring): ``p(p-1)/2`` x SHIFT(1) of n/p; broadcast/reduce: a pipelined chain (optimal chunks).
* ``recursive_halving_doubling``: reduce-scatter log2 p x XOR(2^i) of n/2^(i+1); all-gather the mirror (distance
  p/2 first, size n·2^i); for p not a power of two, Bruck's shifts (reduce-scatter, all-gather) and Thakur et al.'s
  fold (all-reduce: two extra steps of n/2 and n).
* ``direct``: one ALL step, ``p - 1`` messages per rank (reduce-scatter n/p, all-gather n, all-to-all n/p per
  peer); all-reduce = direct reduce-scatter + direct all-gather.
* ``double_binary_tree``: NCCL's two pipelined binary trees: ``2 n / b`` times the ring's contention factor for
  trees, plus the tree depth's traversals up and down.
* ``binary_tree``: one unpipelined binary tree, reduce up ``ceil(log2 p)`` levels then broadcast down:
  ``2 x sum over levels of TREE(d, fan)`` (ASTRA-sim 2.0's ``doubleBinaryTree``).
* ``pairwise`` (all-to-all): ``p - 1`` x SHIFT(k) of n/p. ``binomial_tree``: broadcast, reduce ceil(log2 p) x
  SHIFT(p/2^(i+1)) of n; gather, scatter: level i moves n·2^i. ``dissemination`` (barrier): ceil(log2 p) x SHIFT(2^i)
  of 0 bytes. send_recv: SHIFT(1) of n.
* ``in_network`` (all-reduce on a reducing switch, NVLS / SHARP): SHIFT(1) of n, to the switch and back once.

Sources of each form: docs/design/network-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from emulator_core.network import costmodels as cm
from emulator_core.network.wiring import ALL, SHIFT, SWEEP, TREE, XOR, Racks, ring_distance, step_cost, sweep_cost

__all__ = ["ALGORITHMS", "Linear", "Term", "Wire", "algorithm_terms", "algorithms_for", "linear_cost"]

#: collective -> the algorithms modeled on the topology, in ``auto``'s tie-break order (ring first).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "double_binary_tree", "recursive_halving_doubling", "direct", "binary_tree",
                   "in_network", "hierarchical"),
    "reduce_scatter": ("ring", "recursive_halving_doubling", "direct", "hierarchical"),
    "all_gather": ("ring", "recursive_halving_doubling", "direct", "hierarchical"),
    "broadcast": ("ring", "binomial_tree"),
    "reduce": ("ring", "binomial_tree"),
    "gather": ("binomial_tree", "direct"),
    "scatter": ("binomial_tree", "direct"),
    "all_to_all": ("pairwise", "direct", "ring"),
    "all_to_all_v": ("pairwise", "direct"),
    "barrier": ("dissemination",),
    "send_recv": ("direct",),
}


def algorithms_for(collective: str) -> tuple[str, ...]:
    """The algorithm names nbox models for ``collective``; ``ValueError`` naming the known collectives if unknown."""
    try:
        return ALGORITHMS[collective]
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(ALGORITHMS)}") from None


class Term(NamedTuple):
    """``steps`` steps of ``pattern`` (wiring) with messages of ``fraction * n`` bytes, ``messages`` per rank."""

    steps: float
    pattern: str
    fraction: float
    d: int = 1
    fan: int = 1
    messages: int = 1


@dataclass(frozen=True)
class Wire:
    """One topology dimension as a group sees it: ``p`` of its ranks in the group.

    ``link``: latency per traversal (us), the rank's bandwidth to a neighbour / the switch / a peer (bytes/us,
    per direction) and the efficiency curve; ``kind``, ``store_and_forward`` and ``in_network_reduction`` as in
    ``scenario_topology.Dimension``; ``racks``: a switch dimension's racks (``wiring.Racks``; None: one switch).
    """

    kind: str
    p: int
    link: cm.Link
    store_and_forward: bool = False
    in_network_reduction: bool = False
    racks: Racks | None = None


class Linear(NamedTuple):
    """``latency_us + coefficient * n / (bandwidth * e(size))`` microseconds for ``n`` bytes."""

    latency_us: float
    coefficient: float


def _log2_floor(p: int) -> int:
    return p.bit_length() - 1


def _ceil_log2(p: int) -> int:
    return (p - 1).bit_length()


def _rhd_reduce_scatter(p: int) -> list[Term]:
    """Recursive halving: XOR(2^i) with n/2^(i+1), distance doubling while the size halves. For p not a power of
    two, Bruck's dissemination form: ceil(log2 p) shifts by 2^i moving (p-1)/p of n in all (Thakur et al. 2005;
    Bruck et al. 1997)."""
    k = _ceil_log2(p)
    if p & (p - 1) == 0:
        return [Term(1, XOR, 1 / (2 << i), d=1 << i) for i in range(k)]
    fractions = [1 / (2 << i) for i in range(k - 1)]
    fractions.append((p - 1) / p - sum(fractions))
    return [Term(1, SHIFT, f, d=1 << i) for i, f in enumerate(fractions)]


def _rhd_all_gather(p: int) -> list[Term]:
    """Recursive doubling: XOR(p/2^(i+1)) with n·2^i (the mirror of the reduce-scatter). For p not a power of two,
    Bruck's: ceil(log2 p) shifts by 2^i moving (p-1) n in all."""
    k = _ceil_log2(p)
    if p & (p - 1) == 0:
        return [Term(1, XOR, float(1 << i), d=p >> (i + 1)) for i in range(k)]
    sizes = [float(1 << i) for i in range(k - 1)]
    sizes.append(p - 1 - sum(sizes))
    return [Term(1, SHIFT, f, d=1 << i) for i, f in enumerate(sizes)]


def _rhd_all_reduce(p: int) -> list[Term]:
    """Rabenseifner's all-reduce: halving reduce-scatter then doubling all-gather of the shard. For p not a power
    of two, Thakur et al.'s fold onto q = 2^floor(log2 p) ranks: the extras hand over half their buffer first and
    get the whole result back last."""
    q = 1 << _log2_floor(p)
    body = [*_rhd_reduce_scatter(q), *[t._replace(fraction=t.fraction / q) for t in _rhd_all_gather(q)]]
    return body if q == p else [Term(1, SHIFT, 0.5), *body, Term(1, SHIFT, 1.0)]


def _tree_levels(p: int) -> list[Term]:
    """The levels of ASTRA-sim's / NCCL's binary tree over p ranks, root first: the root's one child at p/2
    (rounded up to a power of two), then two children per parent at half the distance each level."""
    depth = _ceil_log2(p)
    return [Term(1, TREE, 1.0, d=1 << (depth - 1 - j), fan=1 if j == 0 else 2) for j in range(depth)]


def algorithm_terms(collective: str, algorithm: str, p: int) -> list[Term]:
    """The steps of ``algorithm`` for ``collective`` over ``p`` ranks of one dimension (module docstring).

    Raises ``ValueError`` for an algorithm with no step form here (``hierarchical`` is composed over dimensions,
    the ring broadcast is a pipelined chain: see ``pricing``).
    """
    if p <= 1:
        return []
    if algorithm == "ring":
        if collective == "reduce_scatter":
            return [Term(p - 1, SHIFT, 1 / p)]
        if collective == "all_gather":
            return [Term(p - 1, SHIFT, 1.0)]
        if collective == "all_reduce":
            return [Term(2 * (p - 1), SHIFT, 1 / p)]
        if collective == "all_to_all":
            return [Term(p * (p - 1) / 2, SHIFT, 1 / p)]
    if algorithm == "recursive_halving_doubling":
        if collective == "reduce_scatter":
            return _rhd_reduce_scatter(p)
        if collective == "all_gather":
            return _rhd_all_gather(p)
        if collective == "all_reduce":
            return _rhd_all_reduce(p)
    if algorithm == "direct":
        if collective in ("reduce_scatter", "all_to_all", "all_to_all_v"):
            return [Term(1, ALL, 1 / p, messages=p - 1)]
        if collective in ("all_gather", "gather", "scatter"):
            return [Term(1, ALL, 1.0, messages=p - 1)]
        if collective == "all_reduce":
            return [Term(2, ALL, 1 / p, messages=p - 1)]
        if collective == "send_recv":
            return [Term(1, SHIFT, 1.0)]
    if algorithm == "binary_tree" and collective == "all_reduce":
        return [*_tree_levels(p), *_tree_levels(p)]
    if algorithm == "pairwise" and collective in ("all_to_all", "all_to_all_v"):
        return [Term(1, SWEEP, 1 / p)]  # SHIFT(k) for k = 1 .. p-1, summed in closed form
    if algorithm == "binomial_tree":
        k = _ceil_log2(p)
        if collective in ("broadcast", "reduce"):
            return [Term(1, SHIFT, 1.0, d=max(1, (1 << k) >> (i + 1))) for i in range(k)]
        if collective in ("gather", "scatter"):  # level i moves 2^i pieces (the last level what is left)
            sizes = [float(1 << i) for i in range(k - 1)]
            sizes.append(p - 1 - sum(sizes))
            return [Term(1, SHIFT, f, d=1 << i) for i, f in enumerate(sizes)]
    if algorithm == "dissemination" and collective == "barrier":
        return [Term(1, SHIFT, 0.0, d=1 << i) for i in range(_ceil_log2(p))]
    if algorithm == "in_network" and collective == "all_reduce":
        return [Term(1, SHIFT, 1.0)]
    raise ValueError(f"algorithm {algorithm!r} has no step form for {collective}")


def linear_cost(terms: Sequence[Term], wire: Wire, *, aware: bool, overhead_us: float) -> Linear:
    """Sum the terms' step costs on ``wire``: a :class:`Linear` in the collective's ``n`` (bytes)."""
    lat = coef = 0.0
    for t in terms:
        if t.pattern == SWEEP:
            c = sweep_cost(wire.kind, wire.p, latency_us=wire.link.latency_us, aware=aware,
                           store_and_forward=wire.store_and_forward, overhead_us=overhead_us, racks=wire.racks)
        else:
            c = step_cost(wire.kind, wire.p, t.pattern, d=t.d, fan=t.fan, latency_us=wire.link.latency_us,
                          aware=aware, store_and_forward=wire.store_and_forward, messages=t.messages,
                          overhead_us=overhead_us, racks=wire.racks)
        lat += t.steps * c.latency_us
        coef += t.steps * c.bytes_coefficient * t.fraction
    return Linear(lat, coef)


def double_binary_tree(wire: Wire, *, aware: bool, overhead_us: float) -> Linear:
    """NCCL's double binary tree all-reduce, pipelined: up and down the tree depth's traversals, and ``2 n / b``
    times the wiring's contention factor for the tree's busiest link (1 on a switch or fully connected; on a
    ring every level's edges are in flight at once, ``ceil(depth / 2)`` of them on the busiest link, an
    estimate; with racks, the uplink when it is slower). Pipelined in many small chunks, so store-and-forward adds
    only a chunk per level (neglected).
    Sources: Sanders, Speck & Träff 2009; NCCL's tree all-reduce (reduce and broadcast pipelined in chunks)."""
    depth = _ceil_log2(wire.p)
    hops = sum(ring_distance(1 << j, wire.p) for j in range(depth)) if wire.kind == "ring" else depth
    lat = 2 * (hops * wire.link.latency_us + depth * overhead_us)
    coef = 2.0 * max(1, math.ceil(depth / 2)) if wire.kind == "ring" and aware else 2.0
    if wire.racks is not None and wire.kind == "switch" and wire.p > wire.racks.size and aware:
        # each of the two trees crosses a rack's uplink once each way, carrying its half of the buffer up and the
        # result down: the uplink moves 2 n / 2 per direction at size / oversubscription links' rate (an estimate)
        coef = max(coef, 2.0 * wire.racks.oversubscription / wire.racks.size)
    return Linear(lat, coef)
