"""ASTRA-sim's analytical network config (YAML) and system config (JSON) <-> an nbox :class:`Scenario`.

``nbox scenario import NETWORK.yml [SYSTEM.json]`` and ``nbox scenario export``. The conversion rules (topology
kinds, GB/s with GB = 2^30 bytes -> Gb/s, per-link latency -> per-traversal latency with a switch traversal two
links, the backend -> ``[network] congestion`` and the dimensions' ``forwarding``, implementation names ->
nbox algorithms) are :mod:`emulator_core.astra`'s; this module reads and writes the files around them.

Network config (astra-network-analytical's ``NetworkParser``): ``topology``, ``npus_count``, ``bandwidth`` and
``latency``, each a list with one entry per dimension. The FIRST entry is the innermost dimension: NPU ``id``
has coordinate ``id % npus_count[0]`` in it (``MultiDimTopology::translate_address``; the system layer's
``GeneralComplexTopology`` gives dimension 0 an offset of 1), nbox's order too. Dimensions are named ``dim0``,
``dim1``, ... innermost first; the world size is the product of ``npus_count``. The backend is not in the files
(it is which ASTRA-sim binary runs them), so it is an argument: congestion-aware by default.

System config (``Sys::initialize_sys``): ``all-reduce-implementation``, ``all-gather-implementation``,
``reduce-scatter-implementation`` and ``all-to-all-implementation`` become ``[algorithms]``;
``preferred-dataset-splits`` becomes ``[network] chunks`` (ASTRA-sim cuts a collective into that many chunks,
each a stream through the dimension phases). Every other key is not mapped and says so in the notes:
``endpoint-delay`` is ASTRA-sim's delay (in cycles) for every packet an algorithm step moves between the NPU and
its memory bus, not a per-message injection cost like ``message_overhead_us``; ``active-chunks-per-dimension``,
``scheduling-policy``, ``collective-optimization`` (nbox's per-dimension all-reduce is ``localBWAware``'s
reduce-scatter in, all-reduce on the last dimension, all-gather out), the LogGP and memory keys and the
compute keys (roofline, peak-perf, local-mem-bw) have no nbox counterpart. Custom (Chakra ET) collectives are
refused. Export writes the inverse, and refuses what ASTRA-sim cannot express: in-network reduction,
``[[calibration]]`` factors, a per-message overhead, a size-1 dimension, algorithms it does not implement;
what is not network (compute scale, stragglers, overlap, compute noise) is left out and named in the notes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from emulator_core.astra import conventions as astra
from emulator_core.astra.flatyaml import format_flat_yaml_list, read_flat_yaml
from emulator_core.scenario import (
    MAX_CHUNKS,
    MAX_WORLD_SIZE,
    Dimension,
    Network,
    Scenario,
    ScenarioError,
    Topology,
    check_float,
    check_int,
)
from nbox_trace.errors import UsageError
from nbox_trace.files import write_atomic
from nbox_trace.jsonio import load_json

__all__ = ["MAX_SYSTEM_JSON_BYTES", "NETWORK_KEYS", "AstraConfigs", "Exported", "Imported", "astra_configs",
           "export_astra", "import_astra"]

#: The analytical network config's keys, in ASTRA-sim's order.
NETWORK_KEYS = ("topology", "npus_count", "bandwidth", "latency")
#: Largest system config read (ASTRA-sim's own are under 1 KiB).
MAX_SYSTEM_JSON_BYTES = 1 << 20
#: What the files are called in an export folder.
NETWORK_FILE, SYSTEM_FILE = "network.yml", "system.json"
_CUSTOM_KEYS = ("all-reduce-implementation-custom", "all-gather-implementation-custom",
                "reduce-scatter-implementation-custom", "all-to-all-implementation-custom",
                "per-node-custom-implementation")
#: System keys ASTRA-sim reads that are not mapped: why, and the value nbox's model matches (no note then).
_UNMAPPED: dict[str, tuple[str, Any]] = {
    "endpoint-delay": ("a per-packet delay (cycles) at the NPU's memory bus in every algorithm step, not nbox's "
                       "per-message message_overhead_us", 0),
    "active-chunks-per-dimension": ("chunks in flight per dimension", None),
    "scheduling-policy": ("the order of queued collectives", None),
    "collective-optimization": ("nbox runs a per-dimension all-reduce as localBWAware does (reduce-scatter in, "
                                "all-reduce on the last dimension, all-gather out)", "localBWAware"),
}
_UNMAPPED_LOGGP = ("local-reduction-delay", "L", "o", "g", "G", "model-shared-bus")
_NOT_NETWORK = ("local-mem-bw", "peak-perf", "roofline-enabled", "boost-mode", "track-local-mem",
                "local-mem-trace-filename", "trace-enabled", "replay-only")


class Imported(NamedTuple):
    """What :func:`import_astra` read: the scenario, and one line per thing it did not map."""

    scenario: Scenario
    notes: list[str]


class AstraConfigs(NamedTuple):
    """A scenario as ASTRA-sim's two configs (text), the backend to run them with, and what was left out."""

    network_yml: str
    system_json: str
    backend: str
    notes: list[str]


