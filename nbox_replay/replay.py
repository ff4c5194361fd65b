"""``nbox replay``: one frozen config, one library function (the CLI only parses into :class:`ReplayConfig`).

A replay runs twice: under the **baseline** scenario (the fabric the bundle was recorded on: the shipped,
calibrated ``loopback_cpu`` for a CPU bundle, ``dgx_h100_400g`` for a GPU bundle or a bare ET, or
``--baseline``) at the recorded world size, and under the **what-if** (``--what-if``, ``--set``,
``--world-size``; by default the baseline's scenario) at the world size of
:func:`emulator_core.scenario.world.load_what_if`'s rule (``--world-size``, else ``--set world_size``, else the what-if
file's, else the recorded one; the report says which). With ``--clock virtual`` both run in virtual time
(recorded compute, no torch, deterministic; with ``--compute live`` the operators are first re-executed on
this device to measure them, :mod:`nbox_replay.live.measure`, and the simulation uses those durations). With
``--clock real`` both run live on this machine (:mod:`nbox_replay.live`) in interleaved, counterbalanced
pairs of launches, one timed repetition each (:func:`nbox_replay.live.run.replay_paired`): the iteration times
and the breakdown are what the live workers measured, and the report gives the paired speed-ups' spread;
live compute is padded for the host work the replay does not re-run, and with ``replay.host_work=match`` credited
for the replay's own work beyond the real thread's (:mod:`nbox_replay.live.hostwork`).
A setting a live replay cannot honour (``compute_scale`` asking live operators to run faster than this
device) is refused before any rank starts.

Recorded compute is corrected for the profiler's overhead where the bundle carries the figures
(:mod:`nbox_replay.inputs.profiler`; ``replay.profiler_correction``): in virtual time and in a live replay with
``--compute recorded``, the same rule and factors; the report says which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator_core.scenario import (
    SCENARIOS_DIR,
    MeshPlan,
    Scenario,
    describe_changes,
    load_what_if,
    parse_placement,
    scenario_mesh,
)
from nbox_replay.inputs import (
    COMPUTE,
    Correction,
    RankGraph,
    ReplaySource,
    captured_iterations,
    correct_graphs,
    describe_mesh,
    load_rank,
    open_source,
    plan_correction,
    plan_for,
    relabel,
    set_world_size,
)
from nbox_replay.live import HostPad
from nbox_replay.report import RankChoiceError, ReplayReport, RunSummary, summarize_sim
from nbox_replay.settings import (
    HOST_WORK,
    ReplayConfig,
    ReplayConfigError,
    global_batch_size,
)
from nbox_replay.virtual import median_index, simulate, slowest_rank
from nbox_trace.bundle import THREAD_CPU_KEY, traces_directory
from nbox_trace.errors import InvalidInputError
from nbox_trace.mesh import RecordedMesh, parse_names
from nbox_trace.progress import Report

if TYPE_CHECKING:
    from nbox_replay.live import LiveResult

__all__ = ["ReplayConfig", "baseline_path", "baseline_scenario", "global_batch_size", "run_replay"]

def baseline_path(source: ReplaySource, path: Path | None = None) -> Path:
    """The baseline scenario file: ``path`` (``--baseline``), else chosen from the recorded device (module
    docstring: ``loopback_cpu`` for a CPU bundle, ``dgx_h100_400g`` for a CUDA bundle or a bare ET)."""
    if path is not None:
        return path
    return SCENARIOS_DIR / ("loopback_cpu.toml" if source.device == "cpu" else "dgx_h100_400g.toml")


def baseline_scenario(source: ReplaySource, path: Path | None) -> tuple[Scenario, str]:
    """The baseline scenario at the recorded world size, and its name (module docstring)."""
    path = baseline_path(source, path)
    return load_what_if(None, recorded_world=source.recorded_world, default=path)[0], path.stem


def _load(source: ReplaySource, ranks: Sequence[int] | None) -> dict[int, RankGraph]:
    chosen = list(source.ranks) if ranks is None else list(ranks)
    missing = [r for r in chosen if r not in source.trace_set.files]
    if missing:
        raise InvalidInputError(f"--ranks: rank {missing[0]} is not in {source.path} (ranks: {source.ranks})")
    return {r: load_rank(source.trace_set.files[r], r) for r in chosen}


def run_replay(config: ReplayConfig, progress: Report | None = None) -> ReplayReport:
    """Replay ``config.bundle`` (a bundle directory, a ``.nbox`` archive or a bare Chakra ET) under the baseline
    and the what-if; see the module docstring.

    Raises:
        NboxError subclasses: bad input (bundle, scenario, options), a replay that cannot finish.
    """
    with traces_directory(config.bundle) as root:  # an archive is unpacked for the whole replay
        return _replay(config, root, progress)


def _replay(config: ReplayConfig, root: Path, progress: Report | None) -> ReplayReport:
    say = progress or (lambda _msg: None)
    source = open_source(root, name=config.bundle)
    notices: list[str] = []
    compute, clock = config.compute, config.clock
    if source.device == "unknown":
        if compute == "live":
            raise InvalidInputError(f"{config.bundle}: a bare Chakra ET holds no operator schemas to re-execute; "
                                    f"use --compute recorded")
        if clock == "real":
            notices.append("a bare Chakra ET (no manifest): replayed in virtual time with recorded compute")
            clock = "virtual"
        compute = "recorded"
    needs_recorded = source.manifest is not None and source.manifest.extra.get("replay_compute") == "recorded"
    if needs_recorded:  # e.g. `nbox bundle anonymize --level strict`: no shapes to re-execute operators with
        if compute == "live":
            raise InvalidInputError(f"{config.bundle}: this bundle carries no tensor shapes (manifest "
                                    f"replay_compute = recorded, an anonymized bundle?); use --compute recorded")
        if compute == "auto":
            notices.append("the bundle asks for recorded compute (no tensor shapes): operators are not re-executed")
            compute = "recorded"
    compute = _cuda_compute(config, source, compute, notices)
    if compute == "auto":
        compute = "recorded" if clock == "virtual" else "live"
    device = _device(config, source)
    base, base_name = baseline_scenario(source, config.baseline)
    what_if_path = config.what_if or config.baseline or SCENARIOS_DIR / f"{base_name}.toml"
    replayed = sorted(config.ranks or source.ranks)
    recorded_mesh = source.mesh(parse_names(config.recorded_mesh) if config.recorded_mesh else None)
    plan = _plan(config, clock, recorded_mesh, source.groups, replayed, notices)
    what_if, world = load_what_if(config.what_if, config.overrides, recorded_world=source.recorded_world,
                                  requested=plan.world if plan else config.world_size, default=what_if_path,
                                  requested_by=plan.text if plan else "--world-size")
    what_if_name = what_if_path.stem + "".join(f" {o}" for o in config.overrides)
    _mesh_notice(recorded_mesh, plan, what_if.world_size, notices)
    truth = None
    if config.truth is not None:  # checked before any rank starts
        from nbox_replay.truth import open_truth

        truth = open_truth(config.truth, source, what_if.world_size)
    if clock == "real":  # before any rank starts
        from nbox_replay.live import live_refusal

        for label, scenario in (("baseline", base), ("what-if", what_if)):
            why = live_refusal(scenario, replayed, compute)
            if why:
                raise ReplayConfigError(f"{label}: {why}")
    say(f"loading {len(config.ranks or source.ranks)} rank trace(s) from {source.path}")
    graphs = _load(source, config.ranks)
    waited = ", ".join(f"{g.waited_us() / 1e3:.1f} ms (rank {r})" for r, g in sorted(graphs.items()) if g.waited_us())
    if waited:
        notices.append(f"communication waited for inside the operators that issued it, taken out of their recorded "
                       f"compute (nbox_replay.inputs.graph.waits_inside), per pass: {waited}")
    correction = profiler_correction(config.profiler_correction, source, compute)
    if config.host_work is not None and compute != "live":
        raise ReplayConfigError(f"--set {HOST_WORK}={config.host_work}: pads operators re-executed live; this replay's "
                                f"compute is {compute} (use --compute live)")
    graphs = correct_graphs(graphs, correction)
    if _no_durations(graphs):
        notices.append("WARNING: the trace holds no durations (every node's is 0; imported without Kineto?): "
                       "compute counts as 0 and only the modeled collectives take time")
    coverage: float | None = None
    fallbacks: dict[str, int] = {}
    if clock == "virtual" and compute == "live":
        from nbox_replay.live import measure_compute

        say(f"measuring the operators of {len(graphs)} rank(s) on {device} (no communication)")
        measured = measure_compute(graphs, {r: source.trace_set.files[r] for r in graphs}, device=device,
                                   warmup=warmup_repetitions(config, source, graphs, device, say),
                                   iterations=config.iterations, timeout_s=config.timeout_s)
        graphs, coverage, fallbacks = measured.graphs, measured.coverage, measured.fallbacks
        if measured.heap_not_held:
            notices.append(f"the measuring worker's heap not held ({measured.heap_not_held}): its operator times "
                           f"may include page faults the real run did not take (nbox_replay.live.allocator)")
    reps = config.iterations
    say("virtual replay: baseline")
    base_sim = simulate(graphs, base, groups=source.groups, recorded_world=source.recorded_world, repetitions=reps)
    say("virtual replay: what-if")
    wi_sim = simulate(graphs, what_if, groups=source.groups, recorded_world=source.recorded_world, repetitions=reps,
                      mesh=plan)
    notices += _extrapolations(graphs, what_if)
    baseline = summarize_sim(base_sim, label="baseline", scenario=base_name, rank=config.rank)
    wi_rank = config.rank if plan is None or config.rank is None else plan.rank_map.get(config.rank, config.rank)
    whatif = summarize_sim(wi_sim, label="what-if", scenario=what_if_name, rank=wi_rank)
    lines, mesh_doc = describe_mesh(recorded_mesh, plan, what_if)
    report = ReplayReport(source.path, source.recorded_world, source.device, sorted(graphs), compute, clock,
                          source.observed, baseline, whatif, coverage=coverage, fallbacks=fallbacks,
                          unpriced=wi_sim.unpriced, notices=notices, world=world, mesh_lines=lines, mesh=mesh_doc,
                          profiler=correction, changes=describe_changes(config.what_if, config.overrides, what_if,
                                                                        config.mesh))
    if clock == "real":
        _run_live(config, source, graphs, base, what_if, device, report, say, correction)
    if truth is not None and config.truth is not None:
        from nbox_replay.truth import compare_truth

        say(f"the truth: {config.truth} under the what-if")
        recorded = source.observed.get("median") if isinstance(source.observed, Mapping) else None
        report.truth = compare_truth(config.truth, truth[0], truth[1], what_if, report.what_if, report.baseline,
                                     float(recorded) if isinstance(recorded, (int, float)) else None,
                                     config.profiler_correction)
    if config.out is not None:
        from nbox_replay.report import write_timelines

        written = write_timelines(base_sim, graphs, config.out, label="baseline")
        written += write_timelines(wi_sim, graphs if plan is None else relabel(graphs, plan), config.out,
                                   label="what_if")
        report.timelines = [str(p) for p in written]
    return report


def profiler_correction(mode: str, source: ReplaySource, compute: str) -> Correction:
    """The correction of recorded compute for the profiler (:mod:`nbox_replay.inputs.profiler`) that ``mode`` asks for:
    none when compute is re-executed (``live``: only its fallbacks play recorded durations, left as they are)."""
    if compute != "recorded" and mode != "off":
        return Correction(None, why_not="compute is re-executed (--compute live); its fallbacks play their recorded "
                                        "durations as they are")
    return plan_correction(mode, source.manifest.observed if source.manifest is not None else None)


def _extrapolations(graphs: dict[int, RankGraph], scenario: Scenario) -> list[str]:
    """A notice per recorded collective whose calibration the what-if applies beyond the ranks it measured
    (``pricing.extrapolation_note`` on the world group, the largest)."""
    from emulator_core.pricing import extrapolation_note, group_shape

    shape = group_shape(scenario)
    names = sorted({c.collective for g in graphs.values() for c in g.comm.values()})
    return [note for name in names if (note := extrapolation_note(scenario, name, shape)) is not None]


def _plan(config: ReplayConfig, clock: str, recorded: RecordedMesh, groups: Mapping[str, Sequence[int]],
          replayed: Sequence[int], notices: list[str]) -> MeshPlan | None:
    """The what-if mesh: ``--mesh``, else the what-if scenario's (``[mesh]`` of the ``--what-if`` file, ``--set
    mesh.<dim>=N``); placed by ``--placement``, else the scenario's ``mesh_placement``. None: no mesh (the
    world-size rule)."""
    asked = scenario_mesh(config.what_if, config.overrides)
    placement = parse_placement(config.placement) if config.placement else (asked.placement if asked else None)
    placement_by = "--placement" if config.placement else "mesh_placement"
    mesh: str | tuple[tuple[str, int], ...]
    if config.mesh is not None:
        mesh, text = config.mesh, f"--mesh {config.mesh}"
        if asked is not None:
            notices.append(f"--mesh {config.mesh} replaces the what-if scenario's mesh ({asked.text})")
    elif asked is not None:
        mesh, text = asked.degrees, asked.text
        if clock != "virtual":
            raise ReplayConfigError(f"{text}: a what-if mesh is replayed in virtual time only; add --clock virtual "
                                    f"(a live replay scales the world with --world-size)")
    elif config.placement is not None:
        raise ReplayConfigError("--placement: places a what-if mesh; give --mesh (or a [mesh] in the what-if) too")
    elif config.global_batch == "fixed":
        raise ReplayConfigError("--global-batch fixed: strong scaling changes the data-parallel degree of a mesh; "
                                "give --mesh (or a [mesh] in the what-if)")
    else:
        return None
    return plan_for(recorded, mesh, groups=groups, replayed=replayed, world_size=config.world_size,
                    placement=placement or None, text=text, set_world=set_world_size(config.overrides),
                    placement_by=placement_by, batch_size=config.batch_size)


def _mesh_notice(recorded: RecordedMesh, plan: MeshPlan | None, world: int, notices: list[str]) -> None:
    """Say when the world-size rule plays a recording of several mesh dimensions at another size: only the world
    group grows, every other group keeps its members (``--mesh`` scales the dimensions)."""
    if plan is None and recorded.ok and len(recorded.dims) > 1 and world != recorded.world:
        notices.append(f"the recorded mesh is {recorded.describe()}: at world size {world} only the world group "
                       f"grows and every other group keeps its members; --mesh (with --clock virtual) scales "
                       f"the mesh's dimensions instead")


def _no_durations(graphs: dict[int, RankGraph]) -> bool:
    """The traces have compute nodes, and every node's recorded duration and issue cost is 0 (a trace imported
    without Kineto); a trace of collectives alone (an ASTRA-sim microbenchmark) needs none and is not flagged."""
    has_compute = any(COMPUTE in g.kind for g in graphs.values())
    return has_compute and all(not any(g.duration_us) and not any(g.issue_us) for g in graphs.values())


def _cuda_compute(config: ReplayConfig, source: ReplaySource, compute: str, notices: list[str]) -> str:
    """A CUDA bundle replayed without CUDA (``--device cpu``, or ``auto`` on a machine without CUDA): its kernels
    cannot be re-executed, so ``auto`` compute is recorded, with one notice (the GPU baseline is chosen from
    the device, :func:`baseline_path`); ``--compute live`` is refused. Otherwise ``compute`` unchanged."""
    if source.device != "cuda" or _device(config, source) == "cuda":  # one rule for where operators run
        return compute
    hw = source.manifest.hardware if source.manifest is not None else {}
    gpus = f" ({hw['gpu_count']} x {hw['gpu_name']})" if hw.get("gpu_name") and hw.get("gpu_count") else ""
    why = "--device cpu" if config.device == "cpu" else "this machine has no CUDA"
    if compute == "live":
        raise ReplayConfigError(f"--compute live: {config.bundle} was recorded on CUDA{gpus} and {why} to "
                                f"re-execute its kernels; use --compute recorded (the default here)")
    notices.append(f"recorded on CUDA{gpus}, and {why}: recorded compute (kernels not re-executed), baseline "
                   f"{baseline_path(source, config.baseline).stem}")
    return "recorded"


def _device(config: ReplayConfig, source: ReplaySource) -> str:
    """Where live operators run: ``--device``, or for ``auto`` CUDA for a CUDA bundle when this machine has it."""
    if config.device != "auto":
        return config.device
    return "cuda" if source.device == "cuda" and _cuda_available() else "cpu"


def _run_live(config: ReplayConfig, source: ReplaySource, graphs: dict[int, RankGraph], base: Scenario,
              what_if: Scenario, device: str, report: ReplayReport, say: Report,
              correction: Correction) -> None:
    """Replace the report's iteration times and breakdowns by what interleaved live runs measured (module
    docstring); the virtual model's iteration time stays beside them (``modeled_iteration_us``)."""
    from nbox_replay.live import LiveConfig, replay_paired

    compute = report.compute
    files = {r: source.trace_set.files[r] for r in graphs}
    host, why_not = _host_cpu(config, source, graphs, compute, device)
    warmup = warmup_repetitions(config, source, graphs, device, say)
    configs = [LiveConfig(files=files, groups=source.groups, recorded_world=source.recorded_world,
                          scenario=scenario, compute=compute, device=device, warmup=warmup,
                          iterations=1, timeout_s=config.timeout_s, nodes=config.nodes,
                          profiler=correction.worker_doc(), host_cpu_us=host,
                          host_credit=config.host_work == "match")
               for scenario in (base, what_if)]
    say(f"live replay ({compute} compute, {device}): baseline at world size {base.world_size} and what-if at "
        f"world size {what_if.world_size}, {config.iterations} interleaved pairs")
    paired = replay_paired(configs[0], configs[1], config.iterations, say)
    _apply_live(report.baseline, paired.baseline)
    _apply_live(report.what_if, paired.what_if)
    report.paired_speedups = paired.speedups()
    if compute == "live":
        report.host_work = host_work_doc(paired.baseline.host_pad, why_not,  # the first baseline launch's
                                         paired.baseline.heap_not_held, config.host_work or "pad")
        report.coverage = paired.what_if.coverage
        report.fallbacks = dict(paired.what_if.fallbacks)


