"""One rank's Chakra trace as a replayable graph: flat lists indexed by position, dependencies as positions.

What the replay needs from each node (attribute contract: chakra-format.md, nbox's ``nbox_*`` attributes):

* ``kind``: compute (COMP, MEM_LOAD/STORE), collective (COMM_COLL), send, recv, or metadata (no time);
* ``duration_us``: the recorded duration (``duration_micros``); for an asynchronous comm node that is the
  communication's own span, and ``issue_us`` (``nbox_cpu_duration_micros``) is what issuing it cost the
  thread;
* ``gap_us``: the framework's time on the node's thread before it (``nbox_gap_micros``, from the recorder's lean
  pass, nbox_record/sources/leantiming.py; 0 without it), charged to the thread ahead of the node; ``gap_joined``
  (``nbox_gap_joined``): that gap was measured with another thread's work taken out (a CUDA backward on the
  autograd engine's thread), so it starts once that work, which the node depends on, has ended;
* ``waits_us``: the part of a host compute node's recorded duration during which its thread waited for a
  collective issued inside it (:func:`waits_inside`), already taken out of ``duration_us`` (and of
  ``profiled_us``); ``start_us``: the recorded start (``start_time_micros``, 0 when absent);
* ``lean``: whether ``duration_us`` was measured by the lean pass (the node carries
  ``nbox_profiled_duration_micros``), so the profiler correction (profiler.py) leaves it alone;
* ``resource``: what the node occupies while it runs: ``"stream:<n>"`` for GPU work (``nbox_stream``),
  ``"thread:<tid>"`` for host work (``tid``), one shared ``"thread:?"`` when a trace names neither (e.g.
  ASTRA-sim workloads, which are then replayed in node order);
* ``deps``: data and control dependencies as positions (a dependency on an id absent from the file is
  dropped and counted: ``dangling``);
* comm facts: collective name (costmodels' names), ``comm_size`` bytes, process group (``pg_name``),
  peer and tag for send/recv, all-to-all splits, and whether the issuer waits (``nbox_async``). A
  comm node without ``comm_type``/``comm_size`` is :data:`UNPRICED` (recorded duration, counted).

Nodes are kept in file order. nbox's converter writes them in recorded order (every dependency points
earlier); a trace from another tool may not, so :func:`load_rank` sorts them topologically (stable, by
position) and refuses a cycle, naming a node on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from nbox_trace.chakra import Attr, EtReader, as_int, attr_map
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import InvalidInputError

__all__ = ["COMPUTE", "COLLECTIVE", "META", "RECV", "SEND", "CommInfo", "RankGraph", "captured_iterations",
           "load_rank"]

COMPUTE, COLLECTIVE, SEND, RECV, META = 0, 1, 2, 3, 4

#: Chakra CollectiveCommType -> the emulator's collective names (costmodels).
COLLECTIVE_NAMES = {0: "all_reduce", 1: "reduce", 2: "all_gather", 3: "gather", 4: "scatter", 5: "broadcast",
                    6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter", 9: "barrier"}


class ReplayInputError(InvalidInputError):
    """A trace cannot be replayed as it is (the message names the file, node and what is wrong)."""


@dataclass(frozen=True)
class CommInfo:
    """A communication node's facts. ``nbytes`` follows comm_size's convention (nbox_record/sources/comms.py)."""

    collective: str  # costmodels name; "send_recv" for point-to-point
    nbytes: int
    pg: str  # process group name ("" = the world)
    peer: int | None = None  # send: destination; recv: source (global ranks)
    tag: int = 0
    blocking: bool = False  # the issuing thread waits for completion (a synchronous gloo collective)
    in_splits: tuple[int, ...] | None = None  # all-to-all elements per peer
    out_splits: tuple[int, ...] | None = None
    root: int | None = None


@dataclass
class RankGraph:
    """One rank's nodes, by position. See the module docstring for each list's meaning."""

    rank: int
    path: str
    ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    duration_us: list[float] = field(default_factory=list)
    issue_us: list[float] = field(default_factory=list)
    gap_us: list[float] = field(default_factory=list)
    gap_joined: list[bool] = field(default_factory=list)  # the gap starts after other host threads' work
    lean: list[bool] = field(default_factory=list)
    profiled_us: list[float] = field(default_factory=list)  # lean nodes: the profiled capture's duration
    start_us: list[float] = field(default_factory=list)  # recorded start (0: not recorded)
    waits_us: list[float] = field(default_factory=list)  # communication waits taken out of duration_us
    resource: list[int] = field(default_factory=list)  # index into resources
    resources: list[str] = field(default_factory=list)
    deps: list[tuple[int, ...]] = field(default_factory=list)
    iteration: list[int] = field(default_factory=list)
    comm: dict[int, CommInfo] = field(default_factory=dict)
    dangling: int = 0
    nodes: list[pb.Node] | None = None  # the protobuf nodes, when asked for (live replay)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def gaps_us(self) -> list[float]:
        """``gap_us``, or zeros for a graph built without it (a synthetic one)."""
        return self.gap_us if len(self.gap_us) == len(self.ids) else [0.0] * len(self.ids)

    def gap_joined_flags(self) -> list[bool]:
        """``gap_joined``, or all False for a graph built without it."""
        return self.gap_joined if len(self.gap_joined) == len(self.ids) else [False] * len(self.ids)

    def lean_flags(self) -> list[bool]:
        """``lean``, or all False for a graph built without it."""
        return self.lean if len(self.lean) == len(self.ids) else [False] * len(self.ids)

    def profiled(self) -> RankGraph:
        """A copy with every lean-timed node back at its profiled duration and no gaps (the capture as the profiler
        recorded it; nbox_record/sources/leantiming.py)."""
        if not any(self.lean_flags()):
            return self
        n = len(self.ids)
        return dataclasses.replace(self, duration_us=list(self.profiled_us), gap_us=[0.0] * n, lean=[False] * n)

    def waited_us(self) -> float:
        """The communication waits taken out of compute nodes' recorded durations (microseconds, all nodes)."""
        return sum(self.waits_us)

    def compute_us(self) -> float:
        """Recorded compute time (microseconds), the sum over compute nodes."""
        return sum(d for d, k in zip(self.duration_us, self.kind, strict=True) if k == COMPUTE)


