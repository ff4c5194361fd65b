"""Issue 13, "the breakdown does not add up": one definition (nbox_replay.virtual.breakdown) whose parts partition every
rank's iteration, per-collective figures of the same rank, ``--rank``, and the settings that act in virtual time
(``overlap = "serialize"``, uneven all-to-all), and captured iterations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.world import resize
from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, CommInfo, RankGraph
from nbox_replay.replay import ReplayConfig, run_replay
from nbox_replay.report.summary import RankChoiceError, summarize_sim
from nbox_replay.virtual.breakdown import CommSpan, RankIntervals, job_windows, median_index, partition
from nbox_replay.virtual.engine import SimResult, simulate
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import set_attr
from nbox_trace.chakra.codec import write_et

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-6)


def _assert_partitions(sim: SimResult) -> None:
    """Every rank's four parts add up to every iteration's time (0.1%); overlapped <= compute."""
    for s, e in sim.windows():
        for r, rr in sim.ranks.items():
            b = partition(rr.intervals, s, e, rank=r)
            assert min(b.compute_us, b.exposed_comm_us, b.waiting_us, b.idle_us, b.overlapped_comm_us) >= 0
            assert _close(b.parts_us(), e - s), (r, b)
            assert b.overlapped_comm_us <= b.compute_us + 1e-9
            assert _close(sum(b.comm_exposed_us), b.exposed_comm_us) and _close(sum(b.comm_waiting_us), b.waiting_us)


# ------------------------------------------------------------------------------------------- the definition


def test_streams_at_once_and_a_kernel_inside_its_launcher_count_once() -> None:
    """Bug: "compute is summed over every thread and stream of a rank, GPU kernels and the host ops that
    launch them both count" (fsdp2: compute 79.29 + exposed 91.35 > iteration 97.58)."""
    iv = RankIntervals(compute=[(0, 10), (2, 8), (5, 15)])  # a host op, its kernel, a second stream
    b = partition(iv, 0, 20)
    assert b.compute_us == 15 and b.idle_us == 5 and b.parts_us() == 20


def test_waiting_for_a_late_peer_is_not_exposed_communication_and_idle_is_not_clamped() -> None:
    """Bug: "exposed comm includes waiting for a late peer or for the group's previous collective; idle is
    clamped at 0"."""
    iv = RankIntervals(compute=[(0, 10), (40, 50)], comms=[CommSpan(10, 25, 35)])  # issued at 10, peer late to 25
    b = partition(iv, 0, 60)
    assert (b.compute_us, b.waiting_us, b.exposed_comm_us, b.idle_us) == (20, 15, 10, 15)
    assert b.comm_waiting_us == (15,) and b.comm_exposed_us == (10,)
    hidden = partition(RankIntervals(compute=[(0, 30)], comms=[CommSpan(5, 5, 20)]), 0, 30)
    assert hidden.exposed_comm_us == 0 and hidden.overlapped_comm_us == 15 and hidden.parts_us() == 30


def test_an_instant_of_two_spans_goes_to_the_earlier_collective_and_windows_clip() -> None:
    iv = RankIntervals(comms=[CommSpan(0, 0, 10), CommSpan(0, 5, 20)])
    b = partition(iv, 0, 20)
    assert b.comm_exposed_us == (10, 10) and b.comm_waiting_us == (0, 0) and b.exposed_comm_us == 20
    assert partition(iv, 5, 15).comm_exposed_us == (5, 5)
    assert job_windows({0: [10, 30], 1: [12, 25]}) == [(0, 12), (12, 30)]
    assert median_index([3.0, 1.0, 2.0, 4.0]) == 2  # even count: the lower middle one, a real iteration


# -------------------------------------------------------------------------------------- the replay report


def _virtual(bundle: Path | str, **kw: object) -> dict[str, object]:
    return run_replay(ReplayConfig(str(bundle), clock="virtual", **kw)).to_dict()  # type: ignore[arg-type]


