"""``nbox calibrate``: measure the real collectives on real ranks, fit the cost models, write a scenario fragment.

Pipeline: :func:`emulator_core.calibration.run.measure_run` launches ``emulator_core.calibration._worker`` on N ranks
of this machine (one process group, gloo or NCCL) and reads the per-(collective, size) timings it reports (see that
module for the timing method); :func:`emulator_core.calibration.fit.fit` turns them into one
:class:`~emulator_core.calibration.fit.Fit` per collective; :func:`scenario_fragment` and :func:`profile_toml` turn
the fits into a scenario ("the fabric this was recorded on") whose single dimension carries the all_reduce figures
and whose ``[[calibration]]`` entries carry every collective's factors and efficiency curve
(``scenario.Calibration``), each with its ``busy_slowdown`` where its calls beside compute were timed.

Units: sizes are bytes in costmodels' convention (``nbytes`` = the per-rank input; all_gather: the per-rank
shard; all_to_all: the whole per-rank send buffer; barrier: 0); times are microseconds; cost-model bandwidth
is bytes per microsecond (1 GB/s = 1000 bytes/us) and a scenario's ``bandwidth_gbps`` is gigaBITS per second
(1 Gb/s = 125 bytes/us).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from emulator_core.calibration.fit import (
    ALPHA_FLOOR_US,
    BusyFit,
    Fit,
    fit,
    fit_beside,
    significant,
)
from emulator_core.calibration.run import measure_run
from emulator_core.calibration.spec import CalibrateConfig, CalibrateInputError, CalibrationError, CalibrationWriteError
from emulator_core.scenario import Calibration, Dimension, Scenario, Topology, dump_toml
from nbox_trace.files import write_atomic
from nbox_trace.progress import Report


def scenario_fragment(fits: Sequence[Fit], *, nproc: int, dimension: str = "loopback",
                      world_size: int | None = None, library: str = "",
                      slowdowns: Mapping[str, float] | None = None,
                      busy_sizes: Mapping[str, int] | None = None,
                      busy_delays: Mapping[str, float] | None = None) -> Scenario:
    """The scenario of the measured fabric: ``world_size`` (default ``nproc``) ranks on one ``switch`` dimension
    of size 0 (= fill) whose ``bandwidth_gbps`` and ``latency_us`` are the all_reduce fit's (else the first fit
    with a bandwidth), plus one ``[[calibration]]`` per fit with factors relative to those figures (barrier:
    latency only). An all_to_all fit also calibrates all_to_all_v (the same algorithm family). Each entry records
    what it measured: ranks, ``library`` and the smallest and largest size.

    ``slowdowns``: per collective, its ``busy_slowdown`` (:func:`emulator_core.calibration.fit.fit_busy`; 1 where
    not in it). ``busy_sizes``: per collective, the size its ``busy_slowdown`` was measured at (``busy_nbytes``;
    written only beside a slowdown above 1), and ``busy_delays`` what one such call lost (``busy_delay_us``: the busy
    median less the idle one).
    """
    if not fits:
        raise CalibrateInputError("nothing to write: no fits")
    ref = next((f for f in fits if f.collective == "all_reduce"), None) or next(
        (f for f in fits if f.bandwidth_bytes_per_us is not None), fits[0])
    bw_gbps = significant(ref.bandwidth_gbps) if ref.bandwidth_gbps is not None else 1.0
    latency = significant(ref.latency_us)
    dim = Dimension(name=dimension, size=0, kind="switch", bandwidth_gbps=bw_gbps, latency_us=latency)
    cals = []
    for f in fits:
        bw_factor = 1.0 if f.bandwidth_gbps is None else significant(f.bandwidth_gbps / bw_gbps)
        lat_factor = significant(max(f.latency_us, ALPHA_FLOOR_US) / max(latency, ALPHA_FLOOR_US))
        names = [f.collective] + (["all_to_all_v"] if f.collective == "all_to_all" else [])
        sizes = sorted(p.nbytes for p in f.points)
        cals += [Calibration(n, dimension, f.algorithm, f.ranks, lat_factor, bw_factor, f.efficiency, library,
                             (sizes[0], sizes[-1]) if sizes else (), (slowdowns or {}).get(f.collective, 1.0))
                 for n in names]
    busy = busy_sizes or {}
    delays = busy_delays or {}
    cals = [replace(c, busy_nbytes=busy[c.collective], busy_delay_us=delays.get(c.collective))
            if c.busy_slowdown > 1 and busy.get(c.collective, 0) > 0 else c for c in cals]
    return Scenario(world_size=world_size or nproc, topology=Topology((dim,)), calibration=tuple(cals))


def format_fits(fits: Sequence[Fit]) -> str:
    """A plain-text table: per collective its two parameters in units a datasheet gives (microseconds per step,
    gigabits per second per link), then per size measured vs model and the error, outliers named (sizes in IEC
    units; the time columns of one collective in one unit, named in the header: :mod:`nbox_trace.units`)."""
    from nbox_trace.units import format_bytes, format_in, time_unit

    lines = []
    for f in fits:
        bw = "-" if f.bandwidth_gbps is None else f"{f.bandwidth_gbps:.3f} Gb/s per link"
        outliers = [format_bytes(p.nbytes) for p in f.points if p.outlier]
        lines.append(f"{f.collective} ({f.algorithm}, p={f.ranks}): latency {f.latency_us:.2f} us per step, "
                     f"bandwidth {bw}; median |error| {f.median_abs_error_pct():.1f}%"
                     + (f"; outliers (not fitted): {', '.join(outliers)}" if outliers else ""))
        u = time_unit(v for p in f.points for v in (p.measured_us, p.p90_us, p.model_us))
        d = 1 if u[0] == "us" else 3

        def t(v: float, unit: tuple[str, float] = u, digits: int = d) -> str:
            return format_in(v, unit, digits=digits)

        lines.append(f"  {'bytes':>12} {'measured ' + u[0]:>13} {'p10-p90 ' + u[0]:>21} {'model ' + u[0]:>12} "
                     f"{'error':>8}")
        for p in f.points:
            lines.append(f"  {format_bytes(p.nbytes):>12} {t(p.measured_us):>13} {t(p.p10_us) + '-' + t(p.p90_us):>21} "
                         f"{t(p.model_us):>12} {p.error_pct:>7.1f}%" + ("  outlier" if p.outlier else ""))
    return "\n".join(lines)


def profile_toml(scenario: Scenario, fits: Sequence[Fit], config: CalibrateConfig, info: Mapping[str, Any],
                 *, command: str | None = None, busy: Sequence[BusyFit] = ()) -> str:
    """The fragment as TOML with a header comment: command, machine, date, torch, backend, sizes, fit table."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = command or (f"nbox calibrate -n {config.nproc} --backend {config.backend} "
                      f"--sizes {','.join(map(str, config.sizes))} --collectives {','.join(config.collectives)}")
    machine = (f"{info.get('hostname', platform.node())} ({info.get('machine', platform.machine())}, "
               f"{info.get('cpu_count', os.cpu_count())} CPUs, device {info.get('device', '?')})")
    world = info.get("world_size") if type(info.get("world_size")) is int else config.nproc
    nodes = f" on {config.nnodes} nodes ({config.nproc} per node)" if config.nnodes != "1" else ""
    head = [f"# The fabric this was measured on: {world} ranks{nodes}, {config.backend}.",
            f"# source: measured by `{cmd}`",
            f"# machine: {machine}; date: {when}; torch {info.get('torch', '?')}, python "
            f"{info.get('python', platform.python_version())}",
            f"# sizes (bytes, per-rank input as in costmodels): {', '.join(map(str, config.sizes))}",
            "# bandwidth_gbps / latency_us: the all_reduce fit (per link, per step); [[calibration]]: per collective,",
            "# factors x those figures (see emulator_core/calibration/fit.py for the method). Fit:", "#"]
    head += [f"#   {line}" for line in format_fits(fits).splitlines()]
    if busy:
        head += ["#", *(f"# {b.describe()}" for b in busy)]
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
    busy: tuple[BusyFit, ...] = ()


