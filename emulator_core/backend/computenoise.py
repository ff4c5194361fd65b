"""Compute noise of their own for emulated ranks (the scenario's ``compute_noise = "mirror_history"``).

Why: a real job waits at each collective for its slowest rank, and ranks on their own CPUs draw their compute noise
independently. An emulated member *mirrors* a real one (:mod:`emulator_core.pricing.answer`): it arrives exactly with
it, so it carries none of that noise, and ``nbox emulate -n 1`` sees one CPU's luck where the real W = 2 job sees the
slower of two. On the namespace testbed the per-iteration maximum of two
independent one-rank emulations is above one of them alone by about the real two-rank job's excess over
``nbox emulate -n 1`` (bench/emulate_fidelity.py; docs/results.md, "Emulate and the slowest of two CPUs").

The rule, kept by each real rank for the emulated members that mirror it on one group (:class:`MirrorNoise`):

* **segments.** Between two consecutive calls on the group, the real rank's thread spent ``C`` ns on the CPU
  (``time.thread_time_ns``: its compute) and ``B`` ns of wall time beyond that (``B = wall - C``: blocked in a
  ``wait()``, a future, a sleep). The ``p``-th call of iteration ``i`` (iterations counted at the optimizer step,
  :func:`emulator_core.backend.process_group.mark_iteration`) closes segment ``(i, p)``.
* **a copy's draw.** Each emulated copy replays, for the whole of iteration ``i``, the real rank's compute of one
  earlier iteration ``i - lag``, ``lag`` drawn uniformly (:func:`emulator_core.pricing.answer.draw`, seeded by
  ``noise_seed``) among the last :data:`NOISE_HISTORY` iterations on record (at least :data:`NOISE_MIN_HISTORY`,
  else it has no noise yet); the copies of one real rank draw distinct lags, so at most ``NOISE_HISTORY`` of them
  are tracked. One lag per iteration keeps the noise's structure inside an iteration (a slow phase of a CPU slows
  all of its segments).
* **lateness.** Copy ``c`` is ``L_c`` ns behind its real rank. At each segment it computes
  ``d = C(i - lag_c, p) - C(i, p)`` more (0 where the past segment was closed by another collective or size).
  Where the real rank did not block, ``L_c += d``: a copy ahead (``L_c < 0``) keeps its lead. Where it blocked
  (``B`` > :data:`BLOCK_NS`), it waited for a completion the copy waits for too, so the copy's lag or lead up to
  then is absorbed: ``L_c = max(0, L_c + (1 - f) d - B) + f d``, ``f`` the share of the segment's compute after
  the block, taken as the time from the latest completion answered on the group (inside the segment) to the call
  (capped at ``C``; 0 when none falls inside). The order matters: DDP's segment is the wait for the previous
  all-reduce, then the step, forward and backward (``f`` near 1: the copy's extra compute comes after the block
  and is not absorbed); FSDP2's prefetching segment is a layer's compute, then the wait for the next layer's
  all-gather, then the call (``f`` near 0).
* **arrival.** At the call the copies arrive ``max(0, max_c L_c)`` after the real rank
  (:meth:`emulator_core.pricing.answer.Fabric.answer`'s ``mirror_late_us``).

Why segments of CPU time and absorption, not intervals from the previous completion: an earlier rule (commit
21e47f1, reverted) replayed the interval from the group's previous completion to the arrival. Where a rank computes
while a collective is in flight (FSDP2's prefetched all-gathers), that interval shrinks when the completion is late
and grows when it is early, so a copy replaying an early-completion iteration against a late completion counted the
overlapped compute twice, and it overshot FSDP2 (docs/results.md). The CPU time of a segment does not depend on
when the network answered.
"""

from __future__ import annotations

from emulator_core.pricing import draw

__all__ = ["BLOCK_NS", "NOISE_HISTORY", "NOISE_MIN_HISTORY", "MirrorNoise"]

#: How many of the real rank's latest iterations a copy draws from, and how many must be on record before it draws.
NOISE_HISTORY, NOISE_MIN_HISTORY = 32, 4
#: Wall time beyond the CPU time of a segment that counts as a block (ns): a thread's own syscalls and page faults
#: leave a few tens of microseconds; a ``wait()`` sleeps until its last 200 us (``NBOX_SPIN_US``).
BLOCK_NS = 100_000
_SALT = 0x6E6F697365  # "noise": these draws apart from any other draw keyed by the same group


