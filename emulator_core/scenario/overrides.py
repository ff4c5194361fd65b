"""The ``--set a.b.c=VALUE`` override language: change a parsed scenario document before it is built.

Keys are dotted paths of the TOML layout (:mod:`emulator_core.scenario`), list elements addressed by index
(``topology.dims.1.size=16``); values are TOML scalars, or bare strings (``algorithms.all_reduce=ring``).
A key that is a byte count (:data:`SIZE_KEYS`) also takes a size with a unit, as nbox prints them
(``calibration.0.busy_nbytes=1MiB``); a size with a unit given to any other key is refused in one line.
Unknown keys are refused, naming the allowed ones; the values are validated when the scenario is built.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from emulator_core.scenario.model import (
    CALIBRATION_KEYS,
    COLLECTIVES,
    DIM_KEYS,
    NETWORK_KEYS,
    STRAGGLER_KEYS,
    ScenarioError,
)
from emulator_core.scenario.tomltext import toml_decode_error, toml_loads
from emulator_core.scenario.values import REMOVED_KEYS
from nbox_trace.mesh import ALIASES, DIM_NAMES
from nbox_trace.units import has_size_unit, parse_bytes

__all__ = ["SIZE_KEYS", "apply_overrides", "parse_override"]

#: The keys whose value is a byte count: a size with a unit (``64MiB``) is read as its bytes.
SIZE_KEYS = frozenset({"busy_nbytes", "p2p_chunk_bytes"})

_OVERRIDE_KEY_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=VALUE`` into its key path and value.

    The value is read as a TOML scalar (``2`` is an int, ``2.0`` a float, ``true`` a bool, ``"x"`` a
    string); anything that is not a TOML value is taken as a bare string (so ``algorithms.all_reduce=ring``
    works). Arrays and tables are refused. List elements are addressed by index: ``topology.dims.1.size``.
    """
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or not _OVERRIDE_KEY_RE.match(key):
        raise ScenarioError(f"--set {text}", "expected KEY=VALUE with a dotted key, e.g. topology.dims.1.size=16")
    if not raw or "\n" in raw or "\r" in raw:
        raise ScenarioError(f"--set {text}", "the value must be a single non-empty line")
    try:
        doc = toml_loads()(f"v = {raw}")
    except toml_decode_error():
        value: Any = raw
    else:
        if set(doc) != {"v"}:  # pragma: no cover - a single line cannot define two keys
            raise ScenarioError(f"--set {text}", "the value must be one TOML scalar")
        value = doc["v"]
        if not isinstance(value, (str, int, float, bool)):
            raise ScenarioError(f"--set {text}", "the value must be a scalar (number, string or boolean)")
    return key.split("."), value


_SCHEMA: dict[str, Any] = {
    "world_size": None, "compute_scale": None, "overlap": None,
    "algorithms": {c: None for c in COLLECTIVES},
    "topology": {"dims": [{k: None for k in DIM_KEYS}]},
    "network": {k: None for k in NETWORK_KEYS},
    "stragglers": [{k: None for k in STRAGGLER_KEYS}],
    "calibration": [{k: None for k in CALIBRATION_KEYS}],
    "mesh": {k: None for k in (*DIM_NAMES, *ALIASES)},  # --set mesh.dp=512
    "mesh_placement": None,  # --set mesh_placement=pp,dp,tp (a bare string, read by parse_placement)
}


def apply_overrides(doc: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a parsed scenario document (a new dict; ``doc`` is not changed).

    A list index may be the list's length, which appends a new table (e.g. a first straggler:
    ``stragglers.0.rank=5 stragglers.0.slowdown=2``). Unknown keys are refused, listing the allowed ones.
    """
    out = copy.deepcopy(doc)
    for text in overrides:
        parts, value = parse_override(text)
        node: Any = out
        schema: Any = _SCHEMA
        where = f"--set {text}"
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            so_far = ".".join(parts[: depth + 1])
            if isinstance(schema, dict):
                if part not in schema and part in REMOVED_KEYS:
                    raise ScenarioError(so_far, f"removed key in {where}: {REMOVED_KEYS[part]}")
                if part not in schema:
                    raise ScenarioError(so_far, f"unknown key in {where} (allowed: {', '.join(schema)})")
                sub = schema[part]
                if last:
                    if sub is not None:
                        raise ScenarioError(so_far, f"{where}: is a table or array; set one of its keys")
                    node[part] = _size_or_value(part, value, so_far, where)
                    break
                if not isinstance(node.get(part), (dict, list)):
                    node[part] = [] if isinstance(sub, list) else {}
                node, schema = node[part], sub
            else:  # a list: the part is an index
                if not part.isdigit():
                    raise ScenarioError(so_far, f"{where}: expected a list index (0, 1, ...)")
                idx = int(part)
                if idx > len(node):
                    raise ScenarioError(so_far, f"{where}: index out of range (the list has {len(node)} entries)")
                if last:
                    raise ScenarioError(so_far, f"{where}: is a table; set one of its keys")
                if idx == len(node):
                    node.append({})
                if not isinstance(node[idx], dict):
                    raise ScenarioError(so_far, f"{where}: not a table")
                node, schema = node[idx], schema[0]
    return out


def _size_or_value(key: str, value: Any, path: str, where: str) -> Any:
    """``value`` as the key takes it: a size with a unit read as bytes for a size key (:data:`SIZE_KEYS`), refused
    for any other key (which a bare string would otherwise reach as a puzzling type error)."""
    if not isinstance(value, str) or not has_size_unit(value):
        return value
    if key not in SIZE_KEYS:
        raise ScenarioError(path, f"{where}: {value!r} is a size, and {path} is not a byte count (sizes with units "
                            f"are taken by: {', '.join(sorted(SIZE_KEYS))})")
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise ScenarioError(path, f"{where}: {e}") from None
