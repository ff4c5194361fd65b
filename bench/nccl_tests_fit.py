"""How well a fit at one node count predicts another: every public nccl-tests curve in bench/data/nccl_tests/.

For each cluster (a folder of bench/data/nccl_tests/ with its PROVENANCE.md) and collective, each curve in turn
is fitted (``emulator_core.calibration.nccl_calibrate.fit_curve``) and every other node count of the same cluster and
collective is predicted from it (``emulator_core.pricing.nccl_curve.time_us``, the datasheet figures of the shipped
dgx_h100_400g scenario for the regime factor). Reported per cluster and size band: the median and worst |error|
of the predicted time at sizes >= 1 MiB; predictions whose step message lies outside the fitted curve's measured
range are counted apart as well ("extrapolated"). Then the datasheet alone: the shipped scenario, no fit, priced
at every curve's sizes on its shape (``nbox scenario cost --compare``), before (no ``fabric`` on the network
dimension: NCCL's model as is) and after (the network dimension's ``fabric`` set to the cluster's kind, with the
host facts its provenance states, :data:`CLUSTER_FABRIC`: the only things chosen per cluster), per size band, median
and worst |error|. All-to-all is priced as NCCL's point-to-point group (``emulator_core.pricing.nccl_p2p``).

Held-out curves (``bench/data/nccl_tests/heldout/<name>/``, each with its PROVENANCE.md) are priced the same way
from datasheet figures alone and reported apart; nothing in nbox is set from them.

Files: ``*.txt`` are nccl-tests' standard output (read by ``emulator_core.network.nccl_tests``); ``*.csv`` with columns
``Nodes,GPUs,size(MB),...,out algbw(GB/s),...`` are per-node-count summaries of nccl-tests rows (AWS's benchmark
repository), turned into curves here (time = size / algbw, MB = MiB). Run: ``python bench/nccl_tests_fit.py``.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.calibration.nccl_calibrate import (  # noqa: E402
    SIZE_BANDS,
    base_scenario,
    calibrate_from_curves,
    compare,
    fit_curve,
    regime_notes,
)
from emulator_core.calibration.physics_fit import carried, fit_physics  # noqa: E402
from emulator_core.network.nccl_tests import BUS_FACTORS, Curve, NcclTestsError, Point, read_curve  # noqa: E402
from emulator_core.pricing.nccl_curve import between_us, time_us  # noqa: E402
from emulator_core.pricing.nccl_tuner import nccl_supports  # noqa: E402
from emulator_core.pricing.pricer import datasheet_of  # noqa: E402
from emulator_core.scenario import Scenario  # noqa: E402
from emulator_core.scenario.nccl_fit import bracket, regime, step_bytes  # noqa: E402

DATA = ROOT / "bench" / "data" / "nccl_tests"
CSV_COLLECTIVES = {"nccl_all_reduce.csv": "all_reduce", "nccl_all_gather.csv": "all_gather",
                   "nccl_alltoall.csv": "all_to_all"}
BANDS = SIZE_BANDS  # nbox calibrate --nccl-tests names its regimes by the same bands
#: Each cluster's network kind (its PROVENANCE.md says which fabric it is), the --set overrides that make the
#: shipped scenario its datasheet, and the host facts set with the fabric (the "after" rows): (fabric, overrides,
#: host overrides).
CLUSTER_FABRIC: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # p5.48xlarge: 32 x 100 Gb/s EFAv2 = 400 Gb/s per GPU; 3rd-generation AMD EPYC hosts (AWS's P5 instance page:
    # "AMD EPYC 7R13"); the runs set NCCL_P2P_NET_CHUNKSIZE=524288 (PROVENANCE.md)
    "aws_p5_h100": ("efa", (), ("network.host_cpu=amd", "network.p2p_chunk_bytes=512KiB")),
    "voltage_park_h100": ("infiniband", (), ()),    # ConnectX-7 400 Gb/s InfiniBand per GPU
    "gcp_a3mega_2x8": ("tcpxo", ("topology.dims.1.bandwidth_gbps=200",), ()),  # held out: A3 Mega, 200 Gb/s per GPU
    "h100_ib_issue309": ("infiniband", (), ()),     # held out: 8 x 8 H100, 400 Gb/s InfiniBand (PROVENANCE.md)
}


def csv_curves(path: Path) -> list[Curve]:
    """One curve per node count of an AWS-style summary CSV."""
    coll = CSV_COLLECTIVES[path.name]
    rows: dict[tuple[int, int], list[Point]] = defaultdict(list)
    with path.open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            nodes, gpus = int(r["Nodes"]), int(r["GPUs"])
            size = int(float(r["size(MB)"])) << 20
            alg = float(r["out algbw(GB/s)"])
            rows[(nodes, gpus)].append(Point(size, size / alg / 1e3, alg, alg * BUS_FACTORS[coll](gpus)))
    return [Curve(f"{path.name}@{n}x{g // n}", coll, n, g // n, tuple(pts)) for (n, g), pts in sorted(rows.items())]


def load() -> dict[str, list[Curve]]:
    clusters: dict[str, list[Curve]] = {}
    for folder in sorted(p for p in DATA.iterdir() if p.is_dir() and p.name != "heldout"):
        curves = [read_curve(f) for f in sorted(folder.glob("*.txt"))]
        for f in sorted(folder.glob("*.csv")):
            curves += csv_curves(f)
        clusters[folder.name] = curves
    return clusters


def _named(path: Path) -> Curve:
    """A held-out file: its collective from the log, else from the file name's start (``all_reduce_2x8.txt``)."""
    said = next((c for c in sorted(BUS_FACTORS, key=len, reverse=True) if path.name.startswith(c + "_")), None)
    try:
        return read_curve(path)
    except NcclTestsError:
        if said is None:
            raise
        return read_curve(path, collective=said)


