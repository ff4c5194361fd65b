"""Compare two bundles, A and B: why is B's run slower (or faster) than A's?

:func:`diff_bundles` reports, A -> B: every changed manifest key of producer, hardware, job and capture;
the observed iteration time (median/p10/p90, delta, ratio; None: not measured); operators by node name
(count and microseconds per iteration, averaged over each side's recorded ranks; iterations are the
distinct ``nbox_iteration`` values of a rank, else one): added, removed, count changed, and time per
operator and per coarse family (:func:`op_family`); collectives as a multiset of (comm type,
process-group size, bytes) per rank per iteration, position by position within each process group on
the ranks both recorded (resized, added, removed), and bytes per comm type; and a short verdict.
Anonymized names are compared as they are (equal only under the same key).
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbox_trace.bundle.inspection import BundleSummary, load_bundle, summarize
from nbox_trace.chakra import EtReader, as_int, attr_map
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.contract import comm_type_name
from nbox_trace.units import fit_label, format_bytes, format_in, format_us, time_unit

#: Version of the JSON document :meth:`BundleDiff.to_dict` produces.
DIFF_SCHEMA = "nbox.bundle-diff/1"
FAMILIES = ("matmul", "attention", "elementwise", "normalization", "copy/view", "optimizer", "backward", "comm",
            "other")
_MATMUL = re.compile(r"^aten::(mm|addmm|bmm|linear|matmul|baddbmm)$")
_ATTENTION = re.compile(r"scaled_dot_product|_flash|_efficient_attention")
_OPTIMIZER = re.compile(r"_foreach_|optimizer", re.IGNORECASE)
_COPY_VIEW = re.compile(r"^aten::(view|reshape|as_strided|transpose|t|permute|contiguous|clone|expand|split|"
                        r"split_with_sizes|chunk|select|slice|flatten|unsqueeze|squeeze|_to_copy|to|empty|"
                        r"empty_like|cat|stack|narrow|unflatten|detach|alias)$|copy")
_ELEMENTWISE = re.compile(r"^aten::(add|sub|mul|div|neg|abs|exp|log|pow|sqrt|rsqrt|relu|gelu|silu|sigmoid|tanh|"
                          r"dropout|where|fill|zero|ones_like|zeros_like|full_like|clamp|maximum|minimum|"
                          r"mse_loss|cross_entropy_loss|softmax|_softmax|log_softmax|broadcast_tensors|sum|mean)_?$")
_COMM_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
_MAX_NAME = 200


def op_family(name: str, node_type: int = pb.COMP_NODE) -> str:
    """The coarse family of an operator (see :data:`FAMILIES`); comm nodes are ``comm`` whatever their name."""
    if node_type in _COMM_TYPES:
        return "comm"
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    for family, pattern in (("optimizer", _OPTIMIZER), ("attention", _ATTENTION), ("matmul", _MATMUL)):
        if pattern.search(name):
            return family
    if "norm" in name:
        return "normalization"
    if _COPY_VIEW.search(name):
        return "copy/view"
    return "elementwise" if _ELEMENTWISE.search(name) else "other"


@dataclass
class _RankProfile:
    iterations: int
    counts: Counter[str]
    us: Counter[str]
    families: dict[str, str]
    colls: dict[str, list[tuple[str, int]]]  # pg -> [(comm type name, bytes)] in trace order
    p2p_bytes: Counter[str]


def _profile_rank(path: str | os.PathLike[str]) -> _RankProfile:
    counts: Counter[str] = Counter()
    us: Counter[str] = Counter()
    families: dict[str, str] = {}
    colls: dict[str, list[tuple[str, int]]] = defaultdict(list)
    p2p: Counter[str] = Counter()
    iterations: set[int] = set()
    with EtReader(path) as reader:
        for node in reader:
            if node.type == pb.METADATA_NODE:
                continue
            name = node.name.strip()[:_MAX_NAME]
            attrs = attr_map(node.attr) if len(node.attr) else {}
            it = attrs.get("nbox_iteration")
            if it is not None and (value := as_int(it)) is not None:
                iterations.add(value)
            counts[name] += 1
            us[name] += node.duration_micros
            families.setdefault(name, op_family(name, node.type))
            size, ctype = (as_int(attrs[k]) if k in attrs else None for k in ("comm_size", "comm_type"))
            if node.type == pb.COMM_COLL_NODE:
                pg = attrs.get("pg_name")
                if ctype is not None and size is not None:
                    colls["" if pg is None or pg.value is None else str(pg.value)].append((comm_type_name(ctype), size))
            elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) and size is not None:
                p2p["SEND" if node.type == pb.COMM_SEND_NODE else "RECV"] += size
    return _RankProfile(max(1, len(iterations)), counts, us, families, dict(colls), p2p)


@dataclass
class _Side:
    summary: BundleSummary
    ranks: dict[int, _RankProfile]

    def avg(self, pick: Any) -> dict[Any, float]:
        """Rank-average per iteration of ``pick(rank profile) -> {key: amount}``."""
        out: dict[Any, float] = defaultdict(float)
        for prof in self.ranks.values():
            for key, amount in pick(prof).items():
                out[key] += amount / prof.iterations / len(self.ranks)
        return dict(out)

    def pg_size(self, pg: str) -> int | None:
        members = self.summary.process_groups.get(pg)
        return len(members) if members is not None else None


def _load(bundle: str | os.PathLike[str]) -> _Side:
    root = Path(bundle)
    manifest, report = load_bundle(root)
    return _Side(summarize(root, manifest, report), {r.rank: _profile_rank(r.path) for r in report.ranks})


@dataclass(frozen=True)
class Change:
    """One manifest key (dotted) whose value differs; None where a side lacks it."""

    key: str
    a: Any
    b: Any


@dataclass(frozen=True)
class IterationTimeDiff:
    """Observed iteration time of both runs ({median, p10, p90, n} or None: not measured), in microseconds."""

    a: dict[str, float] | None
    b: dict[str, float] | None
    median_delta_us: float | None
    p10_delta_us: float | None
    p90_delta_us: float | None
    ratio: float | None  # median B / median A


@dataclass(frozen=True)
class OperatorDiff:
    """One operator name: count and time (us) per rank per iteration on both sides."""

    name: str
    family: str
    a_count: float
    b_count: float
    a_us: float
    b_us: float

    @property
    def delta_us(self) -> float:
        return self.b_us - self.a_us

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "delta_us": self.delta_us}


@dataclass(frozen=True)
class FamilyDiff:
    """Time of one operator family (us per rank per iteration), A and B."""

    family: str
    a_us: float
    b_us: float
    delta_us: float


@dataclass(frozen=True)
class CollectiveCountDiff:
    """How many collectives of one (type, process-group size, bytes) per rank per iteration, A and B."""

    comm_type: str
    pg_size: int | None
    size_bytes: int
    a_count: float
    b_count: float


@dataclass(frozen=True)
class CollectiveChange:
    """A collective at one position of a process group's sequence, on the listed ranks (both recorded)."""

    kind: str  # resized | added | removed
    pg_name: str
    position: int
    comm_type: str
    a_bytes: int | None
    b_bytes: int | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class BytesDiff:
    """Bytes of one comm type (SEND/RECV: point-to-point) per rank per iteration, A and B."""

    comm_type: str
    a_bytes: float
    b_bytes: float


