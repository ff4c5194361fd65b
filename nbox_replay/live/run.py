"""Live replay (``--clock real``): re-execute a bundle's ranks on this machine, collectives emulated.

:func:`replay_live` launches one process per replayed rank with nbox's one launcher (:mod:`nbox_trace.launch`: N
ranks of ``python -m nbox_replay.live._worker``); each walks its rank's graph on the real clock, compute live
(:mod:`nbox_replay.live.ops`) or at its recorded durations, and collectives go through the ``nbox`` backend, which
presents the what-if world of W ranks and completes each collective at the modeled time (:mod:`emulator_core.backend`).

An iteration is a captured iteration, as in the virtual replay: each worker reports when it ended each captured
iteration of a repetition on its own clock from the repetition's start (no clock is shared across nodes), the job's
windows follow by :func:`nbox_replay.virtual.breakdown.job_windows`, and each rank's spans are cut into the breakdown
by :func:`nbox_replay.virtual.breakdown.partition` (:attr:`LiveResult.rank_breakdown`). Scenario keys that act on
compute are applied by the workers, once (the compute factor: straggler slowdown over ``compute_scale``;
``overlap = "serialize"``); the backend gets the network part only (:func:`network_scenario`). A factor below 1 with
``compute="live"`` is refused before any rank starts (:func:`live_refusal`).

:func:`replay_paired` alternates launches of two scenarios, one timed repetition each, in counterbalanced pairs (A B,
B A, ...), each pair giving one what-if/baseline ratio per captured iteration. Every run has a deadline
(``timeout_s``): past it the ranks are stopped and a :class:`LiveReplayError` names those that had not finished; a
rank that fails names its node and error. Times are microseconds. Temporary files live in a temporary directory.
This module does not import torch (the workers do). Why: docs/design/live-replay.md.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from emulator_core.scenario import Scenario, dump_toml
from nbox_replay.live.hostwork import HostPad
from nbox_replay.live.workerconfig import WorkerConfig
from nbox_replay.report import speedup
from nbox_replay.virtual import Breakdown, CommSpan, RankIntervals, job_windows, partition
from nbox_trace.errors import InputNotFoundError, InvalidInputError, NboxError
from nbox_trace.jsonio import read_json_object
from nbox_trace.launch import Launch, LaunchResult, Nodes, run, seconds_text, then_failed
from nbox_trace.progress import Report, Step

__all__ = ["LiveConfig", "LiveConfigError", "LiveReplayError", "LiveResult", "PairedResult", "compute_factors",
           "live_refusal", "network_scenario", "replay_live", "replay_paired"]

COMPUTE_MODES = ("live", "recorded")
DEVICES = ("cpu", "cuda")


class LiveConfigError(InvalidInputError):
    """The live-replay settings are invalid (the message names the setting)."""


def compute_factors(scenario: Scenario, ranks: Sequence[int]) -> dict[int, float]:
    """Per replayed rank, how much longer its compute takes than measured or recorded: its straggler slowdown
    divided by the scenario's ``compute_scale`` (``compute_scale = 2``: twice as fast, factor 0.5)."""
    return {r: scenario.slowdown(r) / scenario.compute_scale for r in ranks}


def live_refusal(scenario: Scenario, ranks: Sequence[int], compute: str) -> str | None:
    """Why a live replay cannot honour ``scenario`` (None when it can): live compute cannot run an operator
    faster than this device does, so a compute factor below 1 (``compute_scale`` above the ranks' slowdown)
    needs recorded compute, or live compute measured and then simulated (``--clock virtual``)."""
    if compute != "live":
        return None
    fast = {r: f for r, f in compute_factors(scenario, ranks).items() if f < 1.0}
    if not fast:
        return None
    return (f"compute_scale = {scenario.compute_scale:g} asks for compute {1 / min(fast.values()):g}x faster than "
            f"this device runs it (rank {min(fast)}), which a real-clock replay of live operators cannot do; use "
            f"--compute live --clock virtual (operators measured here, then simulated) or --compute recorded")


def network_scenario(scenario: Scenario, ranks: Sequence[int]) -> Scenario:
    """The scenario the backend plays in a live replay: ``scenario`` without its compute keys and without the
    stragglers among the replayed ``ranks`` (the workers apply those; module docstring)."""
    replayed = set(ranks)
    return dataclasses.replace(scenario, compute_scale=1.0, overlap="overlap",
                               stragglers=tuple(s for s in scenario.stragglers if s.rank not in replayed))


