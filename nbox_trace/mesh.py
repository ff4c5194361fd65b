"""The recorded parallelism: which process groups form which dimension of a device mesh (dp, fsdp, tp, pp, ep, cp).

A job's process groups are the slices of a mesh: with tensor parallel 2 x data parallel 2 on 4 ranks (tp
innermost, as frameworks place it), the tp groups are {0,1} and {2,3} (stride 1) and the dp groups {0,2} and {1,3}
(stride 2). :func:`infer_mesh` reads the mesh off the groups alone:

1. **dimensions**: groups of one size whose members step by one stride (an arithmetic progression, starting
   at coordinate 0 of that stride) form a *family*; send/recv pairs form families too (their connected
   components: the pipeline stages). From stride 1 up, the family whose stride is the product of the
   dimensions found so far is the next dimension outward (the smallest such, when several share a stride:
   the larger are flattened dimensions). What the families leave of the world size is one more, outermost
   dimension (for a job that only used the world group: the whole mesh is that dimension).
2. **names**, first that applies: the names the user gave (outermost first); the groups' descriptions
   (``pg_desc``: torch DeviceMesh writes ``mesh_<name>``, Megatron ``TENSOR_MODEL_PARALLEL_GROUP`` etc.); a
   dimension along which ranks send and receive (and that runs no collective) is ``pp``; one that runs an
   all-to-all is ``ep``; the rest by their collectives: a mesh of one dimension is ``fsdp`` when it
   all-gathers or reduce-scatters and runs no all-reduce, else ``dp`` (the world-size rule's own reading); in
   a mesh of several, collectives cannot tell tensor from data parallelism, so the innermost unnamed
   dimension is guessed ``tp`` and the outermost ``dp`` (``fsdp`` as above), and the mesh says it guessed.
3. **groups**: every group is placed on the dimensions along which its members differ; a group that is not a
   whole slice of those dimensions is *irregular* (it keeps its size when the mesh is scaled).

Canonical names and their order (outermost first, as ``torch.distributed.device_mesh`` lists dimensions and
as frameworks place them on ranks, tensor parallel innermost): :data:`DIM_NAMES`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nbox_trace.errors import UsageError

__all__ = ["DIM_NAMES", "MeshDim", "MeshFacts", "MeshNameError", "RecordedMesh", "canonical_name", "infer_mesh",
           "mesh_facts", "parse_names"]

#: Mesh dimension names, outermost first: the default placement on ranks (tensor parallel innermost).
DIM_NAMES = ("pp", "dp", "fsdp", "ep", "cp", "tp")
#: Other spellings accepted for a name (DeviceMesh's HSDP names, "shard").
ALIASES = {"shard": "fsdp", "dp_shard": "fsdp", "replicate": "dp", "dp_replicate": "dp"}
#: Megatron-LM's group descriptions -> names.
_MEGATRON = (("TENSOR", "tp"), ("PIPELINE", "pp"), ("EXPERT", "ep"), ("CONTEXT", "cp"), ("DATA", "dp"))
#: The pseudo-group name of send/recv components (pipeline stages exchange activations without a group).
P2P = "(send/recv)"
_SHARDED = {"ALL_GATHER", "REDUCE_SCATTER"}


class MeshNameError(UsageError):
    """A mesh dimension name nbox does not know, or names that do not fit the recorded mesh (exit 2)."""


def canonical_name(name: str, *, where: str = "--mesh") -> str:
    """``name`` as one of :data:`DIM_NAMES` (aliases accepted, case-insensitive).

    Raises:
        MeshNameError: an unknown name (the message names it and lists the known ones).
    """
    key = name.strip().lower()
    found = ALIASES.get(key, key)
    if found not in DIM_NAMES:
        raise MeshNameError(f"{where}: unknown mesh dimension {name.strip()!r} (known: {', '.join(DIM_NAMES)}; "
                            f"also {', '.join(sorted(ALIASES))})")
    return found


def parse_names(text: str, *, where: str = "--recorded-mesh") -> tuple[str, ...]:
    """``"dp,tp"`` (names, outermost first; ``name=degree`` also accepted, the degree then checked by
    :func:`infer_mesh`) -> canonical names. Degrees are kept as ``name=degree`` strings.

    Raises:
        MeshNameError: empty, an unknown or repeated name, a degree that is not a positive integer.
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise MeshNameError(f"{where} {text!r}: expected names outermost first, e.g. dp,tp")
    out: list[str] = []
    for p in parts:
        name, sep, degree = p.partition("=")
        canon = canonical_name(name, where=where)
        if sep and not (degree.strip().isdecimal() and int(degree) >= 1):
            raise MeshNameError(f"{where}: {name.strip()}={degree.strip()!r}: the degree must be a positive integer")
        if any(o.partition("=")[0] == canon for o in out):
            raise MeshNameError(f"{where}: dimension {canon!r} is named twice")
        out.append(f"{canon}={int(degree)}" if sep else canon)
    return tuple(out)


