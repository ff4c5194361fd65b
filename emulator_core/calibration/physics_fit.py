"""``nbox calibrate --nccl-tests --model physics``: nccl-tests curves in, a datasheet scenario with fitted figures out.

The datasheet path prices a collective by NCCL's own model (:mod:`emulator_core.pricing.nccl_tuner`, with the
network's ``fabric`` kind: :mod:`emulator_core.network.fabric_kinds`): for every algorithm and protocol, steps times
a per-step latency, plus each network hop's store-and-forward slice (the pipeline's fill), plus the bytes over the
bandwidth of the channels, and the cheapest wins. Three physical figures set it, and :func:`fit_physics` fits them
to the curves instead of replaying their points:

* **NVLink bandwidth per GPU** (the node dimension's ``bandwidth_gbps``), from the one-node curves alone (they do not
  touch the network) at sizes from :data:`NVLINK_MIN_BYTES` (below, NCCL's own intra-node latencies, not fitted);
  kept at the datasheet's when there are none;
* **NIC bandwidth per GPU** (the network dimension's ``bandwidth_gbps`` times its ``links_per_rank``) and
* **network latency per step** (its ``net_latency_us``, NCCL's ``latencyInter``, added to each inter-node step and
  twice for Simple), both from the multi-node curves together.

The fit minimizes the Huber loss (:data:`HUBER_DELTA`) of ``log(model / measured)`` over every point: within 10% a
point pulls as in least squares, beyond it with a constant force, so one bad point moves the figures little. A size
that took longer than the next larger size of its curve (by more than 5%) is noise and left out. The search is a log
grid per figure, then golden-section refinement of each in turn. The written scenario is the base with those figures
set and no ``[[nccl_fit]]`` table: every size, node count and collective is NCCL's model's, non-decreasing in size by
construction (each candidate's time is non-decreasing and the model takes their minimum).

Each point's residual is reported; a point beyond :data:`OUTLIER_SCALES` robust scales (1.4826 x the median absolute
deviation of the residuals) and more than :data:`HUBER_DELTA` off is named an outlier. Where a collective was measured
at several node counts, each node count is also predicted from a fit to the others: how far the figures carry.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from emulator_core.network import Curve, NcclTestsError, net_fabric
from emulator_core.pricing import group_shape, make_pricer
from emulator_core.scenario import Dimension, Scenario, Topology, resize

__all__ = ["HUBER_DELTA", "NOISE_TOLERANCE", "NVLINK_MIN_BYTES", "OUTLIER_SCALES", "PhysicsFit", "Residual", "carried",
           "curve_times", "fit_physics", "gpus_per_node", "physics_notes", "sized_base"]

#: Where the loss turns from squares to a constant pull: a point 10% off pulls no harder than one 10% off.
HUBER_DELTA = math.log(1.10)
#: A residual this many robust scales from the median (and beyond HUBER_DELTA) is named an outlier.
OUTLIER_SCALES = 3.0
#: A point slower than the next larger size of its curve by more than this factor is noise, left out of the fit.
NOISE_TOLERANCE = 1.05
#: One-node curves fit NVLink's bandwidth from these sizes up (below, NCCL's own intra-node latencies rule).
NVLINK_MIN_BYTES = 1 << 20
#: The grids, as factors of the datasheet figure (bandwidths) and in microseconds (latency).
_BW_FACTORS = tuple(2.0 ** (k / 4) for k in range(-20, 9))
_LATENCIES_US = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0)
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Residual:
    """One measured point against the fitted model: ``residual`` is ``log(model / measured)``; ``noise``: slower
    than the next larger size of its curve by more than :data:`NOISE_TOLERANCE` (left out of the fit); ``outlier``:
    see the module docstring."""

    path: str
    collective: str
    nodes: int
    size_bytes: int
    real_us: float
    model_us: float
    noise: bool = False
    outlier: bool = False

    @property
    def residual(self) -> float:
        return math.log(self.model_us / self.real_us)


@dataclass(frozen=True)
class PhysicsFit:
    """The fitted figures (GB/s per GPU per direction, us per step), the datasheet's before the fit, the fabric kind,
    the residuals and their robust scale (log units)."""

    nvlink_gbps: float
    nic_gbps: float
    net_latency_us: float
    datasheet_nvlink_gbps: float
    datasheet_nic_gbps: float
    datasheet_latency_us: float
    fabric: str
    nvlink_fitted: bool
    network_fitted: bool
    residuals: tuple[Residual, ...]
    scale: float


def _noise(curve: Curve) -> set[int]:
    """Indices of the points slower than the next larger size of their curve by more than :data:`NOISE_TOLERANCE`
    (a latency-bound curve wobbles by a fraction of a microsecond: that is no noise worth naming)."""
    pts = curve.points
    return {i for i in range(len(pts) - 1) if pts[i].time_us > NOISE_TOLERANCE * pts[i + 1].time_us}


def _with(base: Scenario, nvlink_gbps: float, nic_gbps: float, latency_us: float) -> Scenario:
    """``base`` (node dimension, network dimension) with the three figures set (bandwidths in GB/s per GPU)."""
    node, net = base.topology.dims[0], base.topology.dims[-1]
    node = replace(node, bandwidth_gbps=_sig(nvlink_gbps * 8 / node.links_per_rank))
    net = replace(net, bandwidth_gbps=_sig(nic_gbps * 8 / net.links_per_rank), net_latency_us=_sig(latency_us))
    return replace(base, topology=Topology((node, *base.topology.dims[1:-1], net)))


def _sig(x: float) -> float:
    """``x`` to 4 significant digits (what the written scenario keeps; the fit is not finer than that)."""
    return float(f"{x:.4g}")


def _huber(r: float) -> float:
    a = abs(r)
    return a * a / 2 if a <= HUBER_DELTA else HUBER_DELTA * (a - HUBER_DELTA / 2)


def _golden(f: Callable[[float], float], lo: float, hi: float, prefer: float, iters: int = 14) -> float:
    """The argmin of ``f`` on ``[lo, hi]`` (golden-section; ``f`` need not be smooth: the best seen is kept, and
    of equal ones the nearest to ``prefer``)."""
    seen: dict[float, float] = {}

    def g(x: float) -> float:
        if x not in seen:
            seen[x] = f(x)
        return seen[x]

    a, b = lo, hi
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    for _ in range(iters):
        if (_level(g(c)), abs(c - prefer)) <= (_level(g(d)), abs(d - prefer)):
            b, d = d, c
            c = b - _GOLDEN * (b - a)
        else:
            a, c = c, d
            d = a + _GOLDEN * (b - a)
    g(lo), g(hi)
    return min(seen, key=lambda x: (_level(seen[x]), abs(x - prefer)))


def _level(loss: float) -> float:
    """A loss rounded so that equal fits compare equal: NCCL's graph runs a channel at one of a few discrete speeds
    (``src/graph/search.cc``), so a range of NIC figures prices every size alike, and the fit keeps the one nearest the
    datasheet's."""
    return float(f"{loss:.9g}") if loss > 1e-12 else 0.0


