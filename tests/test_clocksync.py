"""Clock offsets between real ranks (emulator_core.backend.clocksync): Cristian's estimate, the ping-pong protocol over
a simulated link with uneven legs, the test-only offset, and, end to end, ``nbox emulate`` whose two real ranks read
clocks 7.5 s apart and still play one timeline."""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator_core.backend.clocksync import (
    ROUNDS,
    TEST_OFFSET_ENV,
    Clock,
    ClockSyncError,
    deliberate_skew_ns,
    estimate_offset,
    host_key,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_offset_is_exact_when_both_legs_take_as_long() -> None:
    # reference at 1000 sends; the other clock (reference - 400) answers at its 700 (= reference 1100); back at 1200
    assert estimate_offset([(1000, 700, 1200)]) == (400, 100)


def test_the_shortest_round_trip_is_kept_and_the_error_stays_inside_its_bound() -> None:
    true_offset = -5_000_000
    rng = random.Random(7)
    samples = []
    for _ in range(30):
        t0 = rng.randrange(10**9)
        out_leg, back_leg = rng.randrange(20, 5000), rng.randrange(20, 5000)  # uneven legs
        samples.append((t0, t0 + out_leg - true_offset, t0 + out_leg + back_leg))
    offset, bound = estimate_offset(samples)
    best = min(samples, key=lambda s: s[2] - s[0])
    assert bound == (best[2] - best[0] + 1) // 2
    assert abs(offset - true_offset) <= bound


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ClockSyncError, match="no ping-pong sample"):
        estimate_offset([])
    with pytest.raises(ClockSyncError, match="ends before it starts"):
        estimate_offset([(10, 5, 3)])


def test_the_test_offset_reads_one_number_or_one_per_real_rank() -> None:
    assert deliberate_skew_ns(0, {}) == 0
    assert deliberate_skew_ns(3, {TEST_OFFSET_ENV: "1.5"}) == 1_500_000_000
    per_rank = {TEST_OFFSET_ENV: "0, -2, 0.25"}
    assert [deliberate_skew_ns(r, per_rank) for r in range(4)] == [0, -2 * 10**9, 250_000_000, 0]
    with pytest.raises(ClockSyncError, match=f"{TEST_OFFSET_ENV}: not a number of seconds: 'soon'"):
        deliberate_skew_ns(0, {TEST_OFFSET_ENV: "soon"})


def _linked(n: int, delay_s: tuple[float, float]) -> list[tuple[object, object]]:
    """send/recv pairs for n threads over queues whose messages are delivered after a random delay."""
    boxes = {(a, b): queue.Queue() for a in range(n) for b in range(n) if a != b}  # type: ignore[var-annotated]
    rng = random.Random(11)
    lock = threading.Lock()

    def make(me: int) -> tuple[object, object]:
        def send(peer: int, value: int) -> None:
            with lock:
                wait = rng.uniform(*delay_s)
            boxes[(me, peer)].put((time.perf_counter() + wait, value))

        def recv(peer: int) -> int:
            due, value = boxes[(peer, me)].get(timeout=10)
            while time.perf_counter() < due:
                pass
            return int(value)
        return send, recv
    return [make(k) for k in range(n)]


def test_three_ranks_with_skewed_clocks_land_on_rank_zeros_timeline() -> None:
    skews = [0, 4_000_000_000, -9_000_000_000]  # rank 1 reads 4 s ahead, rank 2 9 s behind
    clocks = [Clock(s) for s in skews]
    links = _linked(3, (20e-6, 300e-6))
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            send, recv = links[k]
            clocks[k].synchronize(k, 3, send, recv, host_key(skews[k]))  # type: ignore[arg-type]
        except BaseException as err:
            errors.append(err)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert clocks[0].correction_ns == 0 and clocks[0].bound_ns == 0
    now = time.perf_counter_ns()
    for k in (1, 2):
        c = clocks[k]
        assert 0 < c.bound_ns < 100_000_000  # a round trip between threads (a loaded machine can take ms)
        # one process, one true clock: every rank must put the same instant at the same reference time
        assert abs(c.to_reference_ns(now) - clocks[0].to_reference_ns(now)) <= c.bound_ns
        assert abs(c.describe()["offset_us"] * 1000 + skews[k]) <= c.bound_ns
        assert c.to_perf_ns(c.to_reference_ns(now)) == now


