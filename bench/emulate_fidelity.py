"""Emulation fidelity: a real W-rank gloo run against `nbox emulate` of the same script on N < W real ranks.

    python bench/emulate_fidelity.py [--rounds R] [--example ddp_mlp] [--json]

Pairs (the emulate issue): real W = 2 against ``nbox emulate --world-size 2 -n 1``, and real W = 4 against
``--world-size 4 -n 2``. The emulated side uses the calibrated scenario of this machine (the shipped
``loopback_cpu``). Rounds are interleaved (real, emulated, real, emulated, ...) so that drifts of the machine
hit both alike; per side it prints the median and p10-p90 of the per-iteration time (slowest rank) and the
error of the emulated median. Target: |error| <= 5%. Nothing is asserted. On this 2-vCPU machine a real
4-rank run oversubscribes the cores (2 ranks per core), which the emulated 2-rank run does not: the W=4 pair
measures that difference as much as the emulator.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nbox_record.emulate import EmulateConfig, emulate  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_run(example: str, nproc: int, warmup: int, iterations: int, tmp: Path) -> list[float]:
    """A plain torchrun of the example on ``nproc`` gloo ranks; per timed iteration the slowest rank (us)."""
    times = tmp / f"real-{example}-{nproc}.json"
    script = ROOT / "nbox_record" / "examples" / f"{example}.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
                    str(_port()), str(script), "--steps", str(warmup + iterations), "--report-times", str(times)],
                   env=env, check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    per_rank = [json.loads((tmp / f"{times.name}.rank{r}").read_text()) for r in range(nproc)]
    n = min(len(p) for p in per_rank)
    return [max(p[i] for p in per_rank) for i in range(warmup, n)]


def emulated_run(example: str, world: int, nproc: int, warmup: int, iterations: int) -> list[float]:
    res = emulate(EmulateConfig(world_size=world, nproc=nproc, example=example, warmup=warmup, iterations=iterations))
    if res.world_size_seen != world:
        raise RuntimeError(f"the script saw world size {res.world_size_seen}, not {world}")
    return list(res.iteration_us)


def run(example: str, rounds: int, warmup: int, iterations: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nbox-emulate-fidelity-") as tmp_s:
        tmp = Path(tmp_s)
        for world, nproc in ((2, 1), (4, 2)):
            real: list[float] = []
            emu: list[float] = []
            for _ in range(rounds):
                real += real_run(example, world, warmup, iterations, tmp)
                emu += emulated_run(example, world, nproc, warmup, iterations)
            obs, got = statistics.median(real), statistics.median(emu)
            row = {"example": example, "world_size": world, "real_ranks": nproc, "real_median_us": obs,
                   "real_p10_us": pct(real, 10), "real_p90_us": pct(real, 90), "emulated_median_us": got,
                   "emulated_p10_us": pct(emu, 10), "emulated_p90_us": pct(emu, 90),
                   "error_pct": (got - obs) / obs * 100, "n": (len(real), len(emu))}
            rows.append(row)
            print(format_rows([row]), file=sys.stderr)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'example':<12} {'W':>3} {'N':>3} {'real ms (p10-p90)':>22} {'emulated ms (p10-p90)':>24} {'error':>8}"
             f"  target |error| <= 5%"]
    for r in rows:
        real = f"{r['real_median_us'] / 1e3:.2f} ({r['real_p10_us'] / 1e3:.2f}-{r['real_p90_us'] / 1e3:.2f})"
        emu = (f"{r['emulated_median_us'] / 1e3:.2f} ({r['emulated_p10_us'] / 1e3:.2f}-"
               f"{r['emulated_p90_us'] / 1e3:.2f})")
        met = "met" if abs(r["error_pct"]) <= 5 else "NOT met"
        lines.append(f"{r['example']:<12} {r['world_size']:>3} {r['real_ranks']:>3} {real:>22} {emu:>24} "
                     f"{r['error_pct']:+7.1f}%  {met}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--example", default="ddp_mlp")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = run(args.example, args.rounds, args.warmup, args.iterations)
    print("\n" + format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
