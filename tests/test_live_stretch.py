"""The live replay's stretch of an operator (a straggler's compute factor, the host-work pad) holds the CPU: the
worker spins through it, never sleeps, so that on a node whose CPU is a quota share the next operator does not run on
quota the stretch left unused (issue 59). Its CPU time is booked as a wait's."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from nbox_replay.live._worker import Replayer


def _never_sleep(_s: float) -> None:
    raise AssertionError("the stretch slept")


def test_hold_until_spins_to_its_deadline_and_books_its_cpu_as_a_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", _never_sleep)  # the worker's module is the same time
    me: Any = SimpleNamespace(wait_cpu_ns=0, wait_host_ns=0)
    deadline = time.perf_counter_ns() + 5_000_000
    Replayer._hold_until(me, deadline)
    assert time.perf_counter_ns() >= deadline
    assert me.wait_host_ns > 0 and me.wait_cpu_ns > 0


@pytest.mark.parametrize(("factor", "pad", "held"), [(2.0, 1.0, True), (1.0, 1.3, True), (1.0, 1.0, False)])
def test_a_stretched_live_operator_is_held_not_idled(factor: float, pad: float, held: bool) -> None:
    calls: list[str] = []
    me: Any = SimpleNamespace(
        ops=SimpleNamespace(run=lambda i: True), factor=factor, pad=pad, live_ns=0, _sync=lambda: None,
        _hold_until=lambda deadline: calls.append("hold"), _idle_until=lambda deadline: calls.append("idle"),
        clock=SimpleNamespace(credit=lambda ns: calls.append("credit")))
    Replayer._compute(me, 0)
    assert calls == (["hold"] if held else [])
    assert me.live_ns > 0
