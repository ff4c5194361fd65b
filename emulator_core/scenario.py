"""What-if scenarios: the target cluster the emulator answers for, as one frozen dataclass tree.

This module is the model only: the dataclasses and their validation at construction; every error is a
:class:`ScenarioError` naming the key path and the bad value, e.g. ``topology.dims[1].bandwidth_gbps = -3:
must be > 0``. Reading and writing the TOML text is :mod:`emulator_core.scenario_toml`, the ``--set a.b=c``
override language :mod:`emulator_core.scenario_overrides`, and loading a file (or a shipped example) with
overrides :mod:`emulator_core.scenario_files`.

Units (they also live in the key names):

* bandwidth: ``*_gbps`` is gigaBITS per second with giga = 1e9, i.e. 1 Gb/s = 1e9 bits/s = 1.25e8 bytes/s.
  Per rank, per direction (a full-duplex 400 Gb/s NIC is ``bandwidth_gbps = 400``).
* bytes are bytes (8 bits); where binary multiples appear, 1 KiB = 2^10, 1 MiB = 2^20, 1 GiB = 2^30 bytes.
* time: ``*_us`` is microseconds (1e-6 s).

TOML layout (see the shipped examples in ``emulator_core/scenarios/``)::

    world_size = 1024          # ranks the script sees (W)
    compute_scale = 1.0        # 1.0 = recorded speed; 2.0 = compute twice as fast
    overlap = "overlap"        # or "serialize"

    [algorithms]               # collective -> algorithm name, or "auto" (the default for any not listed)
    all_reduce = "ring"

    [[topology.dims]]          # innermost dimension first (e.g. GPUs within a node)
    name = "nvlink"
    size = 8
    kind = "switch"            # "ring" | "switch" | "fully_connected"
    bandwidth_gbps = 3600.0
    latency_us = 2.0
    links_per_rank = 18        # optional, default 1

    [[stragglers]]             # optional: rank 3 computes 1.5x slower
    rank = 3
    slowdown = 1.5

    [[calibration]]            # optional, from `nbox calibrate` (see Calibration): factors x the dimension's
    collective = "all_reduce"
    dimension = "nvlink"
    algorithm = "ring"         # the fitted closed form
    ranks = 8
    latency_factor = 1.0
    bandwidth_factor = 0.93
    efficiency = [[1024, 0.05], [65536, 0.6], [67108864, 1.0]]   # (size_bytes, fraction) pairs

The product of the dimension sizes must equal ``world_size``. The LAST dimension may say ``size = 0``,
meaning "whatever makes the product equal world_size"; it is resolved when the :class:`Scenario` is built
(the stored scenario always holds concrete sizes, so dumping then loading gives an equal scenario).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from emulator_core import costmodels as cm
from nbox_trace.errors import InvalidInputError

#: Dimension kinds: a ring (each rank talks to 2 neighbours), a switch (any pair at full per-rank
#: bandwidth, non-blocking), fully connected (a dedicated link per pair; bandwidth split over peers).
DIMENSION_KINDS = ("ring", "switch", "fully_connected")
#: Overlap policies: "overlap" lets communication run concurrently with compute (as recorded);
#: "serialize" makes every collective wait for compute and compute wait for every collective.
OVERLAP_POLICIES = ("overlap", "serialize")
#: Jitter policies: "off" prices every collective at its model cost; "calibrated" adds to each one a delay
#: drawn from the measured spread of its ``[[calibration]]`` (``jitter_us``), deterministically.
JITTER_POLICIES = ("off", "calibrated")
#: Collective names accepted as keys of ``[algorithms]``.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast",
               "reduce", "gather", "scatter", "barrier", "send_recv")
#: The algorithm name meaning "pick the fastest for each size".
AUTO = "auto"
#: Largest world size accepted (2^24 ranks); a guard against typos, far above any real cluster.
MAX_WORLD_SIZE = 1 << 24

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

_T = TypeVar("_T")
#: The keys of each table (the top level, ``topology``, ``[[topology.dims]]``, ``[[stragglers]]``,
#: ``[[calibration]]``), in the order the TOML writer puts them.
TOP_KEYS = ("world_size", "topology", "algorithms", "compute_scale", "stragglers", "overlap", "calibration",
             "jitter", "jitter_seed")
TOPOLOGY_KEYS = ("dims",)
DIM_KEYS = ("name", "size", "kind", "bandwidth_gbps", "latency_us", "links_per_rank")
STRAGGLER_KEYS = ("rank", "slowdown")
CALIBRATION_KEYS = ("collective", "dimension", "algorithm", "ranks", "latency_factor", "bandwidth_factor",
                     "efficiency", "jitter_us")


class ScenarioError(InvalidInputError):
    """A scenario file, override or value is invalid.

    Attributes:
        key: the key path (``topology.dims[1].bandwidth_gbps``), or ``""`` when not tied to a key.
        reason: what is wrong, without the key or file.
        file: the scenario file, or ``None``.
        value: the offending value as written in the message (``None`` when there is none).
    """

    def __init__(self, key: str, reason: str, *, value: Any = None, has_value: bool = False,
                 file: str | None = None) -> None:
        self.key = key
        self.reason = reason
        self.value = value
        self.has_value = has_value
        self.file = file
        where = key + (f" = {_fmt(value)}" if has_value else "")
        msg = f"{where}: {reason}" if where else reason
        super().__init__(f"{file}: {msg}" if file else msg)

    def prefixed(self, prefix: str) -> ScenarioError:
        """The same error with ``prefix`` put before the key path (``topology.dims[1].`` + ``size``)."""
        return ScenarioError(prefix + self.key if self.key else prefix.rstrip("."), self.reason, value=self.value,
                             has_value=self.has_value, file=self.file)

    def in_file(self, file: str) -> ScenarioError:
        """The same error, naming ``file``."""
        return ScenarioError(self.key, self.reason, value=self.value, has_value=self.has_value, file=file)


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return quote_toml_string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _parse_tables(key: str, tables: list[Any], parse: Callable[[Any], _T]) -> list[_T]:
    """Parse an array of tables element by element; an error gets the element's path (``key[i].``)."""
    out = []
    for i, table in enumerate(tables):
        try:
            out.append(parse(table))
        except ScenarioError as e:
            raise e.prefixed(f"{key}[{i}].") from None
    return out


