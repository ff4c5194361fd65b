"""Scenario TOML text, both ways: parse it (``tomllib``, or ``tomli`` on Python 3.10) and write it by hand.

The writer emits the layout of :mod:`emulator_core.scenario`'s docstring; reading its output gives an equal
:class:`~emulator_core.scenario.model.Scenario` (floats are written with ``repr``, which round-trips exactly).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from emulator_core.scenario.model import Scenario, ScenarioError, quote_toml_string

__all__ = ["dump_toml", "loads_scenario", "toml_decode_error", "toml_loads"]


def _toml_module() -> Any:
    """``tomllib`` (Python >= 3.11) or the ``tomli`` package (Python 3.10), which has the same API."""
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - Python 3.10 without tomli
        raise ScenarioError("", "reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli), "
                                "or use Python >= 3.11") from None


def toml_loads() -> Callable[[str], dict[str, Any]]:
    """The TOML parser's ``loads`` (text -> document)."""
    loads: Callable[[str], dict[str, Any]] = _toml_module().loads
    return loads


def toml_decode_error() -> type[Exception]:
    """The exception the TOML parser raises on text that is not TOML."""
    err: type[Exception] = _toml_module().TOMLDecodeError
    return err


def loads_scenario(text: str) -> Scenario:
    """Parse a scenario from TOML text (errors name the key but no file)."""
    try:
        doc = toml_loads()(text)
    except toml_decode_error() as e:
        raise ScenarioError("", f"not valid TOML: {e}") from None
    return Scenario.from_dict(doc)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # finite (validated); repr round-trips exactly and is valid TOML (1e-05, 3600.0)
    if isinstance(v, str):
        return quote_toml_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"not a TOML scalar: {v!r}")  # pragma: no cover - scalars and lists only


def dump_toml(scenario: Scenario) -> str:
    """The scenario as TOML text, in the layout of the module docstring; ``loads_scenario`` reads it back equal."""
    d = scenario.to_dict()
    lines = [f"{k} = {_toml_value(d[k])}" for k in ("name", "description", "world_size", "compute_scale", "overlap",
                                                     "mesh_placement")
             if k in d]
    if d["algorithms"]:
        lines += ["", "[algorithms]"] + [f"{k} = {_toml_value(v)}" for k, v in d["algorithms"].items()]
    for dim in d["topology"]["dims"]:
        lines += ["", "[[topology.dims]]"] + [f"{k} = {_toml_value(v)}" for k, v in dim.items()]
    if "mesh" in d:
        lines += ["", "[mesh]"] + [f"{k} = {_toml_value(v)}" for k, v in d["mesh"].items()]
    if "network" in d:
        lines += ["", "[network]"] + [f"{k} = {_toml_value(v)}" for k, v in d["network"].items()]
    for s in d["stragglers"]:
        lines += ["", "[[stragglers]]"] + [f"{k} = {_toml_value(v)}" for k, v in s.items()]
    for c in d["calibration"]:
        lines += ["", "[[calibration]]"] + [f"{k} = {_toml_value(v)}" for k, v in c.items()]
    for f in d.get("nccl_fit", []):
        lines += ["", "[[nccl_fit]]"] + [f"{k} = {_toml_value(v)}" for k, v in f.items()]
    return "\n".join(lines) + "\n"
