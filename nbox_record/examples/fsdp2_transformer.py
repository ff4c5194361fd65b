"""FSDP2 (``torch.distributed.fsdp.fully_shard``) over two transformer blocks. A plain torchrun script.

    python -m torch.distributed.run --nproc-per-node 2 fsdp2_transformer.py --steps 20

Each block is its own FSDP group and the root (final layer norm + head) another, so every iteration
all-gathers parameters (forward, and again in backward: blocks reshard after forward) and
reduce-scatters gradients. Backend: ``NBOX_BACKEND`` or ``gloo`` (``cpu:gloo,cuda:nccl`` when CUDA is
available). Prints nothing per step. Imports nothing from nbox.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

DIM = 128
HEADS = 4
SEQ = 64
BATCH = 8
LAYERS = 2
MODEL_SEED = 0
DATA_SEED = 1000


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int = DIM, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out


class TinyTransformer(nn.Module):
    """``layers`` blocks, then a layer norm and a linear head (the root's own parameters).

    Returns ``(batch * seq, dim)``: the head runs on a flattened 2-D input, so the root's output is not
    a view (FSDP2 warns about views returned by a wrapped module).
    """

    def __init__(self, dim: int = DIM, heads: int = HEADS, layers: int = LAYERS) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x).flatten(0, 1))
        return out


def build_model(dim: int = DIM, heads: int = HEADS, layers: int = LAYERS) -> TinyTransformer:
    """The unsharded model (the same on every rank: seed before calling)."""
    return TinyTransformer(dim, heads, layers)


def shard(model: TinyTransformer) -> None:
    """FSDP2 groups: one per block, then the root (norm + head)."""
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


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
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON (bench/record_overhead.py uses it)")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--seq-len", type=int, default=SEQ)
    args = parser.parse_args(argv)

    dist.init_process_group(backend=default_backend())
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(MODEL_SEED)
    model = build_model().to(device)
    shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [
        (torch.randn(args.batch_size, args.seq_len, DIM, generator=generator).to(device),
         torch.randn(args.batch_size * args.seq_len, DIM, generator=generator).to(device))
        for _ in range(4)
    ]
    times_us: list[float] = []
    t_prev = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
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
