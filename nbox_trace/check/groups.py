"""Process-group membership: an ASTRA-sim ``comm_group.json``, the ``## process_group:init ##`` metadata nodes, or
the convention that ``""`` and ``"0"`` are all ranks.
"""

from __future__ import annotations

import os
from pathlib import Path

from nbox_trace.chakra import TraceSet
from nbox_trace.check.report import RankReport
from nbox_trace.contract import MAX_PG_JSON_BYTES, PG_INIT_NODE, json_loads
from nbox_trace.errors import InputNotFoundError, InvalidInputError


def load_comm_groups(path: str | os.PathLike[str]) -> dict[str, list[int]]:
    """Read an ASTRA-sim ``comm_group.json``: ``{"<pg_name>": [global ranks]}``.

    Raises:
        InvalidInputError: not JSON, too big, or not that shape (the message names the key).
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise InputNotFoundError(f"{p}: comm-group file not found (or not a regular file)")
        size = p.stat().st_size
        if size > MAX_PG_JSON_BYTES:
            raise InvalidInputError(f"{p}: {size} bytes, over the {MAX_PG_JSON_BYTES}-byte cap for a comm-group file")
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"{p}: cannot read the comm-group file: {exc.strerror or exc}") from None
    try:
        data = json_loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"{p}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"{p}: expected an object {{pg_name: [ranks]}}, got {type(data).__name__}")
    out: dict[str, list[int]] = {}
    for key, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise InvalidInputError(f"{p}: key {key!r}: expected a list of integer ranks, got {ranks!r:.80}")
        out[str(key)] = ranks
    return out


def find_comm_group_file(trace_set: TraceSet) -> Path | None:
    """ASTRA-sim keeps ``comm_group.json`` beside the traces or in a sibling ``inputs/`` folder."""
    d = trace_set.directory
    for candidate in (d / "comm_group.json", d.parent / "inputs" / "comm_group.json", d.parent / "comm_group.json"):
        if candidate.is_file():
            return candidate
    return None


def membership(trace_set: TraceSet, reports: list[RankReport],
                comm_group_path: str | os.PathLike[str] | None) -> tuple[dict[str, list[int] | None], str]:
    """Process group -> global ranks (None = all ranks), and where that came from."""
    groups: dict[str, list[int] | None] = {}
    source = "convention ('' and '0' are all ranks; other groups: the ranks that use them)"
    path = Path(comm_group_path) if comm_group_path is not None else find_comm_group_file(trace_set)
    if path is not None:
        groups.update(load_comm_groups(path))
        source = str(path)
    else:
        seen_init = False
        for r in reports:
            for name, ranks in r.pg_init.items():
                seen_init = True
                groups.setdefault(name, ranks or None)
        if seen_init:
            source = f"'{PG_INIT_NODE}' metadata nodes"
    for world in ("", "0"):
        groups.setdefault(world, None)
    return groups, source

