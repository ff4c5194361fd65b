#!/usr/bin/env python
"""Benchmark ``nbox calibrate``: the calibrated model against measured collectives on held-out sizes.

Run from the repository root::

    python bench/calibration.py                  # 2 gloo ranks, 1 KiB - 64 MiB (about 2 minutes on 2 vCPUs)
    python bench/calibration.py --nproc 2 --json

What is measured:

One run of ``emulator_core.calibration.run.measure_run`` on ``nproc`` real ranks times every collective it supports
at the calibration sizes 1 KiB, 4 KiB, ..., 64 MiB (x4 steps) and the held-out sizes between them (2 KiB,
8 KiB, ..., 32 MiB), in interleaved rounds (every round visits every point), so that the slow drifts of a
shared machine hit calibration and evaluation alike. Then:

1. CALIBRATE: the even rounds at the calibration sizes only are fitted (``calibration_fit.fit``) and turned into
   the scenario fragment (``calibrate.scenario_fragment``): the held-out sizes never reach the fit.
2. EVALUATE: the odd rounds (samples the fit never saw) at every size are priced through the fragment the way
   the emulator prices them (``emulator_core.pricing.pricer.price_group`` on the whole group; send_recv on a
   2-rank group) and compared.

Per row: collective, size (bytes, costmodels' convention: per-rank input, all_gather: the shard), whether it was
held out, the measured median and p10-p90 over the timed iterations (microseconds, each iteration the max over
ranks), the model (us) and ``error = 100·(model - measured)/measured``. Per collective: the median |error| over
the held-out sizes (target <= 10%) and over the calibration sizes (re-measured, so it shows run-to-run noise).
The load average before and after is printed: on a shared machine, other jobs' load shows up as error.
Only sanity is asserted, never a timing. ``run()`` and ``format_table()`` can be imported by path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emulator_core.calibration.fit import fit  # noqa: E402
from emulator_core.calibration.pipeline import scenario_fragment  # noqa: E402
from emulator_core.calibration.run import measure_run  # noqa: E402
from emulator_core.calibration.spec import SUPPORTED, CalibrateConfig, Measurement, summarize  # noqa: E402
from emulator_core.pricing.pricer import group_shape, price_group  # noqa: E402

KIB = 1024
CALIBRATION_SIZES = tuple(KIB * 4**k for k in range(9))          # 1 KiB .. 64 MiB
HELD_OUT_SIZES = tuple(2 * s for s in CALIBRATION_SIZES[:-1])      # 2 KiB .. 32 MiB
TARGET_MEDIAN_ERROR_PCT = 10.0


def _half(m: Measurement, parity: int) -> Measurement:
    return summarize(m.collective, m.nbytes, m.requested_bytes, m.ranks, m.rounds_us[parity::2])


def run(nproc: int = 2, backend: str = "gloo", collectives: Sequence[str] = SUPPORTED, budget_s: float = 1.5,
        rounds: int = 16, min_iters: int = 16, timeout_s: float = 600.0,
        progress: Callable[[str], None] | None = None, quick: bool = False) -> list[dict[str, Any]]:
    """Measure, calibrate on the even rounds, price the odd rounds; one dict per (collective, size).

    ``quick``: a smoke run (budget 0.1 s, 4 rounds, 4 iterations minimum per point): about a quarter of the time,
    noisier figures.

    Keys: collective, algorithm, nbytes, held_out (bool), measured_us, p10_us, p90_us, model_us, error_pct,
    iterations; plus, on the first row only, ``meta`` (machine, torch, load average, wall seconds).
    """
    say = progress or (lambda _m: None)
    if quick:
        budget_s, rounds, min_iters = 0.1, 4, 4
    started, load_before = time.monotonic(), os.getloadavg()
    cfg = CalibrateConfig(nproc=nproc, backend=backend, sizes=tuple(sorted(CALIBRATION_SIZES + HELD_OUT_SIZES)),
                          collectives=tuple(collectives), budget_s=budget_s, rounds=max(2, rounds),
                          min_iters=min_iters, timeout_s=timeout_s)
    say(f"measuring {len(cfg.collectives)} collectives x {len(cfg.sizes)} sizes on {nproc} {backend} ranks, "
        f"{cfg.rounds} interleaved rounds")
    measured = measure_run(cfg)
    calibration = [_half(m, 0) for m in measured.measurements
                   if m.requested_bytes in CALIBRATION_SIZES or m.collective == "barrier"]
    scenario = scenario_fragment(fit(calibration, nproc, backend), nproc=nproc)
    whole, pair = group_shape(scenario), group_shape(scenario, [0, 1])
    rows: list[dict[str, Any]] = []
    for full in measured.measurements:
        m = _half(full, 1)
        algo, model = price_group(scenario, m.collective, m.nbytes, pair if m.collective == "send_recv" else whole)
        assert model > 0, (m.collective, m.nbytes, model)
        rows.append({"collective": m.collective, "algorithm": algo, "nbytes": m.nbytes,
                     "held_out": m.requested_bytes in HELD_OUT_SIZES, "measured_us": m.median_us,
                     "p10_us": m.p10_us, "p90_us": m.p90_us, "model_us": model,
                     "error_pct": 100.0 * (model - m.median_us) / m.median_us, "iterations": m.iterations})
    if rows:
        rows[0]["meta"] = {"machine": f"{platform.node()} ({platform.machine()})",
                           "cpu_count": measured.info.get("cpu_count"), "torch": measured.info.get("torch"),
                           "backend": backend, "nproc": nproc, "wall_s": round(time.monotonic() - started, 1),
                           "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return rows


def _median_abs(rows: Sequence[dict[str, Any]]) -> float | None:
    return statistics.median(abs(r["error_pct"]) for r in rows) if rows else None


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a plain-text table, then one summary line per collective (median |error| held-out).

    ``measured`` is the odd rounds' median (samples the fit never saw); ``set`` says held-out or calibration size.
    """
    lines = []
    meta = rows[0].get("meta") if rows else None
    if meta:
        lines.append(f"calibrated model vs measured: {meta['nproc']} {meta['backend']} ranks on {meta['machine']}, "
                     f"{meta['cpu_count']} CPUs, torch {meta['torch']}, {meta['date']}, {meta['wall_s']} s; "
                     f"load average (1 min) {meta['load_before']} before, {meta['load_after']} after")
    lines.append(f"{'collective':<15}{'algorithm':<15}{'bytes':>10} {'set':<5}{'measured us':>12}"
                 f"{'p10-p90 us':>22}{'model us':>11}{'error':>9}")
    for r in rows:
        spread = f"{r['p10_us']:.1f}-{r['p90_us']:.1f}"
        lines.append(f"{r['collective']:<15}{r['algorithm']:<15}{r['nbytes']:>10} "
                     f"{'held' if r['held_out'] else 'cal':<5}{r['measured_us']:>12.1f}{spread:>22}"
                     f"{r['model_us']:>11.1f}{r['error_pct']:>8.1f}%")
    lines.append("")
    for coll in dict.fromkeys(r["collective"] for r in rows):
        mine = [r for r in rows if r["collective"] == coll]
        held = _median_abs([r for r in mine if r["held_out"]])
        again = _median_abs([r for r in mine if not r["held_out"]])
        verdict = "" if held is None else ("  (target <= 10%: met)" if held <= TARGET_MEDIAN_ERROR_PCT
                                           else "  (target <= 10%: NOT met)")
        held_s = "n/a (size-free)" if held is None else f"{held:.1f}%"
        again_s = "n/a" if again is None else f"{again:.1f}%"
        lines.append(f"{coll:<15} median |error| held-out {held_s:>7}, calibration sizes re-measured "
                     f"{again_s:>6}{verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--budget", type=float, default=1.5, help="Timed seconds per point, about.")
    ap.add_argument("--rounds", type=int, default=16, help="Interleaved rounds (even: fit, odd: evaluate).")
    ap.add_argument("--quick", action="store_true", help="A smoke run: fewer iterations, noisier figures.")
    ap.add_argument("--json", action="store_true", help="Print the rows as one JSON document.")
    args = ap.parse_args(argv)
    rows = run(args.nproc, args.backend, budget_s=args.budget, rounds=args.rounds, quick=args.quick,
               progress=lambda m: print(f"bench/calibration: {m}", file=sys.stderr, flush=True))
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
