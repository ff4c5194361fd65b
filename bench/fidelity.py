"""Replay fidelity: a recorded 2-rank gloo run replayed under the calibrated baseline vs fresh real runs.

    python bench/fidelity.py [--rounds R] [--examples ddp_mlp,...] [--json]
    python bench/fidelity.py --testbed [--world 2|4] [--rate 1gbit] [--calibration CAL.toml] ...  # fidelity_testbed.py

For each built-in example:

1. record it (``nbox record --example X``, 2 gloo ranks on this machine) into a bundle;
2. R rounds, interleaved so that drifts of the machine hit both sides alike:
   a. a fresh plain run of the example (torchrun, no nbox, ``--report-times``): per iteration, the job's
      pace after warm-up (the mean over ranks);
   b. ``nbox replay`` of the bundle under the baseline scenario (the shipped, calibrated ``loopback_cpu``)
      with ``--clock real --compute live``, and with ``--compute recorded``;
3. print the observed median and p10-p90 spread of the real runs, the replayed medians, and the error
   (replayed - observed) / observed. The virtual-time prediction is printed too.

Targets (the replay issue): |error| <= 5% with live compute, inside the observed spread. Nothing is
asserted: the machine is shared and noisy; the table says met / not met.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nbox_replay.replay import ReplayConfig, run_replay  # noqa: E402

EXAMPLES = ("ddp_mlp", "ddp_transformer", "fsdp2_transformer")


def _record_overhead() -> Any:
    spec = importlib.util.spec_from_file_location("nbox_bench_record_overhead", ROOT / "bench" / "record_overhead.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def record(example: str, out: Path, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "nbox", "record", "--example", example, "--warmup", "3", "--iterations",
                    "10", "-o", str(out), "--overwrite"], env=env, check=True, timeout=900,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def replay(bundle: Path, compute: str, iterations: int) -> list[float]:
    rep = run_replay(ReplayConfig(str(bundle), clock="real", compute=compute, iterations=iterations, warmup=2))
    return list(rep.baseline.iteration_us)


def run(examples: list[str], rounds: int, steps: int, warmup: int) -> list[dict[str, Any]]:
    ro = _record_overhead()
    env = ro._env()
    rows = []
    with tempfile.TemporaryDirectory(prefix="nbox-fidelity-") as tmp_s:
        tmp = Path(tmp_s)
        for ex in examples:
            bundle = tmp / f"{ex}.bundle"
            record(ex, bundle, env)
            virtual = run_replay(ReplayConfig(str(bundle), clock="virtual", iterations=3)).baseline.median_us
            real: list[float] = []
            live: list[float] = []
            recorded: list[float] = []
            coverage = None
            for _ in range(rounds):
                real += ro.plain_run(ex, steps, warmup, tmp)[1]
                live += replay(bundle, "live", steps - warmup)
                recorded += replay(bundle, "recorded", steps - warmup)
            rep = run_replay(ReplayConfig(str(bundle), clock="real", compute="live", iterations=2, warmup=1))
            coverage = rep.coverage
            obs = statistics.median(real)
            row: dict[str, Any] = {"example": ex, "observed_median_us": obs, "observed_p10_us": pct(real, 10),
                   "observed_p90_us": pct(real, 90), "n_observed": len(real),
                   "live_median_us": statistics.median(live), "recorded_median_us": statistics.median(recorded),
                   "virtual_us": virtual, "coverage": coverage}
            for k in ("live", "recorded"):
                row[f"{k}_error_pct"] = (row[f"{k}_median_us"] - obs) / obs * 100
            row["virtual_error_pct"] = (virtual - obs) / obs * 100
            row["live_in_spread"] = row["observed_p10_us"] <= row["live_median_us"] <= row["observed_p90_us"]
            rows.append(row)
            print(format_rows([row]), file=sys.stderr)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (f"{'example':<18} {'observed ms (p10-p90)':>24} {'live ms':>8} {'err':>7} {'recorded ms':>11} "
            f"{'err':>7} {'virtual ms':>10} {'err':>7} {'coverage':>8}  target |live err| <= 5%")
    lines = [head]
    for r in rows:
        o, lo, hi = r["observed_median_us"] / 1e3, r["observed_p10_us"] / 1e3, r["observed_p90_us"] / 1e3
        spread = f"{o:.2f} ({lo:.2f}-{hi:.2f})"
        met = "met" if abs(r["live_error_pct"]) <= 5 and r["live_in_spread"] else "NOT met"
        cov = f"{r['coverage'] * 100:.0f}%" if r["coverage"] is not None else "-"
        lines.append(f"{r['example']:<18} {spread:>24} {r['live_median_us'] / 1e3:8.2f} {r['live_error_pct']:+6.1f}% "
                     f"{r['recorded_median_us'] / 1e3:11.2f} {r['recorded_error_pct']:+6.1f}% "
                     f"{r['virtual_us'] / 1e3:10.2f} {r['virtual_error_pct']:+6.1f}% {cov:>8}  {met}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=13, help="iterations per real run and per replay (incl. warm-up)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--testbed", action="store_true",
                    help="2 (or --world) nodes x 1 rank on the namespace testbed (root): bench/fidelity_testbed.py")
    ap.add_argument("--rate", default="1gbit", help="--testbed: the link's tbf rate")
    ap.add_argument("--world", type=int, default=2, choices=(2, 4),
                    help="--testbed: nodes x 1 rank (4: two nodes per CPU on a 2-CPU machine, named in the table)")
    ap.add_argument("--gloo-loop", choices=("batch", "default"), default="batch",
                    help="--testbed: gloo's device-loop threads at SCHED_BATCH (the testbed's default; see "
                         "nbox_trace/testbed/threads.py) or at the kernel's default (README's runs J to T)")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="--testbed: the calibrated scenario; measured once and written here when missing")
    ap.add_argument("--sizes", default="4KiB..16MiB", help="--testbed: nbox calibrate --sizes")
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter",
                    help="--testbed: nbox calibrate --collectives")
    ap.add_argument("--budget", type=float, default=0.2, help="--testbed: nbox calibrate --budget")
    ap.add_argument("--live", action="store_true", help="--testbed: also replay live each round (on one node)")
    ap.add_argument("--host-work", default="pad",
                    help="--testbed --live: nbox replay --host-work mode(s), comma-separated (pad, match, off): one "
                         "live replay per mode each round, the order turning; the table's live figure is the first")
    ap.add_argument("--capture", type=int, default=5, help="--testbed: nbox record --capture (iterations captured)")
    ap.add_argument("--lean", type=int, default=0,
                    help="--testbed: nbox record --lean-iterations (the prediction's 'off' column then plays the "
                         "lean pass's times and gaps, 'proportional' the profiled times)")
    ap.add_argument("--one-recording", action="store_true",
                    help="--testbed: record once before the rounds (the bench until 2026-11-26) instead of a fresh "
                         "recording every round, paired with that round's real run (bench/roundstats.py)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="--testbed: keep the bundles and logs here (default: a temporary directory)")
    args = ap.parse_args()
    if args.testbed:
        return _testbed(args)
    rows = run([e for e in args.examples.split(",") if e], args.rounds, args.steps, args.warmup)
    print("\n" + format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


def _testbed(args: argparse.Namespace) -> int:
    spec = importlib.util.spec_from_file_location("nbox_bench_fidelity_testbed", ROOT / "bench" / "fidelity_testbed.py")
    assert spec is not None and spec.loader is not None
    tb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tb)
    modes = tuple(m for m in args.host_work.split(",") if m)
    bad = [m for m in modes if m not in ("pad", "match", "off")]
    if bad or not modes or len(set(modes)) != len(modes):
        print(f"fidelity: --host-work {args.host_work!r}: give distinct modes of pad, match, off", file=sys.stderr)
        return 2
    if modes != ("pad",) and not args.live:
        print("fidelity: --host-work acts on the live replays: add --live", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nbox-fidelity-tb-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, scenario = tb.run([e for e in args.examples.split(",") if e], args.rounds, args.steps, args.warmup,
                                args.rate, args.calibration, args.sizes, args.collectives, args.budget, work,
                                args.capture, args.live, args.lean, args.gloo_loop == "batch", args.world,
                                not args.one_recording, modes)
    cpus = len(os.sched_getaffinity(0))
    shared = f" on {cpus} CPU(s), oversubscribed" if args.world > cpus else ""
    print(f"\ntestbed: {args.world} nodes x 1 rank{shared}, pinned, {args.rate}, gloo loop {args.gloo_loop}; "
          f"scenario {scenario}; "
          "prediction = virtual clock, "
          "recorded compute; --live: live replay across the nodes\n" + tb.format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
