"""T5-base sequence-to-sequence training (random init, random token pairs). A plain torchrun script (no nbox import).

    python -m torch.distributed.run --nproc-per-node 2 t5.py --steps 20            # DDP
    python -m torch.distributed.run --nproc-per-node 2 t5.py --steps 20 --fsdp     # FSDP2

The model is ``transformers.T5ForConditionalGeneration`` built from a ``T5Config`` when transformers is
importable, else the same architecture written here in plain torch: an encoder and a decoder of pre-norm blocks
with RMS layer norms, no biases, ReLU feed-forward, relative position bias (32 log-spaced buckets, computed in each
stack's first block and shared by the rest; bidirectional in the encoder, causal in the decoder), cross-attention in
every decoder block, the token embedding shared by both stacks and tied to the LM head (same modules, names and
parameter count). Nothing is downloaded. Every rank builds the model from the same seed and draws its own source
and target sequences; the decoder reads the target shifted right. ``--fsdp`` shards every encoder and decoder
block, then the root (the shared embedding), with ``fully_shard``. Backend: ``NBOX_BACKEND`` or gloo
(``cpu:gloo,cuda:nccl`` when CUDA is available). Prints nothing per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB = 32128
BUCKETS, MAX_DISTANCE = 32, 128
MODEL_SEED = 0
DATA_SEED = 1000
INSTALL = "pip install 'transformers>=4.40' (or nbox's extra: pip install -e '.[models]')"


def have_transformers() -> bool:
    """Whether ``transformers`` (with its T5) imports here."""
    try:
        from transformers import T5Config, T5ForConditionalGeneration  # noqa: F401
    except Exception:  # ImportError, or a broken install: the plain-torch model is used
        return False
    return True


# --------------------------------------------------------------------------------------------- plain-torch T5

def relative_bucket(rel: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    """T5's bucket of each relative position (key - query): exact below half the buckets, log-spaced up to
    ``MAX_DISTANCE``, split by sign when bidirectional."""
    buckets, out = BUCKETS, torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out = out + (rel > 0).long() * buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    exact = buckets // 2
    large = exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(MAX_DISTANCE / exact)
                     * (buckets - exact)).long()
    return out + torch.where(rel < exact, rel, large.clamp(max=buckets - 1))


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtraction, no bias."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype)
        return out


class T5Attention(nn.Module):
    """Multi-head attention without biases or 1/sqrt(d) scaling (T5 folds it into the initialisation); the first
    block of a stack owns the relative position bias table."""

    def __init__(self, d: int, heads: int, d_kv: int, bias_table: bool, causal: bool) -> None:
        super().__init__()
        self.heads, self.d_kv, self.causal = heads, d_kv, causal
        self.q, self.k, self.v = (nn.Linear(d, heads * d_kv, bias=False) for _ in range(3))
        self.o = nn.Linear(heads * d_kv, d, bias=False)
        self.relative_attention_bias = nn.Embedding(BUCKETS, heads) if bias_table else None

    def position_bias(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        assert self.relative_attention_bias is not None
        rel = torch.arange(k_len, device=device)[None, :] - torch.arange(q_len, device=device)[:, None]
        bias: torch.Tensor = self.relative_attention_bias(relative_bucket(rel, bidirectional=not self.causal))
        bias = bias.permute(2, 0, 1)[None]  # (1, heads, q, k)
        if self.causal:
            bias = bias.masked_fill(rel[None, None] > 0, float("-inf"))
        return bias

    def forward(self, x: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d_kv).transpose(1, 2)
        k, v = (t(kv).view(b, kv.shape[1], self.heads, self.d_kv).transpose(1, 2) for t in (self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1 if self.training else 0.0,
                                             scale=1.0)
        out_d: torch.Tensor = self.o(out.transpose(1, 2).reshape(b, s, self.heads * self.d_kv))
        return out_d


class _AttnLayer(nn.Module):
    def __init__(self, d: int, heads: int, d_kv: int, bias_table: bool, causal: bool, cross: bool) -> None:
        super().__init__()
        attn = T5Attention(d, heads, d_kv, bias_table, causal)
        if cross:
            self.EncDecAttention = attn
        else:
            self.SelfAttention = attn
        self.layer_norm, self.dropout = RMSNorm(d), nn.Dropout(0.1)


class _DenseReluDense(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.wi, self.wo, self.dropout = nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d, bias=False), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.wo(self.dropout(F.relu(self.wi(x))))
        return out


class _FFLayer(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.DenseReluDense, self.layer_norm, self.dropout = _DenseReluDense(d, ffn), RMSNorm(d), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.dropout(self.DenseReluDense(self.layer_norm(x)))
        return out


class T5Block(nn.Module):
    """Self-attention, (decoder only) cross-attention, feed-forward; each pre-norm with a residual."""

    def __init__(self, d: int, heads: int, d_kv: int, ffn: int, first: bool, decoder: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [_AttnLayer(d, heads, d_kv, first, causal=decoder, cross=False)]
        if decoder:
            layers.append(_AttnLayer(d, heads, d_kv, False, causal=False, cross=True))
        layers.append(_FFLayer(d, ffn))
        self.layer = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None,
                memory: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's output and the position bias (the first block computes it: the table is its own, so
        under FSDP2 it is gathered only inside this forward)."""
        sa: Any = self.layer[0]
        if bias is None:
            bias = sa.SelfAttention.position_bias(x.shape[1], x.shape[1], x.device)
        h = sa.layer_norm(x)
        x = x + sa.dropout(sa.SelfAttention(h, h, bias))
        if memory is not None:
            ca: Any = self.layer[1]
            x = x + ca.dropout(ca.EncDecAttention(ca.layer_norm(x), memory, None))
        out: torch.Tensor = self.layer[-1](x)
        return out, bias


