"""The profiler correction's ``segments`` rule (nbox_replay.inputs.segments, nbox_replay.inputs.profiler), the clean
segments in the manifest (nbox_trace.bundle.manifest) and the recorder's clock that cuts them
(nbox_record.capture.clock)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from nbox_replay.inputs.graph import COLLECTIVE, COMPUTE, RankGraph, captured_iterations, load_rank
from nbox_replay.inputs.profiler import (
    Correction,
    RankFigures,
    correct_graph,
    correct_graphs,
    from_worker_doc,
    plan_correction,
    read_figures,
    training_thread,
)
from nbox_replay.inputs.segments import scale_segments, segment_medians
from nbox_replay.replay import ReplayConfig, run_replay

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


# -- the rule on synthetic graphs ---------------------------------------------------------------------------------


def synthetic(durations: list[float | str], iterations: list[int] | None = None) -> RankGraph:
    """One rank on one host thread: a float is a compute node of that duration, "C" a collective it issues."""
    n = len(durations)
    kind = [COLLECTIVE if d == "C" else COMPUTE for d in durations]
    return RankGraph(0, "synthetic", ids=list(range(1, n + 1)), names=[f"n{i}" for i in range(n)], kind=kind,
                     duration_us=[0.0 if d == "C" else float(d) for d in durations], issue_us=[0.0] * n,
                     resource=[0] * n, resources=["thread:1"], deps=[(i - 1,) if i else () for i in range(n)],
                     iteration=iterations if iterations is not None else [1] * n)


def main_sums(g: RankGraph, out: RankGraph) -> list[list[float]]:
    """Per captured iteration, the corrected compute of each segment between the thread's collectives."""
    labels, count, _ = captured_iterations(g)
    sums: list[list[float]] = [[0.0] for _ in range(count)]
    for i, k in enumerate(g.kind):
        if k == COLLECTIVE:
            sums[labels[i]].append(0.0)
        elif k == COMPUTE:
            sums[labels[i]][-1] += out.duration_us[i]
    return sums


def test_each_segment_is_scaled_to_its_own_clean_time() -> None:
    g = synthetic([100.0, 300.0, "C", 50.0, 50.0, "C", 200.0])
    clean = RankFigures(clean_cpu_us=500.0, captured_cpu_us=900.0, clean_segments_us=(300.0, 20.0, 180.0))
    fallbacks: dict[int, str] = {}
    out, factor = correct_graph(g, clean, "segments", fallbacks)
    assert fallbacks == {}
    assert main_sums(g, out) == [[pytest.approx(300.0), pytest.approx(20.0), pytest.approx(180.0)]]
    assert out.duration_us[:2] == [pytest.approx(75.0), pytest.approx(225.0)]  # within a segment: proportional
    assert factor == pytest.approx(500.0 / 700.0)
    # to_clean on the same graph: one factor, so the first collective comes at another point of the iteration
    flat, _ = correct_graph(g, clean, "to_clean")
    assert main_sums(g, flat)[0][0] == pytest.approx(400.0 * 500.0 / 700.0)
    assert sum(main_sums(g, flat)[0]) == pytest.approx(500.0)


def test_a_captured_iteration_with_another_segment_count_falls_back_to_to_clean() -> None:
    g = synthetic([100.0, "C", 100.0, 200.0, "C", 300.0, "C", 100.0], [1, 1, 1, 2, 2, 2, 2, 2])
    fig = RankFigures(400.0, 900.0, clean_segments_us=(300.0, 100.0))
    fallbacks: dict[int, str] = {}
    out, _ = correct_graph(g, fig, "segments", fallbacks)
    assert fallbacks == {1: "3 segments captured, 2 clean"}
    sums = main_sums(g, out)
    assert sums[0] == [pytest.approx(300.0), pytest.approx(100.0)]  # iteration 1 by segments
    to_clean, _ = correct_graph(g, fig, "to_clean")
    labels, _, _ = captured_iterations(g)
    assert [d for d, it in zip(out.duration_us, labels, strict=True) if it == 1] == \
        [d for d, it in zip(to_clean.duration_us, labels, strict=True) if it == 1]  # iteration 2 as to_clean


