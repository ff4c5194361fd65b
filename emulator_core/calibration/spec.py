"""What a calibration is: its settings (:class:`CalibrateConfig`), its errors, message sizes, and the
measured points (:class:`Measurement`) that :mod:`emulator_core.calibration.run` produces and
:mod:`emulator_core.calibration.fit` fits.

Units: sizes are bytes in costmodels' convention (``nbytes`` = the per-rank input; all_gather: the per-rank
shard; all_to_all: the whole per-rank send buffer; barrier: 0); times are microseconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator_core.calibration import _worker as worker
from nbox_trace.errors import InvalidInputError, NboxError, OutputWriteError, UsageError
from nbox_trace.launch import check_nodes
from nbox_trace.units import parse_bytes

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
BACKENDS = ("auto", "gloo", "nccl")
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: Default sizes: 1 KiB .. 64 MiB in x4 steps (bytes).
DEFAULT_SIZES: tuple[int, ...] = tuple(KIB * 4**k for k in range(9))
MAX_SIZE = 4 * GIB
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


class CalibrationError(NboxError):
    """The measurement run failed: a rank raised, died or hung (the message names the rank, collective, size)."""

    exit_code = 1


class CalibrationWriteError(OutputWriteError):
    """The profile could not be written."""


class CalibrateInputError(InvalidInputError):
    """A calibration setting is invalid (the message names the setting and the bad value)."""


class CalibrateUsageError(UsageError, CalibrateInputError):
    """An invalid ``nbox calibrate`` option (exit code 2): the message names the flag as typed (``--sizes``)."""


#: CalibrateConfig field -> the ``nbox calibrate`` flag that sets it (messages name flags as typed).
FLAGS = {"nproc": "--nproc", "backend": "--backend", "sizes": "--sizes", "collectives": "--collectives",
         "budget_s": "--budget", "timeout_s": "--timeout", "dimension": "--dimension", "busy": "--busy"}


def parse_size(text: str, flag: str = "--sizes") -> int:
    """Bytes from ``1024``, ``1KiB``, ``64MiB``, ``1.5GiB`` (K/KB/KiB etc. are all binary: 1 KiB = 1024 B), the
    way nbox prints sizes; every option that takes a byte count parses it here (an error names ``flag``)."""
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise CalibrateUsageError(f"{flag} {text!r}: {e}") from None


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
                raise CalibrateUsageError(f"--sizes: range {item!r} must go from a size >= 1 up to a larger one")
            n = lo
            while n < hi:
                out.add(n)
                n *= 4
            out.add(hi)
        else:
            out.add(parse_size(item))
    if not out:
        raise CalibrateUsageError(f"--sizes {text!r}: lists no size")
    return tuple(sorted(out))


@dataclass(frozen=True)
class CalibrateConfig:
    """What to measure. Validated at construction (:class:`CalibrateInputError` names the setting).

    Attributes:
        nproc: ranks to launch on this machine (1 .. 1024; at least 2 on one node: collectives need peers).
        backend: ``"gloo"`` (CPU tensors), ``"nccl"`` (one GPU per rank) or ``"auto"`` (nccl where the ranks
            see CUDA, else gloo: decided in the ranks, :func:`emulator_core.calibration.calibrate` reads which).
        sizes: message sizes in bytes (1 .. 4 GiB; costmodels' convention, e.g. all_gather: the shard); sorted.
        collectives: a subset of :data:`SUPPORTED`.
        warmup: untimed iterations per point (>= 1; they also size the timed run).
        rounds: interleaved rounds over all points (>= 1; see ``_calibrate_worker``).
        min_iters, max_iters: bounds on the timed iterations per point.
        budget_s: about this many seconds of timed iterations per point (> 0).
        timeout_s: deadline for the whole run in seconds; then every rank is stopped (> 0).
        busy: also time calls beside a computing thread on each rank's core, for each collective's
            ``busy_slowdown`` (``_calibrate_worker`` step 4; CPU ranks only: on CUDA ranks nothing is timed).
            ``None`` (the default): across nodes yes (a node's core is shared by gloo's threads and the training
            step), on one node no. See docs/calibrate.md.
        dimension: the name of the topology dimension the fragment describes.
        nnodes, node_rank, rdzv_endpoint, local_addr, rdzv_host: a measurement across nodes, as ``nbox record``
            takes them (:class:`nbox_trace.launch.launcher.Launch`): each node runs ``nbox calibrate`` with its node
            rank, and each writes the same scenario (the timings are the slowest rank's, on every node).
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
    busy: bool | None = None
    dimension: str = "loopback"
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_addr: str | None = None
    rdzv_host: bool | None = None

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, why: str) -> CalibrateInputError:
            return CalibrateUsageError(f"{FLAGS.get(key, key)} {value!r}: {why}")

        try:
            check_nodes(self.nnodes, self.node_rank, self.rdzv_endpoint, self.local_addr)
        except UsageError as exc:
            raise CalibrateUsageError(str(exc)) from None
        lowest = 2 if self.nnodes == "1" else 1
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or not lowest <= self.nproc <= 1024:
            raise bad("nproc", self.nproc, f"must be an integer from {lowest} to 1024"
                      + (" on one node (collectives need peers)" if lowest == 2 else ""))
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
        if self.busy is None:
            object.__setattr__(self, "busy", self.nnodes != "1")
        if not isinstance(self.busy, bool):
            raise bad("busy", self.busy, "must be true or false")
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


@dataclass(frozen=True)
class Beside:
    """Calls beside compute (``_calibrate_worker`` step 4): per pair, a ``collective`` of ``nbytes`` right after
    another on an idle core (``idle_us``) and one right after that while a thread of each rank computes on its
    core (``busy_us``); microseconds, max over ranks."""

    collective: str
    nbytes: int
    idle_us: tuple[float, ...]
    busy_us: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.idle_us) != len(self.busy_us) or not self.idle_us:
            raise CalibrateInputError(f"beside-compute measurement: {len(self.idle_us)} idle and "
                                      f"{len(self.busy_us)} busy calls (needs as many of each, at least one)")
        if not all(math.isfinite(t) and t >= 0 for t in (*self.idle_us, *self.busy_us)):
            raise CalibrateInputError("beside-compute measurement: times must be finite and >= 0")
        if self.nbytes < 0:
            raise CalibrateInputError(f"beside-compute measurement: nbytes must be >= 0, got {self.nbytes}")


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
