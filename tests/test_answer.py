"""Answering a collective (emulator_core.pricing.answer): the rule of its module docstring, by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emulator_core.pricing.answer as answer_mod
from emulator_core.pricing.answer import Answer, Fabric, mirror_member, mirror_weights
from emulator_core.pricing.pricer import GroupShape, Pricer, PricingError, group_shape, make_pricer, price_group
from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.model import Network, Scenario, Straggler, Topology
from emulator_core.scenario.world import resize

SCENARIOS = Path(__file__).resolve().parents[1] / "emulator_core" / "scenarios"
NVLINK_ALPHA, NVLINK_BW = 2.0, 3600 * 125.0  # dgx_h100_400g's nvlink dimension: 2 us, 3600 Gb/s in bytes/us


def dgx64(**changes: object) -> Scenario:
    """dgx_h100_400g resized to 8 GPUs x 8 nodes, without its NVLink SHARP and per-message overhead: these tests
    check the answering rule against the plain closed forms (the network model has its own tests)."""
    s = resize(load_scenario(SCENARIOS / "dgx_h100_400g.toml"), 64)
    plain = Topology(tuple(replace(d, in_network_reduction=False) for d in s.topology.dims))
    return replace(s, topology=plain, network=Network(), **changes)  # type: ignore[arg-type]


def test_ring_all_reduce_on_a_node_costs_the_closed_form_and_ends_at_last_arrival_plus_cost() -> None:
    s = dgx64()
    fabric = Fabric(s)
    g = fabric.group(range(8), [0, 1])  # one node: the nvlink dimension only
    n = 1 << 30  # big: ring beats the double binary tree
    by_hand = 2 * 7 * NVLINK_ALPHA + 2 * 7 / 8 * n / NVLINK_BW
    a = fabric.answer(g, "all_reduce", n, [10.0, 25.0])
    assert a == Answer(25.0, 25.0 + a.cost_us, a.cost_us, "ring")
    assert a.cost_us == pytest.approx(by_hand, rel=1e-12)
    assert (a.algorithm, a.cost_us) == price_group(s, "all_reduce", n, group_shape(s, range(8)))
    small = fabric.answer(g, "all_reduce", 1 << 20, [0.0, 0.0])  # small: the tree wins
    assert small.algorithm == "double_binary_tree"
    assert small.cost_us == pytest.approx(2 * 3 * NVLINK_ALPHA + 2 * (1 << 20) / NVLINK_BW, rel=1e-12)
    assert small.start_us == a.end_us  # same group: waits for the first


def test_all_gather_on_a_node_costs_the_ring_closed_form() -> None:
    s = dgx64()
    fabric = Fabric(s)
    g = fabric.group(range(8, 16), [8, 11, 15])  # node 1
    n = 1 << 20
    a = fabric.answer(g, "all_gather", n, [3.0, 1.0, 2.0])
    assert a.algorithm == "ring" and a.start_us == 3.0
    assert a.cost_us == pytest.approx(7 * NVLINK_ALPHA + 7 * n / NVLINK_BW, rel=1e-12)
    assert a.end_us == 3.0 + a.cost_us


def test_a_collective_cannot_complete_before_its_last_real_participant_arrives() -> None:
    fabric = Fabric(dgx64())
    g = fabric.group(range(8), [0, 1])
    a = fabric.answer(g, "broadcast", 4096, [0.0, 500.0])
    assert a.start_us == 500.0 and a.end_us == 500.0 + a.cost_us > 500.0


def test_collectives_on_one_group_serialize_and_separate_groups_do_not() -> None:
    fabric = Fabric(dgx64())
    g = fabric.group(range(8), [0, 1])
    h = fabric.group(range(8), [0, 1])  # another communicator on the same ranks
    first = fabric.answer(g, "all_reduce", 1 << 24, [0.0, 0.0])
    assert first.start_us == 0.0 and g.free_us == first.end_us and g.answered == 1
    second = fabric.answer(g, "all_reduce", 1 << 24, [1.0, 2.0])  # issued before first ended
    assert second.start_us == first.end_us and second.end_us == first.end_us + second.cost_us
    other = fabric.answer(h, "all_reduce", 1 << 24, [1.0, 2.0])
    assert other.start_us == 2.0 and h.answered == 1 and g.answered == 2
    later = second.end_us + 100.0
    third = fabric.answer(g, "all_reduce", 1 << 24, [later, later - 50.0])  # arrives after the group is free
    assert third.start_us == later


def test_a_collective_queued_behind_the_previous_costs_its_own_price_under_gloo_as_under_nccl() -> None:
    """A call issued while the group's previous one runs starts when that one ends and costs price(bytes), its
    own: a gloo calibration measured at the group's size (loopback_cpu: gloo, 2 ranks) prices it as NCCL does."""
    fabric = Fabric(load_scenario(SCENARIOS / "loopback_cpu.toml"))
    g = fabric.group([0, 1], [0, 1])
    cal = fabric._calibration(g, "all_reduce")
    assert cal is not None and cal.library == "gloo" and cal.ranks == g.shape.size  # the premise
    b1, b2 = 1181952, 526336
    first = fabric.answer(g, "all_reduce", b1, [0.0, 0.0])
    second = fabric.answer(g, "all_reduce", b2, [10.0, 20.0])  # issued while the first runs
    assert second.start_us == first.end_us
    assert second.cost_us == fabric.price(g, "all_reduce", b2)[1]
    assert second.end_us == first.end_us + fabric.price(g, "all_reduce", b2)[1]

    nccl = Fabric(dgx64())
    h = nccl.group(range(8), [0, 1])
    nccl.answer(h, "all_reduce", b1, [0.0, 0.0])
    queued = nccl.answer(h, "all_reduce", b2, [1.0, 1.0])
    assert queued.cost_us == nccl.price(h, "all_reduce", b2)[1]


