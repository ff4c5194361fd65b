"""Issue 16 workload: FSDP2 (``fully_shard``) with mixed precision (bf16 parameters, fp32 gradient reduction)
and activation checkpointing of each block. Plain torchrun script (gloo, CPU): per optimizer step, per block an
all-gather in forward, again in the recomputed forward of backward (unless kept), and a reduce-scatter.

    torchrun --nproc-per-node 2 tests/workloads/fsdp2_mixed_ckpt.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + checkpoint(self.ff, x, use_reentrant=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(3)], nn.Linear(64, 8))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model[:3]:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        x, y = torch.randn(8, 64, generator=gen), torch.randn(8, 8, generator=gen)
        nn.functional.mse_loss(model(x).float(), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
