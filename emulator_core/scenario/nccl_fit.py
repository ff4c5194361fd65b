"""A collective's measured nccl-tests curve as a network model that holds between sizes and across node counts.

A scenario's ``[[nccl_fit]]`` entry (written by ``nbox calibrate --nccl-tests``) holds one curve measured on
``nodes`` x ``gpus_per_node`` GPUs. It prices a collective of nccl-tests size ``S`` over ``p = N x G`` ranks as

    ``T(S, N) = floor(N) + S * factor(p) / (1000 * busbw(m) * K(N))``      (microseconds; S in bytes)

* ``floor(N) = latency_us * L(N) / L(N_ref)``: ``latency_us`` is the median time of the curve's sizes up to
  :data:`FLOOR_MAX_BYTES` (0 without any); ``L`` is NCCL's modeled time of its cheapest (algorithm, protocol) at the
  smallest size (``emulator_core.pricing.nccl_tuner``). all_to_all and send_recv keep the measured floor.
* ``busbw(m)``: the curve's bus bandwidth (GB/s) above the floor as a table of ``(m, busbw)``, ``m`` the message one
  step moves: ``S / p`` for all_reduce, reduce_scatter, all_gather, all_to_all; ``S`` for broadcast, reduce,
  send_recv. Log-log interpolated; below the measured ``m``, the first two points' slope (clamped to 0..1); above,
  the last point. A point slower per step than the next larger one is read at that one's time (:func:`monotone`),
  so ``T`` is non-decreasing in ``S``.
* ``K(N)``: 1 within the curve's node-count regime (1, 2, or more nodes, as NCCL keys its bandwidths); across
  regimes the ratio of NCCL's modeled bus bandwidth at the largest measured size in the two; all_to_all and
  send_recv across regimes scale by the datasheet bandwidths (NVLink on one node, the NIC on several). all_to_all
  stores ``busbw`` per network byte (the share ``(N - 1) / N`` of the buffer that leaves a node).
* ``factor(p)``: nccl-tests' bus factor (``doc/PERFORMANCE.md``).

A fit applies to groups with its GPUs per node; among curves of one collective, the nearest node count within the
same regime is used, else the nearest; between two measured node counts of one regime, log time is interpolated over
log nodes. This module is the scenario's data; the evaluation is :mod:`emulator_core.pricing.nccl_curve`'s. Why each
term: docs/design/nccl-model.md.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from emulator_core.network import BUS_FACTORS
from emulator_core.scenario.values import MAX_WORLD_SIZE, ScenarioError, bad, check_float, check_int, check_table

__all__ = ["FLOOR_MAX_BYTES", "NCCL_FIT_KEYS", "PER_RANK", "Datasheet", "NcclFit", "check_fits", "choose_fit",
           "bracket", "monotone", "network_share", "regime", "step_bytes"]

NCCL_FIT_KEYS = ("collective", "nodes", "gpus_per_node", "latency_us", "busbw", "source")
#: Sizes up to this are latency-bound on every fabric nbox models (one 64 KiB message is < 2 us at 50 GB/s).
FLOOR_MAX_BYTES = 64 << 10
PER_RANK = frozenset({"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"})
_MAX_POINTS = 4096


def step_bytes(collective: str, size_bytes: float, ranks: int) -> float:
    """The message one step of ``collective`` moves (module docstring): ``S / p`` or ``S``."""
    return size_bytes / ranks if collective in PER_RANK else size_bytes


def regime(nodes: int) -> int:
    """NCCL's node-count regime (tuning.cc index2): 0 = one node, 1 = two nodes, 2 = more."""
    return min(nodes, 3) - 1


def network_share(collective: str, nodes: int) -> float:
    """The share of an all_to_all's buffer that leaves a node: ``(N - 1) / N``; 1 for every other collective or
    on one node."""
    return (nodes - 1) / nodes if collective == "all_to_all" and nodes > 1 else 1.0


