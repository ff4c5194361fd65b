"""Issue 48 workload: a tiny GPT-2-shaped decoder (plain torch: token and position embeddings, pre-norm blocks of
causal attention and a tanh-GELU MLP, a final LayerNorm, an LM head tied to the token embedding, cross-entropy)
under DDP (or FSDP2 with ``--fsdp``: each block and the whole model sharded, the parameters DTensors) with
``torch.optim.AdamW``. The structure of ``transformers``' GPT2LMHeadModel without the dependency:
its backward has the ``evaluate_function`` nodes with no operator of their own (``AddBackward0``,
``ExpandBackward0``, ...) that live replay plays as fallbacks, and its optimizer the ``sqrt`` of Adam's second
moments with Python numbers recorded as 0-dimensional tensors (``beta2``, the bias correction, ``eps``).

    torchrun --nproc-per-node 2 tests/workloads/ddp_gpt_adamw.py [--steps N] [--fsdp]
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 512, 64, 4, 2, 32, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, dim=-1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))
        h = self.fc(self.ln2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        out: torch.Tensor = x + self.out(h)
        return out


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied to the token embedding, as GPT-2's LM head
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net: nn.Module = Decoder()
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in net.blocks:  # type: ignore[union-attr]
            fully_shard(block)
        fully_shard(net)
    else:
        net = DDP(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1 + dist.get_rank()))
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        net(ids).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
