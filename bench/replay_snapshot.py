"""Snapshot of every virtual-replay output, to check that an engine change keeps results bit for bit.

    python bench/replay_snapshot.py OUT.json [--samples DIR]     # write the snapshot of this tree's simulate()
    python bench/replay_snapshot.py OUT.json --check OLD.json    # ... and fail on any difference

Cases: every shipped bundle in traces/ and every Chakra ET sample in tests/data/samples/chakra_et, each
under several scenarios (the baseline at the recorded world size, dgx_h100_400g at 64 and 1024 ranks,
ethernet_100g with a straggler and a compute scale, loopback_cpu with its calibration) and
repetitions, all ranks and rank 0 alone. Per case: each rank's iteration times, compute, exposed and
modeled comm, per-node starts and ends, issue ends and waits; every answered collective in answer order;
or the error a case raised. Floats are written with ``float.hex`` (exact).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario  # noqa: E402
from emulator_core.scenario.model import Scenario  # noqa: E402
from emulator_core.scenario.world import resize  # noqa: E402
from nbox_replay.inputs.graph import load_rank  # noqa: E402
from nbox_replay.inputs.source import open_source  # noqa: E402
from nbox_replay.replay import baseline_scenario  # noqa: E402
from nbox_replay.virtual.engine import SimResult, simulate  # noqa: E402
from nbox_trace.errors import NboxError  # noqa: E402

SAMPLES = ROOT / "tests" / "data" / "samples" / "chakra_et"


def _sources(samples: Path) -> list[str]:
    found = [str(p) for p in sorted((ROOT / "traces").iterdir()) if p.is_dir()]
    for et in sorted(samples.rglob("*.0.et")):
        found.append(str(et.parent / et.name[:-len(".0.et")]))
    return found


def _h(x: float) -> str:
    return float(x).hex()


def _dump(res: SimResult) -> dict[str, Any]:
    ranks = {str(r): {"iteration_us": [_h(x) for x in rr.iteration_us],
                      "compute": [[_h(a), _h(b)] for a, b in rr.intervals.compute],
                      "comms": [[_h(c.issue_us), _h(c.start_us), _h(c.end_us)] for c in rr.intervals.comms],
                      "iteration_end_us": [_h(x) for x in rr.iteration_end_us],
                      "start_us": [_h(x) for x in rr.start_us], "end_us": [_h(x) for x in rr.end_us],
                      "issue_end_us": {str(k): _h(v) for k, v in sorted(rr.issue_end_us.items())},
                      "waited_on": {str(k): v for k, v in sorted(rr.waited_on.items())}}
             for r, rr in res.ranks.items()}
    colls = [[c.pg, c.seq, c.collective, _h(c.nbytes), c.rule, c.algorithm, _h(c.start_us), _h(c.end_us)]
             for c in res.collectives]
    return {"world": res.world_size, "ranks": ranks, "collectives": colls, "unpriced": res.unpriced,
            "nodes": res.nodes_replayed}


def _scenarios(source_path: str) -> list[tuple[str, Any]]:
    src = open_source(source_path)
    base, _ = baseline_scenario(src, None)
    dgx = load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml")
    eth = load_scenario(SCENARIOS_DIR / "ethernet_100g.toml", ["compute_scale=1.7"])
    eth = Scenario.from_dict({**eth.to_dict(), "stragglers": [{"rank": 0, "slowdown": 1.5},
                                                              {"rank": 3, "slowdown": 2.0}]})
    loop = load_scenario(SCENARIOS_DIR / "loopback_cpu.toml")
    out: list[tuple[str, Any]] = [("baseline", base)]
    for name, s, w in (("dgx64", dgx, 64), ("dgx1024", dgx, 1024), ("eth-straggler", eth, 64),
                       ("loopback", loop, max(8, src.recorded_world))):
        try:
            out.append((name, resize(s, max(w, src.recorded_world))))
        except NboxError as e:
            out.append((name, f"error: {type(e).__name__}: {e}"))
    return out


def snapshot(samples: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path in _sources(samples):
        try:
            src = open_source(path)
            graphs = {r: load_rank(src.trace_set.files[r], r) for r in src.ranks}
            cases = _scenarios(path)
        except NboxError as e:
            doc[path] = f"error: {type(e).__name__}: {e}"
            continue
        for name, scenario in cases:
            for reps in (1, 3):
                for subset in ("all", "rank0"):
                    key = f"{path} | {name} | reps={reps} | {subset}"
                    if isinstance(scenario, str):
                        doc[key] = scenario
                        continue
                    gs = graphs if subset == "all" else {min(graphs): graphs[min(graphs)]}
                    try:
                        doc[key] = _dump(simulate(gs, scenario, groups=src.groups, recorded_world=src.recorded_world,
                                                  repetitions=reps))
                    except NboxError as e:
                        doc[key] = f"error: {type(e).__name__}: {e}"
    traces = ROOT / "traces"
    mixed = {0: load_rank(traces / "ddp_mlp" / "trace" / "trace.0.et", 0),  # mismatched ranks: a deadlock or
             1: load_rank(traces / "fsdp2_transformer" / "trace" / "trace.1.et", 1)}  # mismatched answers
    for name, scenario in _scenarios(str(traces / "ddp_mlp")):
        if isinstance(scenario, str):
            continue
        try:
            doc[f"mixed | {name}"] = _dump(simulate(mixed, scenario, groups={"0": [0, 1]}, recorded_world=2,
                                                    repetitions=2))
        except NboxError as e:
            doc[f"mixed | {name}"] = f"error: {type(e).__name__}: {e}"
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="where to write this tree's snapshot (JSON)")
    ap.add_argument("--check", type=Path, help="an earlier snapshot that this one must equal")
    ap.add_argument("--samples", type=Path, default=SAMPLES, help=f"the Chakra ET samples (default {SAMPLES})")
    args = ap.parse_args()
    doc = snapshot(args.samples)
    args.out.write_text(json.dumps(doc, indent=0, sort_keys=True))
    ok_cases = sum(1 for v in doc.values() if not isinstance(v, str))
    print(f"{len(doc)} cases ({ok_cases} replayed, {len(doc) - ok_cases} errors) -> {args.out}")
    if args.check is not None:
        old = json.loads(args.check.read_text())
        if old.keys() != doc.keys():
            print(f"DIFFERENT case lists: {sorted(set(old) ^ set(doc))[:5]}")
            return 1
        bad = [k for k in doc if json.dumps(old[k], sort_keys=True) != json.dumps(doc[k], sort_keys=True)]
        for k in bad[:10]:
            print(f"DIFFERENT: {k}")
        print("identical, bit for bit" if not bad else f"{len(bad)} case(s) differ")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
