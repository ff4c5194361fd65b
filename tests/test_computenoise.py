"""compute_noise = "mirror_history": the lateness of a real rank's emulated copies
(emulator_core/backend/computenoise.py)."""

from __future__ import annotations

import pytest

from emulator_core.backend.computenoise import BLOCK_NS, NOISE_HISTORY, NOISE_MIN_HISTORY, MirrorNoise

MS = 1_000_000
SITE = ("all_reduce", 1024.0)
#: One segment: (CPU ns, blocked ns, site).
Segment = tuple[int, int, tuple[str, float]]


class Thread:
    """One thread's clocks: each segment adds its CPU time to both clocks and its blocked time to the wall."""

    def __init__(self, noise: MirrorNoise, ident: int = 1) -> None:
        self.noise, self.ident, self.wall, self.cpu = noise, ident, 10 * MS, 0

    def call(self, iteration: int, cpu_ns: int, blocked_ns: int = 0, site: tuple[str, float] = SITE) -> int:
        self.wall += cpu_ns + blocked_ns
        self.cpu += cpu_ns
        return self.noise.arrive(iteration, site, self.wall, self.cpu, self.ident)

    def iterations(self, rows: list[list[Segment]], first: int = 0) -> list[list[int]]:
        return [[self.call(first + i, c, b, s) for c, b, s in row] for i, row in enumerate(rows)]


def _rows(cpus: list[list[int]], block0_ns: int = 1000 * MS) -> list[list[Segment]]:
    """Iterations of calls with these CPU segments; the first call of each iteration follows a long block."""
    return [[(c, block0_ns if p == 0 else 0, SITE) for p, c in enumerate(row)] for row in cpus]


def test_a_copy_replays_one_earlier_iteration_of_its_real_rank_per_iteration() -> None:
    """Iterations 0-9 compute (p + 1) ms + i us at position p, the later ones nothing: a copy of iteration i >= 10
    is late by the compute of the one earlier iteration it drew (the same at every position; the block before
    position 0 absorbs what it carried), none before NOISE_MIN_HISTORY iterations are on record; reproducible."""
    cpus = [[(p + 1) * MS + i * 1000 for p in range(3)] for i in range(10)] + [[0, 0, 0] for _ in range(20)]
    late = Thread(MirrorNoise(1, 7, 0)).iterations(_rows(cpus))
    assert late == Thread(MirrorNoise(1, 7, 0)).iterations(_rows(cpus))
    assert late[:NOISE_MIN_HISTORY] == [[0, 0, 0]] * NOISE_MIN_HISTORY
    drawn = set()
    for i in range(10, 30):
        row = late[i]
        if row[1] == 0:  # drew an iteration without compute
            assert row == [0, 0, 0]
            continue
        j = (row[1] - 2 * MS) // 1000  # the iteration replayed, read at position 1 ...
        assert 0 <= j < 10 and 0 < i - j <= NOISE_HISTORY
        assert row[1] == 2 * MS + j * 1000 and row[2] == row[1] + 3 * MS + j * 1000  # ... and the same at 2
        assert row[0] == 0  # position 0 follows a block of 1 s: nothing carried
        drawn.add(j)
    assert len(drawn) >= 3
    assert Thread(MirrorNoise(1, 8, 0)).iterations(_rows(cpus)) != late  # the seed draws


def test_a_block_absorbs_the_lateness_and_a_lead_lasts_until_one() -> None:
    """Late by 5 ms at a call, the copy waits out 3 ms of the real rank's 3 ms block and is 2 ms late at the next;
    a 10 ms block absorbs the rest. Ahead by 5 ms, it stays ahead through unblocked segments and is late only
    once its slower compute overtakes the lead; a block ends a lead too."""
    i = NOISE_HISTORY
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[10 * MS, 10 * MS, 10 * MS] for _ in range(i)]))  # every earlier iteration alike
    assert t.call(i, 5 * MS) == 5 * MS  # 10 ms of compute in the copy's iteration, 5 in the real one
    assert t.call(i, 10 * MS, 3 * MS) == 2 * MS
    assert t.call(i, 10 * MS, 10 * MS) == 0
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[5 * MS, 13 * MS, 14 * MS] for _ in range(i)]))
    assert t.call(i, 10 * MS) == 0  # 5 ms ahead
    assert t.call(i, 10 * MS) == 0  # 3 ms slower: still 2 ms ahead
    assert t.call(i, 10 * MS) == 2 * MS  # 4 ms slower: 2 ms late
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[5 * MS, 13 * MS, 14 * MS] for _ in range(i)]))
    t.call(i, 10 * MS)
    assert t.call(i, 10 * MS, 2 * BLOCK_NS) == 0  # a block: both waited for the same completion, the lead is gone
    assert t.call(i, 10 * MS) == 4 * MS


