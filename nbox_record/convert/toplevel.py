"""Pick the nodes of a host ET that become Chakra nodes: top-level operators and collectives.

A **top-level operator** is an operator whose parent chain up to the thread root holds no other
operator: ``aten::linear`` is one, its children ``aten::t``/``aten::addmm`` are not;
``autograd::engine::evaluate_function: ...`` nodes (the backward's units) are. Not operators, so
looked *into*: the ET's bookkeeping nodes (``[pytorch|profiler|execution_trace|...]``),
``ProfilerStep#N`` (its N becomes the iteration of what it holds), ``record_function`` annotations
(USER_SCOPE, no op schema: ``DistributedDataParallel.forward``, ``Optimizer.step#SGD.step``; their
names become the annotation path), and ``record_param_comms`` nodes that are not collectives (the
``wait`` ones).

A **collective** is a ``c10d::<op>`` / ``_c10d_functional::<op>`` collective operator, or a
``record_param_comms`` naming a collective outside any such operator, wherever it sits, even inside
a top-level operator (DDP issues its gradient all-reduce inside ``evaluate_function:
AccumulateGrad``; Megatron inside ``_ReduceFromModelParallelRegion``). Inside it: the outermost
``record_param_comms`` that names a collective (a barrier implemented as an all-reduce records both;
the outer one is the collective) and the ``nccl:``/``gloo:`` markers. A marker outside any
collective (gloo writes ``gloo:<op>`` when the work completes, under whatever is open then) is
given to the latest earlier collective of its kind by :func:`link_loose_markers`.

``## process_group:init ##`` nodes are collected wherever they are. Iterations: ``ProfilerStep#N``
gives N; without it, nbox's own boundary markers (:data:`BOUNDARY_MARKER`, one at the start of the
capture and one after each iteration) number them from 1 (0: before the first marker). The walk is
iterative.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from nbox_record.handoff import BOUNDARY_MARKER, parse_identity_marker
from nbox_record.sources import RPC_NAME, USER_SCOPE, EtNode, HostEt, collective_kind, marker_kind
from nbox_trace.contract import PG_INIT_NODE

BOOKKEEPING = "[pytorch|profiler|execution_trace|"
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_EVALUATE = "autograd::engine::evaluate_function:"
#: How many earlier collectives a loose marker is compared with.
_MARKER_LOOKBACK = 64


@dataclass
class Collective:
    """One collective: its c10d op (or lone record_param_comms), and what was found inside it."""

    node: EtNode
    kind: str
    top: int | None  # the top-level operator it was issued in, if any
    iteration: int | None
    in_op: bool = False  # issued from inside another dispatcher operator (an ancestor has an op schema)
    rpc: EtNode | None = None
    markers: list[EtNode] = field(default_factory=list)
    identity: tuple[str, int, str] | None = None  # (pg_name, log seq, op) of nbox's identity marker inside it


@dataclass
class Walk:
    """What :func:`walk` found; ``owner`` maps every node inside a chosen one to the chosen one's id."""

    tops: list[EtNode] = field(default_factory=list)
    anchors: list[Collective] = field(default_factory=list)
    pg_nodes: list[EtNode] = field(default_factory=list)
    loose_markers: list[EtNode] = field(default_factory=list)
    owner: dict[int, int] = field(default_factory=dict)  # ET id -> ET id of the top op / anchor holding it
    iteration: dict[int, int] = field(default_factory=dict)
    annotation: dict[int, str] = field(default_factory=dict)
    boundaries: list[int] = field(default_factory=list)  # start orders of nbox's iteration-boundary markers
    identity_markers: list[EtNode] = field(default_factory=list)  # nbox::collective/... (commlog)
    identity_context: dict[int, int | None] = field(default_factory=dict)  # marker id -> enclosing anchor index
    visited: int = 0


def _is_annotation(n: EtNode) -> bool:
    return n.scope == USER_SCOPE and not n.op_schema and not n.name.startswith(_EVALUATE)


def walk(et: HostEt) -> Walk:
    """Classify every node reachable from the roots; see the module docstring."""
    w = Walk()
    # (node id, top op, anchor index, inside a record_param_comms, iteration, annotation path,
    #  inside an operator with a schema)
    stack: list[tuple[int, int | None, int | None, bool, int | None, str, bool]] = [
        (r, None, None, False, None, "", False) for r in reversed(et.roots())]
    while stack:
        nid, top, anchor, in_rpc, iteration, annotation, in_op = stack.pop()
        n = et.nodes[nid]
        w.visited += 1
        name = n.name
        if name.startswith(BOOKKEEPING):
            pass
        elif name == PG_INIT_NODE:
            w.pg_nodes.append(n)
            continue
        elif parse_identity_marker(name) is not None:
            # given to its collective by start order (_attach_identities), not nesting; transparent otherwise:
            # what the redispatch opened inside it (gloo:/nccl: markers, record_param_comms) belongs to the
            # collective, and is walked in the enclosing one's context (moved by _attach_identities if it differs)
            w.identity_markers.append(n)
            w.identity_context[nid] = anchor
            if anchor is not None:
                w.owner[nid] = w.anchors[anchor].node.id
        elif name == BOUNDARY_MARKER:
            w.boundaries.append(n.order)
            continue
        elif anchor is not None and not (name.startswith("c10d::") and w.anchors[anchor].node.name.startswith(
                "c10d::") and collective_kind(n) is not None):
            # (a c10d op inside a c10d op is the ET observer's misnesting, never one collective: its own anchor)
            a = w.anchors[anchor]
            w.owner[nid] = a.node.id
            if name == RPC_NAME:
                if not in_rpc and a.rpc is None and collective_kind(n) is not None:
                    a.rpc = n
                in_rpc = True
            elif marker_kind(name) is not None:
                a.markers.append(n)
        elif (kind := collective_kind(n)) is not None:
            a = Collective(n, kind, top, iteration, in_op)
            if name == RPC_NAME:
                a.rpc = n
                in_rpc = True
            anchor = len(w.anchors)
            w.anchors.append(a)
            w.owner[nid] = nid
        elif marker_kind(name) is not None:
            if top is None:
                w.loose_markers.append(n)
            else:
                w.owner[nid] = top
        elif top is not None:
            w.owner[nid] = top
        elif (step := _PROFILER_STEP.match(name)) is not None:
            iteration = int(step.group(1))
        elif name == RPC_NAME:  # a "wait" or an unknown record_param_comms: not an operator, look inside
            pass
        elif _is_annotation(n):
            annotation = f"{annotation}/{name}" if annotation else name
        else:
            w.tops.append(n)
            w.owner[nid] = nid
            top = nid
            if iteration is not None:
                w.iteration[nid] = iteration
            if annotation:
                w.annotation[nid] = annotation
        in_op = in_op or bool(n.op_schema)
        for child in reversed(et.children(nid)):
            stack.append((child, top, anchor, in_rpc, iteration, annotation, in_op))
    if w.boundaries and not w.iteration and not any(a.iteration is not None for a in w.anchors):
        _iterations_from_boundaries(w)
    _attach_identities(w)
    return w


