"""Communication waits inside a recorded operator are not compute (nbox_replay.inputs.graph.waits_inside).

FSDP2's hooks issue a collective and wait for it inside an autograd operator; the profiler times the
operator with the wait in it and the converter orders the collective after it. Playing the recorded
duration counted the communication twice (the operator, then the modeled collective).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.world import resize
from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, CommInfo, RankGraph, load_rank, waits_inside
from nbox_replay.inputs.source import open_source
from nbox_replay.replay import ReplayConfig, run_replay
from nbox_replay.virtual.engine import simulate
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _graph(op: tuple[float, float], comm: tuple[float, float], *, same_thread: bool = True, lean: bool = False,
           depends: bool = True, second: tuple[float, float] | None = None) -> RankGraph:
    """An operator (start, duration) on thread 1, a collective (start, duration) issued from it, a node after."""
    g = RankGraph(0, "r0")
    comms = [comm] if second is None else [comm, second]
    n = 2 + len(comms)
    g.ids = list(range(1, n + 1))
    g.names = ["evaluate_function: AddmmBackward0", *(["all_gather"] * len(comms)), "aten::mm"]
    g.kind = [COMPUTE, *([COLLECTIVE] * len(comms)), COMPUTE]
    g.start_us = [op[0], *(c[0] for c in comms), op[0] + op[1]]
    g.duration_us = [op[1], *(c[1] for c in comms), 10.0]
    g.profiled_us = list(g.duration_us)
    g.issue_us = [0.0] * n
    g.lean = [lean] + [False] * (n - 1)
    g.resources = ["thread:1", "thread:2"]
    g.resource = [0, *([0 if same_thread else 1] * len(comms)), 0]
    g.deps = [(), *([(0,) if depends else ()] * len(comms)), tuple(range(1, 1 + len(comms)))]
    g.iteration = [0] * n
    g.comm = {1 + k: CommInfo("all_gather", 1024, "0") for k in range(len(comms))}
    return g


def test_a_collective_waited_for_inside_its_operator_is_taken_out_of_the_operator() -> None:
    g = _graph((1000.0, 1000.0), (1100.0, 700.0))  # issued at +100, done at +800, the operator returns at +1000
    assert waits_inside(g) == [700.0, 0.0, 0.0]


@pytest.mark.parametrize(("case", "kw"), [
    ("returns before the collective completes (DDP's gradient hook)", {"comm": (1900.0, 700.0)}),
    ("issued before the operator started", {"comm": (900.0, 300.0)}),
    ("another thread's collective", {"same_thread": False}),
    ("a lean-timed operator", {"lean": True}),
    ("not the operator it was issued after", {"depends": False}),
    ("no recorded start", {"op": (0.0, 1000.0), "comm": (0.0, 500.0)}),
])
def test_what_is_not_a_wait_inside_the_operator(case: str, kw: dict[str, object]) -> None:
    args: dict[str, object] = {"op": (1000.0, 1000.0), "comm": (1100.0, 700.0), **kw}
    assert waits_inside(_graph(**args))[0] == 0.0, case  # type: ignore[arg-type]


def test_two_overlapping_collectives_in_one_operator_count_their_union() -> None:
    g = _graph((1000.0, 1000.0), (1100.0, 500.0), second=(1400.0, 400.0))  # [1100, 1600] and [1400, 1800]
    assert waits_inside(g)[0] == pytest.approx(700.0)


def _write(path: Path, op: tuple[int, int], comm: tuple[int, int]) -> Path:
    """One rank's ET: an operator, an all-gather issued inside it (asynchronous), a node that waits for it."""
    nodes = []
    for nid, name, typ, start, dur, deps in ((1, "evaluate_function: RegisterPostBackwardFunction", pb.COMP_NODE,
                                              op[0], op[1], []),
                                             (2, "c10d::_reduce_scatter_base_", pb.COMM_COLL_NODE, comm[0], comm[1],
                                              [1]),
                                             (3, "aten::add_", pb.COMP_NODE, op[0] + op[1], 50, [2])):
        n = pb.Node(id=nid, name=name, type=typ, start_time_micros=start, duration_micros=dur, ctrl_deps=deps)
        set_attr(n, "tid", 1)
        if typ == pb.COMM_COLL_NODE:
            set_attr(n, "comm_type", 7)
            set_attr(n, "comm_size", 1 << 20)
            set_attr(n, "pg_name", "0")
            set_attr(n, "nbox_async", True)
        nodes.append(n)
    write_et(path, pb.GlobalMetadata(version="0.0.4"), nodes)
    return path


def test_the_loaded_graph_plays_the_operator_without_the_wait_and_the_collective_once(tmp_path: Path) -> None:
    """Loaded from an ET: the operator keeps 1000 - 800 us; the iteration is the operator, the modeled
    collective and the last node, not the operator's recorded 1000 us plus the collective again."""
    graphs = {r: load_rank(_write(tmp_path / f"t.{r}.et", (10_000, 1000), (10_100, 800)), r) for r in (0, 1)}
    g = graphs[0]
    assert g.waits_us[0] == 800.0 and g.duration_us[0] == 200.0 and g.profiled_us[0] == 200.0
    assert g.waited_us() == 800.0 and g.compute_us() == 250.0
    scenario = resize(load_scenario(None), 2)
    sim = simulate(graphs, scenario, groups={"0": [0, 1]}, recorded_world=2)
    modeled = sim.collectives[0].end_us - sim.collectives[0].start_us
    assert sim.ranks[0].iteration_us[0] == pytest.approx(200.0 + modeled + 50.0)


def test_the_shipped_fsdp2_recording_waits_inside_its_hooks_and_ddp_does_not() -> None:
    """The recorder's FSDP2 example: unshard and reduce-scatter waits inside autograd operators; DDP's bucket
    all-reduce is issued from a gradient hook whose operator returns at once (nothing taken out)."""
    for name, expect in (("fsdp2_transformer", True), ("ddp_mlp", False), ("ddp_transformer", False)):
        src = open_source(TRACES / name)
        for r in src.ranks:
            g = load_rank(src.trace_set.files[r], r)
            assert (g.waited_us() > 1000.0) is expect, (name, r, g.waited_us())
            assert all(d >= 0 for d in g.duration_us)
    rep = run_replay(ReplayConfig(str(TRACES / "fsdp2_transformer"), clock="virtual",
                                  profiler_correction="off")).to_dict()
    breakdown = rep["baseline"]["breakdown_us"]  # type: ignore[index]
    assert breakdown["compute"] > 0 and breakdown["exposed_comm"] > 0
    assert any("taken out of their recorded compute" in n and "(rank 1)" in n for n in rep["notices"])  # type: ignore[attr-defined]
    ddp = run_replay(ReplayConfig(str(TRACES / "ddp_mlp"), clock="virtual")).to_dict()
    assert not any("taken out of their recorded compute" in n for n in ddp["notices"])  # type: ignore[attr-defined]
