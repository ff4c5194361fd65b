"""The measuring run of ``nbox calibrate``: launch ``emulator_core._calibrate_worker`` on N ranks of this machine
(gloo or NCCL) through nbox's one launcher (:mod:`nbox_trace.launch`), wait with a deadline, and read the
per-(collective, size) timings it reports (see that module for the timing method). Times in microseconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator_core import _calibrate_worker as worker
from emulator_core.calibration import (
    Beside,
    CalibrateConfig,
    CalibrateInputError,
    CalibrationError,
    Measurement,
    summarize,
)
from nbox_trace.launch import Launch, LaunchResult, run, seconds_text, then_failed
from nbox_trace.progress import Report, Step, watch
from nbox_trace.units import format_bytes


@dataclass(frozen=True)
class MeasureRun:
    """:func:`measure_run`'s result: the measurements, the worker's facts (torch, host, device), the calls beside
    compute per collective (empty: not taken)."""

    measurements: list[Measurement]
    info: dict[str, Any]
    wall_s: float
    beside: tuple[Beside, ...] = ()


def launch_spec(config: CalibrateConfig, work: Path) -> Launch:
    """The launch of ``config``'s measurement (standalone on this machine, or this node of several); results go to
    ``work``."""
    pg_timeout = max(5.0, min(config.timeout_s * 0.5, 300.0))  # a collective fails before the run deadline
    args = ("--out", str(work), "--backend", config.backend, "--collectives", ",".join(config.collectives),
            "--sizes", ",".join(map(str, config.sizes)), "--warmup", str(config.warmup), "--rounds",
            str(config.rounds), "--min-iters", str(config.min_iters), "--max-iters", str(config.max_iters),
            "--budget-s", repr(float(config.budget_s)), "--timeout-s", repr(pg_timeout),
            *(("--busy",) if config.busy else ()))
    return Launch("emulator_core._calibrate_worker", work / "logs", module=True, args=args,
                  nproc_per_node=config.nproc, nnodes=config.nnodes, node_rank=config.node_rank,
                  rdzv_endpoint=config.rdzv_endpoint, local_addr=config.local_addr, rdzv_host=config.rdzv_host,
                  timeout_s=config.timeout_s)


def _read_json(path: Path) -> Any:
    try:  # our own worker's small JSON files; None when missing or unreadable
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _failure(config: CalibrateConfig, work: Path, result: LaunchResult) -> CalibrationError:
    """The error of a failed measurement, from what the ranks left in ``work``."""
    f = result.failure(worker.error_files(work))
    progress = _read_json(work / worker.PROGRESS)
    at = (f"; rank {progress.get('rank', 0)} was measuring {progress.get('collective')} of "
          f"{progress.get('nbytes')} bytes" if isinstance(progress, dict) else "; no rank had started measuring")
    if f.root_rank is not None and f.exit_text is not None:
        return CalibrationError(f"rank {f.root_rank} {f.exit_text}{then_failed(f.others)}{at}{f.root_tail_text()}")
    if f.root_error is not None:
        err = f.root_error
        what = (f"in {err.doc.get('collective')} of {err.doc.get('nbytes')} bytes" if err.doc.get("collective")
                else f"during {err.doc.get('phase', 'start-up')}")
        return CalibrationError(f"rank {err.rank} failed {what}: {err.type}: {err.message}{then_failed(f.others)}")
    if f.timed_out:
        return CalibrationError(f"the calibration did not finish within {seconds_text(config.timeout_s)} s "
                                f"(--timeout) and was stopped{at}")
    return CalibrationError(f"the calibration run exited with code {f.returncode}{at}{f.tail_text()}")


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


def _beside(doc: dict[str, Any]) -> tuple[Beside, ...]:
    entries = doc.get("beside_compute", [])
    try:
        if not isinstance(entries, list):
            raise TypeError(f"a list of beside-compute measurements, got {type(entries).__name__}")
        return tuple(Beside(str(r["collective"]), int(r["nbytes"]), tuple(float(t) for t in r["idle_us"]),
                            tuple(float(t) for t in r["busy_us"])) for r in entries)
    except (KeyError, TypeError, ValueError, CalibrateInputError) as exc:
        raise CalibrationError(f"the worker's result has a malformed beside-compute measurement: {exc!r}") from None


def measure_step(work: Path, config: CalibrateConfig) -> Step | None:
    """How far the measuring ranks are, from the ``progress.json`` rank 0 writes before each point: a warm-up pass
    over every (collective, size), then ``config.rounds`` timed passes (emulator_core._calibrate_worker); None
    before it wrote one."""
    path = work / worker.PROGRESS
    p = json.loads(path.read_bytes()) if path.is_file() else None
    if not isinstance(p, dict):
        return None
    phase, coll, nbytes = str(p.get("phase")), p.get("collective"), p.get("nbytes")
    points = [(c, n) for c in config.collectives for n in ((0,) if c == "barrier" else config.sizes)]
    what = f"calibrating, {phase}"
    detail = f"{coll} of {format_bytes(int(nbytes))}" if coll and nbytes is not None else ""
    point = (str(coll), nbytes if isinstance(nbytes, int) else -1)
    if point not in points or not (phase == "warm-up" or phase.startswith("round ")):
        return Step(what, detail=detail)
    pass_ = 0 if phase == "warm-up" else int(phase.split()[1]) + 1
    return Step(what, pass_ * len(points) + points.index(point), (config.rounds + 1) * len(points), "measurements",
                detail)


def measure_run(config: CalibrateConfig, progress: Report | None = None) -> MeasureRun:
    """Launch the ranks, wait at most ``config.timeout_s`` seconds, return the measurements and worker facts
    (``progress``: told how far they are, :func:`measure_step`).

    Raises:
        CalibrationError: a rank failed (named with its collective and size), the run timed out (the ranks'
            process group is terminated), or it produced no result.
    """
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="nbox-calibrate-"))
    try:
        with watch(lambda: measure_step(work, config), progress):
            result = run(launch_spec(config, work))
        if not result.ok or not (work / worker.RESULT).is_file():
            raise _failure(config, work, result)
        doc = _read_json(work / worker.RESULT)
        measurements = _measurements(doc)
        info = {k: v for k, v in doc.items() if k not in ("results", "beside_compute")}
        return MeasureRun(measurements, info, time.monotonic() - started, _beside(doc))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(config: CalibrateConfig) -> list[Measurement]:
    """The measurements of :func:`measure_run` (see there)."""
    return measure_run(config).measurements