#: ``--warmup-s`` on CUDA when not given (seconds). On a lent H100 a live replay's repetitions ran about twice as
#: long after one warm-up repetition as after a second of them, and fell steadily over the first second: the device
#: (or its host) runs slow until it has been busy a while (bench/gpu_check.py; docs/results.md, "The GPU kit"). On
#: a CPU only a worker's first repetition is cold (``--warmup``, docs/replay.md), so 0 there.
CUDA_WARMUP_S = 1.0
#: The most repetitions ``--warmup-s`` may ask for.
MAX_WARMUP_REPETITIONS = 100_000
#: A repetition is taken to last at least this long when sizing the warm-up (us; a recorded median below it is
#: not believed).
MIN_REPETITION_US = 1.0


def warmup_repetitions(config: ReplayConfig, source: ReplaySource, graphs: Mapping[int, RankGraph], device: str,
                       say: Callable[[str], None] | None = None) -> int:
    """The warm-up repetitions of a live run: ``--warmup``, or more where ``--warmup-s`` (default
    :data:`CUDA_WARMUP_S` on CUDA, 0 on a CPU) asks for a longer warm-up: that time over one repetition's, taken
    as the recorded median iteration (``observed``; the recorded compute of the longest rank for a bundle without
    it) times the captured iterations a repetition replays. Every rank runs the same number (its collectives
    pair across ranks), so it is fixed here, before launch, not by each worker's clock. The virtual clock's
    measuring worker (``--compute live``) runs the ranks one after another, so there each rank warms that long."""
    seconds = config.warmup_s if config.warmup_s is not None else (CUDA_WARMUP_S if device == "cuda" else 0.0)
    if seconds <= 0 or not graphs:
        return config.warmup
    times = source.observed  # the manifest's observed iteration time, untrusted: checked before use
    median = times.get("median") if isinstance(times, Mapping) else None
    captured = max(captured_iterations(g)[1] for g in graphs.values())
    if (isinstance(median, (int, float)) and not isinstance(median, bool) and math.isfinite(median)
            and median >= MIN_REPETITION_US):
        rep_us = float(median) * captured
        basis = f"the recorded {median / 1e3:.2f} ms x {captured} iteration(s)"
    else:
        rep_us = max(g.compute_us() for g in graphs.values())
        basis = f"the recorded compute, {rep_us / 1e3:.2f} ms"
    need = math.ceil(seconds * 1e6 / max(rep_us, MIN_REPETITION_US))
    reps = min(MAX_WARMUP_REPETITIONS, max(config.warmup, need))
    if reps > config.warmup and say is not None:
        say(f"warm-up: {reps} repetitions, at least {seconds:g} s at {basis} per repetition (--warmup-s; "
            f"{device}: a replay runs slow until the device has been busy a while)")
    return reps


