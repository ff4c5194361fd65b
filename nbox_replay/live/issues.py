"""What a live replay's comm nodes are issued with: the process groups at the what-if world size and, per comm
node, a function that issues its collective or point-to-point call on buffers of the retargeted size.

Split from :mod:`nbox_replay.live._worker` (one replayed rank), which calls them once per rank before its walk. A
collective is issued with ``async_op=True`` (the walk decides when to wait on its work); the buffers carry no
information (the live replay moves no data: ``NBOX_MOVE_DATA=0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from nbox_replay.inputs import SEND, CommInfo, RankGraph
from nbox_replay.virtual import retarget
from nbox_trace.chakra import attr_map

__all__ = ["Groups", "Issue", "NodeError", "make_issue"]

Issue = Callable[[], Any]


class NodeError(RuntimeError):
    """A node could not be replayed (carries its id and name for the error file)."""

    def __init__(self, node_id: int, name: str, message: str) -> None:
        super().__init__(message)
        self.node_id, self.name = node_id, name


def _dtype(name: str | None) -> torch.dtype:
    found = getattr(torch, name, None) if name else None
    return found if isinstance(found, torch.dtype) else torch.float32


class Groups:
    """Process groups at the what-if world size: the recorded world grows to W, others keep their members."""

    def __init__(self, groups: dict[str, list[int]], recorded_world: int, world: int) -> None:
        self.world = world
        self.recorded_world = recorded_world
        self.by_name: dict[str, tuple[Any, list[int], bool]] = {}
        everyone = list(range(recorded_world))
        for name in sorted(groups):  # every process creates the same groups in the same order (torch's rule)
            members = sorted(int(r) for r in groups[name])
            grows = members == everyone and world != recorded_world
            if grows or members == list(range(world)):
                self.by_name[name] = (None, list(range(world)), grows)
                continue
            bad = [r for r in members if not 0 <= r < world]
            if bad:
                raise ValueError(f"process group {name!r} has member(s) {bad} outside the what-if world of {world}")
            self.by_name[name] = (dist.new_group(members), members, False)

    def get(self, name: str) -> tuple[Any, list[int], bool]:
        """(group object or None for the world, members' global ranks, grown)."""
        found = self.by_name.get(name)
        if found is None:  # undeclared: the world, like torch's default group
            found = self.by_name[name] = (None, list(range(self.world)), self.world != self.recorded_world)
        return found


def _root(comm: CommInfo, members: list[int]) -> int:
    r = comm.root
    if r is not None and r in members:
        return r
    if r is not None and 0 <= r < len(members):
        return members[r]
    return members[0]


def make_issue(g: RankGraph, i: int, groups: Groups, device: str) -> Issue | None:
    """A function issuing comm node ``i`` (returns its work), or None for an unpriced one (recorded duration)."""
    comm = g.comm[i]
    node_id, name = g.ids[i], g.names[i]
    if comm.collective == "unpriced":
        return None
    me = g.rank
    node = g.nodes[i] if g.nodes is not None else None
    attrs = attr_map(node.attr) if node is not None else {}
    dt_attr = attrs.get("nbox_dtype")
    dtype = _dtype(str(dt_attr.value) if dt_attr is not None and dt_attr.value is not None else None)
    item = torch.empty(0, dtype=dtype).element_size()

    def buf(n: int) -> torch.Tensor:
        return torch.zeros(max(n, 0), dtype=dtype, device=device)

    if comm.collective == "send_recv":
        peer, world = comm.peer, groups.world
        if peer is None or not 0 <= peer < world or peer == me:
            raise NodeError(node_id, name, f"send/recv peer {peer} is not another rank of the what-if world of "
                                           f"{world} (rank {me})")
        t = buf(max(1, round(comm.nbytes / item)))
        if g.kind[i] == SEND:
            return lambda: dist.isend(t, dst=peer, tag=comm.tag)
        return lambda: dist.irecv(t, src=peer, tag=comm.tag)
    pg, members, grows = groups.get(comm.pg)
    if me not in members:
        raise NodeError(node_id, name, f"rank {me} is not a member of process group {comm.pg!r} ({members[:8]})")
    nbytes, _ = retarget(comm, groups.recorded_world, groups.world, grows)
    n = max(1, round(nbytes / item))
    gs = len(members)
    c = comm.collective
    if c == "all_reduce":
        t = buf(n)
        return lambda: dist.all_reduce(t, group=pg, async_op=True)
    if c == "all_gather":
        inp, out = buf(n), buf(n * gs)
        return lambda: dist.all_gather_into_tensor(out, inp, group=pg, async_op=True)
    if c == "reduce_scatter":
        per = max(1, -(-n // gs))
        inp, out = buf(per * gs), buf(per)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=pg, async_op=True)
    if c in ("all_to_all", "all_to_all_v"):
        ins, outs = comm.in_splits, comm.out_splits
        if c == "all_to_all_v" and ins and outs and len(ins) == gs and len(outs) == gs and sum(ins) > 0:
            row = max(1, n // sum(ins))
            a, b = torch.zeros(sum(ins), row, dtype=dtype, device=device), \
                torch.zeros(sum(outs), row, dtype=dtype, device=device)
            in_s, out_s = list(ins), list(outs)
            return lambda: dist.all_to_all_single(b, a, out_s, in_s, group=pg, async_op=True)
        per = max(1, -(-n // gs))
        inp, out = buf(per * gs), buf(per * gs)
        return lambda: dist.all_to_all_single(out, inp, group=pg, async_op=True)
    if c == "broadcast":
        t, src = buf(n), _root(comm, members)
        return lambda: dist.broadcast(t, src=src, group=pg, async_op=True)
    if c == "reduce":
        t, dst = buf(n), _root(comm, members)
        return lambda: dist.reduce(t, dst=dst, group=pg, async_op=True)
    if c == "gather":
        t, dst = buf(n), _root(comm, members)
        gl = [buf(n) for _ in range(gs)] if dst == me else None
        return lambda: dist.gather(t, gl, dst=dst, group=pg, async_op=True)
    if c == "scatter":
        t, src = buf(n), _root(comm, members)
        sl = [buf(n) for _ in range(gs)] if src == me else None
        return lambda: dist.scatter(t, sl, src=src, group=pg, async_op=True)
    if c == "barrier":
        return lambda: dist.barrier(group=pg, async_op=True)
    raise NodeError(node_id, name, f"collective {c!r} cannot be issued live")
