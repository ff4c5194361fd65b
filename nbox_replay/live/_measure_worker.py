"""Measures compute nodes for ``--compute live --clock virtual`` (:mod:`nbox_replay.live.measure`).

``python -m nbox_replay.live._measure_worker CONFIG.json``, one process: for each rank in turn, its compute nodes
run live (:mod:`nbox_replay.live.ops`) in node order, with no communication, ``warmup`` untimed passes then
``iterations`` timed ones; each node's duration is the median of its timed passes (microseconds; on CUDA the
device is synchronized around each node). Writes ``{"ranks": {rank: {"duration_us": [per position: the
median, or null when not compute or a fallback], "fallbacks": {op: nodes}}}, "heap_not_held": why or null}``
to ``config.result`` (its heap held first, :mod:`nbox_replay.live.allocator`, and why not where it could not);
on an exception writes ``error.json`` beside it and exits with code 1.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from nbox_replay.inputs import COMPUTE, load_rank
from nbox_replay.live.allocator import hold_heap
from nbox_replay.live.ops import prepare
from nbox_replay.live.workerconfig import MeasureConfig


def measure_rank(path: str, rank: int, device: str, warmup: int, iterations: int) -> dict[str, Any]:
    """One rank's measured compute durations (module docstring)."""
    g = load_rank(path, rank, keep_nodes=True)
    ops = prepare(g, device)
    cuda = device.startswith("cuda")
    positions = [i for i in range(len(g)) if g.kind[i] == COMPUTE]
    times: dict[int, list[float]] = {i: [] for i in positions}
    for rep in range(warmup + iterations):
        for i in positions:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            ran = ops.run(i)
            if cuda:
                torch.cuda.synchronize()
            if ran and rep >= warmup:
                times[i].append((time.perf_counter_ns() - t0) / 1000.0)
    durations: list[float | None] = [None] * len(g)
    for i, ts in times.items():
        if ts and ops.runnables[i] is not None:  # a node that fell back in any pass keeps its recorded time
            durations[i] = statistics.median(ts)
    return {"duration_us": durations, "fallbacks": dict(ops.fallbacks)}


def main(argv: list[str]) -> int:
    cfg = MeasureConfig.read(argv[1])
    out = Path(cfg.result)
    rank = None
    heap = hold_heap()  # as the live worker does (allocator.py): the operators' own time, without extra faults
    try:
        if os.environ.get("OMP_NUM_THREADS") == "1":
            torch.set_num_threads(1)
        result: dict[str, Any] = {}
        for rank in cfg.ranks:
            result[str(rank)] = measure_rank(cfg.traces[rank], rank, cfg.device, cfg.warmup, cfg.iterations)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ranks": result, "heap_not_held": heap or None}))
        tmp.replace(out)
    except BaseException as err:  # the parent words the error from this file
        (out.parent / "error.json").write_text(json.dumps({
            "rank": rank, "type": type(err).__name__, "message": str(err)[:2000],
            "traceback": traceback.format_exc()[-4000:]}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