def test_an_emulated_straggler_stretches_its_mirrors_arrival_since_the_previous_completion() -> None:
    s = dgx64(stragglers=(Straggler(3, 2.0),))  # rank 3 is emulated, mirrors real member 3 % 2 = 1
    fabric = Fabric(s)
    g = fabric.group(range(8), [0, 1])
    assert g.stragglers == ((2.0, 1),)
    free = fabric.answer(g, "all_reduce", 1 << 20, [0.0, 0.0]).end_us
    a = fabric.answer(g, "all_reduce", 1 << 20, [free + 30.0, free + 20.0])
    assert a.start_us == free + ((free + 20.0) - free) * 2.0  # 40 us after free, later than member 0's 30
    b = fabric.answer(g, "all_reduce", 1 << 20, [a.end_us + 5.0, a.end_us])  # mirror on time: no delay
    assert b.start_us == a.end_us + 5.0


def test_a_real_straggler_and_a_straggler_outside_the_group() -> None:
    s = dgx64(stragglers=(Straggler(1, 3.0), Straggler(20, 100.0)))
    fabric = Fabric(s)
    node0 = fabric.group(range(8), [0, 1])
    assert node0.stragglers == ((3.0, 1),)  # rank 20 is on node 2: no effect here
    free = fabric.answer(node0, "all_gather", 1024, [0.0, 0.0]).end_us
    late = fabric.answer(node0, "all_gather", 1024, [free + 5.0, free + 10.0])
    assert late.start_us == free + ((free + 10.0) - free) * 3.0  # real member 1 is 3x slower
    node1 = fabric.group(range(8, 16), [8, 9])
    assert node1.stragglers == ()
    free = fabric.answer(node1, "all_gather", 1024, [0.0, 0.0]).end_us
    assert fabric.answer(node1, "all_gather", 1024, [free + 7.0, free + 9.0]).start_us == free + 9.0


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier", "reduce")
Call = tuple[str, int, list[float]]


def _replay(calls: list[Call]) -> list[Answer]:
    fabric = Fabric(dgx64(stragglers=(Straggler(5, 1.5), Straggler(12, 4.0))))
    world = fabric.group(None, [0, 9, 40])
    return [fabric.answer(world, coll, n, arrivals) for coll, n, arrivals in calls]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(COLLECTIVES), st.integers(0, 1 << 30),
                          st.lists(st.floats(0.0, 1e7, allow_nan=False), min_size=3, max_size=3)), max_size=12))
def test_the_same_calls_on_fresh_fabrics_answer_bit_for_bit_the_same(calls: list[Call]) -> None:
    first, second = _replay(calls), _replay(calls)
    assert [[x.hex() for x in a[:3]] + [a[3]] for a in first] == [[x.hex() for x in a[:3]] + [a[3]] for a in second]
    free = -math.inf
    for (_, _, arrivals), a in zip(calls, first, strict=True):
        assert a.start_us >= max(free, *arrivals) and a.end_us == a.start_us + a.cost_us
        free = a.end_us


