"""The fit of ``nbox calibrate`` (:func:`fit`): per collective, with the algorithm's closed form ``T(n) =
cost(collective, algorithm, n, p, Link(alpha, bw, e))`` at ``p`` = the ranks measured (2 for send_recv), ``A`` the
coefficient of alpha (``T`` at n = 0 with alpha = 1) and ``t_i`` the measured medians at sizes ``n_i``:

1. start from ``alpha = min_i t_i / A`` (the fastest point is all latency);
2. peak bandwidth ``bw`` = the largest bandwidth that makes the model (efficiency 1) meet a measurement at the
   bandwidth-dominated sizes (``t_i >= 2·A·alpha``: the large ones);
3. alpha = the largest latency under which no latency-dominated point (the others) needs more than ``bw``
   (for the linear forms ``min_i (t_i - T(n_i; alpha=0, bw)) / A``; solved on the closed form, so the
   pipelined chain works too): alpha comes from the small sizes; 2-3 repeat until alpha settles; then ``bw``
   is raised to the largest bandwidth any point needs at that alpha (a mid size that runs faster than the
   largest ones, e.g. from cache, sets it), so that every efficiency is <= 1;
   the medians are first made non-decreasing in size (:func:`monotone`, robust to one outlier);
4. efficiency ``e(n_i) = bw_i / bw`` in (0, 1], where ``bw_i`` is the bandwidth that makes the closed form
   match ``t_i`` exactly (solved numerically on the closed form itself), at the collective's nccl-tests size
   (``p·n`` for all_gather); between measured sizes, points on the power law through the neighbours
   (:func:`power_law_points`), which is what carries the fit to sizes that were not measured.

barrier: latency only, ``alpha = t / ceil(log2 p)``. Timings cannot tell latency from a low efficiency at the
latency-bound sizes; the convention above charges that time to alpha (exact when those sizes run at full
efficiency; otherwise alpha is high by about the bandwidth term of the smallest size, a fraction of a percent
on loopback). Without a bandwidth-dominated size the bandwidth is only bounded below: the fit takes the
bandwidth at which the largest size's bandwidth term is half its time.

Units: sizes in bytes (costmodels' convention), times in microseconds, bandwidth in bytes per microsecond
(a scenario's ``bandwidth_gbps`` is gigaBITS per second: 1 Gb/s = 125 bytes/us).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from emulator_core.calibration import _worker as worker
from emulator_core.calibration.spec import ALGORITHMS, SUPPORTED, Beside, CalibrateInputError, Measurement
from emulator_core.network import costmodels as cm

#: The smallest latency a fit gives, microseconds.
ALPHA_FLOOR_US = 1e-3
_BETWEEN = 3  # efficiency points inserted between measured sizes


@dataclass(frozen=True)
class FitPoint:
    """One measured size against the fitted model: microseconds, and ``error_pct = 100·(model - measured)/measured``."""

    nbytes: int
    measured_us: float
    p10_us: float
    p90_us: float
    model_us: float
    error_pct: float


@dataclass(frozen=True)
class Fit:
    """One collective's fitted model (see the module docstring for the method).

    Attributes:
        collective, algorithm: the collective and the closed form fitted (``costmodels.COST_MODELS``).
        ranks: the group size measured (p).
        latency_us: alpha, microseconds.
        bandwidth_bytes_per_us: peak bandwidth (efficiency 1.0), bytes per microsecond; ``None`` for barrier.
        efficiency: ``(size_bytes, fraction)`` points at the collective's nccl-tests size (``costmodels.Efficiency``).
        points: every measured size, measured vs model.
    """

    collective: str
    algorithm: str
    ranks: int
    latency_us: float
    bandwidth_bytes_per_us: float | None
    efficiency: tuple[tuple[int, float], ...]
    points: tuple[FitPoint, ...] = field(default=())

    @property
    def bandwidth_gbps(self) -> float | None:
        """Peak bandwidth in gigabits per second (1 Gb/s = 125 bytes/us), as a scenario's ``bandwidth_gbps``."""
        return None if self.bandwidth_bytes_per_us is None else self.bandwidth_bytes_per_us / 125.0

    def link(self) -> cm.Link:
        """The cost-model link of this fit (bandwidth 1 byte/us for barrier, which ignores it)."""
        return cm.Link(self.latency_us, self.bandwidth_bytes_per_us or 1.0, cm.Efficiency(self.efficiency))

    def model_us(self, nbytes: float) -> float:
        """Modeled time of the collective on ``nbytes`` (costmodels' convention) at ``ranks``, microseconds."""
        return cm.cost(self.collective, self.algorithm, nbytes, self.ranks, self.link())

    def median_abs_error_pct(self) -> float:
        """The median of ``|error_pct|`` over the measured sizes."""
        errs = sorted(abs(p.error_pct) for p in self.points)
        return worker.percentile(errs, 0.5) if errs else 0.0


