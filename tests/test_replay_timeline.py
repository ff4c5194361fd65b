"""Perfetto timelines of a virtual replay: one well-formed trace-event JSON per rank, comm spans, flows."""

from __future__ import annotations

import json
import math
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.world import resize
from nbox_replay.inputs.graph import COLLECTIVE, CommInfo, RankGraph, load_rank
from nbox_replay.report.timeline import TimelineWriteError, answers_by_node, write_timelines
from nbox_replay.virtual.engine import SimResult, simulate

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "traces" / "ddp_mlp"


def _graphs(bundle: Path = BUNDLE) -> dict[int, RankGraph]:
    return {r: load_rank(bundle / "trace" / f"trace.{r}.et", r) for r in (0, 1)}


def _replay(world: int, reps: int = 2, bundle: Path = BUNDLE) -> tuple[dict[int, RankGraph], SimResult]:
    graphs = _graphs(bundle)
    scenario = resize(load_scenario(None), world)
    return graphs, simulate(graphs, scenario, groups={"0": [0, 1]}, recorded_world=2, repetitions=reps)


def _load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc, doc["traceEvents"]


@pytest.mark.parametrize("world", [2, 64])
def test_one_well_formed_file_per_rank(tmp_path: Path, world: int) -> None:
    graphs, result = _replay(world)
    paths = write_timelines(result, graphs, tmp_path, label=f"w{world}")
    assert paths == [tmp_path / f"rank{r}.w{world}.json" for r in (0, 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)  # no temp file left
    for rank, path in zip((0, 1), paths, strict=True):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        doc, events = _load(path)
        assert doc["otherData"]["rank"] == rank and doc["otherData"]["world_size"] == world
        phases = Counter(e["ph"] for e in events)
        assert set(phases) <= {"X", "M", "s", "f"}
        xs = [e for e in events if e["ph"] == "X"]
        assert xs
        for e in xs:
            for key in ("ph", "ts", "dur", "pid", "tid", "name"):
                assert key in e, (key, e)
            assert e["pid"] == rank
            assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]) and e["ts"] >= -1e-6
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        # every track used by an event is named by a metadata event
        named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert {e["tid"] for e in events if e["ph"] != "M"} <= named
        assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
        # compute events: one per compute node of the graph, recorded vs replayed duration in args
        compute = [e for e in xs if e.get("cat") == "compute"]
        g = graphs[rank]
        assert len(compute) == sum(1 for k in g.kind if k == 0)
        for e in compute:
            assert e["args"]["replayed_us"] == pytest.approx(e["dur"])
            assert e["args"]["recorded_us"] >= 0 and "node_id" in e["args"]


@pytest.mark.parametrize("world", [2, 64])
def test_comm_events_carry_the_modeled_duration(tmp_path: Path, world: int) -> None:
    graphs, result = _replay(world)
    paths = write_timelines(result, graphs, tmp_path, label="t")
    answers = {(a.pg, a.seq): a for a in result.collectives}
    for rank, path in zip((0, 1), paths, strict=True):
        _, events = _load(path)
        comm = [e for e in events if e["ph"] == "X" and e.get("cat") == "comm"]
        n_coll = sum(1 for k in graphs[rank].kind if k == COLLECTIVE)
        assert len(comm) == n_coll  # the last repetition's collectives, one span each
        for e in comm:
            a = answers[(e["args"]["pg"], e["args"]["seq"])]
            assert e["dur"] == a.end_us - a.start_us == e["args"]["modeled_us"]
            assert e["args"]["collective"] == a.collective and e["args"]["bytes"] == a.nbytes
            assert e["args"]["algorithm"] == a.algorithm and e["args"]["rule"] == a.rule
            assert e["tid"] >= 1001
        # the last repetition's answers (2 repetitions: seq of the second half)
        assert {e["args"]["seq"] for e in comm} == set(range(n_coll, 2 * n_coll))


def test_answers_by_node_matches_the_replayed_end_times() -> None:
    graphs, result = _replay(64, reps=3)
    for rank, g in graphs.items():
        found = answers_by_node(result, g)
        assert set(found) == {i for i in g.comm if g.comm[i].collective != "unpriced"}
        for i, ans in found.items():
            assert result.ranks[rank].end_us[i] == ans.end_us


