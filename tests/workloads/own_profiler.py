"""Issue 16 workload: a DDP script that runs its own ``torch.profiler.profile(schedule=...)`` and calls
``prof.step()`` every iteration, as training scripts with built-in profiling do. Plain torchrun script (gloo, CPU).

    torchrun --nproc-per-node 2 tests/workloads/own_profiler.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(args.steps):
            x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen)
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
