"""Issue 16 workload: a ``torch.compile``d model under DDP (gloo, CPU). Plain torchrun script.

DDP wraps the model, then the DDP module is compiled (the pattern the PyTorch docs recommend):
Dynamo splits the graph at DDP's bucket boundaries (``DDPOptimizer``) and the reducer all-reduces the
gradients in backward as usual. The BatchNorm's buffers make DDP broadcast them at every forward, from
inside the compiled call.

    torchrun --nproc-per-node 2 tests/workloads/ddp_compile.py [--steps N]
"""

from __future__ import annotations

import argparse
import os

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
    torch.manual_seed(0)
    net = DDP(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)))
    fwd = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        loss = fwd(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
