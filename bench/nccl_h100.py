"""NCCL's own tuning model (emulator_core.pricing.nccl_tuner) on nbox's default H100 scenario vs public nccl-tests runs.

    python bench/nccl_h100.py [--no-nvls] [--csv PATH]

For every measured point of ``bench/data/nccl_tests_h100.csv`` (public nccl-tests output on H100 systems, each
row citing its source, setup and NCCL version) from 1 MiB up: the measured busbw, the busbw of the time
:func:`~emulator_core.pricing.nccl_tuner.nccl_tune` models, the algorithm / protocol NCCL's model picks, and the
error ``(modeled - measured) / measured``; per source the geometric mean of |error|; last line
``worst error X% over N points, geo-mean Y%``.

The model's inputs are the figures of ``emulator_core/scenarios/dgx_h100_400g.toml`` (nbox's default H100
scenario): per GPU, NVLink 18 x 200 Gb/s = 450 GB/s and one 400 Gb/s NIC = 50 GB/s, read from the scenario
file. The measured systems are HGX H100 boards whose NVSwitches reduce (NVLink SHARP: the 480 GB/s
all-reduce busbw on one node is only reachable that way) and NCCL uses NVLS by default there, so the model
runs with ``nvls=True``, as the scenario says (its NVLink dimension has ``in_network_reduction = true``);
``--no-nvls`` shows it without. No CollNet (no InfiniBand SHARP is mentioned by either source). The scenario's
``library = "nccl"`` makes ``pricing.make_pricer`` call the same model (``tests/test_netmodel.py`` checks they
agree); this bench calls it directly to pass each system's CPU vendor, which a scenario does not carry.

busbw follows nccl-tests ``doc/PERFORMANCE.md`` (emulator_core.network.bandwidth): all_reduce ``algbw * 2(p-1)/p``,
all_gather / reduce_scatter ``algbw * (p-1)/p`` where all_gather's size is the gathered total, broadcast
``algbw``. nbox's ``nbytes`` is the per-rank input, so an all_gather row's ``bytes / p``.

Per-system settings NCCL reads that are not bandwidths (the CPU vendor: LL cap and network post overhead):
Voltage Park: Intel (inferred from the source's STREAM notes: 104 physical cores, DDR5 peak 614 GB/s, i.e.
two 52-core Xeon Sapphire Rapids); AWS p5.48xlarge: AMD (3rd Gen AMD EPYC, AWS's p5 instance page).

Left out on purpose: the same repository's single-node all_gather and broadcast runs, whose busbw jumps up and
down by 5-10x between neighbouring sizes (e.g. all_gather 183 GB/s at 256 MiB, 86 GB/s at 512 MiB) — a
measurement problem of that run, not a property of the hardware; and a GCP A3 Mega run (8 x 200 Gb/s
GPUDirect-TCPXO per node), which is not this scenario's network.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.network.bandwidth import bus_bandwidth_gbps  # noqa: E402
from emulator_core.pricing.nccl_tuner import nccl_tune  # noqa: E402
from emulator_core.scenario.files import load_scenario, shipped_scenarios  # noqa: E402

CSV = ROOT / "bench" / "data" / "nccl_tests_h100.csv"
MIN_BYTES = 1 << 20
CPU = {"Voltage Park": "intel", "AWS p5": "amd"}


def scenario_bandwidths_gbps() -> tuple[float, float]:
    """(NVLink, NIC) per GPU per direction in GB/s from the default H100 scenario (Gb/s x links / 8)."""
    scenario = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    intra, inter = scenario.topology.dims[0], scenario.topology.dims[1]
    return intra.bandwidth_gbps * intra.links_per_rank / 8, inter.bandwidth_gbps * inter.links_per_rank / 8


def cpu_of(system: str) -> str:
    for prefix, cpu in CPU.items():
        if system.startswith(prefix):
            return cpu
    raise SystemExit(f"bench/nccl_h100.py: no CPU vendor known for system {system!r}; add it to CPU")


BANDS = ("1 MiB - 64 MiB", "128 MiB - 1 GiB", ">= 2 GiB")


def band(size: int) -> str:
    return BANDS[0] if size <= 64 << 20 else BANDS[1] if size <= 1 << 30 else BANDS[2]


def geo_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-nvls", action="store_true", help="without NVLink SHARP")
    parser.add_argument("--csv", type=Path, default=CSV, help="measurements (default: %(default)s)")
    args = parser.parse_args()
    intra, inter = scenario_bandwidths_gbps()
    nvls = not args.no_nvls
    print(f"model: NCCL v2.29.7-1 tuning model, NVLink {intra:g} GB/s + NIC {inter:g} GB/s per GPU, nvls={nvls}")
    with args.csv.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["bytes"]) >= MIN_BYTES]
    by_source: dict[str, list[float]] = defaultdict(list)
    by_band: dict[str, list[float]] = defaultdict(list)
    errors: list[float] = []
    current = None
    for r in rows:
        p, nodes, coll, size = int(r["gpus"]), int(r["nodes"]), r["collective"], int(r["bytes"])
        key = (r["source_url"], p, nodes, coll)
        if key != current:
            current = key
            print(f"\n{r['system']}: {coll}, {p} GPUs on {nodes} node(s)\n  {r['source_url']}")
            print(f"  {'bytes':>12} {'measured':>9} {'modeled':>9} {'error':>8}  NCCL model's pick")
        nbytes = size / p if coll == "all_gather" else float(size)
        choice = nccl_tune(coll, nbytes, p, nodes, intra_bw_gbps=intra, inter_bw_gbps=inter, nvls=nvls,
                           cpu=cpu_of(r["system"]))
        measured = float(r["busbw_gbps_measured"])
        modeled = bus_bandwidth_gbps(coll, nbytes, p, choice.time_us)
        err = (modeled - measured) / measured
        errors.append(abs(err))
        by_source[r["source_url"]].append(abs(err))
        by_band[band(size)].append(abs(err))
        pick = f"{choice.algorithm}/{choice.protocol}"
        print(f"  {size:>12} {measured:>9.1f} {modeled:>9.1f} {100 * err:>+7.1f}%  {pick}")
    print()
    for url, errs in by_source.items():
        print(f"geo-mean |error| {100 * geo_mean(errs):5.1f}% (mean {100 * sum(errs) / len(errs):5.1f}%) "
              f"over {len(errs):3d} points: {url}")
    for name in BANDS:
        errs = by_band[name]
        if errs:
            mean = sum(errs) / len(errs)
            print(f"sizes {name:>16}: geo-mean |error| {100 * geo_mean(errs):5.1f}%, mean {100 * mean:5.1f}%, "
                  f"worst {100 * max(errs):5.1f}% over {len(errs)} points")
    print(f"worst error {100 * max(errors):.1f}% over {len(errors)} points, geo-mean {100 * geo_mean(errors):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
