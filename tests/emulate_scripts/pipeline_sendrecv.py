"""A 2-stage pipeline over rank pairs (an unmodified torch.distributed script for ``nbox emulate`` tests).

Stage ``rank % 2``, peer ``rank ^ 1``. Stage 0 runs its layer and ``dist.send``s the activations to its
peer, then ``dist.recv``s their gradient and back-propagates; stage 1 ``dist.recv``s the activations, runs
its layer and the loss, and sends the activations' gradient back. Both call ``optimizer.step()`` every
iteration. The world size must be even.

Usage: ``pipeline_sendrecv.py OUT_DIR [STEPS]``. Before each ``optimizer.step()`` the rank rewrites
``OUT_DIR/rank<R>.json`` with what it observed (the process may be stopped inside any step).
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

BATCH, DIM, HIDDEN = 4, 8, 16


def write(path: Path, obs: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obs), encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    out_dir = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    dist.init_process_group(backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % 2:
        raise SystemExit(f"pipeline_sendrecv needs an even world size, got {world}")
    stage, peer = rank % 2, rank ^ 1
    torch.manual_seed(1000 + rank)
    layer = torch.nn.Linear(DIM, HIDDEN) if stage == 0 else torch.nn.Linear(HIDDEN, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"rank{rank}.json"
    obs: dict[str, Any] = {"world_size": world, "rank": rank, "stage": stage, "peer": peer, "losses": [],
                           "recv_abs_sum": [], "steps": 0}
    for step in range(steps):
        opt.zero_grad()
        if stage == 0:
            act = torch.tanh(layer(torch.randn(BATCH, DIM)))
            dist.send(act.detach().contiguous(), dst=peer)
            grad = torch.empty(BATCH, HIDDEN)
            dist.recv(grad, src=peer)
            torch.autograd.backward(act, grad)
            received = grad
            loss = float((act.detach() * grad).sum())  # a stand-in: stage 0 has no loss of its own
        else:
            act = torch.empty(BATCH, HIDDEN)
            dist.recv(act, src=peer)
            act.requires_grad_()
            out = layer(act)
            loss_t = torch.nn.functional.mse_loss(out, torch.ones(BATCH, 1))
            torch.autograd.backward(loss_t)
            assert act.grad is not None
            dist.send(act.grad.contiguous(), dst=peer)
            received = act.detach()
            loss = float(loss_t)
        obs["losses"].append(loss)
        obs["recv_abs_sum"].append(float(received.abs().sum()))
        obs.update(steps=step + 1, recv_shape=list(received.shape), loss_finite=math.isfinite(loss))
        write(path, obs)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