def load_heldout() -> dict[str, list[Curve]]:
    folder = DATA / "heldout"
    if not folder.is_dir():
        return {}
    return {d.name: [_named(f) for f in sorted(d.glob("*.txt"))] for d in sorted(folder.iterdir()) if d.is_dir()}


def cluster_base(cluster: str, *, fabric: bool) -> Scenario:
    """The shipped scenario as ``cluster``'s datasheet (:data:`CLUSTER_FABRIC`'s overrides); ``fabric``: with its
    network's kind and host facts, else with no fabric (NCCL's model as is: the shipped one runs on InfiniBand)."""
    kind, sets, host = CLUSTER_FABRIC.get(cluster, ("", (), ()))
    base = base_scenario(None, (*sets, *((f"topology.dims.1.fabric={kind}", *host) if fabric and kind else ())))
    if fabric:
        return base
    dims = base.topology.dims
    plain = (dims[0], *(replace(d, fabric="") for d in dims[1:]))
    return replace(base, topology=replace(base.topology, dims=plain))


def datasheet(cluster: str, curves: list[Curve], *, fabric: bool, verbose: bool) -> dict[str, list[float]]:
    """|error| per size band of the shipped scenario, no fit, at each curve's sizes >= 1 MiB; ``fabric``: with the
    network dimension's ``fabric`` set to the cluster's kind."""
    base = cluster_base(cluster, fabric=fabric)
    sheet: dict[str, list[float]] = defaultdict(list)
    for c in curves:
        for r in compare(base, c):
            if r.size_bytes >= 1 << 20:
                sheet[band(r.size_bytes)].append(abs(r.error))
                sheet["collective " + c.collective].append(abs(r.error))
                if c.nodes > 1 and nccl_supports(c.collective):
                    sheet["tuned " + band(r.size_bytes)].append(abs(r.error))
                if verbose:
                    print(f"  {cluster} {'after ' if fabric else 'before'} {c.collective} {c.nodes}x{c.gpus_per_node} "
                          f"{r.size_bytes:>11} real {r.real_us:10.1f} nbox {r.model_us:10.1f} {100 * r.error:+6.1f}% "
                          f"{r.source}")
    return sheet


