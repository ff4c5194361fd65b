"""The lean pass (nbox_record.sources.leantiming): keys of top-level operators, medians and gaps, what is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbox_record.capture import clock as recordclock
from nbox_record.handoff.env import Config, ConfigError, config_from_env
from nbox_record.handoff.rawformat import BOUNDARY_MARKER
from nbox_record.sources.kineto import CpuEvent, KinetoTrace
from nbox_record.sources.leantiming import AUTOGRAD_EVENT as AUTOGRAD
from nbox_record.sources.leantiming import lean_times, top_sequences

MAIN = ("1", "10")
OTHER = ("1", "11")


def op(name: str, ts: float, dur: float, thread: tuple[str, str] = MAIN, cat: str = "cpu_op") -> CpuEvent:
    return CpuEvent(name, cat, thread, ts, dur, None, None)


def mark(ts: float) -> CpuEvent:
    return op(BOUNDARY_MARKER, ts, 0.0, cat="user_annotation")


def trace(events: list[CpuEvent]) -> KinetoTrace:
    return KinetoTrace(Path("k.json"), events, [], {}, [], None, None, 0)


def iteration(t0: float, linear_us: float, add_us: float, gap_us: float) -> list[CpuEvent]:
    """One iteration at t0: linear (with a child addmm), a user annotation, add, add; ``gap_us`` before each."""
    t = t0 + gap_us
    out = [op("aten::linear", t, linear_us), op("aten::addmm", t + 1, linear_us - 2)]
    t += linear_us + gap_us
    out.append(op("Optimizer.step", t, 1.0, cat="user_annotation"))  # an annotation is not an operator
    out.append(op("aten::add", t, add_us))
    t += add_us + gap_us
    out.append(op("aten::add", t, add_us + 1))
    return out


def test_top_level_events_are_keyed_by_thread_name_and_occurrence() -> None:
    events = [mark(0), *iteration(0, 10, 4, 2), op("aten::mul", 5, 1, thread=OTHER), mark(100)]
    [it] = top_sequences(events)
    names = {key: events[i].name for key, i in it.items()}
    assert names == {(MAIN, "aten::linear", 0): "aten::linear", (MAIN, "aten::add", 0): "aten::add",
                     (MAIN, "aten::add", 1): "aten::add", (OTHER, "aten::mul", 0): "aten::mul"}  # no addmm (nested)


def test_events_outside_the_markers_or_across_one_are_left_out() -> None:
    events = [op("aten::early", -5, 1), mark(0), op("aten::inside", 1, 2), op("aten::across", 8, 5), mark(10),
              op("aten::late", 11, 1)]
    assert top_sequences(events) == [{(MAIN, "aten::inside", 0): 2}]
    assert top_sequences([mark(0), op("aten::x", 1, 1)]) == []  # one marker: no iteration


def test_each_captured_operator_takes_the_lean_median_duration_and_gap() -> None:
    lean = trace([mark(0), *iteration(0, 10, 4, 2), mark(100), *iteration(100, 14, 6, 3), mark(200),
                  *iteration(200, 12, 5, 8), mark(300)])
    captured = trace([mark(1000), *iteration(1000, 40, 20, 30), mark(2000)])
    found = lean_times(captured, lean)
    by_name = {(captured.cpu[i].name, captured.cpu[i].ts): t for i, t in found.items()}
    linear = by_name[("aten::linear", 1030)]
    assert (linear.duration_us, linear.gap_us, linear.samples) == (12.0, 3.0, 3)  # medians of 10/14/12 and 2/3/8
    first_add, second_add = sorted((k, v) for k, v in by_name.items() if k[0] == "aten::add")
    assert (first_add[1].duration_us, first_add[1].gap_us) == (5.0, 3.0)
    assert (second_add[1].duration_us, second_add[1].gap_us) == (6.0, 3.0)
    assert len(found) == 3  # the nested addmm and the annotation take nothing


def test_an_operator_absent_from_the_lean_iterations_keeps_no_lean_figure() -> None:
    lean = trace([mark(0), *iteration(0, 10, 4, 2), mark(100)])
    captured = trace([mark(1000), *iteration(1000, 40, 20, 30), op("aten::extra", 1500, 3), mark(2000)])
    found = {captured.cpu[i].name for i in lean_times(captured, lean)}
    assert found == {"aten::linear", "aten::add"}
    assert lean_times(captured, trace([op("aten::linear", 1, 1)])) == {}  # a lean trace without iterations


def test_the_boundaries_put_the_lean_pass_between_the_timed_iterations_and_the_capture(tmp_path: Path) -> None:
    cfg = Config(tmp_path, warmup=2, iterations=3, capture=2, lean=2)
    steps = {n: recordclock.step_at(n, cfg) for n in range(1, 12)}
    assert [steps[n] for n in range(5, 11)] == ["start_lean", "mark", "finish_lean", "mark", "finish_capture", None]
    assert cfg.needed == 2 + 3 + 2 + 2
    no_lean = Config(tmp_path, warmup=2, iterations=3, capture=2)
    assert [recordclock.step_at(n, no_lean) for n in (5, 6, 7)] == ["start_capture", "mark", "finish_capture"]
    timing_only = Config(tmp_path, warmup=2, iterations=3, lean=4, no_capture=True)
    assert timing_only.effective_lean == 0 and recordclock.step_at(5, timing_only) == "finish_timing"


def test_the_captured_iterations_are_timed_after_the_lean_ones() -> None:
    clock = recordclock.IterationClock(1, 2, captured=1, lean=2)
    for n, t in enumerate([0.0, 1.0, 2.0, 3.0, 4.0], start=1):
        clock.take(n, t, None)
        if n == 5:
            clock.capture_started(4.5, None)
    clock.take(6, 6.0, None)
    assert clock.iteration_us == [1e6, 1e6]
    assert clock.capture_us == [1.5e6]  # the lean iterations (boundaries 4, 5) are not captured ones


def test_the_environment_variable_is_read_and_checked(tmp_path: Path) -> None:
    assert config_from_env({"NBOX_RECORD_DIR": str(tmp_path)}).lean == 0
    assert config_from_env({"NBOX_RECORD_DIR": str(tmp_path), "NBOX_LEAN_ITERATIONS": "3"}).lean == 3
    with pytest.raises(ConfigError, match="NBOX_LEAN_ITERATIONS"):
        config_from_env({"NBOX_RECORD_DIR": str(tmp_path), "NBOX_LEAN_ITERATIONS": "-1"})


def test_only_the_training_thread_has_gaps() -> None:
    """Another thread (gloo's, autograd's) waits between its events: its first event is not 'after' the marker."""
    lean = trace([mark(0), op("aten::linear", 5, 10), op("aten::copy_", 60, 2, thread=OTHER), mark(100)])
    captured = trace([mark(1000), op("aten::linear", 1007, 30), op("aten::copy_", 1070, 2, thread=OTHER),
                      mark(2000)])
    found = {captured.cpu[i].name: t for i, t in lean_times(captured, lean).items()}
    assert found["aten::linear"].gap_us == 5.0 and found["aten::copy_"].gap_us == 0.0
    assert found["aten::copy_"].duration_us == 2.0


def test_a_backward_on_another_thread_is_one_timeline_with_its_caller() -> None:
    """A CUDA rank (H100, 2026-11-27): the autograd engine's device thread runs the backward while the caller waits
    in ``backward()``. The caller's wait is not a gap; the engine's time between backward events is."""
    def lean_iteration(t0: float) -> list[CpuEvent]:
        return [op("aten::mse_loss", t0 + 5, 10),  # forward on the caller: gap 5 after the marker
                op(f"{AUTOGRAD} MseLossBackward0", t0 + 20, 8, thread=OTHER),  # 5 after the loss: backward starts
                op(f"{AUTOGRAD} AddmmBackward0", t0 + 31, 6, thread=OTHER),  # the engine's 3 between its events
                op("aten::_foreach_add_", t0 + 40, 4)]  # 3 after the backward, not 25 after the loss

    lean = trace([mark(0), *lean_iteration(0), mark(100), *lean_iteration(100), mark(200)])
    captured = trace([mark(1000), *lean_iteration(1000), mark(2000)])
    times = lean_times(captured, lean)
    found = {captured.cpu[i].name: t.gap_us for i, t in times.items()}
    assert found == {"aten::mse_loss": 5.0, f"{AUTOGRAD} MseLossBackward0": 5.0,
                     f"{AUTOGRAD} AddmmBackward0": 3.0, "aten::_foreach_add_": 3.0}
    assert all(t.joined for t in times.values())  # the replay starts these gaps after the other thread's work


def test_a_thread_that_runs_beside_the_caller_is_not_joined_to_it() -> None:
    """A thread whose events overlap the caller's is concurrent work, not a handoff: it keeps no gaps, and the
    caller's gaps are its own, as on a CPU rank."""
    lean = trace([mark(0), op("aten::linear", 5, 10), op(f"{AUTOGRAD} X", 8, 4, thread=OTHER),
                  op("aten::add", 30, 2), mark(100)])
    times = lean_times(lean, lean)
    found = {lean.cpu[i].name: t.gap_us for i, t in times.items()}
    assert found == {"aten::linear": 5.0, f"{AUTOGRAD} X": 0.0, "aten::add": 15.0}
    assert not any(t.joined for t in times.values())


def test_a_backward_thread_overlapping_any_training_thread_is_not_joined() -> None:
    """With two threads holding markers, the backward event overlaps the first one's long operator though not the
    second's, which starts later and ends earlier: still concurrent work, not a handoff (the latest end among the
    training spans that start before the event's end counts, not the nearest one's)."""
    third = ("1", "12")
    lean = trace([mark(0), op(BOUNDARY_MARKER, 0, 0.0, thread=third, cat="user_annotation"),
                  op("aten::linear", 5, 90), op("aten::mul", 10, 10, thread=third),
                  op(f"{AUTOGRAD} X", 50, 10, thread=OTHER), mark(100),
                  op(BOUNDARY_MARKER, 100, 0.0, thread=third, cat="user_annotation")])
    times = lean_times(lean, lean)
    found = {lean.cpu[i].name: t.gap_us for i, t in times.items()}
    assert found == {"aten::linear": 5.0, "aten::mul": 10.0, f"{AUTOGRAD} X": 0.0}
    assert not any(t.joined for t in times.values())