def test_fsdp2_virtual_breakdown_adds_up_and_names_its_rank() -> None:
    """Bug: "`traces/fsdp2_transformer --clock virtual`: iteration 97.58 ms, compute 79.29 + exposed 91.35"; the
    per-collective "exposed" was a mean over ranks while the row was the slowest rank's, and nothing said which
    rank a row describes."""
    rep = _virtual(TRACES / "fsdp2_transformer")
    for run in (rep["baseline"], rep["what_if"]):
        b = run["breakdown_us"]  # type: ignore[index]
        it = run["iteration_us"]["median"]  # type: ignore[index]
        assert _close(b["compute"] + b["exposed_comm"] + b["waiting_for_peers"] + b["idle"], it)
        assert b["idle"] >= 0 and b["rank"] in (0, 1) and b["rank_chosen_by"] == "slowest"
        tops = run["top_collectives"]  # type: ignore[index]
        assert tops and all(c["rank"] == b["rank"] for c in tops)
        assert sum(c["exposed_us"] for c in tops) <= b["exposed_comm"] + 1e-6
        assert sum(c["waiting_us"] for c in tops) <= b["waiting_for_peers"] + 1e-6
        for x in run["breakdown_per_iteration_us"]:  # type: ignore[index]
            assert _close(x["compute"] + x["exposed_comm"] + x["waiting_for_peers"] + x["idle"], x["iteration"])


def test_per_collective_figures_add_up_to_the_rank_breakdown() -> None:
    """Per-collective figures use the rank's definition: over every collective of the shown iteration they sum
    to the rank's exposed and waiting time (the old figure was a mean over ranks)."""
    graphs, groups = _ddp_graphs()
    sim = simulate(graphs, resize(load_scenario(None), 2), groups=groups, recorded_world=2, repetitions=3)
    run = summarize_sim(sim, label="x", scenario="s", top=1000)
    b = run.breakdown
    assert b is not None
    assert _close(sum(c["exposed_us"] for c in run.top_collectives), b.exposed_comm_us)
    assert _close(sum(c["waiting_us"] for c in run.top_collectives), b.waiting_us)


def test_rank_picks_the_rank_whose_breakdown_is_shown() -> None:
    """`--rank R` picks the row's rank; its parts still add up to the iteration; a rank not replayed is refused."""
    for r in (0, 1):
        b = _virtual(TRACES / "ddp_transformer", rank=r)["what_if"]["breakdown_us"]  # type: ignore[index]
        assert b["rank"] == r and b["rank_chosen_by"] == "--rank"
    with pytest.raises(RankChoiceError, match="--rank 7: not a replayed rank"):
        _virtual(TRACES / "ddp_transformer", rank=7)


# --------------------------------------------------------------------------------------- settings that act


def _graph(rank: int, nodes: list[tuple[int, float, int, tuple[int, ...], CommInfo | None]]) -> RankGraph:
    """nodes: (kind, duration_us, resource, deps, comm)."""
    g = RankGraph(rank, f"r{rank}")
    for i, (kind, dur, res, deps, comm) in enumerate(nodes):
        g.ids.append(i + 1)
        g.names.append("all_reduce" if comm else "aten::mm")
        g.kind.append(kind)
        g.duration_us.append(dur)
        g.issue_us.append(0.0)
        g.resource.append(res)
        g.deps.append(deps)
        g.iteration.append(0)
        if comm is not None:
            g.comm[i] = comm
    g.resources = [f"thread:{k}" for k in range(1 + max(g.resource, default=0))]
    return g


