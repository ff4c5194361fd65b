"""Emulation fidelity: a real W-rank gloo run against `nbox emulate` of the same script on N < W real ranks.

    python bench/emulate_fidelity.py [--rounds R] [--example ddp_mlp] [--what-if S.toml] [--set k=v ...]
                                     [--variant NAME:k=v,k=v ...] [--json]
    flock /tmp/nbox-ranks.lock python bench/emulate_fidelity.py --testbed [--world 2|4] [--calibration CAL.toml]
        [--examples ddp_mlp,ddp_transformer,fsdp2_transformer]      # root: bench/emulate_fidelity_testbed.py

Pairs (the emulate issue): real W = 2 against ``nbox emulate --world-size 2 -n 1``, and real W = 4 against
``--world-size 4 -n 2``. The emulated side uses the calibrated scenario of this machine (the shipped
``loopback_cpu``), under ``--what-if``/``--set`` when given. Each ``--variant`` is one more emulated side
(its ``--set`` overrides on top), e.g. ``--variant slow:topology.dims.0.bandwidth_gbps=0.5`` compares a slower link's
answer against the default in the same run. Rounds are interleaved (real, each
emulated variant, real, ...) so that drifts of the machine hit every side alike; per side it prints the
median and p10-p90 of the per-iteration time (the job's pace: the mean over ranks) and the error of the emulated median.
Target: |error| <= 5%. Nothing is asserted. On this 2-vCPU machine a real
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

from nbox_record.launch.emulation import EmulateConfig, emulate, iteration_breakdown  # noqa: E402
from nbox_trace.bundle import job_iterations_us  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_run(example: str, nproc: int, warmup: int, iterations: int, tmp: Path,
             splits: list[dict[str, float]]) -> list[float]:
    """A plain torchrun of the example on ``nproc`` gloo ranks; per timed iteration the job's pace (the mean over
    ranks, us).
    Appends the run's breakdown (as ``nbox emulate`` computes it) to ``splits`` when the example wrote one."""
    times = tmp / f"real-{example}-{nproc}.json"
    script = ROOT / "nbox_record" / "examples" / f"{example}.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
                    str(_port()), str(script), "--steps", str(warmup + iterations), "--report-times", str(times)],
                   env=env, check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    per_rank = [json.loads((tmp / f"{times.name}.rank{r}").read_text()) for r in range(nproc)]
    timings = {}
    for r in range(nproc):
        split_file = tmp / f"{times.name}.rank{r}.split"
        split = json.loads(split_file.read_text()) if split_file.is_file() else []
        if len(split) == len(per_rank[r]):
            timings[r] = {"iteration_us": per_rank[r][warmup:], "iteration_cpu_us": [c for c, _ in split][warmup:],
                          "iteration_run_queue_us": [q for _, q in split][warmup:]}
    b = iteration_breakdown(timings) if len(timings) == nproc else None
    if b is not None:
        splits.append(b)
    return job_iterations_us({r: p[warmup:] for r, p in enumerate(per_rank)})


def emulated_run(example: str, world: int, nproc: int, warmup: int, iterations: int,
                 splits: list[dict[str, float]], scenario: Path | None = None,
                 overrides: tuple[str, ...] = ()) -> list[float]:
    res = emulate(EmulateConfig(world_size=world, nproc=nproc, example=example, warmup=warmup, iterations=iterations,
                                scenario=scenario, overrides=overrides))
    if res.world_size_seen != world:
        raise RuntimeError(f"the script saw world size {res.world_size_seen}, not {world}")
    if res.breakdown is not None:
        splits.append(res.breakdown)
    return list(res.iteration_us)


def mean_split(splits: list[dict[str, float]]) -> dict[str, float] | None:
    """The runs' breakdowns averaged (each is a mean per iteration over equally many iterations)."""
    if not splits:
        return None
    return {k: statistics.fmean(s[k] for s in splits) for k in splits[0]}