@pytest.mark.parametrize("world", [8, 64, 4096, 1 << 16, 1 << 20])
def test_world_sized_groups_answer_from_the_real_members_and_price_once(
        world: int, monkeypatch: pytest.MonkeyPatch) -> None:
    s = resize(load_scenario(SCENARIOS / "loopback_cpu.toml"), world)
    calls: list[tuple[str, float]] = []

    def counting_pricer(scenario: Scenario, collective: str, shape: GroupShape) -> Pricer:
        inner = make_pricer(scenario, collective, shape)

        def pricer(nbytes: float, **kw: object) -> tuple[str, float]:
            calls.append((collective, nbytes))
            return inner(nbytes, **kw)
        return pricer

    monkeypatch.setattr(answer_mod, "make_pricer", counting_pricer)
    fabric = Fabric(s)
    g = fabric.group(None, [0])
    assert g.shape.size == world and g.real_positions == (0,) and g.stragglers == ()
    first = fabric.answer(g, "all_reduce", 1 << 20, [0.0])
    second = fabric.answer(g, "all_reduce", 1 << 20, [0.0])
    assert calls == [("all_reduce", 1 << 20)] and len(g._prices) == 1  # second answer: a cache hit
    assert first == Answer(0.0, first.cost_us, first.cost_us, first.algorithm)
    assert second == Answer(first.end_us, 2 * first.cost_us, first.cost_us, first.algorithm)
    assert (first.algorithm, first.cost_us) == price_group(s, "all_reduce", 1 << 20, group_shape(s))
    last = fabric.group(None, [world - 1])
    assert last.real_positions == (world - 1,)


def _brute_weights(p: int, positions: list[int]) -> list[int]:
    weights = [0] * len(positions)
    for j in range(p):
        weights[mirror_member(j, positions)] += 1
    return weights


def test_mirror_weights_by_hand() -> None:
    assert mirror_weights(8, [0, 1]) == [4, 4]
    assert [mirror_member(j, [0, 3]) for j in range(7)] == [0, 1, 0, 1, 0, 1, 0]
    assert mirror_weights(7, [0, 3]) == _brute_weights(7, [0, 3]) == [4, 3]
    assert mirror_weights(5, [4]) == [5]
    assert mirror_member(4, [1, 4, 6]) == 1  # a real member mirrors itself, not 4 % 3


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda p: st.tuples(st.just(p), st.lists(st.integers(0, p - 1), min_size=1,
                                                                             max_size=min(p, 12), unique=True))))
def test_mirror_weights_match_a_brute_force_count(case: tuple[int, list[int]]) -> None:
    p, positions = case
    positions.sort()
    weights = mirror_weights(p, positions)
    assert weights == _brute_weights(p, positions) and sum(weights) == p


def test_mirror_weights_for_a_million_ranks_follow_the_closed_form() -> None:
    p, positions = 1 << 20, [0, 5, (1 << 20) - 1]  # residues mod 3: 0, 2, 0
    expected = [1 + math.ceil((p - k) / 3) - real for k, real in enumerate((2, 0, 1))]
    assert expected == [349525, 349526, 349525]
    assert mirror_weights(p, positions) == expected and sum(expected) == p
    small = 3 * 1000 + 1  # same residues pattern: p % 3 == 1 and the last position is p - 1
    assert mirror_weights(small, [0, 5, small - 1]) == _brute_weights(small, [0, 5, small - 1]) == [1000, 1001, 1000]


def test_mirror_errors() -> None:
    with pytest.raises(ValueError, match="without real members"):
        mirror_weights(8, [])
    with pytest.raises(ValueError, match="without real members"):
        mirror_member(3, [])
    with pytest.raises(ValueError, match=r"\[1, 1\] must be distinct and in 0..7"):
        mirror_weights(8, [1, 1])
    with pytest.raises(ValueError, match=r"\[0, 8\] must be distinct and in 0..7"):
        mirror_weights(8, [0, 8])
    with pytest.raises(ValueError, match=r"\[-1\] must be distinct"):
        mirror_weights(8, [-1])


