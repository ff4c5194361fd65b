"""Recorded compute corrected for the profiler's overhead: one rule for the virtual and live replays and sweeps.

The captured iterations ran under the ET observer and Kineto, which lengthened every recorded duration. The bundle
carries, per rank, the training thread's CPU time per clean and per captured iteration (``observed.thread_cpu_us``:
``clean``, ``captured``, ``clean_run_queue``, ``clean_segments``; :mod:`nbox_trace.bundle`), and a rule rescales the
rank's host compute nodes (those on a ``thread:`` resource; GPU stream nodes are not touched) from them:

=====================  ========================================================================================
``proportional``       every duration times ``clean / captured``
``per_op``             each node of captured iteration j loses ``(captured - clean) / n_j`` (n_j: its host compute
                       nodes with a duration), floored at :data:`PER_OP_FLOOR` of its recorded duration
``to_clean``           the training thread's nodes of iteration j times ``clean / recorded_j`` (recorded_j: their
                       sum; may be above 1); other host threads' nodes by ``proportional``
``segments``           ``to_clean`` per segment between the training thread's comm nodes, each to the median clean
                       time of the same segment (:mod:`nbox_replay.inputs.segments`); an iteration whose segments
                       do not match the clean ones' falls back to ``to_clean``, and the report names it
``segments_runnable``  ``segments`` to the clean time on a CPU or waiting for one (CPU plus run-queue time)
``to_wall``            every host node, gap and collective issue cost of iteration j times ``min(1, clean_wall /
                       host_j)`` (clean_wall: the median clean iteration, ``observed.per_rank_us``; host_j: their sum)
=====================  ========================================================================================

``replay.profiler_correction``: ``on`` (the default) picks per rank (:func:`rank_rule`): ``segments_runnable`` with
clean segments (``segments`` where the thread waited for a CPU :data:`OVERSUBSCRIBED_SHARE` of its CPU time or
more beyond what its node's CPU quota makes it wait: ``cpu_share``, :attr:`RankFigures.oversubscribed`; a quota
is a CPU node's, a container's or a host's limit, with no GPU counterpart), else :data:`DEFAULT_RULE`;
:data:`FALLBACK_RULE` for a rank with lean-timed operators (only those the lean pass did not time are corrected) or
unmarked captured iterations; :data:`DEVICE_RULE` for a rank with device compute, marked iterations and a clean wall
time (else :data:`FALLBACK_RULE`). A named rule applies to every rank, the lean figures set aside; ``off`` plays the
durations as they are. ``proportional`` and ``per_op`` never lengthen compute. A rank without figures is replayed
uncorrected, and the report says so. The live worker of ``--compute recorded`` waits the corrected durations. Times
are microseconds.

Why these rules, and what they were compared against: docs/design/profiler-correction.md.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, RECV, RankGraph, captured_iterations
from nbox_replay.inputs.segments import scale_segments, segment_medians
from nbox_trace.bundle import THREAD_CPU_KEY
from nbox_trace.errors import UsageError

__all__ = ["DEFAULT_RULE", "DEVICE_RULE", "FALLBACK_RULE", "MODES", "OVERSUBSCRIBED_SHARE", "PER_OP_FLOOR", "RULES",
           "RUNNABLE_RULE", "SEGMENT_RULE", "SEGMENT_RULES",
           "Correction", "RankFigures", "correct_durations", "correct_graph", "correct_graphs", "from_worker_doc",
           "plan_correction", "rank_rule", "read_figures", "training_thread"]

RULES = ("proportional", "per_op", "to_clean", "to_wall", "segments", "segments_runnable")
MODES = ("on", "off", *RULES)
#: ``on``: the rule of a rank whose work is its host thread's (module docstring) ...
DEFAULT_RULE = "to_clean"
#: ... which a rank whose bundle carries the clean segments between collectives gets as this rule ...
SEGMENT_RULE = "segments"
#: ``segments`` with each segment scaled to the clean thread's time on a CPU or waiting for one (module docstring).
RUNNABLE_RULE = "segments_runnable"
SEGMENT_RULES = (SEGMENT_RULE, RUNNABLE_RULE)
#: ... and of a rank with lean-timed operators (or device compute but no clean wall time) ...
FALLBACK_RULE = "proportional"
#: ... and of a rank with device compute (GPU stream nodes) whose clean wall time the bundle carries.
DEVICE_RULE = "to_wall"
#: A rank whose training thread waited for a CPU at least this share of its CPU time per clean iteration is
#: named in the report as recorded on an oversubscribed machine: a node with a CPU of its own stays far below
#: it, two ranks per CPU far above (docs/results.md).
OVERSUBSCRIBED_SHARE = 0.25
#: ``per_op``: a node keeps at least this share of its recorded duration.
PER_OP_FLOOR = 0.1
#: Caps on what a manifest may carry per rank (untrusted input).
_MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class RankFigures:
    """One rank's training-thread CPU time per iteration (medians, microseconds): clean and captured; its time
    runnable but waiting for a CPU per clean iteration (None: the bundle has none; nbox_replay.live.hostwork); its
    clean iterations' wall time (None: the bundle has none; ``observed.per_rank_us``); and the median CPU time of
    each segment between the collectives the thread issued in a clean iteration (None: the bundle has none;
    :mod:`nbox_replay.inputs.segments`)."""

    clean_cpu_us: float
    captured_cpu_us: float
    clean_run_queue_us: float | None = None
    clean_wall_us: float | None = None
    clean_segments_us: tuple[float, ...] | None = None
    clean_segments_runnable_us: tuple[float, ...] | None = None
    cpu_share: float | None = None

    @property
    def overhead_us(self) -> float:
        """What the profiler cost the thread per iteration (0 when the captured time is not above the clean)."""
        return max(0.0, self.captured_cpu_us - self.clean_cpu_us)

    @property
    def wait_share(self) -> float | None:
        """The clean thread's time waiting for a CPU over its time on one (None without CPU time)."""
        return (self.clean_run_queue_us or 0.0) / self.clean_cpu_us if self.clean_cpu_us > 0 else None

    @property
    def oversubscribed(self) -> bool:
        """Whether the thread waited for a CPU :data:`OVERSUBSCRIBED_SHARE` of its CPU time or more beyond what its
        node's CPU quota makes it wait: a wait for other ranks' compute on a machine with fewer CPUs than ranks,
        which a node of the cluster does not take. Under a quota of ``s`` of one CPU (``cpu_share``, below 1) a
        thread alone on it is on a CPU ``s`` of its wall time, so it waits ``1 / s - 1`` times its CPU time by the
        node's own speed, not by contention: the wall time over the CPU time is compared with ``1 / s``."""
        share = self.wait_share
        if share is None:
            return False
        quota = self.cpu_share if self.cpu_share is not None and 0 < self.cpu_share < 1 else 1.0
        return (1.0 + share) * quota - 1.0 >= OVERSUBSCRIBED_SHARE


