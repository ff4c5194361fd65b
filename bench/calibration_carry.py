"""Does a 2-node calibration carry to 4 and 8 nodes? (issues 59 and 60)

On the quota testbed (:mod:`nbox_trace.testbed`: every node ``--share`` of one CPU by a cgroup quota, links of
``--rate``; root): ``nbox calibrate`` across 2 nodes (``--base FILE``, reused when it exists) is the model; then
``nbox calibrate`` across each of ``--nodes`` (4, 8) measures the same collectives there, and every measured point is
set against what the 2-node scenario prices at that world size (``emulator_core.pricing.price_group``, the path a
replay's what-if takes). The table gives per node count, collective and size the measured and predicted time and the
error; the summary the median and worst |error| at sizes of 1 MiB and up. ``--racks`` does the same on two racks
behind a 4:1 uplink (the racked testbed, and the model's ``racks = 2``, ``oversubscription = 4``). Nothing is
asserted.

    python bench/calibration_carry.py --base /tmp/cal2.toml --nodes 4,8 --collectives all_reduce,all_gather
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
sys.path.insert(0, str(ROOT))

from fidelity_testbed import PORT, on_nodes  # noqa: E402
from seeds_table import ranks_lock  # noqa: E402

OVERSUBSCRIPTION = 4


def _calibrate(nodes: int, args: argparse.Namespace, out: Path, racks: int = 1) -> dict[str, Any]:
    """``nbox calibrate`` across ``nodes`` quota nodes (in ``racks`` racks behind a 4:1 uplink); its ``--json``
    document (node 0's)."""
    from nbox_trace.testbed import Testbed
    from nbox_trace.testbed.namespaces import _rate_bits

    bits = _rate_bits(args.rate) / args.rate_div
    rate = f"{bits / 1e6:g}mbit"
    uplink = f"{bits * nodes / racks / OVERSUBSCRIPTION / 1e6:g}mbit" if racks > 1 else None
    with Testbed(nodes, rate=rate, cpu_share=args.share, racks=racks, uplink_rate=uplink,
                 uplink_queue_ms=args.uplink_queue_ms) as tb, ranks_lock():
        ep = f"{tb.node(0).addr}:{PORT}"
        outs = on_nodes(tb, out.parent, f"carry-{nodes}", lambda k: [
            sys.executable, "-m", "nbox", "calibrate", "-n", "1", "--nnodes", str(nodes), "--node-rank", str(k),
            "--rdzv-endpoint", ep, "--sizes", args.sizes, "--collectives", args.collectives, "--budget",
            str(args.budget), "--timeout", "900", "--no-busy", "--json",
            "-o", str(out if k == 0 else out.with_suffix(f".n{k}.toml"))], timeout_s=1000)
    return dict(json.loads(outs[0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the 2-node calibration (measured here when missing)")
    ap.add_argument("--nodes", default="4,8")
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="1MiB..64MiB")
    ap.add_argument("--collectives", default="all_reduce,all_gather")
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--racks", action="store_true", help="two racks behind a 4:1 uplink at each node count")
    ap.add_argument("--uplink-queue-ms", type=float, default=None, help="the racks' uplink's queue bound (tbf)")
    ap.add_argument("--rate-div", type=float, default=1.0,
                    help="the links at this fraction of --rate at each node count, the model's bandwidth too")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/nbox-carry"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from emulator_core.pricing import group_shape
    from emulator_core.pricing.pricer import price_group
    from emulator_core.scenario.files import load_scenario

    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.base.exists():
        made = _calibrate(2, args, args.workdir / "cal2.toml")
        del made
        args.base.write_text((args.workdir / "cal2.toml").read_text())
    rows = []
    for n in [int(x) for x in args.nodes.split(",")]:
        racks = 2 if args.racks else 1
        doc = _calibrate(n, args, args.workdir / f"cal{n}{'r' if args.racks else ''}{args.rate_div:g}.toml", racks)
        sets = [f"world_size={n}"] + ([f"topology.dims.0.racks={racks}",
                                       f"topology.dims.0.oversubscription={OVERSUBSCRIPTION}"] if racks > 1 else [])
        if args.rate_div != 1.0:
            bw = load_scenario(args.base).topology.dims[0].bandwidth_gbps
            sets.append(f"topology.dims.0.bandwidth_gbps={bw / args.rate_div:.6g}")
        scenario = load_scenario(args.base, sets)
        shape = group_shape(scenario)
        for fit in doc["fits"]:
            for pt in fit["points"]:
                _, pred = price_group(scenario, fit["collective"], pt["nbytes"], shape)
                rows.append({"nodes": n, "collective": fit["collective"], "nbytes": pt["nbytes"],
                             "measured_us": pt["measured_us"], "predicted_us": pred,
                             "error_pct": (pred / pt["measured_us"] - 1) * 100})
    if args.json:
        print(json.dumps({"base": str(args.base), "share": args.share, "rate": args.rate, "rows": rows}, indent=1))
        return 0
    print(f"calibration carry: a 2-node calibration ({args.base}) priced at more nodes against a calibration "
          f"measured there; quota testbed, share {args.share:g}, {args.rate}")
    print(f"{'nodes':>5} {'collective':<15} {'bytes':>10} {'measured ms':>12} {'2-node model ms':>16} {'error':>8}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['collective']:<15} {r['nbytes']:>10} {r['measured_us'] / 1e3:12.2f} "
              f"{r['predicted_us'] / 1e3:16.2f} {r['error_pct']:+7.1f}%")
    print("summary, sizes >= 1 MiB: median |error| (worst)")
    for key in sorted({(r["nodes"], r["collective"]) for r in rows}):
        errs = [abs(r["error_pct"]) for r in rows if (r["nodes"], r["collective"]) == key and r["nbytes"] >= 1 << 20]
        if errs:
            print(f"  {key[0]} nodes {key[1]:<15} {statistics.median(errs):5.1f}% ({max(errs):.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