def test_answer_and_group_errors_leave_the_group_untouched() -> None:
    fabric = Fabric(dgx64())
    g = fabric.group(range(8), [0, 1])
    with pytest.raises(ValueError, match="all_reduce: 1 arrival times for 2 real members"):
        fabric.answer(g, "all_reduce", 8, [0.0])
    for bad in ([0.0, math.inf], [math.nan, 0.0], [-math.inf, 1.0]):
        with pytest.raises(ValueError, match="arrival times must be finite"):
            fabric.answer(g, "all_reduce", 8, bad)
    with pytest.raises(PricingError, match="all_frobnicate"):  # an NboxError now (issue 13: no ValueError escapes)
        fabric.answer(g, "all_frobnicate", 8, [0.0, 0.0])
    assert g.free_us == -math.inf and g.answered == 0
    with pytest.raises(ValueError, match="real rank 9 is not a member of the group"):
        fabric.group(range(8), [0, 9])
    with pytest.raises(ValueError, match="real rank 64 is not a member"):
        fabric.group(None, [64])
    with pytest.raises(ValueError, match="at least one real member"):
        fabric.group(range(8), [])
    with pytest.raises(ValueError, match="must be a Scenario"):
        Fabric("dgx")  # type: ignore[arg-type]


def test_a_nan_arrival_anywhere_is_rejected() -> None:
    fabric = Fabric(dgx64())
    g = fabric.group(range(8), [0, 1, 2])
    with pytest.raises(ValueError, match="arrival times must be finite"):
        fabric.answer(g, "all_reduce", 8, [0.0, math.nan, 5.0])


def test_all_to_all_v_splits_go_through_the_per_peer_model() -> None:
    send = [1000.0 * k for k in range(1, 8)]  # to the 7 peers
    recv = [3000.0] * 7
    busiest = max(sum(send), sum(recv))  # 28,000 sent vs 21,000 received
    fabric = Fabric(dgx64())
    g = fabric.group(range(8), [0])
    a = fabric.answer(g, "all_to_all_v", 8000, [0.0], send_bytes=send, recv_bytes=recv)
    assert (a.algorithm, a.start_us) == ("direct", 0.0)
    assert a.cost_us == pytest.approx(NVLINK_ALPHA + busiest / NVLINK_BW, rel=1e-12)
    uniform = fabric.answer(g, "all_to_all_v", 8000, [0.0])
    assert uniform.cost_us == pytest.approx(NVLINK_ALPHA + 7 / 8 * 8000 / NVLINK_BW, rel=1e-12)
    again = fabric.answer(g, "all_to_all_v", 8000, [0.0], send_bytes=recv, recv_bytes=recv)  # not cached by size
    assert again.cost_us == pytest.approx(NVLINK_ALPHA + 21000 / NVLINK_BW, rel=1e-12)
    pair = Fabric(dgx64(algorithms={"all_to_all_v": "pairwise"}))
    b = pair.answer(pair.group(range(8), [0]), "all_to_all_v", 8000, [0.0], send_bytes=send, recv_bytes=recv)
    by_hand = sum(NVLINK_ALPHA + max(x, y) / NVLINK_BW for x, y in zip(send, recv, strict=True))
    assert b.algorithm == "pairwise" and b.cost_us == pytest.approx(by_hand, rel=1e-12)