class Exported(NamedTuple):
    """What :func:`export_astra` wrote: the two files, the backend to run them with, and what was left out."""

    paths: list[Path]
    backend: str
    notes: list[str]


def _listed(keys: list[str], most: int = 10) -> str:
    """Up to ``most`` keys, each cut to 64 characters, and how many more."""
    shown = ", ".join(json.dumps(k)[1:-1][:64] for k in keys[:most])
    return shown + (f" (and {len(keys) - most} more)" if len(keys) > most else "")


def _number(key: str, value: Any, file: str, *, gt: float | None = None, ge: float | None = None) -> float:
    try:
        return check_float(key, value, gt=gt, ge=ge)
    except ScenarioError as e:
        raise e.in_file(file) from None


def _dimensions(path: Path, forwarding: str) -> tuple[tuple[Dimension, ...], list[str]]:
    doc = read_flat_yaml(path)
    unknown = [k for k in doc if k not in NETWORK_KEYS]
    notes = [f"{path}: not an analytical network key; ignored (as ASTRA-sim does): {_listed(unknown)}"] \
        if unknown else []
    lists: dict[str, list[Any]] = {}
    for key in NETWORK_KEYS:
        if key not in doc:
            raise ScenarioError(key, f"missing (the analytical network needs {', '.join(NETWORK_KEYS)})",
                                file=str(path))
        value, line = doc[key]
        if not isinstance(value, list) or not value:
            raise ScenarioError(key, "must be a [ list ] with one entry per dimension", value=value, has_value=True,
                                file=f"{path}:{line}")
        lists[key] = value
    n = len(lists["topology"])
    for key in NETWORK_KEYS[1:]:
        if len(lists[key]) != n:
            raise ScenarioError(key, f"has {len(lists[key])} entries but topology has {n}; one per dimension",
                                value=lists[key], has_value=True, file=f"{path}:{doc[key][1]}")
    dims = []
    for i in range(n):
        where = {k: f"{path}:{doc[k][1]}" for k in NETWORK_KEYS}
        topo, npus = lists["topology"][i], lists["npus_count"][i]
        if not isinstance(topo, str) or topo not in astra.KIND_FROM_ASTRA:
            raise ScenarioError(f"topology[{i}]", f"unknown topology; known: {', '.join(astra.KIND_FROM_ASTRA)}",
                                value=topo, has_value=True, file=where["topology"])
        try:
            check_int(f"npus_count[{i}]", npus, 2, MAX_WORLD_SIZE)
        except ScenarioError as e:
            raise e.in_file(where["npus_count"]) from None
        bandwidth = _number(f"bandwidth[{i}]", lists["bandwidth"][i], where["bandwidth"], gt=0)
        latency = _number(f"latency[{i}]", lists["latency"][i], where["latency"], ge=0)
        try:
            dims.append(astra.dimension_from_astra(f"dim{i}", topo, npus, bandwidth, latency, forwarding))
        except ScenarioError as e:  # a figure out of nbox's range once converted (e.g. 1e308 GB/s)
            raise ScenarioError(f"bandwidth[{i}]", e.reason, value=bandwidth, has_value=True,
                                file=where["bandwidth"]) from None
    if math.prod(d.size for d in dims) > MAX_WORLD_SIZE:
        raise ScenarioError("npus_count", f"the product must be <= {MAX_WORLD_SIZE}", value=lists["npus_count"],
                            has_value=True, file=f"{path}:{doc['npus_count'][1]}")
    return tuple(dims), notes