@dataclass
class Correction:
    """What the replay does to recorded compute: the rule (None: nothing), each rank's figures, and after
    :func:`correct_graphs` each corrected rank's effective factor (corrected / recorded host compute)."""

    rule: str | None
    figures: dict[int, RankFigures] = field(default_factory=dict)
    factors: dict[int, float] = field(default_factory=dict)
    why_not: str = ""  # rule None: why no correction
    uncorrected: list[int] = field(default_factory=list)  # replayed ranks without figures (kept as recorded)
    use_lean: bool = True  # lean-timed nodes keep the lean pass's figures (False: a named rule, module docstring)
    lean: dict[int, tuple[int, int]] = field(default_factory=dict)  # per rank: (lean-timed, all) host operators
    #: per rank corrected by another rule than :attr:`rule` (``on``: :func:`rank_rule`): (rule, why)
    rank_rules: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: per rank corrected by ``segments``: its captured iterations corrected by ``to_clean`` instead, and why
    segment_fallbacks: dict[int, dict[int, str]] = field(default_factory=dict)

    def _lean_counts(self) -> str:
        """"N of M (rank R), ...": each rank's lean-timed host operators; empty when there are none."""
        return ", ".join(f"{n} of {total} (rank {r})" for r, (n, total) in sorted(self.lean.items()))

    def describe(self) -> str:
        """The report's line: the lean pass's coverage, the rule and the factor per rank, from which figures; or
        why none."""
        counts = self._lean_counts()
        lean = f"host operators timed by the lean pass (no observer; with the gaps between them): {counts}" \
            if counts else ""
        if self.rule is None:
            text = f"recorded compute not corrected for the profiler: {self.why_not}"
            return f"{lean}; the rest {text}" if lean else text
        if (lean and self.use_lean and all(n == total for n, total in self.lean.values())
                and set(self.factors) <= set(self.lean) and DEVICE_RULE not in map(self.rule_of, self.factors)):
            return f"{lean}: no profiler correction needed"
        ranks = sorted(self.factors)
        used = {self.rule_of(r) for r in ranks}
        headline = used.pop() if len(used) == 1 else self.rule

        def one(r: int) -> str:
            other = self.rank_rules.get(r)
            why = f", {other[0]} rule: {other[1]})" if other and other[0] != headline else \
                f": {other[1]})" if other else ")"
            return f"x{self.factors[r]:.2f} (rank {r}" + why

        factors = ", ".join(one(r) for r in ranks)
        clean = " / ".join(f"{self.figures[r].clean_cpu_us / 1e3:.1f}" for r in ranks)
        captured = " / ".join(f"{self.figures[r].captured_cpu_us / 1e3:.1f}" for r in ranks)
        walled = [r for r in ranks if self.rule_of(r) == DEVICE_RULE]
        walls = " / ".join(f"{(self.figures[r].clean_wall_us or 0.0) / 1e3:.2f}" for r in walled)
        work = "each captured iteration's host work (operators, lean-timed ones too, their gaps, collective issues)"
        source = (f"{work} to the clean iterations' wall time, {walls} ms" if headline == DEVICE_RULE else
                  f"from clean {clean} ms vs captured {captured} ms CPU per iteration"
                  + (f"; rank(s) {walled}: {work} to their clean wall time, {walls} ms" if walled else ""))
        text = (f"recorded compute corrected for the profiler ({headline} rule): {factors}, {source} "
                "(median; --set replay.profiler_correction=off: as recorded)"
                + (f"; rank(s) {self.uncorrected} carry no CPU times: as recorded" if self.uncorrected else "")
                + self._oversubscribed(ranks) + self._fallbacks())
        if not self.use_lean:
            return text + (f"; the lean pass's figures set aside (a named rule): {counts}" if counts else "")
        if lean and headline == DEVICE_RULE:
            return f"{lean}; {text}"
        return f"{lean}; the rest {text}" if lean else text

    def _fallbacks(self) -> str:
        """"; rank R: captured iteration(s) [j] by to_clean (why)" for the ranks whose ``segments`` rule fell back."""
        parts = []
        for r, why in sorted(self.segment_fallbacks.items()):
            if why:
                reasons = "; ".join(sorted(set(why.values())))
                parts.append(f"; rank {r}: captured iteration(s) {[j + 1 for j in sorted(why)]} corrected by "
                             f"{DEFAULT_RULE} instead of {self.rule_of(r)} ({reasons})")
        return "".join(parts)

    def rule_of(self, rank: int) -> str | None:
        """The rule rank ``rank`` was corrected by (None: no correction)."""
        other = self.rank_rules.get(rank)
        return other[0] if other is not None else self.rule

    def _shares(self, ranks: list[int]) -> dict[int, float]:
        """Per rank corrected to its CPU time (``to_clean``): its clean run-queue time over its clean CPU time."""
        return {r: share for r in ranks if (share := self.figures[r].wait_share) is not None
                and self.rule_of(r) in (DEFAULT_RULE, *SEGMENT_RULES)}

    def oversubscribed(self) -> list[int]:
        """The corrected ranks whose recording machine was oversubscribed (:data:`OVERSUBSCRIBED_SHARE`)."""
        return sorted(r for r in self._shares(sorted(self.factors)) if self.figures[r].oversubscribed)

    def _oversubscribed(self, ranks: list[int]) -> str:
        """"; rank(s) ... waited for a CPU ..." for the ranks corrected to their CPU time whose recording machine
        was oversubscribed (:data:`OVERSUBSCRIBED_SHARE`); empty when none was."""
        shares = self._shares(ranks)
        over = [r for r in self.oversubscribed() if r in shares]
        if not over:
            return ""
        low, high = min(shares[r] for r in over), max(shares[r] for r in over)
        span = f"{high:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"{low * 100:.0f}-{high:.0%}"
        return (f"; rank(s) {over} waited for a CPU {span} as long as they ran per clean iteration (the recording "
                f"machine oversubscribed): their compute is their CPU time, as on a node with a CPU for each")

    def worker_doc(self) -> dict[str, Any] | None:
        """What a live worker needs to apply the same correction (:func:`from_worker_doc`); None: none."""
        if self.rule is None:
            return None
        return {"rule": self.rule, "use_lean": self.use_lean,
                "figures": {str(r): [f.clean_cpu_us, f.captured_cpu_us, f.clean_wall_us,
                                     list(f.clean_segments_us) if f.clean_segments_us is not None else None,
                                     list(f.clean_segments_runnable_us)
                                     if f.clean_segments_runnable_us is not None else None]
                            for r, f in sorted(self.figures.items())}}

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "why_not": self.why_not or None, "use_lean": self.use_lean,
                "lean_timed": {str(r): {"lean": n, "host_operators": t} for r, (n, t) in sorted(self.lean.items())},
                "factors": {str(r): f for r, f in sorted(self.factors.items())}, "uncorrected": self.uncorrected,
                "rank_rules": {str(r): {"rule": rule, "why": why}
                               for r, (rule, why) in sorted(self.rank_rules.items())},
                "rule_by_rank": {str(r): self.rule_of(r) for r in sorted(self.factors)},
                "clean_run_queue_us": {str(r): f.clean_run_queue_us for r, f in sorted(self.figures.items())},
                "oversubscribed": self.oversubscribed(),
                "clean_cpu_us": {str(r): f.clean_cpu_us for r, f in sorted(self.figures.items())},
                "clean_wall_us": {str(r): f.clean_wall_us for r, f in sorted(self.figures.items())},
                "captured_cpu_us": {str(r): f.captured_cpu_us for r, f in sorted(self.figures.items())},
                "clean_segments": {str(r): len(f.clean_segments_us) if f.clean_segments_us else None
                                   for r, f in sorted(self.figures.items())},
                "segment_fallbacks": {str(r): {str(j + 1): why for j, why in sorted(w.items())}
                                      for r, w in sorted(self.segment_fallbacks.items())}}


