"""The virtual engine's event core: time, then priority, then scheduling order; actions schedule more."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbox_replay.virtual.events import EventQueue


def test_events_run_in_time_then_priority_then_scheduling_order() -> None:
    q = EventQueue()
    seen: list[tuple[int, int, str]] = []
    for time, prio, name in ((2, 0, "c"), (1, 5, "b"), (1, 1, "a"), (0, 9, "first"), (1, 5, "b2")):
        q.schedule(time, prio, lambda n=name: seen.append((q.now, q.priority, n)))
    assert q.run() == 5
    assert seen == [(0, 9, "first"), (1, 1, "a"), (1, 5, "b"), (1, 5, "b2"), (2, 0, "c")]


def test_actions_schedule_further_events_including_at_the_current_time() -> None:
    q = EventQueue()
    seen: list[tuple[int, str]] = []

    def tick(n: int) -> None:
        seen.append((q.now, f"tick{n}"))
        if n < 3:
            q.schedule(q.now, 1, lambda: seen.append((q.now, f"same{n}")))
            q.schedule(q.now + 1, 0, lambda: tick(n + 1))

    q.schedule(0, 0, lambda: tick(0))
    assert q.run() == 7
    assert seen == [(0, "tick0"), (0, "same0"), (1, "tick1"), (1, "same1"), (2, "tick2"), (2, "same2"),
                    (3, "tick3")]


def test_an_exception_in_an_action_propagates_with_the_clock_at_that_event() -> None:
    q = EventQueue()

    def boom() -> None:
        raise RuntimeError("boom")

    q.schedule(4, 2, boom)
    q.schedule(5, 0, lambda: None)
    with pytest.raises(RuntimeError, match="boom"):
        q.run()
    assert (q.now, q.priority) == (4, 2)
    assert q.run() == 1  # the later event is still there


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=30))
def test_random_schedules_run_sorted_and_the_same_way_twice(schedule: list[tuple[int, int]]) -> None:
    def once() -> list[int]:
        q = EventQueue()
        seen: list[int] = []
        for k, (time, prio) in enumerate(schedule):
            q.schedule(time, prio, lambda k=k: seen.append(k))
        q.run()
        return seen

    first = once()
    assert first == once()
    assert first == sorted(range(len(schedule)), key=lambda k: (*schedule[k], k))