def _bad(key: str, value: Any, reason: str) -> ScenarioError:
    return ScenarioError(key, reason, value=value, has_value=True)


def _int(key: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, value, "must be an integer")
    if value < lo:
        raise _bad(key, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        raise _bad(key, value, f"must be <= {hi}")
    return value


def _float(key: str, value: Any, *, gt: float | None = None, ge: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, value, "must be a number")
    v = float(value)
    if not math.isfinite(v):
        raise _bad(key, value, "must be finite")
    if gt is not None and not v > gt:
        raise _bad(key, value, f"must be > {gt:g}")
    if ge is not None and not v >= ge:
        raise _bad(key, value, f"must be >= {ge:g}")
    return v


def _quantile_table(key: str, raw: Any) -> tuple[tuple[float, float], ...]:
    """Validate ``[[quantile, value], ...]``: quantiles strictly increasing from 0 to 1, values finite and
    non-decreasing; empty is allowed."""
    if not isinstance(raw, (list, tuple)) or not all(isinstance(pt, (list, tuple)) and len(pt) == 2 for pt in raw):
        raise _bad(key, raw, "must be an array of [quantile, extra_us] pairs")
    if not raw:
        return ()
    if len(raw) > 1024:
        raise _bad(key, f"{len(raw)} pairs", "must have at most 1024 pairs")
    pts = tuple((_float(key, q, ge=0), _float(key, x)) for q, x in raw)
    qs = [q for q, _ in pts]
    if len(pts) < 2 or qs[0] != 0 or qs[-1] != 1 or any(b <= a for a, b in itertools.pairwise(qs)):
        raise _bad(key, [list(p) for p in pts][:8], "quantiles must increase strictly from 0 to 1")
    if any(b[1] < a[1] for a, b in itertools.pairwise(pts)):
        raise _bad(key, [list(p) for p in pts][:8], "extra_us must not decrease as the quantile grows")
    return pts


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise _bad(key, value, f"must be one of {', '.join(repr(a) for a in allowed)}")
    return value


@dataclass(frozen=True)
class Dimension:
    """One dimension of the topology (e.g. the 8 GPUs of a node, or the nodes of a cluster).

    Attributes:
        name: a label (letters, digits, ``_``, ``-``; starts with a letter), unique within the topology.
        size: ranks along this dimension (>= 1; ``0`` only for the last dimension of a topology given to
            a :class:`Scenario`, resolved there).
        kind: ``"ring"``, ``"switch"`` or ``"fully_connected"`` (see :data:`DIMENSION_KINDS`).
        bandwidth_gbps: per rank, per direction, in gigabits per second (1 Gb/s = 1e9 bits/s), summed over
            the rank's ``links_per_rank`` links in this dimension.
        latency_us: per hop / per message latency in microseconds (>= 0).
        links_per_rank: links each rank has in this dimension (>= 1); the bandwidth is split evenly over them.
    """

    name: str
    size: int
    kind: str
    bandwidth_gbps: float
    latency_us: float
    links_per_rank: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise _bad("name", self.name, "must be 1-64 letters, digits, '_' or '-', starting with a letter")
        _int("size", self.size, 0, MAX_WORLD_SIZE)
        _choice("kind", self.kind, DIMENSION_KINDS)
        object.__setattr__(self, "bandwidth_gbps", _float("bandwidth_gbps", self.bandwidth_gbps, gt=0))
        object.__setattr__(self, "latency_us", _float("latency_us", self.latency_us, ge=0))
        _int("links_per_rank", self.links_per_rank, 1, 1024)

    @property
    def bandwidth_bytes_per_us(self) -> float:
        """Per-rank, per-direction bandwidth in bytes per microsecond (Gb/s x 1e9 / 8 / 1e6 = Gb/s x 125)."""
        return self.bandwidth_gbps * 125.0

    @property
    def link_bandwidth_bytes_per_us(self) -> float:
        """Bandwidth of ONE of the rank's links, per direction, in bytes per microsecond."""
        return self.bandwidth_bytes_per_us / self.links_per_rank

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "kind": self.kind, "bandwidth_gbps": self.bandwidth_gbps,
                "latency_us": self.latency_us, "links_per_rank": self.links_per_rank}

    @classmethod
    def from_dict(cls, d: Any) -> Dimension:
        """Build from a TOML table; errors name the key relative to the table (prefix them)."""
        _check_table("", d, DIM_KEYS)
        missing = [k for k in DIM_KEYS[:5] if k not in d]
        if missing:
            raise ScenarioError(missing[0], f"missing (required keys: {', '.join(DIM_KEYS[:5])})")
        return cls(**d)


