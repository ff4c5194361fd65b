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
pipelined double tree is nbox's ``double_binary_tree``). Sources: astra-sim/astra-sim @ 518bd51 and
astra-network-analytical @ 599a047 (``../shared/astra/README.md``), and the results in that directory.
"""

from __future__ import annotations

from types import MappingProxyType

from emulator_core.scenario_topology import Dimension, Network

__all__ = ["ALGORITHM_FROM_ASTRA", "ALGORITHM_TO_ASTRA", "BACKENDS", "KIND_FROM_ASTRA", "KIND_TO_ASTRA",
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