def curve_times(scenario: Scenario, curve: Curve) -> list[tuple[str, float]]:
    """``scenario``'s (algorithm, time in us) of ``curve``'s collective at each of its sizes, on its shape (the
    scenario resized to ``nodes x gpus_per_node`` ranks; all-gather's nccl-tests size is the output, nbox prices the
    per-rank input)."""
    sized = resize(scenario, curve.ranks)
    pricer = make_pricer(sized, curve.collective, group_shape(sized))
    per_rank_input = curve.collective in ("all_gather", "gather", "scatter")
    return [pricer(pt.size_bytes / curve.ranks if per_rank_input else pt.size_bytes) for pt in curve.points]


def _model_us(scenario: Scenario, curves: Sequence[Curve]) -> list[list[float]]:
    return [[t for _, t in curve_times(scenario, c)] for c in curves]


def _loss(scenario: Scenario, curves: Sequence[Curve], keep: list[list[bool]]) -> float:
    total = 0.0
    for c, times, mask in zip(curves, _model_us(scenario, curves), keep, strict=True):
        for pt, t, k in zip(c.points, times, mask, strict=True):
            if k:
                total += _huber(math.log(max(t, 1e-9) / pt.time_us))
    return total


def _search(loss: Callable[[float, float], float], x_grid: Sequence[float], y_grid: Sequence[float],
            log_x: bool, log_y: bool, prefer: tuple[float, float]) -> tuple[float, float]:
    """A 2-D minimum of ``loss``: the best grid point, then golden-section refinement of each coordinate between
    its grid neighbours, twice; of equal fits, the nearest to ``prefer`` (the datasheet's figures)."""
    def away(xy: tuple[float, float]) -> float:
        return abs(math.log(xy[0] / prefer[0])) if log_x else abs(xy[0] - prefer[0])

    x, y = min(itertools.product(x_grid, y_grid), key=lambda xy: (_level(loss(*xy)), away(xy), abs(xy[1] - prefer[1])))

    def span(v: float, grid: Sequence[float]) -> tuple[float, float]:
        i = min(range(len(grid)), key=lambda j: abs(grid[j] - v))
        return grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]

    def along(f: Callable[[float], float], v: float, grid: Sequence[float], log: bool, near: float) -> float:
        lo, hi = span(v, grid)
        if log:
            return math.exp(_golden(lambda u: f(math.exp(u)), math.log(lo), math.log(hi), math.log(near)))
        return _golden(f, lo, hi, near)

    for _ in range(2):
        x = along(functools.partial(_first, loss, y), x, x_grid, log_x, prefer[0])
        if len(y_grid) > 1:
            y = along(functools.partial(loss, x), y, y_grid, log_y, prefer[1])
    return x, y


