"""``nbox calibrate``: measure the real collectives on real ranks, fit the cost models, write a scenario fragment.

Pipeline: :func:`measure` launches ``python -m torch.distributed.run --standalone --nproc-per-node N
-m emulator_core._calibrate_worker`` (one process group of N ranks on this machine, gloo or NCCL) and reads
the per-(collective, size) timings it reports (see that module for the timing method); :func:`fit` turns them
into one :class:`Fit` per collective; :func:`scenario_fragment` and :func:`profile_toml` turn the fits into a
scenario ("the fabric this was recorded on") whose single dimension carries the all_reduce figures and whose
``[[calibration]]`` entries carry every collective's factors and efficiency curve (``scenario.Calibration``).

Units: sizes are bytes in costmodels' convention (``nbytes`` = the per-rank input; all_gather: the per-rank
shard; all_to_all: the whole per-rank send buffer; barrier: 0); times are microseconds; cost-model bandwidth
is bytes per microsecond (1 GB/s = 1000 bytes/us) and a scenario's ``bandwidth_gbps`` is gigaBITS per second
(1 Gb/s = 125 bytes/us).

The fit (:func:`fit`), per collective, with the algorithm's closed form ``T(n) = cost(collective, algorithm, n,
p, Link(alpha, bw, e))`` at ``p`` = the ranks measured (2 for send_recv), ``A`` the coefficient of alpha (``T``
at n = 0 with alpha = 1) and ``t_i`` the measured medians at sizes ``n_i``:

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
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from emulator_core import _calibrate_worker as worker
from emulator_core import costmodels as cm
from emulator_core.scenario import Calibration, Dimension, Scenario, Topology
from emulator_core.scenario_toml import dump_toml
from nbox_trace.errors import InvalidInputError, NboxError, OutputWriteError
from nbox_trace.files import write_atomic
from nbox_trace.procs import root_error, run_with_deadline

#: Collectives ``nbox calibrate`` can measure (in this order).
SUPPORTED = worker.SUPPORTED
#: The closed form fitted per backend and collective: what the library is known to run (at p = 2 most
#: candidates coincide). NCCL's all_to_all and send/recv are grouped point-to-point sends (direct).
ALGORITHMS: Mapping[str, Mapping[str, str]] = {
    "gloo": {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "broadcast": "binomial_tree",
             "all_to_all": "pairwise", "barrier": "dissemination", "send_recv": "direct"},
    "nccl": {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "broadcast": "ring",
             "all_to_all": "direct", "barrier": "dissemination", "send_recv": "direct"},
}
BACKENDS = ("gloo", "nccl")
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: Default sizes: 1 KiB .. 64 MiB in x4 steps (bytes).
DEFAULT_SIZES: tuple[int, ...] = tuple(KIB * 4**k for k in range(9))
MAX_SIZE = 4 * GIB
_UNITS = {"": 1, "b": 1, "k": KIB, "kb": KIB, "kib": KIB, "m": MIB, "mb": MIB, "mib": MIB, "g": GIB, "gb": GIB,
          "gib": GIB}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_ALPHA_FLOOR_US = 1e-3
_BETWEEN = 3  # efficiency points inserted between measured sizes


class CalibrationError(NboxError):
    """The measurement run failed: a rank raised, died or hung (the message names the rank, collective, size)."""

    exit_code = 1


class CalibrationWriteError(OutputWriteError):
    """The profile could not be written."""


class CalibrateInputError(InvalidInputError):
    """A calibration setting is invalid (the message names the setting and the bad value)."""


def parse_size(text: str) -> int:
    """Bytes from ``1024``, ``1KiB``, ``64MiB``, ``1.5GiB`` (K/KB/KiB etc. are all binary: 1 KiB = 1024 B)."""
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise CalibrateInputError(f"sizes: {text!r} is not a size (e.g. 4096, 1KiB, 64MiB, 1GiB)")
    n = float(m.group(1)) * _UNITS[unit]
    if n != int(n):
        raise CalibrateInputError(f"sizes: {text!r} is not a whole number of bytes")
    return int(n)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Sizes from a comma list (``1KiB,64KiB``) whose items may be ranges ``A..B``: A, 4A, 16A, ... up to B
    (B itself included). Sorted, without duplicates; validation of the values is :class:`CalibrateConfig`'s."""
    out: set[int] = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if ".." in item:
            lo_text, hi_text = item.split("..", 1)
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo < 1 or hi < lo:
                raise CalibrateInputError(f"sizes: range {item!r} must go from a size >= 1 up to a larger one")
            n = lo
            while n < hi:
                out.add(n)
                n *= 4
            out.add(hi)
        else:
            out.add(parse_size(item))
    if not out:
        raise CalibrateInputError(f"sizes: {text!r} lists no size")
    return tuple(sorted(out))