def run(example: str, rounds: int, warmup: int, iterations: int, scenario: Path | None = None,
        overrides: tuple[str, ...] = (), variants: tuple[tuple[str, tuple[str, ...]], ...] = (("emulated", ()),),
        pairs: tuple[tuple[int, int], ...] = ((2, 1), (4, 2))) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nbox-emulate-fidelity-") as tmp_s:
        tmp = Path(tmp_s)
        for world, nproc in pairs:
            real: list[float] = []
            real_split: list[dict[str, float]] = []
            emu: dict[str, list[float]] = {name: [] for name, _ in variants}
            emu_split: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
            for _ in range(rounds):
                real += real_run(example, world, warmup, iterations, tmp, real_split)
                for name, sets in variants:
                    emu[name] += emulated_run(example, world, nproc, warmup, iterations, emu_split[name], scenario,
                                              overrides + sets)
            obs = statistics.median(real)
            for name, sets in variants:
                got = statistics.median(emu[name])
                row = {"example": example, "variant": name, "overrides": list(overrides + sets), "world_size": world,
                       "real_ranks": nproc, "real_median_us": obs, "real_p10_us": pct(real, 10),
                       "real_p90_us": pct(real, 90), "emulated_median_us": got,
                       "emulated_p10_us": pct(emu[name], 10), "emulated_p90_us": pct(emu[name], 90),
                       "error_pct": (got - obs) / obs * 100, "n": (len(real), len(emu[name])),
                       "real_breakdown_us": mean_split(real_split),
                       "emulated_breakdown_us": mean_split(emu_split[name])}
                rows.append(row)
                print(format_rows([row]), file=sys.stderr)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'example':<12} {'variant':<10} {'W':>3} {'N':>3} {'real ms (p10-p90)':>22} "
             f"{'emulated ms (p10-p90)':>24} {'error':>8}  target |error| <= 5%"]
    for r in rows:
        real = f"{r['real_median_us'] / 1e3:.2f} ({r['real_p10_us'] / 1e3:.2f}-{r['real_p90_us'] / 1e3:.2f})"
        emu = (f"{r['emulated_median_us'] / 1e3:.2f} ({r['emulated_p10_us'] / 1e3:.2f}-"
               f"{r['emulated_p90_us'] / 1e3:.2f})")
        met = "met" if abs(r["error_pct"]) <= 5 else "NOT met"
        lines.append(f"{r['example']:<12} {r.get('variant', 'emulated'):<10} {r['world_size']:>3} "
                     f"{r['real_ranks']:>3} {real:>22} {emu:>24} "
                     f"{r['error_pct']:+7.1f}%  {met}")
    lines.append("breakdown, mean ms per iteration (slowest rank's training thread): compute / exposed comm / "
                 "CPU contention = mean iteration")
    for r in rows:
        for side in ("real", "emulated"):
            b = r.get(f"{side}_breakdown_us")
            label = side if side == "real" else r.get("variant", side)
            if b:
                lines.append(f"  W={r['world_size']} {label:<9} {b['compute_us'] / 1e3:6.2f} / "
                             f"{b['exposed_comm_us'] / 1e3:6.2f} / {b['cpu_contention_us'] / 1e3:6.2f} = "
                             f"{b['iteration_us'] / 1e3:6.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--example", default="ddp_mlp")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--what-if", type=Path, default=None, help="scenario TOML (default: the shipped loopback_cpu)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override, repeatable")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,K=V",
                    help="an emulated side with its own overrides (repeatable; default: one side, no overrides)")
    ap.add_argument("--pairs", default="2:1,4:2", help="W:N pairs (default 2:1,4:2)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--testbed", action="store_true",
                    help="real W across W namespace nodes x 1 rank against nbox emulate (root): "
                         "bench/emulate_fidelity_testbed.py")
    ap.add_argument("--world", type=int, default=2, choices=(2, 4), help="--testbed: W (nodes of the real side)")
    ap.add_argument("--examples", default="ddp_mlp,ddp_transformer,fsdp2_transformer", help="--testbed: examples")
    ap.add_argument("--steps", type=int, default=13, help="--testbed: iterations per run (incl. warm-up)")
    ap.add_argument("--rate", default="1gbit", help="--testbed: every link's tbf rate")
    ap.add_argument("--gloo-loop", choices=("batch", "default"), default="batch",
                    help="--testbed: gloo's device-loop threads at SCHED_BATCH (the testbed's default; see "
                         "nbox_trace/testbed/threads.py) or at the kernel's default (README's runs J to T)")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="--testbed: the calibrated scenario; measured on two nodes and written here when missing")
    ap.add_argument("--max-of-nodes", action="store_true",
                    help="--testbed: one more side, a diagnostic: a one-rank emulate on every node at once, each on "
                         "its own, the slowest node's time per iteration (what each rank's own CPU adds)")
    ap.add_argument("--sizes", default="4KiB..16MiB", help="--testbed: nbox calibrate --sizes")
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter",
                    help="--testbed: nbox calibrate --collectives")
    ap.add_argument("--budget", type=float, default=0.2, help="--testbed: nbox calibrate --budget")
    args = ap.parse_args()
    variants = []
    for v in args.variant:
        name, _, sets = v.partition(":")
        variants.append((name, tuple(x for x in sets.split(",") if x)))
    if args.testbed:
        return _testbed(args, tuple(variants) or (("", ()),))
    pairs = tuple((int(w), int(n)) for w, n in (p.split(":") for p in args.pairs.split(",")))
    rows = run(args.example, args.rounds, args.warmup, args.iterations, args.what_if, tuple(args.set),
               tuple(variants) or (("emulated", ()),), pairs)
    print("\n" + format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


def _testbed(args: argparse.Namespace, variants: tuple[tuple[str, tuple[str, ...]], ...]) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    import emulate_fidelity_testbed as tb

    with tempfile.TemporaryDirectory(prefix="nbox-emulate-tb-") as tmp:
        rows = tb.run([e for e in args.examples.split(",") if e], args.world, args.rounds, args.steps, args.warmup,
                      args.rate, args.calibration, args.sizes, args.collectives, args.budget, Path(tmp), variants,
                      args.gloo_loop == "batch", args.max_of_nodes)
    print(f"\ntestbed: real W = {args.world} ({args.world} nodes x 1 rank, pinned, {args.rate} per link, gloo loop "
          f"{args.gloo_loop}) against "
          f"nbox emulate under the testbed's calibrated scenario\n" + tb.format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