def _ddp_graphs() -> tuple[dict[int, RankGraph], dict[str, list[int]]]:
    """Backward: three compute nodes, each followed by an asynchronous all-reduce of its gradient; the optimizer
    waits for all of them. Overlap hides the first two all-reduces behind the next compute."""
    ar = CommInfo("all_reduce", 64 << 20, "0")
    nodes = [(COMPUTE, 3000.0, 0, (), None), (COLLECTIVE, 0.0, 0, (0,), ar),
             (COMPUTE, 3000.0, 0, (0,), None), (COLLECTIVE, 0.0, 0, (2,), ar),
             (COMPUTE, 3000.0, 0, (2,), None), (COLLECTIVE, 0.0, 0, (4,), ar),
             (COMPUTE, 500.0, 0, (1, 3, 5), None)]
    return {r: _graph(r, nodes) for r in (0, 1)}, {"0": [0, 1]}


def test_overlap_serialize_acts_in_virtual_time() -> None:
    """Bug: `overlap = "serialize"`: "nothing in nbox_replay reads it". Serialized, communication no longer
    hides behind compute: the iteration is longer and nothing is overlapped."""
    graphs, groups = _ddp_graphs()
    out = {}
    for policy in ("overlap", "serialize"):
        s = resize(load_scenario(None, (f"overlap={policy}",)), 2)
        sim = simulate(graphs, s, groups=groups, recorded_world=2)
        _assert_partitions(sim)
        out[policy] = summarize_sim(sim, label=policy, scenario=policy)
    assert out["overlap"].overlapped_comm_us > 0
    assert out["serialize"].overlapped_comm_us == 0
    assert out["serialize"].median_us > out["overlap"].median_us
    assert out["serialize"].exposed_comm_us > out["overlap"].exposed_comm_us
    a = _virtual(TRACES / "ddp_mlp")["what_if"]  # type: ignore[index]
    b = _virtual(TRACES / "ddp_mlp", overrides=("overlap=serialize",))["what_if"]  # type: ignore[index]
    assert b["iteration_us"]["median"] > a["iteration_us"]["median"]  # type: ignore[index]
    assert a["breakdown_us"]["overlapped_comm"] > 0 and b["breakdown_us"]["overlapped_comm"] == 0  # type: ignore[index]


def _a2a_graphs(splits: dict[int, tuple[int, ...]]) -> dict[int, RankGraph]:
    """Four ranks, one all-to-all each of 4 MiB (float32), with per-peer splits in elements."""
    graphs = {}
    for r in range(4):
        ins = splits[r]
        outs = tuple(splits[src][r] for src in range(4))
        comm = CommInfo("all_to_all_v" if len(set(ins + outs)) > 1 else "all_to_all", 4 * sum(ins), "0",
                        in_splits=ins, out_splits=outs)
        graphs[r] = _graph(r, [(COLLECTIVE, 0.0, 0, (), comm), (COMPUTE, 10.0, 0, (0,), None)])
    return graphs


