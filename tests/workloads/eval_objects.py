"""Issue 16 workload: training with an evaluation under ``torch.inference_mode()`` and object collectives.
Plain torchrun script (gloo, CPU).

Each step: a DDP training step (one gradient all-reduce), then an evaluation under ``torch.inference_mode()``
whose summed loss and sample count are ``all_reduce``d, then ``all_gather_object`` of this rank's metrics
(a dict) and ``broadcast_object_list`` of rank 0's decision (a dict). Every rank checks what it received:
a failure raises, so a run that ends with exit 0 decoded every object.

    torchrun --nproc-per-node 2 tests/workloads/eval_objects.py [--steps N]
"""

from __future__ import annotations

import argparse
import math
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        net = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 1, generator=gen)
        nn.functional.mse_loss(net(x), y).backward()
        with torch.inference_mode():
            xe, ye = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
            stats = torch.stack([nn.functional.mse_loss(net.module(xe), ye, reduction="sum"), torch.tensor(16.0)])
            dist.all_reduce(stats)
            if not (math.isfinite(float(stats[0])) and float(stats[1]) == 16.0 * world):
                raise RuntimeError(f"eval all_reduce gave {stats.tolist()} in a world of {world}")
        metrics: list[object] = [None] * world
        dist.all_gather_object(metrics, {"rank": rank, "step": step, "eval_loss": float(stats[0] / stats[1])})
        if any(not isinstance(m, dict) or m["step"] != step for m in metrics):
            raise RuntimeError(f"all_gather_object gave {metrics!r}")
        decision: list[object] = [{"step": step, "lr": 0.05 * 0.9 ** step} if rank == 0 else None]
        dist.broadcast_object_list(decision, src=0)
        got = decision[0]
        if not isinstance(got, dict) or got["step"] != step:
            raise RuntimeError(f"broadcast_object_list gave {got!r}")
        for group in opt.param_groups:
            group["lr"] = float(got["lr"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
