"""The wiring's closed forms against explicit routes, and the step costs' semantics.

The oracle routes every message of a step on an explicit graph (ring: shortest way, distance p/2 forward; switch:
the sender's up-port then the receiver's down-port; fully connected: the pair's own link), counts messages per
directed link and takes the longest path; ``wiring.step_shape`` must give the same busiest load and hops.
"""

from __future__ import annotations

from collections import Counter

import pytest

from emulator_core.network.wiring import ALL, SHIFT, TREE, XOR, step_cost, step_shape, sweep_cost


def _route(kind: str, p: int, src: int, dst: int) -> list[tuple[object, ...]]:
    if kind == "fully_connected":
        return [("pair", src, dst)]
    if kind == "switch":
        return [("up", src), ("down", dst)]
    fwd = (dst - src) % p
    if fwd <= p - fwd:  # shortest way; a tie (p/2) goes forward
        return [("fwd", (src + i) % p) for i in range(fwd)]
    return [("back", (src - i) % p) for i in range(p - fwd)]


def _messages(pattern: str, p: int, d: int, fan: int) -> list[tuple[int, int]]:
    if pattern == SHIFT:
        return [(r, (r + d) % p) for r in range(p)]
    if pattern == XOR:
        return [(r, r ^ d) for r in range(p)]
    if pattern == ALL:
        return [(r, q) for r in range(p) for q in range(p) if q != r]
    # TREE(d, fan): parents at odd multiples of d... the binary tree's level with edge length d: parents are the
    # ranks at multiples of 2d that are not multiples of 4d (or the root 0 for the root's level), children at +-d
    if fan == 1:
        return [(d, 0)]
    parents = [q for q in range(0, p, 2 * d) if q % (4 * d) == 2 * d]
    return [(c, q) for q in parents for c in ((q - d) % p, (q + d) % p)]


def _oracle(kind: str, p: int, pattern: str, d: int = 1, fan: int = 1) -> tuple[int, int]:
    links: Counter[tuple[object, ...]] = Counter()
    hops = 0
    for src, dst in _messages(pattern, p, d, fan):
        if src == dst:
            continue
        path = _route(kind, p, src, dst)
        links.update(path)
        hops = max(hops, 1 if kind == "switch" else len(path))
    return max(links.values()), hops


@pytest.mark.parametrize("kind", ["ring", "switch", "fully_connected"])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 64])
def test_shift_and_all_pairs_match_explicit_routes(kind: str, p: int) -> None:
    assert step_shape(kind, p, ALL) == _oracle(kind, p, ALL)
    for d in range(1, p):
        assert step_shape(kind, p, SHIFT, d) == _oracle(kind, p, SHIFT, d), d


@pytest.mark.parametrize("kind", ["ring", "switch", "fully_connected"])
@pytest.mark.parametrize("p", [2, 4, 8, 16, 32, 64])
def test_xor_exchanges_and_tree_levels_match_explicit_routes(kind: str, p: int) -> None:
    d = 1
    while d < p:
        assert step_shape(kind, p, XOR, d) == _oracle(kind, p, XOR, d), d
        d *= 2
    levels = (p - 1).bit_length()
    for j in range(levels):
        dist, fan = 1 << (levels - 1 - j), 1 if j == 0 else 2
        assert step_shape(kind, p, TREE, dist, fan) == _oracle(kind, p, TREE, dist, fan), (dist, fan)


def test_the_oracle_can_fail() -> None:
    # the ring's all-pairs load grows as p^2/8: a wrong closed form (e.g. p - 1, a switch's) disagrees
    assert _oracle("ring", 16, ALL) != (15, 8)
    assert _oracle("ring", 16, ALL) == (36, 8)


