"""The one summary of a replayed run (virtual or live), used by ``nbox replay``, ``nbox sweep`` and the reports.

Definitions (times in microseconds):

* an **iteration** is a captured iteration as the recorder marked it in the trace, once per pass over the
  capture (``--iterations`` passes); a trace without marks has one iteration per pass
  (:func:`nbox_replay.inputs.graph.captured_iterations`, :attr:`RunSummary.iterations_note` says which);
* the job's **iteration time** of iteration ``j``: its window runs from the end of iteration ``j - 1`` to
  the moment its last rank ends it (:func:`nbox_replay.virtual.breakdown.job_windows`; the windows add up to the
  run's wall time);
* the run's figure is the **median iteration** (:func:`nbox_replay.virtual.breakdown.median_index`; with an even
  count the lower middle one): :attr:`RunSummary.median_us`;
* the **breakdown** is one rank's partition of that same median iteration's window
  (:func:`nbox_replay.virtual.breakdown.partition`: compute, exposed communication, waiting for peers and idle add
  up to the iteration time; overlapped communication beside them). The rank is the one that ended the
  median iteration last (the slowest; the lowest on a tie) unless the caller picks one (``--rank``);
  :attr:`RunSummary.breakdowns` holds that rank's breakdown of every iteration;
* the **top collectives** are that rank's, in that iteration, with the same definition (their exposed and
  waiting figures add up to the breakdown's);
* the **speed-up** of a run over a reference run is the reference's iteration time divided by the run's
  (:func:`speedup`; > 1: the run is faster). ``nbox replay``'s reference is its baseline, ``nbox
  sweep``'s the grid's first point. A ratio over a zero time means nothing (a trace with no durations
  replays in 0 us): it is ``None``, written ``null`` in JSON, an empty CSV cell and ``n/a`` in text
  (:func:`format_speedup`), never an infinity.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from nbox_replay.virtual import Breakdown, SimResult, median_index, partition, slowest_rank
from nbox_trace.errors import InvalidInputError

__all__ = ["RunSummary", "format_speedup", "speedup", "summarize_sim"]


def speedup(reference_us: float, run_us: float) -> float | None:
    """``reference_us / run_us`` (> 1: the run is faster); ``None`` when either time is not a positive finite
    number (a ratio over a zero time is undefined: module docstring)."""
    if run_us > 0 and reference_us > 0 and math.isfinite(run_us) and math.isfinite(reference_us):
        return reference_us / run_us
    return None


def format_speedup(ratio: float | None, digits: int = 3) -> str:
    """``1.022x`` (``digits`` decimals), or ``n/a`` for an undefined ratio (:func:`speedup`)."""
    return "n/a" if ratio is None else f"{ratio:.{digits}f}x"


class RankChoiceError(InvalidInputError):
    """``--rank`` names a rank that was not replayed."""


@dataclass
class RunSummary:
    """One replayed run (module docstring). ``iteration_us``: the job's time of each iteration;
    ``breakdowns``: rank ``rank``'s partition of each (empty, or not one per iteration, when the run's times
    were measured without intervals to partition: then the breakdown is unknown, not guessed)."""

    label: str
    scenario: str
    world_size: int
    clock: str
    iteration_us: list[float]
    breakdowns: list[Breakdown]
    rank: int
    rank_chosen: bool = False  # True: picked with --rank; False: the slowest rank of the median iteration
    top_collectives: list[dict[str, Any]] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)
    modeled_iteration_us: float | None = None  # the virtual model's time, when the run itself was real-clock
    captured: int = 1  # captured iterations per pass
    iterations_note: str = ""

    @property
    def median_index(self) -> int:
        """Which iteration the report shows (:func:`nbox_replay.virtual.breakdown.median_index`)."""
        return median_index(self.iteration_us)

    @property
    def median_us(self) -> float:
        """The run's iteration time: the median iteration's (module docstring)."""
        return self.iteration_us[self.median_index]

    @property
    def breakdown(self) -> Breakdown | None:
        """The shown rank's partition of the median iteration; None when the run has no intervals for it."""
        if len(self.breakdowns) != len(self.iteration_us):
            return None
        return self.breakdowns[self.median_index]

    def _part(self, name: str) -> float:
        b = self.breakdown
        return float(getattr(b, name)) if b is not None else math.nan

    @property
    def compute_us(self) -> float:
        return self._part("compute_us")

    @property
    def exposed_comm_us(self) -> float:
        return self._part("exposed_comm_us")

    @property
    def waiting_us(self) -> float:
        return self._part("waiting_us")

    @property
    def idle_us(self) -> float:
        return self._part("idle_us")

    @property
    def overlapped_comm_us(self) -> float:
        return self._part("overlapped_comm_us")

    @property
    def slowest_rank(self) -> int:
        """The rank the breakdown describes (kept for the sweep's column name)."""
        return self.rank

    def spread_us(self) -> tuple[float, float]:
        xs = sorted(self.iteration_us)
        if len(xs) < 2:
            return xs[0], xs[0]
        q = statistics.quantiles(xs, n=10, method="inclusive")
        return q[0], q[-1]

    def to_dict(self) -> dict[str, Any]:
        p10, p90 = self.spread_us()
        b = self.breakdown
        parts = None if b is None else {
            "rank": self.rank, "rank_chosen_by": "--rank" if self.rank_chosen else "slowest",
            "iteration_index": self.median_index, "compute": b.compute_us, "exposed_comm": b.exposed_comm_us,
            "waiting_for_peers": b.waiting_us, "idle": b.idle_us, "overlapped_comm": b.overlapped_comm_us}
        return {"label": self.label, "scenario": self.scenario, "world_size": self.world_size, "clock": self.clock,
                "iteration_us": {"median": self.median_us, "p10": p10, "p90": p90, "values": self.iteration_us},
                "iterations": {"captured_per_pass": self.captured, "count": len(self.iteration_us),
                               "note": self.iterations_note},
                "breakdown_us": parts,
                "breakdown_per_iteration_us": [x.to_dict() for x in self.breakdowns]
                if b is not None else [],
                "modeled_iteration_us": self.modeled_iteration_us,
                "top_collectives": self.top_collectives, "retarget_rules": self.rules}


