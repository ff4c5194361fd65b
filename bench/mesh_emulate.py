"""A 2-D mesh recorded small and replayed large, against ``nbox emulate`` of the same shape (issue 17, "Must show").

    python bench/mesh_emulate.py [--rounds R] [--mesh dp=8,tp=2] [--real-ranks 0,1] [--capture K] [--json]

Each round, in this order (so drifts of the machine hit every side alike):

1. ``nbox record -n 4 --example tp_dp_mlp --capture K``: tensor parallel 2 x data parallel 2 at W = 4;
2. ``nbox replay BUNDLE --clock virtual --mesh dp=8,tp=2 --iterations 1`` with the recorded compute, and again
   with ``--compute live`` (the operators re-executed here, alone, to measure them; then virtual time): each gives
   one what-if time per captured iteration (the job's iteration: its slowest rank);
3. ``nbox emulate --world-size 16 -n 2 --example tp_dp_mlp``: the same script live on 2 real ranks (default: global
   ranks 0 and 1, one whole tp group) that see a world of 16 and build dp=8 x tp=2 from it; the emulator plays
   the other 14. Per timed iteration: the slowest real rank.

All sides price communication with the same scenario (the shipped ``loopback_cpu`` calibration). Prints per side
the median and p10-p90 of the per-iteration times over all rounds, and each replay's error against emulate's
median. Nothing is asserted. Launches ranks: run it alone (4 ranks on this 2-core machine at most).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def nbox(args: list[str], log: list[str]) -> dict[str, Any]:
    log.append("nbox " + shlex.join(args))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "nbox", *args, "--json"], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"nbox {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mesh", default="dp=8,tp=2", help="the what-if mesh (tp must stay 2)")
    ap.add_argument("--real-ranks", default="0,1", help="global ranks emulate runs for real")
    ap.add_argument("--capture", type=int, default=3, help="iterations captured per recording")
    ap.add_argument("--iterations", type=int, default=10, help="iterations timed per emulate run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    degrees = dict(p.split("=") for p in args.mesh.split(","))
    world = int(degrees["dp"]) * int(degrees.get("tp", 2))
    sides: dict[str, list[float]] = {"replay, recorded compute": [], "replay, live compute": [], "emulate": []}
    parts: dict[str, list[dict[str, float]]] = {s: [] for s in sides}  # mean parts per iteration, per run
    log: list[str] = []
    with tempfile.TemporaryDirectory(prefix="nbox-mesh-") as tmp:
        for r in range(args.rounds):
            bundle = str(Path(tmp) / f"tpdp{r}.bundle")
            nbox(["record", "-n", "4", "--example", "tp_dp_mlp", "--warmup", "3", "--iterations", "10",
                  "--capture", str(args.capture), "-o", bundle], log)
            for side, extra in (("replay, recorded compute", []), ("replay, live compute", ["--compute", "live"])):
                doc = nbox(["replay", bundle, "--clock", "virtual", "--mesh", args.mesh, "--iterations", "1", *extra],
                           log)
                assert doc["what_if_world"]["world_size"] == world
                sides[side] += doc["what_if"]["iteration_us"]["values"]
                its = doc["what_if"]["breakdown_per_iteration_us"]
                parts[side].append({k: statistics.mean(i[k] for i in its)
                                    for k in ("compute", "exposed_comm", "waiting_for_peers", "idle")})
            doc = nbox(["emulate", "--world-size", str(world), "--real-ranks", args.real_ranks, "--example",
                        "tp_dp_mlp", "--warmup", "3", "--iterations", str(args.iterations)], log)
            assert doc["world_size_seen"] == world
            sides["emulate"] += doc["iteration_time_us"]["values"]
            b = doc["breakdown_us"] or {}
            parts["emulate"].append({"compute": b.get("compute_us", 0.0), "exposed_comm": b.get("exposed_comm_us", 0.0),
                                     "cpu_contention": b.get("cpu_contention_us", 0.0)})
    ref = statistics.median(sides["emulate"])
    rows: list[dict[str, Any]] = [
        {"side": s, "n": len(v), "median_ms": statistics.median(v) / 1e3, "p10_ms": pct(v, 10) / 1e3,
         "p90_ms": pct(v, 90) / 1e3, "error_vs_emulate": None if s == "emulate" else statistics.median(v) / ref - 1,
         "mean_parts_ms": {k: statistics.mean(p[k] for p in parts[s]) / 1e3 for k in parts[s][0]} if parts[s] else {}}
        for s, v in sides.items()]
    if args.json:
        print(json.dumps({"mesh": args.mesh, "world_size": world, "rows": rows, "commands": log}, indent=2))
        return
    print(f"tp_dp_mlp recorded at W=4 (dp=2 x tp=2), played at {args.mesh} (W={world}); {args.rounds} round(s)")
    print("| side | n | median ms (p10-p90) | error vs emulate median |")
    print("|---|---|---|---|")
    for row in rows:
        err = "" if row["error_vs_emulate"] is None else f"{row['error_vs_emulate']:+.0%}"
        print(f"| {row['side']} | {row['n']} | {row['median_ms']:.2f} ({row['p10_ms']:.2f}-{row['p90_ms']:.2f}) "
              f"| {err} |")
    print("mean parts of an iteration (ms; replay: its slowest rank; emulate: the slowest real rank's thread):")
    for row in rows:
        print(f"  {row['side']}: " + ", ".join(f"{k} {v:.2f}" for k, v in row["mean_parts_ms"].items()))
    print("commands (first round):")
    for line in log[:4]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