def test_a_segment_without_recorded_compute_falls_back_to_to_clean() -> None:
    g = synthetic([100.0, "C", "C", 200.0])
    fig = RankFigures(400.0, 900.0, clean_segments_us=(300.0, 5.0, 95.0))
    fallbacks: dict[int, str] = {}
    out, _ = correct_graph(g, fig, "segments", fallbacks)
    assert fallbacks == {0: "segment 1 has no recorded compute"}
    assert out.duration_us == correct_graph(g, fig, "to_clean")[0].duration_us


def test_named_segments_without_clean_segments_is_to_clean_and_to_clean_ignores_them() -> None:
    g = synthetic([100.0, 300.0, "C", 50.0, 50.0, "C", 200.0])
    with_segs = RankFigures(500.0, 900.0, clean_segments_us=(300.0, 20.0, 180.0))
    without = RankFigures(500.0, 900.0)
    fallbacks: dict[int, str] = {}
    out, _ = correct_graph(g, without, "segments", fallbacks)
    assert fallbacks == {0: "no clean segments"}
    assert out.duration_us == correct_graph(g, without, "to_clean")[0].duration_us
    plain = correct_graph(g, without, "to_clean")[0].duration_us
    assert correct_graph(g, with_segs, "to_clean")[0].duration_us == plain


def test_another_threads_collectives_do_not_cut_and_its_compute_is_proportional() -> None:
    g = synthetic([100.0, 300.0, "C", 50.0, 50.0, "C", 200.0, 40.0, "C"])
    resource = [0] * 7 + [1, 1]
    two = dataclasses.replace(g, resource=resource, resources=["thread:1", "thread:2"])
    assert training_thread(two) == 0
    fallbacks: dict[int, str] = {}
    out, _ = correct_graph(two, RankFigures(500.0, 1000.0, clean_segments_us=(300.0, 20.0, 180.0)), "segments",
                           fallbacks)
    assert fallbacks == {}
    assert out.duration_us[7] == pytest.approx(20.0)  # proportional: 500 / 1000
    assert sum(out.duration_us[3:5]) == pytest.approx(20.0) and sum(out.duration_us[6:7]) == pytest.approx(180.0)


def test_scale_segments_leaves_uncorrected_nodes_alone() -> None:
    out, why = scale_segments([10.0, 0.0, 20.0, 7.0], [True, False, True, False], [False, True, False, False],
                              [0, 0, 0, 0], (5.0, 40.0), [1.0, 2.0, 3.0, 4.0])
    assert why == {} and out == [5.0, 0.0, 40.0, 7.0]


def test_segment_medians_are_per_segment_over_the_common_count_and_refuse_malformed_iterations() -> None:
    assert segment_medians([[[10, 1], [20, 0]], [[30, 0], [40, 2]], [[20, 0], [0, 0]]]) == (20.0, 20.0)
    assert segment_medians([[[10, 1], [20, 0]], [[30, 0]]]) is None  # no count shared by more than half
    assert segment_medians([[[10, 1], [20, 0]], [[30, 0]], [[12, 0], [22, 0]]]) == (11.0, 21.0)  # the common count
    assert segment_medians([]) is None and segment_medians(None) is None
    assert segment_medians([[[-1, 0]]]) is None and segment_medians([[[math.inf, 0]]]) is None
    assert segment_medians([[[True, 0]]]) is None and segment_medians([[[1, 0, 2]]]) is None


