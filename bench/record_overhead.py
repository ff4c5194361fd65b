#!/usr/bin/env python
"""What ``nbox record`` costs: wall time against a plain torchrun of the same script, the bundle
size per captured iteration, and nbox's observed iteration time against the plain run's.

For each built-in example (2 gloo ranks, one thread each), ``--rounds`` interleaved rounds of:

* plain: ``python -m torch.distributed.run --nproc-per-node 2 <example>.py --steps S --report-times F``,
  where S = warm-up + timed + captured iterations, the same work ``nbox record`` lets run; the
  example writes each rank's per-iteration wall times to F (``--report-times``);
* nbox: ``nbox record --example <example> --warmup W --iterations K --capture C``.

Reported per example: median and min-max of both wall times, the ratio, and the target
(wall <= 1.5 x plain + 5 s); the bundle bytes per captured iteration; the plain run's iteration
time (median and p10-p90 over its post-warm-up iterations, slowest rank per iteration) against nbox's
observed median, and whether nbox's median falls inside the plain run's p10-p90 spread.

Sanity only is asserted. Run from the repository root: ``python bench/record_overhead.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("ddp_mlp", "ddp_transformer", "fsdp2_transformer")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def plain_run(example: str, steps: int, warmup: int, tmp: Path) -> tuple[float, list[float]]:
    """Wall seconds of a plain torchrun, and its job iteration times (us) after warm-up."""
    times = tmp / f"plain-{example}.json"
    script = ROOT / "nbox_record" / "examples" / f"{example}.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_port()), str(script), "--steps", str(steps), "--report-times", str(times)]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=_env(), check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    per_rank = [json.loads((times.parent / f"{times.name}.rank{r}").read_text()) for r in range(2)]
    from nbox_trace.bundle import job_iterations_us

    return wall, job_iterations_us({r: p[warmup:] for r, p in enumerate(per_rank)})


def nbox_run(example: str, warmup: int, iterations: int, capture: int, tmp: Path) -> tuple[float, float, int]:
    """Wall seconds of ``nbox record``, its observed median (us), and the bundle's bytes."""
    out = tmp / f"nbox-{example}.bundle"
    cmd = [sys.executable, "-m", "nbox", "record", "--example", example, "--warmup", str(warmup),
           "--iterations", str(iterations), "--capture", str(capture), "-o", str(out), "--overwrite", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(), check=True, timeout=900, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    doc = json.loads(proc.stdout)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return wall, float(doc["observed_iteration_median_us"]), size


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[int(q * 10) - 1]


def run(examples: list[str], rounds: int, warmup: int, iterations: int, capture: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nbox-bench-record-") as tmpdir:
        tmp = Path(tmpdir)
        for ex in examples:
            plain_w, nbox_w, plain_iters, observed, sizes = [], [], [], [], []
            for r in range(rounds):
                w, job = plain_run(ex, warmup + iterations + capture, warmup, tmp)
                plain_w.append(w)
                plain_iters.extend(job)
                w2, obs, size = nbox_run(ex, warmup, iterations, capture, tmp)
                nbox_w.append(w2)
                observed.append(obs)
                sizes.append(size)
                print(f"{ex} round {r + 1}/{rounds}: plain {w:.1f} s, nbox {w2:.1f} s", file=sys.stderr)
            assert all(s > 0 for s in sizes) and all(o > 0 for o in observed)
            pm, nm = statistics.median(plain_w), statistics.median(nbox_w)
            it_med = statistics.median(plain_iters)
            p10, p90 = _pct(plain_iters, 0.1), _pct(plain_iters, 0.9)
            obs_med = statistics.median(observed)
            results[ex] = {
                "plain_wall_s": {"median": pm, "min": min(plain_w), "max": max(plain_w)},
                "nbox_wall_s": {"median": nm, "min": min(nbox_w), "max": max(nbox_w)},
                "wall_ratio": nm / pm, "wall_target_s": 1.5 * pm + 5, "wall_met": nm <= 1.5 * pm + 5,
                "bundle_bytes_per_captured_iteration": statistics.median(sizes) / capture,
                "plain_iteration_us": {"median": it_med, "p10": p10, "p90": p90, "n": len(plain_iters)},
                "nbox_observed_us": {"median": obs_med, "min": min(observed), "max": max(observed)},
                "observed_error_pct": 100 * (obs_med - it_med) / it_med,
                "observed_inside_spread": p10 <= obs_med <= p90,
            }
    return {"rounds": rounds, "warmup": warmup, "iterations": iterations, "capture": capture,
            "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0]}, "examples": results}


def print_table(res: dict[str, Any]) -> None:
    print(f"{res['rounds']} interleaved rounds; warm-up {res['warmup']}, timed {res['iterations']}, "
          f"captured {res['capture']}; 2 gloo ranks, OMP_NUM_THREADS=1; {res['machine']['cpu_count']} CPUs")
    head = (f"{'example':<20}{'plain wall s':>13}{'nbox wall s':>12}{'ratio':>7}{'<=1.5x+5s':>10}"
            f"{'KB/iter':>9}{'plain iter ms (p10-p90)':>26}{'nbox obs ms':>12}{'err %':>7}{'in spread':>10}")
    print(head)
    for ex, r in res["examples"].items():
        pi = r["plain_iteration_us"]
        print(f"{ex:<20}{r['plain_wall_s']['median']:>13.1f}{r['nbox_wall_s']['median']:>12.1f}"
              f"{r['wall_ratio']:>7.2f}{'yes' if r['wall_met'] else 'NO':>10}"
              f"{r['bundle_bytes_per_captured_iteration'] / 1024:>9.0f}"
              f"{pi['median'] / 1000:>10.2f} ({pi['p10'] / 1000:.2f}-{pi['p90'] / 1000:.2f})"
              f"{r['nbox_observed_us']['median'] / 1000:>12.2f}{r['observed_error_pct']:>7.1f}"
              f"{'yes' if r['observed_inside_spread'] else 'NO':>10}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--capture", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run([e for e in a.examples.split(",") if e], a.rounds, a.warmup, a.iterations, a.capture)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
