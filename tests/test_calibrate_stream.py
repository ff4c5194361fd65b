"""Two calls in flight (``nbox calibrate``'s step 5): the worker's ``in_flight`` entries become each collective's
``stream_factor`` and a header line; a pair no faster than two calls writes nothing (today's burst price)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator_core import calibrate as cal
from emulator_core import calibration as cc
from emulator_core import calibration_fit as cf
from emulator_core import calibration_run as cr
from emulator_core import costmodels as cm
from emulator_core.calibration import CalibrateConfig, InFlight
from emulator_core.calibration_run import MeasureRun

SIZES = [1024 * 4**k for k in range(2, 7)]


def _measurements() -> list[cc.Measurement]:
    link = cm.Link(70.0, 150.0)
    out = []
    for n in SIZES:
        t = cm.cost("all_reduce", "ring", n, 2, link)
        out.append(cc.Measurement("all_reduce", n, n, 2, 10, t, t, t, t, t))
    return out


def test_a_pair_in_flight_faster_than_two_calls_sets_the_second_calls_share() -> None:
    hidden = cf.fit_in_flight(InFlight("all_reduce", 1 << 25, (320.0,) * 8, (560.0,) * 7 + (700.0,)))
    assert hidden.stream_factor == pytest.approx(0.75) and hidden.faster == 7 and hidden.reps == 8
    assert hidden.describe().startswith("two in flight: all_reduce of 33554432 bytes, 320 us alone, 560 us")
    assert "stream_factor = 0.75" in hidden.describe()
    busy_link = cf.fit_in_flight(InFlight("all_reduce", 1 << 25, (280.0,) * 8, (561.0,) * 8))  # already saturated
    assert busy_link.stream_factor is None and "not significant" in busy_link.describe()
    few = cf.fit_in_flight(InFlight("all_reduce", 1 << 25, (320.0,) * 8, (500.0,) * 5 + (700.0,) * 3))
    assert few.stream_factor is None  # faster in only 5 of 8: noise, not two calls in flight
    for bad in (((), ()), ((1.0,), (1.0, 2.0)), ((float("nan"),), (1.0,))):
        with pytest.raises(cc.CalibrateInputError, match="in-flight"):
            InFlight("all_reduce", 1, *bad)


def test_the_workers_in_flight_measurements_become_stream_factor(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {"in_flight": [{"collective": "all_reduce", "nbytes": 1 << 20, "one_us": [100.0] * 8,
                          "pair_us": [180.0] * 8}]}
    got = cr._in_flight(doc)
    assert got[0].pair_us == (180.0,) * 8 and cr._in_flight({}) == ()
    for bad in ({"in_flight": {"collective": "all_reduce"}}, {"in_flight": [{"collective": "x"}]},
                {"in_flight": [{**doc["in_flight"][0], "pair_us": [1.0]}]}):
        with pytest.raises(cc.CalibrationError, match="malformed in-flight measurement"):
            cr._in_flight(bad)
    config = CalibrateConfig(backend="gloo", collectives=("all_reduce",), sizes=tuple(SIZES), dimension="network")
    for flight, factor in ((got, 0.8), ((), None)):
        monkeypatch.setattr(cal, "measure_run", lambda c, progress=None, f=flight: MeasureRun(
            _measurements(), {"backend": "gloo", "world_size": 2}, 1.0, (), f))
        out = tmp_path / f"c{factor}.toml"
        res = cal.calibrate(config, out)
        assert res.scenario.calibration[0].stream_factor == factor
        text = out.read_text()
        assert ("stream_factor = 0.8" in text) == (factor is not None)
        assert ("# two in flight: all_reduce of 1048576 bytes" in text) == (factor is not None)
