"""One timeline for real ranks on different hosts: clock offsets estimated by ping-pong at start-up.

Every real rank keeps a correction ``c`` with ``reference = perf_counter + c``, the reference being real rank 0's
clock: arrivals go out on the reference timeline, answers come back on it, and each rank waits for an answered end
on its own clock, ``perf_counter = reference - c``. Processes on one host (the same ``/proc/sys/kernel/random/boot_id``,
:func:`host_key`) share ``CLOCK_MONOTONIC``: their offset is exactly 0. For other hosts, :func:`estimate_offset` is
Cristian's: rank 0 sends ``t0``, rank k answers ``tk``, rank 0 reads ``t1``; ``offset = (t0 + t1) / 2 - tk``, wrong by
at most half the round trip; of :data:`ROUNDS` round trips the shortest is kept, and its bound is reported. Offsets
are estimated once, when the default process group is created; drift is not followed.

A rank's own lag (:class:`Clock`): a live replay's worker may credit its rank (``replay.host_work=match``,
:mod:`nbox_replay.live.hostwork`), so the rank's timeline reads ``lag`` behind its host clock: ``reference =
perf_counter + c - lag``. The lag only grows, only the worker's own thread moves it, and a deadline is turned into
host time when it is waited for, with the lag of that moment (:class:`emulator_core.backend.delay.NboxWork`).

``NBOX_TEST_CLOCK_OFFSET_S`` (read only here, set only by tests) adds an offset to this process's clock, one number
for every rank or a comma-separated list by real rank; such a process counts as a host of its own. Times are
nanoseconds (``time.perf_counter_ns``; reports show microseconds). Why: docs/design/emulated-world.md.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nbox_trace.errors import InvalidInputError

__all__ = ["ROUNDS", "TEST_OFFSET_ENV", "Clock", "ClockSyncError", "deliberate_skew_ns", "estimate_offset",
           "host_key"]

#: Round trips per real rank; the shortest one is kept.
ROUNDS = 24
#: The deliberate per-process clock offset of tests (seconds), see the module docstring.
TEST_OFFSET_ENV = "NBOX_TEST_CLOCK_OFFSET_S"


class ClockSyncError(InvalidInputError):
    """The clock offsets cannot be estimated (bad samples or a bad test offset)."""


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> tuple[int, int]:
    """``(offset_ns, bound_ns)`` from ping-pong samples ``(t0, tk, t1)`` in nanoseconds.

    ``t0``: the reference clock when the ping left; ``tk``: the other clock when it answered; ``t1``: the
    reference clock when the answer arrived. ``offset = reference - other``, from the sample with the shortest
    round trip; ``bound`` is half that round trip (the largest error if the two legs differ).
    """
    if not samples:
        raise ClockSyncError("clock offset: no ping-pong sample")
    t0, tk, t1 = min(samples, key=lambda s: s[2] - s[0])
    if t1 < t0:
        raise ClockSyncError(f"clock offset: a round trip ends before it starts ({t0} -> {t1} ns)")
    return (t0 + t1) // 2 - tk, (t1 - t0 + 1) // 2


def deliberate_skew_ns(real_rank: int, env: Mapping[str, str] | None = None) -> int:
    """This process's deliberate clock offset from ``NBOX_TEST_CLOCK_OFFSET_S`` (0 when unset), nanoseconds."""
    raw = (os.environ if env is None else env).get(TEST_OFFSET_ENV, "").strip()
    if not raw:
        return 0
    parts = [p.strip() for p in raw.split(",")]
    pick = parts[0] if len(parts) == 1 else (parts[real_rank] if real_rank < len(parts) else "0")
    try:
        return round(float(pick) * 1e9)
    except ValueError:
        raise ClockSyncError(f"{TEST_OFFSET_ENV}: not a number of seconds: {pick!r}") from None


