"""Whether gloo's two calls in flight run a stream of all-reduces faster than calls timed alone, on the testbed.

    flock /tmp/nbox_ranks.lock python bench/probes/stream_pair.py [--reps 8] [--sizes 16777216,33554432] [--load]
                                                                   [--json]

Two testbed nodes x one rank, pinned, 1 Gb/s (:mod:`nbox_trace.testbed`). Per size, interleaved in each
repetition, each after a small draining call: one call alone (``T1``); two calls one after the other right after it
(back to back, as ``nbox calibrate`` times its calls); two async calls issued together and both waited for (``T2``);
four issued together (``T4``; gloo still runs two at a time). Medians of the slower rank's times. ``--load``: a thread
of each rank computes a matmul loop throughout, sharing the rank's core.

What it tells (``emulator_core.pricing.answer``, "queued behind the previous"): the model prices a stream of
buckets as calls timed alone, one after another. gloo runs a group's async calls on two worker threads, so while
one call does its host-side steps the other's bytes could keep the link busy. ``factor = (T2 - T1) / T1`` is what
a second call in flight adds; ``steady = (T4 - T2) / (2 T1)`` what each further call adds once the stream runs
(past the start, where a token-bucket link still holds the credit the first call's host-side steps left unused).
Results are read on stdout; nothing is written elsewhere.

A probe (bench/README.md). Its finding, nothing to gain on an idle core (a key fitted from it was reverted):
docs/journal/2026-11-28.md, "The stream's own price: the calibration's state, not gloo's two calls in flight".
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


def worker(out: str, reps: int, sizes: list[int], load: bool) -> None:
    """One rank: time the single calls and the pairs (module docstring); write ``out.rank<R>``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if load:  # a thread computing throughout, sharing the rank's core (a loaded node)
        import threading

        a, b = torch.randn(192, 192), torch.randn(192, 192)
        stop = threading.Event()

        def burner() -> None:  # torch.mm releases the GIL: it competes for the core, not for the interpreter
            while not stop.is_set():
                torch.mm(a, b)

        threading.Thread(target=burner, daemon=True).start()
    drain = torch.ones(1 << 18)
    res: dict[str, Any] = {}
    for size in sizes:
        x, y = torch.ones(size // 4), torch.ones(size // 4)
        more = [torch.ones(size // 4) for _ in range(4)]
        one: list[float] = []
        two: list[float] = []
        seq: list[float] = []
        four: list[float] = []
        for _ in range(reps):
            dist.all_reduce(drain)
            t = time.perf_counter()
            dist.all_reduce(x)
            one.append((time.perf_counter() - t) * 1e6)
            t = time.perf_counter()  # right after it, as the calibration times its calls: back to back
            dist.all_reduce(x)
            dist.all_reduce(y)
            seq.append((time.perf_counter() - t) * 1e6)
            dist.all_reduce(drain)
            t = time.perf_counter()
            works = [dist.all_reduce(x, async_op=True), dist.all_reduce(y, async_op=True)]
            for w in works:
                w.wait()
            two.append((time.perf_counter() - t) * 1e6)
            t = time.perf_counter()  # four issued together right after: gloo still runs two at a time
            works = [dist.all_reduce(z, async_op=True) for z in more]
            for w in works:
                w.wait()
            four.append((time.perf_counter() - t) * 1e6)
        res[str(size)] = [one, two, seq, four]
    if load:
        stop.set()
    Path(f"{out}.rank{dist.get_rank()}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--sizes", default=f"{16 << 20},{32 << 20}", help="bytes per call, comma-separated")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--load", action="store_true", help="a thread of each rank computes throughout (a loaded core)")
    ap.add_argument("--worker", nargs=4, metavar=("OUT", "REPS", "SIZES", "LOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        out, reps, sizes, load = args.worker
        worker(out, int(reps), [int(s) for s in sizes.split(",")], load == "1")
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    docs = run_worker_ranks(Path(__file__), [str(args.reps), ",".join(map(str, sizes)), str(int(args.load))],
                            rate=args.rate, port=29494, timeout_s=550)

    rows = []
    for size in sizes:
        one, two, seq, four = ([max(a, b) for a, b in zip(docs[0][str(size)][i], docs[1][str(size)][i], strict=True)]
                               for i in (0, 1, 2, 3))
        t1, t2 = statistics.median(one), statistics.median(two)
        rows.append({"nbytes": size, "one_us": t1, "pair_us": t2, "factor": (t2 - t1) / t1,
                     "back_to_back_us": statistics.median(seq), "four_us": statistics.median(four),
                     "steady_factor": (statistics.median(four) - t2) / (2 * t1),
                     "one_p10_p90_us": statistics.quantiles(one, n=10)[::8],
                     "pair_p10_p90_us": statistics.quantiles(two, n=10)[::8]})
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'all_reduce bytes':>16} {'one ms':>8} {'pair ms':>8} {'2 in a row ms':>14} {'factor':>7} {'4 ms':>8} "
          f"{'steady':>7} {'one Gb/s':>9} "
          f"{'stream Gb/s':>12}")
    for r in rows:
        n = r["nbytes"]
        print(f"{n:>16} {r['one_us'] / 1e3:8.1f} {r['pair_us'] / 1e3:8.1f} {r['back_to_back_us'] / 1e3:14.1f} "
              f"{r['factor']:7.3f} {r['four_us'] / 1e3:8.1f} {r['steady_factor']:7.3f} "
              f"{n * 8 / r['one_us'] / 1e3:9.3f} {n * 8 / (r['pair_us'] - r['one_us']) / 1e3:12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
