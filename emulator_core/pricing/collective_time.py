"""The time of one collective on a group's wires: one dimension, or several (flat and per dimension).

:mod:`emulator_core.pricing` builds the wires of a group (its spanned dimensions, each a ``netmodel.Wire``) and
chooses the algorithm; this module turns (collective, algorithm, wires) into ``model(n, **kw) -> us``. The rules
are in :mod:`emulator_core.pricing`'s docstring; each function's docstring says its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from emulator_core.network import ALL, SHIFT, XOR, Racks, step_cost, step_shape
from emulator_core.network import costmodels as cm
from emulator_core.network import netmodel as nm
from emulator_core.scenario import AUTO, Dimension
from nbox_trace.errors import InvalidInputError

__all__ = ["HIERARCHICAL", "NCCL_COLLECTIVES", "NCCL_SET", "PHASES", "Model", "PricingError", "Rules",
           "multi_dim", "one_dim", "phase_candidates", "wire"]


class PricingError(InvalidInputError):
    """A collective that cannot be priced on the scenario: an unknown collective or algorithm, an algorithm the
    group's wiring cannot run, or a process group whose ranks are not in the scenario's world (the message names
    them). Exit code 3."""



#: Per-dimension decomposition over every spanned dimension.
HIERARCHICAL = "hierarchical"
#: NCCL's algorithm set: ``auto``'s candidates for the collectives NCCL runs as rings or trees.
NCCL_SET = ("ring", "double_binary_tree")
#: The collectives NCCL runs as rings or trees (``auto``'s NCCL set applies to them).
NCCL_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
#: The collectives with a per-dimension (hierarchical) form.
PHASES = frozenset({"all_reduce", "reduce_scatter", "all_gather"})
#: nccl-tests' "size" of a collective relative to nbox's ``n`` (the efficiency curve's abscissa).
_OUTPUT_TIMES_P = ("all_gather", "gather", "scatter")
Model = Callable[..., float]


@dataclass(frozen=True)
class Rules:
    aware: bool
    overhead_us: float
    chunks: int


def wire(p: int, dim: Dimension, link: cm.Link) -> nm.Wire:
    racks = Racks(dim.size // dim.racks, dim.oversubscription) if dim.racks > 1 else None
    return nm.Wire(dim.kind, p, link, dim.forwarding == "store_and_forward", dim.in_network_reduction, racks)


def _size_for_efficiency(collective: str, n: float, p: int) -> float:
    return p * n if collective in _OUTPUT_TIMES_P else n


def one_dim(collective: str, algorithm: str, wire: nm.Wire, rules: Rules) -> Model:
    """``model(n, **kw) -> us`` of ``algorithm`` on one wire."""
    p, link = wire.p, wire.link
    if p <= 1:
        return lambda n, **kw: 0.0
    if algorithm == "in_network" and not (wire.kind == "switch" and wire.in_network_reduction):
        raise PricingError(f"algorithm 'in_network' needs a switch dimension with in_network_reduction = true "
                           f"(this group's dimension is a {wire.kind} without it)")
    if algorithm == HIERARCHICAL:  # over one dimension: the ring
        algorithm = "ring"
    if algorithm == "ring" and collective in ("broadcast", "reduce"):
        c = step_cost(wire.kind, p, SHIFT, latency_us=link.latency_us, aware=rules.aware,
                      store_and_forward=wire.store_and_forward, overhead_us=rules.overhead_us, racks=wire.racks)
        chain = cm.Link(c.latency_us, link.bandwidth_bytes_per_us / c.bytes_coefficient, link.efficiency)
        return lambda n, **kw: cm.broadcast_ring(n, p, chain)
    if collective == "all_to_all_v" and algorithm in ("pairwise", "direct"):
        return _all_to_all_v(algorithm, wire, rules)
    if algorithm == "double_binary_tree" and collective == "all_reduce":
        lin = nm.double_binary_tree(wire, aware=rules.aware, overhead_us=rules.overhead_us)
    else:
        try:
            lin = nm.linear_cost(nm.algorithm_terms(collective, algorithm, p), wire, aware=rules.aware,
                                 overhead_us=rules.overhead_us)
        except ValueError as exc:
            raise PricingError(str(exc)) from None
    b, eff = link.bandwidth_bytes_per_us, link.efficiency
    lat, coef = lin
    return lambda n, **kw: lat + coef * n / (b * eff(_size_for_efficiency(collective, n, p)))


def _all_to_all_v(algorithm: str, wire: nm.Wire, rules: Rules) -> Model:
    """All-to-all-v from one rank's view: ``send_bytes[k-1]`` to the rank k places on, ``recv_bytes[k-1]`` from the
    rank k places back. pairwise: step k lasts as long as its larger side on SHIFT(k); direct: one ALL step
    whose busiest link carries the busier direction's bytes times the wiring's load per message."""
    p, link = wire.p, wire.link
    uniform = one_dim("all_to_all", algorithm, wire, rules)

    def model(n: float, send_bytes: Sequence[float] | None = None, recv_bytes: Sequence[float] | None = None) -> float:
        if send_bytes is None and recv_bytes is None:
            return uniform(n)
        send, recv = cm._splits(n, p, send_bytes, recv_bytes)
        beta = link.beta(max(sum(send), sum(recv)))
        if algorithm == "pairwise":
            total = 0.0
            for k, (s, r) in enumerate(zip(send, recv, strict=True), start=1):
                c = step_cost(wire.kind, p, SHIFT, d=k, latency_us=link.latency_us, aware=rules.aware,
                              store_and_forward=wire.store_and_forward, overhead_us=rules.overhead_us,
                              racks=wire.racks)
                total += c.latency_us + c.bytes_coefficient * max(s, r) * beta
            return total
        c = step_cost(wire.kind, p, ALL, latency_us=link.latency_us, aware=rules.aware,
                      store_and_forward=wire.store_and_forward, messages=p - 1, overhead_us=rules.overhead_us,
                      racks=wire.racks)
        busiest = max(sum(send), sum(recv))
        return c.latency_us + c.bytes_coefficient * busiest / (p - 1) * beta
    return model


def phase_candidates(collective: str, wire: nm.Wire) -> tuple[str, ...]:
    """``auto``'s algorithms for one dimension's phase: NCCL's set, and ``in_network`` where the switch reduces."""
    names = tuple(a for a in NCCL_SET if a in nm.ALGORITHMS[collective])
    if collective == "all_reduce" and wire.kind == "switch" and wire.in_network_reduction:
        names += ("in_network",)
    return names