@dataclass(frozen=True)
class MeshFacts:
    """What the inference reads: the recorded world size, each group's members, descriptions and collectives
    (Chakra comm type names such as ``ALL_REDUCE``), and the send/recv pairs (global ranks)."""

    world: int
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    descriptions: tuple[tuple[str, str], ...] = ()
    collectives: tuple[tuple[str, tuple[str, ...]], ...] = ()
    p2p: tuple[tuple[int, int], ...] = ()

    @classmethod
    def build(cls, world: int, groups: Mapping[str, Sequence[int] | None], *,
              descriptions: Mapping[str, str] | None = None,
              collectives: Mapping[str, Iterable[str]] | None = None,
              p2p: Iterable[tuple[int, int]] = ()) -> MeshFacts:
        """From mappings; a group whose members are unknown (None) is the world."""
        return cls(world, tuple(sorted((str(n), tuple(sorted(set(m))) if m else tuple(range(world)))
                                       for n, m in groups.items())),
                   tuple(sorted((descriptions or {}).items())),
                   tuple(sorted((str(n), tuple(sorted(set(c)))) for n, c in (collectives or {}).items())),
                   tuple(sorted({(int(a), int(b)) for a, b in p2p})))


def mesh_facts(world: int, groups: Mapping[str, Sequence[int] | None], reports: Iterable[Any]) -> MeshFacts:
    """The facts of a checked trace: ``reports`` are :class:`nbox_trace.check.report.RankReport` objects
    (their ``pg_desc``, ``collectives`` and ``p2p``)."""
    descs: dict[str, str] = {}
    colls: dict[str, set[str]] = {}
    pairs: set[tuple[int, int]] = set()
    for r in reports:
        for name, desc in r.pg_desc.items():
            descs.setdefault(name, desc)
        for c in r.collectives:
            colls.setdefault(c.pg_name, set()).add(c.comm_type)
        pairs.update((op.src, op.dst) for _, op in r.p2p)
    return MeshFacts.build(world, groups, descriptions=descs, collectives=colls, p2p=pairs)


@dataclass(frozen=True)
class MeshDim:
    """One dimension: its name, degree (ranks along it), stride (rank distance between neighbours along
    it), the process groups that lie along exactly it, how it was named, and whether the name is a guess."""

    name: str
    degree: int
    stride: int
    groups: tuple[str, ...]
    named_by: str
    guessed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "degree": self.degree, "stride": self.stride, "groups": list(self.groups),
                "named_by": self.named_by, "guessed": self.guessed}