def _first(loss: Callable[[float, float], float], y: float, x: float) -> float:
    return loss(x, y)


def _fit(curves: Sequence[Curve], base: Scenario) -> tuple[float, float, float, bool, bool]:
    """The three figures fitted to ``curves`` on ``base`` (already sized to their GPUs per node)."""
    node, net = base.topology.dims[0], base.topology.dims[-1]
    nvlink0 = node.bandwidth_bytes_per_us / 1e3
    nic0 = net.bandwidth_bytes_per_us / 1e3
    lat0 = _latency_us(net)
    keep = {id(c): [i not in _noise(c) for i in range(len(c.points))] for c in curves}
    one = [c for c in curves if c.nodes == 1]
    many = [c for c in curves if c.nodes > 1]
    nvlink = nvlink0
    if one:  # NCCL's intra-node latencies stay its own: the bandwidth is fitted where it dominates
        big = [[k and pt.size_bytes >= NVLINK_MIN_BYTES for k, pt in zip(keep[id(c)], c.points, strict=True)]
               for c in one]

        def loss_one(bw: float, _: float) -> float:
            return _loss(_with(base, bw, nic0, lat0), one, big)

        nvlink, _ = _search(loss_one, [nvlink0 * f for f in _BW_FACTORS if f <= 2], [0.0], True, False, (nvlink0, 0.0))
    nic, lat = nic0, lat0
    if many:
        def loss_many(bw: float, latency: float) -> float:
            return _loss(_with(base, nvlink, bw, latency), many, [keep[id(c)] for c in many])

        nic, lat = _search(loss_many, [nic0 * f for f in _BW_FACTORS], _LATENCIES_US, True, False, (nic0, lat0))
    return nvlink, nic, lat, bool(one), bool(many)


def sized_base(curves: Sequence[Curve], base: Scenario) -> Scenario:
    """``base`` as the curves' cluster: its node dimension holds their GPUs per node, its outermost dimension fills
    the world (``g x`` the most nodes measured).

    Raises:
        NcclTestsError: no curves, curves of different GPUs per node, or a base without a node dimension and a
            network dimension with a network ``fabric`` kind (the model needs the transport).
    """
    g = gpus_per_node(curves)
    dims = base.topology.dims
    if len(dims) < 2 or base.network.library != "nccl":
        raise NcclTestsError("--model physics fits NCCL's datasheet model: the base scenario needs a node dimension, "
                             "a network dimension and [network] library = \"nccl\" (e.g. the shipped dgx_h100_400g)")
    if not dims[-1].fabric:
        raise NcclTestsError(f"--model physics needs the network's kind: set the base's dimension {dims[-1].name!r} "
                             f"fabric (--set topology.dims.{len(dims) - 1}.fabric=infiniband, roce, efa, tcpx or "
                             f"tcpxo)")
    topology = Topology((replace(dims[0], size=g), replace(dims[-1], size=0)))
    return replace(base, world_size=g * max(c.nodes for c in curves), topology=topology, nccl_fit=())


def gpus_per_node(curves: Sequence[Curve]) -> int:
    """The one GPUs-per-node figure of ``curves``; :class:`NcclTestsError` when there are no curves or several
    figures (curves of one cluster are calibrated together)."""
    if not curves:
        raise NcclTestsError("no nccl-tests files given")
    gpn = {c.gpus_per_node for c in curves}
    if len(gpn) != 1:
        raise NcclTestsError(f"the files ran {sorted(gpn)} GPUs per node; give the curves of one cluster (one "
                             f"GPUs-per-node figure) per calibration")
    return gpn.pop()


def _latency_us(net: Dimension) -> float:
    """The network dimension's latency per step: its ``net_latency_us``, else its fabric kind's."""
    return net.net_latency_us if net.net_latency_us is not None else net_fabric(net.fabric).latency_us


