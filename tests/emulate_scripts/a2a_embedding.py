"""Model-parallel embedding exchange (an unmodified torch.distributed script for ``nbox emulate`` tests).

Each rank owns ``SHARD`` rows of an embedding table of ``world * SHARD`` rows. Every iteration a rank asks
each owner ``d`` for ``n(rank, d)`` tokens (uneven per peer): the counts go out with an even
``all_to_all_single``, the token ids with an uneven one, the looked-up rows come back with an uneven one
(2-D), their gradients return the same way; a list-form ``dist.all_to_all`` carries a per-peer tag (even
shapes: gloo's list form needs equal tensors). A small dense layer (gradients all-reduced) and SGD;
``optimizer.step()`` every iteration.

Usage: ``a2a_embedding.py OUT_DIR [STEPS] [--flat-rows]``; ``--flat-rows`` moves the rows and their
gradients as 1-D tensors (split sizes in elements) instead of 2-D ones (split sizes in rows). Before each
``optimizer.step()`` the rank rewrites ``OUT_DIR/rank<R>.json`` with what it observed (the process may be
stopped inside any step).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SHARD, DIM = 4, 8


def n_tokens(src: int, dst: int) -> int:
    """Tokens ``src`` asks ``dst`` for: 1..3, different per peer."""
    return 1 + (src + 2 * dst) % 3


def write(path: Path, obs: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obs), encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--flat-rows"]
    flat = "--flat-rows" in sys.argv[1:]
    out_dir = Path(args[0])
    steps = int(args[1]) if len(args) > 1 else 100
    dist.init_process_group(backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(rank)
    emb = torch.nn.Embedding(SHARD, DIM)  # global rows rank*SHARD .. rank*SHARD+SHARD-1
    dense = torch.nn.Linear(DIM, 1)
    opt = torch.optim.SGD([*emb.parameters(), *dense.parameters()], lr=0.05)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"rank{rank}.json"
    obs: dict[str, Any] = {"world_size": world, "rank": rank, "flat_rows": flat, "losses": [], "steps": 0}
    send_counts = torch.tensor([n_tokens(rank, d) for d in range(world)], dtype=torch.int64)
    for step in range(steps):
        opt.zero_grad()
        # 1. counts: even all_to_all_single, one int per peer
        recv_counts = torch.empty(world, dtype=torch.int64)
        dist.all_to_all_single(recv_counts, send_counts)
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
        # 2. token ids: uneven all_to_all_single
        ids = torch.cat([d * SHARD + (torch.arange(n_tokens(rank, d)) + step) % SHARD for d in range(world)])
        asked = torch.empty(sum(out_splits), dtype=torch.int64)
        dist.all_to_all_single(asked, ids, output_split_sizes=out_splits, input_split_sizes=in_splits)
        local = asked - rank * SHARD
        in_shard = bool(((local >= 0) & (local < SHARD)).all())
        # 3. rows back: uneven all_to_all_single of 2-D rows (the reverse splits)
        rows = emb(local.clamp(0, SHARD - 1))
        got = torch.empty(sum(in_splits), DIM)
        if flat:
            dist.all_to_all_single(got.view(-1), rows.detach().reshape(-1).contiguous(),
                                   output_split_sizes=[s * DIM for s in in_splits],
                                   input_split_sizes=[s * DIM for s in out_splits])
        else:
            dist.all_to_all_single(got, rows.detach().contiguous(), output_split_sizes=in_splits,
                                   input_split_sizes=out_splits)
        got.requires_grad_()
        # 4. list-form all_to_all: a per-peer tag (the sender's rank, and the receiver's in the 2nd column)
        tags_out = [torch.tensor([[float(rank), float(d)]]) for d in range(world)]
        tags_in = [torch.empty(1, 2) for _ in range(world)]
        dist.all_to_all(tags_in, tags_out)
        # 5. dense layer, loss, backward; gradients of the rows go back to their owners
        target = torch.ones(got.shape[0], 1)
        loss = torch.nn.functional.mse_loss(dense(got), target)
        torch.autograd.backward(loss)
        assert got.grad is not None
        grad_back = torch.empty(sum(out_splits), DIM)
        if flat:
            dist.all_to_all_single(grad_back.view(-1), got.grad.reshape(-1).contiguous(),
                                   output_split_sizes=[s * DIM for s in out_splits],
                                   input_split_sizes=[s * DIM for s in in_splits])
        else:
            dist.all_to_all_single(grad_back, got.grad.contiguous(), output_split_sizes=out_splits,
                                   input_split_sizes=in_splits)
        torch.autograd.backward(rows, grad_back)
        for p in dense.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        obs.update(steps=step + 1, in_splits=in_splits, out_splits=out_splits, ids_in_shard=in_shard,
                   asked_shape=list(asked.shape), got_shape=list(got.shape), grad_back_shape=list(grad_back.shape),
                   tag_shapes=[list(t.shape) for t in tags_in], tags=[t[0].tolist() for t in tags_in],
                   loss_finite=math.isfinite(float(loss)))
        obs["losses"].append(float(loss))
        write(path, obs)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