def _system(path: Path, dims: int) -> tuple[dict[str, str | tuple[str, ...]], int, list[str]]:
    doc = load_json(path, max_bytes=MAX_SYSTEM_JSON_BYTES, what="ASTRA-sim system config")
    file = str(path)
    if not isinstance(doc, dict):
        raise ScenarioError("", "an ASTRA-sim system config is a JSON object", file=file)
    custom = [k for k in _CUSTOM_KEYS if k in doc]
    if custom:
        raise ScenarioError(custom[0], "a custom collective (a Chakra ET per collective) has no nbox model; "
                                       "use the native implementations (all-reduce-implementation, ...)", file=file)
    algorithms: dict[str, str | tuple[str, ...]] = {}
    for collective, key in astra.IMPLEMENTATION_KEYS.items():
        if key not in doc:
            continue
        names = doc[key]
        if not isinstance(names, list):
            raise ScenarioError(key, "must be a list of implementation names, one per dimension", value=names,
                                has_value=True, file=file)
        try:
            algorithms[collective] = astra.algorithms_from_astra(collective, names, dims)
        except ValueError as e:
            raise ScenarioError(key, str(e), value=names, has_value=True, file=file) from None
    chunks = 1
    if "preferred-dataset-splits" in doc:
        try:
            chunks = check_int("preferred-dataset-splits", doc["preferred-dataset-splits"], 1, MAX_CHUNKS)
        except ScenarioError as e:
            raise e.in_file(file) from None
    notes = [f"{file}: not mapped: {k} = {json.dumps(doc[k])[:64]} ({why})" for k, (why, same) in _UNMAPPED.items()
             if k in doc and doc[k] != same]
    skipped = [k for k in _UNMAPPED_LOGGP if k in doc]
    if skipped:
        notes.append(f"{file}: not mapped (LogGP / memory bus model): {', '.join(skipped)}")
    skipped = [k for k in _NOT_NETWORK if k in doc]
    if skipped:
        notes.append(f"{file}: not mapped (compute, memory, tracing: not the network): {', '.join(skipped)}")
    known = {*astra.IMPLEMENTATION_KEYS.values(), "preferred-dataset-splits", *_UNMAPPED, *_UNMAPPED_LOGGP,
             *_NOT_NETWORK}
    unknown = [k for k in doc if k not in known]
    if unknown:
        notes.append(f"{file}: not an ASTRA-sim system key; ignored: {_listed(unknown)}")
    return algorithms, chunks, notes


def import_astra(network_yml: Path, system_json: Path | None = None, *,
                 backend: str = "analytical_congestion_aware") -> Imported:
    """The scenario ASTRA-sim's configs describe (see the module docstring), and notes on what was not mapped.

    Args:
        network_yml: the analytical network config.
        system_json: the system config; ``None``: every collective ``auto``, one chunk.
        backend: the ASTRA-sim backend the configs are meant for (:data:`emulator_core.astra.conventions.BACKENDS`).

    Raises:
        UsageError: an unknown ``backend``.
        InputNotFoundError: a file does not exist.
        ScenarioError, InvalidInputError: a file is not what ASTRA-sim reads, or holds what nbox cannot model; the
            message names the file (and line) and the key.
    """
    try:
        network, forwarding = astra.network_for_backend(backend)
    except ValueError as e:
        raise UsageError(f"backend: {e}") from None
    dims, notes = _dimensions(network_yml, forwarding)
    algorithms: dict[str, str | tuple[str, ...]] = {}
    if system_json is None:
        notes.append("no system config: every collective's algorithm is auto, one chunk")
    else:
        algorithms, chunks, more = _system(system_json, len(dims))
        network = Network(congestion=network.congestion, chunks=chunks)
        notes += more
    scenario = Scenario(world_size=math.prod(d.size for d in dims), topology=Topology(dims),
                        algorithms=tuple(algorithms.items()), network=network)
    return Imported(scenario, notes)


def _backend_for(scenario: Scenario, notes: list[str]) -> str:
    backend = astra.BACKENDS[0] if scenario.network.congestion == "aware" else astra.BACKENDS[1]
    forwarding = astra.network_for_backend(backend)[1]
    other = [d.name for d in scenario.topology.dims if d.forwarding != forwarding]
    if other:
        notes.append(f"forwarding: ASTRA-sim's {backend} backend is {forwarding}, but dimension(s) "
                     f"{', '.join(other)} say otherwise: its times will differ from nbox's")
    return backend


