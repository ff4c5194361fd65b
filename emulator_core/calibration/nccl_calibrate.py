"""``nbox calibrate --nccl-tests`` and ``nbox scenario cost --compare``: nccl-tests curves in, a fabric out.

:func:`fit_curve` turns one curve (:mod:`emulator_core.network.nccl_tests`) into an ``[[nccl_fit]]`` entry
(:mod:`emulator_core.scenario.nccl_fit` says what each term is and what it is fitted from);
:func:`calibrate_from_curves` puts every curve's entry on a base scenario whose node dimension is the curves' GPUs per
node and whose outermost dimension fills the world (so ``--world-size`` or ``--set world_size=...`` grows the nodes),
and reports the fit error per collective and size: in-sample at the curve's own node count, and predicted from the
nearest other node count of the same collective where the files give one (what the fit is for). :func:`compare` prices a
scenario against one curve, size by size. :func:`write_fabric` writes the scenario atomically.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from emulator_core.calibration.physics_fit import carried, curve_times, fit_physics, gpus_per_node, physics_notes
from emulator_core.network import BUS_FACTORS, Curve, NcclTestsError, Point
from emulator_core.pricing import datasheet_of, time_us
from emulator_core.scenario import NcclFit, Scenario, Topology, dump_toml, nccl_fit
from nbox_trace.files import write_atomic

__all__ = ["MODELS", "FitRow", "NcclTestsConfig", "base_scenario", "calibrate_from_curves", "calibrate_nccl_tests",
           "calibrate_physics", "compare", "fit_curve", "format_rows", "notes", "read_curves", "regime_notes",
           "row_dict", "summary", "write_fabric"]

#: Significant digits kept in the written table.
_DIGITS = 5
#: The size bands a curve is set against the datasheet model in (name, smallest, largest bytes).
SIZE_BANDS = (("1-64 MiB", 1 << 20, 64 << 20), ("128 MiB-1 GiB", (64 << 20) + 1, 1 << 30),
              (">= 2 GiB", (1 << 30) + 1, 1 << 62))
#: ``--model``: ``curve`` writes each curve as an ``[[nccl_fit]]`` entry (:func:`fit_curve`); ``physics`` fits the
#: datasheet model's figures to the curves (:mod:`emulator_core.calibration.physics_fit`).
MODELS = ("curve", "physics")
#: How far a band's median measured time may sit from the datasheet model before it is named a regime (x or 1/x).
REGIME_RATIO = 1.25


def _sig(x: float) -> float:
    return float(f"{x:.{_DIGITS}g}")


@dataclass(frozen=True)
class FitRow:
    """One size of one curve: nccl-tests ``size_bytes``, the measured and modeled times (us), and the relative
    error ``(model - real) / real``. ``source``: where the model came from (``fit``: this curve's own entry;
    ``from NxG``: the entry of another node count; ``scenario``: a scenario's pricing)."""

    path: str
    collective: str
    nodes: int
    gpus_per_node: int
    size_bytes: int
    real_us: float
    model_us: float
    source: str

    @property
    def error(self) -> float:
        return (self.model_us - self.real_us) / self.real_us


def fit_curve(curve: Curve) -> NcclFit:
    """The ``[[nccl_fit]]`` entry of one curve: the floor is the median time of the sizes up to
    :data:`~emulator_core.scenario.nccl_fit.FLOOR_MAX_BYTES` (0 when none was measured); the table is each larger size's
    bus bandwidth of its time above the floor, at its step message; a size whose time is within 5% of the floor
    carries no bandwidth and is left out (below the table, :meth:`NcclFit.busbw_at` extrapolates); a size slower per
    step than the next larger one is noise and takes that one's time (``nccl_fit.monotone``)."""
    floor, bound = _floor_and_table_points(curve)
    p = curve.ranks
    factor = BUS_FACTORS[curve.collective](p)
    share = nccl_fit.network_share(curve.collective, curve.nodes)
    table: list[tuple[float, float]] = []
    for pt in bound:
        rest = max(pt.time_us - floor, 0.05 * pt.time_us)
        m = nccl_fit.step_bytes(curve.collective, pt.size_bytes, p)
        if table and m <= table[-1][0]:
            continue
        bus = pt.size_bytes * factor * share / (rest * 1e3) if factor > 0 else pt.size_bytes / (rest * 1e3)
        table.append((m, bus))
    clean = nccl_fit.monotone(tuple(table))  # a slower point than the next larger one: noise
    return NcclFit(curve.collective, curve.nodes, curve.gpus_per_node, _sig(floor),
                   tuple((m, _sig(b)) for m, b in clean), Path(curve.path).name[:256])


def _floor_and_table_points(curve: Curve) -> tuple[float, list[Point]]:
    """:func:`fit_curve`'s latency floor and the points its table is built from (above the floor by 5% or more)."""
    small = [pt.time_us for pt in curve.points if pt.size_bytes <= nccl_fit.FLOOR_MAX_BYTES]
    floor = statistics.median(small) if small else 0.0
    big = [pt for pt in curve.points if pt.size_bytes > nccl_fit.FLOOR_MAX_BYTES] or list(curve.points)
    return floor, [pt for pt in big if pt.time_us - floor >= 0.05 * pt.time_us] or big[-1:]


def _rows(curve: Curve, fit: NcclFit, scenario: Scenario, source: str) -> list[FitRow]:
    fabric = datasheet_of(scenario)
    return [FitRow(curve.path, curve.collective, curve.nodes, curve.gpus_per_node, pt.size_bytes, pt.time_us,
                   time_us(fit, pt.size_bytes, curve.nodes, fabric), source) for pt in curve.points]


def calibrate_from_curves(curves: Sequence[Curve], base: Scenario) -> tuple[Scenario, list[FitRow]]:
    """The fabric of ``curves`` (one cluster: the same GPUs per node) on ``base``'s topology, and the fit rows.

    Raises:
        NcclTestsError: no curves, curves of different GPUs per node, two curves of one collective and node
            count, or a base scenario without a node dimension and a network dimension.
    """
    g = gpus_per_node(curves)
    _one_per_shape(curves)
    dims = base.topology.dims
    if len(dims) < 2:
        raise NcclTestsError("the base scenario has one topology dimension; nccl-tests curves need a node "
                             "dimension (NVLink) and a network dimension (e.g. the shipped dgx_h100_400g)")
    nodes = max(c.nodes for c in curves)
    topology = Topology((replace(dims[0], size=g), replace(dims[-1], size=0)))
    fits = tuple(fit_curve(c) for c in curves)
    scenario = Scenario(world_size=g * nodes, topology=topology, algorithms=base.algorithms,
                        compute_scale=base.compute_scale, overlap=base.overlap, network=base.network,
                        nccl_fit=fits)
    rows: list[FitRow] = []
    for c, f in zip(curves, fits, strict=True):
        rows += _rows(c, f, scenario, "fit")
        others = [o for o in fits if o.collective == c.collective and o.nodes != c.nodes]
        if others:
            near = min(others, key=lambda o: (abs(math.log(o.nodes / c.nodes)), -o.nodes))
            rows += _rows(c, near, scenario, f"from {near.nodes}x{near.gpus_per_node}")
    return scenario, rows


def _one_per_shape(curves: Sequence[Curve]) -> None:
    """:class:`NcclTestsError` where two curves measured one collective at one node count (or one file twice)."""
    seen: dict[tuple[str, int], str] = {}
    for c in curves:
        key = (c.collective, c.nodes)
        if key in seen:
            raise NcclTestsError(f"{c.path}: {c.collective} on {c.nodes} node(s) is also in {seen[key]}; give one "
                                 f"curve per collective and node count")
        seen[key] = c.path


def compare(scenario: Scenario, curve: Curve) -> list[FitRow]:
    """``scenario``'s modeled time of ``curve``'s collective at each of its sizes on its shape (the scenario
    resized to ``nodes x gpus_per_node`` ranks), beside the measured time.

    Raises:
        NcclTestsError: the scenario's node dimension does not hold the curve's GPUs per node.
    """
    node = scenario.topology.dims[0]
    if len(scenario.topology.dims) > 1 and node.size != curve.gpus_per_node:
        raise NcclTestsError(f"{curve.path}: ran {curve.gpus_per_node} GPUs per node, the scenario's node "
                             f"dimension {node.name!r} has {node.size}; use --set topology.dims.0.size="
                             f"{curve.gpus_per_node}")
    return [FitRow(curve.path, curve.collective, curve.nodes, curve.gpus_per_node, pt.size_bytes, pt.time_us, t, name)
            for pt, (name, t) in zip(curve.points, curve_times(scenario, curve), strict=True)]


def write_fabric(scenario: Scenario, out: Path) -> Path:
    """Write the scenario as TOML, atomically (temporary file and rename: never half a file)."""
    return write_atomic(out, dump_toml(scenario))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_rows(rows: Sequence[FitRow], *, min_bytes: int = 0, compared: bool = False) -> str:
    """A plain table: one block per (file, model source), one line per size, then the median and worst |error|
    at sizes >= 1 MiB. ``compared``: one block per file, the source (the algorithm priced) on each line."""
    out: list[str] = []
    blocks: dict[tuple[str, str], list[FitRow]] = {}
    for r in rows:
        if r.size_bytes >= min_bytes:
            blocks.setdefault((r.path, "scenario" if compared else r.source), []).append(r)
    for (path, source), block in blocks.items():
        r0 = block[0]
        out.append(f"{path}: {r0.collective} on {r0.nodes}x{r0.gpus_per_node}, model: {source}")
        out.append(f"  {'size':>10} {'real us':>11} {'nbox us':>11} {'error':>8}" + ("  algorithm" if compared else ""))
        for r in block:
            out.append(f"  {_size(r.size_bytes):>10} {r.real_us:>11.1f} {r.model_us:>11.1f} {100 * r.error:>+7.1f}%"
                       + (f"  {r.source}" if compared else ""))
        big = [abs(r.error) for r in block if r.size_bytes >= 1 << 20]
        if big:
            out.append(f"  sizes >= 1 MiB: median |error| {100 * statistics.median(big):.1f}%, worst "
                       f"{100 * max(big):.1f}% over {len(big)} sizes")
    return "\n".join(out)


@dataclass(frozen=True)
class NcclTestsConfig:
    """What ``nbox calibrate --nccl-tests`` was asked: the files, the collective and shape for files that do not
    say them (``None``: the files must), the base scenario (``None``: the shipped dgx_h100_400g) and the model
    (:data:`MODELS`)."""

    files: tuple[Path, ...]
    collective: str | None = None
    shape: tuple[int, int] | None = None
    base: Path | None = None
    overrides: tuple[str, ...] = ()
    model: str = "curve"

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise NcclTestsError(f"--model {self.model!r}: one of {', '.join(MODELS)}")


def read_curves(cfg: NcclTestsConfig) -> list[Curve]:
    """Every file of ``cfg`` read (:func:`emulator_core.network.nccl_tests.read_curve`)."""
    from emulator_core.network import read_curve

    return [read_curve(f, collective=cfg.collective, shape=cfg.shape) for f in cfg.files]


def base_scenario(path: Path | None, overrides: Sequence[str] = ()) -> Scenario:
    """The scenario a fabric is fitted on: ``path``, else the shipped ``dgx_h100_400g`` (a node dimension and a
    network dimension, as nccl-tests curves need)."""
    from emulator_core.scenario import SCENARIOS_DIR, load_scenario

    return load_scenario(path if path is not None else SCENARIOS_DIR / "dgx_h100_400g.toml", tuple(overrides))


def calibrate_nccl_tests(cfg: NcclTestsConfig, out: Path) -> tuple[Scenario, list[FitRow], list[str]]:
    """Read the files, fit, write the scenario to ``out`` atomically; the scenario, the fit rows and the
    :func:`notes`. Nothing is written when a file is refused."""
    curves = read_curves(cfg)
    base = base_scenario(cfg.base, cfg.overrides)
    if cfg.model == "physics":
        scenario, rows, said = calibrate_physics(curves, base)
        write_fabric(scenario, out)
        return scenario, rows, said + regime_notes(curves, base, physics=True)
    scenario, rows = calibrate_from_curves(curves, base)
    write_fabric(scenario, out)
    return scenario, rows, notes(curves, scenario) + regime_notes(curves, base)


def calibrate_physics(curves: Sequence[Curve], base: Scenario) -> tuple[Scenario, list[FitRow], list[str]]:
    """``--model physics``: the scenario with the datasheet model's figures fitted to ``curves``
    (:func:`emulator_core.calibration.physics_fit.fit_physics`), the rows (each point against the fit, source
    ``physics``; each node count of a collective measured at others too, from the figures fitted without it) and
    the notes (the figures, the residuals' spread, noise and outliers)."""
    _one_per_shape(curves)
    scenario, fit = fit_physics(curves, base)
    by_path = {c.path: c for c in curves}
    rows = [FitRow(r.path, r.collective, r.nodes, by_path[r.path].gpus_per_node, r.size_bytes, r.real_us,
                   r.model_us, "physics") for r in fit.residuals]
    for c, label, times in carried(curves, base):
        rows += [FitRow(c.path, c.collective, c.nodes, c.gpus_per_node, pt.size_bytes, pt.time_us, t, label)
                 for pt, t in zip(c.points, times, strict=True)]
    return scenario, rows, physics_notes(fit)


def regime_notes(curves: Sequence[Curve], base: Scenario, *, physics: bool = False) -> list[str]:
    """Where a curve sits in a regime the datasheet model cannot reach, by size band: the base scenario (its
    figures, fabric and library, with no fit) priced on each curve's shape, and every band whose median measured
    time is :data:`REGIME_RATIO` or more away from it named. Faster than the model: something the model does not
    have (in-network reduction, SHARP, NVLS on a switch the scenario does not say reduces, adaptive routing, or a
    faster fabric than the datasheet). Slower: a network below its datasheet (congestion, a shared or misconfigured
    fabric) or a setting the scenario lacks. The curve fit prices such a band from its own points either way; the
    model's parameters are not bent to it (``physics``: the physics fit does not bend them either, and says the band
    will miss)."""
    if len(base.topology.dims) < 2:
        return []
    out: list[str] = []
    tail = ("the physics fit's figures are not bent to it: expect this band to miss by about as much" if physics
            else "the fit prices it from its points")
    for c in curves:
        dims = base.topology.dims
        sized = replace(base, topology=replace(base.topology, dims=(replace(dims[0], size=c.gpus_per_node),
                                                                    *dims[1:])))
        rows = compare(sized, c)
        for name, lo, hi in SIZE_BANDS:
            band = [r for r in rows if lo <= r.size_bytes <= hi and r.model_us > 0]
            if not band:
                continue
            mid = statistics.median(r.real_us / r.model_us for r in band)
            algo = statistics.mode(r.source for r in band)
            if mid <= 1 / REGIME_RATIO:
                out.append(f"{c.path}: {name}: measured {1 / mid:.2f}x faster than the datasheet model on "
                           f"{c.nodes}x{c.gpus_per_node} ({algo}): a regime the model does not reach "
                           f"(in-network reduction, NVLS, adaptive routing, or a faster fabric than the datasheet's); "
                           f"{tail}")
            elif mid >= REGIME_RATIO:
                out.append(f"{c.path}: {name}: measured {mid:.2f}x slower than the datasheet model on "
                           f"{c.nodes}x{c.gpus_per_node} ({algo}): the fabric does less than its "
                           f"datasheet (congestion, sharing, a setting the scenario lacks such as its fabric kind); "
                           f"{tail}")
    return out


def summary(rows: Sequence[FitRow], *, min_bytes: int = 1 << 20, compared: bool = False) -> list[dict[str, object]]:
    """Per (file, model source): the median and worst |error| (%) at sizes >= ``min_bytes`` (``compared``: per
    file, whatever algorithm priced each size)."""
    blocks: dict[tuple[str, str], list[FitRow]] = {}
    for r in rows:
        blocks.setdefault((r.path, "scenario" if compared else r.source), []).append(r)
    out: list[dict[str, object]] = []
    for (path, source), block in blocks.items():
        errs = [abs(r.error) for r in block if r.size_bytes >= min_bytes]
        out.append({"file": path, "collective": block[0].collective, "nodes": block[0].nodes,
                    "gpus_per_node": block[0].gpus_per_node, "model": source, "sizes": len(errs),
                    "median_abs_error_pct": round(100 * statistics.median(errs), 2) if errs else None,
                    "worst_abs_error_pct": round(100 * max(errs), 2) if errs else None})
    return out


def row_dict(r: FitRow) -> dict[str, object]:
    return {"file": r.path, "collective": r.collective, "nodes": r.nodes, "gpus_per_node": r.gpus_per_node,
            "size_bytes": r.size_bytes, "real_us": r.real_us, "model_us": round(r.model_us, 3),
            "error_pct": round(100 * r.error, 2), "model": r.source}


def notes(curves: Sequence[Curve], scenario: Scenario) -> list[str]:
    """What a user should know about the curves against the datasheet (stderr, and ``notes`` in ``--json``): each
    fit's terms in datasheet units, each size slower than the next larger one (read as noise), a curve on 2 nodes
    whose bus bandwidth beats the NICs' line rate ran an NVLink-assisted algorithm (priced at more nodes through
    NCCL's regime ratio), and a curve on more nodes whose bus bandwidth beats the node's NICs together says the
    datasheet's NIC figure is too low (the regime ratio reads it)."""
    fabric = datasheet_of(scenario)
    out: list[str] = []
    for c, fit in zip(curves, scenario.nccl_fit, strict=False):
        big = fit.busbw[-1]
        out.append(f"{c.path}: fitted latency floor {fit.latency_us:g} us (the median up to "
                   f"{_size(nccl_fit.FLOOR_MAX_BYTES)}), bus bandwidth above it {fit.busbw[0][1]:g} GB/s at a "
                   f"{_size(int(fit.busbw[0][0]))} step to {big[1]:g} GB/s at {_size(int(big[0]))} and beyond "
                   f"(the datasheet's NIC: {fabric.inter_bw_gbps:g} GB/s a GPU, NVLink {fabric.intra_bw_gbps:g})")
        for a, b in itertools.pairwise(_floor_and_table_points(c)[1]):
            if a.time_us > b.time_us:
                out.append(f"{c.path}: {_size(a.size_bytes)} took {a.time_us:g} us, more than {_size(b.size_bytes)}'s "
                           f"{b.time_us:g} us: noise, priced at the larger size's time")
    for c in curves:
        peak = max(pt.busbw_gbps for pt in c.points)
        node_nics = fabric.inter_bw_gbps * c.gpus_per_node
        if c.nodes == 2 and c.collective == "all_reduce" and peak > node_nics:
            out.append(f"{c.path}: busbw {peak:g} GB/s on 2 nodes is above the NICs' line rate ({node_nics:g} GB/s "
                       f"a node): an NVLink-assisted algorithm; more nodes are priced through NCCL's regime ratio")
        elif c.nodes > 2 and c.collective in ("all_reduce", "all_gather", "reduce_scatter") and peak > node_nics:
            out.append(f"{c.path}: busbw {peak:g} GB/s is above the datasheet's NICs ({node_nics:g} GB/s a node); "
                       f"set the network dimension's bandwidth_gbps to the cluster's (--set)")
    return out
