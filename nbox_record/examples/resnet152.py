"""ResNet-152 image classification (random init, random images). A plain torchrun script (no nbox import).

    python -m torch.distributed.run --nproc-per-node 2 resnet152.py --steps 20            # DDP
    python -m torch.distributed.run --nproc-per-node 2 resnet152.py --steps 20 --fsdp     # FSDP2

The model is ``torchvision.models.resnet152`` (randomly initialised, no weights) when torchvision is importable and
the stem width is the standard 64, else the same architecture written here in plain torch (bottleneck blocks
3-8-36-3 with the stride on the 3x3 convolution, as torchvision's; the same modules, names and parameter count).
Every rank builds the model from the same seed and draws its own images and labels; SGD with momentum,
cross-entropy. DDP broadcasts the batch-norm buffers from rank 0 before each forward, as by default. ``--fsdp``
shards every bottleneck block, then the root, with ``fully_shard``. Backend: ``NBOX_BACKEND`` or gloo
(``cpu:gloo,cuda:nccl`` when CUDA is available). Prints nothing per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MODEL_SEED = 0
DATA_SEED = 1000
BLOCKS = (3, 8, 36, 3)
INSTALL = "pip install torchvision built for this torch (not from PyPI beside a CPU or pinned torch: it pulls its own)"


def have_torchvision() -> bool:
    """Whether ``torchvision`` (with its ResNet) imports here."""
    try:
        from torchvision.models.resnet import ResNet  # noqa: F401
    except Exception:  # ImportError, or a torchvision built for another torch: the plain-torch model is used
        return False
    return True


# ----------------------------------------------------------------------------------------- plain-torch ResNet

def _conv(c_in: int, c_out: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=False)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand (x4), each with batch norm; the shortcut projects when the
    shape changes."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        c_out = planes * self.expansion
        self.conv1, self.bn1 = _conv(c_in, planes, 1), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = _conv(planes, c_out, 1), nn.BatchNorm2d(c_out)
        self.downsample = (nn.Sequential(_conv(c_in, c_out, 1, stride), nn.BatchNorm2d(c_out))
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class PlainResNet(nn.Module):
    """A bottleneck ResNet named like torchvision's (``conv1``, ``bn1``, ``layer1..4``, ``fc``)."""

    def __init__(self, blocks: tuple[int, ...] = BLOCKS, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        c_in = width
        stages = []
        for i, n in enumerate(blocks):
            planes = width * 2 ** i
            stage = []
            for j in range(n):
                stage.append(Bottleneck(c_in, planes, 2 if j == 0 and i > 0 else 1))
                c_in = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(c_in, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
        out: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return out


# ------------------------------------------------------------------------------------------------ the model

def build_model(blocks: tuple[int, ...] = BLOCKS, width: int = 64, classes: int = 1000,
                plain: bool | None = None) -> nn.Module:
    """A bottleneck ResNet (ResNet-152 by default), randomly initialised: torchvision's when importable
    (``plain=None``) or asked (``plain=False``) and ``width`` is 64 (torchvision's stem is fixed), else
    :class:`PlainResNet`. Seed before calling."""
    if len(blocks) != 4 or min(blocks) < 1:
        raise ValueError(f"blocks: four stages of at least one block each, got {blocks}")
    if plain is None:
        plain = width != 64 or not have_torchvision()
    if plain:
        return PlainResNet(tuple(blocks), width, classes)
    from torchvision.models.resnet import Bottleneck as TvBottleneck
    from torchvision.models.resnet import ResNet

    model: nn.Module = ResNet(TvBottleneck, list(blocks), num_classes=classes)
    return model


def residual_blocks(model: nn.Module) -> list[nn.Module]:
    """The bottleneck blocks (each its own FSDP2 group under ``--fsdp``)."""
    return [b for name in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, name)]


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
    parser.add_argument("--batch", type=int, default=2, help="images per rank and step (default 2)")
    parser.add_argument("--image-size", type=int, default=224, help="image height and width (default 224)")
    parser.add_argument("--blocks", default="3,8,36,3",
                        help="bottleneck blocks per stage, four numbers (default 3,8,36,3: ResNet-152)")
    parser.add_argument("--width", type=int, default=64,
                        help="stem width; the stages are 1, 2, 4, 8 times it (default 64)")
    parser.add_argument("--classes", type=int, default=1000, help="output classes (default 1000)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per bottleneck block) instead of DDP")
    parser.add_argument("--plain", action="store_true", help="use the plain-torch ResNet even if torchvision imports")
    parser.add_argument("--report-times", default=None, metavar="PATH",
                        help="write this rank's iteration times (us, optimizer step end to step end) to "
                             "PATH.rank<R> as JSON, and each iteration's (on-CPU us, run-queue us) of the training "
                             "thread to PATH.rank<R>.split")
    args = parser.parse_args(argv)
    try:
        blocks = tuple(int(b) for b in args.blocks.split(","))
    except ValueError:
        parser.error(f"--blocks {args.blocks!r}: four comma-separated integers")
    if len(blocks) != 4 or min(blocks) < 1 or min(args.batch, args.width, args.classes) < 1 or args.image_size < 32:
        parser.error("need --blocks of four numbers >= 1, --batch, --width, --classes >= 1, --image-size >= 32")

    dist.init_process_group(backend=default_backend())
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    plain = args.plain or args.width != 64 or not have_torchvision()
    if rank == 0 and plain and not args.plain and args.width == 64:
        print(f"resnet152: torchvision not importable; using the shipped plain-torch ResNet (same architecture). "
              f"For torchvision's: {INSTALL}", file=sys.stderr, flush=True)

    torch.manual_seed(MODEL_SEED)
    model = build_model(blocks, args.width, args.classes, plain=plain).to(device)
    wrapped: nn.Module
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in residual_blocks(model):
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)

    generator = torch.Generator().manual_seed(DATA_SEED + rank)
    batches = [(torch.randn(args.batch, 3, args.image_size, args.image_size, generator=generator).to(device),
                torch.randint(0, args.classes, (args.batch,), generator=generator).to(device))
               for _ in range(4)]
    times_us: list[float] = []
    split_us: list[tuple[float, float]] = []  # per iteration: the thread's time on a CPU, and waiting for one
    t_prev = None
    tt_prev = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(wrapped(x), y)
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
        raise FloatingPointError(f"resnet152: the loss is {float(loss.detach())}")

    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
