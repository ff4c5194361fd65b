"""A training script run on the `nbox` backend by tests/test_backend.py (not collected by pytest).

It is an ordinary torch.distributed script: it asks for backend "nbox", then runs collectives, DDP and
FSDP2 steps, and writes what it observed (world size, rank, values, losses, times) to
``$NBOX_TEST_RESULTS/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def train(net: torch.nn.Module, steps: int) -> list[float]:
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randn(64, 16, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.1
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def collectives(out: dict[str, Any]) -> None:
    w, g = dist.get_world_size(), dist.get_rank()
    t = torch.tensor([g + 1.0])
    dist.all_reduce(t)
    out["all_reduce_sum"] = t.item()
    t = torch.tensor([g + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["all_reduce_avg"] = t.item()
    t = torch.tensor([float(g)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.item()
    flat = torch.empty(w)
    dist.all_gather_into_tensor(flat, torch.tensor([float(g)]))
    out["all_gather_into_tensor"] = flat.tolist()
    slots = [torch.empty(1) for _ in range(w)]
    dist.all_gather(slots, torch.tensor([float(g)]))
    out["all_gather"] = [s.item() for s in slots]
    rs = torch.empty(1)
    dist.reduce_scatter_tensor(rs, torch.arange(float(w)) * (g + 1))
    out["reduce_scatter_tensor"] = rs.item()
    a2a = torch.empty(w)
    dist.all_to_all_single(a2a, g * 100 + torch.arange(float(w)))
    out["all_to_all_single"] = a2a.tolist()
    for root in (0, 3):
        b = torch.tensor([float(g)])
        dist.broadcast(b, src=root)
        out[f"broadcast_from_{root}"] = b.item()
    objs: list[Any] = [None] * w
    dist.all_gather_object(objs, {"rank": g})
    out["all_gather_object"] = [o["rank"] for o in objs]
    dist.barrier()
    r = funcol.wait_tensor(funcol.all_reduce(torch.tensor([g + 1.0]), "sum", dist.group.WORLD))
    out["funcol_all_reduce"] = r.item()
    ag = funcol.wait_tensor(funcol.all_gather_tensor(torch.tensor([float(g)]), 0, dist.group.WORLD))
    out["funcol_all_gather"] = ag.tolist()
    # point to point: to and from emulated peers (the last rank is emulated in every test)
    peer = w - 1
    dist.send(torch.ones(4), dst=peer)
    got = torch.full((4,), 7.0)
    dist.recv(got, src=peer)
    out["recv_from_emulated"] = got.tolist()
    # sub-groups: every member must create them, real or not (torch's rule)
    evens = dist.new_group(list(range(0, w, 2)))
    firsts = dist.new_group(list(range(4)))
    if g % 2 == 0:
        t = torch.tensor([g + 1.0])
        dist.all_reduce(t, group=evens)
        out["evens_all_reduce"] = t.item()
        out["evens_size"] = dist.get_world_size(evens)
    if g < 4:
        t = torch.tensor([g + 1.0])
        dist.all_reduce(t, group=firsts)
        out["firsts_all_reduce"] = t.item()
    # the work completes at the modeled time: the async call returns first, wait() not before the end
    pg = dist.group.WORLD
    x = torch.ones(1 << 16)
    work = dist.all_reduce(x, async_op=True)
    returned_us = time.perf_counter_ns() / 1000
    assert work is not None
    work.wait()
    waited_us = time.perf_counter_ns() / 1000
    rec = pg.records[-1]  # type: ignore[union-attr]
    out["timing"] = {"returned_us": returned_us, "waited_us": waited_us, "start_us": rec.start_us,
                     "end_us": rec.end_us, "algorithm": rec.algorithm, "collective": rec.collective}


def timing_only(out: dict[str, Any]) -> None:
    """Run with ``NBOX_MOVE_DATA=0`` on two real ranks: what a collective and a late send left in the buffers and
    the answers' times (records: start and the sender's issue on one host's clock)."""
    me = dist.get_rank()
    x = torch.full((4,), float(me + 1))
    dist.all_reduce(x)
    out["timing_only_all_reduce"] = x.tolist()
    pg = dist.group.WORLD
    if me == 1:
        time.sleep(0.3)  # the send is issued well after the receive
        t = torch.full((3,), 7.0)
        dist.send(t, dst=0)
        out["send_issue_us"] = pg.records[-1].issue_us  # type: ignore[union-attr]
    elif me == 0:
        t = torch.zeros(3)
        dist.recv(t, src=1)
        out["recv_buffer"] = t.tolist()
        out["recv_issue_us"] = pg.records[-1].issue_us  # type: ignore[union-attr]
        out["recv_start_us"] = pg.records[-1].start_us  # type: ignore[union-attr]
    dist.barrier()
    # a burst of collectives issued back to back, rank 1 late: with timing only, each one's arrival exchange is
    # started by the group's resolver thread, not the caller; the answers must pair the same calls in order
    if me == 1:
        time.sleep(0.2)
    works = [dist.all_reduce(torch.zeros(4 + k), async_op=True) for k in range(5)]
    for w in works:
        w.wait()
    burst = list(pg.records)[-5:]  # type: ignore[union-attr]
    out["burst"] = [[r.nbytes, r.issue_us, r.start_us] for r in burst]


def beside_compute(out: dict[str, Any], how: str) -> None:
    """An all-reduce, then ``how`` ("spin": the thread computes; "sleep": it is blocked) for 1.25x its modeled
    time, then a second one: the first's answer and the second's issue and start (records, one host's clock)."""
    pg = dist.group.WORLD
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    cost_s = (pg.records[-1].end_us - pg.records[-1].start_us) / 1e6  # type: ignore[union-attr]
    dist.barrier()
    first = dist.all_reduce(x, async_op=True)
    assert first is not None
    until = time.perf_counter() + 1.25 * cost_s
    if how == "spin":
        while time.perf_counter() < until:
            pass
    else:
        time.sleep(max(0.0, until - time.perf_counter()))
    second = dist.all_reduce(x, async_op=True)
    assert second is not None
    first.wait()
    second.wait()
    a, b = list(pg.records)[-2:]  # type: ignore[union-attr]
    out["beside_compute"] = {"first_start_us": a.start_us, "first_end_us": a.end_us, "second_issue_us": b.issue_us,
                             "second_start_us": b.start_us}


def main() -> None:
    modes = sys.argv[1].split(",")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    dist.init_process_group("nbox", timeout=timedelta(seconds=60))
    out: dict[str, Any] = {"world_size": dist.get_world_size(), "rank": dist.get_rank(),
                           "real_world_size": int(os.environ["WORLD_SIZE"]), "backend": dist.get_backend()}
    if "collectives" in modes:
        collectives(out)
    if "timing_only" in modes:
        timing_only(out)
    for how in ("spin", "sleep"):
        if how in modes:
            beside_compute(out, how)
    if "ddp" in modes:
        out["ddp_losses"] = train(DistributedDataParallel(model()), steps)
    if "fsdp2" in modes:
        net = model()
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        out["fsdp2_losses"] = train(net, steps)
    records = dist.group.WORLD.records  # type: ignore[union-attr]
    out["answered"] = len(records)
    out["overrun_us_max"] = max((r.overrun_us for r in records), default=0.0)
    dist.destroy_process_group()
    # one file per rank: the ranks share torchrun's stdout, where two lines can interleave
    path = os.path.join(os.environ["NBOX_TEST_RESULTS"], f"rank{out['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
