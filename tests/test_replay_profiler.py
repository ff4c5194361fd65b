"""Recorded compute corrected for the profiler's overhead (nbox_replay.inputs.profiler): the rules, old bundles,
the flag."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbox_replay.inputs.graph import COMPUTE, load_rank
from nbox_replay.inputs.profiler import (
    DEFAULT_RULE,
    PER_OP_FLOOR,
    Correction,
    RankFigures,
    correct_durations,
    correct_graph,
    correct_graphs,
    from_worker_doc,
    plan_correction,
    read_figures,
)
from nbox_replay.replay import ReplayConfig, ReplayConfigError, run_replay
from nbox_trace.errors import NboxError, UsageError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


# -- the rules, by hand ------------------------------------------------------------------------------------------


def test_proportional_scales_the_flagged_durations_by_clean_over_captured() -> None:
    fig = RankFigures(clean_cpu_us=8000.0, captured_cpu_us=10000.0)  # the profiler cost 2 ms of 10: x0.8
    out = correct_durations([100.0, 50.0, 30.0], [True, True, False], [0, 0, 0], fig, "proportional")
    assert out == pytest.approx([80.0, 40.0, 30.0])


def test_per_op_subtracts_the_overhead_shared_by_the_iterations_nodes_floored() -> None:
    fig = RankFigures(clean_cpu_us=8000.0, captured_cpu_us=10000.0)  # overhead 2000 us per iteration
    # iteration 0: two host compute nodes with a duration (the 0-duration one and the comm node do not count):
    # 2000 / 2 = 1000 each; 1500 -> 500, 100 -> floored at 10% = 10.
    # iteration 1: four nodes, 500 each: 3000 -> 2500, 600 -> 100, 400 -> 40 (floor), 520 -> 52 (floor).
    durations = [1500.0, 100.0, 0.0, 77.0, 3000.0, 600.0, 400.0, 520.0]
    flags = [True, True, True, False, True, True, True, True]
    iteration = [0, 0, 0, 0, 1, 1, 1, 1]
    out = correct_durations(durations, flags, iteration, fig, "per_op")
    assert PER_OP_FLOOR == 0.1
    assert out == pytest.approx([500.0, 10.0, 0.0, 77.0, 2500.0, 100.0, 40.0, 52.0])


def test_to_clean_scales_each_iterations_host_compute_to_the_clean_thread_time() -> None:
    fig = RankFigures(clean_cpu_us=300.0, captured_cpu_us=10000.0)
    # iteration 0: flagged 100 + 50 = 150 -> x2 (lengthened: the operators are shorter than the thread's time);
    # iteration 1: flagged 600 -> x0.5; the unflagged node (a comm, a GPU op) is kept.
    out = correct_durations([100.0, 50.0, 30.0, 600.0], [True, True, False, True], [0, 0, 0, 1], fig, "to_clean")
    assert out == pytest.approx([200.0, 100.0, 30.0, 300.0])
    assert sum(out[:2]) == pytest.approx(fig.clean_cpu_us) and out[3] == pytest.approx(fig.clean_cpu_us)


@pytest.mark.parametrize("rule", ["proportional", "per_op"])
def test_a_captured_time_not_above_the_clean_one_changes_nothing(rule: str) -> None:
    fig = RankFigures(clean_cpu_us=9000.0, captured_cpu_us=8500.0)
    assert fig.overhead_us == 0.0
    assert correct_durations([100.0, 200.0], [True, True], [0, 0], fig, rule) == [100.0, 200.0]


def test_an_unknown_rule_or_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        correct_durations([1.0], [True], [0], RankFigures(1.0, 2.0), "bogus")
    with pytest.raises(UsageError, match=r"replay\.profiler_correction"):
        plan_correction("bogus", {})
    with pytest.raises(ReplayConfigError, match=r"replay\.profiler_correction"):
        ReplayConfig(str(TRACES / "ddp_mlp"), profiler_correction="bogus")
    with pytest.raises(ReplayConfigError, match=r"replay\.profiler_correction"):
        ReplayConfig(str(TRACES / "ddp_mlp"), overrides=("replay.profiler_correction=bogus",))
    with pytest.raises(UsageError, match="unknown replay setting"):
        ReplayConfig(str(TRACES / "ddp_mlp"), overrides=("replay.correction=off",))
    set_off = ReplayConfig(str(TRACES / "ddp_mlp"), overrides=("replay.profiler_correction=off", "world_size=4"))
    assert set_off.profiler_correction == "off" and set_off.overrides == ("world_size=4",)
    assert issubclass(UsageError, NboxError)


def test_figures_are_medians_and_malformed_entries_are_left_out() -> None:
    observed: dict[str, Any] = {"thread_cpu_us": {
        "0": {"clean": [8000, 9000, 7000], "captured": [10000, 12000], "captured_wall": [20000, 21000]},
        "1": {"clean": [8000], "captured": "x"},            # not a list
        "2": {"clean": [8000], "captured": [float("nan")]},  # not finite
        "3": {"clean": [], "captured": [1.0]},              # empty
        "-1": {"clean": [1.0], "captured": [2.0]},           # not a rank
        "4": "nonsense",
    }}
    assert read_figures(observed) == {0: RankFigures(8000.0, 11000.0)}
    assert read_figures({}) == {} and read_figures(None) == {} and read_figures({"thread_cpu_us": [1]}) == {}


def test_the_graph_rule_touches_host_compute_only_and_reports_the_effective_factor() -> None:
    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    fig = RankFigures(8000.0, 10000.0)
    corrected, factor = correct_graph(g, fig, "proportional")
    assert factor == pytest.approx(0.8)
    assert corrected.compute_us() == pytest.approx(g.compute_us() * 0.8)
    for i, k in enumerate(g.kind):
        if k != COMPUTE:
            assert corrected.duration_us[i] == g.duration_us[i]
    assert g.compute_us() != corrected.compute_us()  # the input graph is left as it was
    per_op, f2 = correct_graph(g, fig, "per_op")
    assert 0 < f2 < 1 and per_op.compute_us() == pytest.approx(g.compute_us() * f2)


def _host(g: Any) -> list[int]:
    return [i for i, k in enumerate(g.kind) if k == COMPUTE and g.resources[g.resource[i]].startswith("thread:")]


def test_the_default_rule_plays_each_captured_iterations_host_compute_as_the_clean_thread_time() -> None:
    from nbox_replay.inputs.graph import captured_iterations

    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    c = plan_correction("on", {"thread_cpu_us": FIGURES})
    out = correct_graphs({0: g}, c)[0]
    assert DEFAULT_RULE == "to_clean" and c.rule == "to_clean" and c.rank_rules == {}
    labels, _, _ = captured_iterations(g)
    sums: dict[int, float] = {}
    for i in _host(g):
        sums[labels[i]] = sums.get(labels[i], 0.0) + out.duration_us[i]
    assert sums and all(v == pytest.approx(8000.0) for v in sums.values())  # rank 0's clean median
    assert c.factors[0] == pytest.approx(8000.0 * len(sums) / sum(g.duration_us[i] for i in _host(g)))
    assert "(to_clean rule): x" in c.describe() and "waited for a CPU" not in c.describe()


def test_a_rank_with_device_compute_or_lean_timed_operators_keeps_the_fallback_rule_and_is_named() -> None:
    import dataclasses

    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    host = _host(g)
    # one compute node moved onto a GPU stream: the rank's host thread's CPU time is no longer its work
    resource = list(g.resource)
    resource[host[0]] = len(g.resources)
    device = dataclasses.replace(g, resources=[*g.resources, "stream:7"], resource=resource)
    c = plan_correction("on", {"thread_cpu_us": FIGURES})
    out = correct_graphs({0: device}, c)[0]
    why = "device compute, no clean wall time"  # FIGURES has no observed.per_rank_us: to_wall cannot apply
    assert c.rank_rules == {0: ("proportional", why)} and c.factors[0] == pytest.approx(0.8)
    assert out.duration_us[host[0]] == g.duration_us[host[0]]  # the device node is not touched
    assert f"(proportional rule): x0.80 (rank 0: {why})" in c.describe()  # the rule every rank used
    assert c.to_dict()["rank_rules"] == {"0": {"rule": "proportional", "why": why}}
    # one host operator lean-timed: the rest corrected by the fallback rule, the lean one kept
    lean = dataclasses.replace(g, lean=[i == host[0] for i in range(len(g))])
    c = plan_correction("on", {"thread_cpu_us": FIGURES})
    out = correct_graphs({0: lean}, c)[0]
    assert c.rank_rules == {0: ("proportional", "lean-timed operators")}
    assert out.duration_us[host[0]] == g.duration_us[host[0]]
    assert all(out.duration_us[i] == pytest.approx(0.8 * g.duration_us[i]) for i in host[1:])
    # a named rule applies to every rank, device compute or not
    named = plan_correction("to_clean", {"thread_cpu_us": FIGURES})
    correct_graphs({0: device}, named)
    assert named.rank_rules == {} and named.factors[0] != pytest.approx(0.8)


def test_a_device_rank_with_a_clean_wall_time_has_its_host_work_scaled_to_it() -> None:
    """``to_wall``: each captured iteration's host work (operators, lean-timed too, their gaps, collective issues)
    times min(1, clean wall / its sum); GPU stream nodes untouched; named in the line; never lengthened."""
    import dataclasses

    from nbox_replay.inputs.graph import COLLECTIVE, RECV, captured_iterations

    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    host = _host(g)
    comm = [i for i, k in enumerate(g.kind) if COLLECTIVE <= k <= RECV and g.issue_us[i] > 0]
    assert len(comm) >= 2, "the shipped trace's collectives carry their issue cost"
    resource = list(g.resource)
    resource[host[0]] = len(g.resources)  # one operator becomes a GPU kernel
    resource[comm[0]] = len(g.resources)  # and one collective sits on the stream of its NCCL kernel
    gaps = [7.0 if i in host[1:4] else 0.0 for i in range(len(g))]
    lean = [i == host[1] for i in range(len(g))]
    device = dataclasses.replace(g, resources=[*g.resources, "stream:7"], resource=resource, gap_us=gaps, lean=lean)
    labels, count, _ = captured_iterations(device)
    # host work: compute on a thread, every gap, and every collective's issue, wherever the walk charges it
    on_thread = [device.resources[r].startswith("thread:") or i in comm for i, r in enumerate(device.resource)]
    work = [0.0] * count
    for i in range(len(device)):
        if on_thread[i]:
            work[labels[i]] += (device.duration_us[i] if device.kind[i] == COMPUTE else device.issue_us[i]) + gaps[i]
    wall = min(work) / 2
    figures = {"0": {"clean": [8000.0], "captured": [10000.0]}}
    c = plan_correction("on", {"thread_cpu_us": figures, "per_rank_us": {"0": [wall * 0.9, wall, wall * 1.1]}})
    out = correct_graphs({0: device}, c)[0]
    assert c.rank_rules == {0: ("to_wall", "device compute")} and c.figures[0].clean_wall_us == pytest.approx(wall)
    scale = [wall / w for w in work]
    for i in range(len(device)):
        f = scale[labels[i]] if on_thread[i] else 1.0
        if device.kind[i] == COMPUTE:
            assert out.duration_us[i] == pytest.approx(device.duration_us[i] * f)  # the lean-timed one too
        else:
            assert out.issue_us[i] == pytest.approx(device.issue_us[i] * f)
        assert out.gap_us[i] == pytest.approx(gaps[i] * f)
    assert out.duration_us[host[0]] == device.duration_us[host[0]]  # the kernel is not touched
    assert out.issue_us[comm[0]] == pytest.approx(device.issue_us[comm[0]] * scale[labels[comm[0]]])
    assert "(to_wall rule): x" in c.describe() and "to the clean iterations' wall time" in c.describe()
    assert "no profiler correction needed" not in c.describe() and "the rest" not in c.describe()  # lean ones too
    back = from_worker_doc(json.loads(json.dumps(c.worker_doc())))
    assert back.figures[0].clean_wall_us == pytest.approx(wall)  # a live worker gets the same rule
    # a clean iteration longer than the host's recorded work: nothing is lengthened
    c = plan_correction("on", {"thread_cpu_us": figures, "per_rank_us": {"0": [max(work) * 3]}})
    out = correct_graphs({0: device}, c)[0]
    assert c.factors[0] == 1.0 and out.duration_us == device.duration_us and out.gap_us == gaps
    # unmarked captured iterations (one span of several): to_wall would scale them all to one clean iteration
    unmarked = dataclasses.replace(device, iteration=[0] * len(device))
    c = plan_correction("on", {"thread_cpu_us": figures, "per_rank_us": {"0": [wall]}})
    correct_graphs({0: unmarked}, c)
    assert c.rank_rules == {0: ("proportional", "device compute, captured iterations not marked")}
    with pytest.raises(UsageError, match="to_wall"):  # the rule works on graphs: it scales gaps too
        correct_durations([1.0], [True], [0], RankFigures(1.0, 2.0), "to_wall")


def test_an_oversubscribed_recording_is_named_in_the_line_and_the_json() -> None:
    import dataclasses

    graphs = {r: load_rank(TRACES / "ddp_mlp" / "trace" / f"trace.{r}.et", r) for r in (0, 1)}

    def line(waited: dict[str, float], device: int | None = None) -> Correction:
        figures = {r: {"clean": [8000.0], "captured": [10000.0], "clean_run_queue": [8000.0 * w]}
                   for r, w in waited.items()}
        c = plan_correction("on", {"thread_cpu_us": figures})
        gs = dict(graphs)
        if device is not None:  # one compute node on a GPU stream: that rank keeps proportional
            g = gs[device]
            resource = list(g.resource)
            resource[g.kind.index(COMPUTE)] = len(g.resources)
            gs[device] = dataclasses.replace(g, resources=[*g.resources, "stream:7"], resource=resource)
        correct_graphs(gs, c)
        return c

    quiet = line({"0": 0.05, "1": 0.249})
    assert "waited for a CPU" not in quiet.describe() and quiet.to_dict()["oversubscribed"] == []
    both = line({"0": 0.75, "1": 1.0})
    assert "rank(s) [0, 1] waited for a CPU 75-100% as long as they ran per clean iteration (the recording " \
           "machine oversubscribed)" in both.describe()
    assert both.to_dict()["oversubscribed"] == [0, 1]
    assert both.to_dict()["clean_run_queue_us"] == {"0": 6000.0, "1": 8000.0}
    one = line({"0": 0.25, "1": 0.9}, device=1)  # at the share exactly: named; a proportional rank: not
    assert "rank(s) [0] waited for a CPU 25% as long" in one.describe() and one.to_dict()["oversubscribed"] == [0]
    named = Correction("proportional", both.figures, {0: 0.8, 1: 0.8})
    assert "waited for a CPU" not in named.describe() and named.oversubscribed() == []


def test_to_clean_scales_the_training_threads_compute_and_another_threads_by_proportional() -> None:
    import dataclasses

    from nbox_replay.inputs.graph import captured_iterations
    from nbox_replay.inputs.profiler import training_thread

    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    host = _host(g)
    main = training_thread(g)
    assert main is not None and all(g.resource[i] == main for i in host)
    # the last host node moved to a second host thread
    resource = list(g.resource)
    resource[host[-1]] = len(g.resources)
    two = dataclasses.replace(g, resources=[*g.resources, "thread:999"], resource=resource)
    assert training_thread(two) == main
    out, _ = correct_graph(two, RankFigures(8000.0, 10000.0), "to_clean")
    assert out.duration_us[host[-1]] == pytest.approx(0.8 * g.duration_us[host[-1]])
    labels, _, _ = captured_iterations(two)
    on_main: dict[int, float] = {}
    for i in host[:-1]:
        on_main[labels[i]] = on_main.get(labels[i], 0.0) + out.duration_us[i]
    assert all(v == pytest.approx(8000.0) for v in on_main.values())


def test_under_on_an_unmarked_capture_is_corrected_by_proportional() -> None:
    import dataclasses

    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    unmarked = dataclasses.replace(g, iteration=[0] * len(g))
    c = plan_correction("on", {"thread_cpu_us": FIGURES})
    correct_graphs({0: unmarked}, c)
    assert c.rank_rules == {0: ("proportional", "captured iterations not marked")}
    assert c.factors[0] == pytest.approx(0.8)
    assert "(proportional rule): x0.80 (rank 0: captured iterations not marked)" in c.describe()


def test_a_gpu_rank_through_the_cli_and_sweep_workers_is_scaled_to_its_wall_time_and_says_so(tmp_path: Path) -> None:
    from nbox_trace.chakra import et_def_pb2 as pb
    from nbox_trace.chakra.attrs import make_attr
    from nbox_trace.chakra.codec import EtReader, write_et

    bundle = with_figures(tmp_path, FIGURES)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["observed"]["per_rank_us"]["1"] = [900.0, 1000.0, 1100.0]  # a clean iteration shorter than the host work
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    path = bundle / "trace" / "trace.1.et"
    with EtReader(path) as reader:
        meta, nodes = reader.metadata, list(reader)
    kernel = next(n for n in nodes if n.type == pb.COMP_NODE and any(a.name == "tid" for a in n.attr))
    kernel.attr.append(make_attr("nbox_stream", 7))  # rank 1's first host operator becomes a GPU kernel
    write_et(path, meta, nodes)
    proc = subprocess.run([sys.executable, "-m", "nbox", "replay", str(bundle), "--clock", "virtual", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pc = json.loads(proc.stdout)["profiler_correction"]
    assert pc["rule_by_rank"] == {"0": "to_clean", "1": "to_wall"}  # the bundle carries rank 1's clean wall times
    assert pc["rank_rules"] == {"1": {"rule": "to_wall", "why": "device compute"}}
    factor = pc["factors"]["1"]
    assert 0 < factor < 1 and pc["clean_wall_us"]["1"] == 1000.0
    proc = subprocess.run([sys.executable, "-m", "nbox", "sweep", str(bundle), "--vary", "world_size=2,4", "--jobs",
                           "2", "--out", str(tmp_path / "sweep")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr  # the sweep's workers got the wall time too (to_wall needs it)
    assert f"x{factor:.2f} (rank 1, to_wall rule: device compute)" in proc.stderr


def test_naming_to_wall_scales_every_rank_to_its_wall_time_or_is_refused_without_one() -> None:
    """``--profiler-correction to_wall`` acts on a CPU rank too (the knob moves the answer), and a bundle that
    carries no per-rank wall time is refused with a message naming the rule and the rank."""
    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    figures = {"0": {"clean": [8000.0], "captured": [10000.0]}}
    named = plan_correction("to_wall", {"thread_cpu_us": figures, "per_rank_us": {"0": [1000.0]}})
    out = correct_graphs({0: g}, named)[0]
    assert named.rule_of(0) == "to_wall" and 0 < named.factors[0] < 1
    assert sum(out.duration_us) < sum(g.duration_us)
    with pytest.raises(UsageError, match=r"to_wall rule needs the clean iterations' wall time.*rank 0"):
        correct_graphs({0: g}, plan_correction("to_wall", {"thread_cpu_us": figures}))


def test_the_worker_doc_round_trips_to_the_same_correction() -> None:
    c = Correction("per_op", {0: RankFigures(8000.0, 10000.0), 3: RankFigures(1.0, 2.0)})
    back = from_worker_doc(json.loads(json.dumps(c.worker_doc())))
    assert back.rule == "per_op" and back.figures == c.figures
    assert Correction(None).worker_doc() is None and from_worker_doc(None).rule is None


# -- replay: old bundles, a bundle with the figures, the flag -------------------------------------------------


def with_figures(tmp: Path, figures: dict[str, dict[str, list[float]]], name: str = "ddp_mlp") -> Path:
    """A copy of a shipped bundle whose manifest carries ``observed.thread_cpu_us`` (as nbox record writes it)."""
    out = tmp / name
    shutil.copytree(TRACES / name, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["observed"]["thread_cpu_us"] = figures
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


FIGURES = {"0": {"clean": [8000.0, 8200.0, 7900.0], "captured": [10000.0], "captured_wall": [21000.0]},
           "1": {"clean": [6000.0], "captured": [10000.0], "captured_wall": [21000.0]}}


def virtual(bundle: Path, **kw: Any) -> dict[str, Any]:
    return run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", **kw)).to_dict()


def test_an_old_bundle_without_the_figures_replays_unchanged_and_says_so() -> None:
    on, off = virtual(TRACES / "ddp_mlp"), virtual(TRACES / "ddp_mlp", profiler_correction="off")
    assert on["baseline"]["iteration_us"] == off["baseline"]["iteration_us"]
    assert on["baseline"]["breakdown_us"]["compute"] == off["baseline"]["breakdown_us"]["compute"]
    assert on["profiler_correction"]["rule"] is None
    assert "no clean/captured CPU times" in on["profiler_correction"]["why_not"]
    text = run_replay(ReplayConfig(str(TRACES / "ddp_mlp"), clock="virtual")).format_text()
    assert "recorded compute not corrected for the profiler: the bundle carries no clean/captured" in text


def test_the_correction_is_on_by_default_moves_the_answer_and_off_restores_it(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, FIGURES)
    on = virtual(bundle)
    off = virtual(bundle, profiler_correction="off")
    plain = virtual(TRACES / "ddp_mlp")  # the same traces, no figures
    assert off["baseline"]["iteration_us"] == plain["baseline"]["iteration_us"]  # off: the uncorrected answer
    assert on["baseline"]["breakdown_us"]["compute"] < off["baseline"]["breakdown_us"]["compute"]
    assert on["baseline"]["iteration_us"]["median"] < off["baseline"]["iteration_us"]["median"]
    pc = on["profiler_correction"]
    assert pc["rule"] == DEFAULT_RULE and pc["rule_by_rank"] == {"0": "to_clean", "1": "to_clean"}
    assert pc["clean_cpu_us"] == {"0": 8000.0, "1": 6000.0} and pc["captured_cpu_us"] == {"0": 10000.0, "1": 10000.0}
    c = plan_correction("on", {"thread_cpu_us": FIGURES})  # the library's factors, by the same function
    correct_graphs({r: load_rank(bundle / "trace" / f"trace.{r}.et", r) for r in (0, 1)}, c)
    assert pc["factors"] == pytest.approx({str(r): f for r, f in c.factors.items()})
    assert pc["oversubscribed"] == [] and pc["rank_rules"] == {}
    assert off["profiler_correction"]["rule"] is None
    assert off["profiler_correction"]["why_not"] == "replay.profiler_correction=off"
    rules = {rule: virtual(bundle, profiler_correction=rule)["baseline"]["breakdown_us"]["compute"]
             for rule in ("proportional", "per_op", "to_clean")}
    assert len(set(rules.values())) == 3  # each rule moves the answer its own way
    assert all(v < off["baseline"]["breakdown_us"]["compute"] for v in rules.values())


def test_the_report_line_states_the_rule_and_each_ranks_factor(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, FIGURES)
    text = run_replay(ReplayConfig(str(bundle), clock="virtual", profiler_correction="proportional")).format_text()
    assert ("recorded compute corrected for the profiler (proportional rule): x0.80 (rank 0), x0.60 (rank 1), "
            "from clean 8.0 / 6.0 ms vs captured 10.0 / 10.0 ms CPU per iteration") in text


def test_a_rank_without_figures_is_replayed_as_recorded_and_named(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, {"1": FIGURES["1"]})
    rep = run_replay(ReplayConfig(str(bundle), clock="virtual", profiler_correction="proportional"))
    assert rep.profiler is not None and rep.profiler.factors == {1: pytest.approx(0.6)}
    assert rep.profiler.uncorrected == [0]
    assert "rank(s) [0] carry no CPU times: as recorded" in rep.format_text()


def test_the_cli_flag_turns_it_off(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, FIGURES)

    def cli(*extra: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "nbox", "replay", str(bundle), "--clock", "virtual", "--json",
                               *extra], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    on, off = cli(), cli("--set", "replay.profiler_correction=off")
    assert on["profiler_correction"]["rule"] == DEFAULT_RULE and off["profiler_correction"]["rule"] is None
    assert on["baseline"]["iteration_us"]["median"] < off["baseline"]["iteration_us"]["median"]
    assert off["baseline"]["iteration_us"] == virtual(TRACES / "ddp_mlp")["baseline"]["iteration_us"]


def test_sweep_uses_the_same_correction(tmp_path: Path) -> None:
    from nbox_replay.inputs.source import open_source
    from nbox_replay.replay import profiler_correction
    from nbox_replay.sweep import SweepConfig, run_sweep

    bundle = with_figures(tmp_path, FIGURES)
    source = open_source(bundle)

    def compute(mode: str) -> float:
        cfg = SweepConfig.build(dict(source.trace_set.files), source.groups, source.recorded_world,
                                ["world_size=2"], profiler=profiler_correction(mode, source, "recorded"))
        return run_sweep(cfg)[0].compute_us

    replayed = virtual(bundle, iterations=3)["baseline"]["breakdown_us"]["compute"]
    assert compute("on") < compute("off")
    assert compute("on") == pytest.approx(replayed)


def test_sweep_cli_says_which_correction(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, FIGURES)

    def sweep(*extra: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "nbox", "sweep", str(bundle), "--vary", "world_size=2,4",
                               "--out", str(tmp_path / "sweep"), *extra], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc

    # in worker processes too (--jobs 2), the line names each rank's factor: the same as the library's
    c = plan_correction("on", {"thread_cpu_us": FIGURES})
    correct_graphs({r: load_rank(bundle / "trace" / f"trace.{r}.et", r) for r in (0, 1)}, c)
    assert c.rule == DEFAULT_RULE and c.factors[0] != pytest.approx(0.8)  # not proportional's clean / captured
    line = f"({DEFAULT_RULE} rule): x{c.factors[0]:.2f} (rank 0), x{c.factors[1]:.2f} (rank 1)"
    assert line in sweep("--jobs", "2").stderr
    assert "(proportional rule): x0.80 (rank 0), x0.60 (rank 1)" in sweep(
        "--jobs", "2", "--set", "replay.profiler_correction=proportional").stderr
    doc = json.loads(sweep("--json", "--set", "replay.profiler_correction=off").stdout)
    assert doc["profiler_correction"]["rule"] is None
    on = json.loads(sweep("--json").stdout)
    assert on["profiler_correction"]["factors"] == pytest.approx({str(r): f for r, f in c.factors.items()})
    assert on["rows"][0]["compute_us"] < doc["rows"][0]["compute_us"]


def test_live_compute_is_not_corrected_and_says_why(tmp_path: Path) -> None:
    from nbox_replay.inputs.source import open_source
    from nbox_replay.replay import profiler_correction

    c = profiler_correction("on", open_source(with_figures(tmp_path, FIGURES)), "live")
    assert c.rule is None and "re-executed" in c.why_not


def test_correct_graphs_leaves_graphs_alone_without_a_rule() -> None:
    g = load_rank(TRACES / "ddp_mlp" / "trace" / "trace.0.et", 0)
    c = Correction(None, why_not="x")
    assert correct_graphs({0: g}, c)[0] is g and c.factors == {}


@pytest.mark.integration
def test_a_live_replay_with_recorded_compute_waits_the_corrected_durations(tmp_path: Path) -> None:
    from emulator_core.scenario.files import load_scenario
    from nbox_replay.live.run import LiveConfig, replay_live

    figures = {"0": {"clean": [5000.0], "captured": [10000.0]}, "1": {"clean": [5000.0], "captured": [10000.0]}}
    source = with_figures(tmp_path, figures)
    correction = plan_correction("proportional", {"thread_cpu_us": figures})  # x0.5 on both ranks
    res = replay_live(LiveConfig(files={r: source / "trace" / f"trace.{r}.et" for r in (0, 1)},
                                 groups={"0": [0, 1]}, recorded_world=2, scenario=load_scenario(None),
                                 compute="recorded", warmup=1, iterations=3, timeout_s=90.0,
                                 profiler=correction.worker_doc()))
    recorded = load_rank(source / "trace" / "trace.0.et", 0).compute_us()
    # the worker sleeps each compute node's corrected duration (half the recorded): never less, and below the
    # uncorrected one, which a sleep never undershoots (test_replay_live checks it is waited in full); the margin
    # is the wake-ups' overshoot on a loaded machine (one run with two rank launches at once: 0.90x, 4.4 ms over
    # 26 sleeps)
    assert min(res.rank_compute_us[0]) >= recorded * 0.5 * 0.95
    assert min(res.rank_compute_us[0]) < recorded * 0.97


@pytest.mark.integration
def test_replay_real_clock_recorded_compute_passes_the_correction_to_the_workers(tmp_path: Path) -> None:
    bundle = with_figures(tmp_path, FIGURES)
    rep = run_replay(ReplayConfig(str(bundle), clock="real", compute="recorded", iterations=1, warmup=0,
                                  timeout_s=90.0))
    assert rep.profiler is not None and rep.profiler.rule == DEFAULT_RULE and set(rep.profiler.factors) == {0, 1}
    assert "recorded compute corrected for the profiler" in rep.format_text()


# -- the lean pass's figures (nbox_record/sources/leantiming.py)
# ----------------------------------------------------------


def _rewrite(bundle: Path, edit: Any) -> None:
    """Rewrite every trace of ``bundle`` with ``edit(node)`` applied to each host compute node."""
    from nbox_trace.chakra import et_def_pb2 as pb
    from nbox_trace.chakra.codec import EtReader, write_et

    for path in sorted((bundle / "trace").glob("*.et")):
        with EtReader(path) as reader:
            meta, nodes = reader.metadata, list(reader)
        for node in nodes:
            if node.type == pb.COMP_NODE and any(a.name == "tid" for a in node.attr):
                edit(node)
        write_et(path, meta, nodes)


GAP_US = 100


def with_lean(tmp: Path, name: str, figures: dict[str, Any] | None = FIGURES) -> Path:
    """A copy of the shipped ddp_mlp bundle as a recording with a lean pass would carry it: every host operator's
    profiled duration twice its (lean) duration, and a gap of ``GAP_US`` before it."""
    from nbox_trace.chakra.attrs import make_attr

    out = with_figures(tmp / name, figures or {})

    def edit(node: Any) -> None:
        node.attr.append(make_attr("nbox_profiled_duration_micros", 2 * node.duration_micros))
        node.attr.append(make_attr("nbox_gap_micros", GAP_US))

    _rewrite(out, edit)
    return out


def test_lean_timed_nodes_are_not_corrected_and_a_named_rule_plays_their_profiled_times(tmp_path: Path) -> None:
    lean = with_lean(tmp_path, "lean")
    g = load_rank(lean / "trace" / "trace.0.et", 0)
    host = [i for i, k in enumerate(g.kind) if k == COMPUTE and g.resources[g.resource[i]].startswith("thread:")]
    assert host and all(g.lean[i] and g.gap_us[i] == GAP_US for i in host)
    assert all(g.profiled_us[i] == 2 * g.duration_us[i] for i in host)
    on = plan_correction("on", {"thread_cpu_us": FIGURES})
    same = correct_graphs({0: g}, on)[0]
    assert same.duration_us == g.duration_us and on.factors[0] == 1.0 and on.lean[0] == (len(host), len(host))
    assert "no profiler correction needed" in on.describe()
    named = plan_correction("proportional", {"thread_cpu_us": FIGURES})
    scaled = correct_graphs({0: g}, named)[0]
    factor = 8000.0 / 10000.0  # rank 0's clean / captured medians
    assert all(scaled.duration_us[i] == pytest.approx(2 * g.duration_us[i] * factor) for i in host)
    assert not any(scaled.gap_us) and "set aside" in named.describe()
    back = from_worker_doc(json.loads(json.dumps(named.worker_doc())))
    assert back.use_lean is False and from_worker_doc(on.worker_doc()).use_lean is True


def test_the_gap_before_each_operator_holds_its_thread_in_the_virtual_replay(tmp_path: Path) -> None:
    lean = with_lean(tmp_path, "lean", figures=None)
    plain = virtual(TRACES / "ddp_mlp", iterations=1)
    gapped = virtual(lean, iterations=1)
    g = load_rank(lean / "trace" / "trace.0.et", 0)
    labels = [it for it, k in zip(g.iteration, g.kind, strict=True) if k == COMPUTE and it >= 1]
    per_iteration = GAP_US * labels.count(min(labels))  # host operators of one captured iteration
    grew = gapped["baseline"]["breakdown_us"]["compute"] - plain["baseline"]["breakdown_us"]["compute"]
    assert grew == pytest.approx(per_iteration, rel=0.02)  # the gaps are the thread's work: counted as compute
    assert gapped["baseline"]["iteration_us"]["median"] > plain["baseline"]["iteration_us"]["median"]


def test_off_plays_the_lean_figures_as_carried_and_a_named_rule_the_profiled_ones(tmp_path: Path) -> None:
    lean = with_lean(tmp_path, "lean")
    doubled = with_figures(tmp_path / "doubled", FIGURES)
    _rewrite(doubled, lambda node: setattr(node, "duration_micros", 2 * node.duration_micros))
    for mode in ("proportional", "per_op"):  # the lean figures and gaps set aside: as if recorded without them
        assert virtual(lean, profiler_correction=mode)["baseline"]["iteration_us"] == \
            virtual(doubled, profiler_correction=mode)["baseline"]["iteration_us"]
    on, off = virtual(lean), virtual(lean, profiler_correction="off")
    assert on["baseline"]["iteration_us"] == off["baseline"]["iteration_us"]  # all lean: nothing to correct
    profiled = virtual(doubled, profiler_correction="off")["baseline"]["iteration_us"]["median"]
    assert on["baseline"]["iteration_us"]["median"] < profiled


def test_a_recording_under_a_cpu_quota_is_not_taken_for_an_oversubscribed_machine() -> None:
    """Issue 59: a rank whose node has a quarter of a core (``cpu_share`` 0.25) waits about 3 times its CPU time
    in the run queue by its node's own speed; the rule compares wall over CPU time with 1 / share, so that rank keeps
    segments_runnable (its compute is its wall time there), and only a wait beyond the quota's names the machine
    oversubscribed. The share is read from the manifest as untrusted input."""
    def figures(wait: float, share: object) -> RankFigures:
        doc = {"0": {"clean": [100.0], "captured": [200.0], "clean_run_queue": [100.0 * wait], "cpu_share": share}}
        return read_figures({"thread_cpu_us": doc})[0]

    assert figures(3.0, None).oversubscribed  # no quota: a wait 3 times the CPU time is contention
    assert not figures(3.0, 0.25).oversubscribed and figures(3.0, 0.25).cpu_share == 0.25
    assert not figures(3.9, 0.25).oversubscribed  # (1 + 3.9) x 0.25 - 1 = 0.225: below the share of 0.25
    assert figures(4.5, 0.25).oversubscribed  # two ranks sharing the node's quota would wait twice as long
    assert figures(0.3, 2.0).oversubscribed  # a quota of two cores is no slower than a core of one's own
    for junk in ("0.25", -1, float("nan"), True, 1e9):
        assert figures(3.0, junk).cpu_share is None
