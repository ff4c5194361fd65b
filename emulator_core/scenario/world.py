"""The world size a scenario is played at: the one rule that picks it, and the one rule that resizes to it.

**Which world size** (:func:`what_if_world`, the same for ``nbox replay``, ``nbox sweep`` and ``nbox emulate``),
first that applies:

1. ``--world-size`` (a sweep's ``world_size`` axis);
2. ``--set world_size=N``;
3. the ``world_size`` of the what-if file the user named (``--what-if``; ``nbox emulate``: also the shipped
   default when no file is named, as there is no recording);
4. the recorded world size (a replay or sweep with no what-if file: the baseline's scenario at the
   recording's size).

The scenario is then built at that size (:func:`load_what_if`): its topology resized by :func:`resize`, and only
then the values that depend on the world size checked (a straggler's rank must be below it), so
``--world-size 64`` with ``stragglers.0.rank=40`` on an 8-rank file works and the error, when there is one,
names the world size it was checked against and where that came from. Every report says where its world
size came from (:attr:`WhatIfWorld.source`).

Every command that plays a scenario at a world size other than the file's (also the ``nbox`` backend and
``nbox scenario cost --world-size``) resizes with :func:`resize`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from emulator_core.scenario.files import read_scenario_doc
from emulator_core.scenario.model import Scenario, ScenarioError, check_mesh
from emulator_core.scenario.overrides import apply_overrides, parse_override
from nbox_trace.mesh import canonical_name

__all__ = ["WORLD_SOURCES", "AskedMesh", "WhatIfWorld", "load_what_if", "resize",
           "scenario_mesh", "sets_world_size", "what_if_world"]

#: Where a world size came from, in the order of precedence (module docstring).
WORLD_SOURCES = ("--world-size", "--set world_size", "what-if file", "recorded")


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


@dataclass(frozen=True)
class AskedMesh:
    """A what-if mesh a scenario asks for (:func:`scenario_mesh`).

    Attributes:
        degrees: (dimension, degree) pairs, canonical names; placement: names outermost first (empty: default).
        text: where it came from, for messages and reports: ``--set mesh.dp=512``, ``[mesh] of x.toml``, or
            ``[mesh] of x.toml with --set mesh.dp=512``.
        set_dims: the dimensions a ``--set mesh.<dim>`` names (a sweep refuses to vary them too).
    """

    degrees: tuple[tuple[str, int], ...]
    placement: tuple[str, ...]
    text: str
    set_dims: frozenset[str] = frozenset()


def scenario_mesh(path: Path | None, overrides: Sequence[str] = ()) -> AskedMesh | None:
    """The what-if mesh of the scenario: the ``[mesh]`` table and ``mesh_placement`` of the file the user named
    (``path``; None: none named, as the world size of a default file does not count either), with the ``--set
    mesh.<dim>=N`` / ``--set mesh_placement=...`` overrides applied. None: the scenario asks for no mesh.

    Raises:
        InputNotFoundError: the file does not exist.
        ScenarioError: a bad ``[mesh]`` or ``mesh_placement`` (named, with the file).
    """
    doc: dict[str, Any] = {}
    where = ""
    if path is not None:
        doc, file = read_scenario_doc(path)
        where = str(file)
        doc = {k: doc[k] for k in ("mesh", "mesh_placement") if k in doc}
    try:
        mine = [o for o in overrides if parse_override(o)[0][0] in ("mesh", "mesh_placement")]
        from_file = bool(doc.get("mesh"))
        doc = apply_overrides(doc, mine)
        degrees, placement = check_mesh(doc.get("mesh"), doc.get("mesh_placement"))
    except ScenarioError as e:
        raise e.in_file(where) if where else e from None
    if not degrees:
        return None
    set_text = " ".join(f"--set {o.strip()}" for o in mine)
    text = set_text
    if from_file:
        text = f"[mesh] of {Path(where).name}" + (f" with {set_text}" if set_text else "")
    set_dims = frozenset(canonical_name(key[1], where="--set mesh") for key, _ in map(parse_override, mine)
                         if key[0] == "mesh" and len(key) == 2)
    return AskedMesh(degrees, placement, text, set_dims)


@dataclass(frozen=True)
class WhatIfWorld:
    """A settled world size and where it came from.

    Attributes:
        size: the world size (ranks).
        source: one of :data:`WORLD_SOURCES`.
        detail: what the source named, for people: the flag as typed when not ``--world-size`` itself
            (``--vary world_size``), the what-if file's name; may be empty.
    """

    size: int
    source: str
    detail: str = ""

    def describe(self) -> str:
        """E.g. ``"1024, from the what-if file dgx_h100_400g.toml"``."""
        if self.source == "--world-size":
            return f"{self.size}, from {self.detail or '--world-size'}"
        where = {"--set world_size": "from --set world_size", "what-if file": "from the what-if file",
                 "recorded": "the recorded world size"}[self.source]
        return f"{self.size}, {where}" + (f" {self.detail}" if self.detail else "")

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.size, "source": self.source, "detail": self.detail}


def what_if_world(*, requested: int | None = None, set_world: int | None = None, file_world: int | None = None,
                  recorded_world: int | None = None, requested_by: str = "--world-size",
                  file_name: str = "") -> WhatIfWorld:
    """The world size to play at, and its source: the first of the module docstring's rule that is given.

    Args:
        requested: ``--world-size`` (or a sweep's ``world_size`` axis; ``requested_by`` names it).
        set_world: the value of a ``--set world_size=N`` override.
        file_world: the ``world_size`` of the scenario file the user named (None for a default file).
        recorded_world: the recording's world size (None: there is none, as in ``nbox emulate``).
        file_name: the file, for :attr:`WhatIfWorld.detail`.

    Raises:
        ScenarioError: nothing given.
    """
    if requested is not None:
        return WhatIfWorld(requested, "--world-size", "" if requested_by == "--world-size" else requested_by)
    if set_world is not None:
        return WhatIfWorld(set_world, "--set world_size")
    if file_world is not None:
        return WhatIfWorld(file_world, "what-if file", file_name)
    if recorded_world is None:
        raise ScenarioError("world_size", "no world size: give --world-size, --set world_size or a scenario file")
    return WhatIfWorld(recorded_world, "recorded")


def _topology_world(doc: dict[str, Any]) -> Any:
    """The product of the document's dimension sizes when they are all positive integers, else its
    ``world_size`` as written (then building the scenario names what is wrong)."""
    try:
        sizes = [d["size"] for d in doc["topology"]["dims"]]
    except (KeyError, TypeError):
        return doc.get("world_size")
    if sizes and all(type(x) is int and x > 0 for x in sizes):
        return math.prod(sizes)
    return doc.get("world_size")


def load_what_if(path: Path | None, overrides: Sequence[str] = (), *, recorded_world: int | None,
                 requested: int | None = None, requested_by: str = "--world-size",
                 default: Path | None = None) -> tuple[Scenario, WhatIfWorld]:
    """The scenario of ``path`` with ``overrides`` at the world size of the module docstring's rule.

    ``path`` is the file the user named (its ``world_size`` counts); when it is None, ``default`` (or the
    shipped default scenario) is loaded, and its own world size counts only when there is no recording
    (``recorded_world`` None). The topology is resized first (:func:`resize`); the values that depend on
    the world size (stragglers' ranks) are checked after, against the settled size.

    Raises:
        InputNotFoundError: the file does not exist.
        ScenarioError: the file is not a valid scenario, an override or value is invalid, or the world
            size does not fit the topology or a straggler (the message says where the world size came from).
    """
    file = path if path is not None else default
    doc, where = read_scenario_doc(file)
    try:
        doc = apply_overrides(doc, overrides)
        named = path is not None or recorded_world is None
        set_by_override = sets_world_size(overrides)
        written = doc.get("world_size")
        if (named or set_by_override) and not (type(written) is int and written >= 1):
            Scenario.from_dict(doc)  # a bad world_size: the scenario's own check names it (and the value)
        world = what_if_world(requested=requested, set_world=written if set_by_override else None,
                              file_world=written if named else None, recorded_world=recorded_world,
                              requested_by=requested_by, file_name=where.name if named else "")
        shape = Scenario.from_dict({**doc, "stragglers": [], "world_size": _topology_world(doc)})
        try:
            resized = resize(shape, world.size)
        except ScenarioError as e:
            raise ScenarioError("world_size", f"{e.reason} (the world size is {world.describe()})",
                                value=world.size, has_value=True) from None
        try:
            scenario = Scenario.from_dict({**doc, "world_size": world.size, "topology": resized.topology.to_dict()})
        except ScenarioError as e:
            raise ScenarioError(e.key, f"{e.reason} (the world size is {world.describe()})", value=e.value,
                                has_value=e.has_value) from None
    except ScenarioError as e:
        raise e.in_file(str(where)) from None
    return scenario, world
