"""nbox's network model against ASTRA-sim's own results for single collectives, configured to its semantics.

    python bench/astra_parity.py [GRID.csv] [--min-bytes N] [--all-configs] [--json]

GRID.csv defaults to ``tests/data/astra_grid/reference_grid_upto64.csv`` (see its README: ASTRA-sim 2.0's analytical
backends, one dimension, 50 GB/s with GB = 2^30 B, 500 ns per link). Each row becomes an nbox scenario through
``emulator_core.astra.conventions`` (the same rule ``nbox scenario import`` uses): the topology's kind, per-link
bandwidth, a
switch traversal = two links of latency, store-and-forward links and ``congestion = "aware"`` for the
congestion-aware backend, ``congestion = "unaware"`` for the other; ASTRA-sim's collective implementation named
as nbox's algorithm. Only the ``nosplit_nomemcost`` system config is compared (one chunk, no memory cost; pass
``--all-configs`` to include ``bundled4split`` as well, which nbox does not model chunk by chunk), at sizes >=
``--min-bytes`` (default 1 MiB).

Prints a table per (backend, topology, algorithm, collective): cases, median and worst signed error of nbox
against ASTRA-sim, and the time to price the grid; the last line reads ``worst row error X% over N cases``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.astra.conventions import ALGORITHM_FROM_ASTRA, dimension_from_astra, network_for_backend  # noqa: E402
from emulator_core.pricing.pricer import group_shape, make_pricer  # noqa: E402
from emulator_core.scenario.model import Scenario, Topology  # noqa: E402

DEFAULT_GRID = ROOT / "tests" / "data" / "astra_grid" / "reference_grid_upto64.csv"


def scenario_for(row: dict[str, str]) -> Scenario:
    """The nbox scenario that reproduces one grid row's ASTRA-sim configuration."""
    network, forwarding = network_for_backend(row["backend"])
    npus = int(row["npus"])
    dim = dimension_from_astra("dim0", row["topology"], npus, float(row["bandwidth_GBps"]), float(row["latency_ns"]),
                               forwarding)
    return Scenario(world_size=npus, topology=Topology((dim,)), network=network)


def nbox_ns(row: dict[str, str]) -> float:
    s = scenario_for(row)
    pricer = make_pricer(s, row["collective"], group_shape(s), ALGORITHM_FROM_ASTRA[row["algorithm"]])
    return pricer(int(row["bytes"]))[1] * 1000.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", nargs="?", type=Path, default=DEFAULT_GRID)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--all-configs", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with args.grid.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["simulated_ns"] != "FAIL" and int(r["bytes"]) >= args.min_bytes
                and (args.all_configs or r["system_config"] == "nosplit_nomemcost")]
    errors: dict[tuple[str, ...], list[float]] = defaultdict(list)
    t0 = time.perf_counter()
    for r in rows:
        err = (nbox_ns(r) - float(r["simulated_ns"])) / float(r["simulated_ns"]) * 100
        key = (r["backend"].replace("analytical_", ""), r["topology"], r["algorithm"], r["collective"])
        if args.all_configs:
            key += (r["system_config"],)
        errors[key].append(err)
    elapsed = time.perf_counter() - t0
    table = []
    for key, errs in sorted(errors.items()):
        worst = max(errs, key=abs)
        table.append({"row": list(key), "cases": len(errs), "median_error_pct": statistics.median(errs),
                      "worst_error_pct": worst})
    worst_row = max(table, key=lambda t: abs(t["worst_error_pct"]))
    doc: dict[str, Any] = {"grid": str(args.grid), "cases": len(rows), "seconds": elapsed, "rows": table,
                           "worst_row_error_pct": abs(worst_row["worst_error_pct"])}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    head = f"{'backend':<20} {'topology':<15} {'algorithm':<17} {'collective':<15} {'cases':>5} {'median':>8} " \
           f"{'worst':>8}"
    print(head)
    print("-" * len(head))
    for t in table:
        print(f"{t['row'][0]:<20} {t['row'][1]:<15} {t['row'][2]:<17} {t['row'][3]:<15} {t['cases']:>5} "
              f"{t['median_error_pct']:>+7.2f}% {t['worst_error_pct']:>+7.2f}%")
    print(f"priced {len(rows)} cases in {elapsed:.3f} s ({elapsed / max(1, len(rows)) * 1e6:.0f} us per case, "
          f"scenario build included)")
    print(f"worst row error {doc['worst_row_error_pct']:.2f}% over {len(rows)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