#: A communication node without ``comm_type``/``comm_size`` (e.g. from an old Chakra converter): it cannot
#: be priced or matched across ranks, so the replay gives it its recorded duration and counts it.
UNPRICED = CommInfo("unpriced", -1, "")


def captured_iterations(g: RankGraph) -> tuple[list[int], int, bool]:
    """Each node's captured iteration (0-based), how many there are, and whether the recorder marked them.

    The recorder writes ``nbox_iteration`` = N >= 1 on the nodes of captured iteration N (from
    ``ProfilerStep#N`` or nbox's boundary markers, nbox_record/convert/toplevel.py); 0 or absent: none (the process
    group's set-up, anything before the first mark). A node belongs to the latest iteration marked at or
    before it in node order (the first for those before any mark), so iterations follow the recorded order.
    Without any mark: one iteration, ``marked`` False.
    """
    labels = sorted({it for it, k in zip(g.iteration, g.kind, strict=True) if it >= 1 and k != META})
    if not labels:
        return [0] * len(g), 1, False
    index = {label: j for j, label in enumerate(labels)}
    out, current = [], 0
    for it in g.iteration:
        j = index.get(it)
        if j is not None and j > current:
            current = j
        out.append(current)
    return out, len(labels), True


def _int(attrs: dict[str, Attr], name: str) -> int | None:
    found = attrs.get(name)
    return None if found is None else as_int(found)


def _flag(attrs: dict[str, Attr], name: str) -> bool:
    """A boolean attribute: True only for a bool true (untrusted: any other kind or value is False)."""
    found = attrs.get(name)
    return found is not None and found.value is True


