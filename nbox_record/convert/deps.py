"""Dependencies between the converted nodes of one rank: complete, acyclic, in recorded order.

The nodes arrive sorted in recorded order (host operators by start, GPU ops after the operator that
launched them); :func:`link` gives each one its predecessors, and every predecessor comes earlier in
that order, so the graph is acyclic by construction. The rules:

* **CPU thread order**: a host operator depends on the previous *blocking* node of its thread. A
  comm node is issued after that node too, and after the previous comm node of its process group
  (one group's collectives run one after the other: one NCCL stream, one gloo worker). A collective
  blocks its thread only when it is synchronous and not on a GPU stream (a gloo all-reduce without
  ``async_op``); an asynchronous one, or an NCCL one (the CPU only enqueues it), lets the thread go
  on, and is waited for by whoever touches its tensors (below), or by the first node that started
  after the recorded wait (``collectives.json`` ``wait_us``).
* **Thread switches**: the first node after a switch of threads depends on the latest blocking node
  of the other thread, if that one had finished when it started (the backward thread's first op
  waits for the forward's last one; two threads running at once are not serialized).
* **Tensors**: a node that reads or writes a tensor storage depends on the last writer of that
  storage when the writer ran on another thread or is an asynchronous CPU collective (at most
  :data:`MAX_TENSOR_DEPS` such edges per node; same-thread writers are already ordered; a collective
  on a GPU stream is waited for by GPU ops, through the stream rule, not by host operators).
* **Host waits for the GPU**: a host operator that synchronized with the device (a
  ``cudaStreamSynchronize``/``cudaDeviceSynchronize``/blocking ``cudaMemcpy`` inside it, e.g.
  ``aten::item``) depends on the last GPU op of every stream launched before it.
* **Streams**: a GPU op depends on the host operator that launched it and on the previous op of its
  stream; a comm node with a kernel sits on that stream, waits for the last GPU op launched before
  it (NCCL waits for the compute stream), and unless asynchronous, is waited for by the next GPU op
  of another stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbox_trace.chakra import et_def_pb2 as pb

MAX_TENSOR_DEPS = 16
Key = tuple[int, int, float, int]


@dataclass
class OutNode:
    """One output node before ids and dependencies are known, with what :func:`link` needs."""

    key: Key  # sort key: recorded order
    node: pb.Node
    thread: int | None = None  # host thread (ET tid) of CPU and comm nodes; None for GPU ops
    stream: int | None = None  # GPU stream of GPU ops and of comm nodes with a kernel
    start: float | None = None  # Kineto times (us) when known
    end: float | None = None
    comm: bool = False
    pg: str | None = None  # comm node: its process group (collectives of one group complete in order)
    sync: bool = True  # comm node: the issuer waits for completion (False: async_op)
    wait_us: float | None = None  # comm node: when the script waited on it, if recorded
    owner: int | None = None  # GPU op: index of the host node that launched it
    gpu_sync: bool = False  # host node that waited for the GPU (cudaStreamSynchronize, .item() ...)
    reads: list[int] = field(default_factory=list)  # storage ids
    writes: list[int] = field(default_factory=list)
    deps: list[int] = field(default_factory=list)  # indices of earlier OutNodes

    @property
    def blocking(self) -> bool:
        """Does the issuing thread wait for this node to finish before its next operator?"""
        return not self.comm or (self.sync and self.stream is None)


def link(items: list[OutNode]) -> dict[str, int]:
    """Fill ``deps`` of ``items`` (already in recorded order); return counts for the stats."""
    last_block: dict[int, int] = {}  # thread -> last blocking node
    last_comm: dict[str | None, int] = {}  # process group -> last comm node
    last_cpu: int | None = None  # last blocking node of any thread
    waits: dict[int, list[tuple[float, int]]] = {}  # thread -> comm nodes waited on at a known time
    producer: dict[int, int] = {}
    last_stream: dict[int, int] = {}
    last_gpu: int | None = None
    pending_sync: list[int] = []
    switch = tensor = waited = synced = 0
    for i, it in enumerate(items):
        if it.thread is not None:
            t = it.thread
            p = last_block.get(t)
            if p is not None:
                it.deps.append(p)
            if it.comm:
                c = last_comm.get(it.pg)
                if c is not None and c != p:
                    it.deps.append(c)
            if last_cpu is not None and items[last_cpu].thread != t and last_cpu != p:
                o = items[last_cpu]
                if o.end is None or it.start is None or o.end <= it.start:
                    it.deps.append(last_cpu)
                    switch += 1
            pending = waits.get(t)
            if pending and it.start is not None:
                keep = []
                for wait_us, c in pending:
                    if wait_us <= it.start:
                        it.deps.append(c)
                        waited += 1
                    else:
                        keep.append((wait_us, c))
                waits[t] = keep
            added = 0
            for s in (*it.reads, *it.writes):
                q = producer.get(s)
                if q is None or q in it.deps or added >= MAX_TENSOR_DEPS:
                    continue
                o = items[q]
                if o.stream is None and (o.thread != t or not o.blocking):
                    it.deps.append(q)
                    added += 1
            tensor += added
            if it.gpu_sync:
                for q in last_stream.values():
                    if q not in it.deps:
                        it.deps.append(q)
                        synced += 1
            for s in it.writes:
                producer[s] = i
            if it.comm:
                last_comm[it.pg] = i
                if not it.blocking and it.wait_us is not None:
                    waits.setdefault(t, []).append((it.wait_us, i))
            if it.blocking:
                last_block[t] = i
                last_cpu = i
        if it.stream is None:
            continue
        if it.owner is not None:
            it.deps.append(it.owner)
        prev = last_stream.get(it.stream)
        if prev is not None:
            it.deps.append(prev)
        if it.comm:
            if last_gpu is not None and items[last_gpu].stream != it.stream:
                it.deps.append(last_gpu)
            if it.sync:
                pending_sync.append(i)
        else:
            keep_sync = []
            for c in pending_sync:
                if items[c].stream != it.stream:
                    it.deps.append(c)
                else:
                    keep_sync.append(c)
            pending_sync = keep_sync
            last_gpu = i
        last_stream[it.stream] = i
    return {"thread_switch_deps": switch, "tensor_deps": tensor, "wait_deps": waited, "gpu_sync_deps": synced}
