"""DDP or FSDP2 over a small MLP (an unmodified torch.distributed script for ``nbox emulate`` tests).

Usage: ``ddp_fsdp2.py OUT_DIR STEPS {ddp,fsdp2}``. Besides training (SGD, ``optimizer.step()`` every
iteration), each iteration all-gathers a tensor holding this rank's number, so the test can check the
gathered shape and what every (real or emulated) rank contributed. Under FSDP2 a forward hook notes the
shape of the first layer's weight while it is unsharded (the all-gathered parameter), and the shape of
this rank's shard. Before each ``optimizer.step()`` the rank rewrites ``OUT_DIR/rank<R>.json`` with what
it observed (the process may be stopped inside any step).
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
from torch import nn

IN, HIDDEN, OUT, BATCH = 16, 24, 8, 4


def write(path: Path, obs: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obs), encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    out_dir, steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    obs: dict[str, Any] = {"rank": rank, "world_size": world, "mode": mode, "steps": 0, "losses": []}
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        weight: Any = model[0].weight  # a DTensor once sharded
        obs["shard_shape"] = list(weight.to_local().shape)
        obs["full_shape"] = list(weight.shape)

        def note_unsharded(module: nn.Module, _args: Any, _out: Any) -> None:
            obs["unsharded_shape"] = list(getattr(module, "weight").shape)  # noqa: B009 - mypy: Module attr

        model[0].register_forward_hook(note_unsharded)
        train: nn.Module = model
    else:
        train = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(train.parameters(), lr=0.05)
    for _ in range(steps):
        x = torch.randn(BATCH, IN)
        loss = train(x).pow(2).mean()
        loss.backward()
        gathered = torch.empty(world * 2)
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
        obs["gathered"] = gathered.tolist()
        obs["steps"] += 1
        obs["losses"].append(float(loss))
        obs["loss_finite"] = all(math.isfinite(v) for v in obs["losses"])
        write(out_dir / f"rank{rank}.json", obs)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
