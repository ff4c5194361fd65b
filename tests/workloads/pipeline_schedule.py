"""Issue 16 workload: a ``torch.distributed.pipelining`` schedule (GPipe or 1F1B) across two stages, with
data-parallel replicas of the pipeline. Plain torchrun script (gloo, CPU); the world size must be even.

Ranks ``2k`` and ``2k+1`` form pipeline ``k`` (stage ``rank % 2``); the ranks of one stage form its
data-parallel group, over which the stage's gradients are averaged (``all_reduce``) before each optimizer
step. The stages learn their shapes at the first step (``PipelineStage`` without ``input_args``): they
exchange pickled metadata (``send_object_list``/``recv_object_list``) and a warm-up vote (``send``/``recv``).

    torchrun --nproc-per-node 2 tests/workloads/pipeline_schedule.py [--schedule gpipe|1f1b] [--steps N]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

DIM, HIDDEN, BATCH, MICRO = 8, 16, 8, 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % 2:
        raise SystemExit(f"pipeline_schedule needs an even world size, got {world}")
    pipes = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)]  # every rank creates every group
    stages = [dist.new_group(list(range(s, world, 2))) for s in (0, 1)]
    stage_index, pipe, dp = rank % 2, pipes[rank // 2], stages[rank % 2]
    torch.manual_seed(stage_index)
    module = (nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh()) if stage_index == 0
              else nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)))
    stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), group=pipe)
    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=MICRO, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank // 2)
    for _ in range(args.steps):
        x, y = torch.randn(BATCH, DIM, generator=gen), torch.randn(BATCH, 1, generator=gen)
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        for param in module.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad, group=dp)
            param.grad /= world // 2
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
