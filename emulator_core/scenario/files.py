"""Scenario files: the shipped examples, and loading one (or a given file) with ``--set`` overrides.

Wherever a scenario is taken, a user may name a shipped one instead of giving its path: by its short ``name``
key (``dgx-h100``) or by its file stem (``dgx_h100_400g``). :func:`resolve_scenario` is the one place that turns
such a name into the file; :func:`read_scenario_doc` (and so every loader) calls it first, so every command
accepts the names alike. A path that exists always wins over a name.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator_core.scenario.model import Scenario, ScenarioError
from emulator_core.scenario.overrides import apply_overrides
from emulator_core.scenario.tomltext import toml_decode_error, toml_loads
from nbox_trace.errors import InputNotFoundError

__all__ = ["DEFAULT_SCENARIO", "SCENARIOS_DIR", "ShippedScenario", "load_scenario", "read_scenario_doc",
           "resolve_scenario", "shipped_catalog", "shipped_scenarios"]

#: The scenario used by :func:`load_scenario` when no file is given: this machine's loopback.
DEFAULT_SCENARIO = "loopback_cpu"
#: Folder of the shipped example scenarios.
SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"


def shipped_scenarios() -> dict[str, Path]:
    """The example scenarios shipped in ``emulator_core/scenarios/``: name (file stem) -> path."""
    return {p.stem: p for p in sorted(SCENARIOS_DIR.glob("*.toml"))}


@dataclass(frozen=True)
class ShippedScenario:
    """One shipped scenario as ``nbox scenario list`` shows it: its short name, what it is, its world size, file."""

    name: str
    description: str
    world_size: int
    path: Path

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "world_size": self.world_size,
                "file": str(self.path)}


@functools.lru_cache(maxsize=1)
def shipped_catalog() -> tuple[ShippedScenario, ...]:
    """The shipped scenarios, by file name; each file's ``name`` (its stem with dashes when it has none).

    Raises:
        ScenarioError: a shipped file is not a valid scenario (the message names it).
    """
    out = []
    for path in shipped_scenarios().values():
        scenario = load_scenario(path)
        out.append(ShippedScenario(scenario.name or path.stem.replace("_", "-"), scenario.description,
                                   scenario.world_size, path))
    return tuple(out)


def resolve_scenario(ref: str | Path) -> Path:
    """The scenario file ``ref`` means: ``ref`` itself when it exists or looks like a path (a folder part or a
    ``.toml`` suffix), else the shipped scenario of that short name or file stem (case and ``_``/``-`` alike).

    Raises:
        InputNotFoundError: a bare word that names no shipped scenario (the message lists the known names).
    """
    path = Path(ref)
    text = str(ref)
    if path.exists() or "/" in text or "\\" in text or text.endswith(".toml"):
        return path
    key = text.strip().lower().replace("_", "-")
    catalog = shipped_catalog()
    for entry in catalog:
        if key in (entry.name, entry.path.stem.replace("_", "-")):
            return entry.path
    raise InputNotFoundError(f"{text}: no such scenario file, nor a shipped scenario (known: "
                             f"{', '.join(e.name for e in catalog)}; see nbox scenario list)")


def read_scenario_doc(path: str | Path | None) -> tuple[dict[str, Any], Path]:
    """The parsed TOML document of a scenario file (``None``: the shipped :data:`DEFAULT_SCENARIO`; a shipped
    scenario's name: its file, :func:`resolve_scenario`), and its path.

    Raises:
        InputNotFoundError: ``path`` does not exist (nor names a shipped scenario).
        ScenarioError: the file cannot be read or is not TOML (the message names the file).
    """
    p = resolve_scenario(path) if path is not None else SCENARIOS_DIR / f"{DEFAULT_SCENARIO}.toml"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputNotFoundError(f"{p}: scenario file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError("", f"cannot read: {e}", file=str(p)) from None
    try:
        return toml_loads()(text), p
    except toml_decode_error() as e:
        raise ScenarioError("", f"not valid TOML: {e}", file=str(p)) from None


def load_scenario(path: str | Path | None, overrides: Sequence[str] = ()) -> Scenario:
    """Load a scenario from a TOML file (``None``: the shipped :data:`DEFAULT_SCENARIO`), apply overrides.

    Raises:
        InputNotFoundError: ``path`` does not exist.
        ScenarioError: the file is not TOML, or a key or value is invalid (the message names the file and key).
    """
    doc, p = read_scenario_doc(path)
    try:
        return Scenario.from_dict(apply_overrides(doc, overrides))
    except ScenarioError as e:
        raise e.in_file(str(p)) from None
