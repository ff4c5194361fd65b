"""Tensor parallel x data parallel on a 2-D device mesh: MLP blocks split over ``tp``, gradients averaged over ``dp``.

    python -m torch.distributed.run --nproc-per-node 4 tp_dp_mlp.py --steps 20     # dp=2 x tp=2

The mesh is built from the world size the script sees: ``tp`` = ``--tp`` (default 2), ``dp`` = world / tp,
with ``init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))``, so its process groups carry the
descriptions ``mesh_dp`` and ``mesh_tp``. Model: an input projection, ``BLOCKS`` residual MLP blocks and a
head. Each block's ``fc1`` is ``ColwiseParallel`` and ``fc2`` ``RowwiseParallel`` on the ``tp`` dimension
(DTensor ``parallelize_module``): per block and iteration one all-reduce of the activations in forward (fc2's
partial sums) and one of their gradients in backward (fc1's input), on the tp group. The input projection and
head are replicated. Data parallelism is a manual gradient all-reduce on the ``dp`` group (every rank's local
gradients flattened into one bucket, summed and divided by dp, as DDP does with one bucket); the ranks of one
tp group read the same data. Backend: ``NBOX_BACKEND`` or ``gloo`` (``cpu:gloo,cuda:nccl`` when CUDA is
available). Prints nothing per step. Imports nothing from nbox.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

IN_DIM = 128
DIM = 256
HIDDEN = 1024
OUT_DIM = 64
BLOCKS = 2
BATCH = 32
TP = 2
MODEL_SEED = 0
DATA_SEED = 1000


class Block(nn.Module):
    """x + fc2(relu(fc1(x))): under tensor parallelism fc1 is split by columns, fc2 by rows."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(torch.relu(self.fc1(x)))
        return out


class Mlp(nn.Module):
    def __init__(self, in_dim: int = IN_DIM, dim: int = DIM, hidden: int = HIDDEN, out_dim: int = OUT_DIM,
                 blocks: int = BLOCKS) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(blocks))
        self.head = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def build_model(hidden: int = HIDDEN) -> Mlp:
    """The unsplit model (the same on every rank: seed before calling)."""
    return Mlp(hidden=hidden)


def parallelize(model: Mlp, tp_mesh: DeviceMesh) -> None:
    """Each block's fc1 column-wise and fc2 row-wise on ``tp_mesh`` (input and output replicated)."""
    for block in model.blocks:
        parallelize_module(block, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def average_gradients(model: nn.Module, dp_group: dist.ProcessGroup, dp: int) -> None:
    """One all-reduce of every local gradient (flattened into one bucket) on the dp group, then / dp."""
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    if dp == 1 or not grads:
        return
    bucket = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(bucket, group=dp_group)
    bucket /= dp
    offset = 0
    for g in grads:
        g.copy_(bucket[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def default_backend() -> str:
    """``NBOX_BACKEND`` (``auto``, as ``nbox record --backend auto`` sets it: nccl where CUDA is available, else
    gloo), or without it gloo, ``cpu:gloo,cuda:nccl`` where CUDA is available."""
    chosen = os.environ.get("NBOX_BACKEND")
    if chosen == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return chosen or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20, help="training iterations (default 20)")
    parser.add_argument("--tp", type=int, default=TP, help=f"tensor-parallel degree (default {TP}); dp = world / tp")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    args = parser.parse_args(argv)

    dist.init_process_group(backend=default_backend())
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tp < 1 or world % args.tp:
        raise SystemExit(f"tp_dp_mlp: --tp {args.tp} does not divide the world size {world}")
    dp = world // args.tp
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(MODEL_SEED)
    model = build_model(hidden=args.hidden).to(device)
    parallelize(model, mesh["tp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    generator = torch.Generator().manual_seed(DATA_SEED + mesh.get_local_rank("dp"))
    batches = [
        (torch.randn(args.batch_size, IN_DIM, generator=generator).to(device),
         torch.randn(args.batch_size, OUT_DIM, generator=generator).to(device))
        for _ in range(4)
    ]
    dp_group = mesh.get_group("dp")
    times_us: list[float] = []
    t_prev = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        average_gradients(model, dp_group, dp)
        optimizer.step()
        now = time.perf_counter()
        if t_prev is not None:
            times_us.append((now - t_prev) * 1e6)
        t_prev = now

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