def _median(values: object) -> float | None:
    if not isinstance(values, list) or not values or len(values) > _MAX_SAMPLES:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        return None
    return float(statistics.median(values))


def read_figures(observed: Mapping[str, Any] | None) -> dict[int, RankFigures]:
    """Each rank's :class:`RankFigures` from a manifest's ``observed`` (untrusted: a malformed or missing entry is
    left out, so that rank is not corrected)."""
    raw = observed.get(THREAD_CPU_KEY) if isinstance(observed, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    walls = observed.get("per_rank_us") if isinstance(observed, Mapping) else None
    walls = walls if isinstance(walls, Mapping) else {}
    out: dict[int, RankFigures] = {}
    for rank, entry in raw.items():
        if not (isinstance(rank, str) and rank.isascii() and rank.isdigit() and len(rank) <= 9
                and isinstance(entry, Mapping)):
            continue
        clean, captured = _median(entry.get("clean")), _median(entry.get("captured"))
        if clean is not None and captured is not None and clean > 0 and captured > 0:
            wall = _median(walls.get(rank))
            share = entry.get("cpu_share")
            quota = float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) and \
                math.isfinite(share) and 0 < share <= 4096 else None
            out[int(rank)] = RankFigures(clean, captured, _median(entry.get("clean_run_queue")),
                                         wall if wall is not None and wall > 0 else None,
                                         segment_medians(entry.get("clean_segments")),
                                         segment_medians(entry.get("clean_segments"), runnable=True), quota)
    return out


