"""The discrete-event Timeline: time order, FIFO ties, run(until), cancel, errors, determinism."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator_core.timeline import Timeline


def test_events_run_in_time_order_whatever_the_scheduling_order() -> None:
    t = Timeline()
    seen: list[tuple[float, str]] = []
    for when, name in ((30.0, "c"), (10.0, "a"), (20.0, "b"), (5.5, "first")):
        t.at(when, lambda n=name: seen.append((t.now_us, n)))
    assert t.run() == 4
    assert seen == [(5.5, "first"), (10.0, "a"), (20.0, "b"), (30.0, "c")]
    assert t.now_us == 30.0 and len(t) == 0


def test_ties_run_in_scheduling_order() -> None:
    t = Timeline(start_us=100.0)
    seen: list[int] = []
    for i in (3, 1, 4, 1, 5, 9, 2, 6):
        t.at(150.0, seen.append, i)
    t.after(50.0, seen.append, 0)  # also lands at 150: after the others
    t.run()
    assert seen == [3, 1, 4, 1, 5, 9, 2, 6, 0]


def test_callbacks_schedule_further_events_including_at_the_current_time() -> None:
    t = Timeline()
    seen: list[tuple[float, str]] = []

    def tick(n: int) -> None:
        seen.append((t.now_us, f"tick{n}"))
        if n < 3:
            t.after(10.0, tick, n + 1)
            t.at(t.now_us, seen.append, (t.now_us, f"same{n}"))

    t.at(0.0, tick, 0)
    t.at(15.0, seen.append, (15.0, "other"))
    assert t.run() == 1 + 3 + 3 + 1
    assert seen == [(0.0, "tick0"), (0.0, "same0"), (10.0, "tick1"), (10.0, "same1"), (15.0, "other"),
                    (20.0, "tick2"), (20.0, "same2"), (30.0, "tick3")]


def test_run_until_stops_the_clock_there_and_leaves_later_events() -> None:
    t = Timeline()
    seen: list[float] = []
    for when in (1.0, 2.0, 3.0, 7.0, 9.0):
        t.at(when, seen.append, when)
    assert t.run(until_us=3.0) == 3  # an event exactly at until_us runs
    assert seen == [1.0, 2.0, 3.0] and t.now_us == 3.0
    assert t.run(until_us=5.0) == 0
    assert t.now_us == 5.0 and len(t) == 2 and t.peek_us() == 7.0
    with pytest.raises(ValueError, match="until_us must be a finite number >= now"):
        t.run(until_us=4.0)
    assert t.run() == 2 and seen[-2:] == [7.0, 9.0] and t.now_us == 9.0


def test_run_until_nan_is_rejected() -> None:
    t = Timeline()
    t.at(1.0, lambda: None)
    with pytest.raises(ValueError, match="until_us"):
        t.run(until_us=math.nan)


def test_cancel_removes_an_event_and_unknown_ids_are_errors() -> None:
    t = Timeline()
    seen: list[str] = []
    t.at(1.0, seen.append, "a")
    b = t.at(2.0, seen.append, "b")
    c = t.at(3.0, seen.append, "c")
    assert len(t) == 3
    t.cancel(b)
    assert len(t) == 2
    with pytest.raises(ValueError, match=f"no scheduled event with id {b}"):
        t.cancel(b)  # twice
    with pytest.raises(ValueError, match="no scheduled event with id 999"):
        t.cancel(999)
    t.cancel(c)
    assert t.peek_us() == 1.0
    t.run()
    assert seen == ["a"] and t.now_us == 1.0 and len(t) == 0
    with pytest.raises(ValueError, match="no scheduled event with id 1"):
        t.cancel(1)  # already ran


def test_cancelling_the_next_event_moves_peek_to_the_one_after() -> None:
    t = Timeline()
    first = t.at(1.0, lambda: None)
    t.at(4.0, lambda: None)
    t.cancel(first)
    assert t.peek_us() == 4.0 and len(t) == 1
    assert t.step() and t.now_us == 4.0
    assert not t.step()


@pytest.mark.parametrize(("when", "shown"), [(-1.0, "-1.0"), (math.nan, "nan"), (math.inf, "inf"), (True, "True")])
def test_bad_times_are_value_errors_naming_the_value(when: float, shown: str) -> None:
    t = Timeline(start_us=0.0)
    with pytest.raises(ValueError, match=f"time_us.*{shown}"):
        t.at(when, lambda: None)
    assert len(t) == 0


def test_scheduling_in_the_past_names_the_time_and_now() -> None:
    t = Timeline(start_us=50.0)
    with pytest.raises(ValueError, match=r"time_us 49.5 is in the past \(now 50.0\)"):
        t.at(49.5, lambda: None)


@pytest.mark.parametrize(("delay", "shown"), [(-0.5, "-0.5"), (math.nan, "nan"), (-math.inf, "-inf")])
def test_bad_delays_are_value_errors_naming_the_value(delay: float, shown: str) -> None:
    t = Timeline()
    with pytest.raises(ValueError, match=f"delay_us must be a number >= 0, got {shown}"):
        t.after(delay, lambda: None)
    with pytest.raises(ValueError, match="time_us must be a finite number, got inf"):
        t.after(math.inf, lambda: None)


def test_bad_start_and_non_callable_are_errors() -> None:
    with pytest.raises(ValueError, match="start_us must be a finite number, got nan"):
        Timeline(start_us=math.nan)
    with pytest.raises(ValueError, match="callback must be callable, got 42"):
        Timeline().at(1.0, 42)  # type: ignore[arg-type]


def test_an_exception_in_a_callback_propagates_with_the_clock_at_that_event() -> None:
    t = Timeline()
    seen: list[float] = []

    def boom() -> None:
        raise RuntimeError("callback failed")

    t.at(1.0, seen.append, 1.0)
    t.at(2.0, boom)
    t.at(3.0, seen.append, 3.0)
    with pytest.raises(RuntimeError, match="callback failed"):
        t.run()
    assert t.now_us == 2.0 and seen == [1.0] and len(t) == 1
    assert t.run() == 1 and seen == [1.0, 3.0]


def test_len_and_peek_on_an_empty_timeline() -> None:
    t = Timeline(start_us=12.0)
    assert len(t) == 0 and t.peek_us() == math.inf
    assert not t.step() and t.run() == 0 and t.now_us == 12.0
    t.after(3.0, lambda: None)
    assert len(t) == 1 and t.peek_us() == 15.0


Schedule = list[tuple[int, int, bool]]  # (time, children, cancelled)


def _execute(schedule: Schedule) -> list[tuple[float, str]]:
    t = Timeline()
    order: list[tuple[float, str]] = []

    def fire(label: str, children: int) -> None:
        order.append((t.now_us, label))
        for c in range(children):
            t.after(float(c % 3), fire, f"{label}.{c}", 0)

    ids = [t.at(float(when), fire, str(i), children) for i, (when, children, _) in enumerate(schedule)]
    for event_id, (_, _, cancelled) in zip(ids, schedule, strict=True):
        if cancelled:
            t.cancel(event_id)
    t.run()
    return order


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3), st.booleans()), max_size=30))
def test_random_schedules_run_the_same_way_twice_in_time_then_fifo_order(schedule: Schedule) -> None:
    first, second = _execute(schedule), _execute(schedule)
    assert first == second
    times = [when for when, _ in first]
    assert times == sorted(times)
    roots = [label for _, label in first if "." not in label]
    expected = sorted((i for i, (_, _, cancelled) in enumerate(schedule) if not cancelled),
                      key=lambda i: schedule[i][0])  # stable sort: ties keep scheduling order
    assert roots == [str(i) for i in expected]
    kept = sum(1 + children for _, children, cancelled in schedule if not cancelled)
    assert len(first) == kept