def _splits(attrs: dict[str, Attr], name: str, where: str) -> tuple[int, ...] | None:
    found = attrs.get(name)
    if found is None or found.value is None:
        return None
    value: Any = found.value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ReplayInputError(f"{where}: attribute {name} is not a JSON list: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in value):
        raise ReplayInputError(f"{where}: attribute {name} must list non-negative integers, got {str(value)[:80]}")
    return tuple(value)


def _comm(node: pb.Node, attrs: dict[str, Attr], where: str) -> CommInfo:
    size = _int(attrs, "comm_size")
    if size is None or size < 0:
        size = 0 if node.type == pb.COMM_COLL_NODE and _int(attrs, "comm_type") == 9 else None
    if size is None or (node.type == pb.COMM_COLL_NODE and _int(attrs, "comm_type") not in COLLECTIVE_NAMES):
        return UNPRICED  # replayed with its recorded duration, on this rank alone, and counted
    pg_attr = attrs.get("pg_name")
    pg = str(pg_attr.value) if pg_attr is not None and pg_attr.value is not None else ""
    async_attr = attrs.get("nbox_async")
    blocking = async_attr is not None and str(async_attr.value).lower() in ("false", "0")
    if node.type == pb.COMM_COLL_NODE:
        name = COLLECTIVE_NAMES[_int(attrs, "comm_type") or 0]
        ins, outs = _splits(attrs, "nbox_in_split_sizes", where), _splits(attrs, "nbox_out_split_sizes", where)
        if name == "all_to_all" and ((ins and len(set(ins)) > 1) or (outs and len(set(outs)) > 1)):
            name = "all_to_all_v"
        return CommInfo(name, size, pg, blocking=blocking, in_splits=ins, out_splits=outs,
                        root=_int(attrs, "nbox_root"))
    peer = _int(attrs, "comm_dst" if node.type == pb.COMM_SEND_NODE else "comm_src")
    if peer is None:
        raise ReplayInputError(f"{where}: point-to-point node without "
                               f"{'comm_dst' if node.type == pb.COMM_SEND_NODE else 'comm_src'}")
    return CommInfo("send_recv", size, pg, peer=peer, tag=_int(attrs, "comm_tag") or 0, blocking=blocking)


def load_rank(path: str | os.PathLike[str], rank: int, *, keep_nodes: bool = False) -> RankGraph:
    """Read one rank's ``.et`` into a :class:`RankGraph` (streaming: the file is read once).

    Raises:
        ReplayInputError: a node the replay cannot use (the message names file and node id), or a cycle.
        TraceDecodeError, InputNotFoundError: from the codec.
    """
    g = RankGraph(rank, str(path), nodes=[] if keep_nodes else None)
    resources: dict[str, int] = {}
    raw_deps: list[list[int]] = []
    with EtReader(path) as reader:
        g.metadata = {a.name: v.value for a, v in ((a, attr_map([a])[a.name]) for a in reader.metadata.attr)}
        for node in reader:
            attrs = attr_map(node.attr)
            where = f"{path}: node {node.id} ({node.name[:60]!r})"
            if node.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                g.comm[len(g.ids)] = _comm(node, attrs, where)
                kind = {pb.COMM_COLL_NODE: COLLECTIVE, pb.COMM_SEND_NODE: SEND, pb.COMM_RECV_NODE: RECV}[node.type]
            elif node.type == pb.METADATA_NODE:
                kind = META
            else:
                kind = COMPUTE
            stream, tid = _int(attrs, "nbox_stream"), _int(attrs, "tid")
            res = f"stream:{stream}" if stream is not None else (f"thread:{tid}" if tid is not None else "thread:?")
            idx = resources.get(res)
            if idx is None:
                idx = resources[res] = len(g.resources)
                g.resources.append(res)
            issue = _int(attrs, "nbox_cpu_duration_micros")
            g.ids.append(node.id)
            g.names.append(node.name)
            g.kind.append(kind)
            g.duration_us.append(float(node.duration_micros))
            g.issue_us.append(float(issue) if issue is not None else 0.0)
            gap = _int(attrs, "nbox_gap_micros")
            g.gap_us.append(float(gap) if gap is not None and gap > 0 else 0.0)
            g.gap_joined.append(_flag(attrs, "nbox_gap_joined"))
            profiled = _int(attrs, "nbox_profiled_duration_micros")
            g.lean.append(profiled is not None)
            g.profiled_us.append(float(profiled) if profiled is not None and profiled >= 0
                                 else float(node.duration_micros))
            g.resource.append(idx)
            g.start_us.append(float(node.start_time_micros))
            g.iteration.append(_int(attrs, "nbox_iteration") or 0)
            raw_deps.append([*node.data_deps, *node.ctrl_deps])
            if g.nodes is not None:
                g.nodes.append(node)
    _link(g, raw_deps)
    _take_out_waits(g)
    return g


def waits_inside(g: RankGraph) -> list[float]:
    """Per node, how long its thread waited inside it for collectives issued inside it (microseconds).

    A framework hook that runs inside an operator can issue a collective and wait for it before the operator
    returns: FSDP2's pre-backward hook unshards a block (issues its all-gather, waits) inside autograd's
    ``evaluate_function: AddmmBackward0``, its post-backward issues the reduce-scatter and waits inside
    ``evaluate_function: RegisterPostBackwardFunction``. The profiler times the operator with the wait in it,
    and the converter orders the collective after the operator (its thread's previous node), so a replay
    that played the recorded duration would count the communication twice: once as the operator's compute
    and again as the modeled collective that follows it (how much: docs/design/profiler-correction.md).

    The rule: a collective on a host thread whose recorded span ``[start, start + duration]`` lies inside
    the span of a compute node on the same thread that it depends on (the operator it was issued in, which
    outlived it) counts that span as waited in the operator; several collectives in one operator count their
    union. The operator may have computed between the issue and its wait: that time is taken out too (the
    trace does not say when the wait began); the collective issued inside an operator that returns before it
    completes (DDP's bucket all-reduce from a gradient hook) is not waited in it and counts nothing. Lean-timed
    nodes are left alone (the lean pass timed them in other iterations). Nodes without recorded starts
    (``start_time_micros`` 0, e.g. a synthetic trace) count nothing.
    """
    n = len(g)
    spans: dict[int, list[tuple[float, float]]] = {}
    lean = g.lean_flags()
    starts = g.start_us if len(g.start_us) == n else [0.0] * n
    for c, info in g.comm.items():
        if info is UNPRICED or not g.resources[g.resource[c]].startswith("thread:"):
            continue
        c_start = starts[c]
        c_end = c_start + g.duration_us[c]
        if c_start <= 0 or c_end <= c_start:
            continue
        for i in g.deps[c]:
            if g.kind[i] != COMPUTE or g.resource[i] != g.resource[c] or lean[i] or starts[i] <= 0:
                continue
            if starts[i] <= c_start and c_end <= starts[i] + g.duration_us[i]:
                spans.setdefault(i, []).append((c_start, c_end))
    out = [0.0] * n
    for i, found in spans.items():
        total, reach = 0.0, -math.inf
        for s, e in sorted(found):
            lo = max(s, reach)
            if e > lo:
                total += e - lo
                reach = e
        out[i] = min(total, g.duration_us[i])
    return out


def _take_out_waits(g: RankGraph) -> None:
    """Take :func:`waits_inside` out of the compute nodes' durations (and their profiled durations)."""
    waits = waits_inside(g)
    g.waits_us = waits
    for i, w in enumerate(waits):
        if w > 0:
            g.duration_us[i] = max(0.0, g.duration_us[i] - w)
            g.profiled_us[i] = max(0.0, g.profiled_us[i] - w)


def _link(g: RankGraph, raw_deps: list[list[int]]) -> None:
    """Turn dependency ids into positions; reorder topologically when a dependency points forward."""
    pos = {node_id: i for i, node_id in enumerate(g.ids)}
    if len(pos) != len(g.ids):
        seen: set[int] = set()
        dup = next(i for i in g.ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ReplayInputError(f"{g.path}: node id {dup} appears twice")
    forward = False
    deps: list[tuple[int, ...]] = []
    for i, ids in enumerate(raw_deps):
        resolved = []
        for d in ids:
            j = pos.get(d)
            if j is None:
                g.dangling += 1
            elif j == i:
                continue  # a self-dependency (seen in old Chakra converters): meaningless, dropped
            else:
                resolved.append(j)
                forward |= j > i
        deps.append(tuple(dict.fromkeys(resolved)))
    g.deps = deps
    if forward:
        _toposort(g)


def _toposort(g: RankGraph) -> None:
    n = len(g.ids)
    indeg = [len(d) for d in g.deps]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(g.deps):
        for j in ds:
            users[j].append(i)
    import heapq

    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise ReplayInputError(f"{g.path}: the dependencies form a cycle through node id {g.ids[stuck]}")
    new_pos = {old: new for new, old in enumerate(order)}
    for name in ("ids", "names", "kind", "duration_us", "issue_us", "gap_us", "gap_joined", "lean", "profiled_us",
                 "resource", "iteration", "start_us"):
        old_list = getattr(g, name)
        setattr(g, name, [old_list[i] for i in order])
    g.deps = [tuple(new_pos[j] for j in g.deps[i]) for i in order]
    g.comm = {new_pos[i]: c for i, c in g.comm.items()}
    if g.nodes is not None:
        g.nodes = [g.nodes[i] for i in order]
