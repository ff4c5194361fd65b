"""gloo's all-gather on the testbed: its two modes, into a reused output and into a fresh one (as FSDP2 issues it).

    flock /tmp/nbox_ranks.lock python bench/probes/allgather_modes.py [--rounds 6]
                                                                       [--sizes 14158848,98305536,134217728] [--json]

Two testbed nodes x one rank, pinned, 1 Gb/s (:mod:`nbox_trace.testbed`). Per size, in each round, a few calls back
to back (8 below 32 MiB, 3 below 128 MiB, else 2) of ``all_gather_into_tensor`` into one output reused for every
call, and as many into a fresh output per call whose own shard, the input, is a view filled before the call (FSDP2's
copy-in); the two conditions' order turns round by round. Per call the slower rank's time.

What it tells (``nbox calibrate``'s all-gather, ``--sizes-from``): over a shaped link the all-gather runs in one
of two modes, and the share of calls in each varies with the size and the run: a calibration's median at one size
lands on either. The table gives per size and condition the calls' median, p10-p90 and min-max (the two modes show
as a wide range; in an hour where every call took one mode, as a narrow one). Results are read on stdout; nothing
is written elsewhere.

A probe (bench/README.md). Its finding, the two modes and what they did to a calibration's grid: docs/results.md
and docs/journal/2026-11-28.md, "FSDP2's all-gathers and the job's own sizes".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/probes, for testbed_ranks
from testbed_ranks import run_worker_ranks

CONDITIONS = ("reused", "fresh")


def calls_per_round(nbytes: int) -> int:
    """Calls per size, condition and round: more of the short calls (module docstring)."""
    return 8 if nbytes < 32 << 20 else 3 if nbytes < 128 << 20 else 2


def worker(out: str, rounds: int, sizes: list[int]) -> None:
    """One rank: the timed calls (module docstring); write ``out.rank<R>``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    reused = {n: (torch.empty(n // 4 * world), torch.ones(n // 4)) for n in sizes}

    def call(nbytes: int, fresh: bool) -> float:
        elems = nbytes // 4
        if fresh:
            output = torch.empty(elems * world)
            shard = output.narrow(0, elems * rank, elems)
            shard.fill_(1.0)
        else:
            output, shard = reused[nbytes]
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(output, shard)
        return (time.perf_counter() - t0) * 1e6

    for n in sizes:  # one untimed call each way per size
        call(n, False)
        call(n, True)
    res: dict[str, list[float]] = {}
    for rnd in range(rounds):
        for cond in (CONDITIONS if rnd % 2 == 0 else CONDITIONS[::-1]):
            for n in sizes:
                res.setdefault(f"{cond}/{n}", []).extend(call(n, cond == "fresh") for _ in range(calls_per_round(n)))
    Path(f"{out}.rank{rank}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def summarize(docs: list[dict[str, list[float]]], sizes: list[int]) -> list[dict[str, Any]]:
    """Per size and condition: the slower rank's calls, their median, p10, p90, min and max."""
    rows = []
    for n in sizes:
        per = {c: [max(v) for v in zip(*(d[f"{c}/{n}"] for d in docs), strict=True)] for c in CONDITIONS}
        for cond, calls in per.items():
            deciles = statistics.quantiles(calls, n=10, method="inclusive")
            rows.append({"nbytes": n, "output": cond, "calls": len(calls), "median_us": statistics.median(calls),
                         "p10_us": deciles[0], "p90_us": deciles[-1],
                         "min_us": min(calls), "max_us": max(calls)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sizes", default="14158848,98305536,134217728", help="bytes per rank (the shard), commas")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=3, metavar=("OUT", "ROUNDS", "SIZES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        out, rounds, sizes_text = args.worker
        worker(out, int(rounds), [int(s) for s in sizes_text.split(",")])
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    docs = run_worker_ranks(Path(__file__), [str(args.rounds), ",".join(map(str, sizes))], rate=args.rate,
                            port=29495, timeout_s=900)
    rows = summarize(docs, sizes)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'all_gather shard bytes':>22} {'output':>7} {'calls':>6} {'median ms':>10} {'p10-p90 ms':>17} "
          f"{'min-max ms':>17}")
    for r in rows:
        print(f"{r['nbytes']:>22} {r['output']:>7} {r['calls']:>6} {r['median_us'] / 1e3:10.1f} "
              f"{r['p10_us'] / 1e3:8.1f}-{r['p90_us'] / 1e3:<8.1f} {r['min_us'] / 1e3:8.1f}-{r['max_us'] / 1e3:<8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
