"""Scenario files: the shipped examples, and loading one (or a given file) with ``--set`` overrides."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emulator_core.scenario import Scenario, ScenarioError
from emulator_core.scenario_overrides import apply_overrides
from emulator_core.scenario_toml import toml_decode_error, toml_loads
from nbox_trace.errors import InputNotFoundError

__all__ = ["DEFAULT_SCENARIO", "SCENARIOS_DIR", "load_scenario", "read_scenario_doc", "shipped_scenarios"]

#: The scenario used by :func:`load_scenario` when no file is given: this machine's loopback.
DEFAULT_SCENARIO = "loopback_cpu"
#: Folder of the shipped example scenarios.
SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"


def shipped_scenarios() -> dict[str, Path]:
    """The example scenarios shipped in ``emulator_core/scenarios/``: name (file stem) -> path."""
    return {p.stem: p for p in sorted(SCENARIOS_DIR.glob("*.toml"))}


def read_scenario_doc(path: Path | None) -> tuple[dict[str, Any], Path]:
    """The parsed TOML document of a scenario file (``None``: the shipped :data:`DEFAULT_SCENARIO`), and its path.

    Raises:
        InputNotFoundError: ``path`` does not exist.
        ScenarioError: the file cannot be read or is not TOML (the message names the file).
    """
    p = path if path is not None else SCENARIOS_DIR / f"{DEFAULT_SCENARIO}.toml"
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


def load_scenario(path: Path | None, overrides: Sequence[str] = ()) -> Scenario:
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
