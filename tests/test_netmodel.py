"""The topology-aware network model: every knob moves the answer, hand-computed values, properties, ASTRA parity."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator_core.pricing.pricer import PricingError, extrapolation_note, group_shape, make_pricer, price
from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario
from emulator_core.scenario.model import Calibration, Dimension, Network, Scenario, ScenarioError, Topology

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "tests" / "data" / "astra_grid" / "reference_grid_upto64.csv"
MIB = 1 << 20


def one_dim(p: int, kind: str = "switch", *, bw_gbps: float = 400.0, lat_us: float = 2.0, links: int = 1,
            forwarding: str = "cut_through", inr: bool = False, network: Network | None = None) -> Scenario:
    dim = Dimension("d0", p, kind, bw_gbps, lat_us, links, forwarding, inr)
    return Scenario(world_size=p, topology=Topology((dim,)), network=network or Network())


def t_us(s: Scenario, collective: str, nbytes: float, algorithm: str | None = None,
         ranks: list[int] | None = None) -> float:
    return make_pricer(s, collective, group_shape(s, ranks), algorithm)(nbytes)[1]


# --------------------------------------------------------------------------------- every knob moves it


def test_the_dimension_kind_changes_the_table() -> None:
    """Issue 14: `--set topology.dims.0.kind=ring|switch|fully_connected` printed the same table three times."""
    tables = {kind: [(p.algorithm, p.time_us) for p in price(one_dim(16, kind), "all_reduce", MIB)[0]]
              for kind in ("ring", "switch", "fully_connected")}
    assert len({tuple(t) for t in tables.values()}) == 3
    # direct all-to-all on a ring pays its contention (p(p+2)/8 messages on the busiest link, not p-1)
    ring = t_us(one_dim(16, "ring"), "all_to_all", MIB, "direct")
    switch = t_us(one_dim(16), "all_to_all", MIB, "direct")
    assert ring > 2 * switch


def test_links_per_rank_multiplies_the_bandwidth() -> None:
    one, four = one_dim(8, links=1), one_dim(8, links=4)
    bw = 400 * 125.0
    assert t_us(one, "all_reduce", MIB, "ring") == pytest.approx(14 * 2.0 + 2 * 7 / 8 * MIB / bw)
    assert t_us(four, "all_reduce", MIB, "ring") == pytest.approx(14 * 2.0 + 2 * 7 / 8 * MIB / (4 * bw))


def test_store_and_forward_costs_a_switch_message_twice() -> None:
    ct, sf = one_dim(8), one_dim(8, forwarding="store_and_forward")
    bw = 400 * 125.0
    assert t_us(sf, "all_gather", MIB, "ring") - t_us(ct, "all_gather", MIB, "ring") == pytest.approx(7 * MIB / bw)


def test_congestion_unaware_ignores_link_sharing() -> None:
    aware, unaware = one_dim(16), one_dim(16, network=Network(congestion="unaware"))
    bw = 400 * 125.0
    # direct all-gather: 15 copies of the shard through one port, or (unaware) one shard's time
    assert t_us(aware, "all_gather", MIB, "direct") == pytest.approx(2.0 + 15 * MIB / bw)
    assert t_us(unaware, "all_gather", MIB, "direct") == pytest.approx(2.0 + MIB / bw)


def test_message_overhead_makes_many_messages_cost_more() -> None:
    """Issue 14: a 1 MiB direct all-to-all cost 26 us at 1,024 and at 65,536 ranks."""
    net = Network(message_overhead_us=0.5)
    small, big = one_dim(1024, network=net), one_dim(65536, network=net)
    assert t_us(big, "all_to_all", MIB, "direct") > 30 * t_us(small, "all_to_all", MIB, "direct")
    assert t_us(one_dim(1024), "all_to_all", MIB, "direct") < t_us(small, "all_to_all", MIB, "direct")


def test_in_network_reduction_sends_the_buffer_once() -> None:
    inr, plain = one_dim(8, inr=True), one_dim(8)
    bw = 400 * 125.0
    assert t_us(inr, "all_reduce", 64 * MIB, "in_network") == pytest.approx(2.0 + 64 * MIB / bw)
    assert make_pricer(inr, "all_reduce", group_shape(inr))(64 * MIB)[0] == "in_network"
    with pytest.raises(PricingError, match="in_network_reduction = true"):
        t_us(plain, "all_reduce", MIB, "in_network")
    with pytest.raises(ScenarioError, match=r"in_network_reduction = true: needs kind = \"switch\""):
        one_dim(8, "ring", inr=True)


def _two_dim(inner: int = 8, outer: int = 16, *, chunks: int = 1, per_dim: list[str] | None = None) -> Scenario:
    dims = (Dimension("nvlink", inner, "switch", 200.0, 1.0, 18), Dimension("ib", outer, "switch", 400.0, 5.0))
    algos = {"all_reduce": per_dim} if per_dim else {}
    return Scenario(world_size=inner * outer, topology=Topology(dims), network=Network(chunks=chunks),
                    algorithms=algos)


def test_hierarchical_all_reduce_by_hand_and_chunks_pipeline_it() -> None:
    s = _two_dim(per_dim=["ring", "ring"])
    n, nv, ib = 64 * MIB, 200 * 18 * 125.0, 400 * 125.0
    rs = 7 * (1.0 + n / 8 / nv)
    ar = 2 * 15 * (5.0 + n / 8 / 16 / ib)
    ag = 7 * (1.0 + n / 8 / nv)
    assert make_pricer(s, "all_reduce", group_shape(s))(n) == ("hierarchical", pytest.approx(rs + ar + ag))
    k = 4
    piped = _two_dim(chunks=k, per_dim=["ring", "ring"])
    phases = [7 * (1.0 + n / k / 8 / nv), 2 * 15 * (5.0 + n / k / 8 / 16 / ib), 7 * (1.0 + n / k / 8 / nv)]
    busiest = max(phases[0] + phases[2], phases[1])  # nvlink serves RS + AG of every chunk, ib the all-reduce
    assert t_us(piped, "all_reduce", n) == pytest.approx(sum(phases) + (k - 1) * busiest)
    # one phase dominating, chunks only add latency; balanced phases overlap and win
    assert t_us(piped, "all_reduce", n) > t_us(s, "all_reduce", n)
    ib_fast = (Dimension("nvlink", 8, "switch", 200.0, 1.0, 18), Dimension("ib", 16, "switch", 1600.0, 5.0))
    balanced = Scenario(world_size=128, topology=Topology(ib_fast), algorithms={"all_reduce": ["ring", "ring"]})
    big = 1 << 30  # large enough that bandwidth, not the chunks' extra latency, dominates
    assert t_us(replace(balanced, network=Network(chunks=4)), "all_reduce", big) < t_us(balanced, "all_reduce", big)


def test_per_dimension_algorithms_are_used_and_checked() -> None:
    ring_direct = _two_dim(per_dim=["direct", "ring"])
    assert t_us(ring_direct, "all_reduce", MIB) != t_us(_two_dim(per_dim=["ring", "ring"]), "all_reduce", MIB)
    # a group inside one node uses its dimension's entry, flat
    node = list(range(8))
    assert make_pricer(ring_direct, "all_reduce", group_shape(ring_direct, node))(MIB)[0] == "direct"
    with pytest.raises(ScenarioError, match="one algorithm per topology dimension"):
        _two_dim(per_dim=["ring"])
    with pytest.raises(ScenarioError, match="'hierarchical' is not a one-dimension algorithm"):
        _two_dim(per_dim=["ring", "hierarchical"])


def test_a_calibration_beyond_its_ranks_says_it_is_extrapolated() -> None:
    cal = Calibration("all_reduce", "d0", "ring", 2, latency_factor=2.0)
    s = replace(one_dim(1024), calibration=(cal,))
    note = extrapolation_note(s, "all_reduce", group_shape(s))
    assert note is not None and "extrapolated from p = 2" in note and "p = 1024" in note
    assert extrapolation_note(s, "all_reduce", group_shape(s, [0, 1])) is None


# ------------------------------------------------------------------------------------------- properties

_kinds = st.sampled_from(["ring", "switch", "fully_connected"])
_collectives = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "gather",
                                "barrier", "send_recv"])


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=1, max_size=3))
    dims = tuple(Dimension(f"d{i}", n, draw(_kinds), draw(st.floats(1.0, 4000.0)), draw(st.floats(0.0, 20.0)),
                           draw(st.integers(1, 4)), draw(st.sampled_from(["cut_through", "store_and_forward"])))
                 for i, n in enumerate(sizes))
    net = Network(draw(st.sampled_from(["aware", "unaware"])), draw(st.floats(0.0, 2.0)), draw(st.integers(1, 8)))
    return Scenario(world_size=math.prod(sizes), topology=Topology(dims), network=net)


def _everything(s: Scenario, collective: str, n: float, ranks: list[int] | None) -> list[float]:
    return [make_pricer(s, collective, group_shape(s, ranks), a)(n)[1] for a in (None, "ring", "direct")
            if a is None or _runs(s, collective, a)]


def _runs(s: Scenario, collective: str, algorithm: str) -> bool:
    from emulator_core.network.netmodel import algorithms_for
    return algorithm in algorithms_for(collective)


_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(scenarios(), _collectives, st.floats(0, 1 << 30), st.data())
def test_more_bandwidth_or_less_latency_is_never_slower(s: Scenario, collective: str, n: float,
                                                         data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(s.topology.dims) - 1))
    d = s.topology.dims[i]
    faster = [replace(d, bandwidth_gbps=d.bandwidth_gbps * 2), replace(d, latency_us=d.latency_us / 2)]
    before = _everything(s, collective, n, None)
    for new in faster:
        dims = tuple(new if j == i else x for j, x in enumerate(s.topology.dims))
        after = _everything(replace(s, topology=Topology(dims)), collective, n, None)
        assert all(a <= b * (1 + 1e-12) + 1e-9 for a, b in zip(after, before, strict=True))


@_settings
@given(st.integers(2, 64), st.floats(0, 1 << 30), st.floats(1.0, 4000.0), st.floats(0.0, 20.0))
def test_in_network_reduction_is_never_slower(p: int, n: float, bw: float, lat: float) -> None:
    plain, inr = one_dim(p, bw_gbps=bw, lat_us=lat), one_dim(p, bw_gbps=bw, lat_us=lat, inr=True)
    assert t_us(inr, "all_reduce", n) <= t_us(plain, "all_reduce", n)


@_settings
@given(scenarios(), _collectives, st.floats(0, 1 << 30), st.data())
def test_a_group_inside_one_dimension_never_pays_another_dimensions_figures(s: Scenario, collective: str, n: float,
                                                                            data: st.DataObject) -> None:
    dims = s.topology.dims
    i = data.draw(st.integers(0, len(dims) - 1))
    stride = math.prod(d.size for d in dims[:i])
    group = [k * stride for k in range(dims[i].size)]  # the ranks along dimension i through rank 0
    others = tuple(d if j == i else replace(d, bandwidth_gbps=d.bandwidth_gbps / 7, latency_us=d.latency_us + 9,
                                            kind="ring") for j, d in enumerate(dims))
    changed = replace(s, topology=Topology(others))
    assert _everything(changed, collective, n, group) == _everything(s, collective, n, group)


# ---------------------------------------------------------------------------------------- ASTRA-sim parity


def test_astra_sim_parity_within_five_percent_at_one_mib_and_more() -> None:
    spec = importlib.util.spec_from_file_location("astra_parity", ROOT / "bench" / "astra_parity.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import csv
    with GRID.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["system_config"] == "nosplit_nomemcost"
                and int(r["bytes"]) >= MIB]
    assert len(rows) == 864
    worst = max(abs(mod.nbox_ns(r) / float(r["simulated_ns"]) - 1) for r in rows)
    assert worst <= 0.05


def test_shipped_scenarios_price_every_collective() -> None:
    for path in sorted(SCENARIOS_DIR.glob("*.toml")):
        s = load_scenario(path)
        for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier"):
            prices, chosen = price(s, collective, MIB)
            assert chosen and all(p.time_us >= 0 for p in prices), (path.name, collective)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 64])
def test_on_one_switch_the_network_model_is_the_calibration_fits_closed_form(p: int) -> None:
    """``nbox calibrate`` fits ``costmodels``' one-link closed forms; pricing uses the step model. On one
    cut-through switch, congestion-aware, no message overhead, they must be the same function, or a calibrated
    scenario would not reproduce what was measured."""
    from emulator_core.network import costmodels as cm

    s = one_dim(p, bw_gbps=80.0, lat_us=3.0)
    link = cm.Link(3.0, 80.0 * 125)
    for (collective, algorithm), model in cm.COST_MODELS.items():
        for n in (0, 1000, 1 << 24):
            assert t_us(s, collective, n, algorithm) == pytest.approx(model(n, p, link), rel=1e-9, abs=1e-9), (
                collective, algorithm, n)


def test_a_scenario_that_runs_nccl_prices_with_nccls_own_tuner() -> None:
    from emulator_core.network import net_fabric
    from emulator_core.pricing.nccl_tuner import nccl_plan
    from emulator_core.scenario.world import resize

    s = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 32)  # 8 GPUs x 4 nodes
    assert s.network.library == "nccl"
    ib = net_fabric("infiniband")  # the shipped network's fabric
    for collective, n in (("all_reduce", 1 << 20), ("all_reduce", 1 << 30), ("all_gather", 1 << 22)):
        algo, t = make_pricer(s, collective, group_shape(s))(n)
        ref = nccl_plan(collective, 32, 4, intra_bw_gbps=450.0, inter_bw_gbps=50.0, nvls=True,
                        inter_latency_us=ib.latency_us, net_protocols=ib.protocols,
                        net_slice_bytes=ib.slice_bytes).choose(n)
        assert (algo, t) == (f"{ref.algorithm}/{ref.protocol}", pytest.approx(ref.time_us))
    node = make_pricer(s, "all_reduce", group_shape(s, range(8)))(1 << 30)  # one node: NVLS
    assert node[0].startswith("nvls")
    # the generic auto for the same scenario names nbox's own algorithms; all-to-all is NCCL's p2p group
    generic = replace(s, network=replace(s.network, library="generic"))
    assert make_pricer(generic, "all_reduce", group_shape(generic))(1 << 30)[0] in ("ring", "double_binary_tree",
                                                                                   "hierarchical")
    assert make_pricer(s, "all_to_all", group_shape(s))(1 << 20)[0] == "p2p/Simple"
    assert make_pricer(generic, "all_to_all", group_shape(generic))(1 << 20)[0] in ("pairwise", "direct", "ring")