def test_compute_after_the_block_is_not_absorbed_by_it() -> None:
    """Where the latest completion falls inside the segment, the compute after it comes after the block: DDP's
    segment (the wait for the last all-reduce, then step, forward, backward) carries the copy's extra compute to
    the next all-reduce; without a completion inside, the block is taken to come last (FSDP2's prefetch)."""
    i = NOISE_HISTORY
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[MS, 12 * MS] for _ in range(i)]))
    t.call(i, MS, 1000 * MS)
    t.noise.completed(t.wall + 7 * MS)  # the all-reduce just issued completes in 7 ms, which the rank waits for
    assert t.call(i, 10 * MS, 7 * MS) == 2 * MS  # 10 ms of compute after the wait, 12 in the copy's iteration
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[MS, 12 * MS] for _ in range(i)]))
    t.call(i, MS, 1000 * MS)
    t.noise.completed(t.wall + 11 * MS)  # the rank computes 4 ms, waits 7 ms for this completion, computes 6 ms
    assert t.call(i, 10 * MS, 7 * MS) == round(2 * MS * 0.6)  # what came before the block is absorbed
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(_rows([[MS, 12 * MS] for _ in range(i)]))
    t.call(i, MS, 1000 * MS)
    assert t.call(i, 10 * MS, 7 * MS) == 0  # no completion inside: the block came last and absorbed it


def test_several_copies_draw_distinct_iterations_and_the_latest_counts() -> None:
    """Seven copies replay seven distinct earlier iterations; the call waits for the latest of them."""
    cpus = [[MS, MS + i * 10_000] for i in range(20)]  # position 1's compute grows by 10 us per iteration
    t = Thread(MirrorNoise(7, 3, 0))
    t.iterations(_rows(cpus))
    assert t.call(20, MS, 1000 * MS) == 0  # the block before position 0 absorbs everything carried
    late = t.call(20, MS)
    lags = t.noise._lags
    assert len(lags) == 7 and len(set(lags)) == 7 and all(1 <= x <= 20 for x in lags)
    assert late == max((20 - lag) * 10_000 for lag in lags)  # iteration 20 - lag computed that much more
    one = Thread(MirrorNoise(1, 3, 0))
    one.iterations(_rows(cpus))
    one.call(20, MS, 1000 * MS)
    assert 0 <= one.call(20, MS) <= late
    assert MirrorNoise(40, 0, 0).copies == NOISE_HISTORY  # at most as many tracked as iterations drawn from
    with pytest.raises(ValueError, match="copies"):
        MirrorNoise(-1, 0, 0)


def test_another_collective_or_thread_carries_nothing() -> None:
    """A past segment closed by another collective or size is not replayed; a call from another thread than the
    previous one closes no segment (a segment spans one thread's work); a rank with no copies is never late."""
    history = _rows([[10 * MS] for _ in range(NOISE_HISTORY)])
    t = Thread(MirrorNoise(1, 0, 0))
    t.iterations(history)
    assert t.call(NOISE_HISTORY, MS, 1000 * MS, ("all_gather", 1024.0)) == 0
    assert t.call(NOISE_HISTORY + 1, MS) == 9 * MS
    other = Thread(t.noise, ident=2)
    other.wall, other.cpu = t.wall, t.cpu
    assert other.call(NOISE_HISTORY + 2, MS, 0) == 9 * MS  # not a segment: the lateness stays as it was
    none = Thread(MirrorNoise(0, 0, 0))
    assert none.iterations(history) == [[0]] * NOISE_HISTORY
