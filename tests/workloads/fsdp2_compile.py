"""Issue 16 workload: a ``torch.compile``d model sharded with FSDP2 (``fully_shard``), gloo, CPU. Plain
torchrun script.

Each block and the root are ``fully_shard``ed, then the model is compiled: FSDP2's hooks all-gather the
parameters before each block's forward and backward and reduce-scatter the gradients after its backward.

    torchrun --nproc-per-node 2 tests/workloads/fsdp2_compile.py [--steps N]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

DIM = 16


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()) for _ in range(2)), nn.Linear(DIM, 1))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    fwd = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        fwd(torch.randn(8, DIM, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
