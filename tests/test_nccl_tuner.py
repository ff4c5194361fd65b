"""emulator_core.pricing.nccl_tuner / nccl_graph: NCCL's tuning model (v2.29.7-1 tuning.cc, search.cc) as data + code.

The hand-computed values below redo tuning.cc's arithmetic from the constants of the data file for one H100
system: 18 NVLink4 links of 25 GB/s line rate (450 GB/s), which NCCL counts at 20.6 GB/s each (370.8 GB/s),
and a 400 Gb/s NIC (50 GB/s) per GPU behind PCIe Gen5 x16 (48 GB/s in NCCL's units).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from emulator_core.network.nccl_graph import Graph, search_graphs
from emulator_core.pricing import nccl_tuner as nt

K = nt.nccl_constants()
H100: dict[str, Any] = {"intra_bw_gbps": 450.0, "inter_bw_gbps": 50.0}
MIB = 1 << 20


def cand(choice: nt.NcclChoice, algorithm: str, protocol: str) -> float:
    for a, p, t in choice.candidates:
        if (a, p) == (algorithm, protocol):
            return t
    raise AssertionError(f"{algorithm}/{protocol} not among {choice.candidates}")


def pairs(choice: nt.NcclChoice) -> set[tuple[str, str]]:
    return {(a, p) for a, p, _ in choice.candidates}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12)


# ----------------------------------------------------------------------------------------------- the data file

def _numbers(node: Any, path: str = "") -> list[tuple[str, float]]:
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _numbers(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _numbers(v, f"{path}[{i}]")]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [(path, float(node))]
    return []


def test_data_file_parses_cites_its_source_and_every_constant_is_finite() -> None:
    text = nt.DATA_FILE.read_text(encoding="utf-8")
    assert "src/graph/tuning.cc" in text and "v2.29.7-1" in text and K["nccl_commit"] in text
    numbers = _numbers(K)
    assert len(numbers) > 300
    bad = [(p, v) for p, v in numbers if not math.isfinite(v) or v < 0]
    assert not bad, bad
    assert tuple(K["protocols"]) == nt.PROTOCOLS and tuple(K["algorithms"]) == nt.ALGORITHMS
    for table in (K["base_latency_us"], *K["hw_latency_us"].values()):
        assert set(table) == set(nt.ALGORITHMS) and all(len(v) == 3 for v in table.values())
    for name in ("ll_max_gbps", "per_channel_max_ring_ll128_gbps", "per_channel_max_tree_ll128_gbps",
                 "per_channel_max_tree_gbps", "per_channel_max_nvls_tree_gbps"):
        assert set(K[name]) == set(nt.ARCHS) and all(len(v) == 3 for v in K[name].values())
    assert all(len(K["tree_correction_factor"][p]) == 24 for p in nt.PROTOCOLS)
    # spot checks against tuning.cc 145, 152, 173, 185, 138
    assert K["base_latency_us"]["ring"] == [6.6, 14.0, 8.4]
    assert K["hw_latency_us"]["nvlink"]["tree"] == [0.6, 1.25, 4.0]
    assert K["ll_max_gbps"]["hopper"] == [141.0, 45.0, 35.0]
    assert K["per_channel_max_tree_ll128_gbps"]["hopper"] == [36.7, 36.7, 29.0]
    assert K["nvls_efficiency"]["hopper"] == 0.85


# ------------------------------------------------------------------------------------------ the channel search

def test_h100_graphs_match_what_nccl_reports_on_dgx_h100() -> None:
    # one node: sm90 intra speeds 60, 50, ...: 370.8 // 60 = 6 channels (6 x 60 = 360 beats 7 x 50, ties do not
    # replace), ncclTopoDupChannels doubles to 12 x 30; NCCL logs "24 coll channels" = 2 x 12 (connect.cc 453).
    one = search_graphs(K, arch="hopper", ppn=8, nnodes=1, nvlink_gbps=370.8, nic_gbps=48.0, nvls=True,
                        collnet=False)
    assert one.ring == Graph(12, 30.0, 30.0, True) and one.tree.n_channels == 12 and one.comm_channels == 24
    # NVLS: 8 heads, the busiest GPU carries 9 x bwIntra <= 370.8 -> 40; pass 2 raises bwInter to 60
    assert one.nvls == Graph(8, 40.0, 60.0)
    # several nodes: sm90 inter speeds; 48 fits one channel per NIC but only 7 on NVLink (8 x 48 > 370.8);
    # 8 x 45 = 360 wins; no duplication (45 < 50 with > 4 channels on sm90): "16 coll channels".
    many = search_graphs(K, arch="hopper", ppn=8, nnodes=4, nvlink_gbps=370.8, nic_gbps=48.0, nvls=True,
                         collnet=False)
    assert many.ring == Graph(8, 45.0, 45.0, False) and many.comm_channels == 16
    assert many.nvls == Graph(8, 40.0, 48.0)
    assert many.collnet_direct.n_channels == 0 and many.collnet_chain.n_channels == 0


def test_no_path_falls_back_to_one_channel_at_a_tenth_of_a_gb_per_s() -> None:
    g = search_graphs(K, arch="hopper", ppn=8, nnodes=1, nvlink_gbps=2.0, nic_gbps=48.0, nvls=False,
                      collnet=False)
    assert g.ring == Graph(1, 0.1, 0.1, True)


# --------------------------------------------------------------------------------------- hand-computed values

def test_single_node_all_reduce_by_hand() -> None:
    n = 8
    c = nt.nccl_tune("all_reduce", MIB, n, 1, nvls=True, **H100)
    base, nvl = K["base_latency_us"], K["hw_latency_us"]["nvlink"]
    algbw = n / (2 * (n - 1))  # tuning.cc 349: busBw * nRanks / nsteps
    # ring LL: busBw = min(llMaxBw[hopper][N1], 12 * 30 * .5), latency base + 14 hops
    ring_ll = base["ring"][0] + 14 * nvl["ring"][0] + MIB / (1000 * min(K["ll_max_gbps"]["hopper"][0], 180.0) * algbw)
    assert close(cand(c, "ring", "LL"), ring_ll)
    # ring LL128: min(360 * .92, 12 * perChMaxRingLL128)
    ll128 = min(360 * 0.92, 12 * K["per_channel_max_ring_ll128_gbps"]["hopper"][0])
    assert close(cand(c, "ring", "LL128"), base["ring"][1] + 14 * nvl["ring"][1] + MIB / (1000 * ll128 * algbw))
    # tree Simple: min(360 * .92, 12 * 38.7) * .5, times treeCorrectionFactor[Simple][log2(1 MiB / 64) = 14]
    tree_bw = min(360 * 0.92, 12 * K["per_channel_max_tree_gbps"]["hopper"][0]) * 0.5
    tree_bw *= K["tree_correction_factor"]["Simple"][14]
    tree_lat = base["tree"][2] + 2 * (n - 1) * nvl["tree"][2]
    assert close(cand(c, "tree", "Simple"), tree_lat + MIB / (1000 * tree_bw))
    # NVLS: latency = hw NVLink NVLS (the base is replaced), bw = 8 channels x min(40 * .85 * 7/8 * 2, 60)
    nvls_bw = 8 * min(40 * K["nvls_efficiency"]["hopper"] * 7 / 8 * 2, 60.0) * algbw
    assert close(cand(c, "nvls", "Simple"), nvl["nvls"][2] + MIB / (1000 * nvls_bw))
    assert (c.algorithm, c.protocol) == ("ring", "LL") and c.time_us == cand(c, "ring", "LL")
    assert ("nvls", "LL") not in pairs(c) and ("nvls_tree", "Simple") not in pairs(c)


def test_multi_node_ring_simple_by_hand_with_the_plateau_and_net_overhead() -> None:
    n, nodes, size = 32, 4, float(1 << 30)
    c = nt.nccl_tune("all_reduce", size, n, nodes, **H100)
    net = K["hw_latency_us"]["net"]
    intra = max(K["hw_latency_us"]["nvlink"]["ring"][2], K["net_overhead_us"]["intel"] * 3)  # tuning.cc 376-378
    n_inter = 2 * (nodes - 1)
    lat = K["base_latency_us"]["ring"][2] + (2 * (n - 1) - n_inter) * intra + n_inter * net["ring"][2]
    lat *= K["refinements"]["ring_plateau_latency_factor"]  # 2^30 / (16 channels * 32 ranks) >= 64
    bw = 8 * 45.0 * n / (2 * (n - 1))
    assert close(cand(c, "ring", "Simple"), lat + size / (1000 * bw))
    assert (c.algorithm, c.protocol) == ("ring", "Simple")  # ring 360 GB/s beats tree's min(331.2, 8 x 36)


def test_inter_latency_is_ncccls_latency_inter_added_per_step_and_twice_for_simple() -> None:
    plain = nt.nccl_tune("all_reduce", 4 * MIB, 32, 4, **H100)
    slow = nt.nccl_tune("all_reduce", 4 * MIB, 32, 4, inter_latency_us=2.0, **H100)
    # tree: 2 * log2(4) inter steps; Simple adds latencyInter twice (the flush), LL once
    assert close(cand(slow, "tree", "LL") - cand(plain, "tree", "LL"), 2 * 2 * 2.0)
    assert close(cand(slow, "tree", "Simple") - cand(plain, "tree", "Simple"), 2 * 2 * 4.0)


def test_nbytes_is_the_per_rank_input_and_nccl_tunes_on_the_total() -> None:
    # all_gather of n per rank moves what reduce_scatter of p * n does: same nBytes, same ring model
    ag = nt.nccl_tune("all_gather", MIB, 8, 1, **H100)
    rs = nt.nccl_tune("reduce_scatter", 8 * MIB, 8, 1, **H100)
    assert close(cand(ag, "ring", "Simple"), cand(rs, "ring", "Simple"))
    lat = K["base_latency_us"]["ring"][2] + 7 * K["hw_latency_us"]["nvlink"]["ring"][2]
    assert close(cand(ag, "ring", "Simple"), lat + 8 * MIB / (1000 * 360.0 * 8 / 7))


# ---------------------------------------------------------------------------------------- qualitative behaviour

def test_small_messages_pick_ll_and_large_ones_simple() -> None:
    for nodes in (1, 4, 64):
        small = nt.nccl_tune("all_reduce", 1024, 8 * nodes, nodes, **H100)
        large = nt.nccl_tune("all_reduce", 4 << 30, 8 * nodes, nodes, **H100)
        assert small.protocol == "LL", (nodes, small)
        assert large.protocol == "Simple", (nodes, large)


def test_tree_for_small_messages_on_many_nodes_ring_for_large() -> None:
    # 64 nodes: the ring's 1022 steps of latency keep the tree ahead up to several GiB (tree bus bandwidth is
    # capped at 8 channels x 36 GB/s, the ring's is 8 x 45), 16 GiB goes to the ring; on 8 nodes 4 GiB does
    assert nt.nccl_tune("all_reduce", 64 * 1024, 512, 64, **H100).algorithm == "tree"
    assert nt.nccl_tune("all_reduce", 4 << 30, 512, 64, **H100).algorithm == "tree"
    assert nt.nccl_tune("all_reduce", 16 << 30, 512, 64, **H100).algorithm == "ring"
    assert nt.nccl_tune("all_reduce", 4 << 30, 64, 8, **H100).algorithm == "ring"


def test_nvls_for_large_all_reduce_on_one_h100_node() -> None:
    on = nt.nccl_tune("all_reduce", 1 << 30, 8, 1, nvls=True, **H100)
    off = nt.nccl_tune("all_reduce", 1 << 30, 8, 1, **H100)
    assert on.algorithm == "nvls" and off.algorithm == "ring" and on.time_us < off.time_us
    # NVLS needs Hopper: Ampere has no NVLS graph (search.cc 1063)
    assert "nvls" not in {a for a, _, _ in nt.nccl_tune("all_reduce", 1 << 30, 8, 1, nvls=True, arch="ampere",
                                                        **H100).candidates}


def test_which_algorithms_each_setting_offers() -> None:
    multi = nt.nccl_tune("all_reduce", MIB, 32, 4, nvls=True, **H100)
    assert ("nvls_tree", "Simple") in pairs(multi) and ("nvls", "Simple") not in pairs(multi)  # NVLS needs SHARP
    sharp = nt.nccl_tune("all_reduce", MIB, 32, 4, nvls=True, collnet=True, **H100)
    assert {("nvls", "Simple"), ("collnet_direct", "Simple"), ("collnet_chain", "Simple")} <= pairs(sharp)
    assert {a for a, _ in pairs(nt.nccl_tune("broadcast", MIB, 32, 4, nvls=True, **H100))} == {"ring"}
    assert {a for a, _ in pairs(nt.nccl_tune("all_gather", MIB, 64, 64, **H100))} == {"ring", "pat"}
    assert "pat" not in {a for a, _ in pairs(nt.nccl_tune("all_gather", MIB, 64, 8, **H100))}


@pytest.mark.parametrize(("collective", "nodes", "flags"), [
    ("all_reduce", 1, {"nvls": True}), ("all_reduce", 4, {"nvls": True, "collnet": True}),
    ("all_gather", 1, {"nvls": True}), ("reduce_scatter", 8, {}), ("broadcast", 2, {}), ("reduce", 1, {}),
    ("all_gather", 16, {"ppn": 1}),
])
def test_time_strictly_increases_with_size_for_each_algorithm_and_protocol(
        collective: str, nodes: int, flags: dict[str, Any]) -> None:
    ppn = flags.pop("ppn", 8)
    sizes = [2.0 ** e for e in range(6, 34)] + [3.0 * 2 ** e for e in range(6, 32)]
    sizes.sort()
    times: dict[tuple[str, str], list[float]] = {}
    for s in sizes:
        for a, p, t in nt.nccl_tune(collective, s, ppn * nodes, nodes, **flags, **H100).candidates:
            times.setdefault((a, p), []).append(t)
    assert times
    for (a, p), ts in times.items():
        assert len(ts) == len(sizes), (a, p)
        # tuning.cc's tree correction factor steps at powers of two and can make the tree's modeled time dip
        # right after one (e.g. .4 -> .5 at 1 MiB); at the powers of two themselves it still increases
        series = [t for s, t in zip(sizes, ts, strict=True) if a != "tree" or math.log2(s).is_integer()]
        assert all(b > x for x, b in itertools.pairwise(series)), (a, p, series)


def test_one_rank_costs_nothing_and_the_choice_is_the_fastest_candidate() -> None:
    assert nt.nccl_tune("all_reduce", MIB, 1, 1, **H100) == nt.NcclChoice("ring", "Simple", 0.0,
                                                                           (("ring", "Simple", 0.0),))
    c = nt.nccl_tune("all_reduce", 16 * MIB, 16, 2, nvls=True, **H100)
    assert c.time_us == min(t for _, _, t in c.candidates)
    assert nt.nccl_supports("all_reduce") and not nt.nccl_supports("all_to_all")


# ---------------------------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize(("kwargs", "named"), [
    ({"collective": "all_to_all"}, "'all_to_all'"),
    ({"nbytes": -1.0}, "nbytes = -1.0"),
    ({"nbytes": float("nan")}, "nbytes = nan"),
    ({"nranks": 0}, "nranks = 0"),
    ({"nranks": 8.0}, "nranks = 8.0"),
    ({"nnodes": 3}, "nnodes = 3"),
    ({"intra_bw_gbps": 0.0}, "intra_bw_gbps = 0.0"),
    ({"inter_bw_gbps": float("inf")}, "inter_bw_gbps = inf"),
    ({"inter_latency_us": -2.0}, "inter_latency_us = -2.0"),
    ({"intra_latency_us": "1"}, "intra_latency_us = '1'"),
    ({"nvls": 1}, "nvls = 1"),
    ({"arch": "kepler"}, "arch = 'kepler'"),
    ({"cpu": "power"}, "cpu = 'power'"),
])
def test_bad_arguments_raise_value_error_naming_the_value(kwargs: dict[str, Any], named: str) -> None:
    args: dict[str, Any] = {"collective": "all_reduce", "nbytes": 1.0, "nranks": 8, "nnodes": 2, **H100}
    args.update(kwargs)
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        nt.nccl_tune(**args)
