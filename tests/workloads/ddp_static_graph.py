"""Issue 16 workload: DDP with ``static_graph=True`` and ``gradient_as_bucket_view=True`` (an MLP, 3 buckets).
Plain torchrun script (gloo, CPU): per optimizer step, the reducer's bucket all-reduces only.

    torchrun --nproc-per-node 2 tests/workloads/ddp_static_graph.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    net = DDP(model, static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