@dataclass(frozen=True)
class Topology:
    """The network, as dimensions from innermost (fastest-varying rank index) to outermost.

    Global rank ``r`` has coordinate ``(r % s0, (r // s0) % s1, ...)`` for sizes ``s0, s1, ...``.
    """

    dims: tuple[Dimension, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.dims, tuple):
            object.__setattr__(self, "dims", tuple(self.dims))
        if not self.dims:
            raise ScenarioError("dims", "needs at least one dimension")
        seen: set[str] = set()
        for i, d in enumerate(self.dims):
            if not isinstance(d, Dimension):
                raise _bad(f"dims[{i}]", d, "must be a Dimension")
            if d.name in seen:
                raise _bad(f"dims[{i}].name", d.name, "duplicate dimension name")
            seen.add(d.name)
            if d.size == 0 and i != len(self.dims) - 1:
                raise _bad(f"dims[{i}].size", 0, "only the last dimension may have size 0 (= fill to world_size)")

    @property
    def world_size(self) -> int:
        """The product of the dimension sizes (0 while the last size is still unresolved)."""
        return math.prod(d.size for d in self.dims)

    def to_dict(self) -> dict[str, Any]:
        return {"dims": [d.to_dict() for d in self.dims]}

    @classmethod
    def from_dict(cls, d: Any) -> Topology:
        _check_table("", d, TOPOLOGY_KEYS)
        dims = d.get("dims")
        if not isinstance(dims, list):
            raise ScenarioError("dims", "missing: an array of tables [[topology.dims]]") if dims is None \
                else _bad("dims", dims, "must be an array of tables [[topology.dims]]")
        return cls(tuple(_parse_tables("dims", dims, Dimension.from_dict)))