def test_processes_of_one_boot_share_the_clock_and_skip_the_estimate(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("4f0c7a1e-0000-4000-8000-1234567890ab\n")
    assert host_key(0, str(boot)) == host_key(0, str(boot))
    assert host_key(0, str(boot)) != host_key(1, str(boot))  # a test skew: a clock of its own
    assert host_key(0, str(tmp_path / "missing")) != host_key(0, str(tmp_path / "missing"))  # unknown: estimate
    sent: list[tuple[int, int]] = []
    clock = Clock()
    # rank 1 of a pair on the same boot: sends its key, hears 0 (same clock), no ping, correction stays 0
    clock.synchronize(1, 2, lambda peer, v: sent.append((peer, v)), lambda peer: 0, key=42)
    assert sent == [(0, 42)] and clock.correction_ns == 0 and clock.bound_ns == 0
    got = iter([42])
    sent.clear()
    Clock().synchronize(0, 2, lambda peer, v: sent.append((peer, v)), lambda peer: next(got), key=42)
    assert sent == [(1, 0)]  # rank 0 answers "same clock" and pings nobody


def test_without_the_estimate_the_skew_is_what_the_other_ranks_see() -> None:
    # the control: an unsynchronized clock maps its host reading onto the "reference" unchanged, so a rank that
    # reads 4 s ahead would seem to arrive 4 s late; only synchronize() removes it
    c = Clock(4_000_000_000)
    now = time.perf_counter_ns()
    assert c.to_reference_ns(now) - now == 4_000_000_000
    assert ROUNDS >= 8


def test_a_credited_lag_moves_the_ranks_timeline_behind_its_host_clock_and_only_forward() -> None:
    c = Clock(1_000)
    c.correction_ns = 5_000
    c.credit(300)
    c.credit(200)
    assert c.lag_ns == 500
    assert c.to_reference_ns(10_000) == 10_000 + 5_000 - 500  # arrivals go out earlier
    assert c.to_perf_ns(14_500) == 10_000  # and an answered deadline falls later in host time
    assert c.local_ns(10_000) == 9_500
    with pytest.raises(ValueError, match="only grows"):
        c.credit(-1)


def test_a_work_turns_its_deadline_into_host_time_when_waited_for() -> None:
    """A collective answered before the rank was credited: the wait ends that much later in host time (the rank's
    timeline reaches the deadline then), not at the host time the answer first mapped to."""
    from emulator_core.backend.delay import NboxWork

    c = Clock()
    t0 = time.perf_counter_ns()
    answered = c.to_reference_ns(time.perf_counter_ns()) + 20_000_000  # ends 20 ms from now on the timeline
    work = NboxWork(lambda: "all_reduce", [], 5.0, 200_000, answered, c)
    c.credit(30_000_000)  # then the rank is credited 30 ms
    assert not work.is_completed()
    work.wait()
    assert time.perf_counter_ns() - t0 >= 50_000_000  # 20 + 30 ms after the answer was made
    resolved = NboxWork(lambda: "all_reduce", [], 5.0, 200_000, clock=c)  # the resolver's path
    resolved.resolve(c.to_reference_ns(time.perf_counter_ns()))
    assert resolved.wait() and resolved.is_completed()


@pytest.mark.integration
def test_emulate_with_real_ranks_on_clocks_seconds_apart_plays_one_timeline() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", TEST_OFFSET_ENV: "0,7.5"}
    args = ["emulate", "--world-size", "4", "-n", "2", "--warmup", "2", "--iterations", "4", "--timeout", "90",
            "--call-timeout", "20", "--json"]
    proc = subprocess.run([sys.executable, "-m", "nbox", *args], capture_output=True, text=True, timeout=150, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    sync = doc["clock_sync"]
    assert sync["0"]["offset_us"] == 0.0
    # rank 1's clock reads 7.5 s ahead: the estimate says so within its bound (plus scheduling slack)
    assert abs(sync["1"]["offset_us"] + 7.5e6) <= sync["1"]["bound_us"] + 1000, sync
    # unsynchronized, every collective would wait 7.5 s for rank 1 (and hit the 20 s call timeout)
    assert doc["iteration_time_us"]["median"] < 1e6, doc["iteration_time_us"]
    # DDP's gradient all_reduce, and its per-step broadcast of the ConvNet's BatchNorm buffers
    assert {r["collective"] for r in doc["collectives"]} == {"all_reduce", "broadcast"}
