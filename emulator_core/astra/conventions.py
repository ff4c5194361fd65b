"""ASTRA-sim's conventions, both ways: one rule for ``nbox scenario import/export`` and ``bench/astra_parity.py``.

ASTRA-sim 2.0's analytical network (astra-sim/astra-network-analytical) describes each topology dimension by
``topology`` (Ring, Switch, FullyConnected), ``npus_count``, ``bandwidth`` in GB/s with **GB = 2^30 bytes**, per
link and direction, and ``latency`` in ns **per link** (a Switch path is two links, a Ring path the ring
distance, a FullyConnected path one). nbox's dimension: ``bandwidth_gbps`` in Gb/s (1e9 bits/s) per link and
direction, ``latency_us`` per traversal (a switch traversal is rank -> switch -> rank, so twice ASTRA-sim's link
latency). Its congestion-aware backend makes every link a FIFO that stores and forwards whole messages (nbox:
``forwarding = "store_and_forward"``, ``[network] congestion = "aware"``); its congestion-unaware backend gives
every message its path alone (``congestion = "unaware"``).

Collective implementations: ASTRA-sim's ``ring``, ``direct``, ``halvingDoubling`` and ``doubleBinaryTree`` are
nbox's ``ring``, ``direct``, ``recursive_halving_doubling`` and ``binary_tree`` (ASTRA-sim's "double binary tree"
all-reduce is one tree carrying the whole buffer, not pipelined: its results are ``2 log2(p) x n / B``; NCCL's
pipelined double tree is nbox's ``double_binary_tree``). A system config lists one implementation per dimension,
innermost first (its ``npus_count`` order): nbox's per-dimension ``[algorithms]`` list. Its ``oneRing``,
``oneDirect`` and ``oneHalvingDoubling``, allowed as the first entry only, run one flat ring / direct /
halving-doubling over all NPUs (``GeneralComplexTopology`` then builds a single dimension): nbox's single
algorithm name on a multi-dimension topology. ``directN`` (a window of N messages in flight) has no nbox model.
Sources: astra-sim/astra-sim @ 518bd51 and
astra-network-analytical @ 599a047 (``tests/data/astra_grid/README.md``), and the results copied there.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from emulator_core.network import netmodel as nm
from emulator_core.scenario import Dimension, Network

__all__ = ["ALGORITHM_FROM_ASTRA", "ALGORITHM_TO_ASTRA", "BACKENDS", "FLAT_FROM_ASTRA", "IMPLEMENTATION_KEYS",
           "KIND_FROM_ASTRA", "KIND_TO_ASTRA", "algorithms_from_astra", "algorithms_to_astra",
           "astra_bandwidth_gbps", "astra_latency_us", "dimension_from_astra", "network_for_backend",
           "nbox_bandwidth_GBps", "nbox_latency_ns"]

#: ASTRA-sim topology name -> nbox dimension kind.
KIND_FROM_ASTRA = MappingProxyType({"Ring": "ring", "Switch": "switch", "FullyConnected": "fully_connected"})
KIND_TO_ASTRA = MappingProxyType({v: k for k, v in KIND_FROM_ASTRA.items()})
#: ASTRA-sim collective implementation -> nbox algorithm.
ALGORITHM_FROM_ASTRA = MappingProxyType({"ring": "ring", "direct": "direct",
                                         "halvingDoubling": "recursive_halving_doubling",
                                         "doubleBinaryTree": "binary_tree"})
ALGORITHM_TO_ASTRA = MappingProxyType({v: k for k, v in ALGORITHM_FROM_ASTRA.items()})
#: ASTRA-sim's flat implementations (first entry only: one algorithm over all NPUs) -> nbox algorithm.
FLAT_FROM_ASTRA = MappingProxyType({"oneRing": "ring", "oneDirect": "direct",
                                    "oneHalvingDoubling": "recursive_halving_doubling"})
_FLAT_TO_ASTRA = MappingProxyType({v: k for k, v in FLAT_FROM_ASTRA.items()})
#: nbox collective -> the system config key of its per-dimension implementations.
IMPLEMENTATION_KEYS = MappingProxyType({"all_reduce": "all-reduce-implementation",
                                        "all_gather": "all-gather-implementation",
                                        "reduce_scatter": "reduce-scatter-implementation",
                                        "all_to_all": "all-to-all-implementation"})
#: ASTRA-sim's analytical backends.
BACKENDS = ("analytical_congestion_aware", "analytical_congestion_unaware")

_BYTES_PER_GIB = float(1 << 30)


def astra_bandwidth_gbps(bandwidth_GBps: float) -> float:
    """ASTRA-sim GB/s (2^30 bytes/s) -> nbox Gb/s (1e9 bits/s): ``x * 2^30 * 8 / 1e9``."""
    return bandwidth_GBps * _BYTES_PER_GIB * 8 / 1e9


def nbox_bandwidth_GBps(bandwidth_gbps: float) -> float:
    """nbox Gb/s (1e9 bits/s) -> ASTRA-sim GB/s (2^30 bytes/s)."""
    return bandwidth_gbps * 1e9 / 8 / _BYTES_PER_GIB


def astra_latency_us(kind: str, latency_ns: float) -> float:
    """ASTRA-sim's per-link latency (ns) -> nbox's per-traversal latency (us): a switch traversal is two links."""
    return latency_ns / 1000.0 * (2 if kind == "switch" else 1)


def nbox_latency_ns(kind: str, latency_us: float) -> float:
    """nbox's per-traversal latency (us) -> ASTRA-sim's per-link latency (ns)."""
    return latency_us * 1000.0 / (2 if kind == "switch" else 1)


def network_for_backend(backend: str) -> tuple[Network, str]:
    """The ``[network]`` settings and the dimensions' ``forwarding`` that reproduce ASTRA-sim's ``backend``."""
    if backend == "analytical_congestion_aware":
        return Network(congestion="aware"), "store_and_forward"
    if backend == "analytical_congestion_unaware":
        return Network(congestion="unaware"), "cut_through"
    raise ValueError(f"unknown ASTRA-sim backend {backend!r}; known: {', '.join(BACKENDS)}")


def dimension_from_astra(name: str, topology: str, npus: int, bandwidth_GBps: float, latency_ns: float,
                         forwarding: str = "cut_through") -> Dimension:
    """One nbox dimension for one ASTRA-sim dimension (``ValueError`` naming an unknown topology)."""
    try:
        kind = KIND_FROM_ASTRA[topology]
    except KeyError:
        raise ValueError(f"unknown ASTRA-sim topology {topology!r}; known: {', '.join(KIND_FROM_ASTRA)}") from None
    return Dimension(name, npus, kind, astra_bandwidth_gbps(bandwidth_GBps), astra_latency_us(kind, latency_ns),
                     forwarding=forwarding)


def _known_astra() -> str:
    return ", ".join([*ALGORITHM_FROM_ASTRA, *FLAT_FROM_ASTRA])


def _algorithm_from_astra(collective: str, name: object, table: MappingProxyType[str, str]) -> str:
    if not isinstance(name, str):
        raise ValueError(f"{name!r} is not an implementation name; known: {_known_astra()}")
    if name.removeprefix("one").removeprefix("direct").removeprefix("Direct").isdigit():
        raise ValueError(f"{name!r}: a direct with a window of messages in flight has no nbox model (nbox's direct "
                         f"sends to every peer at once, ASTRA-sim's plain 'direct')")
    algo = table.get(name)
    if algo is None:
        where = "only as the first entry" if name in FLAT_FROM_ASTRA else "unknown"
        raise ValueError(f"{name!r}: {where}; known: {_known_astra()} (flat 'one...' ones first only)")
    flat = [a for a in nm.algorithms_for(collective) if a != "hierarchical"]
    if algo not in flat:
        raise ValueError(f"{name!r} ({algo}): nbox has no model of it for {collective}; it models {', '.join(flat)}")
    return algo


def algorithms_from_astra(collective: str, names: Sequence[object], dims: int) -> str | tuple[str, ...]:
    """An ASTRA-sim implementation list (innermost dimension first) -> the nbox ``[algorithms]`` value for
    ``collective`` on ``dims`` dimensions: one name for one dimension or a flat ``one...`` implementation, else
    one per dimension (nbox runs a single name on several dimensions as ONE flat algorithm, ASTRA-sim runs a
    list dimension by dimension, so equal entries stay a list). ``ValueError`` saying what is wrong."""
    if not names:
        raise ValueError("an empty list; ASTRA-sim needs one implementation per dimension")
    first = names[0]
    if isinstance(first, str) and first.startswith("one"):
        return _algorithm_from_astra(collective, first, FLAT_FROM_ASTRA)  # ASTRA-sim ignores the rest
    if len(names) != dims:
        raise ValueError(f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} for the network's {dims} "
                         f"dimension(s); ASTRA-sim needs one per dimension")
    per_dim = tuple(_algorithm_from_astra(collective, n, ALGORITHM_FROM_ASTRA) for n in names)
    return per_dim[0] if dims == 1 else per_dim


def algorithms_to_astra(collective: str, algorithm: str | tuple[str, ...], dims: int) -> list[str] | None:
    """The inverse of :func:`algorithms_from_astra`: ``None`` for ``auto`` (ASTRA-sim has none), else the
    implementation list. ``ValueError`` naming an algorithm ASTRA-sim does not implement."""
    if algorithm == "auto":
        return None
    if not isinstance(algorithm, str):
        names = [ALGORITHM_TO_ASTRA.get(a) for a in algorithm]
        if None in names:
            wrong = algorithm[names.index(None)]
            raise ValueError(f"{wrong!r} has no ASTRA-sim implementation; ASTRA-sim implements "
                             f"{', '.join(ALGORITHM_TO_ASTRA)} per dimension")
        return [n for n in names if n is not None]
    if dims == 1 and algorithm in ALGORITHM_TO_ASTRA:
        return [ALGORITHM_TO_ASTRA[algorithm]]
    if dims > 1 and algorithm in _FLAT_TO_ASTRA:
        return [_FLAT_TO_ASTRA[algorithm]]
    if dims > 1 and algorithm in ALGORITHM_TO_ASTRA:
        raise ValueError(f"one flat {algorithm} over {dims} dimensions has no ASTRA-sim implementation (its flat "
                         f"ones: {', '.join(FLAT_FROM_ASTRA)}); name one algorithm per dimension instead")
    raise ValueError(f"{algorithm!r} has no ASTRA-sim implementation; ASTRA-sim implements "
                     f"{', '.join(ALGORITHM_TO_ASTRA)} per dimension (and {', '.join(_FLAT_TO_ASTRA)} flat)")
