"""Whether NCCL's own tuning model, with three physical parameters fitted to one nccl-tests curve, carries to the
cluster's other node counts better than the shipped per-size table fit.

    python bench/probes/nccl_tuner_fit.py [--verbose]

For each multi-node curve of an NCCL-tuned collective in bench/data/nccl_tests/ (bench/nccl_tests_fit.py reads them),
three parameters are fitted by grid search to the curve's every size: the NIC's bandwidth per GPU (GB/s), a latency
added to each network hop (us) beyond the fabric kind's, and a scale on the fabric kind's store-and-forward slice;
the loss is soft-L1 on log(model / real) with a 5% knee, so a noisy point pulls little. The time at a size and node
count is :func:`emulator_core.pricing.nccl_tuner.nccl_plan`'s: NCCL's algorithms and protocols, its channel search,
its choice by the minimum (the structure that changes with the node count), on the cluster's fabric kind
(bench/nccl_tests_fit.py's CLUSTER_FABRIC). Each fit then predicts the same collective at the cluster's other node
counts; reported: median and worst |error| at sizes >= 1 MiB (the worst leaves out a real point slower than the next
larger size, as noise), beside the shipped table fit's (``fit_curve`` + ``nccl_curve.time_us``) on the same pairs,
and whether each fitted model is non-decreasing in size from 1 KiB to 8 GiB. Results on stdout; nothing written.

A probe (bench/README.md), issue 60's first step toward a fit that carries: docs/journal/2026-11-29.md, "NCCL's
tuner with three fitted parameters against the table fit".
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import nccl_tests_fit as bench  # noqa: E402

from emulator_core.calibration.nccl_calibrate import base_scenario, fit_curve  # noqa: E402
from emulator_core.network.fabric_kinds import net_fabric  # noqa: E402
from emulator_core.network.nccl_tests import Curve  # noqa: E402
from emulator_core.pricing.nccl_curve import time_us as table_time_us  # noqa: E402
from emulator_core.pricing.nccl_tuner import nccl_plan, nccl_supports  # noqa: E402
from emulator_core.pricing.pricer import datasheet_of  # noqa: E402

NVLINK_GBPS = 450.0  # H100's NVLink line rate per direction, every cluster here
GRID_BW = [5 * 1.05 ** i for i in range(70)]  # 5 .. 145 GB/s
GRID_LAT = (0.0, 2.0, 5.0, 10.0, 20.0, 40.0)
GRID_SLICE = (0.5, 1.0, 2.0, 4.0)


def tuner_time(collective: str, nodes: int, gpn: int, bw: float, lat: float, slice_scale: float,
               kind: str) -> Callable[[float], float]:
    """Time (us) at nccl-tests size S of NCCL's model with the fitted parameters."""
    nf = net_fabric(kind)
    plan = nccl_plan(collective, nodes * gpn, nodes, intra_bw_gbps=NVLINK_GBPS, inter_bw_gbps=bw,
                     inter_latency_us=nf.latency_us + lat, net_protocols=nf.protocols,
                     net_slice_bytes=(nf.slice_bytes[0] * slice_scale, nf.slice_bytes[1] * slice_scale,
                                      nf.slice_bytes[2] * slice_scale))
    ranks = nodes * gpn
    return lambda size: plan.choose(size / ranks if collective == "all_gather" else size).time_us


def fit(curve: Curve, kind: str) -> tuple[float, float, float]:
    def loss(f: Callable[[float], float]) -> float:
        return sum(2 * (math.sqrt(1 + (math.log(f(p.size_bytes) / p.time_us) / 0.05) ** 2) - 1) for p in curve.points)
    best = min((loss(tuner_time(curve.collective, curve.nodes, curve.gpus_per_node, b, la, s, kind)), b, la, s)
                for b in GRID_BW for la in GRID_LAT for s in GRID_SLICE)
    return best[1], best[2], best[3]


def noisy(curve: Curve) -> set[int]:
    pts = sorted(curve.points, key=lambda p: p.size_bytes)
    return {a.size_bytes for a, b in itertools.pairwise(pts) if a.time_us > b.time_us}


def monotone(f: Callable[[float], float]) -> bool:
    sizes = [1 << 10]
    while sizes[-1] < 8 << 30:
        sizes.append(int(sizes[-1] * 1.25))
    times = [f(s) for s in sizes]
    return all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verbose", action="store_true", help="print each fit and each predicted curve's errors")
    args = ap.parse_args()
    sheet = datasheet_of(base_scenario(None))
    for cluster, curves in bench.load().items():
        kind = bench.CLUSTER_FABRIC[cluster][0]
        curves = [c for c in curves if nccl_supports(c.collective) and c.nodes > 1]
        tuned: tuple[list[float], list[float]] = ([], [])
        table: tuple[list[float], list[float]] = ([], [])
        non_monotone = 0
        for ref in curves:
            bw, lat, sl = fit(ref, kind)
            table_fit = fit_curve(ref)
            non_monotone += not monotone(tuner_time(ref.collective, ref.nodes, ref.gpus_per_node, bw, lat, sl, kind))
            if args.verbose:
                print(f"{cluster} {ref.collective} {ref.nodes}x{ref.gpus_per_node}: NIC {bw:.1f} GB/s per GPU, "
                      f"+{lat:g} us per hop, slice x{sl:g}")
            for t in curves:
                if t.collective != ref.collective or t.nodes == ref.nodes or t.gpus_per_node != ref.gpus_per_node:
                    continue
                f = tuner_time(t.collective, t.nodes, t.gpus_per_node, bw, lat, sl, kind)
                skip = noisy(t)
                for p in t.points:
                    if p.size_bytes < 1 << 20:
                        continue
                    for (errs, worst), model in ((tuned, f(p.size_bytes)),
                                                 (table, table_time_us(table_fit, p.size_bytes, t.nodes, sheet))):
                        e = abs(model / p.time_us - 1)
                        errs.append(e)
                        if p.size_bytes not in skip:
                            worst.append(e)
        print(f"{cluster} ({kind}): {len(curves)} multi-node curves of NCCL-tuned collectives, fit at one node count "
              f"-> the others, sizes >= 1 MiB")
        print(f"  NCCL's tuner, 3 fitted parameters: {bench.stats(*tuned)}; not non-decreasing in size: {non_monotone} "
              f"of {len(curves)} fits")
        print(f"  the shipped table fit:             {bench.stats(*table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