def plan_correction(mode: str, observed: Mapping[str, Any] | None) -> Correction:
    """The correction ``mode`` (:data:`MODES`) asks for, with the figures of a manifest's ``observed`` (None: a
    bare ET)."""
    if mode not in MODES:
        raise UsageError(f"--set replay.profiler_correction={mode!r}: must be one of {', '.join(MODES)}")
    if mode == "off":
        return Correction(None, why_not="replay.profiler_correction=off")
    figures = read_figures(observed)
    if not figures:
        return Correction(None, why_not="the bundle carries no clean/captured CPU times (observed."
                                        f"{THREAD_CPU_KEY}: recorded by an older nbox, imported, or a bare ET)")
    return Correction(DEFAULT_RULE if mode == "on" else mode, figures, use_lean=mode == "on")


def from_worker_doc(doc: Mapping[str, Any] | None) -> Correction:
    """The :class:`Correction` of :meth:`Correction.worker_doc` (written by the parent: trusted)."""
    if not doc:
        return Correction(None, why_not="none asked")
    def floats(v: list[Any], k: int) -> tuple[float, ...] | None:
        return tuple(map(float, v[k])) if len(v) > k and v[k] else None

    return Correction(str(doc["rule"]), {int(r): RankFigures(float(v[0]), float(v[1]), None,
                                                             float(v[2]) if len(v) > 2 and v[2] else None,
                                                             floats(v, 3), floats(v, 4))
                                         for r, v in doc["figures"].items()}, use_lean=bool(doc.get("use_lean", True)))