def _fastest(collective: str, names: Sequence[str], wire: nm.Wire, rules: Rules) -> Model:
    models = [one_dim(collective, a, wire, rules) for a in names]
    return lambda n, **kw: min(m(n, **kw) for m in models)


def _hierarchical(collective: str, wires: list[nm.Wire], rules: Rules, per_dim: Sequence[str] | None) -> Model:
    """Dimension by dimension: reduce-scatter innermost first, the outermost dimension's all-reduce, all-gather
    back outermost first (an all-gather alone: outermost first too, so the slow outer dimensions move the small
    shard, as in NCCL's and ASTRA-sim's hierarchical all-gather); each phase on its own wire with its own
    algorithm, the whole cut into ``rules.chunks`` chunks pipelined through the phases:
    ``sum_i T_i(s_i / k) + (k - 1) max_d sum_{i on d} T_i(s_i / k)``: the first chunk crosses every phase, the
    others follow at the pace of the busiest dimension (whose links serve all its phases: an all-reduce's
    reduce-scatter and all-gather share theirs). Themis' dimension-aware pipeline (Rashidi et al., ISCA 2022)."""
    def model_for(phase: str, i: int) -> Model:
        w = wires[i]
        if per_dim is not None and per_dim[i] != AUTO:
            return one_dim(phase, per_dim[i], w, rules)
        return _fastest(phase, phase_candidates(phase, w), w, rules)

    phases: list[tuple[Model, float, int]] = []  # (model, its size as a multiple of n, its dimension)
    scale = 1.0
    if collective == "all_gather":  # the mirror of reduce-scatter: outermost first, while the shard is small
        for i in reversed(range(len(wires))):
            phases.append((model_for("all_gather", i), scale, i))
            scale *= wires[i].p
    else:
        inward = wires if collective == "reduce_scatter" else wires[:-1]
        for i, w in enumerate(inward):
            phases.append((model_for("reduce_scatter", i), scale, i))
            scale /= w.p
        if collective == "all_reduce":
            phases.append((model_for("all_reduce", len(wires) - 1), scale, len(wires) - 1))
            for i in reversed(range(len(wires) - 1)):
                scale *= wires[i].p
                phases.append((model_for("all_gather", i), scale / wires[i].p, i))
    k = rules.chunks

    def model(n: float, **kw: Any) -> float:
        times = [m(n * s / k) for m, s, _ in phases]
        if k == 1:
            return sum(times)
        busy = [0.0] * len(wires)  # a dimension's links serve its phases of every chunk one after another
        for t, (_, _, i) in zip(times, phases, strict=True):
            busy[i] += t
        return sum(times) + (k - 1) * max(busy)
    return model


def _flat_ring(collective: str, wires: list[nm.Wire], size: int, rules: Rules) -> Model:
    """A flat ring across several dimensions, as NCCL builds it: one ring per rank of the inner dimensions (its
    channels), each carrying an equal share and crossing dimension j through a different rank's links, so
    dimension j's links carry ``1 / prod(inner extents)`` of a step's bytes (every rank has its own links in every
    dimension: a rail-optimized fabric); a step lasts as long as the slowest dimension's share (latency and
    per-byte time, each the largest). One dimension: the single ring."""
    costs = [step_cost(w.kind, w.p, SHIFT, latency_us=w.link.latency_us, aware=rules.aware,
                       store_and_forward=w.store_and_forward, overhead_us=rules.overhead_us) for w in wires]
    lat = max(c.latency_us for c in costs)
    rings = [math.prod(w.p for w in wires[:j]) for j in range(len(wires))]
    per_byte = max(c.bytes_coefficient / (w.link.bandwidth_bytes_per_us * k)
                   for c, w, k in zip(costs, wires, rings, strict=True))
    if collective in ("broadcast", "reduce"):
        chain = cm.Link(lat, 1.0 / per_byte)
        return lambda n, **kw: cm.broadcast_ring(n, size, chain)
    terms = nm.algorithm_terms(collective, "ring", size)
    steps_frac = sum(t.steps * t.fraction for t in terms)
    steps = sum(t.steps for t in terms)
    return lambda n, **kw: steps * lat + steps_frac * per_byte * n


