"""Issue 16 workload: DTensor tensor parallel on a 1-D mesh of every rank: a feed-forward block with
``ColwiseParallel`` / ``RowwiseParallel`` and its LayerNorm under ``SequenceParallel`` (activations sharded on the
sequence dimension between blocks: all-gather in, reduce-scatter out, through functional collectives and
``wait_tensor``). Plain torchrun script (gloo, CPU).

    torchrun --nproc-per-node 2 tests/workloads/tp_sequence_parallel.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    block = Block(64)
    parallelize_module(block, mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    })
    opt = torch.optim.SGD(block.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7)  # every TP rank sees the same batch
    for _ in range(args.steps):
        x = torch.randn(4, 16, 64, generator=gen)
        out = block(x)
        out.pow(2).mean().backward()  # the output is a plain tensor, sharded on the sequence (use_local_output)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
