"""The process groups of one rank's conversion: read, learnt from the collectives, and resolved.

Sources: the host ET's ``## process_group:init ##`` nodes (``ranks: []`` with ``group_size`` N is ranks
0..N-1), ``collectives.json`` and ``record_param_comms`` (rank start/stride/size). A collective whose group
the trace does not name is put on ``"0"`` (the world) when its size is the world size or unknown
(``stats["pg_assumed_world"]``); a group of size 1 is this rank alone, named ``SINGLETON_PG_BASE + rank``
so that each rank's differs; any other unnamed size gets a new name per size (``stats["pg_unresolved"]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbox_record.sources import CommFacts, EtNode
from nbox_trace.contract import PG_INIT_NODE, parse_pg_init
from nbox_trace.errors import InvalidInputError

#: Name of a size-1 process group whose name the trace does not give: this number + the rank.
SINGLETON_PG_BASE = 1_000_000


class ProcessGroups:
    """Process group name -> global ranks, their descriptions, and the world size when known."""

    def __init__(self, rank: int, stats: dict[str, int]) -> None:
        self.rank = rank
        self.stats = stats  # counts pg_assumed_world and pg_unresolved
        self.groups: dict[str, list[int]] = {}
        self.group_desc: dict[str, str] = {}  # also "size N" -> the name given to unnamed groups of size N
        self.pg_entries: list[dict[str, Any]] = []  # the ET's own entries, merged by name
        self.world: int | None = None

    def add(self, name: str, ranks: list[int], desc: str | None = None) -> None:
        """Learn a group; what is already known of it stays."""
        if ranks and name not in self.groups:
            self.groups[name] = list(ranks)
        if desc and name not in self.group_desc:
            self.group_desc[name] = desc

    def read_pg_init(self, et_path: Path, pg_nodes: list[EtNode]) -> None:
        """The ET's ``## process_group:init ##`` nodes; a later entry of one name replaces an earlier one."""
        merged: dict[str, dict[str, Any]] = {}
        for n in pg_nodes:
            values = n.inputs.values
            if not values or not isinstance(values[0], str):
                raise InvalidInputError(f"{et_path}: node id {n.id} ({PG_INIT_NODE}): inputs.values[0] is not "
                                        "the process-group JSON text")
            try:
                entries = parse_pg_init(values[0])
            except ValueError as exc:
                raise InvalidInputError(f"{et_path}: node id {n.id} ({PG_INIT_NODE}): {exc}") from None
            for e in entries:
                name = str(e.get("pg_name", ""))
                ranks, size = e.get("ranks", []), e.get("group_size")
                if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
                    raise InvalidInputError(f"{et_path}: node id {n.id}: process group {name!r}: 'ranks' is "
                                            "not a list of ranks")
                if not ranks and isinstance(size, int) and 0 < size <= 1 << 20:
                    ranks = list(range(size))
                merged[name] = e
                self.groups[name] = ranks
                desc = e.get("pg_desc")
                if isinstance(desc, str):
                    self.group_desc[name] = desc
        self.pg_entries = list(merged.values())

    def pg_init_world(self) -> int | None:
        """The world size the default group (``"0"`` or ``default_pg``) names, if any."""
        for name, ranks in self.groups.items():
            if name == "0" or self.group_desc.get(name) == "default_pg":
                return len(ranks) or None
        return None

    def resolve(self, f: CommFacts) -> None:
        """Give ``f`` a pg_name and its members; map group ranks (root, peer) to global ranks."""
        if f.pg_name is not None:
            if f.pg_ranks:
                self.add(f.pg_name, f.pg_ranks, f.pg_desc)
            elif f.pg_desc:
                self.add(f.pg_name, [], f.pg_desc)
        elif f.pg_size == 1 and not f.pg_ranks:
            # a group of one (e.g. Megatron's data-parallel group at DP=1): its only member is this
            # rank, and each rank's is a different group, so the name differs per rank
            f.pg_name = str(SINGLETON_PG_BASE + self.rank)
            self.add(f.pg_name, [self.rank], f.pg_desc)
        elif f.pg_ranks:
            same = next((k for k, v in self.groups.items() if v == f.pg_ranks), None)
            if same is None and self.world is not None and f.pg_ranks == list(range(self.world)):
                same = "0"
            f.pg_name = same if same is not None else self._new_name()
            self.add(f.pg_name, f.pg_ranks, f.pg_desc)
        elif f.pg_size is None or self.world is None or f.pg_size == self.world:
            f.pg_name = "0"
            self.stats["pg_assumed_world"] += 1
            if f.pg_size is not None:
                self.add("0", list(range(f.pg_size)))
        else:
            key = f"size {f.pg_size}"
            f.pg_name = self.group_desc.get(key) or self._new_name()
            self.group_desc[key] = f.pg_name
            self.stats["pg_unresolved"] += 1
        members = self.groups.get(f.pg_name)
        for attr, flag in (("peer", "peer_is_global"), ("root", "root_is_global")):
            value = getattr(f, attr)
            if value is not None and not getattr(f, flag) and members and 0 <= value < len(members):
                setattr(f, attr, members[value])

    def _new_name(self) -> str:
        used = {int(k) for k in (*self.groups, *self.group_desc.values()) if k.isdecimal()}
        return str(max(used, default=0) + 1)