@dataclass(frozen=True)
class Straggler:
    """A rank whose compute runs ``slowdown`` times slower than recorded (>= 1; 1.0 = on time)."""

    rank: int
    slowdown: float

    def __post_init__(self) -> None:
        _int("rank", self.rank, 0)
        object.__setattr__(self, "slowdown", _float("slowdown", self.slowdown, ge=1.0))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "slowdown": self.slowdown}

    @classmethod
    def from_dict(cls, d: Any) -> Straggler:
        _check_table("", d, STRAGGLER_KEYS)
        for k in STRAGGLER_KEYS:
            if k not in d:
                raise ScenarioError(k, f"missing (required keys: {', '.join(STRAGGLER_KEYS)})")
        return cls(**d)


@dataclass(frozen=True)
class Calibration:
    """How one collective, measured on one topology dimension, departs from the dimension's nominal figures.

    Written by ``nbox calibrate``; applied by ``emulator_core.pricing`` when a group spans exactly that dimension:
    the collective runs on a link of ``latency_us * latency_factor`` microseconds and
    ``bandwidth_gbps * bandwidth_factor`` Gb/s (1 Gb/s = 1e9 bits/s = 125 bytes/us), scaled per size by
    ``efficiency``. Factors, not absolute figures, so ``--set topology.dims.0.bandwidth_gbps=400`` still scales it.

    Attributes:
        collective: one of :data:`COLLECTIVES`; dimension: an existing topology dimension's name.
        algorithm: the fitted closed form (one of ``costmodels.algorithms_for(collective)``); ``auto`` pricing
            uses it, since it is what the measured library runs. ranks: ranks measured with (>= 2).
        latency_factor, bandwidth_factor: > 0, multiply the dimension's ``latency_us`` / ``bandwidth_gbps``.
        efficiency: ``(size_bytes, fraction)`` pairs as ``costmodels.Efficiency`` (sizes in bytes, the
            collective's nccl-tests "size"; strictly increasing; fractions in (0, 1]); empty = 1.0 everywhere.
        jitter_us: the measured spread, as the quantile function of the extra time of one call over the
            median of its size, pooled over the sizes: ``(quantile, extra_us)`` pairs, quantiles strictly
            increasing from 0 to 1, extras non-decreasing (may be negative: a call faster than the median).
            Empty = no spread. Used when the scenario's ``jitter = "calibrated"`` (see :meth:`jitter_at`).
    """

    collective: str
    dimension: str
    algorithm: str
    ranks: int
    latency_factor: float = 1.0
    bandwidth_factor: float = 1.0
    efficiency: tuple[tuple[int, float], ...] = ()
    jitter_us: tuple[tuple[float, float], ...] = ()
    #: ``efficiency`` as a ``costmodels.Efficiency`` (derived, not a TOML key).
    curve: cm.Efficiency = field(default_factory=cm.Efficiency, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        _choice("collective", self.collective, COLLECTIVES)
        if not isinstance(self.dimension, str) or not _NAME_RE.match(self.dimension):
            raise _bad("dimension", self.dimension, "must be a dimension name (letters, digits, '_' or '-')")
        known = cm.algorithms_for(self.collective)
        if not isinstance(self.algorithm, str) or self.algorithm not in known:
            raise _bad("algorithm", self.algorithm, f"must be one of {', '.join(known)} for {self.collective}")
        _int("ranks", self.ranks, 2, MAX_WORLD_SIZE)
        object.__setattr__(self, "latency_factor", _float("latency_factor", self.latency_factor, gt=0))
        object.__setattr__(self, "bandwidth_factor", _float("bandwidth_factor", self.bandwidth_factor, gt=0))
        raw: Any = self.efficiency
        bad = [raw] if not isinstance(raw, (list, tuple)) else [pt for pt in raw if not (
            isinstance(pt, (list, tuple)) and len(pt) == 2)]
        if bad:
            raise _bad("efficiency", bad[0], "must be an array of [size_bytes, fraction] pairs")
        points = tuple((pt[0], _float("efficiency", pt[1])) for pt in raw)
        try:
            object.__setattr__(self, "curve", cm.Efficiency(points))
        except ValueError as e:
            raise _bad("efficiency", [list(pt) for pt in points], str(e)) from None
        object.__setattr__(self, "efficiency", points)
        object.__setattr__(self, "jitter_us", _quantile_table("jitter_us", self.jitter_us))

    def jitter_at(self, u: float) -> float:
        """The extra time (us) at quantile ``u`` in [0, 1] of ``jitter_us``, interpolated linearly; 0 if empty."""
        table = self.jitter_us
        if not table:
            return 0.0
        for (q0, x0), (q1, x1) in itertools.pairwise(table):
            if u <= q1:
                return x0 + (x1 - x0) * (u - q0) / (q1 - q0)
        return table[-1][1]

    def to_dict(self) -> dict[str, Any]:
        """Plain form, as in the TOML file; ``jitter_us`` only when measured (files without it stay the same)."""
        d = {k: getattr(self, k) for k in CALIBRATION_KEYS if k != "jitter_us"}
        out = {**d, "efficiency": [list(p) for p in self.efficiency]}
        if self.jitter_us:
            out["jitter_us"] = [list(p) for p in self.jitter_us]
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Calibration:
        """Build from a TOML table; ``latency_factor``/``bandwidth_factor`` default to 1, ``efficiency`` to []."""
        _check_table("", d, CALIBRATION_KEYS)
        missing = [k for k in CALIBRATION_KEYS[:4] if k not in d]
        if missing:
            raise ScenarioError(missing[0], f"missing (required keys: {', '.join(CALIBRATION_KEYS[:4])})")
        return cls(**d)


@dataclass(frozen=True)
class Scenario:
    """A what-if scenario: the cluster the emulator answers collectives for.

    Attributes:
        world_size: ranks the training script sees (1 .. :data:`MAX_WORLD_SIZE`).
        topology: the network; the product of its dimension sizes equals ``world_size`` (a last size of 0
            is resolved here).
        algorithms: ``(collective, algorithm)`` pairs sorted by collective; a collective not listed uses
            ``"auto"``; every algorithm is ``"auto"`` or one the cost models price for its collective
            (``costmodels.algorithms_for``), checked here so that every command refuses it at load time. A
            ``Mapping`` is accepted and converted. Read it with :meth:`algorithm`.
        compute_scale: compute speed factor (> 0): 1.0 = recorded speed, 2.0 = compute twice as fast
            (compute durations are divided by it).
        stragglers: ranks whose compute is slowed down (unique ranks, each < ``world_size``).
        overlap: ``"overlap"`` or ``"serialize"`` (see :data:`OVERLAP_POLICIES`).
        jitter: ``"off"`` or ``"calibrated"`` (see :data:`JITTER_POLICIES`). ``calibrated``: a collective whose
            ``[[calibration]]`` has a ``jitter_us`` table costs its model time plus that table at a quantile
            drawn from ``jitter_seed``, the group's members and the collective's position on the group (the
            same draw on every real rank, and in every run with the same seed).
        jitter_seed: any integer >= 0.
        calibration: measured departures from the dimensions' nominal figures, per (collective, dimension)
            (see :class:`Calibration`; at most one per pair, each naming an existing dimension). Read them
            with :meth:`calibrated`.
    """

    world_size: int
    topology: Topology
    algorithms: tuple[tuple[str, str], ...] = ()
    compute_scale: float = 1.0
    stragglers: tuple[Straggler, ...] = ()
    overlap: str = "overlap"
    calibration: tuple[Calibration, ...] = ()
    jitter: str = "off"
    jitter_seed: int = 0
    _calibrated: Mapping[tuple[str, str], Calibration] = field(default_factory=dict, init=False, repr=False,
                                                               compare=False, hash=False)
    _slowdowns: Mapping[int, float] = field(default_factory=dict, init=False, repr=False, compare=False,
                                            hash=False)

    def __post_init__(self) -> None:
        w = _int("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        if not isinstance(self.topology, Topology):
            raise _bad("topology", self.topology, "must be a Topology")
        self._resolve_topology(w)
        algos: Any = self.algorithms
        pairs = list(algos.items()) if isinstance(algos, Mapping) else list(algos)
        seen: dict[str, str] = {}
        for item in pairs:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise _bad("algorithms", item, "must be (collective, algorithm) pairs")
            coll, algo = item
            if not isinstance(coll, str) or coll not in COLLECTIVES:
                raise ScenarioError(f"algorithms.{coll}", f"unknown collective (allowed: {', '.join(COLLECTIVES)})")
            if coll in seen:
                raise ScenarioError(f"algorithms.{coll}", "given twice")
            known = (AUTO, *cm.algorithms_for(coll))
            if not isinstance(algo, str) or algo not in known:  # checked here, so no command gets further
                raise _bad(f"algorithms.{coll}", algo, f"no cost model for {coll}; known: {', '.join(known)}")
            seen[coll] = algo
        object.__setattr__(self, "algorithms", tuple(sorted(seen.items())))
        object.__setattr__(self, "compute_scale", _float("compute_scale", self.compute_scale, gt=0))
        _choice("overlap", self.overlap, OVERLAP_POLICIES)
        _choice("jitter", self.jitter, JITTER_POLICIES)
        _int("jitter_seed", self.jitter_seed, 0, 2**63 - 1)
        stragglers = tuple(self.stragglers)
        slow: dict[int, float] = {}
        for i, s in enumerate(stragglers):
            if not isinstance(s, Straggler):
                raise _bad(f"stragglers[{i}]", s, "must be a Straggler")
            if s.rank >= w:
                raise _bad(f"stragglers[{i}].rank", s.rank, f"must be < world_size ({w})")
            if s.rank in slow:
                raise _bad(f"stragglers[{i}].rank", s.rank, "rank listed twice")
            slow[s.rank] = s.slowdown
        object.__setattr__(self, "stragglers", stragglers)
        object.__setattr__(self, "_slowdowns", slow)
        self._check_calibration()

    def _check_calibration(self) -> None:
        entries, names, found = tuple(self.calibration), {d.name for d in self.topology.dims}, {}
        for i, c in enumerate(entries):
            if not isinstance(c, Calibration):
                raise _bad(f"calibration[{i}]", c, "must be a Calibration")
            if c.dimension not in names:
                raise _bad(f"calibration[{i}].dimension", c.dimension,
                           f"no such topology dimension (known: {', '.join(sorted(names))})")
            if (c.collective, c.dimension) in found:
                raise _bad(f"calibration[{i}].collective", c.collective,
                           f"calibrated twice on dimension {c.dimension!r}")
            found[(c.collective, c.dimension)] = c
        object.__setattr__(self, "calibration", entries)
        object.__setattr__(self, "_calibrated", found)

    def calibrated(self, collective: str, dimension_name: str) -> Calibration | None:
        """The calibration of ``collective`` on the dimension named ``dimension_name``, or ``None``."""
        return self._calibrated.get((collective, dimension_name))

    def _resolve_topology(self, w: int) -> None:
        dims = self.topology.dims
        last = dims[-1]
        inner = math.prod(d.size for d in dims[:-1])
        key = f"topology.dims[{len(dims) - 1}].size"
        if last.size == 0:
            if w % inner:
                raise _bad(key, 0, f"cannot fill: world_size {w} is not a multiple of the other dimensions' "
                                   f"product {inner}")
            new_last = replace(last, size=w // inner)
            object.__setattr__(self, "topology", Topology((*dims[:-1], new_last)))
        elif inner * last.size != w:
            sizes = " x ".join(str(d.size) for d in dims)
            raise _bad("topology.dims", sizes, f"the product of the sizes ({inner * last.size}) must equal "
                                               f"world_size ({w}); the last size may be 0 to fill it")

    def algorithm(self, collective: str) -> str:
        """The algorithm chosen for ``collective`` (``"auto"`` when the scenario does not say)."""
        return dict(self.algorithms).get(collective, AUTO)

    def slowdown(self, rank: int) -> float:
        """The compute slowdown of ``rank`` (1.0 when it is not a straggler)."""
        return self._slowdowns.get(rank, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict/list/scalar form, as in the TOML file (``from_dict(to_dict())`` == self). ``jitter`` and
        ``jitter_seed`` only when not the defaults, so scenarios written before they existed stay the same."""
        out: dict[str, Any] = {"world_size": self.world_size, "compute_scale": self.compute_scale,
                               "overlap": self.overlap}
        if self.jitter != "off" or self.jitter_seed != 0:
            out.update(jitter=self.jitter, jitter_seed=self.jitter_seed)
        return {**out, "algorithms": dict(self.algorithms), "topology": self.topology.to_dict(),
                "stragglers": [s.to_dict() for s in self.stragglers],
                "calibration": [c.to_dict() for c in self.calibration]}

    @classmethod
    def from_dict(cls, d: Any) -> Scenario:
        """Build from the parsed TOML document; unknown keys are rejected, errors name the key path."""
        _check_table("", d, TOP_KEYS)
        for k in ("world_size", "topology"):
            if k not in d:
                raise ScenarioError(k, "missing (required keys: world_size, topology)")
        try:
            topo = Topology.from_dict(d["topology"])
        except ScenarioError as e:
            raise e.prefixed("topology.") from None
        algos = d.get("algorithms", {})
        if not isinstance(algos, dict):
            raise _bad("algorithms", algos, "must be a table of collective = \"algorithm\"")
        raw_strag = d.get("stragglers", [])
        if not isinstance(raw_strag, list):
            raise _bad("stragglers", raw_strag, "must be an array of tables [[stragglers]]")
        stragglers = _parse_tables("stragglers", raw_strag, Straggler.from_dict)
        if not isinstance(raw_cal := d.get("calibration", []), list):
            raise _bad("calibration", raw_cal, "must be an array of tables [[calibration]]")
        kwargs = {k: d[k] for k in ("compute_scale", "overlap", "jitter", "jitter_seed") if k in d}
        return cls(world_size=d["world_size"], topology=topo, algorithms=tuple(algos.items()),
                   stragglers=tuple(stragglers),
                   calibration=tuple(_parse_tables("calibration", raw_cal, Calibration.from_dict)), **kwargs)


def _check_table(key: str, d: Any, allowed: Sequence[str]) -> None:
    if not isinstance(d, dict):
        raise _bad(key, d, "must be a table") if key else ScenarioError("", f"must be a table, not {_fmt(d)}")
    for k in d:
        if k not in allowed:
            path = f"{key}.{k}" if key else str(k)
            raise ScenarioError(path, f"unknown key (allowed: {', '.join(allowed)})")


def quote_toml_string(s: str) -> str:
    """``s`` as a TOML basic string (double quotes; quotes, backslashes and control characters escaped)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
