"""A what-if's prediction against a recording made at the what-if's scale (``nbox replay --truth``): the figures
and their lines in the report (``nbox_replay.truth`` makes it). Times in microseconds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbox_replay.report.summary import RunSummary

__all__ = ["Truth"]


@dataclass
class Truth:
    """The comparison (module docstring). ``own`` is the truth recording replayed under the what-if (None: its
    traces could not be replayed, ``own_why`` says why)."""

    source: str
    world_size: int
    observed: dict[str, float]
    predicted_us: float
    baseline_us: float
    recorded_us: float | None
    prediction: RunSummary
    own: RunSummary | None = None
    own_why: str = ""

    @property
    def error_pct(self) -> float:
        return (self.predicted_us - self.observed["median"]) / self.observed["median"] * 100

    @property
    def real_ratio(self) -> float | None:
        """The truth's observed median over the small recording's (None: the small bundle has no observed time)."""
        if self.recorded_us is None or not self.recorded_us > 0:
            return None
        return self.observed["median"] / self.recorded_us

    @property
    def predicted_ratio(self) -> float | None:
        return self.predicted_us / self.baseline_us if self.baseline_us > 0 else None

    @property
    def ratio_error_pct(self) -> float | None:
        real, pred = self.real_ratio, self.predicted_ratio
        return None if real is None or pred is None else (pred / real - 1) * 100

    def lines(self, fmt: Callable[[float], str]) -> list[str]:
        """The report's lines (``fmt``: microseconds -> text in the report's unit)."""
        o = self.observed
        out = [f"truth: {self.source}, recorded at world size {self.world_size}: observed {fmt(o['median'])} "
               f"(p10-p90 {fmt(o['p10'])}-{fmt(o['p90'])}, {int(o['n'])} un-instrumented iterations); the what-if's "
               f"prediction {fmt(self.predicted_us)}: {self.error_pct:+.1f}%"]
        if self.ratio_error_pct is not None and self.real_ratio is not None and self.predicted_ratio is not None:
            out.append(f"truth: scaling from the recorded setting: predicted {self.predicted_ratio:.3f}x (what-if over "
                       f"baseline), observed {self.real_ratio:.3f}x (truth over the small recording's observed): "
                       f"{self.ratio_error_pct:+.1f}%")
        rows = [("predicted (the what-if)", self.prediction)]
        if self.own is not None:
            rows.append(("the truth's recording under the what-if", self.own))
        out.append(f"truth: breakdown of the median iteration {'':14} {'iteration':>10} {'compute':>9} {'exposed':>9} "
                   f"{'waiting':>9} {'idle':>9}")
        for name, run in rows:
            out.append(f"  {name:<54} {fmt(run.median_us):>10} {fmt(run.compute_us):>9} "
                       f"{fmt(run.exposed_comm_us):>9} {fmt(run.waiting_us):>9} {fmt(run.idle_us):>9}")
        if self.own is None:
            out.append(f"  the truth's recording was not replayed: {self.own_why}")
        return out

    def to_dict(self) -> dict[str, Any]:
        def parts(run: RunSummary | None) -> dict[str, float] | None:
            if run is None or run.breakdown is None:
                return None
            return {"iteration": run.median_us, "compute": run.compute_us, "exposed_comm": run.exposed_comm_us,
                    "waiting_for_peers": run.waiting_us, "idle": run.idle_us}

        return {"source": self.source, "world_size": self.world_size, "observed_iteration_us": self.observed,
                "predicted_us": self.predicted_us, "error_pct": self.error_pct,
                "predicted_ratio": self.predicted_ratio, "observed_ratio": self.real_ratio,
                "ratio_error_pct": self.ratio_error_pct, "breakdown_predicted_us": parts(self.prediction),
                "breakdown_truth_recording_us": parts(self.own), "truth_recording_not_replayed": self.own_why or None}
