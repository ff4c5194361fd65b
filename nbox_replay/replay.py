"""``nbox replay``: one frozen config, one library function (the CLI only parses into :class:`ReplayConfig`).

A replay runs twice: under the **baseline** scenario (the fabric the bundle was recorded on: the shipped,
calibrated ``loopback_cpu`` for a CPU bundle, ``dgx_h100_400g`` for a GPU bundle or a bare ET, or
``--baseline``) at the recorded world size, and under the **what-if** (``--what-if``, ``--set``,
``--world-size``; by default the baseline's scenario). With ``--clock virtual`` both run in virtual time
(recorded compute, no torch, deterministic; with ``--compute live`` the operators are first re-executed on
this device to measure them, :mod:`nbox_replay.measure`, and the simulation uses those durations). With
``--clock real`` both run live on this machine (:mod:`nbox_replay.live`) in interleaved, counterbalanced
pairs of launches, one timed repetition each (:func:`nbox_replay.live.replay_paired`): the iteration times
and the breakdown are what the live workers measured, and the report gives the paired speed-ups' spread.
A setting a live replay cannot honour (``compute_scale`` asking live operators to run faster than this
device) is refused before any rank starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emulator_core.scenario import Scenario
from emulator_core.scenario_files import SCENARIOS_DIR, load_scenario
from emulator_core.world import resize, what_if_world
from nbox_replay.graph import RankGraph, load_rank
from nbox_replay.report import ReplayReport
from nbox_replay.source import ReplaySource, open_source
from nbox_replay.summary import RunSummary, summarize_sim
from nbox_replay.virtual import simulate
from nbox_trace.errors import InvalidInputError

if TYPE_CHECKING:
    from nbox_replay.live import LiveResult

__all__ = ["ReplayConfig", "baseline_scenario", "run_replay"]

CLOCKS = ("real", "virtual")
COMPUTES = ("auto", "live", "recorded")
DEVICES = ("auto", "cpu", "cuda")


class ReplayConfigError(InvalidInputError):
    """An invalid combination of replay options (the message names the option)."""


@dataclass(frozen=True)
class ReplayConfig:
    """What ``nbox replay`` was asked (validated at construction; errors name the option).

    Attributes:
        bundle: a bundle directory, or a bare Chakra ET (directory or ``<prefix>``).
        what_if: the what-if scenario TOML (None: the baseline's).
        overrides: ``key=value`` overrides applied to the what-if.
        world_size: the what-if world size (None: the recorded one).
        baseline: the baseline scenario TOML (None: chosen from the recorded device, module docstring).
        compute: ``live``, ``recorded`` or ``auto`` (live on the real clock when the device allows it,
            recorded on the virtual clock); ``live`` on the virtual clock measures the operators here first.
        clock: ``real`` (live, on this machine) or ``virtual`` (simulated time).
        ranks: global ranks to replay (None: every recorded rank).
        iterations: timed repetitions of the captured iteration(s) per run (>= 1).
        warmup: untimed repetitions before them (real clock).
        device: ``auto``, ``cpu`` or ``cuda`` (real clock).
        out: directory for the per-rank Perfetto timelines (None: none written).
        timeout_s: deadline of a real-clock run.
    """

    bundle: str
    what_if: Path | None = None
    overrides: tuple[str, ...] = ()
    world_size: int | None = None
    baseline: Path | None = None
    compute: str = "auto"
    clock: str = "real"
    ranks: tuple[int, ...] | None = None
    iterations: int = 3
    warmup: int = 1
    device: str = "auto"
    out: Path | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name, value, allowed in (("--clock", self.clock, CLOCKS), ("--compute", self.compute, COMPUTES),
                                     ("--device", self.device, DEVICES)):
            if value not in allowed:
                raise ReplayConfigError(f"{name} {value!r}: must be one of {', '.join(allowed)}")
        if self.iterations < 1 or self.warmup < 0:
            raise ReplayConfigError(f"--iterations must be >= 1 and --warmup >= 0, got {self.iterations}, "
                                    f"{self.warmup}")
        if self.world_size is not None and self.world_size < 1:
            raise ReplayConfigError(f"--world-size must be >= 1, got {self.world_size}")
        if self.ranks is not None and (not self.ranks or len(set(self.ranks)) != len(self.ranks)):
            raise ReplayConfigError(f"--ranks must name distinct ranks, got {list(self.ranks)}")
        if self.timeout_s <= 0:
            raise ReplayConfigError(f"--timeout must be > 0, got {self.timeout_s}")


def baseline_scenario(source: ReplaySource, path: Path | None) -> tuple[Scenario, str]:
    """The baseline scenario at the recorded world size, and its name (module docstring)."""
    if path is None:
        name = "loopback_cpu" if source.device == "cpu" else "dgx_h100_400g"
        path = SCENARIOS_DIR / f"{name}.toml"
    return resize(load_scenario(path), source.recorded_world), path.stem


def _load(source: ReplaySource, ranks: Sequence[int] | None) -> dict[int, RankGraph]:
    chosen = list(source.ranks) if ranks is None else list(ranks)
    missing = [r for r in chosen if r not in source.trace_set.files]
    if missing:
        raise InvalidInputError(f"--ranks: rank {missing[0]} is not in {source.path} (ranks: {source.ranks})")
    return {r: load_rank(source.trace_set.files[r], r) for r in chosen}


def run_replay(config: ReplayConfig, progress: Callable[[str], None] | None = None) -> ReplayReport:
    """Replay ``config.bundle`` under the baseline and the what-if; see the module docstring.

    Raises:
        NboxError subclasses: bad input (bundle, scenario, options), a replay that cannot finish.
    """
    say = progress or (lambda _msg: None)
    source = open_source(config.bundle)
    notices: list[str] = []
    compute, clock = config.compute, config.clock
    if source.device == "unknown":
        if compute == "live":
            raise ReplayConfigError(f"{config.bundle}: a bare Chakra ET holds no operator schemas to re-execute; "
                                    f"use --compute recorded")
        if clock == "real":
            notices.append("a bare Chakra ET (no manifest): replayed in virtual time with recorded compute")
            clock = "virtual"
        compute = "recorded"
    needs_recorded = source.manifest is not None and source.manifest.extra.get("replay_compute") == "recorded"
    if needs_recorded:  # e.g. `nbox bundle anonymize --level strict`: no shapes to re-execute operators with
        if compute == "live":
            raise ReplayConfigError(f"{config.bundle}: this bundle carries no tensor shapes (manifest "
                                    f"replay_compute = recorded, an anonymized bundle?); use --compute recorded")
        if compute == "auto":
            notices.append("the bundle asks for recorded compute (no tensor shapes): operators are not re-executed")
            compute = "recorded"
    if compute == "auto":
        compute = "recorded" if clock == "virtual" else "live"
    device = _device(config, source)
    if source.device == "cuda" and device == "cpu" and compute == "live":
        notices.append("a CUDA bundle on a machine without CUDA: compute replayed with recorded durations")
        compute = "recorded"
    base, base_name = baseline_scenario(source, config.baseline)
    what_if_path = config.what_if or config.baseline or SCENARIOS_DIR / f"{base_name}.toml"
    what_if_base = load_scenario(what_if_path, config.overrides)
    what_if_name = what_if_path.stem + "".join(f" {o}" for o in config.overrides)
    world = what_if_world(what_if_base, config.overrides, source.recorded_world, config.world_size)
    what_if = resize(what_if_base, world)
    replayed = sorted(config.ranks or source.ranks)
    if clock == "real":  # before any rank starts
        from nbox_replay.live import live_refusal

        for label, scenario in (("baseline", base), ("what-if", what_if)):
            why = live_refusal(scenario, replayed, compute)
            if why:
                raise ReplayConfigError(f"{label}: {why}")
    say(f"loading {len(config.ranks or source.ranks)} rank trace(s) from {source.path}")
    graphs = _load(source, config.ranks)
    coverage: float | None = None
    fallbacks: dict[str, int] = {}
    if clock == "virtual" and compute == "live":
        from nbox_replay.measure import measure_compute

        say(f"measuring the operators of {len(graphs)} rank(s) on {device} (no communication)")
        measured = measure_compute(graphs, {r: source.trace_set.files[r] for r in graphs}, device=device,
                                   warmup=config.warmup, iterations=config.iterations, timeout_s=config.timeout_s)
        graphs, coverage, fallbacks = measured.graphs, measured.coverage, measured.fallbacks
    reps = config.iterations
    say("virtual replay: baseline")
    base_sim = simulate(graphs, base, groups=source.groups, recorded_world=source.recorded_world, repetitions=reps)
    say("virtual replay: what-if")
    wi_sim = simulate(graphs, what_if, groups=source.groups, recorded_world=source.recorded_world, repetitions=reps)
    baseline = summarize_sim(base_sim, label="baseline", scenario=base_name)
    whatif = summarize_sim(wi_sim, label="what-if", scenario=what_if_name)
    report = ReplayReport(source.path, source.recorded_world, source.device, sorted(graphs), compute, clock,
                          source.observed, baseline, whatif, coverage=coverage, fallbacks=fallbacks,
                          unpriced=wi_sim.unpriced, notices=notices)
    if clock == "real":
        _run_live(config, source, graphs, base, what_if, device, report, say)
    if config.out is not None:
        from nbox_replay.timeline import write_timelines

        written = write_timelines(base_sim, graphs, config.out, label="baseline")
        written += write_timelines(wi_sim, graphs, config.out, label="what_if")
        report.timelines = [str(p) for p in written]
    return report


def _device(config: ReplayConfig, source: ReplaySource) -> str:
    """Where live operators run: ``--device``, or for ``auto`` CUDA for a CUDA bundle when this machine has it."""
    if config.device != "auto":
        return config.device
    return "cuda" if source.device == "cuda" and _cuda_available() else "cpu"


def _run_live(config: ReplayConfig, source: ReplaySource, graphs: dict[int, RankGraph], base: Scenario,
              what_if: Scenario, device: str, report: ReplayReport, say: Callable[[str], None]) -> None:
    """Replace the report's iteration times and breakdowns by what interleaved live runs measured (module
    docstring); the virtual model's iteration time stays beside them (``modeled_iteration_us``)."""
    from nbox_replay.live import LiveConfig, replay_paired

    compute = report.compute
    files = {r: source.trace_set.files[r] for r in graphs}
    configs = [LiveConfig(files=files, groups=source.groups, recorded_world=source.recorded_world,
                          scenario=scenario, compute=compute, device=device, warmup=config.warmup,
                          iterations=1, timeout_s=config.timeout_s) for scenario in (base, what_if)]
    say(f"live replay ({compute} compute, {device}): baseline at world size {base.world_size} and what-if at "
        f"world size {what_if.world_size}, {config.iterations} interleaved pairs")
    paired = replay_paired(configs[0], configs[1], config.iterations, say)
    _apply_live(report.baseline, paired.baseline)
    _apply_live(report.what_if, paired.what_if)
    report.paired_speedups = paired.speedups()
    if compute == "live":
        report.coverage = paired.what_if.coverage
        report.fallbacks = dict(paired.what_if.fallbacks)


def _apply_live(summary: RunSummary, live: LiveResult) -> None:
    """The live run's measured times into ``summary``: its repetitions, and the breakdown that explains their
    median (:meth:`nbox_replay.live.LiveResult.job_breakdown`: the parts sum to it)."""
    summary.modeled_iteration_us = summary.median_us
    summary.iteration_us = list(live.iteration_us)
    parts, rank = live.job_breakdown()
    summary.compute_us, summary.exposed_comm_us = parts.compute_us, parts.exposed_comm_us
    summary.waiting_us, summary.overlapped_comm_us = parts.waiting_us, parts.overlapped_comm_us
    summary.slowest_rank = rank
    summary.clock = "real"


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
