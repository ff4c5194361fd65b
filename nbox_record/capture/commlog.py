"""Log every c10d collective and p2p operation a rank issues, as
:class:`~nbox_record.handoff.rawformat.CollectiveRecord`.

How: while a capture runs, a Python kernel is registered for each ``c10d::*`` operator of :data:`OPS` at the
``Autograd`` key (``torch.library.Library("c10d", "IMPL")``), and one at ``BackendSelect`` that logs only the calls
made in inference mode (where the autograd keys are excluded). The dispatcher calls them for every collective issued
with CPU or CUDA tensors, from Python and from C++ (DDP's reducer, FSDP2); each notes the operation and redispatches
below itself (``OpOverload.redispatch``), so the ET keeps exactly one ``c10d::<op>`` node per collective and no aten
operator is touched. The library is destroyed at the capture's end, which restores the dispatch table.

Joining records to the ET, by identity: the kernel takes the record's ``seq`` (issue order on this rank) and opens a
record function ``nbox::collective/<pg_name>/<seq>/<op>`` around the redispatch, which the ET writes as a child of
the ``c10d::<op>`` node. ``issue_us`` is wall clock (a Kineto event's is ``baseTimeNanoseconds / 1000 + ts``).

``comm_bytes`` (the Chakra ``comm_size``) is this rank's input bytes, except ``SCATTER`` (output bytes) and
``BARRIER`` (0): all-reduce: the buffer; all-gather: the shard sent; reduce-scatter: the full unreduced buffer;
all-to-all: everything this rank sends; send/recv: the buffer.

Blind spots (no record; the ET still has the ``c10d::`` node): collectives issued inside another operator's kernel
outside inference mode (functional collectives: torch.compile, DTensor tensor parallelism). ``wait_us`` only for a
Python ``Work.wait()`` (DDP's reducer waits in C++: ``None``); ``done_us`` from the Work's future, else from a Python
``wait()``, else ``None``; ``recv_any_source_`` has ``peer = None``. Times are microseconds.
Why not a ``TorchDispatchMode``, and how the kernels were chosen: docs/design/recording.md.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

from nbox_record.handoff import CollectiveRecord, ProcessGroupInfo, identity_marker


@dataclass(frozen=True)
class _OpSpec:
    comm_type: str              # Chakra CollectiveCommType name, or SEND / RECV
    inputs: str | None          # schema argument holding this rank's input tensor(s)
    outputs: str | None         # schema argument holding this rank's output tensor(s)
    root: str | None = None     # schema argument holding the group-local root rank
    peer: str | None = None     # send/recv: schema argument holding the group-local peer rank
    tag: str | None = None      # send/recv: schema argument holding the tag


#: Every c10d collective / p2p operator of torch 2.13 (``torch._C._dispatch_get_all_op_names()``),
#: except ``check_for_nan``. Operators missing from an older torch are skipped at registration.
OPS: dict[str, _OpSpec] = {
    "allreduce_": _OpSpec("ALL_REDUCE", "tensors", "tensors"),
    "allreduce_coalesced_": _OpSpec("ALL_REDUCE", "tensors", "tensors"),
    "allgather_": _OpSpec("ALL_GATHER", "input_tensors", "output_tensors"),
    "_allgather_base_": _OpSpec("ALL_GATHER", "input_tensor", "output_tensor"),
    "allgather_coalesced_": _OpSpec("ALL_GATHER", "input_list", "output_lists"),
    "allgather_into_tensor_coalesced_": _OpSpec("ALL_GATHER", "inputs", "outputs"),
    "reduce_scatter_": _OpSpec("REDUCE_SCATTER", "input_tensors", "output_tensors"),
    "_reduce_scatter_base_": _OpSpec("REDUCE_SCATTER", "input_tensor", "output_tensor"),
    "reduce_scatter_tensor_coalesced_": _OpSpec("REDUCE_SCATTER", "inputs", "outputs"),
    "broadcast_": _OpSpec("BROADCAST", "tensors", "tensors", root="root_rank"),
    "reduce_": _OpSpec("REDUCE", "tensors", "tensors", root="root_rank"),
    "gather_": _OpSpec("GATHER", "input_tensors", "output_tensors", root="root_rank"),
    "scatter_": _OpSpec("SCATTER", "input_tensors", "output_tensors", root="root_rank"),
    "alltoall_": _OpSpec("ALL_TO_ALL", "input_tensors", "output_tensors"),
    "alltoall_base_": _OpSpec("ALL_TO_ALL", "input", "output"),
    "barrier": _OpSpec("BARRIER", None, None),
    "monitored_barrier_": _OpSpec("BARRIER", None, None),
    "send": _OpSpec("SEND", "tensors", "tensors", peer="dst", tag="tag"),
    "recv_": _OpSpec("RECV", "tensors", "tensors", peer="src", tag="tag"),
    "recv_any_source_": _OpSpec("RECV", "tensors", "tensors", tag="tag"),
}


#: Seconds :meth:`CollectiveLogger.stop` waits, in all, for the capture's Works to finish (see ``_settle``).
SETTLE_TIMEOUT_S = 10.0


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in an argument: a tensor, a list of tensors, or a list of lists of tensors."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item
            elif isinstance(item, (list, tuple)):
                yield from (t for t in item if isinstance(t, torch.Tensor))


def _on_host(args: tuple[Any, ...]) -> bool:
    """Whether a c10d call's tensors are CPU tensors (its first tensor argument's device; True if none)."""
    for arg in args:
        for tensor in _tensors(arg):
            return tensor.device.type == "cpu"
    return True


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _wall_us() -> float:
    return time.time() * 1e6


def process_groups() -> list[ProcessGroupInfo]:
    """Every process group this rank knows, default group first (empty before ``init_process_group``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    world = dist.distributed_c10d._world
    infos: list[ProcessGroupInfo] = []
    for pg, name in world.pg_names.items():
        group_ranks = world.pg_group_ranks.get(pg, {})
        ranks = [g for g, _ in sorted(group_ranks.items(), key=lambda item: item[1])]
        try:
            backend = str(dist.get_backend(pg))
        except (RuntimeError, ValueError):
            backend = ""
        infos.append({"pg_name": str(name), "pg_desc": str(getattr(pg, "group_desc", "")),
                      "ranks": ranks, "backend": backend})
    infos.sort(key=lambda info: (info["pg_name"] != "0", info["pg_name"]))
    return infos


class CollectiveLogger:
    """Records collectives between :meth:`start` and :meth:`stop` (see the module docstring).

    Not reentrant: one logger at a time per process. Errors while describing an operation never reach
    the collective: they are counted in :attr:`errors` and the operation runs as usual.
    """

    def __init__(self) -> None:
        self.records: list[CollectiveRecord] = []
        self.errors: list[str] = []
        self._lib: torch.library.Library | None = None
        self._orig_wait: Callable[..., Any] | None = None
        #: id(Work) -> (Work, record, whether stop() must let it settle: see :meth:`_track`)
        self._pending: dict[int, tuple[Work, CollectiveRecord, bool]] = {}
        self._lock = threading.Lock()
        self._ranks_by_pg: dict[str, list[int]] = {}
        #: Records of the Works still running when :meth:`stop` gave up waiting for them.
        self.unsettled: list[CollectiveRecord] = []

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._lib is not None:
            raise RuntimeError("CollectiveLogger already started")
        lib = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
        try:
            for name, spec in OPS.items():
                packet = getattr(torch.ops.c10d, name, None)
                if packet is None or "default" not in packet.overloads():
                    continue
                lib.impl(  # type: ignore[no-untyped-call]
                    name, self._kernel(name, spec, packet.default), "Autograd", with_keyset=True)
                lib.impl(  # type: ignore[no-untyped-call]
                    name, self._inference_kernel(name, spec, packet.default), "BackendSelect", with_keyset=True)
        except Exception:
            lib._destroy()  # type: ignore[no-untyped-call]
            raise
        self._lib = lib
        self._patch_wait()

    def stop(self) -> list[CollectiveRecord]:
        """Unregister, restore ``Work.wait``, let the Works settle (:meth:`_settle`, :data:`SETTLE_TIMEOUT_S` in
        all), release them; returns the records."""
        if self._lib is not None:
            self._lib._destroy()  # type: ignore[no-untyped-call]
            self._lib = None
        if self._orig_wait is not None:
            Work.wait = self._orig_wait  # type: ignore[method-assign]
            self._orig_wait = None
        with self._lock:
            works = [(work, record) for work, record, settle in self._pending.values() if settle]
            self._pending.clear()
        self.unsettled = self._settle(works, SETTLE_TIMEOUT_S)
        return self.records

    @staticmethod
    def _settle(works: list[tuple[Work, CollectiveRecord]], timeout_s: float) -> list[CollectiveRecord]:
        """Wait until each Work has finished on its backend's thread; returns the records of those that did not
        within ``timeout_s`` seconds in all.

        Why: gloo completes a Work's future *before* ``Work::finish`` ends the collective's record function on
        its worker thread (``ProcessGroupGloo::AsyncWork::finishWorkGloo``), and DDP's reducer waits on the
        future. The rank can thus reach the end of the capture, and the session remove the execution-trace
        observer, while that thread is still inside the observer's exit callback: the callback then locks the
        freed observer's mutex and the process aborts (``pthread_mutex_lock: Assertion
        `mutex->__data.__owner == 0' failed``; 6 of 150 recordings of ``ddp_mlp`` on torch 2.13 + gloo, every
        core dump in ``onFunctionExit`` under ``finishWorkGloo``). ``Work::wait`` returns only after ``finish``
        released the Work's lock, i.e. after the callback. Seen with gloo. Works on CUDA tensors are not settled:
        ``ProcessGroupNCCL::collective`` marks the future completed at enqueue, on the calling thread, and runs
        the record function's end callback there (no race), while a timed ``wait`` on a ``WorkNCCL`` that
        expires reports a timeout the watchdog may act on.

        Only the Works :meth:`_track` marked are passed here, and those already finished are not waited on:
        a second timed ``wait`` on a gloo send/recv Work waits for a *new* completion of its buffer and, at its
        timeout, signals an error to every pair of the context, breaking the script's process group (seen: a
        recording of ``moe_alltoall.py`` blocked 10 s here, then hung).
        """
        deadline = time.monotonic() + timeout_s
        unsettled: list[CollectiveRecord] = []
        for work, record in works:
            with contextlib.suppress(Exception):
                if work.is_completed():  # finished: its record function has ended; never wait twice
                    continue
            left_s = deadline - time.monotonic()
            # wait raises when it times out or when the collective failed (its exception, already the script's)
            with contextlib.suppress(Exception):
                if left_s > 0:
                    work.wait(datetime.timedelta(seconds=left_s))
            try:
                done = bool(work.is_completed())
            except Exception:  # a backend without isCompleted: nothing more to learn
                done = True
            if not done:
                unsettled.append(record)
        return unsettled

    # -- the kernel --------------------------------------------------------------------------------

    def _kernel(self, name: str, spec: _OpSpec, op: torch._ops.OpOverload[Any, Any]) -> Callable[..., Any]:
        after_autograd = torch._C._after_autograd_keyset
        backend_select = torch._C.DispatchKey.BackendSelect  # skip the inference kernel: logged here already
        log = self._logging(name, spec, op)

        def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
            return log((keyset & after_autograd).remove(backend_select), args, kwargs)

        return kernel

    def _inference_kernel(self, name: str, spec: _OpSpec, op: torch._ops.OpOverload[Any, Any]) -> Callable[..., Any]:
        """The ``BackendSelect`` kernel: logs a call made inside ``torch.inference_mode()`` (the ``Autograd``
        kernel never saw it), passes any other call through untouched."""
        backend_select = torch._C.DispatchKey.BackendSelect
        inference = torch.is_inference_mode_enabled
        log = self._logging(name, spec, op)

        def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
            below = keyset.remove(backend_select)
            if not inference():
                return op.redispatch(below, *args, **kwargs)
            return log(below, args, kwargs)

        return kernel

    def _logging(self, name: str, spec: _OpSpec,
                 op: torch._ops.OpOverload[Any, Any]) -> Callable[[torch._C.DispatchKeySet, tuple[Any, ...],
                                                                    dict[str, Any]], Any]:
        """Log one call, then run it with ``below`` (the keys under the calling kernel's)."""
        schema_args = op._schema.arguments

        def log(below: torch._C.DispatchKeySet, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            issue_us = _wall_us()
            record: CollectiveRecord | None
            try:
                bound = self._bind(schema_args, args, kwargs)
                record = self._describe(name, spec, bound, issue_us)
            except Exception as exc:  # never let bookkeeping break the collective
                record = None
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            if record is None:
                return op.redispatch(below, *args, **kwargs)
            self._append(record)  # seq = issue order, taken before the collective starts
            # The identity marker: a child of this c10d node in the host ET, so the ET node names its record
            # whatever the ET observer's nesting (see :func:`identity_marker`).
            with torch._C._profiler._RecordFunctionFast(identity_marker(record)):
                out = op.redispatch(below, *args, **kwargs)
            try:
                self._track(out, record, _on_host(args))
            except Exception as exc:
                self.errors.append(f"{name} (work): {type(exc).__name__}: {exc}")
            return out

        return log

    @staticmethod
    def _bind(schema_args: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Schema argument name -> value, with defaults filled (boxed calls drop trailing defaults)."""
        bound: dict[str, Any] = {}
        for index, arg in enumerate(schema_args):
            if index < len(args):
                bound[arg.name] = args[index]
            elif arg.name in kwargs:
                bound[arg.name] = kwargs[arg.name]
            elif arg.has_default_value():
                bound[arg.name] = arg.default_value
            else:
                bound[arg.name] = None
        return bound

    def _group(self, bound: dict[str, Any]) -> tuple[str, list[int]]:
        """The process group argument (a ScriptObject) -> (group name, global ranks in group-rank order)."""
        obj = bound.get("process_group")
        if not isinstance(obj, torch.ScriptObject):
            return "", []
        name = str(dist.ProcessGroup.unbox(obj).group_name)
        ranks = self._ranks_by_pg.get(name)
        if ranks is None:
            ranks = []
            for info in process_groups():
                if info["pg_name"] == name:
                    ranks = info["ranks"]
            self._ranks_by_pg[name] = ranks
        return name, ranks

    def _describe(self, name: str, spec: _OpSpec, bound: dict[str, Any], issue_us: float,
                  group: tuple[str, list[int]] | None = None) -> CollectiveRecord:
        pg_name, ranks = group if group is not None else self._group(bound)

        def global_rank(group_rank: object) -> int | None:
            if not isinstance(group_rank, int) or group_rank < 0:
                return None
            return ranks[group_rank] if group_rank < len(ranks) else group_rank

        ins = list(_tensors(bound.get(spec.inputs))) if spec.inputs else []
        outs = list(_tensors(bound.get(spec.outputs))) if spec.outputs else []
        first = (ins or outs)[0] if (ins or outs) else None
        if first is None:
            barrier = bound.get("tensor")
            dtype = _dtype_name(barrier.dtype) if isinstance(barrier, torch.Tensor) else ""
            elem_bytes = barrier.element_size() if isinstance(barrier, torch.Tensor) else 0
        else:
            dtype, elem_bytes = _dtype_name(first.dtype), first.element_size()
        in_numel = sum(t.numel() for t in ins)
        out_numel = sum(t.numel() for t in outs)
        in_bytes = sum(t.numel() * t.element_size() for t in ins)
        out_bytes = sum(t.numel() * t.element_size() for t in outs)
        if spec.comm_type == "BARRIER":
            comm_bytes = 0
        elif spec.comm_type == "SCATTER":
            comm_bytes = out_bytes
        else:
            comm_bytes = in_bytes

        in_splits: list[int] = []
        out_splits: list[int] = []
        if name == "alltoall_base_":
            size = max(len(ranks), 1)
            in_splits = self._splits(bound.get("input"), bound.get("input_split_sizes"), size)
            out_splits = self._splits(bound.get("output"), bound.get("output_split_sizes"), size)
        elif name == "alltoall_":
            in_splits = [t.numel() for t in ins]
            out_splits = [t.numel() for t in outs]

        async_flag = bound.get("async_op")
        return {
            "seq": -1,  # set when appended, under the lock
            "op": name,
            "comm_type": spec.comm_type,
            "pg_name": pg_name,
            "dtype": dtype,
            "in_numel": in_numel,
            "out_numel": out_numel,
            "elem_bytes": elem_bytes,
            "comm_bytes": comm_bytes,
            "in_split_sizes": in_splits,
            "out_split_sizes": out_splits,
            "peer": global_rank(bound.get(spec.peer)) if spec.peer else None,
            "tag": int(bound[spec.tag]) if spec.tag and isinstance(bound.get(spec.tag), int) else None,
            "root": global_rank(bound.get(spec.root)) if spec.root else None,
            # send/recv have no async_op argument: the Python API waits for the blocking variants itself.
            "async_op": bool(async_flag) if isinstance(async_flag, bool) else True,
            "issue_us": issue_us,
            "wait_us": None,
            "done_us": None,
        }

    @staticmethod
    def _splits(tensor: object, split_rows: object, group_size: int) -> list[int]:
        """All-to-all split sizes in elements (c10d gives rows of dim 0; empty = equal splits)."""
        if not isinstance(tensor, torch.Tensor):
            return []
        per_row = tensor.numel() // tensor.shape[0] if tensor.dim() > 0 and tensor.shape[0] else tensor.numel()
        if isinstance(split_rows, (list, tuple)) and split_rows:
            return [int(rows) * per_row for rows in split_rows]
        return [tensor.numel() // group_size] * group_size

    def note_python_call(self, name: str, bound: dict[str, Any], group: tuple[str, list[int]],
                         issue_us: float) -> CollectiveRecord | None:
        """Log a collective that a process group written in Python received without the dispatcher
        (``nbox emulate``'s ``NboxProcessGroup``; :mod:`nbox_record.capture.emulated_tap`): ``bound`` holds the
        ``c10d::<name>`` schema's arguments, ``group`` its (name, global ranks). Returns the record."""
        spec = OPS.get(name)
        if spec is None:
            self.errors.append(f"{name}: not a c10d collective nbox logs")
            return None
        try:
            record = self._describe(name, spec, bound, issue_us, group)
        except Exception as exc:  # never let bookkeeping break the collective
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return None
        self._append(record)
        return record

    def _append(self, record: CollectiveRecord) -> None:
        with self._lock:
            record["seq"] = len(self.records)
            self.records.append(record)

    def _track(self, out: object, record: CollectiveRecord, on_host: bool) -> None:
        """Keep the call's Work for the capture; ``on_host``: its tensors are CPU tensors.

        :meth:`stop` settles (:meth:`_settle`) the Works that have a future and run on the host: those a
        backend's worker thread finishes (gloo's collectives). Works without a future (gloo's send/recv)
        finish inside the script's own ``wait``, on its thread; CUDA Works: see :meth:`_settle`."""
        items = out if isinstance(out, tuple) else (out,)
        script_work = next((o for o in items if isinstance(o, torch.ScriptObject)), None)
        if script_work is None:
            return
        work = Work.unbox(script_work)
        try:
            future = work.get_future()
        except RuntimeError:  # gloo send/recv, _reduce_scatter_base_: "Work::getFuture not implemented"
            future = None
        # Keep the Python wrapper alive for the capture: pybind then hands the same object to the script,
        # so the patched Work.wait finds the record by id().
        with self._lock:
            self._pending[id(work)] = (work, record, on_host and future is not None)
        if future is None:
            return

        def done(_: object, record: CollectiveRecord = record) -> None:
            if record["done_us"] is None:
                record["done_us"] = _wall_us()

        future.add_done_callback(done)

    def _patch_wait(self) -> None:
        original = Work.wait
        pending, lock = self._pending, self._lock

        def wait(work: Work, *args: Any, **kwargs: Any) -> Any:
            with lock:
                entry = pending.get(id(work))
            if entry is None or entry[0] is not work:
                return original(work, *args, **kwargs)
            record = entry[1]
            if record["async_op"] and record["wait_us"] is None:
                record["wait_us"] = _wall_us()
            result = original(work, *args, **kwargs)
            if record["done_us"] is None:
                record["done_us"] = _wall_us()
            return result

        self._orig_wait = original
        Work.wait = wait  # type: ignore[method-assign,assignment]
