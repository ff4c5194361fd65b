"""Virtual-time replay speed: nodes per second on a large synthetic graph, and 1024-rank what-ifs of the bundles.

    python bench/replay_speed.py [--nodes N] [--reps R] [--json]

Prints one table:

(a) throughput of :func:`nbox_replay.virtual.engine.simulate` on a synthetic job built directly as
    :class:`~nbox_replay.inputs.graph.RankGraph` objects: 2 ranks x N nodes (default 500,000), each a chain of
    compute nodes (10 us each) with an asynchronous all-reduce (1 MiB, process group "0") every 1,000
    nodes, waited for 500 nodes later. Only ``simulate()`` is timed (median of R runs); building the
    graphs is reported on its own line. Target: >= 1,000,000 nodes/s.
(b) wall time of a 1024-rank what-if of each shipped bundle (traces/ddp_mlp, ddp_transformer,
    fsdp2_transformer): load both ranks' traces and simulate at world size 1024 on
    ``emulator_core/scenarios/dgx_h100_400g.toml`` (resized with ``emulator_core.scenario.world.resize``), median
    of R runs (scenario loading outside the timed part). Target: <= 1 s.

Wall-clock on a shared machine: medians are reported; nothing but sanity is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario  # noqa: E402
from emulator_core.scenario.world import resize  # noqa: E402
from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, CommInfo, RankGraph, load_rank  # noqa: E402
from nbox_replay.virtual.engine import simulate  # noqa: E402

BUNDLES = ("ddp_mlp", "ddp_transformer", "fsdp2_transformer")
TARGET_NODES_PER_S = 1_000_000
TARGET_WHATIF_S = 1.0
COMM_EVERY = 1000  # nodes between all-reduces
WAIT_AFTER = 500  # the node that waits for an all-reduce comes this many nodes later


def synthetic_graph(rank: int, n: int) -> RankGraph:
    """One rank: ``n`` nodes on one thread, a compute chain with an async all-reduce every COMM_EVERY nodes."""
    g = RankGraph(rank, f"<synthetic rank {rank}>")
    g.resources = ["thread:1"]
    comm = CommInfo("all_reduce", 1 << 20, "0")
    ids, names, kind, dur, issue, res, deps, it = (g.ids, g.names, g.kind, g.duration_us, g.issue_us, g.resource,
                                                   g.deps, g.iteration)
    last_comm = -1
    for i in range(n):
        ids.append(i)
        res.append(0)
        it.append(0)
        if i % COMM_EVERY == COMM_EVERY - 1:
            names.append("c10d::allreduce_")
            kind.append(COLLECTIVE)
            dur.append(100.0)
            issue.append(5.0)
            deps.append((i - 1,))
            g.comm[i] = comm
            last_comm = i
        else:
            names.append("aten::mm")
            kind.append(COMPUTE)
            dur.append(10.0)
            issue.append(0.0)
            if last_comm >= 0 and i == last_comm + WAIT_AFTER:
                deps.append((i - 1, last_comm))
            else:
                deps.append((i - 1,) if i else ())
    return g


def timed(fn: Any, reps: int) -> tuple[float, Any]:
    """Median wall time (s) of ``fn()`` over ``reps`` runs, and the last result."""
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500_000, help="nodes per rank in the synthetic graph (a)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per figure (the median is reported)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON document on stdout")
    args = ap.parse_args()

    rows: list[tuple[str, str, str, str]] = []
    doc: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                                      f"{platform.python_version()}", "reps": args.reps}

    # (a) synthetic throughput
    t0 = time.perf_counter()
    graphs = {r: synthetic_graph(r, args.nodes) for r in (0, 1)}
    build_s = time.perf_counter() - t0
    scenario = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 1024)
    sim_s, result = timed(lambda: simulate(graphs, scenario, groups={"0": [0, 1]}, recorded_world=2), args.reps)
    total = sum(len(g) for g in graphs.values())
    rate = result.nodes_replayed / sim_s
    ok_a = rate >= TARGET_NODES_PER_S
    rows.append((f"(a) build synthetic graphs (2 x {args.nodes:,} nodes)", f"{build_s:.3f} s",
                 f"{total / build_s:,.0f} nodes/s", "-"))
    rows.append((f"(a) simulate() 2 x {args.nodes:,} nodes, W=1024, {len(result.collectives)} all-reduces",
                 f"{sim_s:.3f} s", f"{rate:,.0f} nodes/s", f">= {TARGET_NODES_PER_S:,} nodes/s: "
                 f"{'MET' if ok_a else 'MISSED'}"))
    doc["synthetic"] = {"nodes": total, "build_s": build_s, "simulate_s": sim_s, "nodes_per_s": rate, "met": ok_a}

    # (b) 1024-rank what-ifs of the shipped bundles
    doc["whatif"] = {}
    ok_b = True
    for name in BUNDLES:
        bundle = ROOT / "traces" / name
        groups = {k: list(v) for k, v in json.loads((bundle / "comm_group.json").read_text()).items()}
        manifest = json.loads((bundle / "manifest.json").read_text())
        recorded = int(manifest["job"]["world_size"])
        ranks = manifest["job"]["ranks_recorded"]

        def whatif(bundle: Path = bundle, groups: dict[str, list[int]] = groups, recorded: int = recorded,
                   ranks: list[int] = ranks) -> Any:
            gs = {r: load_rank(bundle / "trace" / f"trace.{r}.et", r) for r in ranks}
            return simulate(gs, scenario, groups=groups, recorded_world=recorded), sum(len(g) for g in gs.values())

        wall_s, (res, nodes) = timed(whatif, args.reps)
        met = wall_s <= TARGET_WHATIF_S
        ok_b &= met
        pred_ms = statistics.median(res.iteration_us()) / 1000
        rows.append((f"(b) {name}: load + simulate W=1024 ({nodes} nodes, predicted {pred_ms:.2f} ms)",
                     f"{wall_s * 1000:.1f} ms", f"{nodes / wall_s:,.0f} nodes/s",
                     f"<= {TARGET_WHATIF_S:g} s: {'MET' if met else 'MISSED'}"))
        doc["whatif"][name] = {"nodes": nodes, "wall_s": wall_s, "predicted_iteration_ms": pred_ms, "met": met}

    head = ("figure", f"median of {args.reps}", "throughput", "target")
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(4)]
    print(f"nbox virtual-time replay speed ({doc['machine']})")
    for r in (head, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    if args.json:
        print(json.dumps(doc, indent=1))
    # sanity only (timing never fails a run): every replay produced a positive iteration time
    assert result.iteration_us()[0] > 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
