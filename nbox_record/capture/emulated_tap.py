"""Capturing an emulated run (``nbox emulate -o``): make the ``nbox`` backend's collectives visible.

``emulator_core.backend.process_group.NboxProcessGroup`` is a ``ProcessGroup`` written in Python, so the script's
collectives reach its methods straight from the C++ ``ProcessGroup`` (pybind trampoline), not through
the dispatcher's ``c10d::<op>`` operators that :class:`nbox_record.capture.commlog.CollectiveLogger` hooks and the
execution-trace observer records. For the capture, :func:`tap` registers an observer with the backend
(:func:`emulator_core.backend.process_group.add_observer`) so that each call

* records a ``record_function`` named like the operator it stands for (``c10d::allreduce_``), which the
  execution trace keeps as a node in the right place of the rank's operator tree (it carries no tensor
  inputs: the collective's facts come from the log). It is a marker closed before the call runs: a scope
  left open across the call nested DDP's next bucket's all-reduce inside the previous one in the ET
  (seen on torch 2.13), which the converter reads as a collective issued inside another operator; and
* adds the same :class:`~nbox_record.handoff.rawformat.CollectiveRecord` to the logger that a dispatched
  ``c10d::<op>`` would have produced, with the group's global ranks in the emulated world.

:func:`untap` removes the observer. Group-local root and peer ranks become global through the group's
members, as for any recorded group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from emulator_core.backend import Observer, add_observer, remove_observer
from nbox_record.capture.commlog import CollectiveLogger

__all__ = ["tap", "untap"]

_Bind = Callable[[tuple[Any, ...]], dict[str, Any]]


def _root(args: tuple[Any, ...], index: int) -> int | None:
    opts = args[index] if len(args) > index else None
    return getattr(opts, "rootRank", None)


#: NboxProcessGroup method -> (c10d operator, its schema arguments from the method's arguments).
METHODS: dict[str, tuple[str, _Bind]] = {
    "allreduce": ("allreduce_", lambda a: {"tensors": a[0]}),
    "allreduce_coalesced": ("allreduce_coalesced_", lambda a: {"tensors": a[0]}),
    "allgather": ("allgather_", lambda a: {"output_tensors": a[0], "input_tensors": a[1]}),
    "all_gather_single": ("_allgather_base_", lambda a: {"output_tensor": a[0], "input_tensor": a[1]}),
    "all_gather_single_coalesced": ("allgather_into_tensor_coalesced_",
                                    lambda a: {"outputs": a[0], "inputs": a[1]}),
    "reduce_scatter": ("reduce_scatter_", lambda a: {"output_tensors": a[0], "input_tensors": a[1]}),
    "reduce_scatter_single": ("_reduce_scatter_base_", lambda a: {"output_tensor": a[0], "input_tensor": a[1]}),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced_",
                                        lambda a: {"outputs": a[0], "inputs": a[1]}),
    "broadcast": ("broadcast_", lambda a: {"tensors": a[0], "root_rank": _root(a, 1)}),
    "reduce": ("reduce_", lambda a: {"tensors": a[0], "root_rank": _root(a, 1)}),
    "gather": ("gather_", lambda a: {"output_tensors": a[0], "input_tensors": a[1], "root_rank": _root(a, 2)}),
    "scatter": ("scatter_", lambda a: {"output_tensors": a[0], "input_tensors": a[1], "root_rank": _root(a, 2)}),
    "alltoall": ("alltoall_", lambda a: {"output_tensors": a[0], "input_tensors": a[1]}),
    "all_to_all_single": ("alltoall_base_", lambda a: {"output": a[0], "input": a[1],
                                                         "output_split_sizes": a[2], "input_split_sizes": a[3]}),
    "barrier": ("barrier", lambda a: {}),
    "send": ("send", lambda a: {"tensors": a[0], "dst": a[1], "tag": a[2]}),
    "recv": ("recv_", lambda a: {"tensors": a[0], "src": a[1], "tag": a[2]}),
}


def _group_of(pg: Any) -> tuple[str, list[int]]:
    members = getattr(pg, "members", None)
    ranks = list(members) if members is not None else list(range(pg.size()))
    return str(pg.getGroupName()), ranks


def _observer(logger: CollectiveLogger) -> Observer:
    from torch.autograd.profiler import record_function

    def observe(pg: Any, method: str, args: tuple[Any, ...]) -> None:
        known = METHODS.get(method)
        if known is None:
            return
        op, bind = known
        issue_us = time.time() * 1e6
        try:
            bound = bind(args)
        except Exception as exc:  # never let bookkeeping break the collective
            logger.errors.append(f"{op}: {type(exc).__name__}: {exc}")
            bound = None
        with record_function(f"c10d::{op}"):  # a marker: the call itself runs outside it (see above)
            if bound is not None:
                logger.note_python_call(op, bound, _group_of(pg), issue_us)

    return observe


def tap(logger: CollectiveLogger) -> Observer:
    """Log ``NboxProcessGroup``'s collectives to ``logger`` until :func:`untap` with the returned observer."""
    observer = _observer(logger)
    add_observer(observer)
    return observer


def untap(observer: Observer) -> None:
    """Stop logging through ``observer`` (idempotent)."""
    remove_observer(observer)