def test_on_picks_segments_where_the_figures_carry_them_and_the_worker_doc_keeps_them() -> None:
    figures = {"0": {"clean": [500.0], "captured": [900.0], "clean_segments": [[[300.0, 0.0], [200.0, 0.0]]]},
               "1": {"clean": [500.0], "captured": [900.0]}}
    c = plan_correction("on", {"thread_cpu_us": figures})
    assert c.figures[0].clean_segments_us == (300.0, 200.0) and c.figures[1].clean_segments_us is None
    g = synthetic([100.0, "C", 100.0])
    out = correct_graphs({0: g, 1: g}, c)
    assert c.rule_of(0) == "segments_runnable" and c.rule_of(1) == "to_clean"
    assert out[0].duration_us == [pytest.approx(300.0), 0.0, pytest.approx(200.0)]
    assert out[1].duration_us == [pytest.approx(250.0), 0.0, pytest.approx(250.0)]
    back = from_worker_doc(json.loads(json.dumps(c.worker_doc())))
    assert back.figures[0].clean_segments_us == (300.0, 200.0) and back.figures[1].clean_segments_us is None
    named = plan_correction("to_clean", {"thread_cpu_us": figures})
    correct_graphs({0: g}, named)
    assert named.rule_of(0) == "to_clean"


# -- the replay on a shipped bundle given clean segments ------------------------------------------------------


def segment_bundle(tmp: Path, segments: dict[str, list[list[list[float]]]]) -> Path:
    out = tmp / "ddp_mlp"
    shutil.copytree(TRACES / "ddp_mlp", out)
    manifest = json.loads((out / "manifest.json").read_text())
    cpu: dict[str, Any] = {r: {"clean": [sum(s[0] for s in segs[0])], "captured": [12000.0]}
                           for r, segs in segments.items()}
    for r, segs in segments.items():
        cpu[r]["clean_segments"] = segs
    manifest["observed"]["thread_cpu_us"] = cpu
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def virtual(bundle: Path, **kw: Any) -> dict[str, Any]:
    return run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", **kw)).to_dict()


def test_the_virtual_replay_plays_the_segments_by_default_and_to_clean_when_named(tmp_path: Path) -> None:
    # ddp_mlp's captured iteration: rank 0 has compute in all three segments, rank 1 none between its two
    # all-reduces (so rank 1 falls back to to_clean, and the report says so)
    # rank 0 issues its first all-reduce far later than to_clean would, rank 1 (the quicker) waits for it
    long_forward = [[[5000.0, 0.0], [500.0, 0.0], [500.0, 0.0]]]
    quick = [[[2000.0, 0.0], [500.0, 0.0], [500.0, 0.0]]]
    bundle = segment_bundle(tmp_path, {"0": long_forward, "1": quick})
    on = virtual(bundle)
    pc = on["profiler_correction"]
    assert pc["rule_by_rank"] == {"0": "segments_runnable", "1": "segments_runnable"}  # no run-queue time here
    assert pc["clean_segments"] == {"0": 3, "1": 3}
    assert pc["segment_fallbacks"] == {"0": {}, "1": {"1": "segment 1 has no recorded compute"}}
    text = run_replay(ReplayConfig(str(bundle), clock="virtual")).format_text()
    assert "(segments_runnable rule)" in text
    assert "rank 1: captured iteration(s) [1] corrected by to_clean instead of segments_runnable" in text
    named = virtual(bundle, profiler_correction="to_clean")
    assert named["profiler_correction"]["rule_by_rank"] == {"0": "to_clean", "1": "to_clean"}
    # the same clean CPU time in all: to_clean's compute is the same, where the collectives are issued is not
    assert on["baseline"]["breakdown_us"]["compute"] == pytest.approx(named["baseline"]["breakdown_us"]["compute"])
    assert on["baseline"]["iteration_us"]["median"] > named["baseline"]["iteration_us"]["median"] * 1.05
    plain = segment_bundle(tmp_path / "plain", {"0": long_forward, "1": quick})
    manifest = json.loads((plain / "manifest.json").read_text())
    for entry in manifest["observed"]["thread_cpu_us"].values():
        del entry["clean_segments"]
    (plain / "manifest.json").write_text(json.dumps(manifest))
    old = virtual(plain)  # a bundle without segments: to_clean under on, the answer of the named rule
    assert old["profiler_correction"]["rule_by_rank"] == {"0": "to_clean", "1": "to_clean"}
    assert old["baseline"]["iteration_us"] == named["baseline"]["iteration_us"]
    figs = read_figures(json.loads((bundle / "manifest.json").read_text())["observed"])
    assert figs[0].clean_segments_us == (5000.0, 500.0, 500.0)


