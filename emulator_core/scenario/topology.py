"""The network part of a scenario: topology dimensions, how each is wired, and network-wide model settings.

Units live in the key names: ``*_gbps`` is gigaBITS per second (1 Gb/s = 1e9 bits/s = 125 bytes/us), ``*_us``
microseconds. What one dimension's keys mean (``emulator_core.network.wiring`` prices them):

* ``bandwidth_gbps``: ONE link, per direction; a rank has ``links_per_rank`` such links in parallel (striped), to the
  switch (``switch``), to EACH of its two neighbours (``ring``, bidirectional) or to EACH peer (``fully_connected``).
* ``latency_us``: one traversal: one neighbour link (``ring``: a message d places away pays ``min(d, size - d)``
  of them); rank to rank through the switch (``switch``; ASTRA-sim counts two links of half the latency); the peer
  link (``fully_connected``).
* ``forwarding``: ``cut_through`` or ``store_and_forward`` (forwarded only once whole: each further link costs its
  size / bandwidth again).
* ``in_network_reduction`` (switch only): the switch reduces (NVLink SHARP, InfiniBand SHARP), so an all-reduce
  sends and receives its buffer once.
* ``racks`` and ``oversubscription`` (switch only): ``racks`` racks of consecutive ranks behind their own switches,
  joined by uplinks of the rack's links' sum over ``oversubscription``; 1 and 1.0: one non-blocking switch. Priced
  by the generic model only (refused with ``library = "nccl"``).
* ``fabric``, for NCCL's pricing: ``nvlink`` (the node, innermost dimension only) or a network kind (``infiniband``,
  ``roce``, ``efa``, ``tcpx``, ``tcpxo``), which adds its transport's per-message latency, protocols and
  store-and-forward slices (``emulator_core.network.fabric_kinds``); unset: NCCL's model as is.

``[network]`` applies to every dimension: ``congestion`` (``aware``: a step lasts as long as its busiest link;
``unaware``: every message alone on its path, ASTRA-sim's congestion-unaware backend), ``message_overhead_us`` (per
message a rank injects, LogP's ``o``), ``chunks`` (a multi-dimensional collective cut into that many pipelined
chunks, Themis-style), ``library`` (``generic``: ``auto`` takes the fastest modeled algorithm; ``nccl``: NCCL's
tuner) and, under NCCL only, ``host_cpu`` and ``p2p_chunk_bytes`` (its per-message network overhead and its
point-to-point message size). Where the model comes from: docs/design/network-model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from emulator_core.network import FABRIC_KINDS, role
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
)

#: Dimension kinds: a bidirectional ring (each rank linked to its two neighbours), a switch (every rank
#: linked to one non-blocking switch), fully connected (a link per pair of ranks).
DIMENSION_KINDS = ("ring", "switch", "fully_connected")
#: How a message crosses more than one link: bytes flow on as they arrive, or only once the message is whole.
FORWARDING = ("cut_through", "store_and_forward")
#: Link sharing: ``aware`` (a step lasts as long as its busiest link) or ``unaware`` (no sharing).
CONGESTION = ("aware", "unaware")
#: Whose algorithm choice ``auto`` follows.
LIBRARIES = ("generic", "nccl")
TOPOLOGY_KEYS = ("dims",)
DIM_KEYS = ("name", "size", "kind", "bandwidth_gbps", "latency_us", "links_per_rank", "forwarding",
            "in_network_reduction", "fabric", "racks", "oversubscription", "net_latency_us")
NETWORK_KEYS = ("congestion", "message_overhead_us", "chunks", "library", "host_cpu", "p2p_chunk_bytes")
#: The host CPU kinds NCCL's tuner tells apart (its per-message network overhead, its LL bandwidth cap).
HOST_CPUS = ("intel", "amd", "arm")
#: The largest per-step network latency a dimension may say (us): far above any fabric's (EFA's plugin says 150).
MAX_NET_LATENCY_US = 1e5
#: Most chunks a collective may be cut into.
MAX_CHUNKS = 4096


@dataclass(frozen=True)
class Dimension:
    """One dimension of the topology (e.g. the 8 GPUs of a node, or the nodes of a cluster).

    Attributes:
        name: a label (letters, digits, ``_``, ``-``; starts with a letter), unique within the topology.
        size: ranks along this dimension (>= 1; ``0`` only for the last dimension of a topology given to
            a ``Scenario``, resolved there).
        kind: ``"ring"``, ``"switch"`` or ``"fully_connected"`` (see :data:`DIMENSION_KINDS`).
        bandwidth_gbps: ONE link's bandwidth, per direction, in gigabits per second (1 Gb/s = 1e9 bits/s);
            see the module docstring for which link that is per kind.
        latency_us: one traversal (a neighbour link, rank-switch-rank, or a peer link), microseconds (>= 0).
        links_per_rank: parallel links (>= 1) per neighbour (ring), to the switch (switch) or per peer
            (fully_connected); they multiply ``bandwidth_gbps``.
        forwarding: ``"cut_through"`` (default) or ``"store_and_forward"``.
        in_network_reduction: the switch reduces (``kind = "switch"`` only).
        fabric: ``""`` (unset) or one of :data:`FABRIC_KINDS` (module docstring).
        racks: racks of consecutive ranks behind their own switches (``kind = "switch"`` only; 1: one switch); the
            size must be a multiple of it.
        oversubscription: a rack's links' bandwidth over its uplink's (>= 1; with ``racks`` > 1).
        net_latency_us: the network transport's latency per inter-node step, microseconds (NCCL's
            ``latencyInter``), in place of the ``fabric`` kind's figure; ``None``: the kind's. Only with a network
            ``fabric``. ``nbox calibrate --nccl-tests --model physics`` fits it.
    """

    name: str
    size: int
    kind: str
    bandwidth_gbps: float
    latency_us: float
    links_per_rank: int = 1
    forwarding: str = "cut_through"
    in_network_reduction: bool = False
    fabric: str = ""
    racks: int = 1
    oversubscription: float = 1.0
    net_latency_us: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise bad("name", self.name, "must be 1-64 letters, digits, '_' or '-', starting with a letter")
        check_int("size", self.size, 0, MAX_WORLD_SIZE)
        choice("kind", self.kind, DIMENSION_KINDS)
        object.__setattr__(self, "bandwidth_gbps", check_float("bandwidth_gbps", self.bandwidth_gbps, gt=0))
        object.__setattr__(self, "latency_us", check_float("latency_us", self.latency_us, ge=0))
        check_int("links_per_rank", self.links_per_rank, 1, 1024)
        choice("forwarding", self.forwarding, FORWARDING)
        if not isinstance(self.in_network_reduction, bool):
            raise bad("in_network_reduction", self.in_network_reduction, "must be true or false")
        if self.in_network_reduction and self.kind != "switch":
            raise bad("in_network_reduction", True, f"needs kind = \"switch\" (this dimension is {self.kind!r})")
        if self.fabric != "":
            choice("fabric", self.fabric, FABRIC_KINDS)
        check_int("racks", self.racks, 1, MAX_WORLD_SIZE)
        given = self.oversubscription
        object.__setattr__(self, "oversubscription", check_float("oversubscription", given, ge=1))
        if self.racks > 1 and self.kind != "switch":
            raise bad("racks", self.racks, f"needs kind = \"switch\" (this dimension is {self.kind!r})")
        if self.racks > 1 and self.size and self.size % self.racks:
            raise bad("racks", self.racks, f"must divide the dimension's size ({self.size}): racks of equal size")
        if self.oversubscription != 1.0 and self.racks == 1:
            raise bad("oversubscription", given, "oversubscribes the uplinks between racks: give racks > 1 too")
        if self.net_latency_us is not None:
            lat = check_float("net_latency_us", self.net_latency_us, ge=0)
            if lat > MAX_NET_LATENCY_US:
                raise bad("net_latency_us", lat, f"must be at most {MAX_NET_LATENCY_US:g} us")
            if not self.fabric or role(self.fabric) != "network":
                raise bad("net_latency_us", lat, "replaces a network fabric kind's latency: give the dimension's "
                          "fabric (infiniband, roce, efa, tcpx, tcpxo) too")
            object.__setattr__(self, "net_latency_us", lat)

    @property
    def link_bytes_per_us(self) -> float:
        """One link's bandwidth per direction in bytes per microsecond (Gb/s x 1e9 / 8 / 1e6 = Gb/s x 125)."""
        return self.bandwidth_gbps * 125.0

    @property
    def bandwidth_bytes_per_us(self) -> float:
        """A rank's bandwidth to one neighbour / the switch / one peer, per direction, in bytes per microsecond:
        one link's times ``links_per_rank``."""
        return self.link_bytes_per_us * self.links_per_rank

    def to_dict(self) -> dict[str, Any]:
        """Plain form; ``forwarding``, ``in_network_reduction``, ``fabric``, ``racks``, ``oversubscription`` and
        ``net_latency_us`` only when not the defaults."""
        out: dict[str, Any] = {"name": self.name, "size": self.size, "kind": self.kind,
                               "bandwidth_gbps": self.bandwidth_gbps, "latency_us": self.latency_us,
                               "links_per_rank": self.links_per_rank}
        if self.forwarding != "cut_through":
            out["forwarding"] = self.forwarding
        if self.in_network_reduction:
            out["in_network_reduction"] = True
        if self.fabric:
            out["fabric"] = self.fabric
        if self.racks != 1:
            out["racks"] = self.racks
        if self.oversubscription != 1.0:
            out["oversubscription"] = self.oversubscription
        if self.net_latency_us is not None:
            out["net_latency_us"] = self.net_latency_us
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Dimension:
        """Build from a TOML table; errors name the key relative to the table (prefix them)."""
        check_table("", d, DIM_KEYS, DIM_KEYS[:5])
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
                raise bad(f"dims[{i}]", d, "must be a Dimension")
            if d.name in seen:
                raise bad(f"dims[{i}].name", d.name, "duplicate dimension name")
            seen.add(d.name)
            if d.size == 0 and i != len(self.dims) - 1:
                raise bad(f"dims[{i}].size", 0, "only the last dimension may have size 0 (= fill to world_size)")
            if d.fabric:
                node = i == 0 and len(self.dims) > 1
                if role(d.fabric) == "node" and not node:
                    raise bad(f"dims[{i}].fabric", d.fabric, "is a node fabric: only the innermost dimension of a "
                              "topology of several dimensions may say it")
                if role(d.fabric) == "network" and node:
                    raise bad(f"dims[{i}].fabric", d.fabric, "is a network: the innermost dimension of a topology of "
                              "several dimensions is the node (nvlink)")

    @property
    def world_size(self) -> int:
        """The product of the dimension sizes (0 while the last size is still unresolved)."""
        return math.prod(d.size for d in self.dims)

    def to_dict(self) -> dict[str, Any]:
        return {"dims": [d.to_dict() for d in self.dims]}

    @classmethod
    def from_dict(cls, d: Any) -> Topology:
        check_table("", d, TOPOLOGY_KEYS)
        dims = d.get("dims")
        if not isinstance(dims, list):
            raise ScenarioError("dims", "missing: an array of tables [[topology.dims]]") if dims is None \
                else bad("dims", dims, "must be an array of tables [[topology.dims]]")
        return cls(tuple(parse_tables("dims", dims, Dimension.from_dict)))