def test_a_collective_beside_its_members_compute_is_stretched_by_its_busy_slowdown() -> None:
    """busy_slowdown s: a call issued while the group's previous collective runs shows its members computed
    meanwhile; the stream ends overlap * (1 - 1/s) later, overlap counted from that collective's start (or the
    previous such arrival); a call that starts the stream anew adds nothing, and s = 1 changes nothing."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    slow = replace(base, calibration=tuple(replace(c, busy_slowdown=2.0) if c.collective == "all_reduce" else c
                                           for c in base.calibration))
    n = 1 << 20
    answers = {}
    for name, s in (("plain", base), ("busy", slow)):
        fabric = Fabric(s)
        g = fabric.group(None, [0, 1])
        first = fabric.answer(g, "all_reduce", n, [0.0, 0.0])
        assert first.end_us > 1000.0  # long enough for the queued calls below to find it running
        second = fabric.answer(g, "all_reduce", n // 2, [300.0, 400.0])  # computed 400 us beside it
        third = fabric.answer(g, "all_reduce", n // 4, [700.0, 500.0])  # and 300 us more
        later = fabric.answer(g, "all_reduce", n, [third.end_us + 50.0] * 2)  # a new stream: nothing beside it
        answers[name] = (first, second, third, later)
    (p1, p2, p3, p4), (b1, b2, b3, b4) = answers["plain"], answers["busy"]
    assert b1 == p1 and b4.cost_us == pytest.approx(p4.cost_us)
    assert b2.cost_us - p2.cost_us == pytest.approx(400.0 * 0.5)
    assert b3.cost_us - p3.cost_us == pytest.approx(300.0 * 0.5)
    assert b3.end_us - p3.end_us == pytest.approx(350.0)  # the stream ends the stretch later


def test_a_call_still_running_once_slowed_by_its_members_compute_holds_the_next_one_behind_it() -> None:
    """compute_us (the virtual replay's): the next call arrives after the running one's unslowed end, but the
    members computed beside it all along, so once slowed at its busy rate it still runs and the new call queues
    behind it (T = free + compute (1 - 1/r), its fixed point); members that waited instead of computing (FSDP's
    ranks waiting for their all-gathers) leave it unslowed, and without compute_us (the live backend) it is not
    looked for."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    slow = replace(base, calibration=tuple(replace(c, busy_slowdown=2.0) if c.collective == "all_reduce" else c
                                           for c in base.calibration))
    n = 1 << 20

    def two(compute: object) -> tuple[Answer, Answer]:
        fabric = Fabric(slow)
        g = fabric.group(None, [0, 1])
        first = fabric.answer(g, "all_reduce", n, [0.0, 0.0])
        at = first.end_us + 0.25 * first.cost_us  # after its unslowed end
        kw = {} if compute is None else {"compute_us": compute}
        return first, fabric.answer(g, "all_reduce", n, [at, at], **kw)  # type: ignore[arg-type]

    def busy(k: int, t0: float, t1: float) -> float:
        return max(0.0, t1 - t0)  # every member computed throughout

    first, second = two(busy)
    rate = answer_mod.busy_rate(2.0, *Fabric(slow)._slowdown_of(Fabric(slow).group(None, [0, 1]), "all_reduce")[1:],
                                1, first.cost_us)
    assert rate > 1.25  # so that, slowed, it runs past the next arrival
    at = first.end_us + 0.25 * first.cost_us
    slowed = first.end_us + (at - first.start_us) * (1 - 1 / rate)  # compute counted up to the arrival only
    assert slowed > at
    assert second.start_us == pytest.approx(slowed, abs=1.0)
    assert second.end_us == pytest.approx(slowed + second.cost_us, abs=1.0)
    _, waited = two(lambda k, t0, t1: 0.0)
    _, live = two(None)
    assert waited.start_us == live.start_us == first.end_us + 0.25 * first.cost_us  # starts at its arrival
    _, one = two(lambda k, t0, t1: busy(k, t0, t1) if k == 1 else 0.0)  # one busy member slows the ring
    assert one.start_us == pytest.approx(slowed, abs=1.0)


