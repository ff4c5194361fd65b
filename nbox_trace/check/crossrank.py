"""Cross-rank checks: each process group's collective sequence must match on its member ranks (a mismatch is what
hangs a replay), and point-to-point sends must meet receives.
"""

from __future__ import annotations

from collections import defaultdict

from nbox_trace.check.report import CollOp, P2POp, Problem, RankReport
from nbox_trace.contract import comm_type_name


def check_cross_rank(reports: list[RankReport], groups: dict[str, list[int] | None]) -> list[Problem]:
    """Collective sequences per process group must match on member ranks; p2p sends must meet receives."""
    problems: list[Problem] = []
    present = {r.rank: r for r in reports}
    used: dict[str, set[int]] = defaultdict(set)
    for r in reports:
        for pg in r.coll_seq:
            used[pg].add(r.rank)
    for pg in sorted(used):
        if pg in groups:
            declared = groups[pg]
            members = sorted(present) if declared is None else sorted(declared)
        else:
            members = sorted(used[pg])
        for rank in sorted(used[pg] - set(members)):
            problems.append(Problem("pg-membership", "error",
                                    f"rank {rank} issues collectives on process group {pg!r}, whose members are "
                                    f"{members}", rank))
        ranks_here = [m for m in members if m in present]
        if len(ranks_here) < 2:
            continue
        ref_rank = ranks_here[0]
        ref = present[ref_rank].coll_seq.get(pg, [])
        for other in ranks_here[1:]:
            msg = _first_divergence(ref, present[other].coll_seq.get(pg, []), ref_rank, other)
            if msg is not None:
                text, node_id = msg
                problems.append(Problem("collective-mismatch", "error",
                                        f"process group {pg!r} (ranks {members}): {text}", other, node_id))
    problems.extend(_check_p2p_pairs(present))
    return problems


def _describe(op: CollOp) -> str:
    return f"{comm_type_name(op.comm_type)} of {op.size} B (node id {op.node_id})"


def _first_divergence(a: list[CollOp], b: list[CollOp], ra: int, rb: int) -> tuple[str, int | None] | None:
    for i in range(min(len(a), len(b))):
        x, y = a[i], b[i]
        if x.comm_type != y.comm_type or (x.size != y.size and not (x.split or y.split)):
            return (f"collective #{i} differs: rank {ra} has {_describe(x)}, rank {rb} has {_describe(y)}",
                    y.node_id)
    if len(a) != len(b):
        i = min(len(a), len(b))
        longer, ra_, rb_ = (a, ra, rb) if len(a) > len(b) else (b, rb, ra)
        return (f"collective #{i}: rank {ra_} has {_describe(longer[i])}, rank {rb_} has none "
                f"(rank {ra} issues {len(a)}, rank {rb} issues {len(b)})", longer[i].node_id)
    return None


def _check_p2p_pairs(present: dict[int, RankReport]) -> list[Problem]:
    sent: dict[tuple[int, int, int], list[P2POp]] = defaultdict(list)
    received: dict[tuple[int, int, int], list[P2POp]] = defaultdict(list)
    for r in present.values():
        for kind, op in r.p2p:
            (sent if kind == "send" else received)[(op.src, op.dst, op.tag)].append(op)
    problems: list[Problem] = []
    for key in sorted(set(sent) | set(received)):
        src, dst, tag = key
        if src not in present or dst not in present:
            continue  # the other end is not in this trace set
        snd, rcv = sent.get(key, []), received.get(key, [])
        for i in range(max(len(snd), len(rcv))):
            if i >= len(snd) or i >= len(rcv) or snd[i].size != rcv[i].size:
                if i >= len(snd):
                    text = f"rank {dst} receives message #{i} (node id {rcv[i].node_id}) that rank {src} never sends"
                    rank, nid = dst, rcv[i].node_id
                elif i >= len(rcv):
                    text = f"rank {src} sends message #{i} (node id {snd[i].node_id}) that rank {dst} never receives"
                    rank, nid = src, snd[i].node_id
                else:
                    text = (f"message #{i}: rank {src} sends {snd[i].size} B (node id {snd[i].node_id}), rank {dst} "
                            f"receives {rcv[i].size} B (node id {rcv[i].node_id})")
                    rank, nid = dst, rcv[i].node_id
                problems.append(Problem("p2p-mismatch", "error", f"{src} -> {dst} tag {tag}: {text}", rank, nid))
                break
    return problems

