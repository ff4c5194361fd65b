"""Issue 16 workload: a mixture-of-experts layer (one expert per rank) whose tokens are routed with uneven
``all_to_all_single`` splits (functional collectives with autograd; the counts are exchanged first by an even
``all_to_all_single``), plus a ``batch_isend_irecv`` ring exchange of a halo tensor. Plain torchrun script (gloo,
CPU). Per optimizer step: 2 all-to-alls forward (counts, tokens), 1 back (combine), their backward, the P2P
exchange, and the gradient all-reduce of the gate.

    torchrun --nproc-per-node 2 tests/workloads/moe_alltoall.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    gate = nn.Linear(32, world)
    expert = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    shared = list(gate.parameters())
    opt = torch.optim.SGD(list(gate.parameters()) + list(expert.parameters()), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(args.steps):
        x = torch.randn(24 + 8 * rank, 32, generator=gen)  # uneven token counts per rank
        dest = gate(x).argmax(dim=1)
        order = torch.argsort(dest)
        send_counts = torch.bincount(dest, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        group = dist.group.WORLD
        tokens = all_to_all_single_autograd(x[order], recv_counts.tolist(), send_counts.tolist(), group)
        back = all_to_all_single_autograd(expert(tokens), send_counts.tolist(), recv_counts.tolist(), group)
        loss = back.pow(2).mean() + gate(x).mean()
        loss.backward()
        halo_out, halo_in = torch.randn(16, generator=gen), torch.empty(16)
        ops = [dist.P2POp(dist.isend, halo_out, (rank + 1) % world),
               dist.P2POp(dist.irecv, halo_in, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        for prm in shared:
            if prm.grad is not None:
                dist.all_reduce(prm.grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