class LiveReplayError(NboxError):
    """The live replay failed: a rank raised, died or did not finish in time (the message names it)."""

    exit_code = 1


@dataclass(frozen=True)
class LiveConfig:
    """What a live replay runs, validated at construction.

    Attributes:
        files: replayed global rank -> its ``.et`` file (the rank's trace at the recorded world size).
        groups: process group name -> its members' global ranks at the recorded world size.
        recorded_world: the world size the bundle was recorded at.
        scenario: the what-if scenario at the target world size W (``scenario.world_size``).
        compute: ``"live"`` (re-execute operators) or ``"recorded"`` (recorded durations only).
        device: ``"cpu"`` or ``"cuda"`` (where live operators run).
        warmup: repetitions of the graph run first and not timed (>= 0).
        iterations: timed repetitions (>= 1).
        timeout_s: deadline for the whole run, seconds (> 0); each wait for a collective gives up after 3/4 of it.
        nodes: several nodes (:class:`nbox_trace.launch.launcher.Nodes`): run the same replay on each; this node starts
            its share of the replayed ranks (global rank i replays ``sorted(files)[i]``), each node
            reports the whole job, and the ranks' clocks need not agree (:mod:`emulator_core.backend.clocksync`).
        profiler: the correction of recorded durations for the profiler's overhead
            (:meth:`nbox_replay.inputs.Correction.worker_doc`; None: none), applied by each worker to its graph.
        host_cpu_us: per replayed rank, the real training thread's time on a CPU and waiting for one per clean
            iteration (microseconds; the CPU time alone for a bundle without the run-queue figure):
            each worker pads its live operators for the host work the replay does not re-run
            (:mod:`nbox_replay.live.hostwork`; needs ``warmup`` >= 1). None: no padding.
        host_credit: with ``host_cpu_us``, also credit a rank whose replay is busier than the real thread
            (``replay.host_work=match``, :mod:`nbox_replay.live.hostwork`); False: lengthen only.
    """

    files: Mapping[int, Path]
    groups: Mapping[str, Sequence[int]]
    recorded_world: int
    scenario: Scenario
    compute: str = "live"
    device: str = "cpu"
    warmup: int = 1
    iterations: int = 5
    timeout_s: float = 300.0
    nodes: Nodes = field(default_factory=Nodes)
    profiler: Mapping[str, Any] | None = None
    host_cpu_us: Mapping[int, float] | None = None
    host_credit: bool = False

    def __post_init__(self) -> None:
        if not self.files:
            raise LiveConfigError("files: at least one rank must be replayed")
        w = self.scenario.world_size
        traces: dict[int, Path] = {}
        for rank, path in sorted(self.files.items()):
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < w:
                raise LiveConfigError(f"files: replayed rank {rank!r} is outside the what-if world of {w} ranks")
            p = Path(path)
            if not p.is_file():
                raise InputNotFoundError(f"{p}: trace file of rank {rank} not found")
            traces[rank] = p
        object.__setattr__(self, "files", MappingProxyType(traces))
        rw = self.recorded_world
        if isinstance(rw, bool) or not isinstance(rw, int) or rw < 1:
            raise LiveConfigError(f"recorded_world: must be an integer >= 1, got {rw!r}")
        groups: dict[str, tuple[int, ...]] = {}
        for name, members in self.groups.items():
            ms = tuple(members)
            if not ms or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ms):
                raise LiveConfigError(f"groups[{name!r}]: members must be non-negative global ranks, "
                                      f"got {list(ms)[:8]}")
            groups[str(name)] = ms
        object.__setattr__(self, "groups", MappingProxyType(groups))
        if self.compute not in COMPUTE_MODES:
            raise LiveConfigError(f"compute: must be one of {', '.join(COMPUTE_MODES)}, got {self.compute!r}")
        if self.device not in DEVICES:
            raise LiveConfigError(f"device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise LiveConfigError(f"warmup: must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 1:
            raise LiveConfigError(f"iterations: must be an integer >= 1, got {self.iterations!r}")
        if not self.timeout_s > 0:
            raise LiveConfigError(f"timeout_s: must be > 0, got {self.timeout_s!r}")
        why = live_refusal(self.scenario, sorted(traces), self.compute)
        if why:
            raise LiveConfigError(why)
        if len(traces) % self.nodes.count:
            raise LiveConfigError(f"--nnodes {self.nodes.count}: the {len(traces)} replayed rank(s) do not split "
                                  f"evenly over the nodes (choose --ranks)")


@dataclass(frozen=True)
class LiveResult:
    """The outcome of one live replay. Times in microseconds of wall time.

    Attributes:
        world_size: the what-if world size W.
        compute: ``"live"`` or ``"recorded"``.
        rank_end_us: per replayed rank and timed iteration (the captured iterations of every timed repetition, in
            order), when the rank ended it, from the start of its repetition on its own clock (the last of a
            repetition is the rank's wall time for it).
        iteration_us: per timed iteration, the job's iteration time (its window, module docstring).
        rank_compute_us / rank_wait_us: per rank and timed repetition, time in compute nodes / waiting for comm.
        coverage: share of the replayed ranks' recorded compute time that ran live (0..1).
        rank_coverage: the same per rank.
        fallbacks: compute nodes that fell back to their recorded duration, per operator name (all ranks).
        fallback_reasons: one reason per fallback operator name.
        wall_s: the whole run, launch to exit, in seconds.
        rank_breakdown: per rank and timed iteration, the job's window cut into parts
            (:func:`nbox_replay.virtual.breakdown.partition` over the intervals the worker measured).
        per_repetition: timed iterations per repetition (the captured iterations every rank reported; 1 when
            they disagree: then a repetition is one iteration).
        host_pad: per rank, the padding for host work its worker applied (:mod:`nbox_replay.live.hostwork`; empty
            when none was asked).
        heap_not_held: per rank whose worker could not hold its heap, why (:mod:`nbox_replay.live.allocator`).
    """

    world_size: int
    compute: str
    rank_end_us: dict[int, list[float]]
    iteration_us: list[float]
    rank_compute_us: dict[int, list[float]]
    rank_wait_us: dict[int, list[float]]
    coverage: float
    rank_coverage: dict[int, float]
    fallbacks: dict[str, int]
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    rank_breakdown: dict[int, list[Breakdown]] = field(default_factory=dict)
    per_repetition: int = 1
    host_pad: dict[int, HostPad] = field(default_factory=dict)
    heap_not_held: dict[int, str] = field(default_factory=dict)


def _failure(cfg: LiveConfig, work: Path, result: LaunchResult) -> LiveReplayError:
    """The error of a failed run; global rank i replays ``sorted(cfg.files)[i]``."""
    ranks = sorted(cfg.files)
    f = result.failure({i: work / f"error{r}.json" for i, r in enumerate(ranks)})
    others = [ranks[i] for i in f.others]
    if f.root_rank is not None and f.exit_text is not None:
        return LiveReplayError(f"live replay: rank {ranks[f.root_rank]} {f.exit_text}{then_failed(others)}"
                               f"{f.root_tail_text()}")
    if f.root_error is not None:
        err = f.root_error
        node = (f" at node {err.doc['node_id']} ({str(err.doc.get('node_name'))[:60]})"
                if err.doc.get("node_id") is not None else f" while {err.doc.get('phase')}")
        return LiveReplayError(f"live replay: rank {ranks[err.rank]} failed{node}: {err.type}: {err.message}"
                               f"{then_failed(others)}")
    missing = [r for r in ranks if not (work / f"rank{r}.json").is_file()]
    if f.timed_out:
        return LiveReplayError(f"live replay did not finish within {seconds_text(cfg.timeout_s)} s and was stopped; "
                               f"ranks without a result: {missing}")
    return LiveReplayError(f"live replay exited with code {f.returncode}; ranks without a result: {missing}"
                           f"{f.tail_text()}")


def launch_spec(config: LiveConfig, work: Path, config_path: Path, scenario_path: Path) -> Launch:
    """The launch of one ``nbox_replay.live._worker`` per replayed rank, standalone on this machine; the ranks see
    the what-if world through ``NBOX_WORLD_SIZE``, ``NBOX_REAL_RANKS`` and ``NBOX_SCENARIO``. ``NBOX_MOVE_DATA=0``:
    the replayed buffers carry no information, so only arrival times travel and every collective completes at the
    modeled time (moving real data, a call would complete at the later of the model and the real transfer, and the real
    transfer's own spread would show in the answer: docs/results.md)."""
    env = {"NBOX_WORLD_SIZE": str(config.scenario.world_size),
           "NBOX_REAL_RANKS": ",".join(str(r) for r in sorted(config.files)),
           "NBOX_SCENARIO": str(scenario_path), "NBOX_MOVE_DATA": "0"}
    return Launch("nbox_replay.live._worker", work / "logs", module=True, args=(str(config_path),),
                  nproc_per_node=len(config.files) // config.nodes.count, env=env, timeout_s=config.timeout_s,
                  **config.nodes.launch_fields())


def replay_live(config: LiveConfig) -> LiveResult:
    """Run the live replay described by ``config`` (module docstring) and collect every rank's result.

    Raises:
        LiveReplayError: a rank failed (names the rank and node), died, or the run passed ``timeout_s``.
    """
    started = time.monotonic()
    ranks = sorted(config.files)
    work = Path(tempfile.mkdtemp(prefix="nbox-live-"))
    try:
        scenario_path = work / "scenario.toml"
        scenario_path.write_text(dump_toml(network_scenario(config.scenario, ranks)))
        worker = WorkerConfig(
            ranks=tuple(ranks), traces={r: str(config.files[r].resolve()) for r in ranks},
            factors=compute_factors(config.scenario, ranks), serialize=config.scenario.overlap == "serialize",
            groups={k: tuple(v) for k, v in config.groups.items()}, recorded_world=config.recorded_world,
            world=config.scenario.world_size, compute=config.compute, device=config.device, warmup=config.warmup,
            iterations=config.iterations, timeout_s=config.timeout_s, result_dir=str(work),
            profiler=dict(config.profiler) if config.profiler is not None else None,
            host_cpu_us=None if config.host_cpu_us is None else {r: float(v) for r, v in config.host_cpu_us.items()},
            host_credit=config.host_credit)
        config_path = worker.write(work / "config.json")
        result = run(launch_spec(config, work, config_path, scenario_path))
        results = {r: doc_r for r in ranks if (doc_r := read_json_object(work / f"rank{r}.json")) is not None}
        if not result.ok or len(results) != len(ranks):
            raise _failure(config, work, result)
        return _collect(config, results, time.monotonic() - started)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _floats(doc: dict[str, Any], key: str) -> list[float]:
    return [float(x) for x in doc.get(key) or []]


def _ends(doc: dict[str, Any]) -> list[list[float]]:
    """Per timed repetition, when the rank ended each captured iteration (a worker that reports none: the
    repetition's wall time, one iteration)."""
    ends = doc.get("iteration_ends_us")
    if isinstance(ends, list) and ends:
        return [[float(x) for x in rep] for rep in ends]
    return [[w] for w in _floats(doc, "iteration_us")]


def _collect(config: LiveConfig, results: dict[int, dict[str, Any]], wall_s: float) -> LiveResult:
    ends = {r: _ends(d) for r, d in results.items()}
    reps = min(len(v) for v in ends.values())
    counts = {len(v[i]) for v in ends.values() for i in range(reps)}
    if len(counts) != 1 or 0 in counts:  # ranks disagree on the captured iterations: a repetition is one
        ends = {r: [[v[i][-1]] for i in range(reps)] for r, v in ends.items()}
    windows = [job_windows({r: v[i] for r, v in ends.items()}) for i in range(reps)]
    fallbacks: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for d in results.values():
        fallbacks.update({str(k): int(v) for k, v in (d.get("fallbacks") or {}).items()})
        for k, v in (d.get("fallback_reasons") or {}).items():
            reasons.setdefault(str(k), str(v))
    recorded = sum(float(d.get("recorded_compute_us") or 0.0) for d in results.values())
    live = sum(float(d.get("live_compute_us") or 0.0) for d in results.values())
    return LiveResult(
        world_size=config.scenario.world_size, compute=config.compute,
        rank_end_us={r: [x for i in range(reps) for x in v[i]] for r, v in ends.items()},
        iteration_us=[e - s for ws in windows for s, e in ws],
        rank_compute_us={r: _floats(d, "compute_us") for r, d in results.items()},
        rank_wait_us={r: _floats(d, "wait_us") for r, d in results.items()},
        coverage=live / recorded if recorded > 0 else 0.0,
        rank_coverage={r: float(d.get("coverage") or 0.0) for r, d in results.items()},
        fallbacks=dict(fallbacks), fallback_reasons=reasons, wall_s=wall_s,
        rank_breakdown={r: _breakdowns(r, d, windows) for r, d in results.items()},
        per_repetition=len(windows[0]) if windows else 1,
        host_pad={r: p for r, d in results.items() if (p := HostPad.from_dict(d.get("host_pad"))) is not None},
        heap_not_held={r: str(d["heap_not_held"])[:300] for r, d in results.items()
                       if isinstance(d.get("heap_not_held"), str) and d["heap_not_held"]})


def _breakdowns(rank: int, doc: dict[str, Any], windows: Sequence[Sequence[tuple[float, float]]]) -> list[Breakdown]:
    """Per timed repetition and iteration window of the job, one rank's measured intervals cut into parts over
    it (a rank that finished its part sooner is idle until the window ends), so every rank's parts sum to the
    job's iteration time (worker output: module docstring of :mod:`nbox_replay.live._worker`)."""
    out = []
    for ws, spans in zip(windows, doc.get("spans") or [], strict=False):
        compute = [(float(a), float(b)) for a, b in spans.get("compute") or []]
        comms = [CommSpan(float(i), float(s), float(e)) for i, s, e in spans.get("comms") or []]
        intervals = RankIntervals(compute, comms)
        out += [partition(intervals, s, e, rank=rank) for s, e in ws]
    return out


@dataclass(frozen=True)
class PairedResult:
    """Two scenarios replayed live in alternating launches (module docstring).

    Attributes:
        baseline, what_if: the launches of each side joined, one timed repetition per pair (its captured
            iterations), in pair order.
        order: per pair, which side ran first (``"AB"`` or ``"BA"``).
    """

    baseline: LiveResult
    what_if: LiveResult
    order: list[str]

    def speedups(self) -> list[float]:
        """Per pair and captured iteration, the baseline's iteration time over the what-if's (> 1: the what-if is
        faster), by the one rule of :func:`nbox_replay.report.summary.speedup`; a pair without a ratio (a zero time) is
        left out."""
        ratios = (speedup(b, w) for b, w in zip(self.baseline.iteration_us, self.what_if.iteration_us, strict=True))
        return [r for r in ratios if r is not None]


def _join(parts: Sequence[LiveResult]) -> LiveResult:
    """One result from several launches of the same replay (their repetitions in launch order)."""
    first = parts[0]
    ranks = sorted(first.rank_end_us)

    def cat(attr: str) -> dict[int, list[Any]]:
        return {r: [x for p in parts for x in getattr(p, attr)[r]] for r in ranks}

    fallbacks: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for p in parts:
        for k, v in p.fallbacks.items():
            fallbacks[k] = max(fallbacks.get(k, 0), v)
        for k, why in p.fallback_reasons.items():
            reasons.setdefault(k, why)
    return LiveResult(first.world_size, first.compute, cat("rank_end_us"),
                      [x for p in parts for x in p.iteration_us], cat("rank_compute_us"), cat("rank_wait_us"),
                      min(p.coverage for p in parts), first.rank_coverage, fallbacks, reasons,
                      sum(p.wall_s for p in parts), cat("rank_breakdown"), first.per_repetition, first.host_pad,
                      first.heap_not_held)


def replay_paired(baseline: LiveConfig, what_if: LiveConfig, pairs: int,
                  progress: Report | None = None) -> PairedResult:
    """Replay ``baseline`` (A) and ``what_if`` (B) in ``pairs`` counterbalanced pairs of launches (A B, B A,
    ...), each launch with the config's warm-up and one timed repetition (module docstring).

    Raises:
        LiveConfigError: ``pairs`` < 1. LiveReplayError: a launch failed.
    """
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise LiveConfigError(f"pairs: must be an integer >= 1, got {pairs!r}")
    say = progress or (lambda _msg: None)
    one = {"A": dataclasses.replace(baseline, iterations=1), "B": dataclasses.replace(what_if, iterations=1)}
    got: dict[str, list[LiveResult]] = {"A": [], "B": []}
    order = []
    launches = 0
    for k in range(pairs):
        sides = "AB" if k % 2 == 0 else "BA"
        order.append(sides)
        for side in sides:
            say(Step(f"live replay, pair {k + 1}/{pairs}: {'baseline' if side == 'A' else 'what-if'}", launches,
                     2 * pairs, "launches"))
            cfg = one[side]  # across nodes, launch k rendezvouses at the endpoint's port + k (Nodes.shifted)
            got[side].append(replay_live(dataclasses.replace(cfg, nodes=cfg.nodes.shifted(launches))))
            launches += 1
    return PairedResult(_join(got["A"]), _join(got["B"]), order)