@dataclass(frozen=True)
class Network:
    """Network-wide model settings (the ``[network]`` table); see the module docstring.

    Attributes:
        congestion: ``"aware"`` (default: links are shared) or ``"unaware"`` (ASTRA-sim's congestion-unaware
            analytical backend: each message alone on its path; optimistic, for comparison only).
        message_overhead_us: microseconds (>= 0) a rank spends per message it injects (LogP's ``o``); a step
            in which a rank sends ``k`` messages costs ``k`` times it. Default 0.
        chunks: 1 .. :data:`MAX_CHUNKS`; a collective over several dimensions is cut into this many chunks,
            pipelined through its per-dimension phases (Themis' dimension-aware scheduling). Default 1.
        library: ``"generic"`` (``auto`` = fastest modeled algorithm) or ``"nccl"`` (``auto`` = NCCL's tuner).
        host_cpu: ``""`` (unset: NCCL's model takes an Intel host) or one of :data:`HOST_CPUS`, the nodes' CPU
            vendor: NCCL's per-message network overhead (1 us Intel, 2 us AMD) and its LL cap follow it.
            ``library = "nccl"`` only.
        p2p_chunk_bytes: 0 (unset: NCCL's 128 KiB) or the bytes of one point-to-point network message,
            ``NCCL_P2P_NET_CHUNKSIZE``, which the all-to-all's per-message cost follows. ``library = "nccl"`` only.
    """

    congestion: str = "aware"
    message_overhead_us: float = 0.0
    chunks: int = 1
    library: str = "generic"
    host_cpu: str = ""
    p2p_chunk_bytes: int = 0

    def __post_init__(self) -> None:
        choice("congestion", self.congestion, CONGESTION)
        object.__setattr__(self, "message_overhead_us",
                           check_float("message_overhead_us", self.message_overhead_us, ge=0))
        check_int("chunks", self.chunks, 1, MAX_CHUNKS)
        choice("library", self.library, LIBRARIES)
        if self.host_cpu != "":
            choice("host_cpu", self.host_cpu, HOST_CPUS)
        check_int("p2p_chunk_bytes", self.p2p_chunk_bytes, 0, 1 << 30)
        for key, value in (("host_cpu", self.host_cpu), ("p2p_chunk_bytes", self.p2p_chunk_bytes)):
            if value and self.library != "nccl":
                raise bad(key, value, "is a setting of NCCL's model, which this scenario does not use: set "
                          "network.library = \"nccl\" or leave it out")

    def is_default(self) -> bool:
        return self == Network()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"congestion": self.congestion, "message_overhead_us": self.message_overhead_us,
                               "chunks": self.chunks, "library": self.library}
        if self.host_cpu:
            out["host_cpu"] = self.host_cpu
        if self.p2p_chunk_bytes:
            out["p2p_chunk_bytes"] = self.p2p_chunk_bytes
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Network:
        check_table("", d, NETWORK_KEYS)
        return cls(**d)
