"""`nbox replay --clock virtual`: recorded compute, collectives from the emulator core, no torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.pricing.pricer import group_shape, price_group
from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario
from emulator_core.scenario.world import resize
from nbox_replay.inputs.graph import RankGraph, load_rank
from nbox_replay.inputs.source import ReplayInputError, open_source
from nbox_replay.replay import ReplayConfig, ReplayConfigError, run_replay
from nbox_replay.virtual.engine import ReplayDeadlock, simulate
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et
from nbox_trace.errors import InputNotFoundError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SAMPLES = ROOT / "tests" / "data" / "samples" / "chakra_et"


def virtual(bundle: Path | str, **kw: object) -> dict[str, object]:
    return run_replay(ReplayConfig(str(bundle), clock="virtual", **kw)).to_dict()  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["ddp_mlp", "ddp_transformer", "fsdp2_transformer"])
def test_shipped_bundles_replay_bit_identically(name: str) -> None:
    a = virtual(TRACES / name, world_size=64, iterations=2)
    b = virtual(TRACES / name, world_size=64, iterations=2)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    base, what = a["baseline"], a["what_if"]
    assert base["world_size"] == 2 and what["world_size"] == 64  # type: ignore[index]
    assert all(v > 0 for v in base["iteration_us"]["values"])  # type: ignore[index]
    assert a["observed_iteration_us"]["median"] > 0  # type: ignore[index]


def test_a_slower_network_and_a_bigger_world_cost_more_a_faster_one_less() -> None:
    def t(**kw: object) -> float:
        return virtual(TRACES / "ddp_mlp", **kw)["what_if"]["iteration_us"]["median"]  # type: ignore[index]
    base = t()
    assert t(world_size=8) > base
    assert t(world_size=64) > t(world_size=8)
    assert t(overrides=("topology.dims.0.bandwidth_gbps=1",)) > base
    fast = ("topology.dims.0.bandwidth_gbps=1000", "topology.dims.0.latency_us=1")
    assert t(world_size=64, overrides=fast) < t(world_size=64)
    assert t(overrides=fast) <= base  # never slower; equal when the calibrated comm is hidden behind compute
    assert t(overrides=("compute_scale=2",)) < base


def test_fsdp_shards_shrink_with_the_world_and_ddp_buckets_keep_their_size() -> None:
    fsdp = virtual(TRACES / "fsdp2_transformer", world_size=8)["what_if"]["retarget_rules"]  # type: ignore[index]
    assert any(k.startswith("all_gather: FSDP all-gather: the per-rank shard shrinks") for k in fsdp)
    graphs = {r: load_rank(TRACES / "fsdp2_transformer" / "trace" / f"trace.{r}.et", r) for r in (0, 1)}
    recorded = sorted({c.nbytes for g in graphs.values() for c in g.comm.values() if c.collective == "all_gather"})
    sim = simulate(graphs, resize(load_scenario(None), 8), groups={"0": [0, 1]}, recorded_world=2)
    gathered = sorted({c.nbytes for c in sim.collectives if c.collective == "all_gather"})
    assert gathered == [n * 2 / 8 for n in recorded]
    ddp = virtual(TRACES / "ddp_mlp", world_size=8)["what_if"]["retarget_rules"]  # type: ignore[index]
    assert list(ddp) == ["all_reduce: data-parallel all-reduce: the gradient bucket keeps its size"]


def test_an_astra_sim_microbenchmark_replays_as_exactly_the_modeled_collective() -> None:
    rep = virtual(SAMPLES / "astra-sim_microbenchmarks" / "all_reduce" / "8npus_1MB")
    s = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 8)
    _, cost = price_group(s, "all_reduce", 1048576, group_shape(s))
    assert rep["baseline"]["iteration_us"]["median"] == pytest.approx(cost)  # type: ignore[index]
    assert rep["compute"] == "recorded" and rep["clock"] == "virtual" and rep["notices"] == []


def test_a_bare_trace_with_process_groups_replays_each_group_on_its_members() -> None:
    rep = virtual(SAMPLES / "multi_pg_T3D" / "trace")
    groups = json.loads((SAMPLES / "multi_pg_T3D" / "inputs" / "comm_group.json").read_text())
    s = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 8)
    tops = rep["what_if"]["top_collectives"]  # type: ignore[index]
    assert tops and {c["process_group"] for c in tops} <= set(groups)
    for c in tops:  # each collective is priced on its own pair of ranks, not on the world
        _, cost = price_group(s, "all_reduce", c["bytes"], group_shape(s, groups[c["process_group"]]))
        assert c["modeled_us"] == pytest.approx(cost * c["count"])


def _node(node_id: int, ntype: int, name: str, deps: list[int], dur: int = 10, **attrs: object) -> pb.Node:
    n = pb.Node(id=node_id, name=name, type=ntype, duration_micros=dur)  # type: ignore[arg-type]
    n.data_deps.extend(deps)
    for k, v in attrs.items():
        set_attr(n, k, v)  # type: ignore[arg-type]
    return n


def _write_two_ranks(tmp: Path, sizes: tuple[int, int]) -> Path:
    out = tmp / "bare"
    out.mkdir()
    for rank, size in enumerate(sizes):
        nodes = [_node(1, pb.COMP_NODE, "aten::mm", [], 100, tid=1),
                 _node(2, pb.COMM_COLL_NODE, "all_reduce", [1], 50, comm_type=0, comm_size=size, pg_name="0", tid=1),
                 _node(3, pb.COMP_NODE, "aten::add_", [2], 20, tid=1)]
        write_et(out / f"t.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes)
    return out


def test_ranks_that_disagree_on_a_collective_are_refused_before_replay(tmp_path: Path) -> None:
    bare = _write_two_ranks(tmp_path, (4096, 8192))
    with pytest.raises(ReplayInputError, match=r"process group '0'.*collective #0 differs.*rank 1"):
        open_source(bare / "t")
    sub = tmp_path / "ok"
    sub.mkdir()
    rep = virtual(_write_two_ranks(sub, (4096, 4096)) / "t", iterations=2)
    assert rep["baseline"]["breakdown_us"]["compute"] == pytest.approx(120)  # type: ignore[index]  # interval ends: floats


def test_a_wait_that_can_never_end_is_a_deadlock_naming_rank_and_collective() -> None:
    g0, g1 = RankGraph(0, "r0"), RankGraph(1, "r1")
    from nbox_replay.inputs.graph import COLLECTIVE, CommInfo

    for g, pg in ((g0, "0"), (g1, "1")):  # each waits on a collective of a group the other never joins
        g.ids, g.names, g.kind = [1, 2], ["all_reduce", "after"], [COLLECTIVE, 0]
        g.duration_us, g.issue_us, g.resource, g.resources = [0.0, 5.0], [0.0, 0.0], [0, 0], ["thread:1"]
        g.deps, g.iteration = [(), (0,)], [0, 0]
        g.comm = {0: CommInfo("all_reduce", 1024, pg)}
    with pytest.raises(ReplayDeadlock, match=r"rank 0: stopped at node 2 .*all_reduce #0 on process group '0', "
                                             r"never issued by rank\(s\) \[1\]"):
        simulate({0: g0, 1: g1}, resize(load_scenario(None), 2), groups={"0": [0, 1], "1": [0, 1]},
                 recorded_world=2)


def test_a_last_collective_nobody_waits_for_that_never_ends_is_a_deadlock_naming_it() -> None:
    """The repetition ends when its last collective completes; one the peer never issues, with no node
    after it, used to crash the deadlock message (IndexError on the node past the end); it names it now."""
    from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, CommInfo

    graphs = {}
    for rank in (0, 1):  # rank 0 issues an asynchronous all-reduce as its last node, rank 1 never does
        g = graphs[rank] = RankGraph(rank, f"r{rank}")
        g.ids, g.names, g.kind = [1, 2], ["aten::mm", "all_reduce" if rank == 0 else "aten::mm"], [COMPUTE, COMPUTE]
        g.duration_us, g.issue_us, g.resource, g.resources = [10.0, 5.0], [0.0, 1.0], [0, 0], ["thread:1"]
        g.deps, g.iteration = [(), (0,)], [0, 0]
        if rank == 0:
            g.kind[1] = COLLECTIVE
            g.comm = {1: CommInfo("all_reduce", 1024, "0")}
    with pytest.raises(ReplayDeadlock, match=r"rank 0: stopped at node 2 waiting for node 2 \(all_reduce\), "
                                             r"all_reduce #0 on process group '0', never issued by rank\(s\) \[1\]"):
        simulate(graphs, resize(load_scenario(None), 2), groups={"0": [0, 1]}, recorded_world=2)


def test_a_missing_rank_file_and_bad_options_are_clear_errors(tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(TRACES / "ddp_mlp", copy)
    (copy / "trace" / "trace.1.et").unlink()
    with pytest.raises(InputNotFoundError, match=r"manifest records rank\(s\) \[1\] but .*trace\.1\.et is missing"):
        open_source(copy)
    # issue 13 made `--compute live --clock virtual` a mode (measure the operators here, then simulate): no
    # longer refused; tests/test_live_truth.py covers it
    with pytest.raises(ReplayConfigError, match="--clock 'fast'"):
        ReplayConfig(str(TRACES / "ddp_mlp"), clock="fast")
    with pytest.raises(Exception, match="--ranks: rank 5 is not in"):
        run_replay(ReplayConfig(str(TRACES / "ddp_mlp"), clock="virtual", ranks=(0, 5)))


def test_one_replayed_rank_of_two_mirrors_the_other() -> None:
    rep = virtual(TRACES / "ddp_mlp", ranks=(0,), world_size=8)
    assert rep["ranks_replayed"] == [0] and rep["what_if"]["iteration_us"]["median"] > 0  # type: ignore[index]


def test_virtual_replay_needs_no_torch_and_the_cli_prints_one_json_document() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from nbox.cli import main\n"
            "sys.argv = ['nbox', 'replay', sys.argv[1], '--clock', 'virtual', '--world-size', '16', '--json']\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code, str(TRACES / "ddp_transformer")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "nbox.replay/1" and doc["what_if"]["world_size"] == 16
    bad = subprocess.run([sys.executable, "-m", "nbox", "replay", str(ROOT / "no-such-bundle"), "--clock", "virtual"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 4 and "no-such-bundle" in bad.stderr and "Traceback" not in bad.stderr


def test_a_run_of_zero_time_is_as_fast_as_its_zero_time_baseline(tmp_path: Path) -> None:
    """Two zero iteration times have no ratio: issue 13 ("Traces without durations replay as 0.00 ms with "infx
    (faster)"" and `--json` emits `Infinity`): the speed-up is None (n/a, JSON null), and the replay warns that
    the trace holds no durations. (Before issue 13 this test pinned 1.0x, "the same".)"""
    out = tmp_path / "zero"
    out.mkdir()
    write_et(out / "t.0.et", pb.GlobalMetadata(version="0.0.4"),
             [_node(1, pb.COMP_NODE, "aten::view", [], 0, tid=1), _node(2, pb.COMP_NODE, "aten::view", [1], 0, tid=1)])
    rep = run_replay(ReplayConfig(str(out / "t"), clock="virtual", world_size=4))
    assert rep.baseline.median_us == rep.what_if.median_us == 0.0
    assert rep.speedup is None and "no ratio to the baseline's" in rep.format_text().splitlines()[0]
    assert rep.answer()["ratio"] is None and rep.answer()["direction"] is None
    assert any(n.startswith("WARNING: the trace holds no durations") for n in rep.notices)


def test_a_scenario_path_given_as_a_string_is_a_path() -> None:
    """A library caller's str for a Path field (the CLI passes Paths): coerced, so a missing file is the usual
    clear error naming it, not an AttributeError."""
    cfg = ReplayConfig(str(TRACES / "ddp_mlp"), clock="virtual",
                       baseline=str(SCENARIOS_DIR / "loopback_cpu.toml"),  # type: ignore[arg-type]
                       what_if="missing.toml", out="o")  # type: ignore[arg-type]
    assert cfg.baseline == SCENARIOS_DIR / "loopback_cpu.toml" and cfg.what_if == Path("missing.toml")
    assert cfg.out == Path("o")
    with pytest.raises(InputNotFoundError, match=r"missing\.toml"):
        run_replay(cfg)


def test_a_gap_starts_after_the_other_host_threads_work_it_waited_for_not_a_kernel() -> None:
    """A CUDA rank's backward runs on the autograd engine's thread while the caller waits (H100, 2026-11-27): the
    caller's gap before its next operator (the lean pass's figure, nbox_record/sources/leantiming.py) comes after that
    work. A dependency on a GPU kernel does not hold a gap back: the host runs ahead of its kernels."""
    from nbox_replay.inputs.graph import COMPUTE

    g = RankGraph(0, "r0")
    # A (caller) -> B (engine thread) -> C (caller, gap 5); A -> K (kernel, 100) -> F (caller, gap 4)
    g.ids, g.names = [1, 2, 3, 4, 5], ["A", "B", "C", "K", "F"]
    g.kind = [COMPUTE] * 5
    g.duration_us, g.issue_us = [10.0, 50.0, 1.0, 100.0, 1.0], [0.0] * 5
    g.resources = ["thread:1", "thread:2", "stream:7"]
    g.resource = [0, 1, 0, 2, 0]
    g.deps, g.iteration = [(), (0,), (1,), (0,), (2, 3)], [0] * 5
    g.gap_us = [0.0, 0.0, 5.0, 0.0, 4.0]
    g.gap_joined = [False, False, True, False, True]  # the recorder joined the two threads' timelines
    res = simulate({0: g}, load_scenario(None), groups={}, recorded_world=1).ranks[0]
    assert res.start_us[2] == pytest.approx(65.0)  # B ends at 60, then the gap: not 10 + 5 while B ran
    assert res.start_us[4] == pytest.approx(110.0)  # the gap ran 66-70 while K ran; F waits for K's end
    assert res.iteration_us == [pytest.approx(111.0)]
    # a gap measured on its own thread's timeline (a CPU rank's, not joined) already holds its wait for the
    # other thread: it runs as soon as the thread is free, 10-15, and C starts when B ends
    g.gap_joined = [False] * 5
    res = simulate({0: g}, load_scenario(None), groups={}, recorded_world=1).ranks[0]
    assert res.start_us[2] == pytest.approx(60.0) and res.start_us[4] == pytest.approx(110.0)


def _write_recorded_durations(tmp: Path, comm_us: tuple[int, int]) -> Path:
    """Two ranks, one all-reduce each, recorded as taking ``comm_us`` on ranks 0 and 1 (the later arrival's is the
    shorter: the other waited for it)."""
    out = tmp / "durations"
    out.mkdir()
    for rank, dur in enumerate(comm_us):
        nodes = [_node(1, pb.COMP_NODE, "aten::mm", [], 100, tid=1),
                 _node(2, pb.COMM_COLL_NODE, "all_reduce", [1], dur, comm_type=0, comm_size=1 << 20, pg_name="0",
                       tid=1),
                 _node(3, pb.COMP_NODE, "aten::add_", [2], 20, tid=1)]
        write_et(out / f"t.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes)
    return out


def test_top_collectives_show_the_recordings_own_time_of_each_call_from_its_last_arrival(tmp_path: Path) -> None:
    bare = _write_recorded_durations(tmp_path, (5000, 3000))
    report = run_replay(ReplayConfig(str(bare), clock="virtual", iterations=3))
    for run in (report.baseline, report.what_if):
        (top,) = run.top_collectives
        assert top["count"] == 1 and top["recorded_us"] == 3000  # rank 0's 5000 us waited 2000 for rank 1
        assert top["modeled_us"] != top["recorded_us"]  # the modeled time is the scenario's, not the recording's
    text = report.format_text()
    assert "recorded: the same calls' time in the recording" in text
    assert any(line.split()[:1] == ["all_reduce"] and "3000" in line.split() for line in text.splitlines())
    # one of the two members replayed: its 5000 us include waiting for the other, so no recorded time is shown
    alone = run_replay(ReplayConfig(str(bare), clock="virtual", ranks=(0,)))
    assert alone.baseline.top_collectives[0]["recorded_us"] is None
    assert any(line.split()[:1] == ["all_reduce"] and "-" in line.split() for line in alone.format_text().splitlines())


def test_the_shipped_fsdp_bundle_shows_recorded_times_for_every_top_collective() -> None:
    tops = virtual(TRACES / "fsdp2_transformer")["baseline"]["top_collectives"]  # type: ignore[index]
    assert tops and all(c["recorded_us"] is not None and c["recorded_us"] > 0 for c in tops)


def test_a_recorded_call_queued_behind_its_groups_previous_one_counts_from_that_ones_end(tmp_path: Path) -> None:
    """Two asynchronous all-reduces issued 1 ms apart: the second's recorded 6000 us include 4000 us of waiting
    for the first on the group's stream, so its own time is the 2000 us after the first ended."""
    out = tmp_path / "queued"
    out.mkdir()
    for rank in (0, 1):
        nodes = [_node(1, pb.COMP_NODE, "aten::mm", [], 100, tid=1),
                 _node(2, pb.COMM_COLL_NODE, "all_reduce", [1], 5000, comm_type=0, comm_size=1 << 20, pg_name="0",
                       tid=1),
                 _node(3, pb.COMM_COLL_NODE, "all_reduce", [1], 6000, comm_type=0, comm_size=1 << 19, pg_name="0",
                       tid=1),
                 _node(4, pb.COMP_NODE, "aten::add_", [2, 3], 20, tid=1)]
        for n, start in zip(nodes, (900, 1000, 2000, 8000), strict=True):
            n.start_time_micros = start + 10 * rank  # each rank's own clock
        write_et(out / f"t.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes)
    run = run_replay(ReplayConfig(str(out), clock="virtual")).baseline
    tops = {c["bytes"]: c["recorded_us"] for c in run.top_collectives}
    assert tops == {1 << 20: 5000, 1 << 19: 2000}


def test_recorded_times_edge_cases() -> None:
    from nbox_replay.inputs.recorded_calls import RecordedStreams, recorded_call_us, recording_complete
    s = RecordedStreams()
    assert s.own_us("0", 0.0, 700.0) == 700.0  # no recorded start: the duration
    assert s.own_us("0", 100.0, 500.0) == 500.0  # the group's first call: from its issue
    assert s.own_us("1", 200.0, 300.0) == 300.0  # another group: its own stream
    assert s.own_us("0", 300.0, 900.0) == 900.0 - 300.0  # queued behind the first (ended at 600)
    assert s.own_us("0", 2000.0, 100.0) == 100.0  # issued after the previous ended
    s.reset()
    assert s.own_us("0", 2050.0, 10.0) == 10.0
    assert recorded_call_us({0: 500.0, 1: 300.0}) == 300.0
    assert recorded_call_us({0: 500.0, 1: 0.0}) is None and recorded_call_us({}) is None
    assert recording_complete([0, 1], {0: 1.0, 1: 2.0}) and not recording_complete([0, 1], {0: 1.0})
    assert not recording_complete([0], {0: 1.0})  # one member: nothing to take the shortest over


def _bucketed(compute_between_us: float, waits: bool) -> tuple[float, float, float]:
    """Two ranks issue an all-reduce of 1 MiB, then (``waits``: wait for it, else compute for
    ``compute_between_us``), then a second one: the first's cost and start, the second's start and arrival."""
    from dataclasses import replace

    from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, CommInfo

    graphs = {}
    for rank in (0, 1):
        g = RankGraph(rank, f"r{rank}")
        g.ids, g.names = [1, 2, 3, 4, 5], ["mm", "all_reduce", "backward", "all_reduce", "step"]
        g.kind = [COMPUTE, COLLECTIVE, COMPUTE, COLLECTIVE, COMPUTE]
        g.duration_us = [100.0, 0.0, 0.0 if waits else compute_between_us, 0.0, 10.0]
        g.issue_us, g.resource, g.resources = [0.0] * 5, [0] * 5, ["thread:1"]
        g.deps, g.iteration = [(), (0,), ((1,) if waits else (0,)), (2,), (1, 3)], [0] * 5
        g.comm = {1: CommInfo("all_reduce", 1 << 20, "0"), 3: CommInfo("all_reduce", 1 << 20, "0")}
        graphs[rank] = g
    base = resize(load_scenario(None), 2)
    slow = replace(base, calibration=tuple(replace(c, busy_slowdown=2.0) if c.collective == "all_reduce" else c
                                           for c in base.calibration))
    first, second = simulate(graphs, slow, groups={"0": [0, 1]}, recorded_world=2).collectives
    return first.end_us - first.start_us, first.start_us, second.start_us


def test_a_bucket_still_running_beside_the_backward_pass_holds_the_next_bucket_behind_it() -> None:
    """The replay tells the fabric each member's compute (Fabric.answer's compute_us): a first bucket slowed by
    the backward pass beside it still runs when the next bucket is issued just after its unslowed end, so the next
    queues behind it; when the ranks wait for the first bucket instead of computing, the next starts at its issue."""
    cost, start, _ = _bucketed(0.0, waits=True)
    arrival = start + 1.1 * cost  # the second bucket's issue: 10% of a call after the first's unslowed end
    _, _, queued = _bucketed(arrival - 100.0, waits=False)
    assert queued > arrival + 1.0
    assert queued == pytest.approx(start + cost + (arrival - start) * 0.5, abs=1.0)  # the rate: its cap of 2
    _, _, after_wait = _bucketed(0.0, waits=True)
    assert after_wait == pytest.approx(start + cost)  # the ranks waited: nothing slowed the first one
