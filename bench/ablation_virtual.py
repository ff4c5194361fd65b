"""Ablation of the modeled effects on the virtual replay: each effect off in turn, the same bundles re-priced.

    python bench/ablation_virtual.py --baseline CAL.toml --bundle bert=R0/bert.bundle --bundle bert=R1/bert.bundle \\
        --real bert=5715 [--json]

For every bundle, ``nbox replay BUNDLE --clock virtual --baseline CAL.toml`` is run once with the calibration as it
is and once per variant below (a ``--set``, which acts on the what-if: the baseline file with the overrides; its
what-if row is read); the table gives, per model, the median over its
bundles of the baseline's iteration time and its error against the real median given with ``--real`` (ms), and per
variant how many points that error moves. The virtual replay is deterministic with recorded compute, so one replay
per bundle and variant is enough; the spread is the bundles' (recordings'). The profiler rows play one correction
rule for every rank in place of the one ``on`` picks.
Live replay and emulate need launches and are not covered here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from emulator_core.scenario.files import load_scenario
from nbox_replay.inputs.profiler import RULES


def variants(cal: Path) -> dict[str, list[str]]:
    """Each effect's switch, as ``--set`` keys on a calibration file with one network dimension."""
    n = len(load_scenario(cal, ()).calibration)
    out = {"as calibrated": [],
           "busy_slowdown off": [f"calibration.{i}.busy_slowdown=1" for i in range(n)],
           "profiler correction off": ["replay.profiler_correction=off"]}
    # each profiler-correction rule alone, in place of the one ``on`` picks per rank
    out.update({f"profiler rule {rule} only": [f"replay.profiler_correction={rule}"] for rule in RULES})
    return out


def replay_ms(bundle: str, cal: Path, sets: list[str]) -> float:
    args = [sys.executable, "-m", "nbox", "replay", bundle, "--clock", "virtual", "--baseline", str(cal), "--json"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{bundle} {sets}: {proc.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(proc.stdout)  # --set acts on the what-if (the baseline file with the overrides)
    return float((doc.get("what_if") or doc["baseline"])["iteration_us"]["median"]) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--bundle", action="append", required=True, help="MODEL=PATH (repeatable)")
    ap.add_argument("--real", action="append", required=True, help="MODEL=MS: the real launches' median")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    real = {k: float(v) for k, v in (r.split("=", 1) for r in a.real)}
    bundles: dict[str, list[str]] = {}
    for b in a.bundle:
        k, v = b.split("=", 1)
        bundles.setdefault(k, []).append(v)
    rows = []
    for name, sets in variants(a.baseline).items():
        for model, paths in bundles.items():
            ms = statistics.median(replay_ms(p, a.baseline, sets) for p in paths)
            rows.append({"variant": name, "model": model, "virtual_ms": ms,
                         "error_pct": (ms / real[model] - 1) * 100 if model in real else None})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    base = {r["model"]: r["error_pct"] for r in rows if r["variant"] == "as calibrated"}
    print(f"{'variant':<38} {'model':<11} {'virtual ms':>10} {'error':>8} {'moved':>8}")
    for r in rows:
        err, b = r["error_pct"], base.get(r["model"])
        moved = f"{err - b:+.1f}" if err is not None and b is not None and r["variant"] != "as calibrated" else ""
        print(f"{r['variant']:<38} {r['model']:<11} {r['virtual_ms']:>10.1f} "
              f"{'' if err is None else f'{err:+.1f}%':>8} {moved:>8}")


if __name__ == "__main__":
    main()
