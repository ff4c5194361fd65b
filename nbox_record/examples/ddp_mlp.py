"""DDP over a 3-layer MLP: SGD, MSE loss, random data. A plain torchrun script (no nbox import).

    python -m torch.distributed.run --nproc-per-node 2 ddp_mlp.py --steps 20

Backend: ``NBOX_BACKEND`` or ``gloo`` (``cpu:gloo,cuda:nccl`` when CUDA is available). Prints nothing
per step. One iteration is a few milliseconds on one CPU core per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN_DIM = 256
HIDDEN = 512
OUT_DIM = 64
BATCH = 32
MODEL_SEED = 0
DATA_SEED = 1000


def build_model(in_dim: int = IN_DIM, hidden: int = HIDDEN, out_dim: int = OUT_DIM) -> nn.Module:
    """The 3-layer MLP (the same on every rank: seed before calling)."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out_dim),
    )


def thread_times_ns() -> tuple[int, int] | None:
    """This thread's (time on a CPU, time runnable waiting for one) in ns: the thread clock and Linux's schedstat,
    read as nbox_trace/threadtime.py reads them (schedstat's own CPU field lags up to a scheduler tick), copied
    here because the examples are plain scripts that import torch only; for --report-times
    (bench/emulate_fidelity.py splits the real iteration as nbox emulate does)."""
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
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON (bench/record_overhead.py uses it)")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
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
    model = build_model(hidden=args.hidden).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [
        (torch.randn(args.batch_size, IN_DIM, generator=generator).to(device),
         torch.randn(args.batch_size, OUT_DIM, generator=generator).to(device))
        for _ in range(4)
    ]
    times_us: list[float] = []
    split_us: list[tuple[float, float]] = []  # per iteration: the thread's time on a CPU, and waiting for one
    t_prev = None
    tt_prev = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        tt = thread_times_ns() if args.report_times else None
        if t_prev is not None:
            times_us.append((now - t_prev) * 1e6)
            if tt is not None and tt_prev is not None:
                split_us.append(((tt[0] - tt_prev[0]) / 1e3, (tt[1] - tt_prev[1]) / 1e3))
        t_prev, tt_prev = now, tt

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