def test_the_rule_on_a_shipped_trace_cuts_at_its_all_reduces() -> None:
    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    fallbacks: dict[int, str] = {}
    out, _ = correct_graph(g, RankFigures(6000.0, 12000.0, clean_segments_us=(5000.0, 500.0, 500.0)), "segments",
                           fallbacks)
    assert fallbacks == {}
    main = training_thread(g)
    sums, k = [0.0, 0.0, 0.0], 0
    for i, kind in enumerate(g.kind):
        if g.resource[i] == main and kind == COLLECTIVE:
            k += 1
        elif g.resource[i] == main and kind == COMPUTE:
            sums[k] += out.duration_us[i]
    assert sums == [pytest.approx(5000.0), pytest.approx(500.0), pytest.approx(500.0)]


def test_a_correction_with_fallbacks_serializes() -> None:
    c = Correction("to_clean", {0: RankFigures(1.0, 2.0)})
    c.factors[0] = 0.5
    c.rank_rules[0] = ("segments", "clean time per segment between collectives")
    c.segment_fallbacks[0] = {0: "3 segments captured, 2 clean"}
    assert json.loads(json.dumps(c.to_dict()))["segment_fallbacks"] == {"0": {"1": "3 segments captured, 2 clean"}}
    assert "captured iteration(s) [1] corrected by to_clean instead of segments (3 segments captured, 2 clean)" \
        in c.describe()


def test_segments_runnable_scales_each_segment_to_its_cpu_plus_run_queue_time() -> None:
    """``segments_runnable``: the clean segments' medians of CPU + run-queue time, not CPU alone, and the rule
    scales each captured segment to them (the run queue moves the answer)."""
    clean = [[[10, 1], [20, 4]], [[30, 3], [40, 0]], [[20, 2], [0, 6]]]
    assert segment_medians(clean) == (20.0, 20.0)
    assert segment_medians(clean, runnable=True) == (22.0, 24.0)
    assert segment_medians([[[1, -1]]], runnable=True) is None and segment_medians([[[1, math.inf]]]) is None
    g = synthetic([100.0, 300.0, "C", 50.0, 50.0, "C", 200.0])
    fig = RankFigures(500.0, 900.0, clean_segments_us=(300.0, 20.0, 180.0),
                      clean_segments_runnable_us=(330.0, 20.0, 250.0))
    cpu, _ = correct_graph(g, fig, "segments")
    runnable, _ = correct_graph(g, fig, "segments_runnable")
    assert main_sums(g, cpu) == [[pytest.approx(300.0), pytest.approx(20.0), pytest.approx(180.0)]]
    assert main_sums(g, runnable) == [[pytest.approx(330.0), pytest.approx(20.0), pytest.approx(250.0)]]


def test_on_plays_the_run_queue_unless_the_recording_machine_was_oversubscribed() -> None:
    """``on``: ``segments_runnable`` (each segment's CPU + run-queue time); a rank that waited a quarter of its CPU
    time or more for a CPU (other ranks' compute on too few CPUs) keeps ``segments`` (CPU only)."""
    segs = [[[300.0, 30.0], [200.0, 20.0]]]
    figures = {"0": {"clean": [500.0], "clean_run_queue": [50.0], "captured": [900.0], "clean_segments": segs},
               "1": {"clean": [500.0], "clean_run_queue": [200.0], "captured": [900.0], "clean_segments": segs}}
    c = plan_correction("on", {"thread_cpu_us": figures})
    g = synthetic([100.0, "C", 100.0])
    out = correct_graphs({0: g, 1: g}, c)
    assert c.rule_of(0) == "segments_runnable" and c.rule_of(1) == "segments"
    assert out[0].duration_us == [pytest.approx(330.0), 0.0, pytest.approx(220.0)]
    assert out[1].duration_us == [pytest.approx(300.0), 0.0, pytest.approx(200.0)]
    back = from_worker_doc(json.loads(json.dumps(c.worker_doc())))
    assert back.figures[0].clean_segments_runnable_us == (330.0, 220.0)