@dataclass(frozen=True)
class CalibrateConfig:
    """What to measure. Validated at construction (:class:`CalibrateInputError` names the setting).

    Attributes:
        nproc: ranks to launch on this machine (2 .. 1024).
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (one GPU per rank).
        sizes: message sizes in bytes (1 .. 4 GiB; costmodels' convention, e.g. all_gather: the shard); sorted.
        collectives: a subset of :data:`SUPPORTED`.
        warmup: untimed iterations per point (>= 1; they also size the timed run).
        rounds: interleaved rounds over all points (>= 1; see ``_calibrate_worker``).
        min_iters, max_iters: bounds on the timed iterations per point.
        budget_s: about this many seconds of timed iterations per point (> 0).
        timeout_s: deadline for the whole run in seconds; then every rank is stopped (> 0).
        dimension: the name of the topology dimension the fragment describes.
    """

    nproc: int = 2
    backend: str = "gloo"
    sizes: tuple[int, ...] = DEFAULT_SIZES
    collectives: tuple[str, ...] = SUPPORTED
    warmup: int = 2
    rounds: int = 3
    min_iters: int = 7
    max_iters: int = 400
    budget_s: float = 0.3
    timeout_s: float = 600.0
    dimension: str = "loopback"

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, why: str) -> CalibrateInputError:
            return CalibrateInputError(f"{key} = {value!r}: {why}")

        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or not 2 <= self.nproc <= 1024:
            raise bad("nproc", self.nproc, "must be an integer from 2 to 1024 (collectives need peers)")
        if self.backend not in BACKENDS:
            raise bad("backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        sizes = tuple(sorted(set(self.sizes)))
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_SIZE:
                raise bad("sizes", s, f"each size must be an integer number of bytes from 1 to {MAX_SIZE} (4 GiB)")
        if not sizes:
            raise bad("sizes", self.sizes, "needs at least one size")
        object.__setattr__(self, "sizes", sizes)
        colls = tuple(self.collectives)
        for c in colls:
            if c not in SUPPORTED:
                raise bad("collectives", c, f"unknown or not measurable (supported: {', '.join(SUPPORTED)})")
        if not colls or len(set(colls)) != len(colls):
            raise bad("collectives", colls, "needs at least one collective, each listed once")
        object.__setattr__(self, "collectives", colls)
        for key, lo in (("warmup", 1), ("rounds", 1), ("min_iters", 1), ("max_iters", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(key, v, f"must be an integer >= {lo}")
        if self.max_iters < self.min_iters:
            raise bad("max_iters", self.max_iters, f"must be >= min_iters ({self.min_iters})")
        for key in ("budget_s", "timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise bad(key, v, "must be a number of seconds > 0")
        if not isinstance(self.dimension, str) or not _NAME_RE.match(self.dimension):
            raise bad("dimension", self.dimension, "must be 1-64 letters, digits, '_' or '-', starting with a letter")


@dataclass(frozen=True)
class Measurement:
    """One (collective, size) point: per-iteration times (max over ranks), microseconds.

    ``nbytes`` is what was actually moved (rounded to whole float32 elements), ``requested_bytes`` what was
    asked; ``ranks`` the group size the cost model must use (2 for send_recv); ``rounds_us`` the samples of
    each interleaved round (see :func:`summarize` to rebuild a measurement from some of them).
    """

    collective: str
    nbytes: int
    requested_bytes: int
    ranks: int
    iterations: int
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    max_us: float
    rounds_us: tuple[tuple[float, ...], ...] = field(default=(), compare=False, repr=False)


def summarize(collective: str, nbytes: int, requested_bytes: int, ranks: int,
              rounds_us: Sequence[Sequence[float]]) -> Measurement:
    """A :class:`Measurement` from per-round samples (microseconds): median, p10, p90, min, max over all of them.

    Raises:
        CalibrateInputError: no sample.
    """
    times = [float(t) for rnd in rounds_us for t in rnd]
    if not times:
        raise CalibrateInputError(f"{collective} of {nbytes} bytes: no samples")
    q = worker.percentile
    return Measurement(collective, nbytes, requested_bytes, ranks, len(times), q(times, 0.5), q(times, 0.1),
                       q(times, 0.9), min(times), max(times), tuple(tuple(float(t) for t in r) for r in rounds_us))


@dataclass(frozen=True)
class MeasureRun:
    """:func:`measure_run`'s result: the measurements and the worker's facts (torch, host, device)."""

    measurements: list[Measurement]
    info: dict[str, Any]
    wall_s: float


def launch_command(config: CalibrateConfig, work: Path, log_dir: Path) -> list[str]:
    """The torch.distributed.run command line for ``config``; results go to ``work``."""
    pg_timeout = max(5.0, min(config.timeout_s * 0.5, 300.0))  # a collective fails before the run deadline
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(config.nproc),
            "--max-restarts", "0", "--log-dir", str(log_dir), "--redirects", "3",
            "-m", "emulator_core._calibrate_worker", "--out", str(work), "--backend", config.backend,
            "--collectives", ",".join(config.collectives), "--sizes", ",".join(map(str, config.sizes)),
            "--warmup", str(config.warmup), "--rounds", str(config.rounds), "--min-iters", str(config.min_iters),
            "--max-iters", str(config.max_iters), "--budget-s", repr(float(config.budget_s)),
            "--timeout-s", repr(pg_timeout)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # ranks x threads > cores runs tens of times slower
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parents[1])  # so `-m emulator_core._calibrate_worker` resolves anywhere
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _read_json(path: Path) -> Any:
    try:  # our own worker's small JSON files; None when missing or unreadable
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _failure(config: CalibrateConfig, work: Path, log_dir: Path, rc: int | None, timed_out: bool,
             stderr: str) -> CalibrationError:
    errors = []
    for r in range(config.nproc):
        err = _read_json(worker.error_file(work, r))
        if isinstance(err, dict):
            errors.append((float(err.get("time") or 0.0), r, err))
    if errors:  # the earliest error is the cause, unless it only says a peer went away first
        _, rank, err = errors[root_error([(t, r, str(e.get("message", ""))) for t, r, e in errors])]
        what = (f"in {err.get('collective')} of {err.get('nbytes')} bytes" if err.get("collective")
                else f"during {err.get('phase', 'start-up')}")
        msg = f"rank {rank} failed {what}: {err.get('type', 'error')}: {str(err.get('message', ''))[:500]}"
        others = sorted(r for _, r, _ in errors if r != rank)
        return CalibrationError(msg + (f" (then rank(s) {others} failed too)" if others else ""))
    progress = _read_json(work / worker.PROGRESS)
    at = (f"; rank 0 was measuring {progress.get('collective')} of {progress.get('nbytes')} bytes"
          if isinstance(progress, dict) else "; no rank had started measuring")
    if timed_out:
        return CalibrationError(f"the calibration did not finish within {config.timeout_s:g} s (--timeout) and "
                                f"was stopped{at}")
    tails = [(f"rank {log.parent.name}", log.read_text(errors="replace").strip().splitlines()[-6:])
             for log in sorted(log_dir.rglob("stderr.log")) if log.is_file()]
    name, tail = next(((n, t) for n, t in tails if t), ("torchrun", stderr.strip().splitlines()[-6:]))
    detail = f"\n  last lines of {name} stderr:\n    " + "\n    ".join(tail) if tail else ""
    return CalibrationError(f"the calibration run exited with code {rc}{at}{detail}")


def _measurements(doc: Any) -> list[Measurement]:
    if not isinstance(doc, dict) or doc.get("schema") != worker.SCHEMA or not isinstance(doc.get("results"), list):
        raise CalibrationError(f"the worker's result is not a {worker.SCHEMA} document")
    out = []
    for r in doc["results"]:
        try:
            out.append(summarize(str(r["collective"]), int(r["nbytes"]), int(r["requested_bytes"]),
                                 int(r["ranks"]), r["rounds_us"]))
        except (KeyError, TypeError, ValueError, CalibrateInputError) as exc:
            raise CalibrationError(f"the worker's result has a malformed entry: {exc!r}") from None
    return out


def measure_run(config: CalibrateConfig) -> MeasureRun:
    """Launch the ranks, wait at most ``config.timeout_s`` seconds, return the measurements and worker facts.

    Raises:
        CalibrationError: a rank failed (named with its collective and size), the run timed out (the process
            group of torchrun and every rank is terminated), or it produced no result.
    """
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="nbox-calibrate-"))
    log_dir = work / "logs"
    try:
        rc, timed_out, err = run_with_deadline(launch_command(config, work, log_dir), _env(), config.timeout_s)
        result = work / worker.RESULT
        if timed_out or rc != 0 or not result.is_file():
            raise _failure(config, work, log_dir, rc, timed_out, err.decode(errors="replace"))
        doc = _read_json(result)
        measurements = _measurements(doc)
        info = {k: v for k, v in doc.items() if k != "results"}
        return MeasureRun(measurements, info, time.monotonic() - started)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(config: CalibrateConfig) -> list[Measurement]:
    """The measurements of :func:`measure_run` (see there)."""
    return measure_run(config).measurements


# ---------------------------------------------------------------------------------------------------- fit


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
        jitter_us: the spread, for a scenario's ``jitter_us`` (see :func:`jitter_table`).
    """

    collective: str
    algorithm: str
    ranks: int
    latency_us: float
    bandwidth_bytes_per_us: float | None
    efficiency: tuple[tuple[int, float], ...]
    points: tuple[FitPoint, ...] = field(default=())
    jitter_us: tuple[tuple[float, float], ...] = field(default=())

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


def _sig(x: float, digits: int = 6) -> float:
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
            new = max(_ALPHA_FLOOR_US, min(alpha, max_alpha(peak, small)))
            done, alpha = alpha - new <= 1e-10 * alpha, new
            if done:
                break
    else:  # latency-bound everywhere: the bandwidth is only bounded below; take the bound at which the
        # largest size's bandwidth term is half its time, then alpha as in step 3
        peak = _needed_bandwidth(coll, algo, ns[-1], p, ts[-1] / (2 * a), ts[-1])
        alpha = max(_ALPHA_FLOOR_US, max_alpha(peak, range(len(ts))))
    return _sig(alpha), _sig(peak_at(alpha, range(len(ts))) if big else peak)


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
                out.append((n, min(1.0, _sig(e0 ** (1 - f) * e1**f, 4))))
    return tuple(out + list(points[-1:]))


#: Quantiles of a jitter table: every 5%, plus the 99th.
JITTER_QUANTILES = (*(i / 20 for i in range(20)), 0.99, 1.0)


def jitter_table(ms: Sequence[Measurement]) -> tuple[tuple[float, float], ...]:
    """How much later than the median of its size each timed call ended, pooled over the sizes, as
    ``(quantile, extra_us)`` at :data:`JITTER_QUANTILES` (empty when there are no samples).

    Additive, not relative: on a shared host the slow calls of every size are late by about the same
    few milliseconds (a descheduled thread, a wake-up), e.g. the loopback p90 - median was +3.4 ms at 1 KiB,
    1 MiB and 16 MiB alike. A call faster than its median counts as 0 (played at the median): the model
    fits medians, and a negative delta pooled from large sizes would exceed small calls' whole cost.
    """
    extra = sorted(max(0.0, t - m.median_us) for m in ms for rnd in m.rounds_us for t in rnd)
    if not extra:
        return ()
    return tuple((q, _sig(worker.percentile(extra, q), 4)) for q in JITTER_QUANTILES)


def _fit_one(coll: str, algo: str, p: int, ms: Sequence[Measurement]) -> Fit:
    ms = sorted(ms, key=lambda m: m.nbytes)
    a = cm.cost(coll, algo, 0, p, cm.Link(1.0, 1.0))
    if coll == "barrier":
        alpha = _sig(max(worker.percentile([m.median_us for m in ms], 0.5) / a, _ALPHA_FLOOR_US))
        return _with_points(Fit(coll, algo, p, alpha, None, ()), ms)
    ns, ts = [m.nbytes for m in ms], monotone([m.median_us for m in ms])
    alpha, peak = _alpha_and_peak(coll, algo, p, a, ns, ts)
    eff: dict[int, list[float]] = {}
    for n, t in zip(ns, ts, strict=True):
        bw = _needed_bandwidth(coll, algo, n, p, alpha, t)
        e = 1.0 if not math.isfinite(bw) else min(1.0, max(1e-6, bw / peak))
        eff.setdefault(int(size_key(coll, n, p)), []).append(e)
    measured = [(k, min(1.0, _sig(sum(v) / len(v), 4))) for k, v in sorted(eff.items()) if k > 0]
    return _with_points(Fit(coll, algo, p, alpha, peak, power_law_points(measured)), ms)


def _with_points(f: Fit, ms: Sequence[Measurement]) -> Fit:
    pts = []
    for m in ms:
        model = f.model_us(m.nbytes)
        pts.append(FitPoint(m.nbytes, m.median_us, m.p10_us, m.p90_us, model,
                            100.0 * (model - m.median_us) / m.median_us if m.median_us > 0 else 0.0))
    return Fit(f.collective, f.algorithm, f.ranks, f.latency_us, f.bandwidth_bytes_per_us, f.efficiency, tuple(pts),
               jitter_table(ms))


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


# ------------------------------------------------------------------------------------------ the fragment


def scenario_fragment(fits: Sequence[Fit], *, nproc: int, dimension: str = "loopback",
                      world_size: int | None = None) -> Scenario:
    """The scenario of the measured fabric: ``world_size`` (default ``nproc``) ranks on one ``switch`` dimension
    of size 0 (= fill) whose ``bandwidth_gbps`` and ``latency_us`` are the all_reduce fit's (else the first fit
    with a bandwidth), plus one ``[[calibration]]`` per fit with factors relative to those figures (barrier:
    latency only). An all_to_all fit also calibrates all_to_all_v (the same algorithm family).
    """
    if not fits:
        raise CalibrateInputError("nothing to write: no fits")
    ref = next((f for f in fits if f.collective == "all_reduce"), None) or next(
        (f for f in fits if f.bandwidth_bytes_per_us is not None), fits[0])
    bw_gbps = _sig(ref.bandwidth_gbps) if ref.bandwidth_gbps is not None else 1.0
    latency = _sig(ref.latency_us)
    dim = Dimension(name=dimension, size=0, kind="switch", bandwidth_gbps=bw_gbps, latency_us=latency)
    cals = []
    for f in fits:
        bw_factor = 1.0 if f.bandwidth_gbps is None else _sig(f.bandwidth_gbps / bw_gbps)
        lat_factor = _sig(max(f.latency_us, _ALPHA_FLOOR_US) / max(latency, _ALPHA_FLOOR_US))
        names = [f.collective] + (["all_to_all_v"] if f.collective == "all_to_all" else [])
        cals += [Calibration(n, dimension, f.algorithm, f.ranks, lat_factor, bw_factor, f.efficiency, f.jitter_us)
                 for n in names]
    return Scenario(world_size=world_size or nproc, topology=Topology((dim,)), calibration=tuple(cals))


def format_fits(fits: Sequence[Fit]) -> str:
    """A plain-text table: per collective its fit, then per size measured vs model (us) and the error."""
    lines = []
    for f in fits:
        bw = "-" if f.bandwidth_gbps is None else f"{f.bandwidth_gbps:.3f} Gb/s"
        lines.append(f"{f.collective} ({f.algorithm}, p={f.ranks}): latency {f.latency_us:.2f} us, peak bandwidth "
                     f"{bw}; median |error| {f.median_abs_error_pct():.1f}%")
        lines.append(f"  {'bytes':>12} {'measured us':>13} {'p10-p90 us':>21} {'model us':>12} {'error':>8}")
        for p in f.points:
            lines.append(f"  {p.nbytes:>12} {p.measured_us:>13.1f} {f'{p.p10_us:.1f}-{p.p90_us:.1f}':>21} "
                         f"{p.model_us:>12.1f} {p.error_pct:>7.1f}%")
        if f.jitter_us:
            at = dict(f.jitter_us)
            lines.append(f"  jitter (a call's time over its size's median, all sizes): p50 +{at[0.5]:.0f} us, "
                         f"p75 +{at[0.75]:.0f} us, p90 +{at[0.9]:.0f} us, p99 +{at[0.99]:.0f} us")
    return "\n".join(lines)


def profile_toml(scenario: Scenario, fits: Sequence[Fit], config: CalibrateConfig, info: Mapping[str, Any],
                 *, command: str | None = None) -> str:
    """The fragment as TOML with a header comment: command, machine, date, torch, backend, sizes, fit table."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = command or (f"nbox calibrate -n {config.nproc} --backend {config.backend} "
                      f"--sizes {','.join(map(str, config.sizes))} --collectives {','.join(config.collectives)}")
    machine = (f"{info.get('hostname', platform.node())} ({info.get('machine', platform.machine())}, "
               f"{info.get('cpu_count', os.cpu_count())} CPUs, device {info.get('device', '?')})")
    head = [f"# The fabric this was measured on: {config.nproc} ranks, {config.backend}.",
            f"# source: measured by `{cmd}`",
            f"# machine: {machine}; date: {when}; torch {info.get('torch', '?')}, python "
            f"{info.get('python', platform.python_version())}",
            f"# sizes (bytes, per-rank input as in costmodels): {', '.join(map(str, config.sizes))}",
            "# bandwidth_gbps / latency_us: the all_reduce fit; [[calibration]]: per collective, factors x those",
            "# figures and an efficiency curve (see emulator_core/calibrate.py for the method). Fit:", "#"]
    head += [f"#   {line}" for line in format_fits(fits).splitlines()]
    body = dump_toml(scenario)
    dims = scenario.topology.dims
    if len(dims) == 1:  # the stored scenario holds the resolved size; the fragment says "fill to world_size"
        body = body.replace(f"\n[[topology.dims]]\nname = \"{dims[0].name}\"\nsize = {dims[0].size}\n",
                            f"\n[[topology.dims]]\nname = \"{dims[0].name}\"\nsize = 0\n", 1)
    return "\n".join(head) + "\n\n" + body


@dataclass(frozen=True)
class CalibrateResult:
    """What :func:`calibrate` did: the file, the scenario written, the fits, the worker facts, wall seconds."""

    path: Path
    scenario: Scenario
    fits: list[Fit]
    info: dict[str, Any]
    wall_s: float


def calibrate(config: CalibrateConfig, out: Path, *, command: str | None = None) -> CalibrateResult:
    """Measure, fit, and write the scenario fragment to ``out`` (atomically); see the module docstring."""
    run = measure_run(config)
    fits = fit(run.measurements, config.nproc, config.backend)
    scenario = scenario_fragment(fits, nproc=config.nproc, dimension=config.dimension)
    write_atomic(out, profile_toml(scenario, fits, config, run.info, command=command), error=CalibrationWriteError)
    return CalibrateResult(out, scenario, fits, run.info, run.wall_s)