@pytest.mark.parametrize("world", [2, 64])
def test_flows_pair_up(tmp_path: Path, world: int) -> None:
    graphs, result = _replay(world)
    paths = write_timelines(result, graphs, tmp_path, label="f")
    total = 0
    for rank, path in zip((0, 1), paths, strict=True):
        _, events = _load(path)
        starts = {e["id"]: e for e in events if e["ph"] == "s"}
        finishes = {e["id"]: e for e in events if e["ph"] == "f"}
        assert set(starts) == set(finishes)
        assert len(starts) == sum(1 for e in events if e["ph"] == "s")  # ids unique
        xs = [e for e in events if e["ph"] == "X"]
        for fid, s in starts.items():
            f = finishes[fid]
            assert f["bp"] == "e" and f["ts"] >= s["ts"] and s["pid"] == f["pid"] == rank
            # each end binds to a slice that starts there on its track (the waiting node / the issue)
            assert any(x["tid"] == f["tid"] and x["ts"] == f["ts"] for x in xs)
            assert any(x["tid"] == s["tid"] and x["ts"] == s["ts"] and x["dur"] > 0
                       and x.get("cat") in ("comm_issue", "comm") for x in xs)
        total += len(starts)
    waits = sum(len(result.ranks[r].waited_on) for r in (0, 1))
    assert total == waits > 0  # ddp_mlp: the optimizer's copy waits for the last bucket's all-reduce


def test_blocking_collectives_hold_the_thread(tmp_path: Path) -> None:
    graphs, result = _replay(64, reps=1, bundle=ROOT / "traces" / "fsdp2_transformer")
    [path, _] = write_timelines(result, graphs, tmp_path, label="fsdp")
    _, events = _load(path)
    issues = [e for e in events if e.get("cat") == "comm_issue"]
    comm = {e["args"]["node_id"]: e for e in events if e.get("cat") == "comm"}
    assert issues and comm
    for e in issues:
        if e["args"]["blocking"]:
            c = comm[e["args"]["node_id"]]
            assert e["ts"] + e["dur"] == pytest.approx(c["ts"] + c["dur"])


def test_bad_label_and_unwritable_folder(tmp_path: Path) -> None:
    graphs, result = _replay(2, reps=1)
    with pytest.raises(TimelineWriteError, match="label"):
        write_timelines(result, graphs, tmp_path, label="a/b")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TimelineWriteError) as info:
        write_timelines(result, graphs, blocker / "sub", label="x")
    assert info.value.exit_code == 5


def _tiny(rank: int) -> RankGraph:
    """compute -> async all-reduce (issue costs nothing) -> compute that waits for it."""
    g = RankGraph(rank, f"<tiny {rank}>", resources=["thread:1"])
    for i, (kind, dur, deps) in enumerate(((0, 10.0, ()), (COLLECTIVE, 50.0, (0,)), (0, 5.0, (1,)))):
        g.ids.append(100 + i)
        g.names.append(f"n{i}")
        g.kind.append(kind)
        g.duration_us.append(dur)
        g.issue_us.append(0.0)
        g.resource.append(0)
        g.deps.append(deps)
        g.iteration.append(0)
    g.comm[1] = CommInfo("all_reduce", 1 << 20, "0")
    return g


def test_flow_from_a_zero_length_issue_starts_at_the_modeled_span(tmp_path: Path) -> None:
    graphs = {r: _tiny(r) for r in (0, 1)}
    result = simulate(graphs, resize(load_scenario(None), 8), groups={"0": [0, 1]}, recorded_world=2)
    [path, _] = write_timelines(result, graphs, tmp_path, label="tiny")
    _, events = _load(path)
    [s] = [e for e in events if e["ph"] == "s"]
    [f] = [e for e in events if e["ph"] == "f"]
    [span] = [e for e in events if e.get("cat") == "comm"]
    [waiter] = [e for e in events if e.get("name") == "n2"]
    assert (s["tid"], s["ts"]) == (span["tid"], span["ts"]) and span["dur"] > 0
    assert (f["tid"], f["ts"]) == (waiter["tid"], waiter["ts"]) == (1, span["ts"] + span["dur"])
