"""DDP over a small ConvNet on 32x32 images: SGD, cross entropy, random data. A plain torchrun script (no nbox
import), and the job ``nbox record`` runs when it is given no script.

    python -m torch.distributed.run --nproc-per-node 2 ddp_convnet.py --steps 20

Sized so that an iteration is about 100-300 ms on one CPU core per rank (four 3x3 convolutions of 32 to 128
channels, batch 32, 0.24 M parameters: a 0.9 MiB gradient all-reduce, one DDP bucket): long enough that a launch's
noise is small beside it, short enough that recording and replaying it takes well under two minutes. Backend:
``NBOX_BACKEND`` or ``gloo`` (``cpu:gloo,cuda:nccl`` when CUDA is available). Prints nothing per step.
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

IMAGE = 32
CLASSES = 10
BATCH = 32
WIDTH = 32
MODEL_SEED = 0
DATA_SEED = 1000


def build_model(width: int = WIDTH, classes: int = CLASSES) -> nn.Module:
    """The ConvNet (the same on every rank: seed before calling): two stages of two 3x3 convolutions with batch norm
    and ReLU, each stage ending in a 2x2 max pool, then global average pooling and a linear classifier."""
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, width), *block(width, 2 * width), nn.MaxPool2d(2),
        *block(2 * width, 4 * width), *block(4 * width, 4 * width), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, classes),
    )


def thread_times_ns() -> tuple[int, int] | None:
    """This thread's (time on a CPU, time runnable waiting for one) in ns, as nbox_trace/threadtime.py reads them
    (copied: the examples import torch only); for --report-times."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            run_queue = f.read(256).split()[1]
        return time.thread_time_ns(), int(run_queue)
    except (OSError, ValueError, IndexError):
        return None


def default_backend() -> str:
    """``NBOX_BACKEND`` (``auto``: nccl where CUDA is available, else gloo), or gloo / ``cpu:gloo,cuda:nccl``."""
    chosen = os.environ.get("NBOX_BACKEND")
    if chosen == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return chosen or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20, help="training iterations (default 20)")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--width", type=int, default=WIDTH, help="channels of the first convolution (default 32)")
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
    model = build_model(width=args.width).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [
        (torch.randn(args.batch_size, 3, IMAGE, IMAGE, generator=generator).to(device),
         torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device))
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