def monotone(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """``(m, busbw)`` points read so that a step never costs less than a smaller one: each point's time per step
    ``m / busbw`` is at most the next larger point's (a point slower than the next larger size is noise, and is read
    as that size's time). With log-log interpolation between points, a slope of at most 1 below the first and a
    constant bandwidth above the last, the priced time is then non-decreasing in size."""
    out: list[tuple[float, float]] = []
    cap = math.inf
    for m, b in reversed(points):
        step = min(m / b, cap)
        cap = step
        out.append((m, m / step))
    return tuple(reversed(out))


@dataclass(frozen=True)
class NcclFit:
    """One measured nccl-tests curve as a model (module docstring): ``[[nccl_fit]]`` in a scenario.

    Attributes:
        collective: nbox's name (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send_recv).
        nodes, gpus_per_node: the shape it was measured on.
        latency_us: the latency floor fitted from the smallest sizes (>= 0; 0 when none was measured).
        busbw: ``(m_bytes, busbw_gbps)`` pairs, ``m`` strictly increasing (see :func:`step_bytes`), GB/s = 1e9
            bytes/s, per network byte for all_to_all.
        source: the file it came from (a name, for the record).
    """

    collective: str
    nodes: int
    gpus_per_node: int
    latency_us: float
    busbw: tuple[tuple[float, float], ...]
    source: str = ""
    _logs: tuple[tuple[float, float], ...] = field(default=(), init=False, repr=False, compare=False, hash=False)
    _xs: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.collective, str) or self.collective not in BUS_FACTORS:
            raise bad("collective", self.collective, f"must be one of {', '.join(BUS_FACTORS)}")
        check_int("nodes", self.nodes, 1, MAX_WORLD_SIZE)
        check_int("gpus_per_node", self.gpus_per_node, 1, MAX_WORLD_SIZE)
        if self.nodes * self.gpus_per_node < 2:
            raise bad("nodes", self.nodes, "nodes x gpus_per_node must be >= 2")
        object.__setattr__(self, "latency_us", check_float("latency_us", self.latency_us, ge=0))
        raw: Any = self.busbw
        if not isinstance(raw, (list, tuple)) or not raw or len(raw) > _MAX_POINTS or not all(
                isinstance(pt, (list, tuple)) and len(pt) == 2 for pt in raw):
            raise bad("busbw", raw if isinstance(raw, (list, tuple)) else str(raw)[:40],
                      "must be an array of [m_bytes, busbw_gbps] pairs")
        pts = tuple((check_float("busbw", m, gt=0), check_float("busbw", b, gt=0)) for m, b in raw)
        if any(b[0] <= a[0] for a, b in itertools.pairwise(pts)):
            raise bad("busbw", [list(p) for p in pts[:4]], "m_bytes must increase strictly")
        object.__setattr__(self, "busbw", pts)
        if not isinstance(self.source, str) or len(self.source) > 256:
            raise bad("source", str(self.source)[:40], "must be a string of at most 256 characters")
        object.__setattr__(self, "_logs", tuple((math.log(m), math.log(b)) for m, b in monotone(pts)))
        object.__setattr__(self, "_xs", tuple(x for x, _ in self._logs))

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def busbw_at(self, m: float) -> float:
        """The table's bus bandwidth (GB/s) at step message ``m`` bytes (module docstring)."""
        logs = self._logs
        x = math.log(max(m, 1e-9))
        if x >= logs[-1][0]:
            return math.exp(logs[-1][1])
        if x <= logs[0][0]:
            slope = 1.0
            if len(logs) > 1:
                slope = min(1.0, max(0.0, (logs[1][1] - logs[0][1]) / (logs[1][0] - logs[0][0])))
            return math.exp(logs[0][1] + slope * (x - logs[0][0]))
        i = bisect.bisect_right(self._xs, x)
        (x0, y0), (x1, y1) = logs[i - 1], logs[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"collective": self.collective, "nodes": self.nodes,
                               "gpus_per_node": self.gpus_per_node, "latency_us": self.latency_us,
                               "busbw": [[m, b] for m, b in self.busbw]}
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, d: Any) -> NcclFit:
        check_table("", d, NCCL_FIT_KEYS, NCCL_FIT_KEYS[:5])
        return cls(**d)


@dataclass(frozen=True)
class Datasheet:
    """The datasheet figures a fit scales by across regimes: a GPU's NVLink and NIC bandwidth (GB/s, 1e9 bytes/s,
    per direction), whether the node's switch reduces (NVLS) and whether the network does (SHARP)."""

    intra_bw_gbps: float
    inter_bw_gbps: float
    nvls: bool = False
    collnet: bool = False


def choose_fit(fits: tuple[NcclFit, ...], collective: str, nodes: int, gpus_per_node: int) -> NcclFit | None:
    """The entry that prices ``collective`` on ``nodes`` x ``gpus_per_node``: same GPUs per node, same regime
    first, then the nearest node count (ties: the larger); ``None`` when none applies."""
    cands = [f for f in fits if f.collective == collective and f.gpus_per_node == gpus_per_node]
    if not cands:
        return None
    return min(cands, key=lambda f: (regime(f.nodes) != regime(nodes), abs(math.log(f.nodes / nodes)), -f.nodes))


def bracket(fits: tuple[NcclFit, ...], collective: str, nodes: int,
            gpus_per_node: int) -> tuple[NcclFit, NcclFit] | None:
    """The two entries of ``collective`` with ``gpus_per_node`` nearest below and above ``nodes`` in its regime, or
    ``None`` when the measured node counts do not surround it."""
    same = [f for f in fits if f.collective == collective and f.gpus_per_node == gpus_per_node
            and regime(f.nodes) == regime(nodes)]
    below = [f for f in same if f.nodes < nodes]
    above = [f for f in same if f.nodes > nodes]
    if not below or not above:
        return None
    return max(below, key=lambda f: f.nodes), min(above, key=lambda f: f.nodes)


def check_fits(entries: Any) -> tuple[NcclFit, ...]:
    """The ``nccl_fit`` entries of a scenario: NcclFit instances, at most one per (collective, nodes,
    gpus_per_node); :class:`ScenarioError` naming the entry otherwise."""
    out = tuple(entries)
    seen: set[tuple[str, int, int]] = set()
    for i, f in enumerate(out):
        if not isinstance(f, NcclFit):
            raise bad(f"nccl_fit[{i}]", f, "must be an NcclFit")
        key = (f.collective, f.nodes, f.gpus_per_node)
        if key in seen:
            raise ScenarioError(f"nccl_fit[{i}]", f"{f.collective} on {f.nodes}x{f.gpus_per_node} given twice")
        seen.add(key)
    return out