def size_key(collective: str, nbytes: float, p: int) -> float:
    """The nccl-tests "size" at which a collective's efficiency is read: ``p·n`` for all_gather/gather/scatter,
    0 for barrier, ``n`` otherwise (see the table in costmodels)."""
    if collective == "barrier":
        return 0.0
    return p * nbytes if collective in ("all_gather", "gather", "scatter") else nbytes


def significant(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits."""
    return float(f"{x:.{digits}g}")


def _needed_bandwidth(coll: str, algo: str, n: float, p: int, alpha: float, t: float) -> float:
    """The bandwidth (bytes/us, efficiency 1) at which the closed form takes ``t`` us; inf if alpha alone >= t."""
    def f(bw: float) -> float:
        return cm.cost(coll, algo, n, p, cm.Link(alpha, bw))

    lo, hi = 1e-9, 1e15
    if f(hi) >= t:
        return math.inf
    if f(lo) <= t:
        return lo
    for _ in range(200):  # bisection on log(bw): the model time decreases with bandwidth
        mid = math.sqrt(lo * hi)
        if f(mid) > t:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return math.sqrt(lo * hi)


def monotone(values: Sequence[float]) -> list[float]:
    """A non-decreasing fit to ``values`` that one outlier cannot move far: isotonic regression with each
    pooled block at the MEDIAN of its values (pool adjacent violators).

    A collective's time does not fall as its size grows; where a median is above a larger size's, the two are
    noise around one level. Pooling by median (not mean) keeps a single preempted point from lifting its
    neighbours, and unlike a lower envelope it does not bias the level down.
    """
    blocks: list[list[float]] = []
    for v in values:
        blocks.append([v])
        while len(blocks) > 1 and statistics.median(blocks[-2]) > statistics.median(blocks[-1]):
            last = blocks.pop()
            blocks[-1].extend(last)
    return [statistics.median(b) for b in blocks for _ in b]


def _max_alpha(coll: str, algo: str, n: float, p: int, bw: float, t: float, a: float) -> float:
    """The largest latency (us) at which the closed form at bandwidth ``bw`` takes at most ``t`` us (0 if none)."""
    def f(alpha: float) -> float:
        return cm.cost(coll, algo, n, p, cm.Link(alpha, bw))

    lo, hi = 0.0, t / a  # cost >= A·alpha, so alpha <= t/A
    if f(lo) >= t:
        return 0.0
    for _ in range(100):  # bisection: the model time increases with alpha
        mid = 0.5 * (lo + hi)
        if f(mid) <= t:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def _alpha_and_peak(coll: str, algo: str, p: int, a: float, ns: Sequence[int],
                    ts: Sequence[float]) -> tuple[float, float]:
    """Steps 1-3 of the module docstring: alpha (us) and the peak bandwidth (bytes/us), rounded to 6 digits."""
    def max_alpha(bw: float, idx: Sequence[int]) -> float:
        return min(_max_alpha(coll, algo, ns[i], p, bw, ts[i], a) for i in idx)

    def peak_at(alpha: float, idx: Sequence[int]) -> float:
        need = [_needed_bandwidth(coll, algo, ns[i], p, alpha, ts[i]) for i in idx]
        return max((bw for bw in need if math.isfinite(bw)), default=math.inf)

    alpha = min(ts) / a
    big = [i for i, t in enumerate(ts) if t >= 2 * a * alpha]
    small = [i for i in range(len(ts)) if i not in big]
    if big:
        for _ in range(100):
            peak = peak_at(alpha, big)
            new = max(ALPHA_FLOOR_US, min(alpha, max_alpha(peak, small)))
            done, alpha = alpha - new <= 1e-10 * alpha, new
            if done:
                break
    else:  # latency-bound everywhere: the bandwidth is only bounded below; take the bound at which the
        # largest size's bandwidth term is half its time, then alpha as in step 3
        peak = _needed_bandwidth(coll, algo, ns[-1], p, ts[-1] / (2 * a), ts[-1])
        alpha = max(ALPHA_FLOOR_US, max_alpha(peak, range(len(ts))))
    return significant(alpha), significant(peak_at(alpha, range(len(ts))) if big else peak)


def power_law_points(points: Sequence[tuple[int, float]], between: int = _BETWEEN) -> tuple[tuple[int, float], ...]:
    """``points`` with ``between`` points inserted in each interval on the power law through its ends.

    costmodels interpolates an efficiency linearly in ``log(size)``; the inserted points make it follow
    ``log e`` linear in ``log size`` instead, which carries both a flat efficiency and a latency plateau
    (where the fitted ``e`` grows like the size) to the sizes between the measured ones. Sizes stay strictly
    increasing integers; fractions stay in (0, 1].
    """
    out: list[tuple[int, float]] = []
    for (n0, e0), (n1, e1) in itertools.pairwise(points):
        out.append((n0, e0))
        for k in range(1, between + 1):
            f = k / (between + 1)
            n = round(n0 * (n1 / n0) ** f)
            if out[-1][0] < n < n1:
                out.append((n, min(1.0, significant(e0 ** (1 - f) * e1**f, 4))))
    return tuple(out + list(points[-1:]))


def _fit_one(coll: str, algo: str, p: int, ms: Sequence[Measurement]) -> Fit:
    ms = sorted(ms, key=lambda m: m.nbytes)
    a = cm.cost(coll, algo, 0, p, cm.Link(1.0, 1.0))
    if coll == "barrier":
        alpha = significant(max(worker.percentile([m.median_us for m in ms], 0.5) / a, ALPHA_FLOOR_US))
        return _with_points(Fit(coll, algo, p, alpha, None, ()), ms)
    ns, ts = [m.nbytes for m in ms], monotone([m.median_us for m in ms])
    alpha, peak = _alpha_and_peak(coll, algo, p, a, ns, ts)
    eff: dict[int, list[float]] = {}
    for n, t in zip(ns, ts, strict=True):
        bw = _needed_bandwidth(coll, algo, n, p, alpha, t)
        e = 1.0 if not math.isfinite(bw) else min(1.0, max(1e-6, bw / peak))
        eff.setdefault(int(size_key(coll, n, p)), []).append(e)
    measured = [(k, min(1.0, significant(sum(v) / len(v), 4))) for k, v in sorted(eff.items()) if k > 0]
    return _with_points(Fit(coll, algo, p, alpha, peak, power_law_points(measured)), ms)


def _with_points(f: Fit, ms: Sequence[Measurement]) -> Fit:
    pts = []
    for m in ms:
        model = f.model_us(m.nbytes)
        pts.append(FitPoint(m.nbytes, m.median_us, m.p10_us, m.p90_us, model,
                            100.0 * (model - m.median_us) / m.median_us if m.median_us > 0 else 0.0))
    return Fit(f.collective, f.algorithm, f.ranks, f.latency_us, f.bandwidth_bytes_per_us, f.efficiency, tuple(pts))


def fit(measurements: Sequence[Measurement], nproc: int, backend: str = "gloo") -> list[Fit]:
    """One :class:`Fit` per collective measured (in :data:`SUPPORTED` order), with the algorithm of
    :data:`ALGORITHMS` for ``backend`` at p = ``nproc`` (2 for send_recv, whose pairs are 2-rank groups).

    Raises:
        CalibrateInputError: no measurements, an unknown collective or backend, or a time <= 0.
    """
    if backend not in ALGORITHMS:
        raise CalibrateInputError(f"backend = {backend!r}: must be one of {', '.join(ALGORITHMS)}")
    if not measurements:
        raise CalibrateInputError("nothing to fit: no measurements")
    groups: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.collective not in ALGORITHMS[backend]:
            raise CalibrateInputError(f"collective = {m.collective!r}: not a calibrated collective "
                                      f"(supported: {', '.join(SUPPORTED)})")
        if not (m.median_us > 0 and math.isfinite(m.median_us)):
            raise CalibrateInputError(f"{m.collective} of {m.nbytes} bytes: median_us = {m.median_us!r}: must be > 0")
        groups.setdefault(m.collective, []).append(m)
    out = []
    for coll in SUPPORTED:
        if coll in groups:
            p = 2 if coll == "send_recv" else nproc
            out.append(_fit_one(coll, ALGORITHMS[backend][coll], p, groups[coll]))
    return out


#: A busy call must be slower than its idle partner in at least this share of the pairs to count.
BUSY_MIN_SLOWER = 0.75
#: ... and slower by at least this share of the idle median (the link's run-to-run noise is below it).
BUSY_MIN_EXCESS = 0.01


@dataclass(frozen=True)
class BusyFit:
    """What a computing thread cost a collective (``_calibrate_worker`` step 4): medians of the idle and busy calls
    of ``nbytes`` (microseconds), ``slower`` of ``pairs`` busy calls slower than their idle partner, and the
    ``busy_slowdown`` it sets (:func:`fit_busy`)."""

    collective: str
    nbytes: int
    pairs: int
    slower: int
    idle_us: float
    busy_us: float
    busy_slowdown: float

    def describe(self) -> str:
        """One line for the fit table and the TOML header."""
        seen = (f"busy_slowdown = {self.busy_slowdown:g}" if self.busy_slowdown > 1
                else "not significant: busy_slowdown = 1")
        return (f"beside compute: {self.collective} of {self.nbytes} bytes, {self.idle_us:.0f} us on an idle core, "
                f"{self.busy_us:.0f} us beside a computing thread (medians; {self.slower} of {self.pairs} slower): "
                f"{seen}")


def fit_beside(beside: Beside) -> BusyFit:
    """The :class:`BusyFit` of one collective's calls beside compute."""
    idle = worker.percentile(list(beside.idle_us), 0.5)
    busy = worker.percentile(list(beside.busy_us), 0.5)
    slower = sum(1 for i, b in zip(beside.idle_us, beside.busy_us, strict=True) if b > i)
    return BusyFit(beside.collective, beside.nbytes, len(beside.idle_us), slower, idle, busy,
                   fit_busy(beside.idle_us, beside.busy_us))


def fit_busy(idle_us: Sequence[float], busy_us: Sequence[float]) -> float:
    """How many times longer a call ran beside a computing thread (``scenario.Calibration.busy_slowdown``): the
    ratio of the medians when the busy call was slower in at least :data:`BUSY_MIN_SLOWER` of the pairs and by
    at least :data:`BUSY_MIN_EXCESS`, else 1 (no pairs: not measured; a core of its own; noise). At most 100."""
    if not idle_us or len(idle_us) != len(busy_us):
        return 1.0
    idle, busy = worker.percentile(list(idle_us), 0.5), worker.percentile(list(busy_us), 0.5)
    slower = sum(1 for i, b in zip(idle_us, busy_us, strict=True) if b > i)
    ok = idle > 0 and slower >= math.ceil(BUSY_MIN_SLOWER * len(idle_us)) and busy > idle * (1 + BUSY_MIN_EXCESS)
    return min(100.0, significant(busy / idle, 3)) if ok else 1.0