def _host_compute(g: RankGraph) -> list[bool]:
    """Per node: a compute node on a host thread (the nodes the thread's CPU time speaks for)."""
    host = [name.startswith("thread:") for name in g.resources]
    return [k == COMPUTE and host[res] for k, res in zip(g.kind, g.resource, strict=True)]


def correct_durations(durations: Sequence[float], corrected: Sequence[bool], iteration: Sequence[int],
                      figures: RankFigures, rule: str) -> list[float]:
    """``durations`` with those flagged in ``corrected`` corrected by ``rule`` (module docstring); ``iteration``:
    each node's captured iteration (0-based), for ``per_op``'s count of nodes per iteration."""
    if rule not in RULES or rule == DEVICE_RULE or rule in SEGMENT_RULES:
        raise UsageError(f"profiler correction rule {rule!r}: must be one of proportional, per_op, to_clean "
                         "(to_wall scales gaps too, segments cuts at the comm nodes: correct_graph)")
    out = list(durations)
    if rule == "to_clean":
        totals: dict[int, float] = {}
        for d, c, it in zip(out, corrected, iteration, strict=True):
            if c:
                totals[it] = totals.get(it, 0.0) + d
        scale = {it: figures.clean_cpu_us / t for it, t in totals.items() if t > 0}
        return [d * scale[it] if c and it in scale else d for d, c, it in zip(out, corrected, iteration, strict=True)]
    if figures.overhead_us <= 0:
        return out
    if rule == "proportional":
        factor = figures.clean_cpu_us / figures.captured_cpu_us
        return [d * factor if c else d for d, c in zip(out, corrected, strict=True)]
    counts: dict[int, int] = {}
    for d, c, it in zip(out, corrected, iteration, strict=True):
        if c and d > 0:
            counts[it] = counts.get(it, 0) + 1
    for i, (d, c, it) in enumerate(zip(out, corrected, iteration, strict=True)):
        if c and d > 0:
            out[i] = max(d * PER_OP_FLOOR, d - figures.overhead_us / counts[it])
    return out


