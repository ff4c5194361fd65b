"""emulator_core.network.costmodels: hand-computed closed forms for every (collective, algorithm), and properties.

Unless a test says otherwise: alpha = 2 us, bandwidth = 100 bytes/us so beta = 0.01 us/byte.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator_core.network import costmodels as cm
from emulator_core.network.bandwidth import algorithm_bandwidth_gbps, bus_bandwidth_gbps
from emulator_core.network.costmodels import COST_MODELS, Efficiency, Link, cost

L = Link(latency_us=2.0, bandwidth_bytes_per_us=100.0)
FLAT = list(COST_MODELS)  # the one-link models; hierarchical is hierarchical_all_reduce


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)


# --------------------------------------------------------------------------------- hand-computed values

HAND = [
    # all_reduce, p=4, n=800: ring 2*3*2 + 2*3/4*800*0.01 = 12 + 12
    ("all_reduce", "ring", 800, 4, 24.0),
    # double binary tree: 2*ceil(log2 4)*2 + 2*800*0.01 = 8 + 16
    ("all_reduce", "double_binary_tree", 800, 4, 24.0),
    # p=5: 2*3*2 + 16
    ("all_reduce", "double_binary_tree", 800, 5, 28.0),
    # Rabenseifner, p=4: 2*2*2 + 2*3/4*8 = 8 + 12
    ("all_reduce", "recursive_halving_doubling", 800, 4, 20.0),
    # p=6 -> p'=4: 2*(2+1)*2 + (2*3/4 + 1.5)*8 = 12 + 24
    ("all_reduce", "recursive_halving_doubling", 800, 6, 36.0),
    # direct: 2*2 + 2*3/4*8 = 4 + 12
    ("all_reduce", "direct", 800, 4, 16.0),
    # reduce_scatter, full input n=800, p=4: ring 3*2 + 3/4*8 = 6 + 6
    ("reduce_scatter", "ring", 800, 4, 12.0),
    # recursive halving: 2*2 + 6
    ("reduce_scatter", "recursive_halving_doubling", 800, 4, 10.0),
    # p=5: ceil(log2 5)=3 -> 6 + 4/5*8 = 6 + 6.4
    ("reduce_scatter", "recursive_halving_doubling", 800, 5, 12.4),
    # direct: 2 + 6
    ("reduce_scatter", "direct", 800, 4, 8.0),
    # all_gather, shard n=200, p=4: ring 3*2 + 3*200*0.01 = 6 + 6
    ("all_gather", "ring", 200, 4, 12.0),
    # recursive doubling: 2*2 + 6
    ("all_gather", "recursive_halving_doubling", 200, 4, 10.0),
    # Bruck, p=6: 3*2 + 5*2 = 16
    ("all_gather", "recursive_halving_doubling", 200, 6, 16.0),
    # direct: 2 + 6
    ("all_gather", "direct", 200, 4, 8.0),
    # broadcast ring, p=4, n=800: n*beta = 8, k* = sqrt(2*8/2) = 2*sqrt(2) >= 1,
    # T = (sqrt((p-2)*alpha) + sqrt(n*beta))^2 = (2 + 2*sqrt(2))^2 = 12 + 8*sqrt(2)
    ("broadcast", "ring", 800, 4, 12 + 8 * math.sqrt(2)),
    # p=2: k* = 0 -> k = 1: (0 + 1)*(2 + 8) = 10
    ("broadcast", "ring", 800, 2, 10.0),
    # p=3, n=100: n*beta = 1, k* = sqrt(1*1/2) < 1 -> k = 1: (1 + 1)*(2 + 1) = 6
    ("broadcast", "ring", 100, 3, 6.0),
    # binomial: ceil(log2 4)*(2 + 8) = 20; p=5: 3*10 = 30
    ("broadcast", "binomial_tree", 800, 4, 20.0),
    ("broadcast", "binomial_tree", 800, 5, 30.0),
    ("reduce", "ring", 800, 4, 12 + 8 * math.sqrt(2)),
    ("reduce", "binomial_tree", 800, 4, 20.0),
    # gather/scatter, n=200 per rank, p=4: binomial 2*2 + 3*200*0.01 = 4 + 6; direct 2 + 6
    ("gather", "binomial_tree", 200, 4, 10.0),
    ("gather", "direct", 200, 4, 8.0),
    ("scatter", "binomial_tree", 200, 4, 10.0),
    ("scatter", "direct", 200, 4, 8.0),
    # all_to_all, send buffer n=800, p=4: pairwise 3*(2 + 200*0.01) = 12; direct 2 + 3/4*8 = 8
    ("all_to_all", "pairwise", 800, 4, 12.0),
    ("all_to_all", "direct", 800, 4, 8.0),
    # all_to_all_v without splits = uniform all_to_all
    ("all_to_all_v", "pairwise", 800, 4, 12.0),
    ("all_to_all_v", "direct", 800, 4, 8.0),
    # dissemination barrier: ceil(log2 p)*alpha: p=4 -> 4, p=5 -> 6 (bytes ignored)
    ("barrier", "dissemination", 0, 4, 4.0),
    ("barrier", "dissemination", 999, 5, 6.0),
    # send/recv: 2 + 800*0.01
    ("send_recv", "direct", 800, 2, 10.0),
]


@pytest.mark.parametrize(("collective", "algorithm", "nbytes", "p", "expected"), HAND)
def test_hand_computed(collective: str, algorithm: str, nbytes: int, p: int, expected: float) -> None:
    assert close(cost(collective, algorithm, nbytes, p, L), expected)


def test_every_model_has_a_hand_computed_case() -> None:
    covered = {(c, a) for c, a, *_ in HAND}
    assert covered == set(COST_MODELS)


def test_broadcast_ring_zero_latency_is_the_bandwidth_limit() -> None:
    # alpha = 0: infinitely many chunks, T = n*beta = 800*0.01
    assert close(cost("broadcast", "ring", 800, 16, Link(0.0, 100.0)), 8.0)


def test_hierarchical_two_dims() -> None:
    # p = 8 = 4 intra x 2 inter; intra alpha 2, beta 0.01; inter alpha 10, beta 1/50 = 0.02; n = 800.
    # intra ring RS(800, 4):   3*2 + 3/4*800*0.01 = 12
    # inter ring AR(200, 2):   2*1*10 + 2*1/2*200*0.02 = 24
    # intra ring AG(200, 4):   3*2 + 3*200*0.01 = 12          total 48
    inter = Link(10.0, 50.0)
    assert close(cm.hierarchical_all_reduce(800, [(4, L), (2, inter)]), 48.0)
    # inter double binary tree on 200 over 2: 2*1*10 + 2*200*0.02 = 28 -> 12 + 28 + 12
    got = cm.hierarchical_all_reduce(800, [(4, L), (2, inter)], inter_algorithm="double_binary_tree")
    assert close(got, 52.0)


def test_hierarchical_three_dims() -> None:
    # dims (2, L), (2, L), (2, inter), n = 800:
    # dim 0: RS(800, 2) = 2 + 1/2*8 = 6, AG(400, 2) = 2 + 4 = 6   -> 12, s = 400
    # dim 1: RS(400, 2) = 2 + 2 = 4,     AG(200, 2) = 2 + 2 = 4   -> 8,  s = 200
    # last:  ring AR(200, 2) on inter = 2*10 + 200*0.02 = 24                total 44
    inter = Link(10.0, 50.0)
    assert close(cm.hierarchical_all_reduce(800, [(2, L), (2, L), (2, inter)]), 44.0)


def test_all_to_all_v_splits() -> None:
    # p = 4, step k sends send[k-1] and receives recv[k-1]:
    # pairwise: (2 + max(100,200)*0.01) + (2 + max(0,50)*0.01) + (2 + max(300,100)*0.01) = 4 + 2.5 + 5
    send, recv = [100, 0, 300], [200, 50, 100]
    assert close(cost("all_to_all_v", "pairwise", 0, 4, L, send_bytes=send, recv_bytes=recv), 11.5)
    # direct: 2 + max(400, 350)*0.01
    assert close(cost("all_to_all_v", "direct", 0, 4, L, send_bytes=send, recv_bytes=recv), 6.0)
    with pytest.raises(ValueError, match="p-1=3"):
        cost("all_to_all_v", "direct", 0, 4, L, send_bytes=[1, 2], recv_bytes=[1, 2])
    with pytest.raises(ValueError, match="both send_bytes and recv_bytes"):
        cost("all_to_all_v", "direct", 0, 4, L, send_bytes=[1, 2, 3])
    with pytest.raises(ValueError, match=">= 0"):
        cost("all_to_all_v", "pairwise", 0, 4, L, send_bytes=[1, -2, 3], recv_bytes=[1, 2, 3])


def test_efficiency_curve() -> None:
    eff = Efficiency(((1000, 0.5), (100_000, 1.0)))
    assert eff(10) == 0.5 and eff(1000) == 0.5
    assert close(eff(10_000), 0.75)  # halfway in log(size)
    assert eff(100_000) == 1.0 and eff(10**9) == 1.0
    assert Efficiency()(123) == 1.0
    # ring all-reduce, n = 10000, p = 4: beta = 1/(100*0.75) = 1/75: 2*3*2 + 3/2*10000/75 = 12 + 200
    link = Link(2.0, 100.0, eff)
    assert close(cost("all_reduce", "ring", 10_000, 4, link), 212.0)
    # all_gather evaluates efficiency at its output p*n: shard 2500 -> size 10000 -> 0.75: 6 + 3*2500/75
    assert close(cost("all_gather", "ring", 2500, 4, link), 106.0)


@pytest.mark.parametrize(
    ("points", "match"),
    [
        (((0, 0.5),), "size_bytes"),
        (((10, 0.5), (10, 0.6)), "strictly increasing"),
        (((10, 0.0),), r"\(0, 1\]"),
        (((10, 1.5),), r"\(0, 1\]"),
        (((10, float("nan")),), "finite"),
        (((10,),), "size_bytes, fraction"),
    ],
)
def test_efficiency_validation(points: tuple[tuple[int, float], ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Efficiency(points)


def test_link_validation_and_units() -> None:
    with pytest.raises(ValueError, match="latency_us must be >= 0, got -1"):
        Link(-1.0, 1.0)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_us must be > 0, got 0"):
        Link(1.0, 0.0)
    with pytest.raises(ValueError, match="latency_us must be a finite number"):
        Link(float("inf"), 1.0)
    # 25 GB/s = 25e9 bytes/s = 25000 bytes/us
    assert Link.from_gbps(1.0, 25.0).bandwidth_bytes_per_us == 25_000.0


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="unknown collective 'allreduce'; known: all_reduce"):
        cost("allreduce", "ring", 1, 2, L)
    with pytest.raises(ValueError, match="unknown algorithm 'tree' for broadcast; known: ring, binomial_tree"):
        cost("broadcast", "tree", 1, 2, L)
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        cost("all_reduce", "ring", -1, 2, L)
    with pytest.raises(ValueError, match=r"p .* must be an int >= 1, got 0"):
        cost("all_reduce", "ring", 1, 0, L)
    with pytest.raises(ValueError, match="unknown algorithm 'hierarchical' for all_reduce"):  # not one link
        cost("all_reduce", "hierarchical", 1, 8, L)
    with pytest.raises(ValueError, match="unknown inter_algorithm 'hierarchical'"):
        cm.hierarchical_all_reduce(1, [(2, L), (4, L)], inter_algorithm="hierarchical")


def test_bus_bandwidth() -> None:
    # 1e9-byte all-reduce in 1 s on 8 ranks: algbw 1 GB/s, busbw 2*7/8 = 1.75
    assert close(bus_bandwidth_gbps("all_reduce", 10**9, 8, 1e6), 1.75)
    # all_gather of a 1e8-byte shard on 8 ranks in 1 s: size 8e8 -> algbw 0.8, busbw 0.8*7/8 = 0.7
    assert close(algorithm_bandwidth_gbps("all_gather", 10**8, 8, 1e6), 0.8)
    assert close(bus_bandwidth_gbps("all_gather", 10**8, 8, 1e6), 0.7)
    assert close(bus_bandwidth_gbps("reduce_scatter", 10**9, 8, 1e6), 0.875)
    assert close(bus_bandwidth_gbps("broadcast", 10**9, 8, 1e6), 1.0)
    assert close(bus_bandwidth_gbps("all_to_all", 10**9, 4, 1e6), 0.75)
    assert bus_bandwidth_gbps("barrier", 0, 8, 5.0) == 0.0
    with pytest.raises(ValueError, match="time_us must be > 0"):
        bus_bandwidth_gbps("all_reduce", 1, 8, 0.0)


def test_constant_time_in_world_size() -> None:
    # Closed forms only: at p = 2**40 (a loop over ranks would never finish) every model returns at once.
    for p in (2**20, 2**40):
        for collective, algorithm in FLAT:
            t = cost(collective, algorithm, 1 << 30, p, L)
            assert math.isfinite(t) and t > 0
        assert math.isfinite(cm.hierarchical_all_reduce(1 << 30, [(8, L), (p // 8, L)]))


def test_collectives_listing() -> None:
    assert cm.collectives()[0] == "all_reduce"
    assert "hierarchical" in cm.algorithms_for("all_reduce")


# ------------------------------------------------------------------------------------------- properties

sizes = st.integers(min_value=0, max_value=1 << 40)
ranks = st.integers(min_value=1, max_value=1 << 20)
links = st.builds(
    Link,
    st.floats(min_value=0.0, max_value=1e3),
    st.floats(min_value=1e-3, max_value=1e6),
)
models = st.sampled_from(FLAT)


def le(a: float, b: float) -> bool:
    return a <= b * (1 + 1e-12) + 1e-12


@settings(max_examples=300, deadline=None)
@given(models, sizes, sizes, ranks, links)
def test_non_decreasing_in_bytes(model: tuple[str, str], n1: int, n2: int, p: int, link: Link) -> None:
    lo, hi = sorted((n1, n2))
    assert le(cost(*model, lo, p, link), cost(*model, hi, p, link))


@settings(max_examples=300, deadline=None)
@given(models, sizes, ranks, st.floats(0.0, 1e3), st.floats(1e-3, 1e6), st.floats(1e-3, 1e6))
def test_non_increasing_in_bandwidth(
    model: tuple[str, str], n: int, p: int, alpha: float, bw1: float, bw2: float
) -> None:
    lo, hi = sorted((bw1, bw2))
    assert le(cost(*model, n, p, Link(alpha, hi)), cost(*model, n, p, Link(alpha, lo)))


curves = st.sampled_from([Efficiency(), Efficiency(((1024, 0.3), (1 << 20, 0.9), (1 << 30, 1.0)))])


@settings(max_examples=300, deadline=None)
@given(sizes, ranks, links, curves)
def test_ring_all_reduce_is_reduce_scatter_plus_all_gather(n: int, p: int, link: Link, eff: Efficiency) -> None:
    link = Link(link.latency_us, link.bandwidth_bytes_per_us, eff)
    whole = cost("all_reduce", "ring", n, p, link)
    parts = cost("reduce_scatter", "ring", n, p, link) + cm.all_gather_ring(n / p, p, link)
    assert math.isclose(whole, parts, rel_tol=1e-12, abs_tol=1e-9)


inter_algorithms = st.sampled_from(["ring", "double_binary_tree", "recursive_halving_doubling", "direct"])


@settings(max_examples=300, deadline=None)
@given(sizes, ranks, links, links, inter_algorithms)
def test_hierarchical_over_one_dimension_is_flat(n: int, p: int, intra: Link, inter: Link, algo: str) -> None:
    # all ranks in the inter dimension (p_intra = 1): the flat `algo` on the inter link
    flat_inter = cost("all_reduce", algo, n, p, inter)
    got = cm.hierarchical_all_reduce(n, [(1, intra), (p, inter)], algo)
    assert math.isclose(got, flat_inter, rel_tol=1e-12, abs_tol=1e-9)
    # all ranks in the intra dimension (p_inter = 1): intra ring RS + AG = flat ring all-reduce
    got = cm.hierarchical_all_reduce(n, [(p, intra), (1, inter)], algo)
    assert math.isclose(got, cost("all_reduce", "ring", n, p, intra), rel_tol=1e-12, abs_tol=1e-9)
    assert cm.hierarchical_all_reduce(n, [(p, inter)], algo) == flat_inter


@settings(max_examples=200, deadline=None)
@given(models, sizes, links)
def test_one_rank_costs_nothing(model: tuple[str, str], n: int, link: Link) -> None:
    assert cost(*model, n, 1, link) == 0.0
    assert cm.hierarchical_all_reduce(n, [(1, link)]) == 0.0
