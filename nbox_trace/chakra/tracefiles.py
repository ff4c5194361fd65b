"""Find the per-rank files of a Chakra trace from what a user typed.

A trace is one ``<prefix>.<rank>.et`` file per rank (ASTRA-sim opens ``prefix + "." + rank + ".et"``).
A user may name one file, a directory, or the ``<prefix>`` itself; :func:`resolve_trace_set` turns
any of them into a :class:`TraceSet`, or raises an error that says what was found instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from nbox_trace.errors import InputNotFoundError, InvalidInputError

_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")
_MAX_RANK = 1 << 24


@dataclass(frozen=True)
class TraceSet:
    """The files of one trace: ``files[rank]`` is that rank's ``.et`` file, ranks sorted."""

    prefix: str
    directory: Path
    files: dict[int, Path]

    @property
    def ranks(self) -> list[int]:
        return sorted(self.files)


def split_rank_name(name: str) -> tuple[str, int | None]:
    """``"trace.3.et"`` -> ``("trace", 3)``; a name without a rank number -> ``(stem, None)``."""
    match = _RANK_FILE.match(name)
    if match:
        return match["prefix"], int(match["rank"])
    return (name[:-3] if name.endswith(".et") else name), None


def _group(directory: Path, names: list[str]) -> dict[str, dict[int, Path]]:
    groups: dict[str, dict[int, Path]] = {}
    for name in sorted(names):
        prefix, rank = split_rank_name(name)
        rank = 0 if rank is None else rank
        if rank > _MAX_RANK:
            raise InvalidInputError(f"{directory / name}: rank {rank} in the file name is implausibly large")
        ranks = groups.setdefault(prefix, {})
        if rank in ranks:
            raise InvalidInputError(
                f"{directory}: two files claim rank {rank} of trace {prefix!r}: {ranks[rank].name} and {name}"
            )
        ranks[rank] = directory / name
    return groups


def resolve_trace_set(path: str | os.PathLike[str]) -> TraceSet:
    """Resolve one ``.et`` file, a directory holding one trace, or a ``<prefix>`` of per-rank files.

    Raises:
        InputNotFoundError: nothing exists there, or the directory holds no ``.et`` file.
        InvalidInputError: the directory holds several traces (the message lists their prefixes),
            or two files claim the same rank.
    """
    p = Path(path)
    if p.is_file():
        prefix, rank = split_rank_name(p.name)
        return TraceSet(prefix, p.parent, {0 if rank is None else rank: p})
    if p.is_dir():
        names = [e.name for e in p.iterdir() if e.name.endswith(".et") and e.is_file()]
        if not names:
            raise InputNotFoundError(f"{p}: directory holds no .et files")
        groups = _group(p, names)
        if len(groups) > 1:
            listing = "; ".join(f"{pre} (ranks {_span(sorted(r))})" for pre, r in sorted(groups.items()))
            raise InvalidInputError(
                f"{p}: directory holds {len(groups)} traces: {listing}. Name one as {p}/<prefix>"
            )
        (prefix, files), = groups.items()
        return TraceSet(prefix, p, dict(sorted(files.items())))
    parent = p.parent if str(p.parent) else Path(".")
    if parent.is_dir():
        stem = p.name + "."
        names = [
            e.name for e in parent.iterdir()
            if e.name.startswith(stem) and _RANK_FILE.match(e.name) and split_rank_name(e.name)[0] == p.name
        ]
        if names:
            (prefix, files), = _group(parent, names).items()
            return TraceSet(prefix, parent, dict(sorted(files.items())))
    raise InputNotFoundError(f"{p}: no such file or directory, and no file matches {p}.<rank>.et")


def _span(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
