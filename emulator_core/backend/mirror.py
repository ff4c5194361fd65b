"""What the data of an emulated collective is: the mirror rule, applied per collective.

The script sees a group of ``p`` members of which ``n`` are real processes. **Every emulated member mirrors a real
one** (:func:`emulator_core.pricing.answer.mirror_member`: member ``j`` mirrors real member ``j mod n``): it holds
exactly the tensors its mirror holds, and each collective's result is what it would be if that were so:

=====================  =========================================================================
collective             result on a real member
=====================  =========================================================================
all_reduce SUM         ``sum_k w_k x_k`` (``w_k`` = members real member k stands for, itself
                       included; :func:`emulator_core.pricing.answer.mirror_weights`); AVG divides by p
all_reduce MIN/MAX,    the real members' MIN/MAX/AND/OR (mirrors do not change them);
BAND/BOR, PRODUCT,     PRODUCT is ``prod_k x_k^w_k``; BXOR keeps ``x_k`` when ``w_k`` is odd
BXOR
all_gather             slot ``j`` holds the input of the real member ``j`` mirrors
reduce_scatter         ``sum_k w_k input_k[me]`` (AVG / p; MIN/MAX over real members)
all_to_all(_single)    the chunk from source ``s`` is what ``s``'s mirror sends to me; with uneven
                       splits a chunk whose size differs from the expected one is cut or zero-padded
broadcast / scatter    from the root's mirror (scatter from an emulated root: zeros)
reduce / gather        as all_reduce / all_gather, at a real root (an emulated root: nothing)
recv                   from a real peer: the data; from an emulated peer: zeros
recv_object_list       from a real peer: the objects; from an emulated peer: refused by name
                       (:mod:`emulator_core.backend.objectp2p`)
=====================  =========================================================================

Each function takes the group :class:`Layout`, the real backend among the real members (``inner``; ``None`` when
this process is the group's only real member) and the script's tensors, issues the inner operations asynchronously,
and returns ``(inner works, finish)``; ``finish()`` must run after the works complete, before the script sees the
result. Only this module and :mod:`emulator_core.backend` import torch. What training sees under the rule:
docs/design/emulated-world.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from emulator_core.pricing import mirror_member, mirror_weights

__all__ = ["Layout", "UnsupportedCollective"]

Works = list[Any]
Finish = Callable[[], None] | None
Result = tuple[Works, Finish]

# Reduce ops as plain ints (c10d's RedOpType values): comparing pybind enums costs ~1 us each.
_SUM, _AVG, _PRODUCT = dist.ReduceOp.SUM.value, dist.ReduceOp.AVG.value, dist.ReduceOp.PRODUCT.value
_MIN, _MAX = dist.ReduceOp.MIN.value, dist.ReduceOp.MAX.value
_BAND, _BOR, _BXOR = dist.ReduceOp.BAND.value, dist.ReduceOp.BOR.value, dist.ReduceOp.BXOR.value
_SUPPORTED = frozenset((_SUM, _AVG, _PRODUCT, _MIN, _MAX, _BAND, _BOR, _BXOR))


class UnsupportedCollective(RuntimeError):
    """A call the emulator cannot answer (the message names the call and why)."""


@dataclass(frozen=True)
class Layout:
    """One process group from this process's point of view.

    Attributes:
        size: members ``p`` (what the script's ``get_world_size(group)`` returns).
        me: this process's position in the group.
        real_positions: group positions of the real members, ascending; ``me`` is one of them.
    """

    size: int
    me: int
    real_positions: tuple[int, ...]
    weights: tuple[int, ...] = field(init=False)
    inner_index: int = field(init=False)

    def __post_init__(self) -> None:
        if self.me not in self.real_positions:
            raise ValueError(f"position {self.me} is not among the real members {self.real_positions}")
        object.__setattr__(self, "weights", tuple(mirror_weights(self.size, self.real_positions)))
        object.__setattr__(self, "inner_index", self.real_positions.index(self.me))
        object.__setattr__(self, "_index", None)

    @property
    def n(self) -> int:
        """Real members."""
        return len(self.real_positions)

    @property
    def weight(self) -> int:
        """Members this process stands for (itself included)."""
        return self.weights[self.inner_index]

    def mirror(self, j: int) -> int:
        """Index (among the real members) of the real member that member ``j`` mirrors."""
        return mirror_member(j, self.real_positions)

    def mirror_index(self) -> torch.Tensor:
        """``mirror(j)`` for every member, as an int64 tensor (built once, O(p))."""
        cached: torch.Tensor | None = object.__getattribute__(self, "_index")
        if cached is None:
            idx = torch.arange(self.size, dtype=torch.int64) % self.n
            for k, pos in enumerate(self.real_positions):
                idx[pos] = k
            object.__setattr__(self, "_index", idx)
            cached = idx
        return cached

    def real_index_tensor(self) -> torch.Tensor:
        return torch.tensor(self.real_positions, dtype=torch.int64)


def _op(opts: Any) -> int:
    return int(opts.reduceOp.op.value)


def _check_op(call: str, op: int) -> None:
    if op not in _SUPPORTED:
        raise UnsupportedCollective(f"{call} with reduce op {dist.ReduceOp.RedOpType(op)} is not emulated "
                                    f"(PREMUL_SUM has no mirror rule here); use SUM, AVG, MIN, MAX or PRODUCT")


def _inner_op(op: int) -> Any:
    """The op the real members run (gloo has no AVG: SUM, then divide)."""
    return dist.ReduceOp(dist.ReduceOp.RedOpType(_SUM if op == _AVG else op))


def _weigh(t: torch.Tensor, op: int, w: int) -> None:
    """Make ``t`` stand for ``w`` identical members under ``op`` (in place)."""
    if w == 1 or t.dtype == torch.bool:
        return
    if op in (_SUM, _AVG):
        t.mul_(w)
    elif op == _PRODUCT:
        t.pow_(w)
    elif op == _BXOR and w % 2 == 0:
        t.zero_()


def _average(ts: Sequence[torch.Tensor], op: int, p: int) -> Finish:
    if op != _AVG:
        return None

    def finish() -> None:
        for t in ts:
            if t.is_floating_point() or t.is_complex():
                t.div_(p)
            else:
                t.floor_divide_(p)
    return finish


def _chain(a: Finish, b: Finish) -> Finish:
    if a is None or b is None:
        return a or b

    def both() -> None:
        a()
        b()
    return both


def _fill(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` element-wise; cut when longer, zero-pad when shorter."""
    d, s = dst.reshape(-1), src.reshape(-1)
    if d.numel() == s.numel():
        dst.copy_(src.reshape(dst.shape))
        return
    k = min(d.numel(), s.numel())
    flat = dst.view(-1)
    flat[:k].copy_(s[:k])
    flat[k:].zero_()


def all_reduce(lay: Layout, inner: Any, tensors: list[torch.Tensor], opts: Any) -> Result:
    op = _op(opts)
    _check_op("all_reduce", op)
    for t in tensors:
        _weigh(t, op, lay.weight)
    works: Works = []
    if inner is not None:
        o = dist.AllreduceOptions()
        o.reduceOp = _inner_op(op)
        works.append(inner.allreduce(tensors, o))
    return works, _average(tensors, op, lay.size)


def all_gather(lay: Layout, inner: Any, outs: list[torch.Tensor], inp: torch.Tensor) -> Result:
    if len(outs) != lay.size:
        raise UnsupportedCollective(f"all_gather: {len(outs)} output tensors for a group of {lay.size}")
    if inner is None:
        for o in outs:
            o.copy_(inp)
        return [], None
    tmp = [torch.empty_like(inp) for _ in range(lay.n)]
    work = inner.allgather([tmp], [inp])

    def finish() -> None:
        for j, o in enumerate(outs):
            o.copy_(tmp[lay.mirror(j)])
    return [work], finish


def all_gather_single(lay: Layout, inner: Any, out: torch.Tensor, inp: torch.Tensor) -> Result:
    p = lay.size
    if out.numel() != p * inp.numel():
        raise UnsupportedCollective(f"all_gather_into_tensor: output has {out.numel()} elements, expected "
                                    f"{p} x {inp.numel()}")
    rows = out.view(p, -1)
    if inner is None:
        rows.copy_(inp.reshape(1, -1).expand(p, -1))
        return [], None
    tmp = torch.empty((lay.n, inp.numel()), dtype=inp.dtype, device=inp.device)
    work = inner._allgather_base(tmp.view(-1), inp.reshape(-1).contiguous())

    def finish() -> None:
        rows.copy_(tmp.index_select(0, lay.mirror_index().to(tmp.device)))
    return [work], finish


def reduce_scatter(lay: Layout, inner: Any, out: torch.Tensor, ins: list[torch.Tensor], opts: Any) -> Result:
    op = _op(opts)
    _check_op("reduce_scatter", op)
    if len(ins) != lay.size:
        raise UnsupportedCollective(f"reduce_scatter: {len(ins)} input tensors for a group of {lay.size}")
    if inner is None:
        out.copy_(ins[lay.me])
        _weigh(out, op, lay.weight)
        return [], _average([out], op, lay.size)
    contrib = [ins[pos].clone() for pos in lay.real_positions]
    for c in contrib:
        _weigh(c, op, lay.weight)
    o = dist.ReduceScatterOptions()
    o.reduceOp = _inner_op(op)
    return [inner.reduce_scatter([out], [contrib], o)], _average([out], op, lay.size)


def reduce_scatter_single(lay: Layout, inner: Any, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Result:
    op = _op(opts)
    _check_op("reduce_scatter_tensor", op)
    p = lay.size
    if inp.numel() != p * out.numel():
        raise UnsupportedCollective(f"reduce_scatter_tensor: input has {inp.numel()} elements, expected "
                                    f"{p} x {out.numel()}")
    rows = inp.reshape(p, -1)
    if inner is None:
        out.copy_(rows[lay.me].view(out.shape))
        _weigh(out, op, lay.weight)
        return [], _average([out], op, p)
    contrib = rows.index_select(0, lay.real_index_tensor().to(rows.device))
    _weigh(contrib, op, lay.weight)
    o = dist.ReduceScatterOptions()
    o.reduceOp = _inner_op(op)
    flat_out = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    work = inner._reduce_scatter_base(flat_out.view(-1), contrib.view(-1), o)
    fin = _average([out], op, p)
    if flat_out is not out:
        def copy_back() -> None:
            out.copy_(flat_out)
        fin = _chain(copy_back, fin)
    return [work], fin


def broadcast(lay: Layout, inner: Any, tensors: list[torch.Tensor], root: int) -> Result:
    if inner is None:
        return [], None
    o = dist.BroadcastOptions()
    o.rootRank = lay.mirror(root)
    return [inner.broadcast(tensors, o)], None


def reduce(lay: Layout, inner: Any, tensors: list[torch.Tensor], root: int, opts: Any) -> Result:
    op = _op(opts)
    _check_op("reduce", op)
    if root not in lay.real_positions:
        return [], None  # no real process receives an emulated root's result
    for t in tensors:
        _weigh(t, op, lay.weight)
    fin = _average(tensors, op, lay.size) if root == lay.me else None
    if inner is None:
        return [], fin
    o = dist.ReduceOptions()
    o.rootRank = lay.real_positions.index(root)
    o.reduceOp = _inner_op(op)
    return [inner.reduce(tensors, o)], fin


def gather(lay: Layout, inner: Any, outs: list[torch.Tensor], inp: torch.Tensor, root: int) -> Result:
    if root not in lay.real_positions:
        return [], None
    is_root = root == lay.me
    if is_root and len(outs) != lay.size:
        raise UnsupportedCollective(f"gather: {len(outs)} output tensors at the root for a group of {lay.size}")
    if inner is None:
        for o in outs:
            o.copy_(inp)
        return [], None
    tmp = [torch.empty_like(inp) for _ in range(lay.n)] if is_root else []
    go = dist.GatherOptions()
    go.rootRank = lay.real_positions.index(root)
    work = inner.gather([tmp] if is_root else [], [inp], go)

    def finish() -> None:
        for j, o in enumerate(outs):
            o.copy_(tmp[lay.mirror(j)])
    return [work], finish if is_root else None


def scatter(lay: Layout, inner: Any, out: torch.Tensor, ins: list[torch.Tensor], root: int) -> Result:
    if root not in lay.real_positions:
        out.zero_()
        return [], None
    is_root = root == lay.me
    if is_root and len(ins) != lay.size:
        raise UnsupportedCollective(f"scatter: {len(ins)} input tensors at the root for a group of {lay.size}")
    if inner is None:
        out.copy_(ins[lay.me])
        return [], None
    so = dist.ScatterOptions()
    so.rootRank = lay.real_positions.index(root)
    pieces = [ins[pos] for pos in lay.real_positions] if is_root else []
    return [inner.scatter([out], [pieces] if is_root else [], so)], None


def all_to_all(lay: Layout, inner: Any, outs: list[torch.Tensor], ins: list[torch.Tensor]) -> Result:
    if len(outs) != lay.size or len(ins) != lay.size:
        raise UnsupportedCollective(f"all_to_all: {len(ins)} inputs / {len(outs)} outputs for a group of {lay.size}")
    if inner is None:
        for o in outs:
            _fill(o, ins[lay.me])
        return [], None
    send = [ins[pos].contiguous() for pos in lay.real_positions]
    recv = [torch.empty_like(outs[pos]) for pos in lay.real_positions]
    work = inner.alltoall(recv, send, dist.AllToAllOptions())

    def finish() -> None:
        for s, o in enumerate(outs):
            _fill(o, recv[lay.mirror(s)])
    return [work], finish


def _offsets(splits: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for s in splits:
        out.append(acc)
        acc += s
    return out


def all_to_all_single(lay: Layout, inner: Any, out: torch.Tensor, inp: torch.Tensor,
                      out_splits: Sequence[int], in_splits: Sequence[int]) -> Result:
    p = lay.size
    if not out_splits and not in_splits:
        if inp.numel() % p or out.numel() != inp.numel():
            raise UnsupportedCollective(f"all_to_all_single: {inp.numel()} input / {out.numel()} output elements "
                                        f"do not split evenly over {p} members")
        rows_in, rows_out = inp.reshape(p, -1), out.view(p, -1)
        if inner is None:
            rows_out.copy_(rows_in[lay.me].reshape(1, -1).expand(p, -1))
            return [], None
        send = rows_in.index_select(0, lay.real_index_tensor().to(inp.device))
        recv = torch.empty_like(send)
        work = inner.alltoall_base(recv, send, [], [], dist.AllToAllOptions())

        def finish_even() -> None:
            rows_out.copy_(recv.index_select(0, lay.mirror_index().to(recv.device)))
        return [work], finish_even
    if len(out_splits) != p or len(in_splits) != p:
        raise UnsupportedCollective(f"all_to_all_single: split sizes must list {p} members, got "
                                    f"{len(in_splits)} input / {len(out_splits)} output")
    row = math.prod(inp.shape[1:])  # elements per row (split sizes count rows of dim 0); also with 0 rows
    flat_in, flat_out = inp.reshape(-1), out.view(-1)
    ioff, ooff = _offsets(in_splits), _offsets(out_splits)

    def chunk(flat: torch.Tensor, off: int, n: int) -> torch.Tensor:
        return flat[off * row:(off + n) * row]

    if inner is None:
        mine = chunk(flat_in, ioff[lay.me], in_splits[lay.me])
        for s in range(p):
            _fill(chunk(flat_out, ooff[s], out_splits[s]), mine)
        return [], None
    send_splits = [in_splits[pos] for pos in lay.real_positions]
    recv_splits = [out_splits[pos] for pos in lay.real_positions]
    send = torch.cat([chunk(flat_in, ioff[pos], in_splits[pos]) for pos in lay.real_positions])
    recv = torch.empty(sum(recv_splits) * row, dtype=out.dtype, device=out.device)
    # the buffers are flat, so the real exchange's splits count elements, not rows
    work = inner.alltoall_base(recv, send, [n * row for n in recv_splits], [n * row for n in send_splits],
                               dist.AllToAllOptions())

    def finish() -> None:
        roff = _offsets(recv_splits)
        for s in range(p):
            k = lay.mirror(s)
            _fill(chunk(flat_out, ooff[s], out_splits[s]), chunk(recv, roff[k], recv_splits[k]))
    return [work], finish


def barrier(lay: Layout, inner: Any) -> Result:
    if inner is None:
        return [], None
    return [inner.barrier(dist.BarrierOptions())], None


def send(lay: Layout, inner: Any, tensors: list[torch.Tensor], peer: int, tag: int) -> Result:
    if peer not in lay.real_positions or inner is None:
        return [], None  # an emulated peer: the data goes nowhere
    return [inner.send(tensors, lay.real_positions.index(peer), tag)], None


def recv(lay: Layout, inner: Any, tensors: list[torch.Tensor], peer: int, tag: int) -> Result:
    if peer not in lay.real_positions or inner is None:
        for t in tensors:
            t.zero_()
        return [], None
    return [inner.recv(tensors, lay.real_positions.index(peer), tag)], None