def test_a_queued_call_counts_the_members_compute_not_the_time_since_the_running_call_began() -> None:
    """compute_us in the queued rule: the overlap is the busiest member's compute up to its own arrival, at most
    the time since the running call began; a member that waited adds nothing."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    slow = replace(base, calibration=tuple(replace(c, busy_slowdown=2.0) if c.collective == "all_reduce" else c
                                           for c in base.calibration))
    n = 1 << 20
    costs = {}
    for name, compute in (("proxy", None), ("half", lambda k, t0, t1: (t1 - t0) / 2),
                          ("waited", lambda k, t0, t1: 0.0), ("over", lambda k, t0, t1: 10 * (t1 - t0))):
        fabric = Fabric(slow)
        g = fabric.group(None, [0, 1])
        fabric.answer(g, "all_reduce", n, [0.0, 0.0])
        kw = {} if compute is None else {"compute_us": compute}
        costs[name] = fabric.answer(g, "all_reduce", n // 2, [300.0, 400.0], **kw).cost_us  # type: ignore[arg-type]
    plain = Fabric(base)
    pg = plain.group(None, [0, 1])
    own = plain.price(pg, "all_reduce", n // 2)[1]
    assert costs["proxy"] - own == pytest.approx(400.0 * 0.5)
    assert costs["half"] - own == pytest.approx(200.0 * 0.5)
    assert costs["waited"] == pytest.approx(own)
    assert costs["over"] == pytest.approx(costs["proxy"])  # never more than the time since it began


def test_busy_rate_is_a_delay_per_call_capped_at_the_measured_factor() -> None:
    """busy_rate: 1 without a slowdown; the measured factor for calls as short as the measured one (and for a
    stream of zero cost); 1 + delay x calls / cost for longer calls, so their stretch is the delay per call."""
    from emulator_core.pricing.answer import busy_rate

    assert busy_rate(1.0, 5000.0, 3, 100.0) == 1.0
    assert busy_rate(1.6, 6000.0, 1, 10_000.0) == pytest.approx(1.6)  # the measured call: (s - 1) x its price
    assert busy_rate(1.6, 6000.0, 1, 5_000.0) == pytest.approx(1.6)  # shorter: never more than measured
    assert busy_rate(1.6, 6000.0, 1, 0.0) == pytest.approx(1.6)
    assert busy_rate(1.6, 6000.0, 4, 1_000_000.0) == pytest.approx(1.024)  # four calls lose 24 ms over 1 s
    # a stream that lasts k x (cost + delay) of overlap is stretched by k delays, not by (1 - 1/s) of it
    rate = busy_rate(1.6, 6000.0, 1, 240_000.0)
    assert 10 * (240_000.0 + 6000.0) * (1 - 1 / rate) == pytest.approx(10 * 6000.0)


def test_a_long_stream_beside_compute_loses_the_measured_delay_per_call_not_the_factor() -> None:
    """busy_nbytes: the slowdown's size. A stream of calls much longer than the measured one is stretched by
    about (s - 1) x the measured call's price per call; calls of the measured size keep the whole factor; without
    busy_nbytes the delay is taken at BUSY_CALL_MAX_US; the key moves the answer."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    small, big = 1 << 16, 1 << 27

    def with_busy(nbytes: int | None) -> Scenario:
        return replace(base, calibration=tuple(replace(c, busy_slowdown=2.0, busy_nbytes=nbytes)
                                               if c.collective == "all_reduce" else c for c in base.calibration))

    def stream(s: Scenario, nbytes: int) -> tuple[float, float, float]:
        fabric = Fabric(s)
        g = fabric.group(None, [0, 1])
        first = fabric.answer(g, "all_reduce", nbytes, [0.0, 0.0])
        at = first.start_us + first.cost_us / 2  # computed beside the first call for half of it
        second = fabric.answer(g, "all_reduce", nbytes, [at, at])
        return first.cost_us, second.cost_us, fabric.price(g, "all_reduce", small)[1]

    c1, plain2, measured_us = stream(base, big)
    assert c1 > 40 * measured_us  # the premise: the stream's calls are far longer than the measured one
    _, busy2, _ = stream(with_busy(small), big)
    rate = 1 + measured_us / c1  # s - 1 = 1: the measured call's price per call
    assert busy2 - plain2 == pytest.approx(c1 / 2 * (1 - 1 / rate))
    assert busy2 - plain2 < 0.05 * (c1 / 2 * 0.5)  # the old rule's stretch (1 - 1/s of the overlap) is 20x more
    _, unknown2, _ = stream(with_busy(None), big)
    assert unknown2 - plain2 == pytest.approx(c1 / 2 * (1 - 1 / (1 + answer_mod.BUSY_CALL_MAX_US / c1)))
    assert unknown2 > busy2
    s1, p2, _ = stream(base, small)
    _, b2, _ = stream(with_busy(small), small)
    assert b2 - p2 == pytest.approx(s1 / 2 * 0.5)  # calls of the measured size: the whole factor


def test_busy_call_max_is_the_calibration_workers_longest_busy_call() -> None:
    from emulator_core.calibration import _worker as _calibrate_worker

    assert answer_mod.BUSY_CALL_MAX_US == _calibrate_worker.BUSY_CALL_MAX_US