class MirrorNoise:
    """The lateness of the emulated copies of one real rank on one group (module docstring).

    Args:
        copies: how many emulated members of the group mirror this real rank (>= 0).
        seed: the scenario's ``noise_seed``.
        key: the group's draw key (:attr:`emulator_core.pricing.answer.FabricGroup.key`).
    """

    def __init__(self, copies: int, seed: int, key: int) -> None:
        if copies < 0:
            raise ValueError(f"copies must be >= 0, got {copies}")
        self.copies = min(copies, NOISE_HISTORY)
        self.seed = seed
        self.key = key ^ _SALT
        self.late_ns = [0] * self.copies
        self._history: dict[int, dict[int, tuple[tuple[str, float], int]]] = {}  # p -> iteration -> (site, C)
        self._prev: tuple[int, int, int] | None = None  # (thread, wall ns, CPU ns) at the previous call
        self._iteration = -1
        self._first = -1
        self._index = 0
        self._lags: tuple[int, ...] = ()
        self._last_end_ns = 0  # the latest completion answered on the group so far (perf_counter_ns)

    def completed(self, end_ns: int) -> None:
        """A call on the group was answered: it completes at ``end_ns`` (``perf_counter_ns``)."""
        if end_ns > self._last_end_ns:
            self._last_end_ns = end_ns

    def arrive(self, iteration: int, site: tuple[str, float], wall_ns: int, cpu_ns: int, thread: int) -> int:
        """Close the segment the call ``site`` (collective, bytes) ends; how late its copies arrive (ns, >= 0).

        ``wall_ns`` and ``cpu_ns`` are the calling thread's ``perf_counter_ns`` and ``thread_time_ns`` at the call,
        ``thread`` its identity: a segment spans one thread's calls only (another thread's call starts afresh)."""
        if iteration != self._iteration:
            self._iteration, self._index = iteration, 0
            if self._first < 0:
                self._first = iteration
            self._lags = self._draw_lags(iteration)
        p = self._index
        self._index += 1
        prev, self._prev = self._prev, (thread, wall_ns, cpu_ns)
        if self.copies == 0:
            return 0
        if prev is None or prev[0] != thread:  # no segment closes here; the copies stay as late as they were
            return max(0, max(self.late_ns))
        c_ns = max(0, cpu_ns - prev[2])
        b_ns = max(0, wall_ns - prev[1] - c_ns)
        blocked = b_ns > BLOCK_NS
        # the share of the segment's compute after its block: from the latest completion in it to this call
        after = (min(c_ns, wall_ns - self._last_end_ns) / c_ns
                 if blocked and c_ns > 0 and prev[1] < self._last_end_ns < wall_ns else 0.0)
        history = self._history.setdefault(p, {})
        for k, lag in enumerate(self._lags):
            past = history.get(iteration - lag)
            d_ns = past[1] - c_ns if past is not None and past[0] == site else 0
            if blocked:
                self.late_ns[k] = max(0, self.late_ns[k] + round(d_ns * (1.0 - after)) - b_ns) + round(d_ns * after)
            else:
                self.late_ns[k] += d_ns
        if blocked:
            for k in range(len(self._lags), self.copies):
                self.late_ns[k] = max(0, self.late_ns[k] - b_ns)
        history[iteration] = (site, c_ns)
        if len(history) > NOISE_HISTORY + 1:
            del history[min(history)]
        return max(0, max(self.late_ns, default=0))

    def _draw_lags(self, iteration: int) -> tuple[int, ...]:
        """Distinct lags (1..available) for the copies in ``iteration`` (a partial Fisher-Yates on :func:`draw`)."""
        available = min(NOISE_HISTORY, iteration - self._first)
        if self.copies == 0 or available < NOISE_MIN_HISTORY:
            return ()
        pool = list(range(1, available + 1))
        n = min(self.copies, available)
        for c in range(n):
            j = c + int(draw(self.seed, self.key, iteration * 64 + c) * (available - c))
            pool[c], pool[j] = pool[j], pool[c]
        return tuple(pool[:n])