def _flat_direct(collective: str, wires: list[nm.Wire], size: int, rules: Rules) -> Model:
    """Flat direct across dimensions: a message crosses every dimension its destination differs in (dimension
    order), so dimension j carries ``size / p_j`` times its own all-pairs load; the step lasts as long as the
    busiest dimension, plus the longest path's traversals and the rank's ``size - 1`` messages' overhead."""
    terms = nm.algorithm_terms(collective, "direct", size)
    lat = sum(step_shape(w.kind, w.p, ALL)[1] * w.link.latency_us for w in wires)
    per_byte = 0.0
    for w in wires:
        load = step_shape(w.kind, w.p, ALL)[0] * size / w.p if rules.aware else 1.0
        if rules.aware and w.store_and_forward and w.kind == "switch":
            load += 1
        per_byte = max(per_byte, load / w.link.bandwidth_bytes_per_us)
    total_lat = sum(t.steps * (lat + t.messages * rules.overhead_us) for t in terms)
    total_frac = sum(t.steps * t.fraction for t in terms)
    return lambda n, **kw: total_lat + total_frac * per_byte * n


def _flat_tree(wires: list[nm.Wire], rules: Rules) -> Model:
    """NCCL's double binary tree across dimensions: a tree within each dimension (NCCL: a chain inside the node,
    trees between nodes), one channel per rank of the inner dimensions so dimension j's links carry
    ``1 / prod(inner extents)`` of the ``2 n`` each rank moves; every level's traversals up and down."""
    lat = per_byte = 0.0
    channels = 1
    for w in wires:
        one = nm.double_binary_tree(w, aware=rules.aware, overhead_us=rules.overhead_us)
        lat += one.latency_us
        per_byte = max(per_byte, one.coefficient / (w.link.bandwidth_bytes_per_us * channels))
        channels *= w.p
    return lambda n, **kw: lat + per_byte * n


def _flat_rhd(collective: str, wires: list[nm.Wire], size: int, rules: Rules) -> Model | None:
    """Recursive halving/doubling across dimensions of power-of-two extent: exchange ``XOR(d)`` runs on the
    dimension the partner differs in, as ``XOR(d / stride)`` there. ``None`` when an extent is not a power of 2."""
    if any(w.p & (w.p - 1) for w in wires):
        return None
    lat = per_byte_n = 0.0
    for t in nm.algorithm_terms(collective, "recursive_halving_doubling", size):
        stride = 1
        for w in wires:
            if t.d < stride * w.p:
                c = step_cost(w.kind, w.p, XOR, d=t.d // stride, latency_us=w.link.latency_us, aware=rules.aware,
                              store_and_forward=w.store_and_forward, overhead_us=rules.overhead_us)
                lat += t.steps * c.latency_us
                per_byte_n += t.steps * c.bytes_coefficient * t.fraction / w.link.bandwidth_bytes_per_us
                break
            stride *= w.p
    return lambda n, **kw: lat + per_byte_n * n


def _slowest(collective: str, algorithm: str, wires: list[nm.Wire], size: int, rules: Rules) -> Model:
    """A flat algorithm with no per-dimension form: as slow as the slowest dimension could run it alone, i.e. the
    largest of its time over the whole group on each spanned dimension's wiring and figures."""
    models = [one_dim(collective, algorithm, nm.Wire(w.kind, size, w.link, w.store_and_forward, False), rules)
              for w in wires]
    return lambda n, **kw: max(m(n, **kw) for m in models)


def multi_dim(collective: str, algorithm: str, wires: list[nm.Wire], size: int, rules: Rules,
               per_dim: Sequence[str] | None) -> Model:
    if algorithm == HIERARCHICAL:
        if collective not in PHASES:
            raise PricingError(f"algorithm 'hierarchical' is modeled for {', '.join(sorted(PHASES))}, "
                               f"not {collective}")
        return _hierarchical(collective, wires, rules, per_dim)
    if algorithm == "ring" and collective in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                              "broadcast", "reduce"):
        return _flat_ring(collective, wires, size, rules)
    if algorithm == "direct" and collective != "send_recv":
        return _flat_direct(collective, wires, size, rules)
    if algorithm == "double_binary_tree" and collective == "all_reduce":
        return _flat_tree(wires, rules)
    if algorithm == "recursive_halving_doubling":
        rhd = _flat_rhd(collective, wires, size, rules)
        if rhd is not None:
            return rhd
    if algorithm == "in_network":
        raise PricingError("algorithm 'in_network' runs within one switch dimension; this group spans "
                           f"{len(wires)} dimensions (use hierarchical: its all-reduce phase can reduce in the switch)")
    return _slowest(collective, algorithm, wires, size, rules)