def test_a_recorded_busy_delay_keeps_its_time_under_a_slower_link_and_grows_with_the_steps() -> None:
    """busy_delay_us (issue 59): the time a call lost beside compute where it was measured. A what-if of a link at a
    quarter of its rate lengthens every call's transfer but not that delay, which the old rule ((s - 1) x the
    call's price, a file without the key) did; on 8 ranks a ring all-reduce has 14 steps against 2, and a call
    loses 7 times the delay."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    dim = base.topology.dims[0]
    n = 1 << 26

    def scenario(delay: float | None, world: int = 2, bw_div: float = 1.0) -> Scenario:
        cals = tuple(replace(c, busy_slowdown=1.5, busy_nbytes=1 << 22, busy_delay_us=delay)
                     if c.collective == "all_reduce" else c for c in base.calibration)
        topo = type(base.topology)((replace(dim, size=world, bandwidth_gbps=dim.bandwidth_gbps / bw_div),))
        return replace(base, world_size=world, topology=topo, calibration=cals)

    def delay_of(s: Scenario) -> float:
        fabric = Fabric(s)
        return fabric._slowdown_of(fabric.group(None, [0, 1]), "all_reduce")[1]

    def stretch(s: Scenario) -> float:
        """How much later the second of two large calls ends for its members' compute beside the first."""
        ends = []
        for sc in (replace(s, calibration=base.calibration), s):
            fabric = Fabric(sc)
            g = fabric.group(None, [0, 1])
            first = fabric.answer(g, "all_reduce", n, [0.0, 0.0])
            at = first.start_us + first.cost_us / 2
            ends.append(fabric.answer(g, "all_reduce", n, [at, at]).end_us)
        return ends[1] - ends[0]

    assert delay_of(scenario(800.0)) == delay_of(scenario(800.0, bw_div=4.0)) == 800.0
    assert stretch(scenario(800.0, bw_div=4.0)) <= stretch(scenario(800.0)) * 1.01  # not lengthened by the link
    assert delay_of(scenario(None, bw_div=4.0)) > 3 * delay_of(scenario(None))  # the old rule's direction
    assert stretch(scenario(None, bw_div=4.0)) > 3 * stretch(scenario(None))
    assert delay_of(scenario(800.0, world=8)) == pytest.approx(800.0 * 14 / 2)


def test_a_stragglers_group_loses_its_slowdown_times_the_delay_beside_compute() -> None:
    """A member whose compute is k times slower runs its library's threads on a CPU k times slower (a CPU node's
    straggler): its group's delay beside compute is k times the delay, its cap 1 + (s - 1) k; a group without it
    keeps the calibration's."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    cals = tuple(replace(c, busy_slowdown=1.5, busy_nbytes=1 << 20, busy_delay_us=400.0)
                 if c.collective == "all_reduce" else c for c in base.calibration)
    dim = base.topology.dims[0]
    four = replace(base, world_size=4, topology=type(base.topology)((replace(dim, size=4),)), calibration=cals)
    slow = replace(four, stragglers=(Straggler(3, 2.0),))
    fabric = Fabric(slow)
    assert fabric._slowdown_of(fabric.group(None, [0, 1]), "all_reduce") == pytest.approx((2.0, 400.0 * 3 / 1 * 2))
    assert fabric._slowdown_of(fabric.group([0, 1], [0, 1]), "all_reduce") == pytest.approx((1.5, 400.0))
    plain = Fabric(four)
    assert plain._slowdown_of(plain.group(None, [0, 1]), "all_reduce") == pytest.approx((1.5, 400.0 * 3))


def test_an_emulated_straggler_computes_on_while_its_group_runs_a_call() -> None:
    """A straggler's calls issued while its group's previous call still runs (DDP's buckets during the backward
    pass) arrive at its previous arrival plus its mirror's compute since the previous issue, stretched by its
    slowdown: the straggler computes the whole backward pass slower, not only the part before its first bucket."""
    base = load_scenario(SCENARIOS / "loopback_cpu.toml")
    fabric = Fabric(replace(base, stragglers=(Straggler(1, 2.0),)))
    g = fabric.group(None, [0])  # rank 1 emulated, mirroring rank 0, and a straggler
    first = fabric.answer(g, "all_reduce", 1 << 16, [1000.0])  # the stream's first call: not stretched
    assert first.start_us == 1000.0
    free_before = 1000.0 + first.cost_us
    second = fabric.answer(g, "all_reduce", 1 << 10, [1100.0])  # queued: 100 us of compute since, stretched
    third = fabric.answer(g, "all_reduce", 1 << 10, [1150.0])  # 50 more
    assert free_before > 1100.0  # the premise: the first call still ran at both issues
    assert second.start_us == pytest.approx(max(free_before, 1000.0 + 100.0 * 2))
    assert third.start_us == pytest.approx(max(second.end_us, 1000.0 + 100.0 * 2 + 50.0 * 2))
    nxt = fabric.answer(g, "all_reduce", 1 << 10, [third.end_us + 400.0])  # after the group went idle: from free
    assert nxt.start_us == pytest.approx(third.end_us + 400.0 * 2)
