"""Pricing a collective on a scenario, and the `nbox scenario show|validate|cost` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.network import costmodels as cm
from emulator_core.network import netmodel as nm
from emulator_core.pricing.answer import Fabric
from emulator_core.pricing.pricer import (
    PricingError,
    applicable,
    group_shape,
    link_for,
    make_pricer,
    price,
    price_group,
)
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import Dimension, Scenario, ScenarioError, Topology
from emulator_core.scenario.world import resize
from nbox_trace.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
DGX = ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml"


def test_link_for_a_group_over_several_dimensions_is_the_slowest_crossed() -> None:
    s = load_scenario(DGX)
    ib = s.topology.dims[1]
    link = link_for(s, "all_reduce", group_shape(s))
    assert link.bandwidth_bytes_per_us == ib.bandwidth_bytes_per_us == 400 * 125  # 400 Gb/s = 50,000 B/us
    assert link.latency_us == max(d.latency_us for d in s.topology.dims)


def test_ring_all_reduce_matches_the_closed_form_by_hand() -> None:
    s = load_scenario(DGX)
    p, n = s.world_size, 1 << 30
    # NCCL's multi-ring: 8 rings (one per GPU of a node), each crossing nodes through its own 400 Gb/s NIC, so
    # a step's inter-node share is 1/8; the 8 rings together move a whole step over NVLink (3600 Gb/s). A step
    # pays the slower (IB 5 us) latency plus the message overhead (0.5 us).
    alpha = link_for(s, "all_reduce", group_shape(s)).latency_us + s.network.message_overhead_us
    bw = min(8 * 400 * 125, 18 * 200 * 125)
    by_hand = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw
    ring = next(x for x in price(s, "all_reduce", n)[0] if x.algorithm == "ring")
    assert ring.time_us == pytest.approx(by_hand)
    assert ring.busbw_gbps == pytest.approx(n / by_hand / 1e3 * 2 * (p - 1) / p)


def test_auto_picks_the_fastest_of_nccls_set_and_hierarchical_never_direct() -> None:
    s = load_scenario(DGX, ["network.library=generic"])  # nbox's own choice (library = "nccl": NCCL's tuner)
    prices, chosen = price(s, "all_reduce", 1 << 30)
    by_name = {p.algorithm: p.time_us for p in prices}
    assert chosen == min(("ring", "double_binary_tree", "hierarchical"), key=lambda a: by_name[a])
    # over a ring of nodes the trees' edges share links: going dimension by dimension wins
    torus = Scenario(world_size=512, topology=Topology((Dimension("nv", 8, "switch", 200.0, 1.0, 18),
                                                        Dimension("net", 64, "ring", 400.0, 5.0))))
    assert price(torus, "all_reduce", 1 << 26)[1] == "hierarchical"
    # every algorithm that can run here: not in_network (no reducing switch in this scenario)
    assert {p.algorithm for p in prices} == set(nm.algorithms_for("all_reduce")) - {"in_network"}
    assert applicable(s, "all_reduce", group_shape(s)) == [p.algorithm for p in prices]
    small, chosen_small = price(s, "all_reduce", 8, "auto")
    assert chosen_small != "direct" and [p.algorithm for p in small] == [chosen_small]


def test_world_size_grows_the_outermost_dimension() -> None:
    s = resize(load_scenario(DGX), 64)
    assert s.world_size == 64 and [d.size for d in s.topology.dims] == [8, 8]
    with pytest.raises(ScenarioError, match="world_size = 12"):
        resize(load_scenario(DGX), 12)


def test_unknown_algorithm_lists_the_known_ones() -> None:
    """Issue 13: 'library errors escape as `ValueError` (... pricing)': an unknown --algorithm is a usage error
    (exit 2) naming the flag; an unknown collective too."""
    with pytest.raises(UsageError, match=r"--algorithm 'quantum'.*known: ring"):
        price(load_scenario(DGX), "all_reduce", 1, "quantum")
    with pytest.raises(UsageError, match="collective 'allreduce': unknown; known: all_reduce"):
        price(load_scenario(DGX), "allreduce", 1)


def nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_cost_command_json_and_human() -> None:
    proc = nbox("scenario", "cost", "all_reduce", "--bytes", 1 << 30, "--what-if", DGX, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    s = load_scenario(DGX)
    assert doc["world_size"] == 1024 and doc["auto"] == price(s, "all_reduce", 1 << 30)[1] == "nvls_tree/Simple"
    # every algorithm nbox models that can run here, then NCCL's own pick (the scenario runs NCCL)
    assert [a["algorithm"] for a in doc["algorithms"]] == [*applicable(s, "all_reduce", group_shape(s)),
                                                           "nvls_tree/Simple"]
    human = nbox("scenario", "cost", "all_gather", "--bytes", 1 << 20, "--world-size", 64, "--what-if", DGX)
    # Issue 13: "all human output goes to stderr, so `nbox scenario cost ... | grep ring` prints nothing":
    # the table is the result, on stdout; stderr stays empty. Bytes in IEC units, one time unit per column.
    assert human.returncode == 0 and human.stderr == "" and "over 64 ranks" in human.stdout
    assert "1.0 MiB per rank" in human.stdout and "ring" in human.stdout
    header = next(line for line in human.stdout.splitlines() if "algorithm" in line)
    unit = header.split("time ")[1].split()[0]
    assert unit in ("us", "ms", "s")
    rows = human.stdout.splitlines()[2:]
    assert rows and all(" us" not in r and " ms" not in r for r in rows)  # the unit is in the header only


def test_show_round_trips_and_validate_names_the_bad_key(tmp_path: Path) -> None:
    shown = nbox("scenario", "show", DGX, "--set", "world_size=2048", "--set", "topology.dims.1.size=256")
    assert shown.returncode == 0, shown.stderr
    (tmp_path / "s.toml").write_text(shown.stdout)
    assert load_scenario(tmp_path / "s.toml").world_size == 2048
    ok = nbox("scenario", "validate", tmp_path / "s.toml")
    assert ok.returncode == 0 and "valid: world size 2048" in ok.stdout  # issue 13: results on stdout
    bad = nbox("scenario", "validate", DGX, "--set", "topology.dims.1.bandwidth_gbps=-3")
    assert bad.returncode == 3 and "topology.dims[1].bandwidth_gbps = -3" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_group_shape_finds_the_dimensions_a_group_spans() -> None:
    s = resize(load_scenario(DGX), 64)  # 8 per node x 8 nodes
    node0 = group_shape(s, range(8))
    assert node0.size == 8 and [(n, d.name) for n, d in node0.dims] == [(8, s.topology.dims[0].name)]
    rail = group_shape(s, range(0, 64, 8))  # GPU 0 of every node
    assert [(n, d.name) for n, d in rail.dims] == [(8, s.topology.dims[1].name)]
    assert [n for n, _ in group_shape(s).dims] == [8, 8]
    with pytest.raises(PricingError, match=r"outside 0\.\.63"):  # issue 13: no ValueError from the library
        group_shape(s, [0, 64])
    with pytest.raises(PricingError, match="twice"):
        group_shape(s, [1, 1])


def test_price_group_agrees_with_price_over_the_world_and_uses_the_intra_node_link_inside_a_node() -> None:
    s = resize(load_scenario(DGX, ["network.library=generic"]), 64)
    for coll in ("all_reduce", "all_gather", "all_to_all", "broadcast"):
        prices, chosen = price(s, coll, 1 << 24, "auto")
        assert price_group(s, coll, 1 << 24, group_shape(s)) == (chosen, pytest.approx(prices[0].time_us))
    intra = s.topology.dims[0]
    name, t = price_group(s, "all_gather", 1 << 20, group_shape(s, range(8)))
    link = cm.Link(intra.latency_us + s.network.message_overhead_us, intra.bandwidth_bytes_per_us)
    assert (name, t) == ("ring", pytest.approx(cm.all_gather_ring(1 << 20, 8, link)))
    # a one-rank group costs 0 and names what auto picks at a tie (ring), as scenario cost does; it said "auto"
    assert price_group(s, "all_reduce", 1 << 20, group_shape(s, [5])) == ("ring", 0.0)


# ------------------------------------------------------------------------------------ one auto choice


def _one_link(ranks: int, latency_us: float, bandwidth_bytes_per_us: float) -> Scenario:
    dim = Dimension("net", ranks, "switch", bandwidth_bytes_per_us / 125.0, latency_us)
    return Scenario(world_size=ranks, topology=Topology((dim,)))


def test_auto_picks_like_nccl_and_never_a_direct_model_where_a_ring_or_tree_exists() -> None:
    # Was costmodels.auto (dead but for tests), which took every model and so picked "direct" at 800 B on 4 ranks.
    s = _one_link(1024, 2.0, 100.0)
    auto = make_pricer(s, "all_reduce", group_shape(s))
    assert auto(1000)[0] == "double_binary_tree" and auto(10**9)[0] == "ring"
    four = _one_link(4, 2.0, 100.0)
    assert make_pricer(four, "all_reduce", group_shape(four))(800) == ("ring", 24.0)
    assert make_pricer(four, "all_to_all", group_shape(four))(800)[0] == "direct"  # no ring/tree: any model


@pytest.mark.parametrize("collective", cm.collectives())
@pytest.mark.parametrize(("n", "p"), [(1, 2), (800, 4), (1 << 20, 64), (1 << 30, 1024)])
def test_auto_is_no_slower_than_any_of_its_candidates(collective: str, n: int, p: int) -> None:
    s = _one_link(p, 2.0, 100.0)
    shape = group_shape(s)
    name, best = make_pricer(s, collective, shape)(n)
    known = cm.algorithms_for(collective)
    candidates = [a for a in cm.NCCL_ALGORITHMS if a in known] or [a for a in known if a != "hierarchical"]
    assert name in candidates
    assert all(best <= make_pricer(s, collective, shape, a)(n)[1] for a in candidates)


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
@pytest.mark.parametrize("world", [None, 2, 1])
def test_scenario_cost_names_the_algorithm_the_replay_path_uses(name: str, world: int | None) -> None:
    """`nbox scenario cost` (price) and the replay/backend path (Fabric.answer) choose through one function."""
    s = load_scenario(shipped_scenarios()[name])
    s = s if world is None else resize(s, world)
    for collective in cm.collectives():
        fabric = Fabric(s)
        group = fabric.group(None, [0])
        for n in (0, 1024, 1 << 20, 1 << 30):
            chosen = price(s, collective, n)[1]
            assert fabric.answer(group, collective, n, [0.0]).algorithm == chosen, (collective, n)


def test_scenario_cost_stars_the_scenario_s_own_algorithm() -> None:
    # It ignored [algorithms] and starred auto's pick while a replay ran the scenario's algorithm.
    s = load_scenario(DGX, ["algorithms.all_reduce=ring"])
    assert price(s, "all_reduce", 1 << 30)[1] == "ring"
    proc = nbox("scenario", "cost", "all_reduce", "--bytes", 1 << 30, "--what-if", DGX, "--set",
                "algorithms.all_reduce=ring")
    assert proc.returncode == 0 and "the scenario sets ring" in proc.stdout