def test_uneven_all_to_all_is_priced_from_its_recorded_splits() -> None:
    """Bug: "uneven all-to-all splits are parsed but virtual time prices them as uniform". The same buffers,
    with ranks 1-3 sending all of theirs to rank 0 (a hot expert: rank 0 receives three buffers), now take
    longer than evenly split ones; uniform pricing gave both the same time."""
    n = 1 << 18  # elements per rank
    even = {r: (n // 4,) * 4 for r in range(4)}
    skew = {0: (n // 4,) * 4, **{r: (n, 0, 0, 0) for r in (1, 2, 3)}}
    s = resize(load_scenario(None), 4)
    t = {}
    for name, splits in (("even", even), ("skew", skew)):
        sim = simulate(_a2a_graphs(splits), s, groups={"0": [0, 1, 2, 3]}, recorded_world=4)
        _assert_partitions(sim)
        t[name] = sim.iteration_us()[0]
        rules = {c.rule for c in sim.collectives}
        if name == "skew":
            assert rules == {"priced from its recorded per-peer splits (the busiest member)"}
    assert t["skew"] > t["even"] * 2


# ------------------------------------------------------------------------------------------------ iterations


def _node(node_id: int, ntype: int, name: str, deps: list[int], dur: int, **attrs: object) -> pb.Node:
    node = pb.Node(id=node_id, name=name, type=ntype, duration_micros=dur)  # type: ignore[arg-type]
    node.data_deps.extend(deps)
    for k, v in attrs.items():
        set_attr(node, k, v)  # type: ignore[arg-type]
    return node


def _marked_capture(tmp: Path, captured: int, marked: bool = True) -> Path:
    """A 2-rank bare ET of ``captured`` iterations (compute 1000 us, an all-reduce, compute 200 us each),
    marked with nbox_iteration as the recorder marks them."""
    out = tmp / f"cap{captured}{'m' if marked else ''}"
    out.mkdir()
    for rank in (0, 1):
        nodes, nid, prev = [], 1, []
        for it in range(1, captured + 1):
            mark = {"nbox_iteration": it} if marked else {}
            nodes.append(_node(nid, pb.COMP_NODE, "aten::mm", prev, 1000, tid=1, **mark))
            nodes.append(_node(nid + 1, pb.COMM_COLL_NODE, "all_reduce", [nid], 0, comm_type=0, comm_size=1 << 20,
                               pg_name="0", tid=1, **mark))
            nodes.append(_node(nid + 2, pb.COMP_NODE, "aten::add_", [nid + 1], 200, tid=1, **mark))
            prev, nid = [nid + 2], nid + 3
        write_et(out / f"t.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes)
    return out / "t"


def test_each_captured_iteration_is_one_replayed_iteration(tmp_path: Path) -> None:
    """Bug: "a replay 'iteration' is one pass over the whole capture, never divided by the number of captured
    iterations: `--capture 2` shows +71.7% against the observed time". Marked iterations are replayed one by
    one; an unmarked capture is one iteration per pass and the report says so."""
    one = run_replay(ReplayConfig(str(_marked_capture(tmp_path, 1)), clock="virtual", iterations=2))
    three = run_replay(ReplayConfig(str(_marked_capture(tmp_path, 3)), clock="virtual", iterations=2))
    assert len(one.baseline.iteration_us) == 2 and len(three.baseline.iteration_us) == 6
    assert three.baseline.captured == 3 and "3 captured iteration(s) per pass" in three.format_text()
    assert _close(three.baseline.median_us, one.baseline.median_us)
    bare = run_replay(ReplayConfig(str(_marked_capture(tmp_path, 3, marked=False)), clock="virtual", iterations=2))
    assert len(bare.baseline.iteration_us) == 2 and bare.baseline.median_us > 2.5 * one.baseline.median_us
    assert "marks no iteration boundaries: one iteration = one pass" in bare.format_text()
    doc = json.loads(json.dumps(three.to_dict(), allow_nan=False))
    assert doc["baseline"]["iterations"] == {"captured_per_pass": 3, "count": 6,
                                             "note": "3 captured iteration(s) per pass, as marked by the recorder"}
    assert len(doc["baseline"]["breakdown_per_iteration_us"]) == 6


# ------------------------------------------------------------------------------------------- property test


@st.composite
def _random_world(draw: st.DrawFn) -> tuple[dict[int, RankGraph], bool]:
    """2-3 ranks sharing one node template (kinds, resources, dependencies, collectives in one order) with
    per-rank durations: single- or multi-stream, asynchronous and blocking collectives."""
    ranks = draw(st.integers(2, 3))
    n = draw(st.integers(1, 14))
    streams = draw(st.integers(1, 3))
    template = []
    for i in range(n):
        kind = draw(st.sampled_from([COMPUTE, COMPUTE, COLLECTIVE]))
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        comm = CommInfo("all_reduce", draw(st.integers(0, 1 << 22)), "0", blocking=draw(st.booleans())) \
            if kind == COLLECTIVE else None
        template.append((kind, draw(st.integers(0, streams - 1)), deps, comm))
    graphs = {}
    for r in range(ranks):
        nodes = [(k, float(draw(st.integers(0, 5000))) if k == COMPUTE else 0.0, res, deps, comm)
                 for k, res, deps, comm in template]
        g = graphs[r] = _graph(r, nodes)
        g.issue_us = [float(draw(st.integers(0, 50))) if k == COLLECTIVE else 0.0 for k in g.kind]
    return graphs, draw(st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_world(), st.integers(1, 3))
def test_property_parts_add_up_on_random_graphs(world: tuple[dict[int, RankGraph], bool], reps: int) -> None:
    """Issue 13, "Must show": on random graphs (single- and multi-stream, with collectives, overlap or
    serialize) every rank's parts sum to every iteration's time within 0.1% in virtual mode."""
    graphs, serialize = world
    s = resize(load_scenario(None, ("overlap=serialize",) if serialize else ()), len(graphs))
    sim = simulate(graphs, s, groups={"0": list(graphs)}, recorded_world=len(graphs), repetitions=reps)
    _assert_partitions(sim)


def _corpus() -> list[str]:
    samples = ROOT / "tests" / "data" / "samples"
    found = sorted({str(p)[: -len(".0.et")] for p in samples.rglob("*.0.et")})
    return [*(str(p) for p in sorted(TRACES.iterdir()) if p.is_dir()), *found]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from nbox_record.convert.importer import ConvertConfig, import_traces

    meg = ROOT / "tests" / "data" / "samples" / "pytorch_et" / "megatron_tp8_nccl"
    out = tmp_path_factory.mktemp("imported") / "megatron.bundle"
    pairs = tuple((meg / f"megatron_et_{r}.json.gz", meg / f"megatron_kineto_{r}.json.gz") for r in (0, 1))
    return [str(import_traces(ConvertConfig(pairs=pairs, out=out))[0])]


def test_property_parts_add_up_on_every_shipped_bundle_sample_and_imported_trace(imported: list[str]) -> None:
    """Issue 13, "Must show": over every shipped bundle in traces/, every sample in tests/data/samples and an
    imported (Megatron, 2-stream GPU) trace, every rank's parts sum to every iteration's time within 0.1%."""
    from nbox_replay.inputs.source import open_source
    from nbox_replay.replay import _load
    from nbox_trace.errors import NboxError

    checked = 0
    for path in [*_corpus(), *imported]:
        try:
            source = open_source(path)
            graphs = _load(source, None)
        except NboxError:  # a sample the replay refuses (a dependency cycle) has nothing to partition
            continue
        s = resize(load_scenario(None), source.recorded_world)
        sim = simulate(graphs, s, groups=source.groups, recorded_world=source.recorded_world, repetitions=2)
        _assert_partitions(sim)
        checked += 1
    assert checked >= 20


# ------------------------------------------------------------------------- a real capture of 3 iterations


@pytest.fixture(scope="module")
def capture3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("cap3") / "cap3.bundle"
    proc = subprocess.run([sys.executable, "-m", "nbox", "record", "--capture", "3", "--iterations", "3",
                           "--warmup", "1", "-o", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.integration
def test_a_capture_of_three_iterations_replays_three_per_pass(capture3: Path) -> None:
    """Bug: "`nbox record --capture 2` then `nbox replay --clock virtual` shows +71.7% against the observed
    time": a pass over the capture was one iteration. `--capture 3` now gives three replayed iterations per
    pass, each with a breakdown that adds up."""
    rep = run_replay(ReplayConfig(str(capture3), clock="virtual", iterations=2))
    for run in (rep.baseline, rep.what_if):
        assert run.captured == 3 and len(run.iteration_us) == 6 and len(run.breakdowns) == 6
        for b in run.breakdowns:
            assert _close(b.parts_us(), b.iteration_us)
    assert "3 captured iteration(s) per pass, as marked by the recorder" in rep.format_text()

