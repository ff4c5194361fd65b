"""The one summary of a replayed run (virtual or live), used by ``nbox replay``, ``nbox sweep`` and the reports.

Definitions (times in microseconds):

* a run's **iteration time** for one repetition is the slowest replayed rank's time for it (the job's
  iteration: it ends when its last rank does); the run's figure is the **median over the repetitions** of
  those per-repetition times (:attr:`RunSummary.median_us`);
* the **breakdown** (compute, exposed comm, overlapped comm) is the slowest rank's: the rank with the
  largest median of its own iteration times (the lowest rank on a tie), its totals divided by the
  number of repetitions (per iteration);
* the **speed-up** of a run over a reference run is the reference's iteration time divided by the run's
  (:func:`speedup`; > 1: the run is faster). ``nbox replay``'s reference is its baseline, ``nbox
  sweep``'s the grid's first point.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from nbox_replay.virtual import SimResult

__all__ = ["RunSummary", "speedup", "summarize_sim"]


def speedup(reference_us: float, run_us: float) -> float:
    """``reference_us / run_us`` (> 1: the run is faster); two zero times are the same speed (1.0), a zero
    run time after a non-zero reference is infinitely faster (``inf``)."""
    if run_us > 0:
        return reference_us / run_us
    return 1.0 if reference_us == 0 else math.inf


@dataclass
class RunSummary:
    """One replayed run (module docstring). ``iteration_us``: per repetition, the slowest rank's time;
    the breakdown is per iteration, of ``slowest_rank``."""

    label: str
    scenario: str
    world_size: int
    clock: str
    iteration_us: list[float]
    compute_us: float
    exposed_comm_us: float
    overlapped_comm_us: float
    slowest_rank: int
    top_collectives: list[dict[str, Any]] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)
    modeled_iteration_us: float | None = None  # the virtual model's time, when the run itself was real-clock
    waiting_us: float = 0.0  # waiting for peers (nbox_replay.breakdown); measured in a real-clock run

    @property
    def median_us(self) -> float:
        """The run's iteration time: the median over the repetitions (module docstring)."""
        return statistics.median(self.iteration_us)

    @property
    def idle_us(self) -> float:
        return max(0.0, self.median_us - self.compute_us - self.exposed_comm_us - self.waiting_us)

    def spread_us(self) -> tuple[float, float]:
        xs = sorted(self.iteration_us)
        if len(xs) < 2:
            return xs[0], xs[0]
        q = statistics.quantiles(xs, n=10, method="inclusive")
        return q[0], q[-1]

    def to_dict(self) -> dict[str, Any]:
        p10, p90 = self.spread_us()
        return {"label": self.label, "scenario": self.scenario, "world_size": self.world_size, "clock": self.clock,
                "iteration_us": {"median": self.median_us, "p10": p10, "p90": p90, "values": self.iteration_us},
                "breakdown_us": {"compute": self.compute_us, "exposed_comm": self.exposed_comm_us,
                                 "overlapped_comm": self.overlapped_comm_us, "waiting_for_peers": self.waiting_us,
                                 "idle": self.idle_us},
                "modeled_iteration_us": self.modeled_iteration_us,
                "top_collectives": self.top_collectives, "retarget_rules": self.rules}


def summarize_sim(sim: SimResult, *, label: str, scenario: str, top: int = 5) -> RunSummary:
    """A :class:`RunSummary` of a virtual replay (module docstring); its ``top`` collectives by exposed time,
    per iteration."""
    iters = sim.iteration_us()
    slowest = max(sim.ranks.values(), key=lambda r: (statistics.median(r.iteration_us), -r.rank))
    reps = max(1, len(iters))
    by_key: dict[tuple[str, str, float, str, str], dict[str, Any]] = {}
    rules: dict[str, int] = {}
    for c in sim.collectives:
        rules[f"{c.collective}: {c.rule}"] = rules.get(f"{c.collective}: {c.rule}", 0) + 1
        key = (c.pg, c.collective, c.nbytes, c.algorithm, c.rule)
        agg = by_key.setdefault(key, {"process_group": c.pg, "collective": c.collective, "bytes": c.nbytes,
                                      "algorithm": c.algorithm, "rule": c.rule, "count": 0,
                                      "modeled_us": 0.0, "exposed_us": 0.0})
        agg["count"] += 1
        agg["modeled_us"] += c.end_us - c.start_us
        agg["exposed_us"] += c.exposed_us / max(1, len(sim.ranks))
    tops = sorted(by_key.values(), key=lambda a: (-a["exposed_us"], -a["modeled_us"]))[:top]
    for a in tops:  # per iteration
        a["count"] //= reps
        a["modeled_us"] /= reps
        a["exposed_us"] /= reps
    return RunSummary(label, scenario, sim.world_size, "virtual", iters, slowest.compute_us / reps,
                      slowest.exposed_comm_us / reps, slowest.overlapped_comm_us / reps, slowest.rank, tops, rules)
