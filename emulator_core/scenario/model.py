"""What-if scenarios: the target cluster the emulator answers for, as one frozen dataclass tree.

The model only: the dataclasses and their validation at construction; every error is a :class:`ScenarioError`
naming the key path and the bad value (``topology.dims[1].bandwidth_gbps = -3: must be > 0``). The TOML text is
:mod:`emulator_core.scenario.tomltext`'s, ``--set a.b=c`` :mod:`emulator_core.scenario.overrides`'s, loading a file
:mod:`emulator_core.scenario.files`'. Units live in the key names: ``*_gbps`` is gigaBITS per second per link and
direction (1 Gb/s = 1e9 bits/s = 125 bytes/us), ``*_us`` microseconds; bytes are bytes (1 KiB = 2^10, 1 MiB = 2^20).

TOML layout (the shipped examples: ``emulator_core/scenarios/``)::

    world_size = 1024          # ranks the script sees (W)
    compute_scale = 1.0        # 1.0 = recorded speed; 2.0 = compute twice as fast
    overlap = "overlap"        # or "serialize"
    mesh_placement = ["pp", "dp", "tp"]   # optional: mesh dimensions outermost first as laid on ranks
    [algorithms]               # collective -> algorithm name, or "auto" (the default for any not listed)
    all_reduce = "ring"
    [[topology.dims]]          # innermost dimension first (e.g. GPUs within a node); keys: scenario/topology.py
    name = "nvlink"
    size = 8
    kind = "switch"            # "ring" | "switch" | "fully_connected"
    bandwidth_gbps = 200.0     # one NVLink 4 link, per direction (25 GB/s)
    latency_us = 2.0           # optional keys: links_per_rank, forwarding, in_network_reduction, racks, fabric
    [network]                  # optional: congestion, message_overhead_us, chunks, library, host_cpu, p2p_chunk_bytes
    congestion = "aware"       # or "unaware" (ASTRA-sim's congestion-unaware backend, for comparison)
    [mesh]                     # optional: a what-if mesh for `nbox replay`, as --mesh dp=512,tp=2
    dp = 512
    [[stragglers]]             # optional: rank 3 computes 1.5x slower (Straggler)
    rank = 3
    slowdown = 1.5
    [[calibration]]            # optional, from `nbox calibrate` (Calibration: factors x the dimension's figures)
    collective = "all_reduce"
    dimension = "nvlink"
    algorithm = "ring"
    ranks = 8
    bandwidth_factor = 0.93
    efficiency = [[1024, 0.05], [65536, 0.6], [67108864, 1.0]]   # (size_bytes, fraction) pairs

The product of the dimension sizes must equal ``world_size``; the LAST dimension may say ``size = 0`` ("whatever
makes the product equal world_size"), resolved when the :class:`Scenario` is built, so dump then load is equal.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from emulator_core.network import costmodels as cm
from emulator_core.network import netmodel as nm
from emulator_core.scenario.mesh import MeshError, parse_mesh, parse_placement
from emulator_core.scenario.nccl_fit import NcclFit, check_fits
from emulator_core.scenario.topology import (
    CONGESTION,
    DIM_KEYS,
    DIMENSION_KINDS,
    FORWARDING,
    LIBRARIES,
    NETWORK_KEYS,
    TOPOLOGY_KEYS,
    Dimension,
    Network,
    Topology,
)
from emulator_core.scenario.values import (
    MAX_WORLD_SIZE,
    NAME_RE,
    ScenarioError,
    bad,
    check_float,
    check_int,
    check_table,
    choice,
    parse_tables,
    quote_toml_string,
)

__all__ = ["AUTO", "CALIBRATION_KEYS", "COLLECTIVES", "CONGESTION", "DIMENSION_KINDS", "DIM_KEYS", "FORWARDING",
           "LIBRARIES", "MAX_WORLD_SIZE", "NETWORK_KEYS", "OVERLAP_POLICIES", "STRAGGLER_KEYS",
           "TOPOLOGY_KEYS", "TOP_KEYS", "Calibration", "Dimension", "Network", "Scenario", "ScenarioError",
           "Straggler", "Topology", "check_mesh", "quote_toml_string"]

#: Overlap policies: "overlap" lets communication run concurrently with compute (as recorded);
#: "serialize" makes every collective wait for compute and compute wait for every collective.
OVERLAP_POLICIES = ("overlap", "serialize")
#: Collective names accepted as keys of ``[algorithms]``.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast",
               "reduce", "gather", "scatter", "barrier", "send_recv")
#: The algorithm name meaning "pick the fastest for each size".
AUTO = "auto"
#: The keys of each table (the top level, ``[[stragglers]]``, ``[[calibration]]``), in the order the TOML
#: writer puts them.
TOP_KEYS = ("name", "description", "world_size", "topology", "algorithms", "compute_scale", "stragglers", "overlap",
            "calibration", "network", "mesh", "mesh_placement", "nccl_fit")
STRAGGLER_KEYS = ("rank", "slowdown")
CALIBRATION_KEYS = ("collective", "dimension", "algorithm", "ranks", "latency_factor", "bandwidth_factor",
                    "efficiency", "library", "sizes_bytes", "busy_slowdown", "busy_nbytes", "busy_delay_us")


def check_mesh(mesh: Any, placement: Any) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """The ``[mesh]`` table (a mapping, or (name, degree) pairs; empty or None: no mesh) and ``mesh_placement`` (names
    outermost first, a list or a ``"pp,dp,tp"`` string; empty or None: the default) as canonical (name, degree)
    pairs and names (:func:`emulator_core.scenario.mesh.parse_mesh`,
    :func:`~emulator_core.scenario.mesh.parse_placement`).

    Raises:
        ScenarioError: not a table of positive integer degrees, an unknown or repeated name, a placement that is
            not a list of names, a placement without a mesh; the key is named.
    """
    pairs: tuple[tuple[str, int], ...] = ()
    if mesh is not None and not (isinstance(mesh, (list, tuple)) and not mesh):
        if isinstance(mesh, Mapping):
            table: Any = mesh
        elif isinstance(mesh, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in mesh):
            table = dict(mesh)
            if len(table) != len(mesh):
                raise bad("mesh", [list(p) for p in mesh], "a dimension is given twice")
        else:
            raise bad("mesh", mesh, "must be a table of dimension = degree, e.g. [mesh] dp = 512, tp = 2")
        try:
            pairs = parse_mesh(table, where="mesh")
        except MeshError as e:
            raise ScenarioError("mesh", str(e).removeprefix("mesh: ").removeprefix("mesh")) from None
    names: tuple[str, ...] = ()
    if placement is not None and placement != [] and placement != ():
        if not (isinstance(placement, str) or (isinstance(placement, (list, tuple))
                                               and all(isinstance(n, str) for n in placement))):
            raise bad("mesh_placement", placement, "must be an array of mesh dimension names, outermost first")
        try:
            names = parse_placement(placement, where="mesh_placement")
        except MeshError as e:
            raise ScenarioError("mesh_placement", str(e).removeprefix("mesh_placement: ")) from None
        if not pairs:
            raise ScenarioError("mesh_placement", "places a what-if mesh: give the [mesh] table (or --set mesh.dp=N) "
                                "too")
    return pairs, names


@dataclass(frozen=True)
class Straggler:
    """A rank whose compute runs ``slowdown`` times slower than recorded (>= 1; 1.0 = on time)."""

    rank: int
    slowdown: float

    def __post_init__(self) -> None:
        check_int("rank", self.rank, 0)
        object.__setattr__(self, "slowdown", check_float("slowdown", self.slowdown, ge=1.0))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "slowdown": self.slowdown}

    @classmethod
    def from_dict(cls, d: Any) -> Straggler:
        check_table("", d, STRAGGLER_KEYS, STRAGGLER_KEYS)
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
        library: the communication library measured (``"gloo"``, ``"nccl"``; ``""`` = not recorded).
        sizes_bytes: the smallest and largest size measured (bytes, ``[min, max]``; empty = not recorded).
        busy_slowdown: how many times longer a call ran while a thread computed on its ranks' cores (>= 1; 1, the
            default: not slowed; at most 100): gloo's threads share a node's core with the training step
            (``emulator_core.pricing.answer``, "beside compute"); ``nbox calibrate --busy`` measures it beside
            a matmul thread (CPU ranks only).
        busy_nbytes: the size ``busy_slowdown`` was measured at (bytes, costmodels' convention; None, the default:
            not recorded). The factor is one call's loss there, a delay per call rather than a rate: a longer call
            beside compute loses about as much, not ``busy_slowdown`` times its length
            (``emulator_core.pricing.answer``, "beside compute").
        busy_delay_us: what one call of ``busy_nbytes`` lost beside compute where it was measured (microseconds,
            the busy median less the idle one, on ``ranks`` ranks; None: not recorded, a file written before it
            was). A time, not a share of the call's price: a what-if with a slower link does not lengthen it, and
            on ``p`` ranks it grows with the algorithm's steps (``emulator_core.pricing.answer``).
    """

    collective: str
    dimension: str
    algorithm: str
    ranks: int
    latency_factor: float = 1.0
    bandwidth_factor: float = 1.0
    efficiency: tuple[tuple[int, float], ...] = ()
    library: str = ""
    sizes_bytes: tuple[int, ...] = ()
    busy_slowdown: float = 1.0
    busy_nbytes: int | None = None
    busy_delay_us: float | None = None
    #: ``efficiency`` as a ``costmodels.Efficiency`` (derived, not a TOML key).
    curve: cm.Efficiency = field(default_factory=cm.Efficiency, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        choice("collective", self.collective, COLLECTIVES)
        if not isinstance(self.dimension, str) or not NAME_RE.match(self.dimension):
            raise bad("dimension", self.dimension, "must be a dimension name (letters, digits, '_' or '-')")
        known = cm.algorithms_for(self.collective)
        if not isinstance(self.algorithm, str) or self.algorithm not in known:
            raise bad("algorithm", self.algorithm, f"must be one of {', '.join(known)} for {self.collective}")
        check_int("ranks", self.ranks, 2, MAX_WORLD_SIZE)
        object.__setattr__(self, "latency_factor", check_float("latency_factor", self.latency_factor, gt=0))
        object.__setattr__(self, "bandwidth_factor", check_float("bandwidth_factor", self.bandwidth_factor, gt=0))
        raw: Any = self.efficiency
        wrong = [raw] if not isinstance(raw, (list, tuple)) else [pt for pt in raw if not (
            isinstance(pt, (list, tuple)) and len(pt) == 2)]
        if wrong:
            raise bad("efficiency", wrong[0], "must be an array of [size_bytes, fraction] pairs")
        points = tuple((pt[0], check_float("efficiency", pt[1])) for pt in raw)
        try:
            object.__setattr__(self, "curve", cm.Efficiency(points))
        except ValueError as e:
            raise bad("efficiency", [list(pt) for pt in points], str(e)) from None
        object.__setattr__(self, "efficiency", points)
        if not isinstance(self.library, str) or len(self.library) > 64 or not (
                self.library == "" or NAME_RE.match(self.library)):
            raise bad("library", self.library, "must be a library name such as \"gloo\" or \"nccl\"")
        sizes: Any = self.sizes_bytes
        if not isinstance(sizes, (list, tuple)) or len(sizes) not in (0, 2) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes) or (
                len(sizes) == 2 and sizes[0] > sizes[1]):
            raise bad("sizes_bytes", sizes, "must be [smallest, largest] measured size in bytes (integers >= 0)")
        object.__setattr__(self, "sizes_bytes", tuple(sizes))
        busy = check_float("busy_slowdown", self.busy_slowdown, ge=1)
        if busy > 100:
            raise bad("busy_slowdown", self.busy_slowdown, "must be <= 100 (times longer beside a computing thread)")
        object.__setattr__(self, "busy_slowdown", busy)
        if self.busy_nbytes is not None:
            check_int("busy_nbytes", self.busy_nbytes, 1, 1 << 50)
        if self.busy_delay_us is not None:
            object.__setattr__(self, "busy_delay_us", check_float("busy_delay_us", self.busy_delay_us, ge=0))

    def to_dict(self) -> dict[str, Any]:
        """Plain form, as in the TOML file; ``library``, ``sizes_bytes``, ``busy_slowdown``, ``busy_nbytes`` and
        ``busy_delay_us`` only when recorded (files without them stay the same)."""
        d = {k: getattr(self, k) for k in CALIBRATION_KEYS
             if k not in ("library", "sizes_bytes", "busy_slowdown", "busy_nbytes", "busy_delay_us")}
        out = {**d, "efficiency": [list(p) for p in self.efficiency]}
        if self.library:
            out["library"] = self.library
        if self.sizes_bytes:
            out["sizes_bytes"] = list(self.sizes_bytes)
        if self.busy_slowdown != 1.0:
            out["busy_slowdown"] = self.busy_slowdown
        if self.busy_nbytes is not None:
            out["busy_nbytes"] = self.busy_nbytes
        if self.busy_delay_us is not None:
            out["busy_delay_us"] = self.busy_delay_us
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Calibration:
        """Build from a TOML table; ``latency_factor``/``bandwidth_factor`` default to 1, ``efficiency`` to []."""
        check_table("", d, CALIBRATION_KEYS, CALIBRATION_KEYS[:4])
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
        network: network-wide model settings (``[network]``: congestion, message overhead, chunks, library;
            see ``emulator_core.scenario.topology.Network``).
        calibration: measured departures from the dimensions' nominal figures, per (collective, dimension)
            (see :class:`Calibration`; at most one per pair, each naming an existing dimension). Read them
            with :meth:`calibrated`.
        mesh: a what-if mesh, (dimension, degree) pairs with canonical names (``[mesh]``; empty: none): what
            ``nbox replay`` plays when ``--mesh`` is not given. Not checked against ``world_size`` here: the
            dimensions not named keep the recording's degree, so the mesh's world size is known at replay.
        mesh_placement: the mesh dimensions outermost first as laid on ranks (empty: tensor parallel innermost).
        nccl_fit: measured nccl-tests curves as models (``[[nccl_fit]]``, ``scenario/nccl_fit.py``), at most one
            per (collective, nodes, GPUs per node); ``auto`` prices their collectives with them.
        name: a short name a user asks for the scenario by (``--what-if dgx-h100``; empty: none; lower-case letters,
            digits and dashes); description: one line saying what cluster it is (``nbox scenario list``).
    """

    world_size: int
    topology: Topology
    algorithms: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    compute_scale: float = 1.0
    stragglers: tuple[Straggler, ...] = ()
    overlap: str = "overlap"
    calibration: tuple[Calibration, ...] = ()
    network: Network = field(default_factory=Network)
    mesh: tuple[tuple[str, int], ...] = ()
    mesh_placement: tuple[str, ...] = ()
    nccl_fit: tuple[NcclFit, ...] = ()
    name: str = ""
    description: str = ""
    _calibrated: Mapping[tuple[str, str], Calibration] = field(default_factory=dict, init=False, repr=False,
                                                               compare=False, hash=False)
    _slowdowns: Mapping[int, float] = field(default_factory=dict, init=False, repr=False, compare=False,
                                            hash=False)

    def __post_init__(self) -> None:
        w = check_int("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        if not isinstance(self.name, str) or not re.fullmatch(r"([a-z0-9][a-z0-9-]*)?", self.name):
            raise bad("name", self.name, "must be a short name of lower-case letters, digits and dashes")
        if not isinstance(self.description, str) or "\n" in self.description or len(self.description) > 200:
            raise bad("description", self.description, "must be one line of text (at most 200 characters)")
        if not isinstance(self.topology, Topology):
            raise bad("topology", self.topology, "must be a Topology")
        self._resolve_topology(w)
        algos: Any = self.algorithms
        pairs = list(algos.items()) if isinstance(algos, Mapping) else list(algos)
        seen: dict[str, str | tuple[str, ...]] = {}
        for item in pairs:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise bad("algorithms", item, "must be (collective, algorithm) pairs")
            coll, algo = item
            if not isinstance(coll, str) or coll not in COLLECTIVES:
                raise ScenarioError(f"algorithms.{coll}", f"unknown collective (allowed: {', '.join(COLLECTIVES)})")
            if coll in seen:
                raise ScenarioError(f"algorithms.{coll}", "given twice")
            known = (AUTO, *nm.algorithms_for(coll))
            if isinstance(algo, (list, tuple)):  # one per topology dimension: run dimension by dimension
                per_dim = tuple(algo)
                if len(per_dim) != len(self.topology.dims):
                    raise bad(f"algorithms.{coll}", list(per_dim), f"a per-dimension list needs one algorithm per "
                              f"topology dimension ({len(self.topology.dims)})")
                flat = tuple(a for a in known if a not in ("hierarchical",))
                wrong = [a for a in per_dim if not isinstance(a, str) or a not in flat]
                if wrong:
                    raise bad(f"algorithms.{coll}", list(per_dim), f"{wrong[0]!r} is not a one-dimension algorithm "
                              f"for {coll}; known: {', '.join(flat)}")
                seen[coll] = per_dim
                continue
            if not isinstance(algo, str) or algo not in known:  # checked here, so no command gets further
                raise bad(f"algorithms.{coll}", algo, f"no cost model for {coll}; known: {', '.join(known)}")
            seen[coll] = algo
        object.__setattr__(self, "algorithms", tuple(sorted(seen.items())))
        object.__setattr__(self, "compute_scale", check_float("compute_scale", self.compute_scale, gt=0))
        choice("overlap", self.overlap, OVERLAP_POLICIES)
        stragglers = tuple(self.stragglers)
        slow: dict[int, float] = {}
        for i, s in enumerate(stragglers):
            if not isinstance(s, Straggler):
                raise bad(f"stragglers[{i}]", s, "must be a Straggler")
            if s.rank >= w:
                raise bad(f"stragglers[{i}].rank", s.rank, f"must be < world_size ({w})")
            if s.rank in slow:
                raise bad(f"stragglers[{i}].rank", s.rank, "rank listed twice")
            slow[s.rank] = s.slowdown
        object.__setattr__(self, "stragglers", stragglers)
        object.__setattr__(self, "_slowdowns", slow)
        if not isinstance(self.network, Network):
            raise bad("network", self.network, "must be a Network")
        racked = [i for i, d in enumerate(self.topology.dims) if d.racks > 1]
        if racked and self.network.library == "nccl":
            raise bad(f"topology.dims[{racked[0]}].racks", self.topology.dims[racked[0]].racks,
                      "racks behind oversubscribed uplinks are priced by the generic model; NCCL's tuner "
                      "(network.library = \"nccl\") has none: set network.library = \"generic\"")
        mesh, placement = check_mesh(self.mesh, self.mesh_placement)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "mesh_placement", placement)
        self._check_calibration()
        object.__setattr__(self, "nccl_fit", check_fits(self.nccl_fit))

    def _check_calibration(self) -> None:
        entries, names, found = tuple(self.calibration), {d.name for d in self.topology.dims}, {}
        for i, c in enumerate(entries):
            if not isinstance(c, Calibration):
                raise bad(f"calibration[{i}]", c, "must be a Calibration")
            if c.dimension not in names:
                raise bad(f"calibration[{i}].dimension", c.dimension,
                           f"no such topology dimension (known: {', '.join(sorted(names))})")
            if (c.collective, c.dimension) in found:
                raise bad(f"calibration[{i}].collective", c.collective,
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
                raise bad(key, 0, f"cannot fill: world_size {w} is not a multiple of the other dimensions' "
                                   f"product {inner}")
            new_last = replace(last, size=w // inner)
            object.__setattr__(self, "topology", Topology((*dims[:-1], new_last)))
        elif inner * last.size != w:
            sizes = " x ".join(str(d.size) for d in dims)
            raise bad("topology.dims", sizes, f"the product of the sizes ({inner * last.size}) must equal "
                                               f"world_size ({w}); the last size may be 0 to fill it")

    def algorithm(self, collective: str) -> str:
        """The algorithm chosen for ``collective`` (``"auto"`` when the scenario does not say, ``"hierarchical"``
        when it lists one algorithm per dimension)."""
        algo = dict(self.algorithms).get(collective, AUTO)
        return algo if isinstance(algo, str) else "hierarchical"

    def dimension_algorithms(self, collective: str) -> tuple[str, ...] | None:
        """The per-dimension algorithms of ``collective`` (innermost dimension first), or ``None`` when the
        scenario names one algorithm (or none) for it. ASTRA-sim's per-dimension collective implementations."""
        algo = dict(self.algorithms).get(collective, AUTO)
        return None if isinstance(algo, str) else algo

    def slowdown(self, rank: int) -> float:
        """The compute slowdown of ``rank`` (1.0 when it is not a straggler)."""
        return self._slowdowns.get(rank, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict/list/scalar form, as in the TOML file (``from_dict(to_dict())`` == self).
        ``network``, ``mesh`` and ``mesh_placement`` only when not the defaults, so scenarios written before they
        existed stay the same."""
        out: dict[str, Any] = {**({"name": self.name} if self.name else {}),
                               **({"description": self.description} if self.description else {}),
                               "world_size": self.world_size, "compute_scale": self.compute_scale,
                               "overlap": self.overlap}
        if not self.network.is_default():
            out["network"] = self.network.to_dict()
        if self.mesh:
            out["mesh"] = dict(self.mesh)
        if self.mesh_placement:
            out["mesh_placement"] = list(self.mesh_placement)
        algorithms = {c: a if isinstance(a, str) else list(a) for c, a in self.algorithms}
        return {**out, "algorithms": algorithms, "topology": self.topology.to_dict(),
                "stragglers": [s.to_dict() for s in self.stragglers],
                "calibration": [c.to_dict() for c in self.calibration],
                **({"nccl_fit": [f.to_dict() for f in self.nccl_fit]} if self.nccl_fit else {})}

    @classmethod
    def from_dict(cls, d: Any) -> Scenario:
        """Build from the parsed TOML document; unknown keys are rejected, errors name the key path."""
        check_table("", d, TOP_KEYS)
        for k in ("world_size", "topology"):
            if k not in d:
                raise ScenarioError(k, "missing (required keys: world_size, topology)")
        try:
            topo = Topology.from_dict(d["topology"])
        except ScenarioError as e:
            raise e.prefixed("topology.") from None
        algos = d.get("algorithms", {})
        if not isinstance(algos, dict):
            raise bad("algorithms", algos, "must be a table of collective = \"algorithm\"")
        raw_strag = d.get("stragglers", [])
        if not isinstance(raw_strag, list):
            raise bad("stragglers", raw_strag, "must be an array of tables [[stragglers]]")
        stragglers = parse_tables("stragglers", raw_strag, Straggler.from_dict)
        if not isinstance(raw_cal := d.get("calibration", []), list):
            raise bad("calibration", raw_cal, "must be an array of tables [[calibration]]")
        kwargs: dict[str, Any] = {k: d[k] for k in ("compute_scale", "overlap", "mesh", "mesh_placement", "name",
                                                    "description") if k in d}
        if "network" in d:
            try:
                kwargs["network"] = Network.from_dict(d["network"])
            except ScenarioError as e:
                raise e.prefixed("network.") from None
        if not isinstance(raw_fit := d.get("nccl_fit", []), list):
            raise bad("nccl_fit", raw_fit, "must be an array of tables [[nccl_fit]]")
        kwargs["nccl_fit"] = tuple(parse_tables("nccl_fit", raw_fit, NcclFit.from_dict))
        return cls(world_size=d["world_size"], topology=topo, algorithms=tuple(algos.items()),
                   stragglers=tuple(stragglers),
                   calibration=tuple(parse_tables("calibration", raw_cal, Calibration.from_dict)), **kwargs)