def host_key(skew_ns: int = 0, boot_id_path: str = "/proc/sys/kernel/random/boot_id") -> int:
    """A 63-bit number equal for two processes exactly when they read the same clock: the Linux boot's id (every
    process of one boot, network namespaces included, reads one ``CLOCK_MONOTONIC``) mixed with the test skew;
    a random number where the boot id cannot be read (then every pair is estimated)."""
    try:
        with open(boot_id_path, "rb") as f:
            boot = f.read(64).strip()
    except OSError:
        boot = b""
    if not boot:
        boot = os.urandom(16)
    digest = hashlib.blake2b(boot + b"/" + str(skew_ns).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class Clock:
    """This process's clock and its correction onto the reference timeline (nanoseconds).

    ``skew_ns`` is the deliberate test offset (:func:`deliberate_skew_ns`), ``correction_ns`` maps this process's
    ``perf_counter_ns`` onto the reference (it includes the skew), ``bound_ns`` is the estimate's error bound
    (0 for the reference itself or before any estimate), ``lag_ns`` the time the rank has been credited
    (module docstring, "A rank's own lag"; 0 outside a live replay's ``replay.host_work=match``).
    """

    skew_ns: int = 0
    correction_ns: int = 0
    bound_ns: int = 0
    lag_ns: int = 0

    def __post_init__(self) -> None:
        self.correction_ns = self.skew_ns  # unsynchronized: the host clock as it reads

    def host_ns(self) -> int:
        """This host's clock as it reads (``perf_counter_ns`` plus the test skew)."""
        return time.perf_counter_ns() + self.skew_ns

    def to_reference_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` reading on the reference timeline (the rank's lag taken off)."""
        return perf_ns + self.correction_ns - self.lag_ns

    def to_perf_ns(self, reference_ns: float) -> int:
        """A reference time as this process's ``perf_counter_ns`` (a deadline to wait for, with the lag of now)."""
        return int(reference_ns) - self.correction_ns + self.lag_ns

    def local_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` reading on the rank's own timeline (its lag taken off; what records hold)."""
        return perf_ns - self.lag_ns

    def credit(self, ns: int) -> None:
        """Move the rank's timeline ``ns`` nanoseconds behind its host clock (module docstring); ``ns`` >= 0."""
        if ns < 0:
            raise ValueError(f"a clock's lag only grows: credit of {ns} ns")
        self.lag_ns += ns

    def describe(self) -> dict[str, float]:
        """For reports: the correction and its bound in microseconds (test skew shown apart)."""
        return {"offset_us": (self.correction_ns - self.skew_ns) / 1000.0, "bound_us": self.bound_ns / 1000.0,
                "test_skew_us": self.skew_ns / 1000.0}

    def synchronize(self, me: int, n: int, send: Callable[[int, int], None], recv: Callable[[int], int],
                    key: int, rounds: int = ROUNDS) -> None:
        """Estimate the correction with real ranks ``0..n-1`` (``me`` is this one; 0 is the reference).

        ``send(peer, value_ns)`` and ``recv(peer) -> value_ns`` move one integer to or from a peer, blocking;
        ``key`` is this process's :func:`host_key`. Each rank sends rank 0 its key; rank 0 answers 1 when the keys
        differ (another clock), then pings that rank ``rounds + 1`` times (the first round warms the connection
        and is dropped) and sends it its offset and bound; 0 when they match (one clock: offset exactly 0).
        Every rank must call this at the same point.
        """
        if n <= 1:
            return
        if me == 0:
            for k in range(1, n):
                other = recv(k) != key
                send(k, int(other))
                if not other:
                    continue
                samples = []
                for i in range(rounds + 1):
                    t0 = self.host_ns()
                    send(k, t0)
                    tk = recv(k)
                    t1 = self.host_ns()
                    if i:
                        samples.append((t0, tk, t1))
                offset, bound = estimate_offset(samples)
                send(k, offset)
                send(k, bound)
            return
        send(0, key)
        if not recv(0):
            return  # the reference's own clock: correction = skew (0 outside tests)
        for _ in range(rounds + 1):
            recv(0)
            send(0, self.host_ns())
        offset, bound = recv(0), recv(0)
        self.correction_ns = self.skew_ns + offset
        self.bound_ns = bound

