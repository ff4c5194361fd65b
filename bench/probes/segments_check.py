"""The virtual replay under the profiler correction's one-factor rule (``to_clean``) and under ``segments``, side by
side, against real iteration medians.

    python bench/probes/segments_check.py --bundle resnet152=R0/resnet152.bundle --real resnet152=2713 \\
        [--bundle bert=R0/bert.bundle --real bert=628] [--baseline CAL.toml] [--json]

For each bundle, ``nbox replay BUNDLE --clock virtual [--baseline CAL.toml]`` is run (through the library) with
``--set replay.profiler_correction=to_clean`` and with ``=segments``; the table gives each prediction (the baseline's
median iteration, ms), its error against the real median given with ``--real`` (ms; none given: no error), the
training thread's corrected compute before its first all-reduce in the first captured iteration (where the
replay issues DDP's first gradient bucket, less the gaps and issue costs; the slowest rank's), and under ``segments``
which captured iterations fell back to ``to_clean`` and why. A bundle recorded before the recorder sampled the
clean segments falls back everywhere (the column says so), and both rows are then the same. Deterministic: one
replay per bundle and rule. No assertion: a table for the reader.

A probe (bench/README.md; ``bench/ablation_virtual.py``'s one-factor row gives the same comparison). Its finding:
docs/journal/2026-11-28.md, "Where ResNet-152's virtual replay lost its time: one profiler factor for the whole
iteration".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nbox_replay.inputs import (
    COLLECTIVE,
    COMPUTE,
    RECV,
    captured_iterations,
    correct_graphs,
    load_rank,
    plan_correction,
)
from nbox_replay.inputs.profiler import training_thread
from nbox_replay.replay import ReplayConfig, run_replay
from nbox_trace.bundle.manifest import read_manifest

RULES = ("to_clean", "segments")


def before_first_all_reduce_ms(bundle: Path, rule: str) -> float | None:
    """The slowest rank's corrected training-thread compute before its first all-reduce (DDP's first gradient
    bucket; a DDP forward's buffer broadcast comes before it) in captured iteration 1 (ms); None without a recorded
    rank or an all-reduce on the training thread."""
    manifest = read_manifest(bundle)
    ranks = [int(r) for r in manifest.job.get("ranks_recorded") or []]
    graphs = {r: load_rank(bundle / "trace" / f"trace.{r}.et", r) for r in ranks}
    corrected = correct_graphs(graphs, plan_correction(rule, manifest.observed))
    found = []
    for g in corrected.values():
        main = training_thread(g)
        labels, _, _ = captured_iterations(g)
        total = 0.0
        for i, (k, res) in enumerate(zip(g.kind, g.resource, strict=True)):
            if labels[i] != 0 or res != main:
                continue
            if COLLECTIVE <= k <= RECV and g.comm[i].collective == "all_reduce":
                found.append(total / 1e3)
                break
            if k == COMPUTE:
                total += g.duration_us[i]
    return max(found) if found else None


def replay(bundle: Path, rule: str, baseline: Path | None) -> dict[str, Any]:
    rep = run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", baseline=baseline,
                                  profiler_correction=rule)).to_dict()
    pc = rep.get("profiler_correction") or {}
    falls = {r: w for r, w in (pc.get("segment_fallbacks") or {}).items() if w}
    return {"ms": float(rep["baseline"]["iteration_us"]["median"]) / 1e3,
            "compute_ms": float(rep["baseline"]["breakdown_us"]["compute"]) / 1e3,
            "rules": pc.get("rule_by_rank"), "fallbacks": falls,
            "first_all_reduce_ms": before_first_all_reduce_ms(bundle, rule)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--real", action="append", default=[], help="NAME=MS: the real launches' median iteration")
    ap.add_argument("--baseline", type=Path, default=None, help="the calibrated scenario (nbox replay --baseline)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    real = {k: float(v) for k, v in (r.split("=", 1) for r in a.real)}
    rows = []
    for item in a.bundle:
        name, path = item.split("=", 1)
        row: dict[str, Any] = {"name": name, "bundle": path, "real_ms": real.get(name)}
        for rule in RULES:
            got = replay(Path(path), rule, a.baseline)
            got["error_pct"] = (got["ms"] / real[name] - 1) * 100 if name in real else None
            row[rule] = got
        rows.append(row)
    if a.json:
        print(json.dumps(rows, indent=1))
        return

    def err(x: float | None) -> str:
        return "" if x is None else f"{x:+.1f}%"

    def ms(x: float | None) -> str:
        return "" if x is None else f"{x:.1f}"

    print(f"{'model':<22} {'real ms':>9} {'to_clean ms':>11} {'error':>7} {'1st AR':>9} "
          f"{'segments ms':>11} {'error':>7} {'1st AR':>9}  segments fell back")
    for r in rows:
        t, s = r["to_clean"], r["segments"]
        fell = "; ".join(f"rank {k}: " + ", ".join(f"it {j} ({w})" for j, w in v.items())
                         for k, v in s["fallbacks"].items()) or "none"
        print(f"{r['name']:<22} {ms(r['real_ms']):>9} {t['ms']:>11.1f} {err(t['error_pct']):>7} "
              f"{ms(t['first_all_reduce_ms']):>9} {s['ms']:>11.1f} {err(s['error_pct']):>7} "
              f"{ms(s['first_all_reduce_ms']):>9}  {fell}")
    print("1st AR: the slowest rank's corrected training-thread compute before its first all-reduce (ms)")


if __name__ == "__main__":
    main()
