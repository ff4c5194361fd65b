"""Repair the host ET's nesting with Kineto's clock: a node is inside its parent only if it started before the
parent ended.

The ``ExecutionTraceObserver`` gives each node the operator open on its thread when it started (``ctrl_deps``).
That bookkeeping goes wrong after a record function that opens on one thread and closes on another (gloo's
``gloo:<op>`` opens on the issuing thread and closes on its worker thread): later operators of the issuing
thread are then written as children of an operator that had already returned. Measured on
``tests/workloads/ddp_static_graph.py`` (gloo, 2 ranks): in one recording of three, rank 1's whole optimizer step
of an iteration was written under the backward's ``evaluate_function: AccumulateGrad`` that issued the
all-reduce, so it left the top-level operators (and a replay ran it inside the backward, or not at all).

Kineto times the same operators (joined by ``rf_id``, :func:`nbox_record.sources.kineto.join_host_ops`). A node whose
start is after its parent's end gets as parent the operator of its thread that started last before it and was
still running when it started (the innermost one holding it: operators of one thread nest; ``gloo:``/``nccl:``
markers are never chosen, as they end on another thread); when none is, the nearest ancestor whose span holds
its start, where an ancestor Kineto did not time (the ET's thread roots) holds anything. In a second recording
of ddp_static_graph.py the ET had also put an ``AddmmBackward0``'s ``aten::sum`` under the preceding
``AccumulateGrad``: it belongs inside that ``AddmmBackward0``'s ``evaluate_function``, not at the top level.
A node written under a ``gloo:``/``nccl:`` marker of its own thread is moved the same way (such a marker opens on
the issuing thread and closes on the worker, so its span holds whatever the issuing thread did meanwhile, and in
one ddp_static_graph recording a whole iteration was written under one). Nothing else changes: a node that starts
inside its parent stays there even if it ends after it (``gloo:`` markers do, holding their worker's operators).
Without Kineto, or when Kineto was joined by order rather than ``rf_id`` (old traces: the order join can pair an
operator with another call of the same name, e.g. PARAM's ``param_linear`` sample, where trusting it would move
43 ``aten::zero_`` out of their ``zero_grad``), nothing is repaired.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from nbox_record.sources.comms import marker_kind
from nbox_record.sources.hostet import EtNode, HostEt
from nbox_record.sources.kineto import KinetoTrace

__all__ = ["repair_nesting"]

#: How many earlier operators of its thread are searched for a node's true parent.
SCAN_BACK = 4096


def repair_nesting(et: HostEt, ev_of: dict[int, int], trace: KinetoTrace) -> tuple[HostEt, int]:
    """``et`` with every node that started after its parent's end re-parented (see the module docstring), and
    how many nodes moved. ``ev_of`` maps ET node ids to indices in ``trace.cpu``."""
    span = {nid: (trace.cpu[i].ts, trace.cpu[i].end) for nid, i in ev_of.items()}
    outside = [n for n in et.nodes.values() if n.parent is not None and n.id in span and _outside(et, span, n)]
    if not outside:
        return et, 0
    # Candidates for the true parent: timed nodes of the same thread, by start. gloo:/nccl: markers end on another
    # thread, so their spans hold operators that were never inside them.
    by_tid: dict[int, list[tuple[float, float, int]]] = {}
    for nid, (ts, end) in span.items():
        node = et.nodes[nid]
        if marker_kind(node.name) is None:
            by_tid.setdefault(node.tid, []).append((ts, end, nid))
    for rows in by_tid.values():
        rows.sort()
    starts = {tid: [r[0] for r in rows] for tid, rows in by_tid.items()}
    moved: dict[int, int | None] = {}
    for n in outside:
        start = span[n.id][0]
        rows = by_tid.get(n.tid, [])
        i = bisect.bisect_left(starts.get(n.tid, []), start) - 1
        found: int | None = None
        for ts, end, nid in reversed(rows[max(0, i - SCAN_BACK):i + 1]):  # the latest to start holding it: innermost
            if nid != n.id and ts <= start <= end:
                found = nid
                break
        moved[n.id] = found if found is not None else _ancestor_holding(et, span, n.parent, start)
    nodes = {nid: replace(n, parent=moved[nid]) if nid in moved else n for nid, n in et.nodes.items()}
    return HostEt(et.path, et.schema, et.pid, nodes), len(moved)


def _outside(et: HostEt, span: dict[int, tuple[float, float]], n: EtNode) -> bool:
    """Whether node ``n`` (timed, with a parent) was written under a parent it never ran inside: it started after
    the parent ended, or the parent is a ``gloo:``/``nccl:`` marker of its own thread (a marker's span runs on to
    the worker thread's end, so time cannot tell; its real children are the worker's, on another thread)."""
    assert n.parent is not None
    parent = et.nodes.get(n.parent)
    if parent is not None and marker_kind(parent.name) is not None and parent.tid == n.tid:
        return True
    ps = span.get(n.parent)
    return ps is not None and not ps[0] <= span[n.id][0] <= ps[1]


def _ancestor_holding(et: HostEt, span: dict[int, tuple[float, float]], parent: int | None,
                      start: float) -> int | None:
    """The nearest ancestor from ``parent`` up whose span holds ``start``, or an untimed one (a thread root)."""
    hops = 0
    p = parent
    while p is not None and (ps := span.get(p)) is not None and not ps[0] <= start <= ps[1]:
        p = et.nodes[p].parent if p in et.nodes else None
        hops += 1
        if hops > len(et.nodes):  # a parent cycle (untrusted input): leave the node where it was
            return parent
    return p
