"""The network's closed forms, knowing no scenario: what a collective costs on a link, by algorithm.

The per-collective x algorithm cost formulas (``costmodels``), the wiring of each algorithm's steps (``wiring``), the
wire model that sums them over a path (``netmodel``), algbw/busbw (``bandwidth``), the fabric kinds
(``fabric_kinds``, data/fabric_kinds.toml), NCCL's graph search (``nccl_graph``) and nccl-tests' output read into
curves (``nccl_tests``). A new collective algorithm or a new fabric effect starts here.

May import: ``nbox_trace`` only; nothing else of ``emulator_core``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "bandwidth": ("algorithm_bandwidth_gbps", "bus_bandwidth_gbps"),
    "fabric_kinds": ("FABRIC_KINDS", "net_fabric", "role"),
    "nccl_graph": ("Graph", "Graphs", "search_graphs"),
    "nccl_tests": ("BUS_FACTORS", "Curve", "NcclTestsError", "Point", "parse_shape", "read_curve"),
    "wiring": ("ALL", "SHIFT", "XOR", "Racks", "step_cost", "step_shape"),
}

__all__ = ["ALL", "BUS_FACTORS", "Curve", "FABRIC_KINDS", "Graph", "Graphs", "NcclTestsError", "Point", "Racks",
    "SHIFT", "XOR", "algorithm_bandwidth_gbps", "bus_bandwidth_gbps", "costmodels", "net_fabric", "netmodel",
    "parse_shape", "read_curve", "role", "search_graphs", "step_cost", "step_shape"]

if TYPE_CHECKING:
    from emulator_core.network import costmodels, netmodel
    from emulator_core.network.bandwidth import algorithm_bandwidth_gbps, bus_bandwidth_gbps
    from emulator_core.network.fabric_kinds import FABRIC_KINDS, net_fabric, role
    from emulator_core.network.nccl_graph import Graph, Graphs, search_graphs
    from emulator_core.network.nccl_tests import BUS_FACTORS, Curve, NcclTestsError, Point, parse_shape, read_curve
    from emulator_core.network.wiring import ALL, SHIFT, XOR, Racks, step_cost, step_shape
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