def _attach_identities(w: Walk) -> None:
    """Give each identity marker to the ``c10d::`` collective it was opened in: the latest one to start before it
    on its thread (``commlog`` opens the marker right after the op's own record function, before any other
    collective on that thread can start). The ET observer's nesting cannot decide this: it sometimes hangs a
    marker, and the next collective, under an earlier collective (issue 16: 2 recordings in 20 diverged)."""
    by_tid: dict[int, list[Collective]] = {}
    for a in w.anchors:
        if a.node.name.startswith("c10d::"):
            by_tid.setdefault(a.node.tid, []).append(a)
    for anchors in by_tid.values():
        anchors.sort(key=lambda a: a.node.order)
    orders = {tid: [a.node.order for a in anchors] for tid, anchors in by_tid.items()}
    for m in sorted(w.identity_markers, key=lambda n: n.order):
        ident = parse_identity_marker(m.name)
        i = bisect.bisect_left(orders.get(m.tid, []), m.order) - 1
        if ident is None or i < 0:
            continue  # no collective started before it on its thread: the join names the record as absent
        a = by_tid[m.tid][i]
        if a.identity is None:
            a.identity = ident
            w.owner[m.id] = a.node.id
            ctx = w.identity_context.get(m.id)
            if ctx is not None and w.anchors[ctx] is not a:
                _rehome(w, w.anchors[ctx], a, m.id)


def _rehome(w: Walk, wrong: Collective, right: Collective, marker_id: int) -> None:
    """Move what the walk gave ``wrong`` from under identity marker ``marker_id`` (its gloo:/nccl: markers, its
    record_param_comms) to ``right``, the collective the marker names."""
    mine = [m for m in wrong.markers if m.parent == marker_id]
    if mine:
        wrong.markers = [m for m in wrong.markers if m.parent != marker_id]
        right.markers.extend(mine)
        for m in mine:
            w.owner[m.id] = right.node.id
    if wrong.rpc is not None and wrong.rpc.parent == marker_id and right.rpc is None:
        right.rpc, wrong.rpc = wrong.rpc, None
        w.owner[right.rpc.id] = right.node.id


def _iterations_from_boundaries(w: Walk) -> None:
    """Without ``ProfilerStep#N``: iteration k (from 1) is what started after the k-th boundary marker."""
    marks = sorted(w.boundaries)
    for n in w.tops:
        w.iteration[n.id] = bisect.bisect_left(marks, n.order)
    for a in w.anchors:
        a.iteration = bisect.bisect_left(marks, a.node.order)


def link_loose_markers(w: Walk) -> None:
    """Give each top-level ``gloo:``/``nccl:`` marker to the latest earlier collective of its kind."""
    anchors = sorted(w.anchors, key=lambda a: a.node.order)
    orders = [a.node.order for a in anchors]
    for m in sorted(w.loose_markers, key=lambda n: n.order):
        kind = marker_kind(m.name)
        last = bisect.bisect_left(orders, m.order) - 1
        for i in range(last, max(-1, last - _MARKER_LOOKBACK), -1):
            a = anchors[i]
            if not a.markers and (kind in (a.kind, "UNKNOWN")):
                a.markers.append(m)
                break


def op_namespace(op_schema: str) -> str:
    """The namespace of a schema ``ns::op.overload(...) -> ...`` ("" when there is no schema)."""
    head = op_schema.split("(", 1)[0]
    return head.split("::", 1)[0].strip() if "::" in head else ""


def runnable_descendants(et: HostEt, w: Walk, top: EtNode, namespace: str = "aten") -> list[EtNode]:
    """The outermost ``namespace`` operators under ``top``, in execution (start) order.

    Looks through what has no schema or another namespace's (``autograd::engine::evaluate_function``
    wrappers, ``fsdp::`` ops, annotations); never into a collective hoisted out of ``top`` (its nodes
    are owned by the collective, not by ``top``), never under an operator it lists. Iterative.
    """
    out: list[EtNode] = []
    stack = list(reversed(et.children(top.id)))
    while stack:
        n = et.nodes[stack.pop()]
        if w.owner.get(n.id) != top.id:
            continue
        if op_namespace(n.op_schema) == namespace:
            out.append(n)
            continue
        stack.extend(reversed(et.children(n.id)))
    return out
