"""The replay report: recorded vs baseline vs what-if, the breakdown, the top collectives, as text and JSON.

Times are microseconds (JSON) or one unit per column (text, :mod:`nbox_trace.units`). The breakdown is
one rank's partition of the median iteration (:mod:`nbox_replay.virtual.breakdown`, :mod:`nbox_replay.report.summary`);
its four parts add up to the iteration time:

* ``compute``: some compute operation of the rank runs (streams and threads at once count once);
* ``exposed``: no compute, and a communication of the rank is running (its modeled span);
* ``waiting``: none of the above, and a collective the rank issued has not started because a peer, or the
  group's previous collective, is late;
* ``idle``: the rest;
* ``overlapped`` (beside the sum): communication running while the rank computes.

The ``rank`` column names the rank (the slowest of the median iteration unless ``--rank`` picked one).

The text opens with the answer (:meth:`ReplayReport.answer`, words from :mod:`emulator_core.scenario.question`): the
what-if, labelled by what it changed, its iteration time, that time against the baseline's in words, and the
share of it that is exposed communication. On the real clock, where the paired live repetitions' p10-p90 of the
what-if over the baseline holds 1.0, the answer says that the two differ by no more than this machine's noise
instead of a ratio (which would change from run to run). The JSON document carries the same facts under ``answer``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from emulator_core.scenario import WhatIfWorld, compare, share_words
from nbox_replay.report.summary import RunSummary, speedup
from nbox_trace.units import fit_label, format_bytes, format_in, format_us, time_unit

if TYPE_CHECKING:
    from nbox_replay.inputs import Correction
    from nbox_replay.report.truth import Truth

__all__ = ["REPORT_SCHEMA", "ReplayReport"]

REPORT_SCHEMA = "nbox.replay/1"


@dataclass
class ReplayReport:
    """Everything ``nbox replay`` says."""

    source: str
    recorded_world: int
    device: str
    ranks: list[int]
    compute: str
    clock: str
    observed: dict[str, Any] | None
    baseline: RunSummary
    what_if: RunSummary
    coverage: float | None = None  # share of recorded compute time re-executed live
    fallbacks: dict[str, int] = field(default_factory=dict)
    unpriced: int = 0
    notices: list[str] = field(default_factory=list)
    timelines: list[str] = field(default_factory=list)
    world: WhatIfWorld | None = None  # the what-if's world size and where it came from
    paired_speedups: list[float] | None = None  # real clock: per interleaved pair, baseline / what-if time
    mesh_lines: list[str] = field(default_factory=list)  # the recorded mesh, and the what-if's (inputs/meshing.py)
    mesh: dict[str, Any] | None = None  # the same as JSON
    profiler: Correction | None = None  # how recorded compute was corrected for the profiler (inputs/profiler.py)
    host_work: dict[str, Any] | None = None  # live compute padded for host work (live/hostwork.py): "line", ranks
    changes: list[str] = field(default_factory=list)  # what the what-if changed, in words (scenario.question)
    truth: Truth | None = None  # --truth: the prediction against a recording at the what-if's scale (truth.py)

    def paired_spread(self) -> dict[str, float] | None:
        """The paired live speed-ups' median and p10-p90 (inclusive quantiles), or None (virtual clock)."""
        xs = sorted(self.paired_speedups or [])
        if not xs:
            return None
        p10, p90 = (statistics.quantiles(xs, n=10, method="inclusive")[i] for i in (0, -1)) if len(xs) > 1 \
            else (xs[0], xs[0])
        return {"median": statistics.median(xs), "p10": p10, "p90": p90, "pairs": len(xs)}

    @property
    def speedup(self) -> float | None:
        """The what-if's speed-up over the baseline (:func:`nbox_replay.report.summary.speedup`; > 1: faster; None:
        undefined, a zero time)."""
        return speedup(self.baseline.median_us, self.what_if.median_us)

    def run_label(self, run: RunSummary) -> str:
        """A row's label: the what-if by what it changed, the baseline by its scenario and world size."""
        if run is self.what_if:
            return f"what-if ({', '.join(self.changes)})" if self.changes else f"what-if ({run.world_size} ranks)"
        return f"{run.label} ({run.scenario}, {run.world_size} rank{'s' if run.world_size != 1 else ''})"

    def answer(self) -> dict[str, Any]:
        """The report's first line and its facts: the what-if's median iteration time, against the baseline's
        in words, and the share of it the shown rank spent in exposed communication (when measured)."""
        wi, base = self.what_if, self.baseline
        label = self.run_label(wi)
        cmp = compare(wi.median_us, base.median_us)
        exposed = wi.exposed_comm_us if wi.breakdown is not None else math.nan
        share = share_words(exposed, wi.median_us, "exposed communication")
        spread = self.paired_spread()
        within_noise = spread is not None and spread["pairs"] > 1 and spread["p10"] <= 1.0 <= spread["p90"]
        if within_noise and cmp is not None and spread is not None:
            against = (f"no difference from the baseline's {format_us(base.median_us)} beyond this machine's noise "
                       f"(paired repetitions {spread['p10']:.2f}x-{spread['p90']:.2f}x)")
        else:
            against = (f"{cmp.words} the baseline's {format_us(base.median_us)}" if cmp is not None else
                       f"no ratio to the baseline's {format_us(base.median_us)} (an iteration time of 0)")
        line = f"{label}: {format_us(wi.median_us)} per iteration, {against}" + (f"; {share}" if share else "")
        return {"line": line, "what_if_label": label, "changes": list(self.changes),
                "what_if_iteration_us": wi.median_us, "baseline_iteration_us": base.median_us,
                "ratio": cmp.ratio if cmp else None,
                "direction": ("within noise" if within_noise else cmp.direction) if cmp else None,
                "exposed_share": exposed / wi.median_us if share else None}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "answer": self.answer(), "source": self.source,
                "recorded_world_size": self.recorded_world,
                "device": self.device, "ranks_replayed": self.ranks, "compute": self.compute, "clock": self.clock,
                "observed_iteration_us": self.observed, "baseline": self.baseline.to_dict(),
                "what_if": self.what_if.to_dict(), "speedup": self.speedup, "coverage": self.coverage,
                "fallbacks": self.fallbacks, "unpriced_collectives": self.unpriced, "notices": self.notices,
                "timelines": self.timelines, "what_if_world": self.world.to_dict() if self.world else None,
                "mesh": self.mesh, "profiler_correction": self.profiler.to_dict() if self.profiler else None,
                "host_work": self.host_work, "truth": self.truth.to_dict() if self.truth is not None else None,
                "paired_speedup": None if self.paired_speedups is None else
                {**(self.paired_spread() or {}), "values": self.paired_speedups}}

    def format_text(self) -> str:
        """The report for people (stdout): one time unit per column, IEC bytes, labels cut at a word."""
        runs = (self.baseline, self.what_if)
        obs = self.observed if self.observed and self.observed.get("median") is not None else None
        lines = [self.answer()["line"],
                 f"replay of {self.source}: recorded on {self.device} at world size {self.recorded_world}; "
                 f"ranks {','.join(map(str, self.ranks))} replayed, compute {self.compute}, clock {self.clock}"]
        if self.world is not None:
            lines.append(f"what-if world size: {self.world.describe()}")
        lines += self.mesh_lines
        lines += [f"notice: {n}" for n in self.notices]
        if self.profiler is not None:
            lines.append(self.profiler.describe())
        if self.host_work is not None:
            lines.append(str(self.host_work["line"]))
        b = self.baseline
        lines.append(f"iterations: {b.iterations_note or 'one pass over the capture each'}; "
                     f"{len(b.iteration_us)} per run, the median one shown")
        values = [v for run in runs for v in (*run.iteration_us, run.compute_us, run.exposed_comm_us, run.waiting_us,
                                              run.idle_us, run.overlapped_comm_us) if math.isfinite(v)]
        if obs is not None:
            values += [obs["median"], obs.get("p10", obs["median"]), obs.get("p90", obs["median"])]
        unit = time_unit(values)

        def t(v: float) -> str:
            return format_in(v, unit) if math.isfinite(v) else "-"

        u = unit[0]
        width = min(max(36, *(len(self.run_label(run)) for run in runs)), 56)
        lines.append(f"{'':{width}} {'iteration ' + u:>13} {'p10-p90 ' + u:>17} {'rank':>4} {'compute':>9} "
                     f"{'exposed':>9} {'waiting':>9} {'idle':>9} | {'overlapped':>10}")
        if obs is not None:
            spread = f"{t(obs.get('p10', obs['median']))}-{t(obs.get('p90', obs['median']))}"
            lines.append(f"{'recorded (observed, un-instrumented)':{width}} {t(obs['median']):>13} {spread:>17}")
        for run in runs:
            p10, p90 = run.spread_us()
            name = fit_label(self.run_label(run), width)
            rank = str(run.rank) if run.breakdown is not None else "-"
            lines.append(f"{name:{width}} {t(run.median_us):>13} {t(p10) + '-' + t(p90):>17} {rank:>4} "
                         f"{t(run.compute_us):>9} {t(run.exposed_comm_us):>9} {t(run.waiting_us):>9} "
                         f"{t(run.idle_us):>9} | {t(run.overlapped_comm_us):>10}")
        for run in runs:
            shown = ", ".join(t(v) for v in run.iteration_us[:12]) + (", ..." if len(run.iteration_us) > 12 else "")
            lines.append(f"{run.label} iterations ({u}): {shown}")
        if any(run.breakdown is None for run in runs):
            lines.append("breakdown: - where the run's own intervals were not measured (the model's parts would "
                         "not describe the measured time)")
        if obs is not None and obs["median"]:
            err = (self.baseline.median_us - obs["median"]) / obs["median"] * 100
            lines.append(f"baseline vs recorded: {err:+.1f}%")
        if self.truth is not None:
            lines += self.truth.lines(t)
        if (ps := self.paired_spread()) is not None:
            inside = ps["p10"] <= 1.0 <= ps["p90"]
            lines.append(f"paired live repetitions: what-if vs baseline {ps['median']:.2f}x, p10-p90 "
                         f"{ps['p10']:.2f}x-{ps['p90']:.2f}x over {ps['pairs']} interleaved pairs ("
                         + ("1.00x inside: no difference beyond this machine's noise)" if inside else
                            "1.00x outside: a difference beyond this machine's noise)"))
        tops = self.what_if.top_collectives
        if tops:
            cu = time_unit([v for c in tops for v in (c["modeled_us"], c.get("recorded_us") or 0.0, c["exposed_us"],
                                                      c["waiting_us"])])
            model = " of the virtual model" if self.clock == "real" else ""
            lines.append(f"top collectives{model} of rank {self.what_if.rank} in the median iteration, by exposed + "
                         f"waiting time (what-if; {cu[0]}; recorded: the same calls' time in the recording, "
                         f"from their last arrival):")
            lines.append(f"  {'collective':<14} {'size':>10} {'count':>5} {'algorithm':<20} {'modeled':>9} "
                         f"{'recorded':>9} {'exposed':>9} {'waiting':>9}  group")
            for c in tops:
                rec = c.get("recorded_us")
                lines.append(f"  {fit_label(c['collective'], 14):<14} {format_bytes(c['bytes']):>10} {c['count']:>5} "
                             f"{fit_label(c['algorithm'], 20):<20} {format_in(c['modeled_us'], cu):>9} "
                             f"{'-' if rec is None else format_in(rec, cu):>9} "
                             f"{format_in(c['exposed_us'], cu):>9} {format_in(c['waiting_us'], cu):>9}  "
                             f"{c['process_group']!r}")
        for rule, n in sorted(self.what_if.rules.items()):
            lines.append(f"size rule: {rule} ({n} answered)")
        if self.coverage is not None:
            fb = ", ".join(f"{k} x{v}" for k, v in sorted(self.fallbacks.items(), key=lambda kv: -kv[1])[:6])
            lines.append(f"live compute coverage: {self.coverage * 100:.1f}% of recorded compute time"
                         + (f"; recorded durations for: {fb}" if fb else ""))
        if self.unpriced:
            lines.append(f"{self.unpriced} communication node(s) without comm_type/comm_size: recorded durations")
        lines += [f"timeline: {t}" for t in self.timelines]
        return "\n".join(lines)