def summarize_sim(sim: SimResult, *, label: str, scenario: str, top: int = 5, rank: int | None = None) -> RunSummary:
    """A :class:`RunSummary` of a virtual replay (module docstring): ``rank``'s breakdown (None: the slowest
    rank of the median iteration) and its ``top`` collectives in the median iteration.

    Raises:
        RankChoiceError: ``rank`` was not replayed.
    """
    windows = sim.windows()
    iters = [e - s for s, e in windows]
    j = median_index(iters)
    ends = {r: rr.iteration_end_us for r, rr in sim.ranks.items()}
    if rank is None:
        chosen = slowest_rank(ends, j)
    elif rank in sim.ranks:
        chosen = rank
    else:
        raise RankChoiceError(f"--rank {rank}: not a replayed rank (replayed: {sorted(sim.ranks)})")
    rr = sim.ranks[chosen]
    breakdowns = [partition(rr.intervals, s, e, rank=chosen) for s, e in windows]
    rules: dict[str, int] = {}
    for c in sim.collectives:
        rules[f"{c.collective}: {c.rule}"] = rules.get(f"{c.collective}: {c.rule}", 0) + 1
    shown = breakdowns[j]
    w_start, w_end = windows[j]
    by_key: dict[tuple[str, str, float, str, str], dict[str, Any]] = {}
    for k, ans in enumerate(rr.comm_answers):
        span = rr.intervals.comms[k]
        if ans is None or span.end_us <= w_start or span.issue_us >= w_end:
            continue
        key = (ans.pg, ans.collective, ans.nbytes, ans.algorithm, ans.rule)
        agg = by_key.setdefault(key, {"process_group": ans.pg, "collective": ans.collective, "bytes": ans.nbytes,
                                      "algorithm": ans.algorithm, "rule": ans.rule, "rank": chosen, "count": 0,
                                      "modeled_us": 0.0, "recorded_us": 0.0, "exposed_us": 0.0,
                                      "waiting_us": 0.0})
        if w_start <= ans.start_us < w_end:
            agg["count"] += 1
            agg["modeled_us"] += ans.end_us - ans.start_us
            if agg["recorded_us"] is not None:
                agg["recorded_us"] = None if ans.recorded_us is None else agg["recorded_us"] + ans.recorded_us
        agg["exposed_us"] += shown.comm_exposed_us[k]
        agg["waiting_us"] += shown.comm_waiting_us[k]
    tops = sorted(by_key.values(), key=lambda a: (-(a["exposed_us"] + a["waiting_us"]), -a["modeled_us"]))[:top]
    return RunSummary(label, scenario, sim.world_size, "virtual", iters, breakdowns, chosen, rank is not None, tops,
                      rules, captured=sim.captured, iterations_note=sim.iterations_note)
