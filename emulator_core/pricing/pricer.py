"""Price one collective on a what-if scenario: which algorithm runs, and its modeled time.

:func:`make_pricer` is the one algorithm choice and the one pricing path: ``nbox scenario cost`` (:func:`price`), the
replays, the ``nbox`` backend (``answer.Fabric``) and sweeps all price through it. :func:`group_shape` finds the
topology dimensions a group spans and its extent on each; each becomes a ``netmodel.Wire`` priced on its wiring:

* over **one dimension**, the algorithm's steps with link contention (``[network] congestion``), the per-message
  overhead and, with a calibration, its factors and efficiency curve;
* over **several**, ``hierarchical`` (all-reduce, reduce-scatter, all-gather): reduce-scatter inward, the outermost
  dimension's all-reduce, all-gather outward, each dimension with its own algorithm, in ``[network] chunks``
  pipelined chunks (Themis). A flat ``ring`` is NCCL's (one ring per rank of the inner dimensions: an outer dimension
  carries ``1 / prod(inner extents)`` of a step, a step costs the slowest dimension's share); flat ``direct`` loads
  each dimension with the messages that cross it; flat ``recursive_halving_doubling`` puts each exchange on the
  dimension its partner differs in; the double binary tree is a tree per dimension with NCCL's channels; the other
  flat algorithms cost their slowest dimension's time over the whole group (an approximation).

**Calibration**: a group spanning exactly one dimension (or none, on a topology with one dimension of size > 1) with
a ``[[calibration]]`` for (collective, dimension) is priced at the calibrated latency, bandwidth and efficiency, and
``auto`` means the calibrated algorithm; a larger group than the calibration's ``ranks`` is extrapolated through the
topology model (:func:`extrapolation_note`). A ``[[nccl_fit]]`` prices its collective under ``auto`` for groups with
its GPUs per node (``emulator_core.scenario.nccl_fit``; reported as ``nccl_fit``).

``auto`` otherwise: with ``[network] library = "nccl"``, NCCL's tuner (``nccl_tuner``) for the collectives it tunes
and NCCL's point-to-point all-to-all (``nccl_p2p``);
else the fastest modeled of ring and double binary tree, plus ``hierarchical`` over several dimensions and
``in_network`` on a reducing switch; for collectives without a ring or tree (all-to-all(-v), gather, scatter) the
fastest of every modeled algorithm, ``direct`` included. Times are microseconds, sizes bytes (costmodels' convention).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from emulator_core.network import BUS_FACTORS, algorithm_bandwidth_gbps, bus_bandwidth_gbps
from emulator_core.network import costmodels as cm
from emulator_core.network import netmodel as nm
from emulator_core.pricing.collective_time import (
    HIERARCHICAL,
    NCCL_COLLECTIVES,
    NCCL_SET,
    PHASES,
    Model,
    PricingError,
    Rules,
    multi_dim,
    one_dim,
    phase_candidates,
    wire,
)
from emulator_core.pricing.nccl_curve import between, prepare
from emulator_core.scenario import AUTO, Calibration, Datasheet, Dimension, Scenario, nccl_fit
from nbox_trace.errors import UsageError
from nbox_trace.units import format_bytes


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
    """The cost-model link of one topology dimension: latency per traversal (us), the rank's bandwidth to a
    neighbour / the switch / a peer (bytes/us, per direction)."""
    return cm.Link(dim.latency_us, dim.bandwidth_bytes_per_us)


def _spanned(scenario: Scenario, shape: GroupShape) -> list[tuple[int, Dimension]]:
    if shape.dims:
        return list(shape.dims)
    dims = [d for d in scenario.topology.dims if d.size > 1] or list(scenario.topology.dims)
    return [(shape.size, dims[0])] if len(dims) == 1 else [(d.size, d) for d in dims]


def calibration_for(scenario: Scenario, collective: str, shape: GroupShape) -> tuple[Dimension, Calibration] | None:
    """The dimension and calibration that apply to ``collective`` over a group of ``shape``, if any: the group
    spans exactly one dimension (or none, and the topology has one dimension of size > 1, or one dimension)
    and ``scenario.calibrated(collective, that_dimension.name)`` exists."""
    dims = _spanned(scenario, shape)
    if len(dims) != 1:
        return None
    cal = scenario.calibrated(collective, dims[0][1].name)
    return (dims[0][1], cal) if cal is not None else None


def extrapolation_note(scenario: Scenario, collective: str, shape: GroupShape) -> str | None:
    """``"extrapolated from p = 2"`` (and why) when a calibration applies to a group larger than it measured."""
    found = calibration_for(scenario, collective, shape)
    if found is None or shape.size <= found[1].ranks:
        return None
    dim, cal = found
    what = f"{cal.library} on " if cal.library else ""
    lo, hi = cal.sizes_bytes or (0, 0)
    sizes = f", {format_bytes(lo)} to {format_bytes(hi)}" if cal.sizes_bytes else ""
    return (f"{collective} on {dim.name!r}: calibrated with {what}{cal.ranks} ranks{sizes}, extrapolated from "
            f"p = {cal.ranks} to p = {shape.size} through the topology model")


def link_for(scenario: Scenario, collective: str, shape: GroupShape) -> cm.Link:
    """The link (latency per traversal, bandwidth, efficiency) a single-dimension group of ``shape`` runs on:
    the dimension's figures times a calibration's factors with its curve when one applies (see
    :func:`calibration_for`); for a group over several dimensions, the slowest (lowest bandwidth, highest
    latency) of them, which the flat algorithms without a per-dimension form run at."""
    found = calibration_for(scenario, collective, shape)
    if found is not None:
        dim, cal = found
        return cm.Link(dim.latency_us * cal.latency_factor, dim.bandwidth_bytes_per_us * cal.bandwidth_factor,
                       cal.curve)
    dims = [d for _, d in _spanned(scenario, shape)]
    return cm.Link(max(d.latency_us for d in dims), min(d.bandwidth_bytes_per_us for d in dims))


Pricer = Callable[..., tuple[str, float]]


def _rules(scenario: Scenario) -> Rules:
    net = scenario.network
    return Rules(net.congestion == "aware", net.message_overhead_us, net.chunks)


def _auto_candidates(collective: str, wires: list[nm.Wire]) -> list[str]:
    known = nm.ALGORITHMS[collective]
    nccl = [a for a in NCCL_SET if a in known] if collective in NCCL_COLLECTIVES else []
    if not nccl:
        return [a for a in known if a not in (HIERARCHICAL, "in_network")]
    if len(wires) > 1:
        return [*nccl, HIERARCHICAL] if collective in PHASES else nccl
    return [*nccl, *[a for a in phase_candidates(collective, wires[0]) if a not in nccl]]


def make_pricer(scenario: Scenario, collective: str, shape: GroupShape, algorithm: str | None = None) -> Pricer:
    """:func:`price_group` for one (collective, group) with everything but the size resolved once.

    The one place an algorithm is chosen (module docstring): the replay, the backend (through ``answer.Fabric``),
    sweeps and ``nbox scenario cost`` all come here. ``algorithm``: the scenario's for ``collective`` when ``None``
    (a per-dimension list in the scenario means ``hierarchical`` with those algorithms, or the one for the group's
    dimension). Ties in ``auto`` go to the earlier candidate (ring first); a one-rank group costs 0.

    Returns ``pricer(nbytes, **kw) -> (algorithm, time_us)``: wires, links and candidates are fixed here, so a call
    evaluates closed forms only. ``kw`` is ``send_bytes``/``recv_bytes`` for all_to_all_v.

    Raises:
        PricingError: unknown collective, an algorithm not modeled for ``collective``, or one the group's wiring
            cannot run (``in_network`` without a reducing switch).
    """
    known = _algorithms_for(collective)
    per_dim: tuple[str, ...] | None = None
    if algorithm is None:
        algorithm = scenario.algorithm(collective)
        per_dim = scenario.dimension_algorithms(collective)
    found = calibration_for(scenario, collective, shape) if algorithm == AUTO and per_dim is None else None
    if found is not None:
        algorithm = found[1].algorithm
    if algorithm != AUTO and algorithm not in known:
        raise PricingError(f"unknown algorithm {algorithm!r} for {collective}; known: {', '.join(known)}, auto")
    rules = _rules(scenario)
    spanned = _spanned(scenario, shape)
    if shape.size <= 1:
        first = known[0] if algorithm == AUTO else algorithm
        return lambda nbytes, **kw: (first, 0.0)
    index = {d.name: i for i, d in enumerate(scenario.topology.dims)}
    if len(spanned) == 1:
        wires = [wire(shape.size, spanned[0][1], link_for(scenario, collective, shape))]
    else:
        wires = [wire(p, d, dimension_link(d)) for p, d in spanned]
    group_dims = per_dim and tuple(per_dim[index[d.name]] for _, d in spanned)
    if group_dims is not None and len(wires) == 1:
        algorithm, group_dims = group_dims[0], None
    elif group_dims is not None:
        algorithm = HIERARCHICAL

    def model_of(name: str) -> Model:
        if len(wires) == 1:
            return one_dim(collective, name, wires[0], rules)
        return multi_dim(collective, name, wires, shape.size, rules, group_dims)

    if algorithm != AUTO:
        model, chosen = model_of(algorithm), algorithm
        return lambda nbytes, **kw: (chosen, model(nbytes, **kw))
    fitted = _fit_pricer(scenario, collective, shape, spanned)
    if fitted is not None:
        return fitted
    nccl = _nccl_pricer(scenario, collective, shape, spanned)
    if nccl is not None:
        return nccl
    models = [(a, model_of(a)) for a in _auto_candidates(collective, wires)]

    def pricer(nbytes: float, **kw: Any) -> tuple[str, float]:
        best_name, best = "", math.inf
        for name, model in models:
            t = model(nbytes, **kw)
            if t < best:
                best_name, best = name, t
        return best_name, best
    return pricer


def _nccl_pricer(scenario: Scenario, collective: str, shape: GroupShape,
                 spanned: list[tuple[int, Dimension]]) -> Pricer | None:
    """NCCL's own choice (``nccl_tuner``) when the scenario says ``library = "nccl"`` and NCCL tunes
    ``collective`` (all-reduce, all-gather, reduce-scatter, broadcast, reduce), and all-to-all(-v) as NCCL's
    point-to-point group (``nccl_p2p``, reported ``p2p/Simple``); ``None`` otherwise. The host CPU and the p2p
    message size come from ``[network] host_cpu`` / ``p2p_chunk_bytes``. NCCL's view
    of the topology: the innermost dimension is the node (NVLink; with one dimension every rank is a node of its
    own), the others the network; a group's ranks on one node and its node count come from its shape; NVLS when
    the node's switch reduces, CollNet when a network dimension's does. NCCL's own latency tables replace the
    dimensions' ``latency_us`` for these collectives; the name is NCCL's ``algorithm/protocol``. The network
    dimension's ``fabric`` (the slowest spanned one's), when set, gives NCCL's model its transport's latency (its
    ``net_latency_us`` where it says one), its protocols and its hops' store-and-forward slices
    (``emulator_core.network.fabric_kinds``)."""
    from emulator_core.network import net_fabric
    from emulator_core.pricing.nccl_p2p import DEFAULT_P2P_CHUNK_BYTES, nccl_all_to_all_us
    from emulator_core.pricing.nccl_tuner import nccl_plan, nccl_supports

    p2p = collective in ("all_to_all", "all_to_all_v")
    if scenario.network.library != "nccl" or not (p2p or nccl_supports(collective)):
        return None
    dims = scenario.topology.dims
    node = dims[0] if len(dims) > 1 else None  # NCCL's view: the innermost dimension is the node (NVLink)
    on_node = next((p for p, d in spanned if node is not None and d.name == node.name), 1)
    outer = [d for p, d in spanned if node is None or d.name != node.name] or [d for d in dims if d is not node]
    if shape.size % on_node:
        raise PricingError(f"{collective} over {shape.size} ranks with {on_node} on a node: NCCL's model needs the "
                           f"same number of ranks on every node")
    slowest = min(outer, key=lambda d: d.bandwidth_bytes_per_us)
    net = net_fabric(slowest.fabric) if slowest.fabric else None
    if net is not None and slowest.net_latency_us is not None:  # a fitted or measured figure in place of the kind's
        net = replace(net, latency_us=slowest.net_latency_us)
    cpu = scenario.network.host_cpu or "intel"
    intra_gbps = (node or outer[0]).bandwidth_bytes_per_us / cm.BYTES_PER_US_PER_GBPS
    inter_gbps = slowest.bandwidth_bytes_per_us / cm.BYTES_PER_US_PER_GBPS
    if p2p:
        nnodes, chunk = shape.size // on_node, scenario.network.p2p_chunk_bytes or DEFAULT_P2P_CHUNK_BYTES
        latency = net.latency_us if net else 0.0

        def p2p_pricer(nbytes: float, **kw: Any) -> tuple[str, float]:
            try:
                return "p2p/Simple", nccl_all_to_all_us(
                    nbytes, shape.size, nnodes, intra_bw_gbps=intra_gbps, inter_bw_gbps=inter_gbps,
                    inter_latency_us=latency, cpu=cpu, chunk_bytes=chunk, send_bytes=kw.get("send_bytes"),
                    recv_bytes=kw.get("recv_bytes"))
            except ValueError as exc:
                raise PricingError(f"NCCL's all-to-all: {exc}") from None
        return p2p_pricer
    try:
        plan = nccl_plan(collective, shape.size, shape.size // on_node,
                         intra_bw_gbps=intra_gbps, inter_bw_gbps=inter_gbps, cpu=cpu,
                         nvls=node is not None and node.in_network_reduction,
                         collnet=any(d.in_network_reduction for d in outer),
                         inter_latency_us=net.latency_us if net else None,
                         net_protocols=net.protocols if net else None,
                         net_slice_bytes=net.slice_bytes if net else None)
    except ValueError as exc:
        raise PricingError(f"NCCL's tuner: {exc}") from None

    def pricer(nbytes: float, **kw: Any) -> tuple[str, float]:
        choice = plan.choose(nbytes)
        return f"{choice.algorithm}/{choice.protocol}", choice.time_us
    return pricer


#: The name ``auto`` reports for a collective priced by a measured nccl-tests curve (``[[nccl_fit]]``).
FITTED = "nccl_fit"


def datasheet_of(scenario: Scenario) -> Datasheet:
    """The datasheet figures an ``[[nccl_fit]]`` scales by: the innermost dimension is the node (NVLink), the
    others the network (as NCCL's view in :func:`_nccl_pricer`); GB/s per GPU per direction."""
    dims = scenario.topology.dims
    node, outer = dims[0], (list(dims[1:]) or [dims[0]])
    return Datasheet(node.bandwidth_bytes_per_us / cm.BYTES_PER_US_PER_GBPS,
                  min(d.bandwidth_bytes_per_us for d in outer) / cm.BYTES_PER_US_PER_GBPS,
                  nvls=len(dims) > 1 and node.in_network_reduction,
                  collnet=len(dims) > 1 and any(d.in_network_reduction for d in outer))


def _fit_pricer(scenario: Scenario, collective: str, shape: GroupShape,
                spanned: list[tuple[int, Dimension]]) -> Pricer | None:
    """A measured nccl-tests curve's model (``emulator_core.scenario.nccl_fit``) when the scenario has one for
    ``collective`` with the group's GPUs per node (its extent on the innermost dimension; on a one-dimension
    topology every rank is a node of one GPU); ``None`` otherwise.

    A curve prices what it measured: its node-count regime (1, 2, more nodes) and the step messages of its table.
    Where the scenario also has NCCL's datasheet model (``library = "nccl"``), a group in another regime is priced
    by that model, and a size whose step message lies beyond the table (above its largest, or below its smallest
    when the curve measured no latency floor) by that model clamped to the curve's end, ``max(datasheet, fit at the
    largest)`` above and ``min(datasheet, fit at the smallest)`` below: still non-decreasing in size. Without the
    datasheet model the curve extrapolates (``nccl_fit``'s docstring)."""
    if not scenario.nccl_fit or collective not in BUS_FACTORS:
        return None
    dims = scenario.topology.dims
    on_node = next((p for p, d in spanned if len(dims) > 1 and d.name == dims[0].name), 1)
    if shape.size % on_node:
        return None
    nodes = shape.size // on_node
    fit = nccl_fit.choose_fit(scenario.nccl_fit, collective, nodes, on_node)
    if fit is None:
        return None
    datasheet = _nccl_pricer(scenario, collective, shape, spanned)
    if datasheet is not None and nccl_fit.regime(fit.nodes) != nccl_fit.regime(nodes):
        return datasheet
    fabric = datasheet_of(scenario)
    p = shape.size
    times_p = collective in ("all_gather", "gather", "scatter")
    pair = nccl_fit.bracket(scenario.nccl_fit, collective, nodes, on_node)
    model = between(prepare(pair[0], nodes, fabric), prepare(pair[1], nodes, fabric), nodes) if pair is not None \
        else prepare(fit, nodes, fabric)
    used = pair if pair is not None else (fit,)
    lo = min(f.busbw[0][0] for f in used) if all(f.latency_us == 0 for f in used) else 0.0
    hi = max(f.busbw[-1][0] for f in used)

    def size_of(m: float) -> float:  # the nccl-tests size whose step message is m
        return m / nccl_fit.step_bytes(collective, 1.0, p)

    def pricer(nbytes: float, **kw: Any) -> tuple[str, float]:
        size = nbytes * p if times_p else nbytes
        m = nccl_fit.step_bytes(collective, size, p)
        if datasheet is None or lo <= m <= hi:
            return FITTED, model(size)
        name, t = datasheet(nbytes, **kw)
        edge = size_of(hi if m > hi else lo)
        return name, max(t, model(edge)) if m > hi else min(t, model(edge))
    return pricer


def _algorithms_for(collective: str) -> tuple[str, ...]:
    try:
        return nm.algorithms_for(collective)
    except ValueError as exc:
        raise PricingError(str(exc)) from None


def price_group(scenario: Scenario, collective: str, nbytes: float, shape: GroupShape,
                **kw: Any) -> tuple[str, float]:
    """The algorithm the scenario uses for ``collective`` on a group of ``shape``, and its time (us).

    See :func:`make_pricer` (this is it, for one size). ``kw`` goes to the model (``send_bytes``/``recv_bytes``
    for all_to_all_v). A one-rank group costs 0.

    Raises:
        PricingError: the scenario names an algorithm not modeled for ``collective``, or one the group cannot run.
    """
    return make_pricer(scenario, collective, shape)(nbytes, **kw)


def applicable(scenario: Scenario, collective: str, shape: GroupShape) -> list[str]:
    """The algorithms that can run ``collective`` on a group of ``shape``: every modeled one but ``hierarchical``
    over one dimension and ``in_network`` off a reducing switch dimension."""
    spanned = _spanned(scenario, shape)
    out = []
    for name in _algorithms_for(collective):
        if name == HIERARCHICAL and len(spanned) < 2:
            continue
        if name == "in_network" and not (len(spanned) == 1 and spanned[0][1].kind == "switch"
                                         and spanned[0][1].in_network_reduction):
            continue
        out.append(name)
    return out


def price(scenario: Scenario, collective: str, nbytes: int, algorithm: str = "all") -> tuple[list[Price], str]:
    """Modeled time of ``collective`` on ``nbytes`` (the per-rank input, costmodels' convention) over all
    ranks of ``scenario``: one Price per applicable algorithm (or the one named; ``auto``: the chosen one), and
    the algorithm the scenario runs (:func:`make_pricer`'s choice, the one a replay of it uses).

    Raises:
        UsageError: unknown collective or ``algorithm`` (the message lists the known ones).
    """
    p = scenario.world_size
    shape = group_shape(scenario)
    try:
        known = nm.algorithms_for(collective)
    except ValueError:
        raise UsageError(f"collective {collective!r}: unknown; known: {', '.join(nm.ALGORITHMS)}") from None
    if algorithm not in ("all", AUTO) and algorithm not in known:
        raise UsageError(f"--algorithm {algorithm!r}: not modeled for {collective}; known: {', '.join(known)}, "
                         f"auto, all")
    chosen = make_pricer(scenario, collective, shape)(nbytes)[0]
    names = [chosen] if algorithm == AUTO else applicable(scenario, collective, shape) if algorithm == "all" \
        else [algorithm]
    if algorithm == "all" and chosen not in names:
        names.append(chosen)
    prices = []
    for name in names:
        pricer = make_pricer(scenario, collective, shape) if name == chosen else \
            make_pricer(scenario, collective, shape, name)
        t = pricer(nbytes)[1]
        prices.append(Price(name, t, algorithm_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0,
                            bus_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0))
    return prices, chosen
