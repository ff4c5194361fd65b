"""Is a real model's launch on the namespace testbed slow because of the model or because of the machine?

    flock /tmp/nbox_ranks.lock python bench/probes/contention_probe.py [--model deeplight]
                                       [--plan alone,hog,alone,hog] [--steps 14] [--warmup 2] [--record]

The testbed pins node k's rank to core k, but the machine's other processes (another session's tests, a pip
install) run on the same cores, and the ranks lock only orders rank-launching jobs. For each entry of ``--plan``
this launches the example plainly across the two nodes (``alone``, or ``hog``: beside one unpinned busy-loop
process, as one other CPU-bound job would be) and prints the job's median iteration ms and the training threads'
median on-CPU and run-queue ms per iteration (the example's ``--report-times`` split; examples without it show
none). ``--record`` also runs ``nbox record`` of the example in the same condition and prints its observed median,
so a plain launch and a recording can be compared under the same load. Results on stdout, one JSON line each.

A probe (bench/README.md). Its finding, other processes on the cores and not the model: docs/journal/2026-11-28.md,
"DeepLight's two "modes" on the testbed are other processes on the cores".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import fidelity_testbed as ft  # noqa: E402


def one(tb: object, tmp: Path, model: str, mode: str, rnd: int, args: argparse.Namespace) -> dict[str, object]:
    """One plain launch (and, with --record, one recording) in ``mode``: alone or beside a busy loop."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if mode == "hog" else None
    try:
        job, splits = ft.plain_run(tb, tmp, model, args.steps, args.warmup, rnd)
        row: dict[str, object] = {"round": rnd, "mode": mode, "plain_median_ms": round(statistics.median(job) / 1e3, 1),
                                  "plain_ms": [round(x / 1e3) for x in job]}
        if splits:
            row["on_cpu_median_ms"] = round(statistics.median(s[0] / 1e3 for r in splits for s in r), 1)
            row["run_queue_median_ms"] = round(statistics.median(s[1] / 1e3 for r in splits for s in r), 1)
        if args.record:
            where = tmp / f"r{rnd}"
            where.mkdir(exist_ok=True)
            row["record_observed_ms"] = round(ft.record(tb, where, model, args.warmup,
                                                        args.steps - args.warmup - 1, 1)[1] / 1e3, 1)
    finally:
        if hog is not None:
            os.kill(hog.pid, signal.SIGTERM)
            hog.wait()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="deeplight", help="a built-in example (default deeplight)")
    ap.add_argument("--plan", default="alone,hog,alone,hog", help="launch conditions in order: alone or hog")
    ap.add_argument("--steps", type=int, default=14, help="iterations per plain launch (default 14)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations (default 2)")
    ap.add_argument("--record", action="store_true", help="also nbox record in each condition")
    args = ap.parse_args()
    plan = args.plan.split(",")
    if any(m not in ("alone", "hog") for m in plan) or not 0 <= args.warmup < args.steps - 2:
        ap.error("--plan takes alone/hog entries; need 0 <= --warmup < --steps - 2")
    from nbox_trace.testbed import Testbed, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"contention_probe: {why}")
    with tempfile.TemporaryDirectory(prefix="nbox-contention-") as tmp_s, Testbed(2, rate="1gbit") as tb:
        for rnd, mode in enumerate(plan):
            print(json.dumps(one(tb, Path(tmp_s), args.model, mode, rnd, args)), flush=True)


if __name__ == "__main__":
    main()
