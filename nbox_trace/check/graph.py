"""Graph metrics of one rank's dependency graph: roots, depth, critical path, dangling dependencies and cycles.

Dependencies are the union of ``data_deps`` and ``ctrl_deps``, as ASTRA-sim's current feeder waits on both. Depth
counts nodes on the longest dependency chain; the critical path is the longest chain by the sum of
``duration_micros`` (microseconds). Both are computed with Kahn's algorithm, without recursion, so a 1M-node chain
is fine.
"""

from __future__ import annotations

from nbox_trace.check.report import ProblemLog


def graph_metrics(ids: list[int], durs: list[int], dep_start: list[int], dep_ids: list[int], n_data: list[int],
                   id_index: dict[int, int], log: ProblemLog) -> tuple[int, int, int]:
    """Roots, depth (nodes) and critical path (us) by Kahn's algorithm; reports dangling deps and cycles."""
    n = len(ids)
    preds: list[tuple[int, ...]] = []
    indeg = [0] * n
    succ_count = [0] * n
    for i in range(n):
        lo, hi = dep_start[i], dep_start[i + 1]
        if lo == hi:
            preds.append(())
            continue
        resolved = set()
        for k in range(lo, hi):
            dep = dep_ids[k]
            j = id_index.get(dep)
            if j is None:
                which = "data_deps" if k - lo < n_data[i] else "ctrl_deps"
                log.add("dangling-dep", "error", f"node id {ids[i]}: {which} names id {dep}, not a node of this file",
                        ids[i])
            elif j == i:
                log.add("cycle", "error", f"node id {ids[i]} depends on itself", ids[i])
            else:
                resolved.add(j)
        p = tuple(resolved)
        preds.append(p)
        indeg[i] = len(p)
        for j in p:
            succ_count[j] += 1
    # successor lists in CSR form
    succ_start = [0] * (n + 1)
    for i in range(n):
        succ_start[i + 1] = succ_start[i] + succ_count[i]
    fill = succ_start[:-1].copy()
    succ = [0] * succ_start[n]
    for i in range(n):
        for j in preds[i]:
            succ[fill[j]] = i
            fill[j] += 1
    start_us = [0] * n
    level = [1] * n
    queue = [i for i in range(n) if indeg[i] == 0]
    roots = len(queue)
    head = 0
    depth = 0
    critical = 0
    while head < len(queue):
        u = queue[head]
        head += 1
        finish = start_us[u] + durs[u]
        lv = level[u]
        if finish > critical:
            critical = finish
        if lv > depth:
            depth = lv
        for k in range(succ_start[u], succ_start[u + 1]):
            v = succ[k]
            if finish > start_us[v]:
                start_us[v] = finish
            if lv + 1 > level[v]:
                level[v] = lv + 1
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    if head < n:
        blocked = [i for i in range(n) if indeg[i] > 0]
        cycle = _find_cycle(blocked[0], preds, indeg)
        shown = " -> ".join(str(ids[i]) for i in cycle[:8]) + (" -> ..." if len(cycle) > 8 else "")
        log.add("cycle", "error",
                f"dependency cycle through node ids {shown} -> {ids[cycle[0]]}; {len(blocked)} node(s) are on "
                "or behind a cycle and can never run", ids[cycle[0]])
    return roots, depth, critical


def _find_cycle(start: int, preds: list[tuple[int, ...]], indeg: list[int]) -> list[int]:
    """Walk blocked predecessors from ``start`` until a node repeats; return that cycle (in dependency order)."""
    seen: dict[int, int] = {}
    path: list[int] = []
    u = start
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = next(j for j in preds[u] if indeg[j] > 0)
    return list(reversed(path[seen[u]:]))

