"""One real rank (W = 4) training a small DDP model with its collectives held on the fake device
(tests/test_device_hold.py): DDP's C++ reducer reaches the held works through ``get_future()``. Prints one JSON line."""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from emulator_core.backend import devicecall
from emulator_core.device.fake import FakeDevice


def main() -> None:
    dev = FakeDevice(host_clock=time.perf_counter_ns, skew_ns=5_000_000)
    dev.start()
    devicecall.register_factory("cpu", lambda _: dev)
    dist.init_process_group("nbox")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    reference = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    reference.load_state_dict(model.state_dict())
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    for _ in range(3):
        ddp.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
    reference.zero_grad()
    nn.functional.mse_loss(reference(x), y).backward()
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    same = all(a.grad is not None and b.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-6)
               for a, b in pairs)
    deadline = time.monotonic() + 30
    while any(s.status == 0 for s in dev.slots) and time.monotonic() < deadline:  # the last deadlines being written
        time.sleep(0.001)
    pg = dist.distributed_c10d._get_default_group()
    records = getattr(pg, "records", None)
    if records is None:
        records = pg._get_backend(torch.device("cpu")).records
    print(json.dumps({"world": dist.get_world_size(), "grads_match": same, "holds": len(dev.slots),
                      "released": sum(s.status == 1 for s in dev.slots), "records": len(records),
                      "held_streams": sorted({r.split(":")[0] for r in dev.ran})}))
    dist.destroy_process_group()
    dev.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
