"""How ranks are wired along one topology dimension, and what one communication step costs on it.

A step is a pattern every rank of the dimension follows at once, with messages of ``m`` bytes: ``SHIFT(d)`` (rank
``r`` sends to ``r + d`` mod p), ``XOR(d)`` (exchanges with ``r xor d``, d a power of two), ``ALL`` (every rank to
every other, ``p - 1`` messages each), ``TREE(d, fan)`` (one level of a binary tree whose edges span ``d`` ranks,
``fan`` children per parent at once). For each (kind, pattern) :func:`step_shape` gives, in closed form, the busiest
link's load in messages and the hops of the longest message (``tests/test_wiring.py`` checks each against explicit
routes). Routes: ``ring`` bidirectional, shortest path, distance exactly ``p/2`` forward; ``switch`` one non-blocking
switch (one traversal of ``latency_us``, two links); ``fully_connected`` a link per ordered pair.

:func:`step_cost` is ``latency_us + bytes_coefficient * m / bandwidth``, plus ``messages * message_overhead_us``:

* congestion-aware, cut-through: ``load * m / b + hops * L``, or ``min(hops, 2) * L`` when ``load > hops`` (the
  path's traversals overlap the busiest link's queue but for one link at each end);
* congestion-aware, store-and-forward: on a switch ``(load + 1) * m / b``; on a ring ``max(load, h) * m / b``;
* congestion-unaware (ASTRA-sim's analytical backend): ``hops * L + m / b``, every message alone on its path.

**Racks** (:class:`Racks`, ``switch`` only): ranks in racks of ``size`` consecutive ranks behind their own switches,
joined by one uplink per rack of bandwidth the rack's links' sum over ``oversubscription``. :func:`uplink_messages`
counts the messages of a step that leave a rack (racks of ``m``, a group of ``p``: SHIFT(d) ``min(d, p - d, m)``; ALL
``m (p - m)``; XOR(d) ``m`` when ``d >= m`` for power-of-two racks, counted over the first rack otherwise;
TREE(d, fan) ``fan x max(1, m / 2d)`` when ``d >= m``, an estimate), the uplink is the busiest link when
``c x oversubscription / m`` exceeds the ranks' own links' load, and a message across racks pays two more
traversals of ``latency_us``; on a GPU cluster, the leaf-spine uplinks of a fabric that is not rail-optimized.
Sources: docs/design/network-model.md.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ALL", "SHIFT", "SWEEP", "TREE", "XOR", "Racks", "StepCost", "ring_distance", "step_cost", "step_shape",
           "sweep_cost", "uplink_messages"]

SHIFT = "shift"
XOR = "xor"
ALL = "all"
#: SHIFT(k) for every k = 1 .. p-1 in turn (pairwise exchange), priced in closed form by :func:`sweep_cost`.
SWEEP = "sweep"
TREE = "tree"


class Racks(NamedTuple):
    """A switch dimension's racks: ``size`` consecutive ranks per rack, an uplink of ``oversubscription``:1
    (module docstring)."""

    size: int
    oversubscription: float


#: Racks larger than this count their XOR crossings by the power-of-two rule (no enumeration).
_ENUMERATE_MAX = 4096


def uplink_messages(p: int, pattern: str, racks: Racks, d: int = 1, fan: int = 1) -> int:
    """The messages of one step of ``pattern`` over ``p`` ranks that leave one rack through its uplink, per
    direction (the busiest rack; module docstring). 0 when the group lies in one rack."""
    m = racks.size
    if p <= m:
        return 0
    if pattern == ALL:
        return m * (p - m)
    if pattern == SHIFT:
        dd = d % p
        return min(dd, p - dd, m)
    if pattern == XOR:
        if m & (m - 1) == 0 or m > _ENUMERATE_MAX:
            return m if d >= m else 0
        return sum(1 for x in range(m) if (x ^ d) >= m)
    if pattern == TREE:
        return fan * max(1, m // (2 * d)) if d >= m else 0
    raise ValueError(f"unknown pattern {pattern!r}")


def ring_distance(d: int, p: int) -> int:
    """Hops between ranks ``d`` apart on a bidirectional ring of ``p`` (shortest way; ``p/2`` forward)."""
    d %= p
    return min(d, p - d)


def _ring_all_pairs_load(p: int) -> int:
    """Busiest directed ring link's load (in messages) when every rank sends one message to every other.

    Forward messages of distance 1 .. ceil(p/2) - 1, plus distance p/2 for even p (ties go forward): by symmetry
    each forward link carries ``sum(d) (+ p/2)`` messages: ``p(p+2)/8`` for even p, ``(p^2-1)/8`` for odd p.
    """
    half = (p - 1) // 2
    load = half * (half + 1) // 2
    return load + p // 2 if p % 2 == 0 else load


def step_shape(kind: str, p: int, pattern: str, d: int = 1, fan: int = 1) -> tuple[int, int]:
    """``(load, hops)`` of one step: the busiest link's load in messages, the longest message's link traversals.

    ``p`` ranks along the dimension (>= 2), ``d`` the pattern's rank distance, ``fan`` a tree level's children
    per parent. A switch traversal is one hop (rank -> switch -> rank pays ``latency_us`` once).
    """
    if kind == "fully_connected":
        return 1, 1  # every ordered pair has its own link: no two messages of one step share one
    if kind == "switch":
        if pattern == ALL:
            return p - 1, 1  # a rank's p-1 messages leave through its one port (and p-1 arrive on it)
        if pattern == TREE:
            return fan, 1  # a parent's port carries its children's messages
        return 1, 1
    if kind != "ring":
        raise ValueError(f"unknown dimension kind {kind!r}")
    if pattern == ALL:
        return _ring_all_pairs_load(p), p // 2
    h = ring_distance(d, p)
    if pattern == TREE:
        return 1, h  # children at +d and -d arrive from opposite directions; edges of one level do not overlap
    # SHIFT(d): every rank's message runs h links the same way: each link carries h of them. XOR(d): the senders
    # of one direction form blocks of d consecutive ranks; a window of h <= d links sees at most h of them.
    return h, h


def sweep_cost(kind: str, p: int, *, latency_us: float, aware: bool, store_and_forward: bool,
               overhead_us: float = 0.0, racks: Racks | None = None) -> StepCost:
    """The sum of :func:`step_cost` of ``SHIFT(k)`` for k = 1 .. p-1 (pairwise exchange), in closed form: on a
    ring the distances sum to ``floor(p^2 / 4)`` (each step's load equals its hops); elsewhere ``p - 1`` times a
    neighbour step; with racks, each step summed (O(p))."""
    if p <= 1:
        return StepCost(0.0, 0.0)
    if racks is not None and kind == "switch" and p > racks.size:
        steps = [step_cost(kind, p, SHIFT, d=k, latency_us=latency_us, aware=aware,
                           store_and_forward=store_and_forward, overhead_us=overhead_us, racks=racks)
                 for k in range(1, p)]
        return StepCost(sum(c.latency_us for c in steps), sum(c.bytes_coefficient for c in steps))
    if kind != "ring":
        one = step_cost(kind, p, SHIFT, latency_us=latency_us, aware=aware, store_and_forward=store_and_forward,
                        overhead_us=overhead_us)
        return StepCost((p - 1) * one.latency_us, (p - 1) * one.bytes_coefficient)
    hops = p * p // 4
    return StepCost(hops * latency_us + (p - 1) * overhead_us, float(hops if aware else p - 1))


class StepCost(NamedTuple):
    """One step as ``latency_us + bytes_coefficient * m / bandwidth_bytes_per_us`` (microseconds)."""

    latency_us: float
    bytes_coefficient: float


def step_cost(kind: str, p: int, pattern: str, *, d: int = 1, fan: int = 1, latency_us: float,
              aware: bool, store_and_forward: bool, messages: int = 1, overhead_us: float = 0.0,
              racks: Racks | None = None) -> StepCost:
    """The linear cost of one step of ``pattern`` on a dimension of ``kind`` with ``p`` ranks (module docstring).

    ``latency_us`` is one traversal; ``messages`` the messages each rank injects in the step (for the overhead);
    ``racks`` a switch dimension's racks (None: one switch).
    """
    load, hops = step_shape(kind, p, pattern, d, fan)
    if racks is not None and kind == "switch":
        crossing = uplink_messages(p, pattern, racks, d, fan)
        if crossing:
            hops += 2
            per_message = racks.oversubscription / racks.size  # the uplink's time for one message, in link units
            if not aware:
                return StepCost(hops * latency_us + messages * overhead_us, max(1.0, per_message))
            uplink = crossing * per_message
            if uplink > load:
                lat = hops * latency_us + messages * overhead_us
                return StepCost(lat, uplink + (1.0 if store_and_forward else 0.0))
    if not aware:
        return StepCost(hops * latency_us + messages * overhead_us, 1.0)
    # a queue longer than the path hides the path's latency behind it, but for the link at each end
    lat = (min(hops, 2) if load > hops else hops) * latency_us + messages * overhead_us
    if store_and_forward and kind == "switch":
        return StepCost(lat, float(load + 1))
    if store_and_forward and kind == "ring":
        return StepCost(lat, float(max(load, hops)))
    return StepCost(lat, float(load))
