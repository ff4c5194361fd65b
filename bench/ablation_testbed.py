"""Ablation rows that need launches: the host-work pad (live replay) and compute_noise (emulate), on and off.

    python bench/ablation_testbed.py --calibration CAL.toml --bundle deeplight=R0/deeplight.bundle \\
        --bundle deeplight=R1/deeplight.bundle --real deeplight=573 [--warmup 2 --iterations 6] [--json]

On the two-node namespace testbed (:mod:`nbox_trace.testbed.namespaces`, root), per model and per bundle given
(one bundle per round, from ``bench/seeds_table.py --workdir``), interleaved, the order flipped every round:

* the live replay of the bundle (``nbox replay --clock real --compute live`` across the nodes, as
  ``bench/fidelity_testbed.py`` runs it) with ``replay.host_work=pad`` (the default) and with ``off``;
* ``nbox emulate --world-size 2 -n 1`` of the model with ``compute_noise`` off (the default) and with
  ``compute_noise = "mirror_history"``.

The table gives each variant's median iteration time over its rounds' pooled iterations, its error against the
real launches' median given with ``--real`` (ms, from the same ``seeds_table`` run), and how many points the effect
moves the error (the variant's error minus the default's). The virtual replay's rows are
``bench/ablation_virtual.py``'s (no launch needed). Every launch holds ``/tmp/nbox_ranks.lock``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import emulate_fidelity_testbed as eft  # noqa: E402
import fidelity_testbed as ft  # noqa: E402
from seeds_table import ranks_lock  # noqa: E402

#: (path, variant label, what it runs): the default first in each pair.
VARIANTS = (("live", "host-work pad (default)", "pad"), ("live", "host-work pad off", "off"),
            ("emulate", "compute_noise off (default)", ""), ("emulate", "compute_noise mirror_history",
                                                             "compute_noise=mirror_history"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=Path, required=True, help="the testbed's calibrated scenario")
    ap.add_argument("--bundle", action="append", required=True, help="MODEL=PATH, one per round (repeatable)")
    ap.add_argument("--real", action="append", required=True, help="MODEL=MS: the real launches' median")
    ap.add_argument("--warmup", type=int, default=2, help="emulate: untimed iterations (default 2)")
    ap.add_argument("--iterations", type=int, default=6, help="emulate: timed iterations (default 6)")
    ap.add_argument("--rate", default="1gbit", help="the link's tbf rate")
    ap.add_argument("--paths", default="live,emulate", help="which rows: live, emulate or both (default both)")
    ap.add_argument("--workdir", type=Path, required=True, help="logs here")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    real = {k: float(v) for k, v in (r.split("=", 1) for r in args.real)}
    bundles: dict[str, list[Path]] = {}
    for b in args.bundle:
        k, v = b.split("=", 1)
        bundles.setdefault(k, []).append(Path(v))
    if set(bundles) - set(real):
        ap.error(f"--real is missing for {sorted(set(bundles) - set(real))}")
    paths = {p for p in args.paths.split(",") if p}
    if not paths or paths - {"live", "emulate"}:
        ap.error(f"--paths {args.paths!r}: live, emulate or both")
    variants = tuple(v for v in VARIANTS if v[0] in paths)
    args.workdir.mkdir(parents=True, exist_ok=True)

    from nbox_trace.testbed.namespaces import Testbed

    got: dict[tuple[str, str], list[float]] = {}
    with Testbed(2, rate=args.rate) as tb:
        for model, paths in bundles.items():
            for rnd, bundle in enumerate(paths):
                order = variants if rnd % 2 == 0 else tuple(reversed(variants))
                for path, label, what in order:
                    with ranks_lock():
                        if path == "live":
                            us = ft.live_replay(tb, args.workdir, bundle, args.calibration, rnd, host_work=what)
                        else:
                            us = eft.emulate_on(tb, args.workdir, f"abl-emu-{model}-{rnd}-{bool(what)}", model, 2, 1,
                                                args.calibration, args.warmup, args.iterations,
                                                (what,) if what else ())
                    got.setdefault((model, label), []).extend(us)
                    print(f"ablation_testbed: {model} round {rnd} {label}: "
                          f"{statistics.median(us) / 1e3:.1f} ms", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for model in bundles:
        for i, (path, label, _what) in enumerate(variants):
            us = got[(model, label)]
            ms = statistics.median(us) / 1e3
            err = (ms / real[model] - 1) * 100
            rows.append({"model": model, "path": path, "variant": label, "median_ms": ms, "n": len(us),
                         "error_pct": err, "default": i % 2 == 0})
    for i in range(1, len(rows), 2):  # each pair's second row: the points the effect moves
        rows[i]["moved_points"] = rows[i]["error_pct"] - rows[i - 1]["error_pct"]
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'model':<11} {'variant':<30} {'median ms':>10} {'n':>4} {'error':>8} {'moved':>7}")
    for r in rows:
        moved = f"{r['moved_points']:+.1f}" if "moved_points" in r else ""
        print(f"{r['model']:<11} {r['variant']:<30} {r['median_ms']:>10.1f} {r['n']:>4} {r['error_pct']:>+7.1f}% "
              f"{moved:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
