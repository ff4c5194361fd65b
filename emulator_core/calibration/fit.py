"""The fit of ``nbox calibrate`` (:func:`fit`): per collective, the two physical parameters of its algorithm's closed
form ``T(n) = cost(collective, algorithm, n, p, Link(alpha, bw))`` at ``p`` = the ranks measured (2 for send_recv):
``alpha``, the latency of one step (microseconds: a ring all-reduce on p ranks has ``2 (p - 1)`` steps), and
``bw``, the bandwidth of one link (bytes per microsecond). Nothing else: no table that replays the measured points.
So the fit says what another size, another node count (the closed form's steps and bytes at p) or another link rate
(the dimension's ``bandwidth_gbps`` changed) costs, and its time never falls as the size grows. With ``A`` the
coefficient of alpha (``T`` at n = 0 with alpha = 1) and ``t_i`` the measured medians at sizes ``n_i``:

1. ``alpha`` = the median, over the latency-bound sizes (``t_i <= 2 min t``), of the latency at which the closed form
   takes ``t_i`` (alternating with step 2 until both settle);
2. ``bw`` = the bandwidth at which the closed form at ``alpha`` moves all the bandwidth-bound sizes
   (``t_i >= 4 A alpha``) in the sum of their p10 times (their clean transfers): a size-weighted mean, so a library
   that runs small calls in one mode and large ones in another (gloo's all-gather on 2 ranks) is priced by the large
   ones, where a job spends its time. A median of back-to-back calls carries the ranks' skew and the calls the
   scheduler preempted (on the namespace testbed up to 13% above the p10 at 1-16 MiB, where a call after a drained
   link took its p10), which a replay answers from the members' arrivals, not as bandwidth. A size whose own
   bandwidth is off by more than about 30% is left out of a second pass. Without a bandwidth-bound size the
   bandwidth is only bounded below: the bandwidth at which the largest size's bandwidth term is half its time.

:attr:`FitPoint.error_pct` is the model against each median; a point beyond ``max(`` :data:`OUTLIER_MIN` ``, 3 x``
the residuals' robust spread ``)`` is named an outlier (a regime the closed form does not reach, such as a shaper's
burst credit at small sizes): the model is not bent to meet it. barrier: latency only, ``alpha = median t /
ceil(log2 p)``. Units: sizes in bytes (costmodels' convention), times in microseconds, bandwidth in bytes per
microsecond (a scenario's ``bandwidth_gbps`` is gigaBITS per second: 1 Gb/s = 125 bytes/us).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from emulator_core.calibration import _worker as worker
from emulator_core.calibration.spec import ALGORITHMS, SUPPORTED, Beside, CalibrateInputError, Measurement
from emulator_core.network import costmodels as cm

#: The smallest latency a fit gives, microseconds.
ALPHA_FLOOR_US = 1e-3
#: A point is an outlier beyond this relative error at least (module docstring).
OUTLIER_MIN = 0.10
#: A bandwidth-bound size whose own bandwidth is off the fit's by more than this log ratio (about 30%) is left out of
#: the bandwidth's second pass.
OUTLIER_BANDWIDTH = 0.26


@dataclass(frozen=True)
class FitPoint:
    """One measured size against the fitted model: microseconds, ``error_pct = 100·(model - measured)/measured``
    against the median, and whether the point is an outlier the model was not bent to meet (module docstring)."""

    nbytes: int
    measured_us: float
    p10_us: float
    p90_us: float
    model_us: float
    error_pct: float
    outlier: bool = False


@dataclass(frozen=True)
class Fit:
    """One collective's fitted model (see the module docstring for the method).

    Attributes:
        collective, algorithm: the collective and the closed form fitted (``costmodels.COST_MODELS``).
        ranks: the group size measured (p).
        latency_us: alpha, microseconds per step.
        bandwidth_bytes_per_us: one link's bandwidth, bytes per microsecond; ``None`` for barrier.
        efficiency: empty (1.0 at every size: the closed form alone); a scenario's calibration entry keeps the key,
            which files written by an older ``nbox calibrate`` fill.
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


def _solve_bandwidth(coll: str, algo: str, n: float, p: int, alpha: float, t: float) -> float:
    """The bandwidth (bytes/us) at which the closed form takes ``t`` us at latency ``alpha`` (bisection on log bw:
    the time falls as the bandwidth grows; any closed form, the pipelined chain's too); inf if alpha alone takes t."""
    def f(bw: float) -> float:
        return cm.cost(coll, algo, n, p, cm.Link(alpha, bw))

    lo, hi = 1e-9, 1e15
    if f(hi) >= t:
        return math.inf
    if f(lo) <= t:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > t else (lo, mid)
        if hi / lo < 1 + 1e-12:
            break
    return math.sqrt(lo * hi)