def correct_graph(g: RankGraph, figures: RankFigures, rule: str,
                  fallbacks: dict[int, str] | None = None) -> tuple[RankGraph, float]:
    """A copy of ``g`` with its host compute corrected by ``rule``, and the effective factor (corrected / recorded
    host compute; 1.0 when it has none). A lean-timed node (nbox_record/sources/leantiming.py, measured without the
    observer) is left as it is. ``fallbacks`` (``segments``): filled with the captured iterations corrected by
    ``to_clean`` instead, and why."""
    labels, _, _ = captured_iterations(g)
    if rule == "to_wall":
        return _to_wall(g, figures, labels)
    flags = [h and not lean for h, lean in zip(_host_compute(g), g.lean_flags(), strict=True)]
    if rule == DEFAULT_RULE or rule in SEGMENT_RULES:  # the training thread's to its clean time; others: proportional
        main = training_thread(g)
        on_main = [c and g.resource[i] == main for i, c in enumerate(flags)]
        new = correct_durations(g.duration_us, on_main, labels, figures, DEFAULT_RULE)
        if rule in SEGMENT_RULES:
            cuts = [COLLECTIVE <= k <= RECV and res == main for k, res in zip(g.kind, g.resource, strict=True)]
            clean = figures.clean_segments_runnable_us if rule == RUNNABLE_RULE else figures.clean_segments_us
            new, why = scale_segments(g.duration_us, on_main, cuts, labels, clean, new)
            if fallbacks is not None:
                fallbacks.update(why)
        new = correct_durations(new, [c and not m for c, m in zip(flags, on_main, strict=True)], labels, figures,
                                "proportional")
    else:
        new = correct_durations(g.duration_us, flags, labels, figures, rule)
    before = sum(d for d, c in zip(g.duration_us, flags, strict=True) if c)
    after = sum(d for d, c in zip(new, flags, strict=True) if c)
    return dataclasses.replace(g, duration_us=new), (after / before if before > 0 else 1.0)


def _to_wall(g: RankGraph, figures: RankFigures, labels: Sequence[int]) -> tuple[RankGraph, float]:
    """:func:`correct_graph` under ``to_wall`` (module docstring): the host's recorded work in captured iteration j
    (every compute node on a host thread, lean-timed or not, its gap, and what issuing a collective or send/recv
    cost the thread that issued it, also where the walk charges the issue to the GPU stream its kernel ran on)
    times ``min(1, clean_wall / host_j)``, host_j its recorded sum."""
    wall = figures.clean_wall_us
    if wall is None:
        raise UsageError("the to_wall rule needs the clean iterations' wall time (observed.per_rank_us), which "
                         f"the bundle does not carry for rank {g.rank}")
    on_host = [name.startswith("thread:") for name in g.resources]
    comm = [COLLECTIVE <= k <= RECV for k in g.kind]
    host = [on_host[res] or c for res, c in zip(g.resource, comm, strict=True)]
    compute = _host_compute(g)
    gaps = g.gaps_us()
    issue = g.issue_us if len(g.issue_us) == len(g.ids) else [0.0] * len(g.ids)
    totals: dict[int, float] = {}
    for i, h in enumerate(host):
        if h:
            own = (g.duration_us[i] if compute[i] else 0.0) + gaps[i] + (issue[i] if comm[i] else 0.0)
            totals[labels[i]] = totals.get(labels[i], 0.0) + own
    scale = [min(1.0, wall / totals[labels[i]]) if host[i] and totals.get(labels[i], 0.0) > 0 else 1.0
             for i in range(len(g))]
    dur = [d * f if c else d for d, f, c in zip(g.duration_us, scale, compute, strict=True)]
    new_gaps = [x * f for x, f in zip(gaps, scale, strict=True)]
    new_issue = [x * f if c else x for x, f, c in zip(issue, scale, comm, strict=True)]
    before = sum(totals.values())
    after = sum((d if c else 0.0) + x + (u if m else 0.0)
                for d, x, u, c, m, h in zip(dur, new_gaps, new_issue, compute, comm, host, strict=True) if h)
    new = dataclasses.replace(g, duration_us=dur,
                              gap_us=new_gaps if len(g.gap_us) == len(g.ids) else g.gap_us,
                              issue_us=new_issue if len(g.issue_us) == len(g.ids) else g.issue_us)
    return new, (after / before if before > 0 else 1.0)