@dataclass(frozen=True)
class RecordedMesh:
    """The inferred mesh (module docstring). ``dims`` outermost first; ``group_dims``: every process group
    -> the names of the dimensions it spans (the world: all; a one-rank group: none); ``irregular``: groups
    that are not a whole slice of the mesh; ``ok`` False: the groups form no mesh (``notes`` say why)."""

    world: int
    dims: tuple[MeshDim, ...]
    group_dims: tuple[tuple[str, tuple[str, ...]], ...]
    irregular: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    ok: bool = True

    @property
    def guessed(self) -> bool:
        return any(d.guessed for d in self.dims)

    def dim(self, name: str) -> MeshDim | None:
        return next((d for d in self.dims if d.name == name), None)

    def degrees(self) -> dict[str, int]:
        return {d.name: d.degree for d in self.dims}

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's coordinate on each dimension."""
        return {d.name: (rank // d.stride) % d.degree for d in self.dims}

    def spans(self, group: str) -> tuple[str, ...] | None:
        """The dimensions ``group`` spans (None: an irregular or unknown group)."""
        return dict(self.group_dims).get(group)

    def spanned(self, members: Sequence[int]) -> tuple[str, ...] | None:
        """The dimensions a group of ``members`` (global ranks) spans; None: not a whole slice of the mesh."""
        return _spanned(self.dims, members) if self.ok else None

    def describe(self) -> str:
        """E.g. ``dp=2 x tp=2``, outermost first."""
        return " x ".join(f"{d.name}={d.degree}" for d in self.dims) or f"one rank (world size {self.world})"

    def to_dict(self) -> dict[str, Any]:
        return {"mesh": self.describe() if self.ok else None, "dims": [d.to_dict() for d in self.dims],
                "group_dims": {g: list(ds) for g, ds in self.group_dims}, "irregular_groups": list(self.irregular),
                "guessed": self.guessed, "ok": self.ok, "notes": list(self.notes)}

    def lines(self) -> list[str]:
        """For people: the mesh, then one line per dimension, then the notes."""
        if not self.ok:
            return ["mesh: the process groups form no mesh", *(f"  {n}" for n in self.notes)]
        out = [f"mesh: {self.describe()}" + (" (outermost first)" if len(self.dims) > 1 else "")
               + (" - names guessed, name them with --recorded-mesh" if self.guessed else "")]
        for d in self.dims:
            groups = ", ".join(repr(g) for g in d.groups[:4]) + (", ..." if len(d.groups) > 4 else "")
            out.append(f"  {d.name}: {d.degree} ranks, stride {d.stride}, named by {d.named_by}"
                       + (f"; groups {groups}" if groups else "; no group of its own"))
        out += [f"  note: {n}" for n in self.notes]
        return out


def _desc_name(desc: str) -> str | None:
    """The dimension a group description names, if it names exactly one."""
    m = re.fullmatch(r"mesh_([A-Za-z_]+)", desc.strip())
    if m:
        key = m.group(1).lower()
        return ALIASES.get(key, key) if ALIASES.get(key, key) in DIM_NAMES else None
    upper = desc.upper()
    hits = [name for word, name in _MEGATRON if word in upper and "GROUP" in upper]
    return hits[0] if len(hits) == 1 else None


def _stride(members: tuple[int, ...]) -> int | None:
    """The common step of sorted ``members`` (an arithmetic progression), else None."""
    if len(members) < 2:
        return None
    step = members[1] - members[0]
    return step if step > 0 and all(b - a == step for a, b in itertools.pairwise(members)) else None


def _components(pairs: Iterable[tuple[int, int]], world: int) -> list[tuple[int, ...]]:
    parent = list(range(world))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        if 0 <= a < world and 0 <= b < world:
            parent[find(a)] = find(b)
    comps: dict[int, list[int]] = {}
    for r in range(world):
        comps.setdefault(find(r), []).append(r)
    return [tuple(c) for c in comps.values() if len(c) > 1]


def _layout(world: int, sets: Mapping[tuple[int, ...], list[str]]) -> tuple[list[tuple[int, int, list[str]]], str]:
    """Dimensions innermost first as (degree, stride, group names), and why the layout stopped short ('')."""
    families: dict[tuple[int, int], list[tuple[tuple[int, ...], list[str]]]] = {}
    for members, names in sets.items():
        step = _stride(members)
        if step is not None and (members[0] // step) % len(members) == 0:
            families.setdefault((step, len(members)), []).append((members, names))
    dims: list[tuple[int, int, list[str]]] = []
    expected = 1
    misfit = ""
    for (step, size), fam in sorted(families.items()):
        if step == expected and world % (expected * size):
            misfit = misfit or f"groups of {size} ranks at stride {step} do not divide the world size {world}"
        if step != expected or world % (expected * size):
            continue
        covered = [r for members, _ in fam for r in members]
        if len(covered) != len(set(covered)):
            continue  # overlapping groups: not the slices of one dimension
        dims.append((size, step, [n for _, names in fam for n in names]))
        expected *= size
    if misfit and not dims:
        return dims, misfit
    if world // expected > 1:
        dims.append((world // expected, expected, []))
    return dims, ""


def infer_mesh(facts: MeshFacts, names: Sequence[str] | None = None) -> RecordedMesh:
    """The recorded mesh (module docstring); ``names``: the user's names, outermost first, from
    :func:`parse_names` (``name=degree`` entries have their degree checked).

    Raises:
        MeshNameError: ``names`` that do not fit the inferred mesh (count or degree; the message names them).
    """
    world = facts.world
    groups = dict(facts.groups)
    sets: dict[tuple[int, ...], list[str]] = {}
    for name, members in sorted(groups.items()):
        if 1 < len(members) < world:
            sets.setdefault(members, []).append(name)
    for comp in _components(facts.p2p, world):
        if len(comp) < world:
            sets.setdefault(comp, []).append(P2P)
    inner_first, why = _layout(world, sets)
    if why:
        return RecordedMesh(world, (), (), tuple(sorted(groups)), (why,), ok=False)
    colls = dict(facts.collectives)
    descs = dict(facts.descriptions)
    dims = [(deg, stride, gs) for deg, stride, gs in reversed(inner_first)]  # outermost first
    named = _user_names(dims, names) if names is not None else _names(dims, groups, colls, descs, facts.p2p, world)
    mesh_dims = tuple(MeshDim(n, deg, stride, (), by, guess)
                      for (deg, stride, _), (n, by, guess) in zip(dims, named, strict=True))
    group_dims, irregular = _place_groups(mesh_dims, groups)
    mesh_dims = tuple(replace(d, groups=tuple(g for g, spans in group_dims if spans == (d.name,)))
                      for d in mesh_dims)
    notes = []
    if any(d.guessed for d in mesh_dims):
        notes.append("collectives alone cannot tell tensor from data parallelism: names guessed by position "
                     "(tp innermost); name the dimensions with --recorded-mesh, outermost first")
    if irregular:
        notes.append(f"groups not along mesh dimensions (they keep their size): {', '.join(map(repr, irregular))}")
    return RecordedMesh(world, mesh_dims, group_dims, irregular, tuple(notes))


def _user_names(dims: Sequence[tuple[int, int, list[str]]], names: Sequence[str]) -> list[tuple[str, str, bool]]:
    if len(names) != len(dims):
        shape = " x ".join(str(d) for d, _, _ in dims) or "none"
        raise MeshNameError(f"--recorded-mesh {','.join(names)}: {len(names)} name(s) for the {len(dims)} "
                            f"dimension(s) the groups form (degrees outermost first: {shape})")
    out = []
    for (deg, _, _), given in zip(dims, names, strict=True):
        name, _, degree = given.partition("=")
        if degree and int(degree) != deg:
            raise MeshNameError(f"--recorded-mesh {name}={degree}: that dimension has {deg} ranks in the recording")
        out.append((name, "--recorded-mesh", False))
    return out


def _names(dims: Sequence[tuple[int, int, list[str]]], groups: Mapping[str, tuple[int, ...]],
           colls: Mapping[str, tuple[str, ...]], descs: Mapping[str, str], p2p: Sequence[tuple[int, int]],
           world: int) -> list[tuple[str, str, bool]]:
    """Names outermost first (module docstring, step 2)."""
    n = len(dims)
    world_groups = [g for g, m in groups.items() if len(m) == world]
    out: list[tuple[str, str, bool] | None] = [None] * n
    taken: set[str] = set()
    for i, (_, _, gs) in enumerate(dims):
        found = {x for x in (_desc_name(descs.get(g, "")) for g in gs) if x is not None}
        if len(found) == 1 and (name := found.pop()) not in taken:
            desc = next(descs[g] for g in gs if _desc_name(descs.get(g, "")) == name)
            out[i] = (name, f"description {desc!r}", False)
            taken.add(name)
    kinds: list[set[str]] = []
    for _, _, gs in dims:
        own = [g for g in gs if g != P2P] or (world_groups if n == 1 else [])
        k = {c for g in own for c in colls.get(g, ())}
        if P2P in gs or (n == 1 and p2p):
            k.add("P2P")
        kinds.append(k)
    for i, k in enumerate(kinds):
        if out[i] is None and "P2P" in k and not (k - {"P2P", "BARRIER"}) and "pp" not in taken:
            out[i] = ("pp", "send/recv between its ranks", False)
            taken.add("pp")
        elif out[i] is None and "ALL_TO_ALL" in k and "ep" not in taken:
            out[i] = ("ep", "collectives (all-to-all)", False)
            taken.add("ep")
    rest = [i for i in range(n) if out[i] is None]

    def by_collectives(k: set[str]) -> str:
        return "fsdp" if k & _SHARDED and "ALL_REDUCE" not in k else "dp"

    if n == 1 and rest:
        name = by_collectives(kinds[0])
        return [(name, f"collectives ({', '.join(sorted(kinds[0])).lower() or 'none'})", False)]
    free = [x for x in ("tp", "cp", "fsdp", "dp", "ep", "pp") if x not in taken]
    inner_first = list(reversed(rest))
    for pos, i in enumerate(inner_first):
        # the outermost (or only) unnamed one: data parallel; the innermost: tensor parallel, as frameworks place it
        want = by_collectives(kinds[i]) if pos == len(inner_first) - 1 else ("tp" if pos == 0 else "")
        name = want if want and want in free else free[0]
        out[i] = (name, "position (guessed)", True)
        free.remove(name)
    return [x for x in out if x is not None]


def _place_groups(dims: Sequence[MeshDim], groups: Mapping[str, tuple[int, ...]]
                  ) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]]:
    placed: list[tuple[str, tuple[str, ...]]] = []
    irregular: list[str] = []
    for name, members in sorted(groups.items()):
        spanned = _spanned(dims, members)
        if spanned is None:
            irregular.append(name)
        else:
            placed.append((name, spanned))
    return tuple(placed), tuple(irregular)


def _spanned(dims: Sequence[MeshDim], members: Sequence[int]) -> tuple[str, ...] | None:
    """The dimensions along which ``members`` differ, when they are a whole slice of them (else None)."""
    if not members or len(set(members)) != len(members):
        return None
    world = math.prod(d.degree for d in dims)
    if any(not 0 <= r < world for r in members):
        return None
    spanned = tuple(d.name for d in dims if len({(r // d.stride) % d.degree for r in members}) > 1)
    return spanned if math.prod(d.degree for d in dims if d.name in spanned) == len(members) else None