class T5Stack(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, d_kv: int, ffn: int, decoder: bool) -> None:
        super().__init__()
        self.block = nn.ModuleList(T5Block(d, heads, d_kv, ffn, i == 0, decoder) for i in range(layers))
        self.final_layer_norm, self.dropout = RMSNorm(d), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None) -> torch.Tensor:
        bias = None
        x = self.dropout(x)
        for block in self.block:
            x, bias = block(x, bias, memory)
        out: torch.Tensor = self.dropout(self.final_layer_norm(x))
        return out


class PlainT5ForConditionalGeneration(nn.Module):
    """T5 in plain torch, named like ``transformers.T5ForConditionalGeneration`` (``shared``, ``encoder.block``,
    ``decoder.block``, ``lm_head`` tied to ``shared``); ``forward(input_ids, labels)`` returns the loss."""

    def __init__(self, layers: int, d: int, heads: int, d_kv: int, ffn: int) -> None:
        super().__init__()
        self.d = d
        self.shared = nn.Embedding(VOCAB, d)
        self.encoder = T5Stack(layers, d, heads, d_kv, ffn, decoder=False)
        self.decoder = T5Stack(layers, d, heads, d_kv, ffn, decoder=True)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.lm_head.weight = self.shared.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=m.weight.shape[-1] ** -0.5 if isinstance(m, nn.Linear) else 1.0)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.shared(input_ids), None)
        start = torch.zeros_like(labels[:, :1])  # decoder_start_token_id = pad = 0
        hidden = self.decoder(self.shared(torch.cat([start, labels[:, :-1]], 1)), memory)
        logits = self.lm_head(hidden * self.d ** -0.5)  # tied embeddings: rescaled, as T5 does
        return F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))


# ------------------------------------------------------------------------------------------------ the model

def build_model(layers: int = 12, d_model: int = 768, heads: int = 12, d_kv: int = 64, ffn: int = 3072,
                plain: bool | None = None) -> nn.Module:
    """T5 for conditional generation (T5-base by default: the same number of encoder and decoder blocks),
    randomly initialised: ``transformers.T5ForConditionalGeneration`` when importable (``plain=None``) or asked
    (``plain=False``), else :class:`PlainT5ForConditionalGeneration`. Seed before calling."""
    if plain is None:
        plain = not have_transformers()
    if plain:
        return PlainT5ForConditionalGeneration(layers, d_model, heads, d_kv, ffn)
    from transformers import T5Config, T5ForConditionalGeneration

    # the generic config keys as a mapping: transformers 5 types T5Config's own arguments only
    generic: dict[str, Any] = {"tie_word_embeddings": True, "decoder_start_token_id": 0, "pad_token_id": 0}
    cfg = T5Config(vocab_size=VOCAB, d_model=d_model, d_kv=d_kv, d_ff=ffn, num_layers=layers,
                   num_decoder_layers=layers, num_heads=heads, relative_attention_num_buckets=BUCKETS,
                   relative_attention_max_distance=MAX_DISTANCE, feed_forward_proj="relu", **generic)
    model: nn.Module = T5ForConditionalGeneration(cfg)
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The encoder's and the decoder's blocks (each its own FSDP2 group under ``--fsdp``)."""
    return [*model.encoder.block, *model.decoder.block]  # type: ignore[union-attr, misc]


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sequence-to-sequence cross-entropy, for either implementation."""
    out: Any = model(**batch)
    loss: torch.Tensor = out if isinstance(out, torch.Tensor) else out.loss
    return loss