def print_datasheet(cluster: str, curves: list[Curve], overall: dict[str, list[float]], verbose: bool) -> None:
    kind = CLUSTER_FABRIC.get(cluster, ("-", (), ()))[0]
    for fabric in (False, True):
        sheet = datasheet(cluster, curves, fabric=fabric, verbose=verbose)
        label = f"datasheet, fabric = {kind!r}" if fabric else "datasheet, no fabric"
        for name, _, _ in BANDS:
            print(f"  {label:28} {name:>14}: {stats(sheet[name])}")
        sall = [e for name, _, _ in BANDS for e in sheet[name]]
        print(f"  {label:28} {'all':>14}: {stats(sall)}")
        for coll in sorted({c.collective for c in curves}):
            print(f"    of which {coll + ':':<61} {stats(sheet['collective ' + coll])}")
        tuned = [e for name, _, _ in BANDS for e in sheet["tuned " + name]]
        print(f"    of which NCCL-tuned collectives on several nodes (where a fabric acts): {stats(tuned)}")
        print(f"    of which the same at 1-64 MiB:                                      "
              f"{stats(sheet['tuned ' + BANDS[0][0]])}")
        suffix = " after" if fabric else ""
        overall["datasheet" + suffix] += sall
        overall["datasheet 1-64" + suffix] += sheet[BANDS[0][0]]
        overall["tuned" + suffix] += tuned
        overall["tuned 1-64" + suffix] += sheet["tuned " + BANDS[0][0]]
    said = regime_notes(curves, cluster_base(cluster, fabric=True))
    print(f"  size bands the datasheet model (fabric {kind!r}) does not reach, as `nbox calibrate --nccl-tests` "
          f"names them: {len(said) or 'none'}")
    for line in said:
        print(f"    {Path(line.split(':', 1)[0]).name}:{line.split(':', 1)[1].split(' (', 1)[0]}")


def scenario_fit_errors(cluster: str, curves: list[Curve]) -> list[tuple[int, float, bool]]:
    """(size, |error|, noise) at sizes >= 1 MiB of each curve's fitted scenario (``nbox calibrate --nccl-tests`` on
    the cluster's datasheet with its fabric and host facts) priced at every other node count of its collective, as
    ``nbox scenario cost --compare`` prices it: the fit in its regime and step messages, the datasheet model
    elsewhere (``emulator_core.pricing.pricer._fit_pricer``); noise: slower than its next larger size."""
    base = cluster_base(cluster, fabric=True)
    out: list[tuple[int, float, bool]] = []
    for ref in curves:
        scenario, _ = calibrate_from_curves([ref], base)
        for target in curves:
            if target.collective != ref.collective or target.nodes == ref.nodes \
                    or target.gpus_per_node != ref.gpus_per_node:
                continue
            noise = _noisy(target)
            out += [(r.size_bytes, abs(r.error), r.size_bytes in noise) for r in compare(scenario, target)
                    if r.size_bytes >= 1 << 20]
    return out


def _noisy(curve: Curve) -> set[int]:
    """Sizes of ``curve`` slower than its next larger size: noise, left out of the worst (issue 60's rule)."""
    pts = curve.points
    return {pts[i].size_bytes for i in range(len(pts) - 1) if pts[i].time_us > pts[i + 1].time_us}


