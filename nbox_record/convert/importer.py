"""``nbox record convert``: turn host-ET + Kineto pairs that users already collect (Chakra's recipe)
into an nbox bundle.

Each pair is one rank. The rank comes from the last number in the host-ET file name
(``megatron_et_3.json.gz`` -> 3, ``host.1.json`` -> 1), else from the pair's position. No clean
iteration time exists for such traces, so the manifest's ``observed`` part says so instead of
inventing one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox_trace import __version__
from nbox_trace.errors import InputNotFoundError, InvalidInputError


@dataclass(frozen=True)
class RankInput:
    """One rank's raw capture: host ET, and optionally Kineto and nbox's collectives.json."""

    host_et: Path
    kineto: Path | None = None
    collectives: Path | None = None
    world_size: int | None = None
    lean_kineto: Path | None = None  # the lean pass's Kineto trace (nbox_record.sources.leantiming)


@dataclass
class ConvertedRanks:
    """Bundle files (``trace/trace.<rank>.et`` + ``comm_group.json``) and what the conversion found."""

    files: dict[str, Path | bytes]
    process_groups: dict[str, list[int]]
    nodes_per_rank: dict[int, int]
    source_schema: str | None
    hardware: dict[str, Any] = field(default_factory=dict)  # device facts read off the traces (convertdevice)


def convert_ranks(ranks: dict[int, RankInput], staging: Path) -> ConvertedRanks:
    """Convert every rank into ``staging`` with :func:`nbox_record.convert.assemble.convert_rank`; the bundle's
    files, keyed by their path inside the bundle. Shared by ``nbox record`` and ``nbox record convert``."""
    from nbox_record.convert.assemble import convert_rank
    from nbox_record.convert.device import DeviceFacts, hardware_facts
    from nbox_trace.bundle import COMM_GROUP_NAME
    from nbox_trace.chakra import write_et

    files: dict[str, Path | bytes] = {}
    groups: dict[str, list[int]] = {}
    nodes: dict[int, int] = {}
    schema = None
    devices: list[DeviceFacts] = []
    for rank, item in sorted(ranks.items()):
        conv = convert_rank(item.host_et, item.kineto, rank=rank, collectives=item.collectives,
                            world_size=item.world_size, lean_kineto=item.lean_kineto)
        files[f"trace/trace.{rank}.et"] = write_et(staging / f"trace.{rank}.et", conv.metadata, conv.nodes)
        nodes[rank] = len(conv.nodes)
        devices.append(conv.device)
        for name, members in conv.process_groups.items():
            groups.setdefault(name, list(members))
        schema = schema or next((a.string_val for a in conv.metadata.attr if a.name == "schema"), None)
    files[COMM_GROUP_NAME] = (json.dumps(groups, indent=1, sort_keys=True) + "\n").encode()
    return ConvertedRanks(files, groups, nodes, schema, hardware_facts(devices))


@dataclass(frozen=True)
class ConvertConfig:
    """Arguments of ``nbox record convert``: (host ET, Kineto or None) per rank, and the bundle to write."""

    pairs: tuple[tuple[Path, Path | None], ...]
    out: Path
    overwrite: bool = False


_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def rank_of(path: Path, position: int) -> int:
    """The last number in a file name, else ``position``."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    match = _LAST_NUMBER.search(name)
    return int(match.group(1)) if match else position


def import_traces(cfg: ConvertConfig) -> tuple[Path, dict[int, int]]:
    """Convert every pair and write the bundle; return (bundle path, nodes per rank).

    Raises:
        InputNotFoundError: a file is missing.
        InvalidInputError: two pairs claim one rank, or a file does not convert.
    """
    import tempfile

    from nbox_trace.bundle import Manifest, write_bundle

    if not cfg.pairs:
        raise InvalidInputError("nothing to convert: give HOST_ET.json [KINETO.json] per rank")
    ranks: dict[int, tuple[Path, Path | None]] = {}
    for i, (host, kineto) in enumerate(cfg.pairs):
        for p in (host, kineto):
            if p is not None and not p.is_file():
                raise InputNotFoundError(f"{p}: " + ("a folder, not a trace file" if p.is_dir() else "file not found"))
        r = rank_of(host, i)
        if r in ranks:
            raise InvalidInputError(f"{host} and {ranks[r][0]} both claim rank {r} (from their file names)")
        ranks[r] = (host, kineto)
    parent = cfg.out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{cfg.out.name}.convert-", dir=parent) as tmp:
        conv = convert_ranks({r: RankInput(host, kineto) for r, (host, kineto) in ranks.items()}, Path(tmp))
        groups, nodes, schema = conv.process_groups, conv.nodes_per_rank, conv.source_schema
        world = max((max(m) + 1 for m in groups.values() if m), default=max(ranks) + 1)
        manifest = Manifest(
            producer={"nbox": __version__, "torch": None, "backend": None, "source_schema": schema,
                      "converted_from": [str(h) for h, _ in cfg.pairs]},
            hardware=conv.hardware,  # device "cuda" or "cpu", GPU model and count: read off the traces
            job={"world_size": world, "ranks_recorded": sorted(ranks), "process_groups": groups},
            observed={"iteration_time_us": None,
                      "rule": "not measured: converted from existing traces, which carry no clean iterations"},
            capture={"source": "nbox record convert", "kineto": all(k is not None for _, k in ranks.values())},
            complete=True,
            kind="imported",
        )
        out = write_bundle(cfg.out, manifest, conv.files, overwrite=cfg.overwrite)
    return out, nodes