def make_batch(batch: int, src: int, tgt: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random source and target tokens (never the pad id 0)."""
    return {"input_ids": torch.randint(1, VOCAB, (batch, src), generator=generator),
            "labels": torch.randint(1, VOCAB, (batch, tgt), generator=generator)}


def thread_times_ns() -> tuple[int, int] | None:
    """This thread's (time on a CPU, time runnable waiting for one) in ns, read as nbox_trace/threadtime.py reads
    them (copied: the examples import torch only). A rank that waits for a CPU runs a slower iteration with the
    same work; on a shared machine that wait, not the model, is what makes one launch slower than another, and
    --report-times writes it beside the iteration times so a reader can tell the two apart."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            run_queue = f.read(256).split()[1]
        return time.thread_time_ns(), int(run_queue)
    except (OSError, ValueError, IndexError):
        return None


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
    parser.add_argument("--batch", type=int, default=2, help="sequence pairs per rank and step (default 2)")
    parser.add_argument("--src-len", type=int, default=128, help="source (encoder) tokens (default 128)")
    parser.add_argument("--tgt-len", type=int, default=32, help="target (decoder) tokens (default 32)")
    parser.add_argument("--layers", type=int, default=12, help="encoder blocks, and as many decoder blocks "
                                                               "(default 12: T5-base)")
    parser.add_argument("--d-model", type=int, default=768, help="model width (default 768)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    parser.add_argument("--d-kv", type=int, default=64, help="width of each head (default 64)")
    parser.add_argument("--ffn", type=int, default=3072, help="feed-forward size (default 3072)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per block) instead of DDP")
    parser.add_argument("--plain", action="store_true", help="use the plain-torch T5 even if transformers imports")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON, and each iteration's (on-CPU us, run-queue us) of the training "
                             "thread to PATH.rank<R>.split")
    args = parser.parse_args(argv)
    if min(args.batch, args.src_len, args.tgt_len, args.layers, args.d_model, args.heads, args.d_kv, args.ffn) < 1:
        parser.error("every size must be >= 1")

    dist.init_process_group(backend=default_backend())
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    plain = args.plain or not have_transformers()
    if rank == 0 and plain and not args.plain:
        print(f"t5: transformers not importable; using the shipped plain-torch T5 (same architecture). "
              f"For transformers' T5ForConditionalGeneration: {INSTALL}", file=sys.stderr, flush=True)

    torch.manual_seed(MODEL_SEED)
    model = build_model(args.layers, args.d_model, args.heads, args.d_kv, args.ffn, plain=plain).to(device)
    wrapped: nn.Module
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in blocks(model):
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [{k: v.to(device) for k, v in make_batch(args.batch, args.src_len, args.tgt_len, generator).items()}
               for _ in range(4)]
    times_us: list[float] = []
    split_us: list[tuple[float, float]] = []  # per iteration: the thread's time on a CPU, and waiting for one
    t_prev = None
    tt_prev = None
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(wrapped, batches[step % len(batches)])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        now = time.perf_counter()
        tt = thread_times_ns() if args.report_times else None
        if t_prev is not None:
            times_us.append((now - t_prev) * 1e6)
            if tt is not None and tt_prev is not None:
                split_us.append(((tt[0] - tt_prev[0]) / 1e3, (tt[1] - tt_prev[1]) / 1e3))
        t_prev, tt_prev = now, tt
    if args.steps and not math.isfinite(float(loss.detach())):
        raise FloatingPointError(f"t5: the loss is {float(loss.detach())}")

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