def test_store_and_forward_and_congestion_semantics() -> None:
    kw = {"latency_us": 1.0, "overhead_us": 0.0}
    # switch, direct (p - 1 messages through one port): cut-through load p-1; store-and-forward one more message
    assert step_cost("switch", 8, ALL, aware=True, store_and_forward=False, **kw).bytes_coefficient == 7
    assert step_cost("switch", 8, ALL, aware=True, store_and_forward=True, **kw).bytes_coefficient == 8
    # unaware: every message alone on its path
    assert step_cost("switch", 8, ALL, aware=False, store_and_forward=True, **kw).bytes_coefficient == 1
    # ring, a message 4 hops away store-and-forwarded: 4 times its size; cut-through: its link load (4 as well,
    # every rank sends the same distance), and 4 traversals of latency
    sf = step_cost("ring", 16, TREE, d=4, fan=2, aware=True, store_and_forward=True, **kw)
    ct = step_cost("ring", 16, TREE, d=4, fan=2, aware=True, store_and_forward=False, **kw)
    assert (sf.bytes_coefficient, ct.bytes_coefficient, sf.latency_us) == (4, 1, 4.0)
    # a queue longer than the path hides all but the end links' latency
    assert step_cost("ring", 64, ALL, aware=True, store_and_forward=False, **kw).latency_us == 2.0
    assert step_cost("ring", 64, ALL, aware=False, store_and_forward=False, **kw).latency_us == 32.0
    # every message a rank injects pays the overhead
    o = step_cost("switch", 8, ALL, aware=True, store_and_forward=False, latency_us=1.0, messages=7, overhead_us=0.5)
    assert o.latency_us == 1.0 + 7 * 0.5


@pytest.mark.parametrize("kind", ["ring", "switch", "fully_connected"])
@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 16, 33])
@pytest.mark.parametrize("aware", [True, False])
def test_the_pairwise_sweep_is_the_sum_of_its_steps(kind: str, p: int, aware: bool) -> None:
    kw = {"latency_us": 1.5, "aware": aware, "store_and_forward": False, "overhead_us": 0.25}
    steps = [step_cost(kind, p, SHIFT, d=k, **kw) for k in range(1, p)]
    total = sweep_cost(kind, p, **kw)
    assert total.latency_us == pytest.approx(sum(s.latency_us for s in steps))
    assert total.bytes_coefficient == pytest.approx(sum(s.bytes_coefficient for s in steps))


def _rack_oracle(p: int, m: int, over: float, pattern: str, d: int = 1, fan: int = 1) -> float:
    """The busiest link's time per message size over the rank's link bandwidth, routing every message of the step
    explicitly: a rank's up and down port (1 each), and across racks its rack's uplink out and the other's in, each
    of ``m / over`` links' bandwidth (so ``over / m`` per message)."""
    links: Counter[tuple[object, ...]] = Counter()
    for src, dst in _messages(pattern, p, d, fan):
        if src == dst:
            continue
        links.update([("up", src), ("down", dst)])
        if src // m != dst // m:
            links.update([("uplink-out", src // m), ("uplink-in", dst // m)])
    return max(n * (over / m if key[0].startswith("uplink") else 1.0) for key, n in links.items())


@pytest.mark.parametrize(("p", "m"), [(4, 2), (8, 4), (8, 2), (16, 4), (12, 4), (12, 6), (6, 3)])
@pytest.mark.parametrize("over", [1.0, 2.0, 4.0])
def test_racks_shift_all_and_xor_match_explicit_routes(p: int, m: int, over: float) -> None:
    from emulator_core.network.wiring import Racks

    racks = Racks(m, over)
    kw = {"latency_us": 0.0, "aware": True, "store_and_forward": False, "racks": racks}
    assert step_cost("switch", p, ALL, **kw).bytes_coefficient == pytest.approx(_rack_oracle(p, m, over, ALL))
    for d in range(1, p):
        got = step_cost("switch", p, SHIFT, d=d, **kw).bytes_coefficient
        assert got == pytest.approx(_rack_oracle(p, m, over, SHIFT, d)), d
    if p & (p - 1) == 0:
        d = 1
        while d < p:
            got = step_cost("switch", p, XOR, d=d, **kw).bytes_coefficient
            assert got == pytest.approx(_rack_oracle(p, m, over, XOR, d)), d
            d *= 2


def test_racks_cost_a_ring_only_where_the_uplink_is_slower_than_a_link() -> None:
    from emulator_core.network.wiring import Racks

    kw = {"latency_us": 1.0, "aware": True, "store_and_forward": False}
    one = step_cost("switch", 8, SHIFT, **kw)
    # racks of 4 behind a 4:1 uplink: the ring's one message across each way has the uplink (4 links / 4) to itself
    four = step_cost("switch", 8, SHIFT, racks=Racks(4, 4.0), **kw)
    assert four.bytes_coefficient == one.bytes_coefficient == 1.0
    assert four.latency_us == 3.0  # two more traversals across the racks
    # racks of 2 behind 4:1: the uplink is half a link
    assert step_cost("switch", 4, SHIFT, racks=Racks(2, 4.0), **kw).bytes_coefficient == 2.0
    # a group inside one rack never crosses
    assert step_cost("switch", 4, SHIFT, racks=Racks(4, 4.0), **kw) == step_cost("switch", 4, SHIFT, **kw)
