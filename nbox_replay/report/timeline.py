"""Per-rank timelines of a virtual replay as Chrome/Perfetto trace-event JSON (open in ui.perfetto.dev).

One file per replayed rank, ``rank<r>.<label>.json``, in the JSON object format of the Trace Event Format
(``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``); ``ts`` and ``dur`` are
microseconds of virtual time, counted from the start of the last repetition (the one
:class:`~nbox_replay.virtual.engine.RankResult` keeps node times for; ``otherData.offset_us`` is that start).

Tracks (``pid`` = the rank, one ``tid`` per track, named by ``"M"`` metadata events):

* one **compute track** per thread/stream resource of the graph (``tid`` 1, 2, ...): a complete event
  (``"X"``) per compute node with its name, node id, recorded and replayed duration (us); comm nodes
  appear there as their issue (``issue: <name>``: the time issuing cost the thread; a blocking one spans
  to its completion);
* one **communication track** per process group (``tid`` 1001, 1002, ...; point-to-point pairs get one
  each): the modeled span of each collective, from the emulator's answer start to its end, with the
  collective, bytes, algorithm, retargeting rule and sequence number;
* **flow arrows** (``"s"`` at the comm node's issue, or at its modeled span when issuing took no time,
  ``"f"`` with ``bp: "e"`` at the start of the node that waited for it, per :attr:`RankResult.waited_on`),
  so the UI draws "this compute waited for that all-reduce".

Which answer belongs to which node is derived as the replay assigns them: a rank's priced collectives
on one process group take sequence numbers 0, 1, 2, ... in node order, repetition after repetition
(send/recv per (source, destination, tag)), so the last repetition's comm nodes hold the last numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbox_replay.inputs import COLLECTIVE, COMPUTE, META, RECV, SEND, RankGraph
from nbox_replay.virtual import CollectiveAnswer, RankResult, SimResult
from nbox_trace.errors import OutputWriteError
from nbox_trace.files import write_atomic

__all__ = ["TimelineWriteError", "answers_by_node", "rank_timeline", "write_timelines"]

#: ``tid`` of the first communication track (compute tracks count from 1).
COMM_TID_BASE = 1001


class TimelineWriteError(OutputWriteError):
    """A timeline file could not be written (exit code 5, like every output error)."""


def _comm_key(g: RankGraph, i: int) -> str | None:
    """The replay's matching key (process group, or ``p2p:src->dst:tag``) of comm node ``i``; None if unpriced."""
    comm = g.comm[i]
    if comm.collective == "unpriced":
        return None
    if comm.collective == "send_recv":
        peer = comm.peer if comm.peer is not None else -1
        src, dst = (g.rank, peer) if g.kind[i] == SEND else (peer, g.rank)
        return f"p2p:{src}->{dst}:{comm.tag}"
    return comm.pg


def answers_by_node(result: SimResult, g: RankGraph) -> dict[int, CollectiveAnswer]:
    """Node position -> the collective answer of that comm node in the last repetition (see module docstring).

    Nodes whose answer is not in ``result`` (unpriced comm nodes, or a result of another graph) are left out.
    """
    rank_result = result.ranks.get(g.rank)
    reps = len(rank_result.iteration_us) if rank_result is not None else 1
    answers = {(a.pg, a.seq): a for a in result.collectives}
    per_key: dict[str, list[int]] = {}
    for i in sorted(g.comm):
        key = _comm_key(g, i)
        if key is not None:
            per_key.setdefault(key, []).append(i)
    out: dict[int, CollectiveAnswer] = {}
    for key, nodes in per_key.items():
        first = (max(reps, 1) - 1) * len(nodes)
        for k, i in enumerate(nodes):
            ans = answers.get((key, first + k))
            if ans is not None:
                out[i] = ans
    return out


def _finite(x: float) -> bool:
    return math.isfinite(x)