@dataclass(frozen=True)
class BundleDiff:
    """Everything :func:`diff_bundles` found, A -> B. Per-iteration figures are rank averages."""

    a: str
    b: str
    environment: tuple[Change, ...]
    iteration_time: IterationTimeDiff
    operators_added: tuple[str, ...]
    operators_removed: tuple[str, ...]
    operators_count_changed: tuple[OperatorDiff, ...]
    operators: tuple[OperatorDiff, ...]  # every name, by |delta_us| descending
    families: tuple[FamilyDiff, ...]  # by |delta_us| descending
    collective_counts: tuple[CollectiveCountDiff, ...]  # only keys whose count differs
    collectives_resized: tuple[CollectiveChange, ...]
    collectives_added: tuple[CollectiveChange, ...]
    collectives_removed: tuple[CollectiveChange, ...]
    comm_bytes: tuple[BytesDiff, ...]
    verdict: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return not (self.environment or self.operators_added or self.operators_removed
                    or self.operators_count_changed or self.collective_counts or self.collectives_resized
                    or self.collectives_added or self.collectives_removed
                    or any(o.delta_us for o in self.operators))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": DIFF_SCHEMA, "identical": self.identical}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if isinstance(value, tuple):
                value = [v.to_dict() if hasattr(v, "to_dict") else asdict(v) if hasattr(v, "__dataclass_fields__")
                         else v for v in value]
            elif hasattr(value, "__dataclass_fields__"):
                value = asdict(value)
            out[key] = value
        return out

    def lines(self, top: int = 10) -> list[str]:
        out = [f"diff A={self.a}  B={self.b}"]
        out.append(f"environment: {len(self.environment)} change(s)")
        out += [f"  {c.key}: {_short(c.a)} -> {_short(c.b)}" for c in self.environment]
        it = self.iteration_time
        unit = time_unit([v for d in (it.a, it.b) if d is not None for v in (d["median"], d["p10"], d["p90"])])

        def spread(d: dict[str, Any] | None) -> str:
            return "not measured" if d is None else (f"{format_in(d['median'], unit)}/{format_in(d['p10'], unit)}/"
                                                     f"{format_in(d['p90'], unit)} {unit[0]} (n={d['n']})")

        out.append(f"iteration time median/p10/p90: A {spread(it.a)}  B {spread(it.b)}"
                   + (f"  delta {'+' if it.median_delta_us >= 0 else ''}{format_in(it.median_delta_us, unit)} "
                      f"{unit[0]} (x{it.ratio:.2f})" if it.median_delta_us is not None and it.ratio is not None
                      else ""))
        out.append(f"operators (per rank per iteration): {len(self.operators_added)} added, "
                   f"{len(self.operators_removed)} removed, {len(self.operators_count_changed)} count changed")
        out += [f"  + {n}" for n in self.operators_added[:top]] + [f"  - {n}" for n in self.operators_removed[:top]]
        out += [f"  ~ {o.name}: {o.a_count:g} -> {o.b_count:g}" for o in self.operators_count_changed[:top]]
        ops = [o for o in self.operators[:top] if o.delta_us]
        tu = time_unit([v for r in self.families for v in (r.a_us, r.b_us, r.delta_us)]
                       + [v for o in ops for v in (o.a_us, o.b_us, o.delta_us)])  # one unit for both tables
        digits = None if tu[0] == "us" else 3

        def t(v: float, sign: str = "") -> str:
            return f"{format(v / tu[1], f'{sign}.{0 if digits is None else digits}f')}"

        w = min(max([56, *(len(o.name) + 2 for o in ops)]), 90)  # the names as long as they are, up to 88
        out.append(f"  {f'time by family ({tu[0]})':<{w}}{'A':>10}{'B':>10}{'delta':>10}")
        out += [f"  {fit_label(f.family, w - 2):<{w}}{t(f.a_us):>10}{t(f.b_us):>10}{t(f.delta_us, '+'):>10}"
                for f in self.families]
        out.append(f"  {f'time by operator ({tu[0]}), top {top}':<{w}}{'A':>10}{'B':>10}{'delta':>10}")
        out += [f"  {fit_label(o.name, w - 2):<{w}}{t(o.a_us):>10}{t(o.b_us):>10}{t(o.delta_us, '+'):>10}"
                for o in ops]
        out.append("collectives (bytes per rank per iteration):")
        out += [f"  {fit_label(c.comm_type, 54):<56}{format_bytes(c.a_bytes):>12}{format_bytes(c.b_bytes):>12}"
                f"{_signed_bytes(c.b_bytes - c.a_bytes):>12}" for c in self.comm_bytes]
        out += [f"  count {c.comm_type} pg size {c.pg_size} {format_bytes(c.size_bytes)}: {c.a_count:g} -> "
                f"{c.b_count:g}" for c in self.collective_counts[:top]]
        for c in (*self.collectives_resized, *self.collectives_added, *self.collectives_removed)[:top]:
            out.append(f"  {c.kind} pg {c.pg_name!r} #{c.position} {c.comm_type}: {_bytes_or_dash(c.a_bytes)} -> "
                       f"{_bytes_or_dash(c.b_bytes)} (ranks {list(c.ranks)})")
        out.append("verdict:")
        out += [f"  - {v}" for v in self.verdict]
        return out


