"""bench/roundstats.py: the paired-rounds error and its interval that the testbed benches print."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("roundstats", ROOT / "bench" / "roundstats.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["roundstats"] = mod  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


rs = _load()


def test_a_constant_ratio_has_a_zero_width_interval_at_that_error() -> None:
    got = rs.paired([110.0, 220.0, 330.0], [100.0, 200.0, 300.0])
    assert got.rounds == 3
    assert got.mean_error_pct == pytest.approx(10.0)
    assert got.ci90_pct == pytest.approx((10.0, 10.0))
    assert got.within(5.0) is False and got.within(10.5) is True


def test_a_high_and_a_low_round_cancel_in_the_geometric_mean() -> None:
    got = rs.paired([110.0, 100.0 / 1.1], [100.0, 100.0])
    assert got.mean_error_pct == pytest.approx(0.0, abs=1e-9)
    assert got.round_errors_pct == pytest.approx((10.0, -100 / 11))


def test_the_interval_is_the_students_t_interval_of_the_log_ratios() -> None:
    pred, obs = [105.0, 97.0, 112.0, 101.0], [100.0, 100.0, 100.0, 100.0]
    logs = [math.log(p / o) for p, o in zip(pred, obs, strict=True)]
    half = 2.353 * statistics.stdev(logs) / 2  # t(0.95, 3 df), sqrt(4) rounds
    got = rs.paired(pred, obs)
    m = statistics.fmean(logs)
    assert got.ci90_pct == pytest.approx(((math.exp(m - half) - 1) * 100, (math.exp(m + half) - 1) * 100))
    lo, hi = got.ci90_pct
    assert lo < got.mean_error_pct < hi


def test_the_interval_covers_a_known_bias_about_nine_times_in_ten() -> None:
    """Simulated rounds: a +3% model under 8% log-normal launch luck on both sides; the 90% interval should hold
    +3% in about 90% of 2000 benches of 6 rounds (seeded, so the count is fixed)."""
    rng = random.Random(7)
    held = 0
    for _ in range(2000):
        obs = [20.0 * math.exp(rng.gauss(0, 0.08)) for _ in range(6)]
        pred = [20.0 * 1.03 * math.exp(rng.gauss(0, 0.08)) for _ in range(6)]
        lo, hi = rs.paired(pred, obs).ci90_pct
        held += lo <= 3.0 <= hi
    assert 0.87 <= held / 2000 <= 0.93


def test_verdicts_inside_outside_and_cannot_tell() -> None:
    inside = rs.paired([101.0, 99.0, 100.5, 100.0], [100.0] * 4)
    outside = rs.paired([90.0, 91.0, 89.0], [100.0] * 3)
    straddle = rs.paired([104.0, 112.0, 96.0], [100.0] * 3)
    assert inside.within(5) is True and "inside +-5%" in inside.describe()
    assert outside.within(5) is False and "outside +-5%" in outside.describe()
    assert straddle.within(5) is None and "cannot tell at +-5%" in straddle.describe()


def test_one_round_has_no_interval() -> None:
    got = rs.paired([103.0], [100.0])
    assert got.ci90_pct is None and got.sd_pct is None and got.within(5) is None
    assert "no interval" in got.describe()


def test_the_dict_form_round_trips() -> None:
    got = rs.paired([105.0, 97.0, 112.0], [100.0, 101.0, 99.0])
    assert rs.Paired.from_dict(got.as_dict()) == got


@pytest.mark.parametrize(("pred", "obs"), [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0]), ([1.0], [-2.0]),
                                           ([float("nan")], [1.0])])
def test_bad_rounds_are_refused(pred: list[float], obs: list[float]) -> None:
    with pytest.raises(ValueError, match="paired"):
        rs.paired(pred, obs)


def test_t_quantiles() -> None:
    assert rs.t95(1) == 6.314 and rs.t95(9) == 1.833 and rs.t95(30) == 1.697 and rs.t95(500) == 1.645
    with pytest.raises(ValueError, match="degrees of freedom"):
        rs.t95(0)