def calibrate(config: CalibrateConfig, out: Path, *, command: str | None = None,
              progress: Report | None = None) -> CalibrateResult:
    """Measure, fit, and write the scenario fragment to ``out`` (atomically); see the module docstring.
    ``progress`` is told how far the ranks' measurements are (:class:`nbox_trace.progress.Step`)."""
    run = measure_run(config, progress=progress)
    if config.backend == "auto":  # the ranks decided (emulator_core.calibration._worker): the fit is per library
        used = run.info.get("backend")
        if used not in ("gloo", "nccl"):
            raise CalibrationError(f"the calibration ranks reported backend {used!r}, expected gloo or nccl")
        config = replace(config, backend=str(used))
    world = run.info.get("world_size")
    ranks = world if type(world) is int and world >= 2 else config.nproc  # across nodes: every node's ranks
    fits = fit(run.measurements, ranks, config.backend)
    busy = tuple(fit_beside(b) for b in run.beside)
    scenario = scenario_fragment(fits, nproc=ranks, dimension=config.dimension, library=config.backend,
                                 slowdowns={b.collective: b.busy_slowdown for b in busy},
                                 busy_sizes={b.collective: b.nbytes for b in busy},
                                 busy_delays={b.collective: significant(max(0.0, b.busy_us - b.idle_us))
                                              for b in busy})
    write_atomic(out, profile_toml(scenario, fits, config, run.info, command=command, busy=busy),
                 error=CalibrationWriteError)
    return CalibrateResult(out, scenario, fits, run.info, run.wall_s, busy)
