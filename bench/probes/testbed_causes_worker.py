"""One rank of bench/probes/testbed_causes.py (run through torchrun on each testbed node): times gloo all_reduces at
the given sizes alone, the same sizes issued together (as DDP's buckets are), a fixed matmul loop alone and
while a large all_reduce is in flight (gloo's CPU cost on the rank's one core), and the process CPU time (all
threads, user + system) one all_gather / reduce_scatter / all_reduce of argv[4] bytes (the full buffer) costs,
and the same calls' wall time while a thread of this rank computes on its core (``{name}_busy``: a matmul
loop started 2 ms before the call and stopped after it; the calibration times calls on an idle core).

Completion while a member computes (``done_{mode}_{size}``, microseconds from the issue to the moment gloo
completes the call, taken in its completion callback): an async all_reduce issued by the main thread, which
then ``idle``: waits for it at once; ``self``: computes (a matmul loop on the main thread, as a training step
does after issuing a collective) for ``compute_ms`` before waiting, on both ranks; ``peer``: rank 0 computes,
rank 1 waits at once (rank 1's figure is the one read: the peer's compute delaying its completion).
Writes JSON to argv[1].rank<R>. A probe's worker (bench/README.md); the findings: testbed_causes.py's docstring."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def main() -> None:
    out, sizes, reps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    cpu_bytes = int(sys.argv[4])
    dist.init_process_group("gloo")
    full, shard = torch.ones(cpu_bytes // 4), torch.ones(cpu_bytes // 4 // dist.get_world_size())
    calls: dict[str, Callable[[], object]] = {
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
        "all_reduce": lambda: dist.all_reduce(full)}
    bufs = [torch.ones(s // 4) for s in sizes]
    big = torch.ones(4 * 1024 * 1024)  # 16 MiB: ~140 ms on the 1 Gb/s link
    a, b = torch.randn(32, 512), torch.randn(512, 512)
    res: dict[str, list[float]] = {f"alone_{s}": [] for s in sizes}
    res.update({"together": [], "mm_alone": [], "mm_during_comm": []})
    res.update({f"{k}_{m}": [] for k in calls for m in ("wall", "cpu", "idle", "busy")})
    busy, stop = threading.Event(), threading.Event()
    ba, bb = torch.randn(192, 192), torch.randn(192, 192)

    def burner() -> None:  # computes while ``busy`` is set (torch.mm releases the GIL)
        while not stop.is_set():
            if busy.is_set():
                torch.mm(ba, bb)
            else:
                time.sleep(0.0005)

    threading.Thread(target=burner, daemon=True).start()

    def timed(fn: object) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        return (time.perf_counter() - t) * 1e6

    def mm_loop() -> None:
        for _ in range(200):
            torch.mm(a, b)

    for _ in range(reps):
        for s, buf in zip(sizes, bufs, strict=True):
            res[f"alone_{s}"].append(timed(lambda buf=buf: dist.all_reduce(buf)))
        res["together"].append(timed(lambda: [w.wait() for w in [dist.all_reduce(x, async_op=True) for x in bufs]]))
        res["mm_alone"].append(timed(mm_loop))
        dist.barrier()
        work = dist.all_reduce(big, async_op=True)
        t = time.perf_counter()
        mm_loop()
        res["mm_during_comm"].append((time.perf_counter() - t) * 1e6)
        work.wait()
        for name, call in calls.items():  # per call, over 5 calls: wall and this process's CPU (us)
            dist.barrier()
            c, t = time.process_time(), time.perf_counter()
            for _ in range(5):
                call()
            res[f"{name}_wall"].append((time.perf_counter() - t) * 1e6 / 5)
            res[f"{name}_cpu"].append((time.process_time() - c) * 1e6 / 5)
            for mode in ("idle", "busy"):  # one call each, interleaved
                dist.barrier()
                if mode == "busy":
                    busy.set()
                    time.sleep(0.002)
                t = time.perf_counter()
                call()
                res[f"{name}_{mode}"].append((time.perf_counter() - t) * 1e6)
                busy.clear()
    done_sizes = (65536, 262144, 1048576)
    done_bufs = {n: torch.ones(n // 4) for n in done_sizes}
    rank = dist.get_rank()
    for n in done_sizes:
        res.update({f"done_{m}_{n}": [] for m in ("idle", "self", "peer")})

    def compute_for(ms: float) -> None:  # the main thread computes for ``ms`` (torch.mm releases the GIL)
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            torch.mm(a, b)

    for _ in range(reps):
        for n in done_sizes:
            compute_ms = 8.0 if n < 1_000_000 else 12.0  # longer than the call alone
            for mode in ("idle", "self", "peer"):
                dist.barrier()
                compute_for(1.0)
                stamp: list[float] = []
                t = time.perf_counter()
                work = dist.all_reduce(done_bufs[n], async_op=True)
                work.get_future().then(lambda _f, stamp=stamp: stamp.append(time.perf_counter()))
                if mode == "self" or (mode == "peer" and rank == 0):
                    compute_for(compute_ms)
                work.wait()
                while not stamp:
                    time.sleep(1e-4)
                res[f"done_{mode}_{n}"].append((stamp[0] - t) * 1e6)
    stop.set()
    with open(f"{out}.rank{dist.get_rank()}", "w") as f:
        json.dump({k: statistics.median(v) for k, v in res.items()} | {"raw": res}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
