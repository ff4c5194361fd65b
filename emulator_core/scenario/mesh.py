"""Scaling the recorded mesh: ``--mesh dp=512,tp=2`` (and a sweep's ``mesh.dp`` axis).

A what-if mesh names a degree for some dimensions of the recorded mesh (:mod:`nbox_trace.mesh`); the others keep
their recorded degree. :func:`plan_mesh` turns it into a :class:`MeshPlan`:

* **ranks**: dimensions are laid on ranks in the placement order (outermost first; default
  :data:`nbox_trace.mesh.DIM_NAMES`' order, tensor parallel innermost), so the innermost mesh dimensions land on the
  innermost topology dimensions. A replayed rank keeps its recorded coordinates and plays the target rank they give
  (:attr:`MeshPlan.rank_map`): rank 2 of dp=2 x tp=2 (dp 1, tp 0) plays rank 2 of dp=512 x tp=2.
* **groups**: a group along some dimensions is the target mesh's slice along them at its members' other
  coordinates (a dp group grows from 2 to 512, a tp group keeps 2); a group that is not a slice keeps its members.
* **sizes** (:meth:`MeshPlan.size`), by the group's dimensions, the rule named in its text: a dp gradient all-reduce
  keeps its bytes; an all-gather's whole is fixed along the sharded dimensions it spans (each shard shrinks as
  recorded/target degree); a reduce-scatter keeps its unsharded input; an all-to-all keeps each rank's buffer (a
  resized all-to-all-v is priced as uniform); send/recv and groups not resized keep theirs.

Refused (:class:`MeshError`, naming the dimension): an unknown name, a dimension the recording lacks, a changed
``tp``, ``cp`` or ``pp`` degree (a trace cannot rescale its compute or its pipeline), guessed names (name them with
``--recorded-mesh``), a replayed rank with no place in a smaller mesh. **Global batch** (:class:`GlobalBatch`): weak
scaling by default (each rank keeps its batch); ``--global-batch fixed`` keeps the global batch, so each rank's is
``B x D_rec / D_target`` (``B`` the user-named per-rank batch, ``D`` the dp x fsdp degree; a whole number), and every
compute duration and every activation collective (groups along tp, cp, ep or pp only, and send/recv) scale by
``B_target / B``; dp and fsdp collectives keep their bytes. Why these rules: docs/design/mesh-scaling.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbox_trace.errors import UsageError
from nbox_trace.mesh import DIM_NAMES, MeshNameError, RecordedMesh, canonical_name

__all__ = ["BATCH_DIMS", "FIXED_DIMS", "GlobalBatch", "MeshError", "MeshPlan", "parse_mesh", "parse_placement",
           "plan_mesh"]

#: Dimensions whose degree cannot change (why, for the message).
FIXED_DIMS = {
    "tp": "a different tensor-parallel degree changes each rank's compute, which a recorded trace cannot scale",
    "cp": "a different context-parallel degree changes each rank's compute, which a recorded trace cannot scale",
    "pp": "a deeper or shallower pipeline needs stages built by the recorded stage's pattern and the schedule's "
          "bubble, which nbox does not model yet",
}
#: Dimensions that shard what an all-gather gathers (the gathered whole is fixed, shards shrink).
SHARDED = ("fsdp", "tp", "cp")
#: Most ranks a what-if mesh may have (a guard against a typo).
MAX_WORLD = 1 << 20
#: Dimensions that split the global batch (the data-parallel degree is the product of their degrees).
BATCH_DIMS = ("dp", "fsdp")


class MeshError(UsageError):
    """A what-if mesh that cannot be played on the recording (the message names the dimension; exit 2)."""


def parse_mesh(value: str | Mapping[str, Any], *, where: str = "--mesh") -> tuple[tuple[str, int], ...]:
    """``"dp=512,tp=2"`` (or a mapping, as a scenario's ``[mesh]`` table) -> ((name, degree), ...) with canonical
    names, in the order given.

    Raises:
        MeshError: not ``NAME=DEGREE,...``, an unknown or repeated name, a degree that is not a positive integer.
    """
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    else:
        items = []
        for part in (p.strip() for p in str(value).split(",")):
            name, sep, degree = part.partition("=")
            if not sep or not name.strip():
                raise MeshError(f"{where} {value!r}: expected NAME=DEGREE,... e.g. dp=512,tp=2")
            items.append((name, degree.strip()))
    if not items:
        raise MeshError(f"{where}: empty mesh; expected NAME=DEGREE,... e.g. dp=512,tp=2")
    out: list[tuple[str, int]] = []
    for name, degree in items:
        try:
            canon = canonical_name(name, where=where)
        except MeshNameError as e:
            raise MeshError(str(e)) from None
        ok = (isinstance(degree, int) and not isinstance(degree, bool)) or (isinstance(degree, str)
                                                                             and degree.isdecimal())
        if not ok or int(degree) < 1:
            raise MeshError(f"{where}: {canon}={degree}: the degree must be a positive integer")
        if any(n == canon for n, _ in out):
            raise MeshError(f"{where}: dimension {canon!r} is given twice")
        out.append((canon, int(degree)))
    return tuple(out)


def parse_placement(value: str | Sequence[str], *, where: str = "--placement") -> tuple[str, ...]:
    """``"pp,dp,tp"`` (mesh dimensions outermost first) -> canonical names.

    Raises:
        MeshError: empty, or an unknown or repeated name.
    """
    parts = [p.strip() for p in (value.split(",") if isinstance(value, str) else value)]
    if not parts or any(not p for p in parts):
        raise MeshError(f"{where} {value!r}: expected mesh dimensions outermost first, e.g. dp,tp")
    try:
        names = [canonical_name(p, where=where) for p in parts]
    except MeshNameError as e:
        raise MeshError(str(e)) from None
    dup = [n for i, n in enumerate(names) if n in names[:i]]
    if dup:
        raise MeshError(f"{where}: dimension {dup[0]!r} is listed twice")
    return tuple(names)


@dataclass(frozen=True)
class GlobalBatch:
    """Strong scaling (module docstring): the recorded per-rank batch and what each target rank gets.

    Attributes:
        per_rank: the recorded per-rank batch ``B`` (samples), as the user named it.
        dp_recorded, dp_target: the data-parallel degree (product of :data:`BATCH_DIMS` degrees) recorded / target.
    """

    per_rank: int
    dp_recorded: int
    dp_target: int

    @property
    def target_per_rank(self) -> int:
        return self.per_rank * self.dp_recorded // self.dp_target

    @property
    def ratio(self) -> float:
        """Target per-rank batch over the recorded one: what compute and activation collectives are scaled by."""
        return self.target_per_rank / self.per_rank

    def describe(self) -> str:
        return (f"global batch fixed at {self.per_rank * self.dp_recorded} = {self.per_rank} x {self.dp_recorded}: "
                f"per-rank batch {self.per_rank} -> {self.target_per_rank} over {self.dp_target} data-parallel "
                f"ranks; compute and activation collectives x {self.ratio:g}")

    def to_dict(self) -> dict[str, Any]:
        return {"per_rank_recorded": self.per_rank, "per_rank": self.target_per_rank, "dp_recorded": self.dp_recorded,
                "dp": self.dp_target, "global": self.per_rank * self.dp_recorded, "ratio": self.ratio}


@dataclass(frozen=True)
class MeshPlan:
    """A recorded mesh played at a target mesh (module docstring). Picklable (sweep workers).

    Attributes:
        recorded: the recorded mesh.
        order: dimension names, outermost first, as laid on the target ranks (the placement).
        degrees: target degree per name.
        text: how the user asked (``--mesh dp=512,tp=2``), for the report.
        groups: process group -> (its target members, its dimensions, recorded size); irregular groups have
            dimensions None.
        rank_map: replayed recorded rank -> the target rank it plays.
        batch: strong scaling (``--global-batch fixed``); None: weak scaling (each rank keeps its batch).
    """

    recorded: RecordedMesh
    order: tuple[str, ...]
    degrees: Mapping[str, int]
    text: str
    groups: Mapping[str, tuple[tuple[int, ...], tuple[str, ...] | None, int]] = field(default_factory=dict)
    rank_map: Mapping[int, int] = field(default_factory=dict)
    batch: GlobalBatch | None = None

    @property
    def compute_factor(self) -> float:
        """What each compute node's recorded duration is multiplied by (1.0: weak scaling)."""
        return 1.0 if self.batch is None else self.batch.ratio

    @property
    def world(self) -> int:
        return math.prod(self.degrees.values())

    def describe(self) -> str:
        """E.g. ``dp=512 x tp=2`` (placement order, outermost first)."""
        return " x ".join(f"{n}={self.degrees[n]}" for n in self.order)

    def strides(self) -> dict[str, int]:
        out, stride = {}, 1
        for name in reversed(self.order):
            out[name] = stride
            stride *= self.degrees[name]
        return out

    def target_rank(self, recorded_rank: int) -> int | None:
        """The target rank with ``recorded_rank``'s coordinates (None: a coordinate beyond a target degree)."""
        coords = self.recorded.coords(recorded_rank)
        strides = self.strides()
        if any(c >= self.degrees[n] for n, c in coords.items()):
            return None
        return sum(c * strides[n] for n, c in coords.items())

    def members(self, group: str) -> tuple[list[int], bool]:
        """``group``'s target members (group order) and whether its size changed; an unknown group is the world."""
        found = self.groups.get(group)
        if found is None:
            return list(range(self.world)), self.world != self.recorded.world
        members, _, size = found
        return list(members), len(members) != size

    def size(self, collective: str, group: str, nbytes: int) -> tuple[float, str]:
        """The collective's size at the target mesh (bytes, costmodels' convention) and the rule, naming the
        group's dimensions (module docstring); with a fixed global batch, activation collectives follow the
        per-rank batch."""
        size, rule = self._size(collective, group, nbytes)
        if self.batch is None or self.batch.ratio == 1.0:
            return size, rule
        found = self.groups.get(group)
        dims = found[1] if found is not None else tuple(d.name for d in self.recorded.dims)
        if collective == "send_recv" or (dims and not set(dims) & set(BATCH_DIMS)):
            return size * self.batch.ratio, rule + (f"; activations x {self.batch.ratio:g} (per-rank batch "
                                                    f"{self.batch.per_rank} -> {self.batch.target_per_rank})")
        return size, rule

    def _size(self, collective: str, group: str, nbytes: int) -> tuple[float, str]:
        if collective == "send_recv":
            return float(nbytes), "send/recv keeps its size (pipeline activations)"
        found = self.groups.get(group)
        dims: tuple[str, ...] | None
        if found is None:
            dims, rec, tgt = tuple(d.name for d in self.recorded.dims), self.recorded.world, self.world
        else:
            members, dims, rec = found
            tgt = len(members)
        if dims is None:
            return float(nbytes), f"irregular group ({rec} ranks, not a mesh slice): unchanged"
        label = " x ".join(dims) if dims else "one-rank"
        if rec == tgt:
            return float(nbytes), f"{label} group not resized ({rec} ranks): unchanged"
        head = f"{label} group {rec} -> {tgt} ranks: "
        shard_rec = math.prod(self.recorded.degrees()[n] for n in dims if n in SHARDED)
        shard_tgt = math.prod(self.degrees[n] for n in dims if n in SHARDED)
        if collective == "all_gather" and shard_rec != shard_tgt:
            return nbytes * shard_rec / shard_tgt, head + ("all-gather of a whole sharded along "
                                                          f"{'/'.join(n for n in dims if n in SHARDED)}: each "
                                                          f"rank's shard shrinks as {shard_rec}/{shard_tgt}")
        if collective == "all_gather":
            return float(nbytes), head + "all-gather of per-rank data: each rank's part keeps its size"
        if collective == "all_reduce":
            what = "data-parallel gradient all-reduce" if "dp" in dims or "fsdp" in dims else "all-reduce"
            return float(nbytes), head + f"{what} keeps its bytes"
        if collective == "reduce_scatter":
            return float(nbytes), head + "reduce-scatter keeps its unsharded input (its shards shrink)"
        if collective in ("all_to_all", "all_to_all_v"):
            what = "expert-parallel all-to-all" if "ep" in dims else "all-to-all"
            tail = "; the recorded uneven splits name the recorded peers: priced as uniform" \
                if collective == "all_to_all_v" else ""
            return float(nbytes), head + (f"{what} keeps each rank's buffer, its per-peer splits follow the group "
                                          f"(1/{rec} -> 1/{tgt} of it){tail}")
        return float(nbytes), head + f"{collective} keeps its size"

    def to_dict(self) -> dict[str, Any]:
        return {"mesh": self.describe(), "asked": self.text, "placement": list(self.order),
                "world_size": self.world, "rank_map": {str(k): v for k, v in sorted(self.rank_map.items())},
                "global_batch": None if self.batch is None else self.batch.to_dict(),
                "groups": {g: {"dims": None if d is None else list(d), "recorded_size": n, "size": len(m)}
                           for g, (m, d, n) in sorted(self.groups.items())}}


def plan_mesh(recorded: RecordedMesh, degrees: Iterable[tuple[str, int]], *, groups: Mapping[str, Sequence[int]],
              replayed: Sequence[int], placement: Sequence[str] | None = None, text: str = "--mesh",
              placement_by: str = "--placement", batch_size: int | None = None) -> MeshPlan:
    """Play ``recorded`` at ``degrees`` (the dimensions named; the rest keep their recorded degree).

    Args:
        groups: the recorded process groups (name -> global ranks at the recorded world size).
        replayed: the recorded ranks being replayed (each must have a place in the target mesh).
        placement: dimension names outermost first (every dimension of the mesh); None: canonical order.
        text: the flag as typed, for messages and the report; placement_by: where the placement came from.
        batch_size: the recorded per-rank batch, for a fixed global batch (``--global-batch fixed``); None: weak
            scaling.

    Raises:
        MeshError: see the module docstring; the message names the dimension.
    """
    if not recorded.ok:
        raise MeshError(f"{text}: the recorded process groups form no mesh ({'; '.join(recorded.notes)})")
    have = recorded.degrees()
    target = dict(have)
    for name, degree in degrees:
        if name not in have:
            raise MeshError(f"{text}: the recording has no {name} dimension (recorded mesh: {recorded.describe()}); "
                            f"adding a parallel dimension changes each rank's work")
        if degree != have[name] and name in FIXED_DIMS:
            raise MeshError(f"{text}: {name}={degree}: {FIXED_DIMS[name]}; keep {name}={have[name]}")
        target[name] = degree
    if recorded.guessed:
        names = ",".join(d.name for d in recorded.dims)
        raise MeshError(f"{text}: the recorded mesh's names are guessed ({recorded.describe()}): say which is "
                        f"which with --recorded-mesh {names} (outermost first)")
    order = tuple(n for n in DIM_NAMES if n in have) if placement is None else tuple(placement)
    if sorted(order) != sorted(have):
        raise MeshError(f"{placement_by} {','.join(order)}: must list each dimension of the mesh once "
                        f"({', '.join(sorted(have))})")
    world = math.prod(target.values())
    if world > MAX_WORLD:
        raise MeshError(f"{text}: {world} ranks, over the limit of {MAX_WORLD}")
    plan = MeshPlan(recorded, order, target, text)
    rank_map: dict[int, int] = {}
    for r in sorted(replayed):
        t = plan.target_rank(r)
        if t is None:
            coords = recorded.coords(r)
            dim = next(n for n, c in coords.items() if c >= target[n])
            raise MeshError(f"{text}: {dim}={target[dim]}: replayed rank {r} has {dim} coordinate {coords[dim]}, "
                            f"outside the target mesh (replay fewer ranks with --ranks)")
        rank_map[r] = t
    planned = {name: g for name, members in groups.items() if (g := _target_group(plan, members)) is not None}
    batch = None if batch_size is None else _global_batch(recorded, target, batch_size, text)
    return MeshPlan(recorded, order, target, text, planned, rank_map, batch)


def _global_batch(recorded: RecordedMesh, target: Mapping[str, int], per_rank: int, text: str) -> GlobalBatch:
    """The fixed global batch of ``per_rank`` recorded samples per rank at ``target`` (module docstring).

    Raises:
        MeshError: no data-parallel dimension, a batch that is not a positive integer, or a global batch that does
            not split into whole per-rank batches over the target data-parallel degree.
    """
    dims = [n for n in BATCH_DIMS if n in target]
    if not dims:
        raise MeshError(f"--global-batch fixed: the recorded mesh ({recorded.describe()}) has no data-parallel "
                        f"dimension ({' or '.join(BATCH_DIMS)}) to split the global batch over")
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 1:
        raise MeshError(f"--batch-size {per_rank!r}: the recorded per-rank batch must be a positive integer")
    have = recorded.degrees()
    rec, tgt = math.prod(have[n] for n in dims), math.prod(target[n] for n in dims)
    whole = per_rank * rec
    if whole % tgt:
        raise MeshError(f"{text} --global-batch fixed: the global batch {whole} ({per_rank} per rank x {rec} "
                        f"data-parallel ranks) does not split into whole per-rank batches over {tgt} data-parallel "
                        f"ranks ({' x '.join(f'{n}={target[n]}' for n in dims)})")
    return GlobalBatch(per_rank, rec, tgt)


def _target_group(plan: MeshPlan, members: Sequence[int]) -> tuple[tuple[int, ...], tuple[str, ...] | None,
                                                                       int] | None:
    """A recorded group at the target mesh (see :attr:`MeshPlan.groups`); None: it has no place there.
    A group that keeps its size keeps its members' order (its group ranks), renumbered."""
    recorded = plan.recorded
    spans = recorded.spanned(members)
    mapped = [plan.target_rank(r) for r in members]
    if spans is None:
        kept = tuple(t for t in mapped if t is not None)
        return (kept, None, len(members)) if kept else None
    fixed = recorded.coords(members[0])
    if any(fixed[n] >= plan.degrees[n] for n in fixed if n not in spans):
        return None
    strides = plan.strides()
    base = sum(fixed[n] * strides[n] for n in fixed if n not in spans)
    axes = [[c * strides[n] for c in range(plan.degrees[n])] for n in plan.order if n in spans]
    slice_ = tuple(sorted(base + sum(p) for p in itertools.product(*axes)))
    if len(slice_) == len(members) and set(slice_) == set(mapped):
        return tuple(t for t in mapped if t is not None), spans, len(members)
    return slice_, spans, len(members)
