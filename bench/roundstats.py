"""The error of a prediction against real runs over interleaved rounds, with its uncertainty (the testbed benches).

Why an interval: on the development VM a launch's median iteration time is a draw. Back-to-back launches of one
example on the two-node testbed have medians with a standard deviation of 7-9% of their median
(docs/journal/2026-11-26.md, "The launch's luck"), and half of that variance follows the process's address-space
layout, which is fixed for a process's life and differs between programs. One recording against three real launches
is therefore an error with a standard deviation of about 9%, and a 5% target met or missed by one such comparison
says little about the model. The benches pair a prediction with a real launch in each round (a fresh recording per
round for the replay bench, a fresh ``nbox emulate`` launch for the emulate bench), so each round's ratio carries
both sides' luck once, and the rounds' ratios give the model's error with a confidence interval.

:func:`paired` takes the per-round (predicted, observed) medians and returns the geometric mean of the ratios
(the mean of ``log(predicted / observed)``, exponentiated: a 10% high and a 10% low round cancel) with a
two-sided 90% Student-t interval over the rounds. Nothing here runs ranks or imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Paired", "paired", "t95"]

#: Student t's 0.95 quantile (a two-sided 90% interval) for 1..30 degrees of freedom (standard tables).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    """Student t's 0.95 quantile for ``df`` >= 1 degrees of freedom (the normal's 1.645 beyond 30)."""
    if df < 1:
        raise ValueError(f"t95: degrees of freedom must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.645


@dataclass(frozen=True)
class Paired:
    """A prediction's error over paired rounds, in percent of the observed.

    Attributes:
        rounds: how many rounds were paired.
        round_errors_pct: each round's ``predicted / observed - 1``, in order.
        mean_error_pct: the geometric mean ratio minus 1.
        ci90_pct: the two-sided 90% interval of ``mean_error_pct`` (None with fewer than two rounds).
        sd_pct: the rounds' standard deviation of the log ratio, as a percentage (None below two rounds).
    """

    rounds: int
    round_errors_pct: tuple[float, ...]
    mean_error_pct: float
    ci90_pct: tuple[float, float] | None
    sd_pct: float | None

    def within(self, bound_pct: float) -> bool | None:
        """True when the whole interval lies within +-``bound_pct``; False when it lies wholly outside;
        None when it straddles the bound (the rounds cannot tell) or there is no interval."""
        if self.ci90_pct is None:
            return None
        lo, hi = self.ci90_pct
        if -bound_pct <= lo and hi <= bound_pct:
            return True
        if hi < -bound_pct or lo > bound_pct:
            return False
        return None

    def describe(self, bound_pct: float = 5.0) -> str:
        """``+1.2% (90% CI -2.0..+4.5%, 6 rounds): inside +-5%`` (or ``outside``, ``cannot tell``)."""
        if self.ci90_pct is None:
            return f"{self.mean_error_pct:+.1f}% ({self.rounds} round: no interval)"
        lo, hi = self.ci90_pct
        verdict = {True: f"inside +-{bound_pct:g}%", False: f"outside +-{bound_pct:g}%",
                   None: f"cannot tell at +-{bound_pct:g}%"}[self.within(bound_pct)]
        return f"{self.mean_error_pct:+.1f}% (90% CI {lo:+.1f}..{hi:+.1f}%, {self.rounds} rounds): {verdict}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Paired:
        """The inverse of :meth:`as_dict` (a bench row read back from its JSON)."""
        ci = d["ci90_pct"]
        return cls(int(d["rounds"]), tuple(d["round_errors_pct"]), float(d["mean_error_pct"]),
                   (float(ci[0]), float(ci[1])) if ci else None, d["sd_pct"])

    def as_dict(self) -> dict[str, object]:
        return {"rounds": self.rounds, "round_errors_pct": list(self.round_errors_pct),
                "mean_error_pct": self.mean_error_pct, "ci90_pct": list(self.ci90_pct) if self.ci90_pct else None,
                "sd_pct": self.sd_pct}


def paired(predicted: Sequence[float], observed: Sequence[float]) -> Paired:
    """The error of ``predicted`` against ``observed``, round by round (the same length, every value > 0)."""
    if len(predicted) != len(observed) or not predicted:
        raise ValueError(f"paired: {len(predicted)} predicted against {len(observed)} observed rounds")
    if any(not (v > 0) for v in (*predicted, *observed)):
        raise ValueError("paired: every median must be > 0")
    logs = [math.log(p / o) for p, o in zip(predicted, observed, strict=True)]
    errors = tuple((math.exp(x) - 1) * 100 for x in logs)
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Paired(1, errors, (math.exp(mean) - 1) * 100, None, None)
    sd = statistics.stdev(logs)
    half = t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    ci = ((math.exp(mean - half) - 1) * 100, (math.exp(mean + half) - 1) * 100)
    return Paired(len(logs), errors, (math.exp(mean) - 1) * 100, ci, (math.exp(sd) - 1) * 100)