def _host_cpu(config: ReplayConfig, source: ReplaySource, graphs: Mapping[int, RankGraph], compute: str,
              device: str) -> tuple[dict[int, float] | None, str]:
    """Per replayed rank, the real training thread's time on a CPU and waiting for one per clean iteration (the
    CPU time alone for a bundle without the run-queue figure) for the host-work padding
    (:mod:`nbox_replay.live.hostwork`; on CUDA waits on the host before launches, :mod:`nbox_replay.live.streams`),
    or None and why it is not applied. ``match`` on CUDA is refused (ReplayConfigError)."""
    if compute != "live":
        return None, ""
    if config.host_work == "off":
        return None, f"{HOST_WORK}=off"
    if device != "cpu" and config.host_work == "match":  # on CUDA the pad is the host's waits before launches
        raise ReplayConfigError(f"--set {HOST_WORK}=match: credits a replay on a CPU for its own work beyond the "
                                f"real thread's; on {device} the pad only lengthens the host's time (use pad or off)")
    if config.warmup < 1:
        return None, "--warmup 0 leaves no repetition to measure the replay's own time on"
    figures = plan_correction("on", source.manifest.observed if source.manifest is not None else None).figures
    host = {r: f.clean_cpu_us + (f.clean_run_queue_us or 0.0) for r, f in figures.items() if r in graphs}
    if not host:
        return None, (f"the bundle carries no clean CPU time per iteration for the replayed ranks "
                      f"(observed.{THREAD_CPU_KEY})")
    return host, ""