def rank_timeline(result: SimResult, g: RankGraph, *, label: str = "") -> dict[str, Any]:
    """One rank's trace-event document (a dict ready for :func:`json.dumps`; see the module docstring).

    Raises:
        KeyError: ``g.rank`` was not replayed in ``result``.
    """
    rr: RankResult = result.ranks[g.rank]
    pid = g.rank
    offset = sum(rr.iteration_us[:-1]) if rr.iteration_us else 0.0
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {g.rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": g.rank}},
    ]
    for idx, res in enumerate(g.resources):
        tid = idx + 1
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"compute {res}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    answers = answers_by_node(result, g)
    comm_tids: dict[str, int] = {}
    for i in sorted(g.comm):
        key = _comm_key(g, i)
        if key is not None and key not in comm_tids:
            tid = COMM_TID_BASE + len(comm_tids)
            comm_tids[key] = tid
            name = key if key.startswith("p2p:") else f"comm pg {key or '(world)'}"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
    starts, ends = rr.start_us, rr.end_us
    n = min(len(g), len(starts), len(ends))
    for i in range(n):
        k = g.kind[i]
        s, e = starts[i], ends[i]
        if k == META or not _finite(s):
            continue
        tid = g.resource[i] + 1
        if k == COMPUTE:
            if not _finite(e):
                continue
            events.append({"ph": "X", "name": g.names[i], "cat": "compute", "pid": pid, "tid": tid,
                           "ts": s - offset, "dur": max(0.0, e - s),
                           "args": {"node_id": g.ids[i], "recorded_us": g.duration_us[i], "replayed_us": e - s,
                                    "iteration": g.iteration[i]}})
            continue
        if not COLLECTIVE <= k <= RECV:
            continue
        comm = g.comm[i]
        ans = answers.get(i)
        issue_end = rr.issue_end_us.get(i, s)
        thread_end = e if comm.blocking and _finite(e) else issue_end
        if ans is None:  # unpriced: its recorded duration on the thread
            thread_end = e if _finite(e) else s
        events.append({"ph": "X", "name": f"issue: {g.names[i]}", "cat": "comm_issue", "pid": pid, "tid": tid,
                       "ts": s - offset, "dur": max(0.0, thread_end - s),
                       "args": {"node_id": g.ids[i], "collective": comm.collective, "pg": comm.pg,
                                "blocking": comm.blocking, "issue_us": g.issue_us[i],
                                "priced": ans is not None}})
        if ans is None:
            continue
        key = _comm_key(g, i)
        assert key is not None
        events.append({"ph": "X", "name": f"{ans.collective} #{ans.seq}", "cat": "comm", "pid": pid,
                       "tid": comm_tids[key], "ts": ans.start_us - offset, "dur": ans.end_us - ans.start_us,
                       "args": {"node_id": g.ids[i], "collective": ans.collective, "bytes": ans.nbytes,
                                "algorithm": ans.algorithm, "rule": ans.rule, "pg": ans.pg, "seq": ans.seq,
                                "modeled_us": ans.end_us - ans.start_us, "issued_at_us": s - offset}})
    flow = 0
    for waiter, comm_node in sorted(rr.waited_on.items()):
        if not (0 <= waiter < n and 0 <= comm_node < n):
            continue
        ws, ce = starts[waiter], ends[comm_node]
        if not (_finite(ws) and _finite(ce)) or ws != ce:  # a wait of an earlier repetition, not this one
            continue
        fid = (g.rank << 32) | flow
        flow += 1
        src_tid, src_ts = g.resource[comm_node] + 1, starts[comm_node]
        ans = answers.get(comm_node)
        key = _comm_key(g, comm_node) if comm_node in g.comm else None
        if rr.issue_end_us.get(comm_node, src_ts) <= src_ts and ans is not None and key is not None:
            src_tid, src_ts = comm_tids[key], ans.start_us  # a zero-length issue: start at the modeled span
        events.append({"ph": "s", "name": "waits for", "cat": "wait", "id": fid, "pid": pid,
                       "tid": src_tid, "ts": src_ts - offset})
        events.append({"ph": "f", "bp": "e", "name": "waits for", "cat": "wait", "id": fid, "pid": pid,
                       "tid": g.resource[waiter] + 1, "ts": ws - offset})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "nbox replay (virtual time)", "rank": g.rank, "label": label,
                      "world_size": result.world_size, "offset_us": offset,
                      "iteration_us": list(rr.iteration_us), "trace": g.path},
    }


def write_timelines(result: SimResult, graphs: Mapping[int, RankGraph], out_dir: Path, *, label: str) -> list[Path]:
    """Write ``out_dir/rank<r>.<label>.json`` for every rank replayed in ``result`` (sorted by rank).

    Each file is written to a temporary name and renamed. Returns the paths written.

    Raises:
        TimelineWriteError: ``out_dir`` cannot be created or a file cannot be written; or ``label`` would
            leave the folder (contains a path separator).
    """
    if not label or "/" in label or "\\" in label or label in (".", ".."):
        raise TimelineWriteError(f"timeline label {label!r} must be a non-empty file-name part without '/'")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TimelineWriteError(f"{out_dir}: cannot create the timeline folder: {e}") from None
    written = []
    for rank in sorted(result.ranks):
        g = graphs.get(rank)
        if g is None:
            continue
        doc = rank_timeline(result, g, label=label)
        path = out_dir / f"rank{rank}.{label}.json"
        write_atomic(path, json.dumps(doc, allow_nan=False, separators=(",", ":")), error=TimelineWriteError)
        written.append(path)
    return written