def physics_errors(cluster: str, curves: list[Curve]) -> dict[str, list[tuple[float, bool]]]:
    """(|error|, noise) at sizes >= 1 MiB of the physics fit (``nbox calibrate --nccl-tests --model physics`` on the
    cluster's datasheet with its fabric): ``own``, every curve against the figures fitted to all of them;
    ``one``, each multi-node curve's figures carried to every other multi-node count of its collective;
    ``rest``, each multi-node count predicted from the figures fitted to the cluster's other node counts."""
    base = cluster_base(cluster, fabric=True)
    out: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    _, fit = fit_physics(curves, base)
    noise = {c.path: _noisy(c) for c in curves}
    out["own"] = [(abs(r.model_us / r.real_us - 1), r.size_bytes in noise[r.path]) for r in fit.residuals
                  if r.size_bytes >= 1 << 20]
    for ref in (c for c in curves if c.nodes > 1):
        scenario, _ = fit_physics([ref], base)
        for target in curves:
            if target.collective != ref.collective or target.nodes in (1, ref.nodes) \
                    or target.gpus_per_node != ref.gpus_per_node:
                continue
            out["one"] += [(abs(r.error), r.size_bytes in noise[target.path]) for r in compare(scenario, target)
                           if r.size_bytes >= 1 << 20]
    for c, _, times in carried(curves, base):
        out["rest"] += [(abs(t / pt.time_us - 1), pt.size_bytes in noise[c.path])
                        for pt, t in zip(c.points, times, strict=True) if pt.size_bytes >= 1 << 20]
    return out


def pstats(pairs: list[tuple[float, bool]]) -> str:
    """:func:`stats` of (|error|, noise) pairs: the median over all, the worst over the points not noise."""
    return stats([e for e, _ in pairs], [e for e, n in pairs if not n])


def band(size: int) -> str:
    return next(name for name, lo, hi in BANDS if lo <= size <= hi)