def fit_physics(curves: Sequence[Curve], base: Scenario) -> tuple[Scenario, PhysicsFit]:
    """The scenario of ``curves`` (one cluster) with the three figures fitted (module docstring), and the fit."""
    sized = sized_base(curves, base)
    node, net = sized.topology.dims[0], sized.topology.dims[-1]
    nvlink, nic, lat, nv_fitted, net_fitted = _fit(curves, sized)
    nvlink, nic, lat = _sig(nvlink), _sig(nic), _sig(lat)
    scenario = _with(sized, nvlink, nic, lat)
    residuals: list[Residual] = []
    for c, times in zip(curves, _model_us(scenario, curves), strict=True):
        noise = _noise(c)
        residuals += [Residual(c.path, c.collective, c.nodes, pt.size_bytes, pt.time_us, t, noise=i in noise)
                      for i, (pt, t) in enumerate(zip(c.points, times, strict=True))]
    used = [r.residual for r in residuals if not r.noise]
    mid = statistics.median(used) if used else 0.0
    scale = 1.4826 * statistics.median(abs(r - mid) for r in used) if used else 0.0
    residuals = [replace(r, outlier=not r.noise and abs(r.residual - mid) > max(OUTLIER_SCALES * scale, HUBER_DELTA))
                 for r in residuals]
    fit = PhysicsFit(nvlink, nic, lat, node.bandwidth_bytes_per_us / 1e3, net.bandwidth_bytes_per_us / 1e3,
                     _latency_us(net),
                     net.fabric, nv_fitted, net_fitted, tuple(residuals), scale)
    return scenario, fit


def carried(curves: Sequence[Curve], base: Scenario) -> list[tuple[Curve, str, list[float]]]:
    """Each multi-node curve whose collective was measured at other node counts too, predicted from the figures
    fitted to every curve but those of its node count: (curve, ``from N1xG,N2xG``, modeled times)."""
    sized = sized_base(curves, base)
    out: list[tuple[Curve, str, list[float]]] = []
    for n in sorted({c.nodes for c in curves if c.nodes > 1}):
        held = [c for c in curves if c.nodes == n]
        rest = [c for c in curves if c.nodes != n]
        targets = [c for c in held if any(o.collective == c.collective and o.nodes > 1 for o in rest)]
        if not targets:
            continue
        nvlink, nic, lat, _, _ = _fit(rest, sized)
        scenario = _with(sized, nvlink, nic, lat)
        label = "from " + ",".join(f"{m}x{rest[0].gpus_per_node}" for m in sorted({c.nodes for c in rest}))
        out += [(c, label, times) for c, times in zip(targets, _model_us(scenario, targets), strict=True)]
    return out


def physics_notes(fit: PhysicsFit) -> list[str]:
    """The fitted figures in datasheet units, the residuals' spread, each noise point and each outlier."""
    def size(n: int) -> str:
        from nbox_trace.units import format_bytes

        return format_bytes(n)

    parts = []
    parts.append(f"NVLink {fit.nvlink_gbps:.1f} GB/s per GPU ({'fitted' if fit.nvlink_fitted else 'not fitted'}; "
                 f"datasheet {fit.datasheet_nvlink_gbps:.1f})")
    if fit.network_fitted:
        parts.append(f"NIC {fit.nic_gbps:.1f} GB/s per GPU (datasheet {fit.datasheet_nic_gbps:.1f})")
        parts.append(f"network latency {fit.net_latency_us:.1f} us per step ({fit.fabric}: "
                     f"{fit.datasheet_latency_us:g})")
    else:
        parts.append("no multi-node curve: the NIC and network latency keep the datasheet's")
    used = [r for r in fit.residuals if not r.noise]
    out = [f"physics fit: {', '.join(parts)}; residuals: robust scale {100 * math.expm1(fit.scale):.1f}% over "
           f"{len(used)} points, Huber loss beyond {100 * math.expm1(HUBER_DELTA):.0f}%"]
    for r in fit.residuals:
        if r.noise:
            out.append(f"{r.path}: {size(r.size_bytes)} took {r.real_us:g} us, more than "
                       f"{100 * (NOISE_TOLERANCE - 1):.0f}% over the next larger size: noise, left out of the fit")
        elif r.outlier:
            out.append(f"{r.path}: {size(r.size_bytes)}: measured {r.real_us:g} us, the fitted model "
                       f"{r.model_us:.1f} us ({100 * (r.model_us / r.real_us - 1):+.0f}%): an outlier "
                       f"(beyond {OUTLIER_SCALES:g} robust scales), its pull on the fit capped")
    return out
