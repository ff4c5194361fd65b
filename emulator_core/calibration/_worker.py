"""One rank of ``nbox calibrate``: time real collectives and report them (launched by
``emulator_core.calibration.run``).

Run as N ranks of ``python -m emulator_core.calibration._worker --out DIR ...`` (:mod:`nbox_trace.launch`; torchrun
across nodes), with the launcher's process-group environment; every collective waits at most ``--timeout-s``. For
each collective x size (a "point"; bytes in costmodels' convention: the per-rank input, all_gather: the shard):

1. ``--warmup`` untimed iterations; their slowest time (max over ranks) sets the iteration count
   ``clamp(budget_s / warm-up time, --min-iters, --max-iters)``, the same on every rank;
2. ``--rounds`` rounds, each visiting every point in turn: fresh tensors (all_gather: a fresh output per call, as
   FSDP2 issues it, :class:`_FreshAllGather`), one untimed iteration, then ``ceil(count / rounds)`` timed iterations
   back to back after one barrier, each ``t0; op; t1`` (CUDA: synchronize before t0 and before t1);
3. the per-iteration time is the max over ranks of ``t1 - t0`` (microseconds); reported: median, p10, p90, min, max,
   count, and the per-round samples;
4. ``--busy`` (CPU ranks): for each of :data:`BUSY_COLLECTIVES`, at its largest size whose warm-up took at most
   :data:`BUSY_CALL_MAX_US` (else the smallest), at least :data:`BUSY_MIN_PAIRS` pairs of a call on an idle core
   and one while a thread of the rank computes a matmul loop (``idle_us``, ``busy_us``, max over ranks), reported
   as ``beside_compute`` with the size measured (``emulator_core.calibration.pipeline`` makes ``busy_slowdown``).

The first rank of each node writes ``DIR/result.json`` (schema ``nbox.calibrate-result/1``) and keeps
``DIR/progress.json`` on the current point; a rank that fails writes ``DIR/error-rank<R>.json`` (rank, collective,
size, exception type and message) and exits 1. Tensors are float32 (CPU for gloo, ``cuda:LOCAL_RANK`` for nccl); a
size is rounded up to whole elements and, where the collective splits the buffer, to a multiple of
``4 * world_size`` bytes: the bytes moved are reported. send_recv pairs ranks (0, 1), (2, 3), ...: the even rank
sends. Why the timing is done so: docs/design/calibration.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

RESULT = "result.json"
PROGRESS = "progress.json"
SCHEMA = "nbox.calibrate-result/1"
#: The beside-compute calls take at most this long back to back (microseconds): a call long enough that the
#: computing thread shares its core for a while, short enough to time many pairs in the budget.
BUSY_CALL_MAX_US = 20_000.0
#: Collectives timed beside compute (those measured).
BUSY_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
#: Fewest (idle, busy) pairs timed per collective: the slowdown is a ratio of medians of noisy calls.
BUSY_MIN_PAIRS = 40
#: Collectives the worker can time.
SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier", "send_recv")


def error_file(out: Path, rank: int) -> Path:
    """Where ``rank`` writes its error report."""
    return out / f"error-rank{rank}.json"


def error_files(out: Path) -> dict[int, Path]:
    """The error reports the ranks left in ``out``, by rank."""
    found = {}
    for path in out.glob("error-rank*.json"):
        digits = path.name[len("error-rank"):-len(".json")]
        if digits.isdigit():
            found[int(digits)] = path
    return dict(sorted(found.items()))


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def element_count(collective: str, nbytes: int, world: int) -> int:
    """float32 elements of the per-rank input for ``nbytes`` (rounded up; split collectives: a multiple of world)."""
    if collective == "barrier":
        return 0
    elems = max(1, -(-nbytes // 4))
    if collective in ("reduce_scatter", "all_to_all"):
        elems = -(-elems // world) * world
    return elems


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) with linear interpolation between order statistics."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _make_op(collective: str, elems: int, rank: int, world: int, device: Any) -> Callable[[], object]:
    import torch
    import torch.distributed as dist

    x = torch.ones(max(elems, 1), dtype=torch.float32, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(x)
    if collective == "broadcast":
        return lambda: dist.broadcast(x, src=0)
    if collective == "barrier":
        return lambda: dist.barrier()
    if collective == "all_gather":
        return _FreshAllGather(elems, rank, world, device)
    if collective == "reduce_scatter":
        shard = torch.empty(elems // world, dtype=torch.float32, device=device)
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: rs(shard, x)
    if collective == "all_to_all":
        recv = torch.empty(elems, dtype=torch.float32, device=device)
        return lambda: dist.all_to_all_single(recv, x)
    if collective == "send_recv":
        if rank % 2 == 0 and rank + 1 < world:
            return lambda: dist.send(x, rank + 1)
        if rank % 2 == 1:
            return lambda: dist.recv(x, rank - 1)
        return lambda: None
    raise ValueError(f"unsupported collective {collective!r} (supported: {', '.join(SUPPORTED)})")


class _FreshAllGather:
    """all_gather_into_tensor as FSDP2 (and ZeRO-3) issue it: each call gathers into a newly allocated output whose
    own shard, the input, is a view filled before the call (FSDP2's copy-in). :meth:`prepare` makes them, outside
    the timed window, so the call is timed as the job makes it (why: docs/design/calibration.md)."""

    def __init__(self, elems: int, rank: int, world: int, device: Any) -> None:
        self.elems, self.rank, self.world, self.device = elems, rank, world, device
        self.prepare()

    def prepare(self) -> None:
        import torch

        self.out = torch.empty(self.elems * self.world, dtype=torch.float32, device=self.device)
        self.inp = self.out.narrow(0, self.elems * self.rank, self.elems)
        self.inp.fill_(1.0)

    def __call__(self) -> object:
        import torch.distributed as dist

        return dist.all_gather_into_tensor(self.out, self.inp)


def _prepare(op: Callable[[], object], device: Any) -> None:
    """Run the op's untimed preparation, if it has one (CUDA: and wait for it)."""
    prepare = getattr(op, "prepare", None)
    if prepare is None:
        return
    prepare()
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _timed_calls(op: Callable[[], object], iters: int, device: Any) -> list[float]:
    """``iters`` calls back to back, each ``prepare; t0; op; t1`` (CUDA: synchronized; ``prepare`` only for an op
    that has one, untimed); this rank's times, microseconds."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    local = []
    for _ in range(iters):
        _prepare(op, device)
        t0 = time.perf_counter()
        op()
        if cuda:
            torch.cuda.synchronize(device)
        local.append((time.perf_counter() - t0) * 1e6)
    return local


def _max_over_ranks(local: list[float], device: Any) -> list[float]:
    """Per entry, the max over ranks (every rank passes as many)."""
    import torch
    import torch.distributed as dist

    if not local:
        return []
    times = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return [float(v) for v in times.cpu().tolist()]


def _timed(op: Callable[[], object], iters: int, device: Any) -> list[float]:
    """``iters`` timed iterations after one barrier, back to back (module docstring); per iteration the max over
    ranks of ``t1 - t0``, microseconds."""
    import torch.distributed as dist

    dist.barrier()
    return _max_over_ranks(_timed_calls(op, iters, device), device)


def _iterations(op: Callable[[], object], args: argparse.Namespace, device: Any) -> tuple[int, float]:
    """Warm up, then the timed iteration count every rank agrees on (from the slowest warm-up iteration) and
    that iteration's time (microseconds)."""
    warm = max(_timed(op, max(1, args.warmup), device))
    per_iter_s = max(warm * 1e-6, 1e-6)
    return int(min(args.max_iters, max(args.min_iters, args.budget_s // per_iter_s))), warm


def _beside_compute(op: Callable[[], object], pairs: int, device: Any) -> tuple[list[float], list[float]]:
    """``pairs`` x (a call right after a call on an idle core, a call right after that while a thread of this rank
    computes a matmul loop, on every rank): per pair the max over ranks of each call's time, microseconds (module
    docstring, step 4). Both follow a call (a drained link), so only the computing thread differs."""
    import threading

    import torch

    a, b = torch.randn(192, 192), torch.randn(192, 192)
    busy, stop = threading.Event(), threading.Event()

    def burner() -> None:  # torch.mm releases the GIL: it competes for the core, not for the interpreter
        while not stop.is_set():
            if busy.is_set():
                torch.mm(a, b)
            else:
                busy.wait(0.01)

    thread = threading.Thread(target=burner, name="nbox-calibrate-burner", daemon=True)
    thread.start()
    idle, loaded = [], []
    try:
        for _ in range(pairs):
            _prepare(op, device)
            op()  # drains the link
            idle += _timed_calls(op, 1, device)
            busy.set()
            loaded += _timed_calls(op, 1, device)
            busy.clear()
    finally:
        stop.set()
        busy.set()
        thread.join()
    times = _max_over_ranks(idle + loaded, device)
    return times[:pairs], times[pairs:]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="emulator_core.calibration._worker")
    ap.add_argument("--out", type=Path, required=True, help="Folder for result.json / error-rank<R>.json.")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), required=True,
                    help="auto: nccl with CUDA, else gloo")
    ap.add_argument("--collectives", required=True, help="Comma list.")
    ap.add_argument("--sizes", required=True, help="Comma list of bytes.")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="Interleaved rounds over all points.")
    ap.add_argument("--min-iters", type=int, default=7)
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=0.3, help="Timed seconds per point (about).")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="Process-group timeout per collective.")
    ap.add_argument("--busy", action="store_true", help="Also time calls beside a computing thread (CPU ranks).")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run this rank; 0 on success, 1 after writing ``error-rank<R>.json``."""
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    where: dict[str, Any] = {"collective": None, "nbytes": None, "phase": "init_process_group"}
    try:
        warnings.filterwarnings("ignore", category=FutureWarning)
        import torch
        import torch.distributed as dist

        if args.backend == "auto":  # decided here, where torch is loaded anyway (nbox calibrate's process is not)
            args.backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout_s))
        world = dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        writer = local == 0  # one per node: each node's nbox calibrate reads its own folder
        device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        sizes = [int(s) for s in args.sizes.split(",") if s]
        points = [(c, n) for c in args.collectives.split(",") if c for n in ([0] if c == "barrier" else sizes)]
        counts: dict[tuple[str, int], int] = {}
        warm_us: dict[tuple[str, int], float] = {}
        samples: dict[tuple[str, int], list[list[float]]] = {pt: [] for pt in points}
        rounds = max(1, args.rounds)
        for r in range(-1, rounds):  # round -1: warm-up and iteration counts
            for coll, nbytes in points:
                where = {"collective": coll, "nbytes": nbytes, "phase": "warm-up" if r < 0 else f"round {r}"}
                if writer:
                    _write_json(args.out / PROGRESS, {**where, "rank": rank, "time": time.time()})
                op = _make_op(coll, element_count(coll, nbytes, world), dist.get_rank(), world, device)
                if r < 0:
                    counts[(coll, nbytes)], warm_us[(coll, nbytes)] = _iterations(op, args, device)
                else:
                    _timed(op, 1, device)
                    samples[(coll, nbytes)].append(_timed(op, -(-counts[(coll, nbytes)] // rounds), device))
                del op
        results = []
        for coll, nbytes in points:
            times = [t for rnd in samples[(coll, nbytes)] for t in rnd]
            results.append({"collective": coll, "requested_bytes": nbytes,
                            "nbytes": element_count(coll, nbytes, world) * 4,
                            "ranks": 2 if coll == "send_recv" else world, "iterations": len(times),
                            "median_us": percentile(times, 0.5), "p10_us": percentile(times, 0.1),
                            "p90_us": percentile(times, 0.9), "min_us": min(times), "max_us": max(times),
                            "rounds_us": samples[(coll, nbytes)]})
        beside: list[dict[str, Any]] = []
        if args.busy and device.type == "cpu":
            for coll in BUSY_COLLECTIVES:
                coll_sizes = [n for c, n in points if c == coll]
                if not coll_sizes:
                    continue
                fit_in = [n for n in coll_sizes if warm_us[(coll, n)] <= BUSY_CALL_MAX_US]
                nbytes = max(fit_in) if fit_in else min(coll_sizes)
                where = {"collective": coll, "nbytes": nbytes, "phase": "beside compute"}
                if writer:
                    _write_json(args.out / PROGRESS, {**where, "rank": rank, "time": time.time()})
                pair_s = 3 * warm_us[(coll, nbytes)] * 1e-6
                pairs = int(min(args.max_iters, max(BUSY_MIN_PAIRS, args.min_iters, args.budget_s // pair_s)))
                elems = element_count(coll, nbytes, world)
                op = _make_op(coll, elems, dist.get_rank(), world, device)
                idle, loaded = _beside_compute(op, pairs, device)
                del op
                beside.append({"collective": coll, "nbytes": elems * 4, "idle_us": idle, "busy_us": loaded})
        where = {"collective": None, "nbytes": None, "phase": "destroy_process_group"}
        dist.barrier()
        if writer:
            _write_json(args.out / RESULT, {
                "schema": SCHEMA, "backend": args.backend, "world_size": world, "torch": torch.__version__,
                "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1),
                "hostname": socket.gethostname(), "machine": platform.machine(), "processor": platform.processor(),
                "cpu_count": os.cpu_count(), "python": platform.python_version(),
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "results": results, **({"beside_compute": beside} if beside else {})})
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # report, then exit non-zero: the launcher stops the other ranks
        with contextlib.suppress(OSError):
            _write_json(error_file(args.out, rank), {**where, "rank": rank, "type": type(exc).__name__,
                                                      "message": str(exc)[:2000],
                                                      "time_us": time.time() * 1e6})
        if isinstance(exc, KeyboardInterrupt):
            raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
