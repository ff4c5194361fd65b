"""BERT-base masked language modelling (random init, random tokens). A plain torchrun script (no nbox import).

    python -m torch.distributed.run --nproc-per-node 2 bert.py --steps 20            # DDP
    python -m torch.distributed.run --nproc-per-node 2 bert.py --steps 20 --fsdp     # FSDP2

The model is ``transformers.BertForMaskedLM`` built from a ``BertConfig`` when transformers is importable, else
the same architecture written here in plain torch (the same modules, names and parameter count: embeddings, N
post-norm encoder layers, the MLM head tied to the word embeddings). Nothing is downloaded. Every rank builds the
model from the same seed and draws its own batches; 15% of the tokens are masked and predicted. ``--fsdp`` shards
every encoder layer, then the root (embeddings and head), with ``fully_shard``. Backend: ``NBOX_BACKEND`` or gloo
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

VOCAB = 30522
MAX_POSITIONS = 512
MODEL_SEED = 0
DATA_SEED = 1000
MASK_ID = 103
INSTALL = "pip install 'transformers>=4.40' (or nbox's extra: pip install -e '.[models]')"


def have_transformers() -> bool:
    """Whether ``transformers`` (with its BERT) imports here."""
    try:
        from transformers import BertConfig, BertForMaskedLM  # noqa: F401
    except Exception:  # ImportError, or a broken install: the plain-torch model is used
        return False
    return True


# ------------------------------------------------------------------------------------------- plain-torch BERT

class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(b, s, d)


class _DenseNorm(nn.Module):
    """``LayerNorm(dropout(dense(x)) + residual)``: BERT's post-norm output sublayer."""

    def __init__(self, d_in: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.dense, self.LayerNorm, self.dropout = nn.Linear(d_in, hidden), nn.LayerNorm(hidden, eps=1e-12), \
            nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.dropout(self.dense(x)) + residual)
        return out


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.self = _SelfAttention(hidden, heads, dropout)
        self.output = _DenseNorm(hidden, hidden, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.output(self.self(x, mask), x)
        return out


class _Intermediate(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.attention = _Attention(hidden, heads, dropout)
        self.intermediate = _Intermediate(hidden, ffn)
        self.output = _DenseNorm(ffn, hidden, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        out: torch.Tensor = self.output(self.intermediate(x), x)
        return out


class _Embeddings(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(MAX_POSITIONS, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.LayerNorm, self.dropout = nn.LayerNorm(hidden, eps=1e-12), nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings(torch.zeros_like(ids))
        out: torch.Tensor = self.dropout(self.LayerNorm(x))
        return out


class _Encoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, heads, ffn, dropout) for _ in range(layers))


class _Bert(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.embeddings = _Embeddings(hidden, dropout)
        self.encoder = _Encoder(layers, hidden, heads, ffn, dropout)


class _Transform(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(F.gelu(self.dense(x)))
        return out


class _Predictions(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.transform = _Transform(hidden)
        self.decoder = nn.Linear(hidden, VOCAB, bias=False)
        self.bias = nn.Parameter(torch.zeros(VOCAB))


class _Heads(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.predictions = _Predictions(hidden)


class PlainBertForMaskedLM(nn.Module):
    """BERT for masked LM in plain torch, named like ``transformers.BertForMaskedLM`` (without the pooler, as there);
    ``forward(input_ids, attention_mask, labels)`` returns the loss (labels -100 are ignored)."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.bert = _Bert(layers, hidden, heads, ffn, dropout)
        self.cls = _Heads(hidden)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied, as in BERT
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        mask = attention_mask[:, None, None, :].bool()
        x = self.bert.embeddings(input_ids)
        for layer in self.bert.encoder.layer:
            x = layer(x, mask)
        p = self.cls.predictions
        logits = F.linear(p.transform(x), p.decoder.weight, p.bias)
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)


# ------------------------------------------------------------------------------------------------ the model

def build_model(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                plain: bool | None = None) -> nn.Module:
    """BERT for masked LM (BERT-base by default), randomly initialised: ``transformers.BertForMaskedLM`` when
    importable (``plain=None``) or asked (``plain=False``), else :class:`PlainBertForMaskedLM`. Seed before calling."""
    if plain is None:
        plain = not have_transformers()
    if plain:
        return PlainBertForMaskedLM(layers, hidden, heads, ffn)
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=ffn, max_position_embeddings=MAX_POSITIONS)
    model: nn.Module = BertForMaskedLM(cfg)
    return model


def encoder_layers(model: nn.Module) -> list[nn.Module]:
    """The encoder layers (each its own FSDP2 group under ``--fsdp``)."""
    return list(model.bert.encoder.layer)  # type: ignore[union-attr, arg-type]


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The masked-LM loss, for either implementation."""
    out: Any = model(**batch)
    loss: torch.Tensor = out if isinstance(out, torch.Tensor) else out.loss
    return loss


def make_batch(batch: int, seq: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tokens, 15% of them replaced by [MASK] and labelled with the original (the rest -100)."""
    ids = torch.randint(1000, VOCAB, (batch, seq), generator=generator)
    masked = torch.rand(batch, seq, generator=generator) < 0.15
    masked[:, 0] = True  # at least one label per row
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(masked, torch.full_like(ids, MASK_ID), ids),
            "attention_mask": torch.ones_like(ids), "labels": labels}


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
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank and step (default 2)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128, at most 512)")
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (default 12: BERT-base)")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default 12; must divide --hidden)")
    parser.add_argument("--ffn", type=int, default=3072, help="feed-forward size (default 3072)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per encoder layer) instead of DDP")
    parser.add_argument("--plain", action="store_true", help="use the plain-torch BERT even if transformers imports")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON, and each iteration's (on-CPU us, run-queue us) of the training "
                             "thread to PATH.rank<R>.split")
    args = parser.parse_args(argv)
    if args.hidden % args.heads or not 1 <= args.seq_len <= MAX_POSITIONS or min(args.batch, args.layers) < 1:
        parser.error("need --hidden divisible by --heads, 1 <= --seq-len <= 512, --batch >= 1, --layers >= 1")

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
        print(f"bert: transformers not importable; using the shipped plain-torch BERT (same architecture). "
              f"For transformers' BertForMaskedLM: {INSTALL}", file=sys.stderr, flush=True)

    torch.manual_seed(MODEL_SEED)
    model = build_model(args.layers, args.hidden, args.heads, args.ffn, plain=plain).to(device)
    wrapped: nn.Module
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in encoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [{k: v.to(device) for k, v in make_batch(args.batch, args.seq_len, generator).items()}
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
        raise FloatingPointError(f"bert: the loss is {float(loss.detach())}")

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
