"""DeepLight's DeepFwFM click-through-rate model over Criteo-shaped fields (random init, random samples). A plain
torchrun script (no nbox import).

    python -m torch.distributed.run --nproc-per-node 2 deeplight.py --steps 20

DeepFwFM (Deng et al., "DeepLight: Deep Lightweight Feature Interactions for Accelerating CTR Predictions in Ad
Serving", arXiv 2002.06987) adds a field-weighted factorization machine and a DNN over the same field embeddings:

* 39 fields as in Criteo: 13 dense (each one embedding vector scaled by the feature's value) and 26 sparse
  categorical (one embedding table each, ``--vocab`` rows);
* FwFM: a bias, the field-specific linear term ``sum_i <e_i, w_F(i)>`` and the pairwise term
  ``sum_{i<j} r_{F(i),F(j)} <e_i, e_j>`` with a learned field-pair weight matrix ``r``;
* DNN: the concatenated embeddings through ReLU layers (400-400-400 by default) to one logit;
* the prediction is ``sigmoid(fwfm + dnn)``, trained with binary cross-entropy and Adam.

Written here in plain torch (no library ships it). DDP (the embedding tables' gradients are dense, so every table
is all-reduced whole each step). Every rank builds the model from the same seed and draws its own samples.
Backend: ``NBOX_BACKEND`` or gloo (``cpu:gloo,cuda:nccl`` when CUDA is available). Prints nothing per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DENSE_FIELDS, SPARSE_FIELDS = 13, 26
MODEL_SEED = 0
DATA_SEED = 1000


class DeepFwFM(nn.Module):
    """FwFM beside a DNN over shared field embeddings; ``forward(dense, sparse)`` gives one logit per sample
    (``dense``: float ``(batch, 13)``, ``sparse``: int64 ``(batch, 26)`` row indices)."""

    upper: torch.Tensor  # the strict upper triangle of ones: the field pairs i < j

    def __init__(self, vocab: int = 40000, dim: int = 10, hidden: tuple[int, ...] = (400, 400, 400),
                 dense_fields: int = DENSE_FIELDS, sparse_fields: int = SPARSE_FIELDS) -> None:
        super().__init__()
        fields = dense_fields + sparse_fields
        self.dense_embedding = nn.Parameter(torch.randn(dense_fields, dim) * 0.01)
        tables = [nn.Embedding(vocab, dim) for _ in range(sparse_fields)]
        for table in tables:
            nn.init.normal_(table.weight, std=0.01)
        self.sparse_embeddings = nn.ModuleList(tables)
        self.bias = nn.Parameter(torch.zeros(1))
        self.field_linear = nn.Parameter(torch.randn(fields, dim) * 0.01)  # w_F(i): FwFM's FeLV linear term
        self.field_pair = nn.Parameter(torch.randn(fields, fields) * 0.01)  # r: only i < j is used
        self.register_buffer("upper", torch.triu(torch.ones(fields, fields), diagonal=1), persistent=False)
        layers: list[nn.Module] = []
        width = fields * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.dnn = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        e_dense = dense.unsqueeze(-1) * self.dense_embedding  # (batch, 13, dim)
        e_sparse = torch.stack([t(sparse[:, i]) for i, t in enumerate(self.sparse_embeddings)], 1)
        e = torch.cat([e_dense, e_sparse], 1)  # (batch, fields, dim)
        linear = (e * self.field_linear).sum((1, 2))
        gram = torch.bmm(e, e.transpose(1, 2))  # <e_i, e_j>
        pairs = (gram * (self.field_pair * self.upper)).sum((1, 2))
        deep = self.dnn(e.flatten(1)).squeeze(-1)
        out: torch.Tensor = self.bias + linear + pairs + deep
        return out


def build_model(vocab: int = 40000, dim: int = 10, hidden: tuple[int, ...] = (400, 400, 400)) -> DeepFwFM:
    """DeepFwFM over 13 dense and 26 sparse fields, randomly initialised (seed before calling)."""
    return DeepFwFM(vocab, dim, hidden)


def make_batch(batch: int, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """Criteo-shaped samples: log-scaled non-negative dense values, sparse ids (skewed towards low rows, as
    categorical features are), click labels."""
    dense = torch.log1p(torch.rand(batch, DENSE_FIELDS, generator=generator) * 100)
    sparse = (torch.rand(batch, SPARSE_FIELDS, generator=generator) ** 3 * vocab).long().clamp(max=vocab - 1)
    clicks = (torch.rand(batch, generator=generator) < 0.25).float()
    return dense, sparse, clicks


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
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank and step (default 4096)")
    parser.add_argument("--vocab", type=int, default=40000, help="rows of each sparse field's table (default 40000)")
    parser.add_argument("--dim", type=int, default=10, help="embedding width (default 10)")
    parser.add_argument("--layers", type=int, default=3, help="DNN hidden layers (default 3)")
    parser.add_argument("--hidden", type=int, default=400, help="DNN hidden width (default 400)")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON, and each iteration's (on-CPU us, run-queue us) of the training "
                             "thread to PATH.rank<R>.split")
    args = parser.parse_args(argv)
    if min(args.batch, args.vocab, args.dim, args.layers, args.hidden) < 1:
        parser.error("every size must be >= 1")

    dist.init_process_group(backend=default_backend())
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(MODEL_SEED)
    model = build_model(args.vocab, args.dim, (args.hidden,) * args.layers).to(device)
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [tuple(t.to(device) for t in make_batch(args.batch, args.vocab, generator)) for _ in range(4)]
    times_us: list[float] = []
    split_us: list[tuple[float, float]] = []  # per iteration: the thread's time on a CPU, and waiting for one
    t_prev = None
    tt_prev = None
    for step in range(args.steps):
        dense, sparse, clicks = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(ddp(dense, sparse), clicks)
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
        raise FloatingPointError(f"deeplight: the loss is {float(loss.detach())}")

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