def _solve_alpha(coll: str, algo: str, n: float, p: int, bw: float, t: float, a: float) -> float:
    """The latency (us per step) at which the closed form takes ``t`` us at bandwidth ``bw`` (0 if the bandwidth term
    alone takes t): bisection, the time grows with alpha."""
    def f(alpha: float) -> float:
        return cm.cost(coll, algo, n, p, cm.Link(alpha, bw))

    lo, hi = 0.0, t / a
    if f(lo) >= t:
        return 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) <= t else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def _bandwidth_of(coll: str, algo: str, p: int, alpha: float, bound: Sequence[Measurement]) -> float:
    """The bandwidth that moves ``bound``'s sizes in the sum of their clean times at ``alpha`` (module docstring),
    once more without a size whose own bandwidth is off it by more than :data:`OUTLIER_BANDWIDTH` (an outlier).
    A pipelined chain (not linear in the size): the closed form solved on the largest size."""
    def clean(m: Measurement) -> float:
        return min(m.p10_us, m.median_us)

    if not _linear(coll, algo, p):
        return _solve_bandwidth(coll, algo, bound[-1].nbytes, p, alpha, clean(bound[-1]))

    def weighted(ms: Sequence[Measurement]) -> float:
        moved = sum(cm.cost(coll, algo, m.nbytes, p, cm.Link(0.0, 1.0)) for m in ms)
        return moved / sum(max(clean(m) - cm.cost(coll, algo, 0, p, cm.Link(alpha, 1.0)), 1e-9) for m in ms)

    bw = weighted(bound)
    kept = [m for m in bound
            if abs(math.log(_solve_bandwidth(coll, algo, m.nbytes, p, alpha, clean(m)) / bw)) <= OUTLIER_BANDWIDTH]
    return weighted(kept) if kept else bw


def _linear(coll: str, algo: str, p: int) -> bool:
    """Whether the closed form is ``A alpha + K n / bw`` (every form but the pipelined chain of a ring broadcast)."""
    n = 1 << 20
    whole = cm.cost(coll, algo, n, p, cm.Link(10.0, 100.0))
    parts = cm.cost(coll, algo, 0, p, cm.Link(10.0, 100.0)) + cm.cost(coll, algo, n, p, cm.Link(0.0, 100.0))
    return math.isclose(whole, parts, rel_tol=1e-9)


def _fit_one(coll: str, algo: str, p: int, ms: Sequence[Measurement]) -> Fit:
    ms = sorted(ms, key=lambda m: m.nbytes)
    a = cm.cost(coll, algo, 0, p, cm.Link(1.0, 1.0))
    if coll == "barrier":
        alpha = significant(max(worker.percentile([m.median_us for m in ms], 0.5) / a, ALPHA_FLOOR_US))
        return _with_points(Fit(coll, algo, p, alpha, None, ()), ms)
    fastest = min(m.median_us for m in ms)
    small = [m for m in ms if m.median_us <= 2 * fastest]
    bw = 1e15
    alpha = ALPHA_FLOOR_US
    for _ in range(8):  # alpha from the small sizes at bw, bw from the large ones' p10 at alpha (module docstring)
        alpha = max(ALPHA_FLOOR_US, statistics.median(_solve_alpha(coll, algo, m.nbytes, p, bw, m.median_us, a)
                                                      for m in small))
        bound = [m for m in ms if m.median_us >= 4 * a * alpha]
        if not bound:  # latency-bound everywhere: the bandwidth is only bounded below
            bw = _solve_bandwidth(coll, algo, ms[-1].nbytes, p, ms[-1].median_us / (2 * a), ms[-1].median_us)
            break
        bw = _bandwidth_of(coll, algo, p, alpha, bound)
    return _with_points(Fit(coll, algo, p, significant(alpha), significant(bw), ()), ms)


def _with_points(f: Fit, ms: Sequence[Measurement]) -> Fit:
    """``f`` with every measured size against its model, the outliers marked (module docstring)."""
    res = [(f.model_us(m.nbytes) - m.median_us) / m.median_us if m.median_us > 0 else 0.0 for m in ms]
    centre = statistics.median(res) if res else 0.0
    spread = 1.4826 * statistics.median(abs(r - centre) for r in res) if res else 0.0
    limit = max(OUTLIER_MIN, 3 * spread)
    pts = tuple(FitPoint(m.nbytes, m.median_us, m.p10_us, m.p90_us, f.model_us(m.nbytes), 100.0 * r,
                         f.bandwidth_bytes_per_us is not None and abs(r) > limit) for m, r in zip(ms, res, strict=True))
    return Fit(f.collective, f.algorithm, f.ranks, f.latency_us, f.bandwidth_bytes_per_us, f.efficiency, pts)


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