def stats(errs: list[float], worst: list[float] | None = None) -> str:
    """Median and worst |error| of ``errs`` (the worst over ``worst`` where given: the points not left out as noise)."""
    if not errs:
        return "-"
    top = max(errs if worst is None else worst or [math.nan])
    return f"median {100 * statistics.median(errs):5.1f}%  worst {100 * top:6.1f}%  ({len(errs)} points)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="print every predicted point")
    args = parser.parse_args()
    base = base_scenario(None)
    fabric = datasheet_of(base)
    print(f"datasheet: the shipped dgx_h100_400g (NVLink {fabric.intra_bw_gbps:g} GB/s, NIC "
          f"{fabric.inter_bw_gbps:g} GB/s per GPU, NVLS {fabric.nvls}); sizes >= 1 MiB")
    overall: dict[str, list[Any]] = defaultdict(list)
    for cluster, curves in load().items():
        by_band: dict[str, list[float]] = defaultdict(list)
        same_regime: list[float] = []
        crossing: list[float] = []
        inside: list[float] = []
        outside: list[float] = []
        pairs = 0
        for ref in curves:
            fit = fit_curve(ref)
            lo, hi = fit.busbw[0][0], fit.busbw[-1][0]
            for target in curves:
                if target.collective != ref.collective or target.nodes == ref.nodes \
                        or target.gpus_per_node != ref.gpus_per_node:
                    continue
                pairs += 1
                for pt in target.points:
                    if pt.size_bytes < 1 << 20:
                        continue
                    model = time_us(fit, pt.size_bytes, target.nodes, fabric)
                    err = abs(model / pt.time_us - 1)
                    by_band[band(pt.size_bytes)].append(err)
                    (same_regime if regime(ref.nodes) == regime(target.nodes) else crossing).append(err)
                    m = step_bytes(target.collective, pt.size_bytes, target.ranks)
                    (inside if lo <= m <= hi else outside).append(err)
                    if args.verbose:
                        print(f"  {cluster} {ref.collective} {ref.nodes}->{target.nodes} nodes {pt.size_bytes:>11} "
                              f"real {pt.time_us:10.1f} nbox {model:10.1f} {100 * (model / pt.time_us - 1):+6.1f}%")
        print(f"\n{cluster}: {len(curves)} curves, {pairs} (fitted node count -> other node count) pairs")
        for name, _, _ in BANDS:
            print(f"  fit -> other node count, {name:>14}: {stats(by_band[name])}")
        allerr = [e for v in by_band.values() for e in v]
        print(f"  fit -> other node count, {'all':>14}: {stats(allerr)}")
        print(f"    of which within NCCL's node regime (1, 2, >2 nodes): {stats(same_regime)}")
        print(f"    of which across regimes:                          {stats(crossing)}")
        print(f"    of which step message inside the fitted range: {stats(inside)}")
        print(f"    of which extrapolated beyond it:               {stats(outside)}")
        priced: dict[str, list[float]] = defaultdict(list)
        for size, err, _ in scenario_fit_errors(cluster, curves):
            priced[band(size)].append(err)
        overall["priced"] += [e for v in priced.values() for e in v]
        for name, _, _ in BANDS:
            print(f"  fitted scenario as priced,{name:>14}: {stats(priced[name])}")
        print(f"  fitted scenario as priced,{'all':>14}: {stats([e for v in priced.values() for e in v])}  (the fit "
              f"where it measured, the datasheet model with the cluster's fabric elsewhere)")
        phys = physics_errors(cluster, curves)
        for key, label in (("own", "every curve, the figures fitted to all"),
                           ("one", "one node count's figures -> the others"),
                           ("rest", "the other node counts' figures -> each")):
            print(f"  physics fit, {label:<40}: {pstats(phys[key])}")
            overall["physics " + key + " pairs"] += phys[key]
        between: list[float] = []
        for target in curves:
            fits = tuple(fit_curve(c) for c in curves if c is not target and c.collective == target.collective
                         and c.gpus_per_node == target.gpus_per_node)
            pair = bracket(fits, target.collective, target.nodes, target.gpus_per_node)
            if pair is None:
                continue
            between += [abs(between_us(*pair, pt.size_bytes, target.nodes, fabric) / pt.time_us - 1)
                        for pt in target.points if pt.size_bytes >= 1 << 20]
        print(f"  fits at the node counts around it -> the one between: {stats(between)}")
        overall["between"] += between
        overall["fit"] += allerr
        overall["same"] += same_regime
        print_datasheet(cluster, curves, overall, args.verbose)
    print(f"\nall clusters: fit -> other node count {stats(overall['fit'])}")
    print(f"all clusters: fit -> other node count in the same regime {stats(overall['same'])}")
    print(f"all clusters: fits around a node count -> it  {stats(overall['between'])}")
    print(f"all clusters: fitted scenario as priced at other node counts {stats(overall['priced'])}")
    print(f"all clusters: datasheet, no fabric        {stats(overall['datasheet'])}")
    print(f"all clusters: datasheet, no fabric, 1-64 MiB {stats(overall['datasheet 1-64'])}")
    print(f"all clusters: datasheet, with fabric      {stats(overall['datasheet after'])}")
    print(f"all clusters: datasheet, with fabric, 1-64 MiB {stats(overall['datasheet 1-64 after'])}")
    for suffix, label in (("", "no fabric"), (" after", "with fabric")):
        print(f"all clusters, NCCL-tuned collectives on several nodes, {label}: {stats(overall['tuned' + suffix])}; "
              f"1-64 MiB {stats(overall['tuned 1-64' + suffix])}")
    for key, label in (("own", "every curve, the figures fitted to all"),
                       ("one", "one node count's figures -> the others"),
                       ("rest", "the other node counts' figures -> each")):
        print(f"all clusters: physics fit, {label}: {pstats(overall['physics ' + key + ' pairs'])}  (worst "
              f"without the noise points)")
    held: dict[str, list[float]] = defaultdict(list)
    for cluster, curves in load_heldout().items():
        print(f"\nHELD OUT {cluster}: {len(curves)} curves (no default is set from them)")
        print_datasheet(cluster, curves, held, args.verbose)
        phys = physics_errors(cluster, curves)
        for key, label in (("own", "every curve, the figures fitted to all"),
                           ("one", "one node count's figures -> the others"),
                           ("rest", "the other node counts' figures -> each")):
            print(f"  physics fit, {label:<40}: {pstats(phys[key])}")
        carried_curve = [(e, n) for _, e, n in scenario_fit_errors(cluster, curves)]
        print(f"  curve fit as priced, one node count -> the others:   {pstats(carried_curve)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