def host_work_doc(pads: Mapping[int, HostPad], why_not: str,
                  heap_not_held: Mapping[int, str] | None = None, mode: str = "pad") -> dict[str, Any]:
    """The report's host-work line and figures: per rank, the padding (or, with ``mode`` ``match``, the credit)
    its worker applied, and why a worker's heap was not held (:mod:`nbox_replay.live.allocator`; with or without a
    pad)."""
    heap = dict(heap_not_held or {})
    heap_doc = {str(r): why for r, why in sorted(heap.items())}
    if not pads:
        line = f"live operators not padded for host work: {why_not}"
        line += "".join(f"; rank {r}'s heap not held ({why})" for r, why in sorted(heap.items()))
        return {"line": line, "ranks": {}, "why_not": why_not, "mode": mode, "heap_not_held": heap_doc}
    parts = []
    for r, p in sorted(pads.items()):
        if p.why_not:
            parts.append(f"rank {r} not padded ({p.why_not})")
        else:
            amount = f"credited {-p.pad_us / 1e3:.2f} ms" if p.pad_us < 0 else f"+{p.pad_us / 1e3:.2f} ms"
            parts.append(f"rank {r} {amount} per iteration (x{p.factor:.2f}: the real thread "
                         f"{p.clean_us / 1e3:.2f} ms on a CPU or waiting for one, the replay's "
                         f"{p.replay_us / 1e3:.2f} ms)")
            if mode == "match":
                parts[-1] = parts[-1][:-1] + (f" outside its waits, its thread busy {p.busy_us / 1e3:.2f} ms), its "
                                              f"waits caught up {p.caught_up_us / 1e3:.2f} ms")
        if r in heap:
            parts[-1] += f", its heap not held ({heap[r]})"
    parts += [f"rank {r}'s heap not held ({why})" for r, why in sorted(heap.items()) if r not in pads]
    head = ("live operators padded for the host work the replay does not re-run, and credited for the replay's own "
            f"beyond the real thread's ({HOST_WORK}=match): " if mode == "match" else
            f"live operators padded for the host work the replay does not re-run ({HOST_WORK}=pad): ")
    return {"line": head + "; ".join(parts), "ranks": {str(r): p.to_dict() for r, p in sorted(pads.items())},
            "why_not": None, "mode": mode, "heap_not_held": heap_doc}


