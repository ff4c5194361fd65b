"""How much longer a gloo all-reduce runs beside compute on its node's one core, by size and in a DDP-like stream.

    flock /tmp/nbox_ranks.lock python bench/probes/busy_sizes.py [--reps 8] [--stream-calls 8] [--json]

Two testbed nodes x one rank, pinned, 1 Gb/s (:mod:`nbox_trace.testbed`). Per size (1 MiB, 4 MiB, 16 MiB and one
25 MiB DDP bucket): pairs of a call on an idle core and one while a thread of the rank computes a matmul loop on it,
each after a small draining call, as ``nbox calibrate --rest`` times ``busy_slowdown`` at one size; medians of the
slower rank's times. Then a stream as DDP issues its buckets during the backward pass: ``--stream-calls`` async
all-reduces of a bucket, issued ``--gap-ms`` apart, all waited for at the end, once on an idle core and once with
the thread computing from the first issue to the last completion.

What it tells (``emulator_core.pricing.answer``, "beside compute"): whether the loss beside compute is a delay per call
(the same milliseconds at every size) or a rate (the same ratio), and what a stream of buckets, whose calls gloo
runs two at a time, loses against the single calls. Results are read on stdout; nothing is written elsewhere.

A probe (bench/README.md). Its finding, a delay per call rather than a rate: docs/journal/2026-11-28.md,
"busy_slowdown: a delay per call".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/probes, for testbed_ranks
from testbed_ranks import run_worker_ranks

SIZES = (1 << 20, 4 << 20, 16 << 20, 26812416)  # the last: a DDP bucket of 25 MiB, as ResNet-152's recorded
BUCKET = SIZES[-1]


def worker(out: str, reps: int, calls: int, gap_s: float) -> None:
    """One rank: time the single calls and the streams (module docstring); write ``out.rank<R>``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    a, b = torch.randn(192, 192), torch.randn(192, 192)
    busy, stop = threading.Event(), threading.Event()

    def burner() -> None:  # torch.mm releases the GIL: it competes for the core, not the interpreter
        while not stop.is_set():
            if busy.is_set():
                torch.mm(a, b)
            else:
                busy.wait(0.01)

    thread = threading.Thread(target=burner, daemon=True)
    thread.start()
    drain = torch.ones(1 << 18)
    res: dict[str, Any] = {}
    for size in SIZES:
        buf = torch.ones(size // 4)
        idle: list[float] = []
        loaded: list[float] = []
        for _ in range(reps):
            for times, on in ((idle, False), (loaded, True)):
                dist.all_reduce(drain)
                if on:
                    busy.set()
                t = time.perf_counter()
                dist.all_reduce(buf)
                times.append((time.perf_counter() - t) * 1e6)
                busy.clear()
        res[f"single_{size}"] = [idle, loaded]
    bufs = [torch.ones(BUCKET // 4) for _ in range(calls)]
    for mode in ("idle", "busy"):
        spans = []
        for _ in range(max(2, reps // 2)):
            dist.barrier()
            t = time.perf_counter()
            if mode == "busy":
                busy.set()
            works = []
            for x in bufs:
                works.append(dist.all_reduce(x, async_op=True))
                time.sleep(gap_s)
            for w in works:
                w.wait()
            busy.clear()
            spans.append((time.perf_counter() - t) * 1e6)
        res[f"stream_{mode}"] = spans
    stop.set()
    busy.set()
    thread.join()
    Path(f"{out}.rank{dist.get_rank()}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--stream-calls", type=int, default=8)
    ap.add_argument("--gap-ms", type=float, default=100.0, help="between a stream's issues (a backward's buckets)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--share", type=float, default=None, help="each node's CPU share (a cgroup quota; default none)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=4, metavar=("OUT", "REPS", "CALLS", "GAP_S"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        out, reps, calls, gap = args.worker
        worker(out, int(reps), int(calls), float(gap))
        return 0
    docs = run_worker_ranks(Path(__file__), [str(args.reps), str(args.stream_calls), str(args.gap_ms / 1e3)],
                            rate=args.rate, port=29493, timeout_s=550, cpu_share=args.share)

    def slower(key: str, i: int | None = None) -> list[float]:  # per sample, the slower rank's time
        pair = [d[key] if i is None else d[key][i] for d in docs]
        return [max(x, y) for x, y in zip(pair[0], pair[1], strict=True)]

    rows = []
    for size in SIZES:
        idle, loaded = statistics.median(slower(f"single_{size}", 0)), statistics.median(slower(f"single_{size}", 1))
        rows.append({"nbytes": size, "idle_us": idle, "busy_us": loaded})
    stream = {m: statistics.median(slower(f"stream_{m}")) for m in ("idle", "busy")}
    if args.json:
        print(json.dumps({"singles": rows, "stream": {"calls": args.stream_calls, "gap_ms": args.gap_ms, **stream}}))
        return 0
    print(f"{'all_reduce bytes':>16} {'idle ms':>9} {'busy ms':>9} {'ratio':>6} {'extra ms':>9}")
    for r in rows:
        print(f"{r['nbytes']:>16} {r['idle_us'] / 1e3:9.1f} {r['busy_us'] / 1e3:9.1f} "
              f"{r['busy_us'] / r['idle_us']:6.2f} {(r['busy_us'] - r['idle_us']) / 1e3:+9.1f}")
    print(f"stream of {args.stream_calls} x {BUCKET} bytes, {args.gap_ms:g} ms apart: idle {stream['idle'] / 1e3:.1f} "
          f"ms, busy {stream['busy'] / 1e3:.1f} ms ({(stream['busy'] / stream['idle'] - 1) * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
