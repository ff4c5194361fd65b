"""The collective library's own CPU on a rank's core: gloo's threads' CPU time per all-reduce over the call's time.

    python bench/probes/library_cpu.py [--sizes 1048576,8388608,26214400,104857600] [--rate 1gbit] [--json]

Two testbed nodes x one rank, pinned, over the shaped link (:mod:`nbox_trace.testbed`, root). Per size, a few
``all_reduce`` calls back to back after one untimed call; per call and rank: the wall time, the process's CPU time
less the calling thread's (the library's threads: gloo copies and reduces on them while the caller waits), and the
busy time of the rank's core from ``/proc/stat`` (kernel time included; 10 ms ticks, so coarse on short calls). The
table gives per size and rank the medians and the library's share of a core (its CPU over the call's time). It
measured what ``nbox emulate`` leaves out where the peer is emulated. Nothing is asserted; nothing is written.

A probe (bench/README.md). Its finding, a share not worth putting back: docs/results.md and
docs/journal/2026-11-28.md, "Emulate, the library's CPU and compute noise, measured on the four models".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/probes, for testbed_ranks
from testbed_ranks import run_worker_ranks


def _core_busy_ticks(cpus: set[int]) -> int:
    """The busy ticks (all but idle and iowait) of ``cpus`` so far, from ``/proc/stat``."""
    total = 0
    names = {f"cpu{c}" for c in cpus}
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in names:
                v = [int(x) for x in fields[1:]]
                total += sum(v) - v[3] - v[4]
    return total


def worker(out: str, sizes: list[int]) -> None:
    """One rank: the timed calls; write ``out.rank<R>``: per size, per call (wall, library CPU, core busy) us."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cpus, tick_us = set(os.sched_getaffinity(0)), 1e6 / os.sysconf("SC_CLK_TCK")
    res: dict[str, list[list[float]]] = {}
    for n in sizes:
        t = torch.ones(n // 4)
        dist.all_reduce(t)
        calls = []
        for _ in range(6 if n < 64 << 20 else 3):
            j0 = _core_busy_ticks(cpus)
            w0, p0, c0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
            dist.all_reduce(t)
            w1, p1, c1 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
            j1 = _core_busy_ticks(cpus)
            calls.append([(w1 - w0) / 1e3, ((p1 - p0) - (c1 - c0)) / 1e3, (j1 - j0) * tick_us])
        res[str(n)] = calls
    Path(f"{out}.rank{rank}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1048576,8388608,26214400,104857600", help="bytes per rank, commas")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("OUT", "SIZES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], [int(s) for s in args.worker[1].split(",")])
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    docs = run_worker_ranks(Path(__file__), [",".join(map(str, sizes))], rate=args.rate, port=29497, timeout_s=900)
    rows: list[dict[str, Any]] = []
    for r, doc in enumerate(docs):
        for n in sizes:
            calls = doc[str(n)]
            rows.append({"rank": r, "nbytes": n, "calls": len(calls),
                         "wall_ms": statistics.median(c[0] for c in calls) / 1e3,
                         "library_cpu_ms": statistics.median(c[1] for c in calls) / 1e3,
                         "library_share": statistics.median(c[1] / c[0] for c in calls),
                         "core_busy_share": statistics.median(c[2] / c[0] for c in calls)})
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'rank':>4} {'bytes':>11} {'calls':>5} {'wall ms':>9} {'library CPU ms':>15} {'share of a core':>16} "
          f"{'core busy':>10}")
    for row in rows:
        print(f"{row['rank']:>4} {row['nbytes']:>11} {row['calls']:>5} {row['wall_ms']:>9.1f} "
              f"{row['library_cpu_ms']:>15.1f} {row['library_share']:>16.3f} {row['core_busy_share']:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