def _apply_live(summary: RunSummary, live: LiveResult) -> None:
    """The live run's measured times into ``summary``: its iterations (each captured iteration of every timed
    repetition, :mod:`nbox_replay.live`), and the shown rank's measured breakdown of each (the rank that ended
    the median iteration last unless ``--rank`` picked one; the parts sum to each iteration's time,
    :mod:`nbox_replay.report.summary`); the model's time stays as ``modeled_iteration_us``."""
    summary.modeled_iteration_us = summary.median_us
    summary.iteration_us = list(live.iteration_us)
    j = median_index(summary.iteration_us)
    rank = summary.rank if summary.rank_chosen else slowest_rank(live.rank_end_us, j)
    if rank not in live.rank_breakdown:
        raise RankChoiceError(f"--rank {rank}: not a replayed rank (replayed: {sorted(live.rank_breakdown)})")
    summary.breakdowns = list(live.rank_breakdown[rank])  # measured by the workers (issue 13), not the model's
    if live.per_repetition != summary.captured:
        summary.iterations_note = (f"{summary.iterations_note}; live: {live.per_repetition} iteration(s) per "
                                   f"repetition (the ranks' captured iterations disagree, so each repetition is "
                                   f"timed whole)")
    summary.rank = rank
    summary.clock = "real"


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
