"""A small DDP script that plants secrets for tests/test_anonymize_record.py (see there)."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--api-key")
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

lib = torch.library.Library("nightingale", "DEF")
lib.define("fused_gate(Tensor x, str mode) -> Tensor")


def fused_gate_cpu(x, mode):
    return torch.sigmoid(x) * x


lib.impl("fused_gate", fused_gate_cpu, "CPU")


class NightingaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class NightingaleMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        with torch.profiler.record_function("ProjectNightingale/block3"):
            h = self.up(x)
            h = torch.ops.nightingale.fused_gate(h.detach(), "nightingale-mode") + h
            h = NightingaleFn.apply(h)
        return self.down(h)


dist.init_process_group("gloo")
tp = dist.new_group([0, 1], group_desc="tp_group_nightingale")
model = DDP(NightingaleMLP())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(args.steps):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    dist.all_reduce(torch.ones(4), group=tp)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
