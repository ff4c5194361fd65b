"""Read a Kineto (``torch.profiler``) Chrome trace and join it with the host ET.

What is kept from the trace:

* CPU events (``cat`` ``cpu_op`` / ``user_annotation``): name, thread, start, duration, and the keys
  that join them to host-ET nodes: ``args["Record function id"]`` (== ET ``rf_id``, PyTorch >= 2.3)
  and ``args["External id"]``;
* GPU work (``kernel``, ``gpu_memcpy``, ``gpu_memset``): name, stream, start, duration and
  ``args["correlation"]``, which equals the correlation of the CUDA runtime/driver call that launched
  it (``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaMemcpyAsync``...; ``cat`` ``cuda_runtime`` /
  ``cuda_driver``);
* ``distributedInfo`` (rank, world size) when present;
* ``deviceProperties``: the model name of each GPU the profiler saw (:attr:`KinetoTrace.device_names`).

Times are microseconds. When the trace has ``baseTimeNanoseconds`` (newer Kineto), event ``ts`` are
relative to it and it is added, so every time here is absolute (Unix epoch, microseconds).

Joining (:func:`join_host_ops`): by ``rf_id`` when the trace carries ``Record function id``; older
traces (e.g. the Megatron sample) do not, and are aligned by order instead: host-ET nodes in start
order against CPU events in ``External id`` order, matching equal names within a window (the ET and
Kineto see the same operators in the same order, Kineto a few more annotations). Malformed events
are skipped and counted, never fatal; a malformed file is.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbox_record.sources.hostet import EtNode
from nbox_trace.errors import InvalidInputError
from nbox_trace.jsonio import DEFAULT_MAX_JSON_BYTES, load_json

CPU_CATS = frozenset({"cpu_op", "user_annotation"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: Runtime calls after which the host has waited for the GPU.
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy"})
#: How far ahead (in CPU events) the order-based join looks for the next event of the same name.
ORDER_JOIN_WINDOW = 256


@dataclass(frozen=True)
class CpuEvent:
    name: str
    cat: str
    thread: tuple[str, str]  # (pid, tid) as text: Kineto writes numbers or labels
    ts: float  # absolute, us
    dur: float
    rf_id: int | None
    ext_id: int | None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class GpuOp:
    name: str
    cat: str
    stream: int
    ts: float
    dur: float
    correlation: int | None


@dataclass(frozen=True)
class Launch:
    name: str
    thread: tuple[str, str]
    ts: float
    correlation: int


@dataclass
class KinetoTrace:
    path: Path
    cpu: list[CpuEvent]
    gpu: list[GpuOp]
    launches: dict[int, Launch]  # by correlation
    syncs: list[Launch]  # host calls that wait for the GPU (SYNC_CALLS)
    rank: int | None
    world_size: int | None
    skipped: int  # malformed events ignored
    device_names: tuple[str, ...] = ()  # ``deviceProperties``: each listed GPU's model name, in order


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_kineto(path: str | Path, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> KinetoTrace:
    """Read one Kineto trace (plain or gzip JSON); see the module docstring.

    Raises:
        InputNotFoundError: no such file.
        InvalidInputError: not JSON, over the cap, or not a Chrome trace (no ``traceEvents`` list).
    """
    p = Path(path)
    data = load_json(p, max_bytes=max_bytes, what="Kineto trace")
    if isinstance(data, list):
        events: Any = data
        data = {}
    elif isinstance(data, dict):
        events = data.get("traceEvents")
    else:
        raise InvalidInputError(f"{p}: not a Kineto trace: top level is a {type(data).__name__}")
    if not isinstance(events, list):
        raise InvalidInputError(f"{p}: not a Kineto trace: no 'traceEvents' list")
    base_ns = _opt_int(data.get("baseTimeNanoseconds"))
    base = base_ns / 1000 if base_ns is not None and base_ns > 0 else 0.0
    info = data.get("distributedInfo")
    rank = world = None
    if isinstance(info, dict):
        rank, world = _opt_int(info.get("rank")), _opt_int(info.get("world_size"))
    cpu: list[CpuEvent] = []
    gpu: list[GpuOp] = []
    launches: dict[int, Launch] = {}
    syncs: list[Launch] = []
    skipped = 0
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if cat not in CPU_CATS and cat not in GPU_CATS and cat not in LAUNCH_CATS:
            continue
        ts, dur, name = _num(ev.get("ts")), _num(ev.get("dur")), ev.get("name")
        args = ev.get("args")
        if ts is None or dur is None or dur < 0 or not isinstance(name, str):
            skipped += 1
            continue
        args = args if isinstance(args, dict) else {}
        thread = (str(ev.get("pid")), str(ev.get("tid")))
        if cat in CPU_CATS:
            cpu.append(CpuEvent(name, cat, thread, ts + base, dur, _opt_int(args.get("Record function id")),
                                _opt_int(args.get("External id"))))
        elif cat in GPU_CATS:
            stream = _opt_int(args.get("stream"))
            if stream is None:
                stream = _opt_int(ev.get("tid"))
            if stream is None:
                skipped += 1
                continue
            gpu.append(GpuOp(name, cat, stream, ts + base, dur, _opt_int(args.get("correlation"))))
        else:
            corr = _opt_int(args.get("correlation"))
            if corr is not None:
                launches.setdefault(corr, Launch(name, thread, ts + base, corr))
            if name in SYNC_CALLS:
                syncs.append(Launch(name, thread, ts + base, corr if corr is not None else -1))
    props = data.get("deviceProperties")
    names = tuple(str(d["name"])[:200] for d in props if isinstance(d, dict) and isinstance(d.get("name"), str)) \
        if isinstance(props, list) else ()
    return KinetoTrace(p, cpu, gpu, launches, syncs, rank, world, skipped, names)


def join_host_ops(nodes: Iterable[EtNode], trace: KinetoTrace) -> tuple[dict[int, int], str]:
    """Map host-ET node ids to indices of ``trace.cpu``: ``(mapping, method)``.

    ``method`` is ``"rf_id"`` or ``"order"`` (see the module docstring). ``nodes`` must be in start
    order for the order join. A pair is made only when the names agree.
    """
    if any(ev.rf_id is not None for ev in trace.cpu):
        by_rf: dict[int, int] = {}
        for i, ev in enumerate(trace.cpu):
            if ev.rf_id is not None:
                by_rf.setdefault(ev.rf_id, i)
        out: dict[int, int] = {}
        for node in nodes:
            j = by_rf.get(node.rf_id) if node.rf_id > 0 else None
            if j is not None and trace.cpu[j].name == node.name:
                out[node.id] = j
        return out, "rf_id"
    order = sorted(range(len(trace.cpu)),
                   key=lambda i: (trace.cpu[i].ext_id if trace.cpu[i].ext_id is not None else -1, trace.cpu[i].ts))
    positions: dict[str, list[int]] = {}
    for pos, i in enumerate(order):
        positions.setdefault(trace.cpu[i].name, []).append(pos)
    out = {}
    cursor = 0
    for node in nodes:
        cands = positions.get(node.name)
        if not cands:
            continue
        k = bisect.bisect_left(cands, cursor)
        if k < len(cands) and cands[k] - cursor <= ORDER_JOIN_WINDOW:
            out[node.id] = order[cands[k]]
            cursor = cands[k] + 1
    return out, "order"


def enclosing_events(trace: KinetoTrace, points: list[tuple[tuple[str, str], float]],
                     joined: set[int]) -> list[int | None]:
    """For each ``(thread, ts)`` point, the innermost CPU event in ``joined`` whose span holds it.

    ``joined`` are indices of ``trace.cpu`` matched to host-ET nodes; one sweep per thread with a
    stack of open events (spans are nested, as RecordFunction scopes are).
    """
    out: list[int | None] = [None] * len(points)
    by_thread: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for k, (thread, ts) in enumerate(points):
        by_thread.setdefault(thread, []).append((ts, k))
    spans: dict[tuple[str, str], list[int]] = {}
    for ci in joined:
        spans.setdefault(trace.cpu[ci].thread, []).append(ci)
    cpu = trace.cpu
    for thread, items in by_thread.items():
        events = sorted(spans.get(thread, []), key=lambda c: (cpu[c].ts, -cpu[c].dur))
        items.sort()
        stack: list[int] = []
        nxt = 0
        for ts, k in items:
            while nxt < len(events) and cpu[events[nxt]].ts <= ts:
                start = cpu[events[nxt]].ts
                while stack and cpu[stack[-1]].end < start:
                    stack.pop()
                stack.append(events[nxt])
                nxt += 1
            while stack and cpu[stack[-1]].end < ts:
                stack.pop()
            if stack:
                out[k] = stack[-1]
    return out


def launching_events(trace: KinetoTrace, joined: set[int]) -> dict[int, int]:
    """For each GPU op (index into ``trace.gpu``), the innermost joined CPU event enclosing its launch.

    The launch is the runtime/driver call with the op's correlation id (see :func:`enclosing_events`).
    """
    ops: list[int] = []
    points: list[tuple[tuple[str, str], float]] = []
    for gi, op in enumerate(trace.gpu):
        launch = trace.launches.get(op.correlation) if op.correlation is not None else None
        if launch is not None:
            ops.append(gi)
            points.append((launch.thread, launch.ts))
    found = enclosing_events(trace, points, joined)
    return {gi: ci for gi, ci in zip(ops, found, strict=True) if ci is not None}
