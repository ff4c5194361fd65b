"""One way to write sizes and times for people (nbox_trace.units): issue 13 found "1708288 B", "1.6 MiB" and
"0.526 MB" in three commands, "11.0 ms" and "6467 us" in one column, and labels cut mid-word."""

from __future__ import annotations

import pytest

from nbox_trace.units import fit_label, format_bytes, format_in, format_us, time_unit


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                         (1708288, "1.6 MiB"), (3 << 30, "3.0 GiB"), (5 << 40, "5.0 TiB"),
                                         (7 << 50, "7168.0 TiB")])
def test_bytes_are_iec(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_one_unit_per_column_picked_by_the_largest_value() -> None:
    assert time_unit([6467.0, 11000.0]) == ("ms", 1e3)
    unit = time_unit([6467.0, 11000.0])
    assert [format_in(v, unit) for v in (6467.0, 11000.0)] == ["6.47", "11.00"]
    assert time_unit([812.0])[0] == "us" and time_unit([12e6])[0] == "s" and time_unit([])[0] == "us"
    assert time_unit([float("inf"), 5.0])[0] == "us"


def test_a_single_time_carries_its_unit() -> None:
    assert (format_us(812), format_us(16280), format_us(3.2e7)) == ("812 us", "16.28 ms", "32.00 s")


def test_labels_end_in_an_ellipsis_at_a_word_boundary() -> None:
    assert fit_label("baseline W=8 (loopback_cpu topology)", 80) == "baseline W=8 (loopback_cpu topology)"
    cut = fit_label("baseline W=8 (loopback_cpu topology)", 34)
    assert cut == "baseline W=8 (loopback_cpu…" and len(cut) <= 34
    assert fit_label("abcdefghij", 5) == "abcd…"
    with pytest.raises(ValueError):
        fit_label("x", 0)
