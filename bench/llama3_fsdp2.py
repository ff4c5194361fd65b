"""A Llama-3-8B-architecture model trained with FSDP2, in plain torch: the GPU kit's large job (issue 49).

    nbox emulate --world-size 8 -n 1 --what-if dgx-h100 -- bench/llama3_fsdp2.py            # one GPU plays 8
    python -m torch.distributed.run --nproc-per-node 8 bench/llama3_fsdp2.py                 # the real job
    nbox emulate --world-size 2 -n 1 -- bench/llama3_fsdp2.py --config tiny --steps 6        # CPU, seconds

The model is built from Llama 3 8B's published configuration (Meta's model card and params.json: dim 4096, 32
layers, 32 attention heads, 8 key/value heads, feed-forward 14336, vocabulary 128256, RMSNorm eps 1e-5, RoPE theta
500000, untied output) and trained as TorchTitan's 8-GPU row T1a was (bench/data/torchtitan_t1a.json): FSDP2 with
``fully_shard`` on every transformer block and on the whole model, bf16 parameters and fp32 gradient reduction
(``MixedPrecisionPolicy``), the last block not resharded after forward, AdamW (lr 3e-4), gradients clipped at norm
1.0, sequence 8192, local batch 2, no compile, and per-op selective activation checkpointing (``--ac op``, the
default): each block is checkpointed with a policy that keeps the outputs of attention and of every other matrix
multiply and recomputes the rest (the policy TorchTitan calls op-level SAC); ``--ac full`` recomputes whole
blocks, ``--ac none`` keeps everything. Attention is ``scaled_dot_product_attention`` (causal) after the key/value
heads are repeated to the query heads. Parameters are made on the meta device, sharded, then materialized and
initialized (normal, std 0.02), so no rank ever holds the whole model.

``--parallel ddp`` trains the same model whole on every rank under DDP (bf16 autocast) instead: with
``--config small`` it is the kit's GPU-bound DDP job. ``--report PATH`` writes rank 0's own iteration times (the
device synchronized at each step), the same clock for a plain run and an emulated one.

The data is random token ids (the iteration time does not depend on them). tokens/s per GPU, as TorchTitan counts
it, is ``batch x seq`` over the iteration time (``bench/gpu_check.py --hold`` computes it from ``nbox emulate``'s
iteration time). Backend: whatever ``nbox emulate`` redirects; on its own, nccl on CUDA and gloo on CPU. Prints
nothing per step. Imports nothing from nbox.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


@dataclass(frozen=True)
class Config:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5


CONFIGS = {
    "8b": Config(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256),
    "small": Config(dim=1024, layers=8, heads=16, kv_heads=4, ffn=3584, vocab=32000),
    "tiny": Config(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, seq: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE's rotation angles, (seq, head_dim / 2)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of ``x`` (batch, seq, heads, head_dim) by the angles (Llama's interleaved layout)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.dim // cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = apply_rope(self.wq(x).view(b, s, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(b, s, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        rep = self.heads // self.kv_heads  # grouped-query attention: each key/value head serves `rep` query heads
        k, v = (t.repeat_interleave(rep, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


#: Ops whose outputs per-op selective checkpointing keeps (every other matrix multiply, attention; the rest is
#: recomputed in backward).
_SAVED = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
          torch.ops.aten._scaled_dot_product_efficient_attention.default,
          torch.ops.aten._scaled_dot_product_cudnn_attention.default,
          torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def _sac_contexts() -> Any:
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    def __init__(self, cfg: Config, ac: str) -> None:
        super().__init__()
        self.ac = ac
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.ac == "none" or not torch.is_grad_enabled():
            return self._forward(x, cos, sin)
        extra: dict[str, Any] = {"context_fn": _sac_contexts} if self.ac == "op" else {}
        out: torch.Tensor = checkpoint(self._forward, x, cos, sin, use_reentrant=False, preserve_rng_state=False,
                                       **extra)
        return out


class Llama(nn.Module):
    def __init__(self, cfg: Config, seq: int, ac: str) -> None:
        super().__init__()
        self.cfg, self.seq = cfg, seq
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, ac) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.register_buffer("cos", torch.empty(seq, cfg.dim // cfg.heads // 2), persistent=False)
        self.register_buffer("sin", torch.empty(seq, cfg.dim // cfg.heads // 2), persistent=False)

    def init_weights(self) -> None:
        """After ``to_empty``: RoPE's tables, norms at 1, every other weight normal (std 0.02)."""
        cos, sin = rope_tables(self.cfg.dim // self.cfg.heads, self.seq, self.cfg.rope_theta, self.cos.device)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        out: torch.Tensor = self.output(self.norm(h))
        return out


def build(cfg: Config, seq: int, ac: str, device: torch.device, param_dtype: torch.dtype) -> Llama:
    """The model made on the meta device, sharded as TorchTitan shards it, then materialized on ``device``."""
    with torch.device("meta"):
        model = Llama(cfg, seq, ac)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for i, layer in enumerate(model.layers):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=device)
    model.init_weights()
    return model


def build_ddp(cfg: Config, seq: int, ac: str, device: torch.device) -> nn.Module:
    """The model made whole on ``device`` (fp32 weights, bf16 autocast in the step) and wrapped in DDP."""
    from torch.nn.parallel import DistributedDataParallel

    model = Llama(cfg, seq, ac).to(device)
    model.init_weights()
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def write_report(path: str, times_us: list[float]) -> None:
    """This rank's iteration times so far (JSON, replaced whole at each step: the run may be stopped any time)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"iteration_us": times_us}, f)
    os.replace(tmp, path)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="8b", help="model size (default 8b)")
    ap.add_argument("--layers", type=int, default=None, help="override the configuration's layer count")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 8192; tiny: 32)")
    ap.add_argument("--batch-size", type=int, default=2, help="sequences per rank and step (default 2)")
    ap.add_argument("--ac", choices=("op", "full", "none"), default="op",
                    help="activation checkpointing: per-op selective (default), full, none")
    ap.add_argument("--param-dtype", choices=("bf16", "fp32"), default="bf16", help="FSDP2's compute dtype")
    ap.add_argument("--steps", type=int, default=20, help="training iterations (default 20)")
    ap.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp",
                    help="FSDP2 as TorchTitan (default), or DDP with bf16 autocast (the kit's zero-cost check)")
    ap.add_argument("--report", default=None, metavar="PATH",
                    help="write rank 0's iteration times (us, device synchronized at each step) to PATH as JSON")
    args = ap.parse_args(argv)
    cfg = CONFIGS[args.config]
    if args.layers is not None:
        cfg = replace(cfg, layers=args.layers)
    seq = args.seq_len or (8192 if args.config == "8b" else 32)

    dist.init_process_group(backend=default_backend())
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    model = build(cfg, seq, args.ac, device, dtype) if args.parallel == "fsdp" else build_ddp(cfg, seq, args.ac, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    gen = torch.Generator(device="cpu").manual_seed(1000 + dist.get_rank())
    cast = torch.autocast(device.type, dtype=dtype, enabled=args.parallel == "ddp" and dtype != torch.float32)
    times_us: list[float] = []
    for _ in range(args.steps):
        t0 = _now_us(device)
        tokens = torch.randint(0, cfg.vocab, (args.batch_size, seq + 1), generator=gen).to(device)
        with cast:
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
        del logits, loss
        if args.report and dist.get_rank() == 0:
            times_us.append(_now_us(device) - t0)
            write_report(args.report, times_us)
    dist.destroy_process_group()


def _now_us(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e6


if __name__ == "__main__":
    main()
