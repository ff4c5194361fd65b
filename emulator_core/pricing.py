"""Price one collective on a what-if scenario: the library behind ``nbox scenario cost``.

How a scenario becomes cost-model links (``costmodels.Link``):

* **flat algorithms** (ring, double binary tree, ...) over ranks that span several topology
  dimensions run at the pace of the slowest dimension they cross: the lowest bandwidth and the
  highest latency among the dimensions of size > 1. (A ring over 8 GPUs x 128 nodes crosses the NIC
  on every inter-node hop, so the NIC bounds it.)
* **hierarchical** all-reduce uses every dimension of size > 1, innermost first: reduce-scatter
  within dimension 0, all-reduce across the rest, all-gather within dimension 0
  (``costmodels.hierarchical_all_reduce``).

``auto`` picks the fastest of NCCL's own algorithm set (ring, double binary tree), plus hierarchical
for an all-reduce over more than one dimension; the optimistic ``direct`` models are priced when asked
for but never chosen by ``auto`` (they assume all p-1 messages proceed at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from emulator_core import costmodels as cm
from emulator_core.scenario import Scenario, ScenarioError


@dataclass(frozen=True)
class Price:
    """One algorithm's modeled time (us) and nccl-tests bandwidths (GB/s = 1e9 bytes/s)."""

    algorithm: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def flat_link(scenario: Scenario) -> cm.Link:
    """The slowest dimension crossed by a flat algorithm over all ranks (see the module docstring)."""
    dims = [d for d in scenario.topology.dims if d.size > 1] or list(scenario.topology.dims)
    bandwidth = min(d.bandwidth_bytes_per_us for d in dims)
    latency = max(d.latency_us for d in dims)
    return cm.Link(latency, bandwidth)


def with_world_size(scenario: Scenario, world_size: int) -> Scenario:
    """The scenario at another world size: the outermost dimension grows or shrinks to fit.

    Raises:
        ScenarioError: ``world_size`` is not a multiple of the inner dimensions' product.
    """
    dims = scenario.topology.dims
    inner = math.prod(d.size for d in dims[:-1])
    if world_size < 1 or world_size % inner:
        raise ScenarioError("world_size", f"must be a positive multiple of {inner}, the product of the inner "
                            f"dimensions {[d.name for d in dims[:-1]]}", value=world_size, has_value=True)
    last = replace(dims[-1], size=world_size // inner)
    return replace(scenario, world_size=world_size, topology=replace(scenario.topology, dims=(*dims[:-1], last)))


def price(scenario: Scenario, collective: str, nbytes: int, algorithm: str = "all") -> tuple[list[Price], str]:
    """Modeled time of ``collective`` on ``nbytes`` (the per-rank input, costmodels' convention) over all
    ranks of ``scenario``: one Price per algorithm (or the one named), and the algorithm ``auto`` picks.

    Raises:
        ValueError: unknown collective or algorithm (the message lists the known ones).
    """
    p = scenario.world_size
    link = flat_link(scenario)
    known = cm.algorithms_for(collective)
    multi = [(d.size, cm.Link(d.latency_us, d.bandwidth_bytes_per_us)) for d in scenario.topology.dims if d.size > 1]
    names = list(known) if algorithm == "all" else [algorithm if algorithm != "auto" else ""]
    if algorithm not in ("all", "auto") and algorithm not in known:
        raise ValueError(f"unknown algorithm {algorithm!r} for {collective}; known: {', '.join(known)}")
    prices: dict[str, Price] = {}
    for name in known:
        if name == "hierarchical":
            if collective != "all_reduce" or len(multi) < 2:
                continue
            t = cm.hierarchical_all_reduce(nbytes, multi)
        else:
            t = cm.cost(collective, name, nbytes, p, link)
        prices[name] = Price(name, t, cm.algorithm_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0,
                             cm.bus_bandwidth_gbps(collective, nbytes, p, t) if t > 0 else 0.0)
    candidates = [a for a in (*cm.NCCL_ALGORITHMS, "hierarchical") if a in prices] or list(prices)
    chosen = min(candidates, key=lambda a: prices[a].time_us)
    if algorithm == "auto":
        names = [chosen]
    return [prices[n] for n in names if n in prices], chosen
