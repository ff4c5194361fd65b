"""The replay report: recorded vs baseline vs what-if, the breakdown, the top collectives, as text and JSON.

Times are microseconds. The breakdown is the slowest replayed rank's, from the virtual-time model of
the same graphs (it is exact for ``--clock virtual``; for ``--clock real`` it explains the measured time):

* ``compute``: the compute nodes' durations (recorded, divided by the compute scale and stretched for
  stragglers);
* ``exposed comm``: time the rank's threads waited for a collective to complete;
* ``overlapped comm``: the rest of the collectives' modeled time, hidden behind compute;
* ``idle``: iteration time minus compute minus exposed comm (waiting for other ranks, issue costs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from nbox_replay.summary import RunSummary, speedup

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
    paired_speedups: list[float] | None = None  # real clock: per interleaved pair, baseline / what-if time

    def paired_spread(self) -> dict[str, float] | None:
        """The paired live speed-ups' median and p10-p90 (inclusive quantiles), or None (virtual clock)."""
        xs = sorted(self.paired_speedups or [])
        if not xs:
            return None
        p10, p90 = (statistics.quantiles(xs, n=10, method="inclusive")[i] for i in (0, -1)) if len(xs) > 1 \
            else (xs[0], xs[0])
        return {"median": statistics.median(xs), "p10": p10, "p90": p90, "pairs": len(xs)}

    @property
    def speedup(self) -> float:
        """The what-if's speed-up over the baseline (:func:`nbox_replay.summary.speedup`; > 1: faster)."""
        return speedup(self.baseline.median_us, self.what_if.median_us)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "source": self.source, "recorded_world_size": self.recorded_world,
                "device": self.device, "ranks_replayed": self.ranks, "compute": self.compute, "clock": self.clock,
                "observed_iteration_us": self.observed, "baseline": self.baseline.to_dict(),
                "what_if": self.what_if.to_dict(), "speedup": self.speedup, "coverage": self.coverage,
                "fallbacks": self.fallbacks, "unpriced_collectives": self.unpriced, "notices": self.notices,
                "timelines": self.timelines,
                "paired_speedup": None if self.paired_speedups is None else
                {**(self.paired_spread() or {}), "values": self.paired_speedups}}

    def format_text(self) -> str:
        ms = 1000.0
        lines = [f"replay of {self.source}: recorded on {self.device} at world size {self.recorded_world}; "
                 f"ranks {','.join(map(str, self.ranks))} replayed, compute {self.compute}, clock {self.clock}"]
        lines += [f"notice: {n}" for n in self.notices]
        head = (f"{'':34} {'iteration ms':>12} {'p10-p90 ms':>15} {'compute':>9} {'exp.comm':>9} {'ovl.comm':>9} "
                f"{'idle':>8}")
        lines.append(head)
        if self.observed and self.observed.get("median") is not None:
            o = self.observed
            spread = f"{o.get('p10', o['median']) / ms:.2f}-{o.get('p90', o['median']) / ms:.2f}"
            lines.append(f"{'recorded (observed, un-instrumented)':34} {o['median'] / ms:12.2f} {spread:>15}")
        for run in (self.baseline, self.what_if):
            p10, p90 = run.spread_us()
            name = f"{run.label} W={run.world_size} ({run.scenario})"[:34]
            lines.append(f"{name:34} {run.median_us / ms:12.2f} {f'{p10 / ms:.2f}-{p90 / ms:.2f}':>15} "
                         f"{run.compute_us / ms:9.2f} {run.exposed_comm_us / ms:9.2f} "
                         f"{run.overlapped_comm_us / ms:9.2f} {run.idle_us / ms:8.2f}")
        if self.observed and self.observed.get("median"):
            err = (self.baseline.median_us - self.observed["median"]) / self.observed["median"] * 100
            lines.append(f"baseline vs recorded: {err:+.1f}%")
        faster = "faster" if self.speedup > 1 else ("slower" if self.speedup < 1 else "the same")
        lines.append(f"what-if vs baseline: {self.speedup:.3f}x ({faster})")
        if (ps := self.paired_spread()) is not None:
            inside = ps["p10"] <= 1.0 <= ps["p90"]
            lines.append(f"paired live repetitions: what-if vs baseline {ps['median']:.2f}x, p10-p90 "
                         f"{ps['p10']:.2f}x-{ps['p90']:.2f}x over {ps['pairs']} interleaved pairs ("
                         + ("1.00x inside: no difference beyond this machine's noise)" if inside else
                            "1.00x outside: a difference beyond this machine's noise)"))
        if self.what_if.top_collectives:
            lines.append("top collectives by exposed time, per iteration (what-if):")
            for c in self.what_if.top_collectives:
                lines.append(f"  {c['collective']:<14} {c['bytes'] / 1e6:10.3f} MB x{c['count']:<3} "
                             f"{c['algorithm']:<20} modeled {c['modeled_us'] / ms:8.3f} ms  exposed "
                             f"{c['exposed_us'] / ms:8.3f} ms  (group {c['process_group']!r})")
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