def _short(value: Any, limit: int = 80) -> str:
    text = "-" if value is None else repr(value) if isinstance(value, str) else str(value)
    return fit_label(text, limit)


def _bytes_or_dash(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


def _signed_us(delta_us: float) -> str:
    return ("+" if delta_us > 0 else "") + format_us(delta_us)


def _signed_bytes(delta: float) -> str:
    return ("+" if delta > 0 else "") + format_bytes(delta)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _environment(a: BundleSummary, b: BundleSummary) -> tuple[Change, ...]:
    def facts(s: BundleSummary) -> dict[str, Any]:
        top = {"version": s.migrated_from or s.schema_version, "kind": s.kind, "complete": s.complete,
               "anonymized": s.anonymized}
        for part in ("producer", "hardware", "job", "capture"):
            top[part] = getattr(s, part)
        return _flatten("", top, {})

    fa, fb = facts(a), facts(b)
    return tuple(Change(k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k))


def _iteration_time(a: BundleSummary, b: BundleSummary) -> IterationTimeDiff:
    ia, ib = a.iteration_time_us, b.iteration_time_us

    def delta(key: str) -> float | None:
        return None if ia is None or ib is None else ib[key] - ia[key]

    ratio = None if ia is None or ib is None or not ia["median"] else ib["median"] / ia["median"]
    return IterationTimeDiff(ia, ib, delta("median"), delta("p10"), delta("p90"), ratio)


def _positional(a: _Side, b: _Side) -> list[CollectiveChange]:
    found: dict[tuple[str, str, int, str, int | None, int | None], list[int]] = defaultdict(list)
    for rank in sorted(a.ranks.keys() & b.ranks.keys()):
        ca, cb = a.ranks[rank].colls, b.ranks[rank].colls
        for pg in sorted(ca.keys() | cb.keys()):
            sa, sb = ca.get(pg, []), cb.get(pg, [])
            for i in range(max(len(sa), len(sb))):
                oa = sa[i] if i < len(sa) else None
                ob = sb[i] if i < len(sb) else None
                if oa == ob:
                    continue
                if oa is not None and ob is not None and oa[0] == ob[0]:
                    found[("resized", pg, i, oa[0], oa[1], ob[1])].append(rank)
                    continue
                if oa is not None:
                    found[("removed", pg, i, oa[0], oa[1], None)].append(rank)
                if ob is not None:
                    found[("added", pg, i, ob[0], None, ob[1])].append(rank)
    return [CollectiveChange(*key, ranks=tuple(ranks)) for key, ranks in found.items()]


def _by_delta(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(sorted(items, key=lambda x: (-abs(x.delta_us), getattr(x, "name", getattr(x, "family", "")))))


def _verdict(d: dict[str, Any], a: _Side, b: _Side) -> list[str]:
    out = []
    it: IterationTimeDiff = d["iteration_time"]
    if it.median_delta_us is not None and it.ratio is not None and it.a and it.b:
        word = "slower" if it.median_delta_us > 0 else "faster" if it.median_delta_us < 0 else "as fast"
        out.append(f"B is {word}: median iteration {format_us(it.a['median'])} -> {format_us(it.b['median'])} "
                   f"({_signed_us(it.median_delta_us)}, x{it.ratio:.2f})")
    else:
        side = " and ".join(s for s, v in (("A", it.a), ("B", it.b)) if v is None)
        out.append(f"iteration time not measured in {side}: no observed delta")
    families: tuple[FamilyDiff, ...] = d["families"]
    total = max(sum(f.a_us for f in families), sum(f.b_us for f in families), 1.0)
    ops: tuple[OperatorDiff, ...] = d["operators"]
    for f in [f for f in families if abs(f.delta_us) >= max(1.0, 0.01 * total)][:3]:
        tops = [o for o in ops if o.family == f.family and o.delta_us * f.delta_us > 0][:2]
        what = "communication time" if f.family == "comm" else f"{f.family} compute"
        out.append(f"{what} {_signed_us(f.delta_us)} per rank per iteration ({format_us(f.a_us)} -> "
                   f"{format_us(f.b_us)}); most from " + ", ".join(f"{o.name} {_signed_us(o.delta_us)}" for o in tops))
    for c in d["comm_bytes"]:
        if c.a_bytes != c.b_bytes:
            pct = f" ({(c.b_bytes - c.a_bytes) / c.a_bytes:+.0%})" if c.a_bytes else ""
            out.append(f"{c.comm_type} traffic {format_bytes(c.a_bytes)} -> {format_bytes(c.b_bytes)} per rank per "
                       f"iteration{pct}")
    n_res, n_add, n_rem = (len(d[k]) for k in ("collectives_resized", "collectives_added", "collectives_removed"))
    if n_res or n_add or n_rem:
        out.append(f"collective sequence: {n_res} resized, {n_add} added, {n_rem} removed (by position)")
    if d["operators_added"] or d["operators_removed"]:
        out.append(f"different programs: {len(d['operators_added'])} operator(s) only in B, "
                   f"{len(d['operators_removed'])} only in A")
    if d["environment"]:
        keys = [c.key for c in d["environment"]]
        out.append("environment changed: " + ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6
                                                                   else ""))
    if a.summary.anonymized or b.summary.anonymized:
        out.append("anonymized names: operators compare equal only when both bundles used the same key")
    if len(out) == 1 and not any(o.delta_us for o in ops):
        out.append("no differences in environment, operators or collectives")
    return out


def diff_bundles(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> BundleDiff:
    """Compare bundle ``a`` (the baseline) with bundle ``b``; see the module docstring.

    Raises:
        InputNotFoundError: either path is not a bundle (the message names it).
        InvalidInputError: a bad manifest or an undecodable trace (the message names the file).
    """
    sa, sb = _load(a), _load(b)
    counts_a, counts_b = sa.avg(lambda p: p.counts), sb.avg(lambda p: p.counts)
    us_a, us_b = sa.avg(lambda p: p.us), sb.avg(lambda p: p.us)
    fam: dict[str, str] = {}
    for prof in (*sa.ranks.values(), *sb.ranks.values()):
        fam.update({n: f for n, f in prof.families.items() if n not in fam})
    ops = [OperatorDiff(n, fam[n], round(counts_a.get(n, 0.0), 6), round(counts_b.get(n, 0.0), 6),
                        round(us_a.get(n, 0.0), 3), round(us_b.get(n, 0.0), 3)) for n in sorted(fam)]
    fam_a = {f: sum(o.a_us for o in ops if o.family == f) for f in FAMILIES}
    fam_b = {f: sum(o.b_us for o in ops if o.family == f) for f in FAMILIES}
    families = [FamilyDiff(f, fam_a[f], fam_b[f], fam_b[f] - fam_a[f]) for f in FAMILIES if fam_a[f] or fam_b[f]]

    def multiset(side: _Side) -> dict[Any, float]:
        return side.avg(lambda p: Counter((t, side.pg_size(pg), size) for pg, seq in p.colls.items()
                                          for t, size in seq))

    def bytes_by_type(side: _Side) -> dict[Any, float]:
        def pick(p: _RankProfile) -> Counter[str]:
            out: Counter[str] = Counter(p.p2p_bytes)
            for seq in p.colls.values():
                for t, size in seq:
                    out[t] += size
            return out
        return side.avg(pick)

    ma, mb = multiset(sa), multiset(sb)
    counts = [CollectiveCountDiff(k[0], k[1], k[2], round(ma.get(k, 0.0), 6), round(mb.get(k, 0.0), 6))
              for k in sorted(ma.keys() | mb.keys(), key=lambda k: (k[0], k[1] or 0, k[2]))
              if round(ma.get(k, 0.0), 6) != round(mb.get(k, 0.0), 6)]
    ba, bb = bytes_by_type(sa), bytes_by_type(sb)
    positional = _positional(sa, sb)
    d: dict[str, Any] = {
        "environment": _environment(sa.summary, sb.summary),
        "iteration_time": _iteration_time(sa.summary, sb.summary),
        "operators_added": tuple(o.name for o in ops if not o.a_count and o.b_count),
        "operators_removed": tuple(o.name for o in ops if o.a_count and not o.b_count),
        "operators_count_changed": tuple(o for o in ops if o.a_count and o.b_count and o.a_count != o.b_count),
        "operators": _by_delta(ops),
        "families": _by_delta(families),
        "collective_counts": tuple(counts),
        "collectives_resized": tuple(c for c in positional if c.kind == "resized"),
        "collectives_added": tuple(c for c in positional if c.kind == "added"),
        "collectives_removed": tuple(c for c in positional if c.kind == "removed"),
        "comm_bytes": tuple(BytesDiff(t, ba.get(t, 0.0), bb.get(t, 0.0)) for t in sorted(ba.keys() | bb.keys())),
    }
    return BundleDiff(a=str(a), b=str(b), verdict=tuple(_verdict(d, sa, sb)), **d)


__all__ = ["DIFF_SCHEMA", "FAMILIES", "BundleDiff", "BytesDiff", "Change", "CollectiveChange", "CollectiveCountDiff",
           "FamilyDiff", "IterationTimeDiff", "OperatorDiff", "diff_bundles", "op_family"]
