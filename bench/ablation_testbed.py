"""Ablation rows that need launches: the host-work pad (live replay) on and off, and emulate beside the real job.

    python bench/ablation_testbed.py --calibration CAL.toml --bundle deeplight=R0/deeplight.bundle \\
        --bundle deeplight=R1/deeplight.bundle --real deeplight=573 [--warmup 2 --iterations 6] [--json]

On the two-node namespace testbed (:mod:`nbox_trace.testbed.namespaces`, root), per model and per bundle given
(one bundle per round, from ``bench/seeds_table.py --workdir``), interleaved, the order flipped every round:

* the live replay of the bundle (``nbox replay --clock real --compute live`` across the nodes, as
  ``bench/fidelity_testbed.py`` runs it) with ``replay.host_work=pad`` (the default) and with ``off``;
* ``nbox emulate --world-size 2 -n 1`` of the model (its ``compute_noise`` rows, before that key was removed, are
  in docs/results.md);
* with ``--paths ...,real``, the real job itself (``bench/fidelity_testbed.plain_run``, two nodes x 1 rank) in the
  same rounds, so that the errors are against launches of the same hour. Without the live rows no bundle is
  needed: ``--models M1,M2 --rounds N``.

The table gives each variant's median iteration time over its rounds' pooled iterations, its error against the
real launches' median (the ``real`` rows' own when launched, else ``--real``, ms, from the same ``seeds_table``
run), and how many points the effect moves the error (the variant's error minus the default's); with the real rows,
also the paired error (each round's median against that round's real launch, geometric mean over the rounds). The
virtual replay's rows are ``bench/ablation_virtual.py``'s (no launch needed). Every launch holds
``/tmp/nbox_ranks.lock``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import emulate_fidelity_testbed as eft  # noqa: E402
import fidelity_testbed as ft  # noqa: E402
from seeds_table import ranks_lock  # noqa: E402

#: (path, variant label, what it runs): each path's default first, labelled "(default)".
VARIANTS = (("live", "host-work pad (default)", "pad"), ("live", "host-work pad off", "off"),
            ("emulate", "emulate (default)", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=Path, required=True, help="the testbed's calibrated scenario")
    ap.add_argument("--bundle", action="append", default=[], help="MODEL=PATH, one per round (repeatable)")
    ap.add_argument("--models", default="", help="without live rows: comma list of models (no bundle needed)")
    ap.add_argument("--rounds", type=int, default=2, help="with --models: rounds per model (default 2)")
    ap.add_argument("--real", action="append", default=[],
                    help="MODEL=MS: the real launches' median (not needed with --paths ...,real)")
    ap.add_argument("--warmup", type=int, default=2, help="emulate: untimed iterations (default 2)")
    ap.add_argument("--iterations", type=int, default=6, help="emulate: timed iterations (default 6)")
    ap.add_argument("--rate", default="1gbit", help="the link's tbf rate")
    ap.add_argument("--paths", default="live,emulate",
                    help="which rows, comma list of live, emulate, real (default live,emulate)")
    ap.add_argument("--workdir", type=Path, required=True, help="logs here")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    real = {k: float(v) for k, v in (r.split("=", 1) for r in args.real)}
    paths = {p for p in args.paths.split(",") if p}
    if not paths or paths - {"live", "emulate", "real"} or paths == {"real"}:
        ap.error(f"--paths {args.paths!r}: live and/or emulate, and real if wanted")
    bundles: dict[str, list[Path | None]] = {}
    for b in args.bundle:
        k, v = b.split("=", 1)
        bundles.setdefault(k, []).append(Path(v))
    if "live" in paths and (args.models or not bundles):
        ap.error("the live rows replay bundles: give --bundle MODEL=PATH per round, not --models")
    if "live" not in paths and args.models:
        bundles = {m: [None] * args.rounds for m in args.models.split(",") if m}
    if not bundles:
        ap.error("give --bundle MODEL=PATH per round, or --models with --rounds")
    if "real" not in paths and set(bundles) - set(real):
        ap.error(f"--real is missing for {sorted(set(bundles) - set(real))}")
    variants = tuple(v for v in VARIANTS if v[0] in paths)
    launch_real = "real" in paths
    args.workdir.mkdir(parents=True, exist_ok=True)

    from nbox_trace.testbed.namespaces import Testbed

    got: dict[tuple[str, str], list[float]] = {}
    by_round: dict[tuple[str, str], list[float]] = {}  # each round's median, for the paired error
    with Testbed(2, rate=args.rate) as tb:
        for model, per_round in bundles.items():
            for rnd, bundle in enumerate(per_round):
                steps = (("real", "real", ""),) if launch_real else ()
                order = variants + steps if rnd % 2 == 0 else steps + tuple(reversed(variants))
                for path, label, what in order:
                    with ranks_lock():
                        if path == "real":
                            us, _ = ft.plain_run(tb, args.workdir, model, args.warmup + args.iterations,
                                                 args.warmup, rnd)
                        elif path == "live":
                            assert bundle is not None
                            us = ft.live_replay(tb, args.workdir, bundle, args.calibration, rnd, host_work=what)
                        else:
                            us = eft.emulate_on(tb, args.workdir, f"abl-emu-{model}-{rnd}-{bool(what)}", model, 2, 1,
                                                args.calibration, args.warmup, args.iterations,
                                                (what,) if what else ())
                    got.setdefault((model, label), []).extend(us)
                    by_round.setdefault((model, label), []).append(statistics.median(us))
                    print(f"ablation_testbed: {model} round {rnd} {label}: "
                          f"{statistics.median(us) / 1e3:.1f} ms", file=sys.stderr)
    if launch_real:
        real = {m: statistics.median(got[(m, "real")]) / 1e3 for m in bundles}
    rows: list[dict[str, Any]] = []
    for model in bundles:
        if launch_real:
            rows.append({"model": model, "path": "real", "variant": "real launches", "median_ms": real[model],
                         "n": len(got[(model, "real")]), "error_pct": 0.0, "real": True})
        for path, label, _what in variants:
            us = got[(model, label)]
            ms = statistics.median(us) / 1e3
            err = (ms / real[model] - 1) * 100
            row = {"model": model, "path": path, "variant": label, "median_ms": ms, "n": len(us),
                   "error_pct": err, "default": "(default)" in label}
            if launch_real:  # each round's median against that round's real launch, geometric mean
                pairs = zip(by_round[(model, label)], by_round[(model, "real")], strict=True)
                row["paired_pct"] = (math.exp(statistics.fmean(math.log(a / b) for a, b in pairs)) - 1) * 100
            rows.append(row)
    base: dict[tuple[str, str], float] = {}
    for r in rows:  # a variant's row: the points it moves the error from its path's default
        if "real" in r:
            continue
        if r["default"]:
            base[(r["model"], r["path"])] = r["error_pct"]
        else:
            r["moved_points"] = r["error_pct"] - base[(r["model"], r["path"])]
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'model':<11} {'variant':<30} {'median ms':>10} {'n':>4} {'error':>8} {'moved':>7} {'paired':>8}")
    for r in rows:
        moved = f"{r['moved_points']:+.1f}" if "moved_points" in r else ""
        paired = f"{r['paired_pct']:+.1f}%" if "paired_pct" in r else ""
        print(f"{r['model']:<11} {r['variant']:<30} {r['median_ms']:>10.1f} {r['n']:>4} {r['error_pct']:>+7.1f}% "
              f"{moved:>7} {paired:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