def astra_configs(scenario: Scenario, *, source: str | None = None) -> AstraConfigs:
    """``scenario`` as ASTRA-sim's network and system configs (text); see the module docstring.

    Args:
        source: the scenario's file, named in errors.

    Raises:
        ScenarioError: the scenario holds what ASTRA-sim cannot express; the message names the key.
    """
    def refuse(key: str, value: Any, reason: str) -> ScenarioError:
        return ScenarioError(key, reason, value=value, has_value=True, file=source or None)

    notes: list[str] = []
    dims = scenario.topology.dims
    for i, d in enumerate(dims):
        if d.in_network_reduction:
            raise refuse(f"topology.dims[{i}].in_network_reduction", True, "ASTRA-sim's analytical network has "
                         "no in-network reduction")
        if d.size < 2:
            raise refuse(f"topology.dims[{i}].size", d.size, "ASTRA-sim needs npus_count > 1 in every dimension")
        if d.links_per_rank != 1:
            notes.append(f"topology.dims[{i}].links_per_rank = {d.links_per_rank}: written as one link of "
                         f"{d.links_per_rank} x the bandwidth (ASTRA-sim has one link per neighbour/switch/peer)")
    if scenario.calibration:
        raise refuse("calibration[0]", scenario.calibration[0].collective, "calibration factors have no ASTRA-sim "
                     "form; export the scenario without [[calibration]]")
    if scenario.network.message_overhead_us:
        raise refuse("network.message_overhead_us", scenario.network.message_overhead_us,
                     "ASTRA-sim's analytical network has no per-message overhead")
    backend = _backend_for(scenario, notes)
    system: dict[str, Any] = {"scheduling-policy": "LIFO", "endpoint-delay": 0, "active-chunks-per-dimension": 1,
                              "preferred-dataset-splits": scenario.network.chunks}
    auto: list[str] = []
    for collective, key in astra.IMPLEMENTATION_KEYS.items():
        algo = dict(scenario.algorithms).get(collective, "auto")
        try:
            names = astra.algorithms_to_astra(collective, algo, len(dims))
        except ValueError as e:
            raise refuse(f"algorithms.{collective}", algo if isinstance(algo, str) else list(algo), str(e)) from None
        if names is None:
            auto.append(collective)
        else:
            system[key] = names
    if auto:
        notes.append(f"algorithms: auto for {', '.join(auto)}: no implementation written (ASTRA-sim has no auto; "
                     f"a workload with such a collective needs one: set algorithms.{auto[0]} = \"ring\" or a list "
                     f"per dimension)")
    system["collective-optimization"] = "localBWAware"
    others = [c for c, _ in scenario.algorithms if c not in astra.IMPLEMENTATION_KEYS]
    if others:
        notes.append(f"algorithms: not written (ASTRA-sim's system config has no such key): {', '.join(others)}")
    left_out = [k for k, v in (("compute_scale", scenario.compute_scale != 1.0), ("stragglers", scenario.stragglers),
                               ("overlap", scenario.overlap != "overlap"),
                               ("network.library", scenario.network.library != "generic"),
                               ("topology.dims.fabric", any(d.fabric for d in dims))) if v]
    if left_out:
        notes.append(f"not exported (not ASTRA-sim's network or collective config): {', '.join(left_out)}")
    lines = ["# ASTRA-sim analytical network, written by nbox scenario export",
             f"# run with ASTRA-sim's {backend} backend",
             format_flat_yaml_list("topology", [astra.KIND_TO_ASTRA[d.kind] for d in dims]),
             format_flat_yaml_list("npus_count", [d.size for d in dims]),
             format_flat_yaml_list("bandwidth", [_decimal(astra.nbox_bandwidth_GBps(d.bandwidth_gbps *
                                                                                   d.links_per_rank)) for d in dims],
                                   "GB/s (2^30 bytes/s) per link and direction"),
             format_flat_yaml_list("latency", [_decimal(astra.nbox_latency_ns(d.kind, d.latency_us)) for d in dims],
                                   "ns per link (a switch path is 2 links)")]
    body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in system.items())
    return AstraConfigs("\n".join(lines) + "\n", "{\n" + body + "\n}\n", backend, notes)


def _decimal(x: float) -> float:
    """``x`` at 15 significant digits: a figure imported from ASTRA-sim goes back exactly as it was written
    (the unit conversions there and back may leave a last-bit error)."""
    return float(f"{x:.15g}")


def export_astra(scenario: Scenario, out_dir: Path, *, source: str | None = None) -> Exported:
    """Write ``scenario`` as ``network.yml`` and ``system.json`` in ``out_dir`` (created if missing).

    Both texts are built first, so a refused scenario writes nothing; each file is written atomically, and the
    first is removed again when the second cannot be written (unless it was there before).

    Raises:
        ScenarioError: the scenario holds what ASTRA-sim cannot express (see :func:`astra_configs`).
        OutputWriteError: a file cannot be written.
    """
    configs = astra_configs(scenario, source=source)
    network, system = out_dir / NETWORK_FILE, out_dir / SYSTEM_FILE
    existed = network.exists()
    write_atomic(network, configs.network_yml)
    try:
        write_atomic(system, configs.system_json)
    except BaseException:
        if not existed:
            network.unlink(missing_ok=True)
        raise
    return Exported([network, system], configs.backend, configs.notes)
