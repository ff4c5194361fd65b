"""Issue 16 workload: a 2-D device mesh (dp x tp): DTensor tensor parallel (``ColwiseParallel`` /
``RowwiseParallel``) on the ``tp`` dimension and FSDP2 (``fully_shard``) on the ``dp`` dimension, so the
tensor-parallel all-reduce runs on the tp groups (functional collectives and ``wait_tensor``) and the FSDP2
all-gathers and reduce-scatters on the dp groups. Plain torchrun script (gloo, CPU), 4 ranks = 2 x 2.

    torchrun --nproc-per-node 4 tests/workloads/tp_fsdp_2d.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class FeedForward(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % 2:
        raise SystemExit(f"tp_fsdp_2d.py needs an even world size (dp x tp with tp = 2), got {world}")
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(FeedForward(32), FeedForward(32))
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + mesh["dp"].get_local_rank())  # tp peers see the same batch
    for _ in range(args.steps):
        x = torch.randn(8, 32, generator=gen)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
