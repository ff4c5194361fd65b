"""Fabric kinds: what a topology dimension's ``fabric`` key means to NCCL's pricing path.

The kinds and their figures live in ``data/fabric_kinds.toml`` with their sources. A kind is either the node's
fabric (``nvlink``) or a network's (``infiniband``, ``roce``, ``efa``, ``tcpx``, ``tcpxo``). A network kind gives
NCCL's model (:mod:`emulator_core.pricing.nccl_tuner`) the transport's per-message latency beyond InfiniBand verbs
(NCCL's ``latencyInter``), the protocols NCCL runs across it, and the store-and-forward slice each network hop holds
before forwarding (the pipeline fill at mid sizes). See the data file for why each term exists.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FABRIC_KINDS", "NetFabric", "fabric_kinds", "net_fabric"]

DATA_FILE = Path(__file__).with_name("data") / "fabric_kinds.toml"
#: The kinds a dimension's ``fabric`` key may name (the data file's tables, in this order).
FABRIC_KINDS = ("nvlink", "infiniband", "roce", "efa", "tcpx", "tcpxo")


@dataclass(frozen=True)
class NetFabric:
    """A network kind as NCCL's model uses it: ``latency_us`` per network hop (NCCL's latencyInter),
    ``protocols`` NCCL runs across it, ``slice_bytes`` per protocol (LL, LL128, Simple) a hop holds before
    forwarding."""

    kind: str
    latency_us: float
    protocols: tuple[str, ...]
    slice_bytes: tuple[float, float, float]


@functools.cache
def fabric_kinds() -> dict[str, Any]:
    """The parsed ``data/fabric_kinds.toml`` (read once; ``tomllib``, or ``tomli`` on Python 3.10, directly: the
    scenario modules import this one, so it cannot import theirs)."""
    toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    doc: dict[str, Any] = toml.loads(DATA_FILE.read_text(encoding="utf-8"))
    return doc


def role(kind: str) -> str:
    """``"node"`` or ``"network"``: where a kind may stand in a topology."""
    return str(fabric_kinds()["kinds"][kind]["role"])


def net_fabric(kind: str) -> NetFabric:
    """The network kind ``kind``'s terms (``kind`` must be a network kind of :data:`FABRIC_KINDS`)."""
    k = fabric_kinds()
    entry = k["kinds"][kind]
    s = k["common"]["net_slice_bytes"]
    return NetFabric(kind, float(entry["net_latency_us"]), tuple(str(p) for p in entry["protocols"]),
                     (float(s[0]), float(s[1]), float(s[2])))
