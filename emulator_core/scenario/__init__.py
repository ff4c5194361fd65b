"""The what-if: one frozen, validated :class:`Scenario` and everything that builds it.

The scenario model (``model``, on ``values`` and ``topology``), its TOML text (``tomltext``), the ``--set``
language (``overrides``), loading files and the shipped scenarios (``files``), the world size and its resize
(``world``: :func:`load_what_if` is the one call that builds a what-if from a file or a named cluster, ``--set``,
world size and mesh), the target mesh (``mesh``), the measured ``[[nccl_fit]]`` tables (``nccl_fit``, exported
whole: its helpers serve only the pricing and the calibration of those tables) and the question a report answers
(``question``).

May import: ``emulator_core.network`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "files": ("SCENARIOS_DIR", "load_scenario", "shipped_catalog"),
    "mesh": ("MeshError", "MeshPlan", "parse_mesh", "parse_placement", "plan_mesh"),
    "model": ("AUTO", "Calibration", "Scenario"),
    "nccl_fit": ("Datasheet", "NcclFit"),
    "overrides": ("parse_override",),
    "question": ("compare", "describe_changes", "share_words"),
    "tomltext": ("dump_toml", "toml_loads"),
    "topology": ("Dimension", "MAX_CHUNKS", "Network", "Topology"),
    "values": ("MAX_WORLD_SIZE", "ScenarioError", "check_float", "check_int"),
    "world": ("AskedMesh", "WhatIfWorld", "load_what_if", "resize", "scenario_mesh"),
}

__all__ = ["AUTO", "AskedMesh", "Calibration", "Datasheet", "Dimension", "MAX_CHUNKS", "MAX_WORLD_SIZE", "MeshError",
    "MeshPlan", "NcclFit", "Network", "SCENARIOS_DIR", "Scenario", "ScenarioError", "Topology", "WhatIfWorld",
    "check_float", "check_int", "compare", "describe_changes", "dump_toml", "load_scenario", "load_what_if",
    "nccl_fit", "parse_mesh", "parse_override", "parse_placement", "plan_mesh", "resize", "scenario_mesh",
    "share_words", "shipped_catalog", "toml_loads"]

if TYPE_CHECKING:
    from emulator_core.scenario import nccl_fit
    from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario, shipped_catalog
    from emulator_core.scenario.mesh import MeshError, MeshPlan, parse_mesh, parse_placement, plan_mesh
    from emulator_core.scenario.model import AUTO, Calibration, Scenario
    from emulator_core.scenario.nccl_fit import Datasheet, NcclFit
    from emulator_core.scenario.overrides import parse_override
    from emulator_core.scenario.question import compare, describe_changes, share_words
    from emulator_core.scenario.tomltext import dump_toml, toml_loads
    from emulator_core.scenario.topology import MAX_CHUNKS, Dimension, Network, Topology
    from emulator_core.scenario.values import MAX_WORLD_SIZE, ScenarioError, check_float, check_int
    from emulator_core.scenario.world import (
        AskedMesh,
        WhatIfWorld,
        load_what_if,
        resize,
        scenario_mesh,
    )
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