def training_thread(g: RankGraph) -> int | None:
    """The resource index of the host thread with the most recorded compute (None: no host compute)."""
    totals: dict[int, float] = {}
    for k, res, d in zip(g.kind, g.resource, g.duration_us, strict=True):
        if k == COMPUTE and g.resources[res].startswith("thread:"):
            totals[res] = totals.get(res, 0.0) + d
    return max(totals, key=lambda r: (totals[r], -r)) if totals else None


def rank_rule(rank: int, g: RankGraph, correction: Correction) -> tuple[str, str] | None:
    """The rule for ``rank`` (its graph ``g``) when it is not ``correction.rule``, and why (``on`` only: a named
    rule applies to every rank): :data:`DEVICE_RULE` for a rank with device compute whose clean wall time the
    bundle carries and whose captured iterations are marked, else :data:`FALLBACK_RULE` for it; FALLBACK_RULE for a
    rank with lean-timed host operators or unmarked captured iterations (module docstring); None when the
    correction's rule applies."""
    if correction.rule != DEFAULT_RULE or not correction.use_lean:
        return None
    device = [not name.startswith("thread:") for name in g.resources]
    if any(k == COMPUTE and device[res] for k, res in zip(g.kind, g.resource, strict=True)):
        figures = correction.figures.get(rank)
        if figures is None or figures.clean_wall_us is None:
            return FALLBACK_RULE, "device compute, no clean wall time"
        if not captured_iterations(g)[2]:  # one span of k iterations would be scaled to one clean iteration
            return FALLBACK_RULE, "device compute, captured iterations not marked"
        return DEVICE_RULE, "device compute"
    if correction.lean.get(rank, (0, 0))[0]:
        return FALLBACK_RULE, "lean-timed operators"
    if not captured_iterations(g)[2]:
        return FALLBACK_RULE, "captured iterations not marked"
    figures = correction.figures.get(rank)
    if figures is not None and figures.clean_segments_runnable_us and not figures.oversubscribed:
        return RUNNABLE_RULE, "clean time on or waiting for a CPU per segment between collectives"
    if figures is not None and figures.clean_segments_us:
        why = "; the machine oversubscribed: CPU time only" if figures.oversubscribed else ""
        return SEGMENT_RULE, f"clean time per segment between collectives{why}"
    return None


def correct_graphs(graphs: Mapping[int, RankGraph], correction: Correction) -> dict[int, RankGraph]:
    """``graphs`` with each rank that has figures corrected (:func:`correct_graph`); fills ``correction.factors``.
    A rank without figures is kept as recorded (and named in the correction's line)."""
    for rank, g in graphs.items():
        host = _host_compute(g)
        n_lean = sum(1 for h, lean in zip(host, g.lean_flags(), strict=True) if h and lean)
        if n_lean:
            correction.lean[rank] = (n_lean, sum(host))
    if correction.rule is not None and not correction.use_lean:
        graphs = {rank: g.profiled() for rank, g in graphs.items()}
    out = dict(graphs)
    if correction.rule is None:
        return out
    for rank, g in graphs.items():
        figures = correction.figures.get(rank)
        if figures is not None:
            other = rank_rule(rank, g, correction)
            if other is not None:
                correction.rank_rules[rank] = other
            rule = other[0] if other else correction.rule
            fallbacks: dict[int, str] = {}
            out[rank], correction.factors[rank] = correct_graph(g, figures, rule, fallbacks)
            if rule in SEGMENT_RULES:
                correction.segment_fallbacks[rank] = fallbacks
        else:
            correction.uncorrected.append(rank)
    if not correction.factors:
        correction.why_not = (f"the bundle's CPU times are for ranks {sorted(correction.figures)}, none of them "
                              f"replayed")
        correction.rule = None
        correction.uncorrected = []
    return out
