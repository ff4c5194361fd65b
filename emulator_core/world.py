"""The world size a scenario is played at, and the one rule that resizes a scenario to it.

Every command that plays a scenario at a world size other than the file's (``nbox replay``, ``nbox sweep``,
``nbox emulate``, the ``nbox`` backend, ``nbox scenario cost --world-size``) calls :func:`resize`; a replay
or a sweep of a recording picks its world size with :func:`what_if_world`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from emulator_core.scenario import Scenario, ScenarioError
from emulator_core.scenario_overrides import parse_override

__all__ = ["resize", "sets_world_size", "what_if_world"]


def resize(scenario: Scenario, world_size: int) -> Scenario:
    """``scenario`` at ``world_size`` ranks (the same scenario when it already has that many).

    The outermost dimension grows or shrinks to fit. A world no larger than the innermost dimension
    (e.g. 2 ranks on an 8-GPU-per-node scenario) keeps the innermost dimension only, sized to the world:
    the ranks share one node, the outer dimensions have size 1.

    Raises:
        ScenarioError: ``world_size`` is below 1, or neither rule fits (not a multiple of the inner
            dimensions' product, and larger than the innermost dimension); the message names ``world_size``.
    """
    if scenario.world_size == world_size:
        return scenario
    dims = scenario.topology.dims
    inner = math.prod(d.size for d in dims[:-1])
    if world_size >= 1 and world_size % inner == 0:
        last = replace(dims[-1], size=world_size // inner)
        new_dims = (*dims[:-1], last)
    elif 1 <= world_size <= dims[0].size:
        new_dims = (replace(dims[0], size=world_size), *(replace(d, size=1) for d in dims[1:]))
    else:
        raise ScenarioError("world_size", f"must be a positive multiple of {inner}, the product of the inner "
                            f"dimensions {[d.name for d in dims[:-1]]}, or at most {dims[0].size} (the "
                            f"innermost dimension {dims[0].name!r})", value=world_size, has_value=True)
    return replace(scenario, world_size=world_size, topology=replace(scenario.topology, dims=new_dims))


def sets_world_size(overrides: Sequence[str]) -> bool:
    """Whether one of the ``--set`` overrides sets ``world_size``.

    Raises:
        ScenarioError: an override that is not ``KEY=VALUE``.
    """
    return any(parse_override(o)[0] == ["world_size"] for o in overrides)


def what_if_world(scenario: Scenario, overrides: Sequence[str], recorded_world: int,
                  requested: int | None = None) -> int:
    """The world size to play a recording of ``recorded_world`` ranks at, under ``scenario``.

    ``requested`` (``--world-size``, a sweep's ``world_size`` axis) when given; else the scenario's own
    when an override sets ``world_size`` (``--set world_size=64``); else the recorded world size.
    """
    if requested is not None:
        return requested
    return scenario.world_size if sets_world_size(overrides) else recorded_world
