"""Emulate beside a computing peer core: how much of emulate's testbed error is the testbed's two nodes sharing a VM.

    python bench/probes/corun_emulate.py --calibration CAL.toml [--models t5,resnet152] [--rounds 2] [--json]

On the two-node namespace testbed (:mod:`nbox_trace.testbed.namespaces`, root), per model and round, interleaved
(the order turned each round): ``nbox emulate --world-size 2 -n 1`` of the model on node 0 alone; the same while a
second ``nbox emulate`` of it runs on node 1 (it computes as the real job's other rank would and communicates with
nobody); and the real job across both nodes (``bench/fidelity_testbed.plain_run``). The testbed's nodes are the
VM's vCPUs: in the real job both ranks compute at once and share the host's memory system, while emulate's one
real rank computes beside an idle core. The table gives each side's median of its rounds' medians and its error
against the real launches'. Every launch holds ``/tmp/nbox_ranks.lock``. Nothing is asserted.

A probe (bench/README.md). Its finding, half of T5's gap the testbed's own: docs/results.md and
docs/journal/2026-11-28.md, "Emulate, the library's CPU and compute noise, measured on the four models".
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
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import emulate_fidelity_testbed as eft  # noqa: E402
import fidelity_testbed as ft  # noqa: E402
from seeds_table import ranks_lock  # noqa: E402
from whatif_table import JOBS  # noqa: E402

SIDES = ("alone", "beside a computing peer", "real")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=Path, required=True, help="the testbed's calibrated scenario")
    ap.add_argument("--models", default="t5,resnet152",
                    help="comma list of built-in examples or bench/whatif_table.py jobs (default t5,resnet152)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per model (default 2)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--rate", default="1gbit", help="the link's tbf rate")
    ap.add_argument("--share", type=float, default=None,
                    help="each node's CPU share (a cgroup quota, as bench/whatif_table.py's testbed); default none")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    from nbox_trace.testbed import Testbed

    got: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nbox-corun-") as work, \
            Testbed(2, rate=args.rate, cpu_share=args.share) as tb:
        tmp = Path(work)
        for name in [m for m in args.models.split(",") if m]:
            job = JOBS.get(name)  # a job of the what-if table (a script with its arguments), else an example
            model, extra = (job.example, job.args) if job else (name, ())
            _, tail, _ = ft.workload(model, extra)
            for rnd in range(args.rounds):
                for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
                    with ranks_lock():
                        if side == "real":
                            us, _ = ft.plain_run(tb, tmp, model, args.warmup + args.iterations, args.warmup, rnd, extra)
                        elif side == "alone":
                            us = eft.emulate_on(tb, tmp, f"alone-{name}-{rnd}", model, 2, 1, args.calibration,
                                                args.warmup, args.iterations, extra=extra)
                        else:  # the peer outlasts node 0's run: more iterations, stopped after
                            peer = tb.run_on(1, eft._nbox("emulate", "--world-size", 2, "-n", 1, "--what-if",
                                                          args.calibration, "--warmup", 1, "--iterations",
                                                          2 * (args.warmup + args.iterations), "--timeout", 400,
                                                          *tail),
                                             {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **tb.node(1).env()},
                                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            try:
                                us = eft.emulate_on(tb, tmp, f"beside-{name}-{rnd}", model, 2, 1,
                                                    args.calibration, args.warmup, args.iterations, extra=extra)
                            finally:
                                os.killpg(peer.pid, signal.SIGKILL)
                                peer.wait()
                    got.setdefault((name, side), []).append(statistics.median(us))
                    print(f"corun_emulate: {name} round {rnd} {side}: {statistics.median(us) / 1e3:.1f} ms",
                          file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for model in dict.fromkeys(m for m, _ in got):
        real = statistics.median(got[(model, "real")])
        for side in SIDES:
            ms = statistics.median(got[(model, side)])
            rows.append({"model": model, "side": side, "median_ms": ms / 1e3,
                         "rounds_ms": [v / 1e3 for v in got[(model, side)]], "error_pct": (ms / real - 1) * 100})
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'model':<11} {'side':<25} {'median ms':>10} {'error':>8}  rounds ms")
    for r in rows:
        print(f"{r['model']:<11} {r['side']:<25} {r['median_ms']:>10.1f} {r['error_pct']:>+7.1f}%  "
              + ", ".join(f"{v:.0f}" for v in r["rounds_ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
