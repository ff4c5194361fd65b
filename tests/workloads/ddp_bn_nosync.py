"""Issue 16 workload: a small CNN with BatchNorm under DDP, gradient accumulation with ``no_sync()`` and a
``dist.broadcast`` of the learning rate every step. Plain torchrun script (gloo, CPU).

Per optimizer step, each rank issues (DDP, ``broadcast_buffers=True``) one buffer broadcast per forward,
i.e. 2 (the accumulation step under ``no_sync()`` and the sync step), the reducer's gradient all-reduce(s)
only on the sync step's backward, and one user ``broadcast`` of the learning rate. Several issue paths
(DDP's reducer hook, its buffer broadcast, the user's call) interleave: the case that made the collective
log and the host ET diverge when they were joined by position.

    torchrun --nproc-per-node 2 tests/workloads/ddp_bn_nosync.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 2  # micro-batches per optimizer step


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    with warnings.catch_warnings():  # torch 2.13 deprecates the name, not the behaviour
        warnings.simplefilter("ignore", FutureWarning)
        net = DDP(model(), broadcast_buffers=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    lr = torch.zeros(1)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        for micro in range(ACCUM):
            x = torch.randn(4, 3, 8, 8, generator=gen)
            y = torch.randint(0, 10, (4,), generator=gen)
            if micro < ACCUM - 1:
                with net.no_sync():
                    nn.functional.cross_entropy(net(x), y).backward()
            else:
                nn.functional.cross_entropy(net(x), y).backward()
        if rank == 0:
            lr.fill_(0.1 * (0.99 ** step))
        dist.broadcast(lr, src=0)
        for group in opt.param_groups:
            group["lr"] = float(lr.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
