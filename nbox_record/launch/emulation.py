"""``nbox emulate``: run an unmodified training script on N real ranks as if the world were W.

The launch is ``nbox record``'s (:func:`nbox_record.launch.launcher.launch_spec` run by :mod:`nbox_trace.launch`: the
ranks with torchrun's environment, the injected ``sitecustomize``, deadline, failure reports), with two switches of the
in-rank bootstrap (:mod:`nbox_record.capture.bootstrap`): ``NBOX_EMULATE=1`` turns whatever backend the script passes to
``init_process_group`` / ``new_group`` into ``nbox`` (:mod:`emulator_core.backend`: the script sees world size W, its
collectives complete at the modeled time), and ``NBOX_NO_CAPTURE=1`` times the iterations at the optimizer-step
boundaries without any profiler and stops the ranks after the timed ones.

The emulated world reaches the ranks as ``NBOX_WORLD_SIZE``, ``NBOX_REAL_RANKS`` and ``NBOX_SCENARIO`` (the
scenario with its overrides, resized to W, written to a TOML file in the run's work folder). Each rank
writes ``timings.json`` (its iteration times) and ``emulate.json`` (the world size the script saw, the
modeled collectives of the timed iterations: :func:`nbox_record.capture.emulated_rank.emulated_collectives`).

Per iteration, the job's time is the slowest real rank's; the result gives its median and 10th-90th
percentiles over the timed iterations.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nbox_record.capture import EMULATE_ALL, EMULATE_REPORT
from nbox_record.handoff import rawformat as raw
from nbox_record.launch.launcher import (
    EXAMPLES,
    RecordConfig,
    RecordError,
    _failure,
    _rank_dirs,
    _read_json,
    _write_bundle,
    launch_spec,
    rank_step,
    script_path,
)
from nbox_trace.bundle import job_iterations_us
from nbox_trace.errors import UsageError
from nbox_trace.files import Output, as_paths, check_outputs
from nbox_trace.launch import Nodes, run
from nbox_trace.progress import Report, watch
from nbox_trace.units import fit_label, format_bytes, format_in, format_us, time_unit

__all__ = ["SCHEMA", "EmulateConfig", "EmulateError", "EmulateResult", "emulate"]

SCHEMA = "nbox.emulate/1"


class EmulateError(RecordError):
    """The emulated run failed: a rank raised, died or hung, or reported nothing usable."""


@dataclass(frozen=True)
class EmulateConfig:
    """Everything ``nbox emulate`` needs, validated at construction (``ValueError`` names the field).

    Attributes:
        world_size: W, the world size the script sees; None: ``--set world_size``, else the scenario file's
            (the one world-size rule, :mod:`emulator_core.scenario.world`; settled here, with the scenario loaded).
        world_from: where the world size came from (set here, for reports: ``"8, from --world-size"``).
        nproc: real ranks per node (torchrun processes on this machine); nnodes x nproc <= W.
        real_ranks: the global rank each real process plays (nnodes x nproc distinct ranks < W, indexed by the real
            rank torchrun gives); empty: 0..nnodes x nproc - 1.
        nnodes, node_rank, rdzv_endpoint, local_addr, rdzv_host: several nodes, as ``nbox record`` takes them
            (:mod:`nbox_trace.launch`); run ``nbox emulate`` with the same settings on each node. A fixed node
            count only (no ``1:4``). Each node reports the whole job (every real rank's times reach every node
            through the rendezvous store, :func:`nbox_record.capture.emulated_rank.share_results`); the ranks' clocks
            need not agree (:mod:`emulator_core.backend.clocksync`).
        scenario: what-if scenario TOML (None: the shipped default); ``overrides`` as ``--set key=value``.
        warmup, iterations: optimizer steps skipped, then timed (the ranks stop after them).
        timeout_s: deadline for the whole run, then every rank is stopped.
        call_timeout_s: longest wait for one collective's real part (a deadlock among real ranks then
            fails the waiting rank with an error naming the call); None: a third of ``timeout_s``, >= 5 s.
        out: also capture one iteration after the timed ones and write a bundle of the emulated run.
    """

    world_size: int | None = None  # settled to an int in __post_init__
    nproc: int = 1
    real_ranks: tuple[int, ...] = ()
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_addr: str | None = None
    rdzv_host: bool | None = None
    script: Path | None = None          # None: the built-in example
    script_args: tuple[str, ...] = ()
    example: str = "ddp_convnet"
    scenario: Path | None = None
    overrides: tuple[str, ...] = ()
    warmup: int = 3
    iterations: int = 10
    timeout_s: float = 300.0
    keep_work: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    out: Path | None = None
    overwrite: bool = False
    call_timeout_s: float | None = None
    world_from: str = field(default="", init=False, compare=False)

    def __post_init__(self) -> None:
        """Raises UsageError (exit 2) naming the ``nbox emulate`` flag as typed."""
        as_paths(self, "script", "scenario", "out")
        w, n = self.world_size, self.nproc
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise UsageError(f"--world-size must be an integer >= 1, got {w!r}")
        from emulator_core.scenario import load_what_if

        settled = load_what_if(self.scenario, tuple(self.overrides), recorded_world=None, requested=w)[1]
        w = settled.size
        object.__setattr__(self, "world_size", w)
        object.__setattr__(self, "world_from", settled.describe())
        nodes = Nodes(self.nnodes, self.node_rank, self.rdzv_endpoint, self.local_addr, self.rdzv_host).count
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n * nodes <= w:
            raise UsageError(f"-n/--nproc-per-node (real ranks per node) x --nnodes {nodes} must be in 1..world_size "
                             f"{w}, got {n!r}")
        total = n * nodes
        ranks = tuple(self.real_ranks) or tuple(range(total))
        if len(ranks) != total:
            across = f" x --nnodes {nodes} = {total}" if nodes > 1 else ""
            raise UsageError(f"--real-ranks lists {len(ranks)} rank(s) {list(ranks)} but nproc is {n}{across}")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < w:
                raise UsageError(f"--real-ranks: real rank {r!r} is not a global rank of the emulated world "
                                 f"(0..{w - 1})")
        if len(set(ranks)) != total:
            raise UsageError(f"--real-ranks {list(ranks)}: not distinct")
        object.__setattr__(self, "real_ranks", ranks)
        for flag, value, lo in (("--warmup", self.warmup, 0), ("--iterations", self.iterations, 1)):
            if value < lo:
                raise UsageError(f"{flag} must be >= {lo}, got {value}")
        if self.script is None and self.example not in EXAMPLES:
            raise UsageError(f"--example {self.example!r}: unknown example; choose from {', '.join(EXAMPLES)}")
        if not self.timeout_s > 0 or not math.isfinite(self.timeout_s):
            raise UsageError(f"--timeout must be a positive number of seconds, got {self.timeout_s}")
        if self.call_timeout_s is not None and not (self.call_timeout_s > 0 and math.isfinite(self.call_timeout_s)):
            raise UsageError(f"--call-timeout must be a positive number of seconds, got {self.call_timeout_s}")
        check_outputs([Output("-o/--out", self.out, "dir", self.overwrite)])


@dataclass(frozen=True)
class EmulateResult:
    """What the emulated run showed. Times in microseconds."""

    world_size: int
    real_ranks: tuple[int, ...]
    world_size_seen: int | None          # get_world_size() as the script saw it (None: never initialized)
    iteration_us: list[float]            # per timed iteration: the slowest real rank's time
    per_rank_iteration_us: dict[int, list[float]]   # by global rank
    collectives: list[dict[str, Any]]    # rows by total modeled time, descending (see module docstring)
    scenario: str
    wall_s: float
    breakdown: dict[str, float] | None = None   # see :func:`iteration_breakdown`; None where not measured
    bundle: str | None = None            # ``-o``: the bundle written
    world_from: str = ""                 # where the world size came from (EmulateConfig.world_from)
    clocks: dict[int, dict[str, float]] = field(default_factory=dict)  # by global rank: Clock.describe()
    changes: tuple[str, ...] = ()        # what the emulated world changed, in words (emulator_core.scenario.question)
    peak_memory: dict[int, dict[str, Any]] = field(default_factory=dict)  # by global rank: emulaterank.peak_memory

    def answer(self) -> dict[str, Any]:
        """The report's first line and its facts: the emulated world, labelled by what it changed, its median
        iteration time, and the share of it that was exposed communication (when the breakdown was measured)."""
        from emulator_core.scenario import share_words

        label = f"emulated ({', '.join(self.changes) or f'{self.world_size} ranks'})"
        median = self.quantile_us(0.5)
        b = self.breakdown
        share = share_words(b["exposed_comm_us"], b["iteration_us"], "exposed communication") if b else None
        real = len(self.real_ranks)
        line = (f"{label}: {format_us(median)} per iteration with {real} real rank{'s' if real != 1 else ''}"
                + (f"; {share}" if share else ""))
        peak = max((int(m.get("bytes", 0)) for m in self.peak_memory.values()), default=0)
        if peak > 0:
            line += f"; peak memory {format_bytes(peak)} per rank"
        return {"line": line, "label": label, "changes": list(self.changes), "iteration_us": median,
                "peak_memory_bytes": peak or None,
                "exposed_share": b["exposed_comm_us"] / b["iteration_us"] if share and b else None}

    def quantile_us(self, q: float) -> float:
        return _quantile(self.iteration_us, q)

    def to_json(self) -> dict[str, Any]:
        """The ``nbox.emulate/1`` document."""
        return {
            "schema": SCHEMA,
            "answer": self.answer(),
            "world_size": self.world_size,
            "world_size_source": self.world_from,
            "real_ranks": list(self.real_ranks),
            "world_size_seen": self.world_size_seen,
            "scenario": self.scenario,
            "iteration_time_us": {"median": self.quantile_us(0.5), "p10": self.quantile_us(0.1),
                                  "p90": self.quantile_us(0.9), "count": len(self.iteration_us),
                                  "values": self.iteration_us},
            "per_rank_iteration_us": {str(r): v for r, v in self.per_rank_iteration_us.items()},
            "breakdown_us": self.breakdown,
            "collectives": self.collectives,
            "bundle": self.bundle,
            "clock_sync": {str(r): c for r, c in self.clocks.items()},
            "peak_memory": {str(r): m for r, m in self.peak_memory.items()},
            "wall_s": round(self.wall_s, 3),
        }


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def iteration_breakdown(timings: dict[int, dict[str, Any]]) -> dict[str, float] | None:
    """Where the job's iteration time went, in microseconds, mean per timed iteration.

    Per iteration the job's time is its slowest real rank's; that rank's training thread's wall time
    splits into ``compute_us`` (on a CPU), ``cpu_contention_us`` (runnable, waiting for a CPU) and
    ``exposed_comm_us`` (blocked: waiting for a collective), as sampled by :mod:`nbox_trace.threadtime`.
    Means, not medians, so the parts add up to ``iteration_us``. ``None`` when a rank has no samples
    (not Linux) or the counts disagree.
    """
    splits = {}
    for rank, t in timings.items():
        wall, cpu, runq = t.get("iteration_us"), t.get("iteration_cpu_us"), t.get("iteration_run_queue_us")
        if not (isinstance(wall, list) and isinstance(cpu, list) and isinstance(runq, list)
                and wall and len(wall) == len(cpu) == len(runq)):
            return None
        splits[rank] = (wall, cpu, runq)
    n = min(len(w) for w, _, _ in splits.values())
    sums = {"iteration_us": 0.0, "compute_us": 0.0, "exposed_comm_us": 0.0, "cpu_contention_us": 0.0}
    for i in range(n):
        wall, cpu, runq = max(((w[i], c[i], q[i]) for w, c, q in splits.values()), key=lambda x: x[0])
        sums["iteration_us"] += wall
        sums["compute_us"] += min(cpu, wall)
        sums["cpu_contention_us"] += min(runq, max(0.0, wall - cpu))
        sums["exposed_comm_us"] += max(0.0, wall - cpu - runq)
    return {k: v / n for k, v in sums.items()}


def _scenario_toml(cfg: EmulateConfig, path: Path) -> tuple[str, tuple[str, ...]]:
    """Load the scenario + overrides, resize it to W, write it to ``path``; returns a one-line description and
    what the user changed, in words (:func:`emulator_core.scenario.question.describe_changes`)."""
    from emulator_core.backend import live_unsupported
    from emulator_core.scenario import ScenarioError, describe_changes, dump_toml, load_what_if

    scenario = load_what_if(cfg.scenario, cfg.overrides, recorded_world=None, requested=cfg.world_size)[0]
    why = live_unsupported(scenario)
    if why:
        raise ScenarioError("", why, file=str(cfg.scenario) if cfg.scenario is not None else None)
    path.write_text(dump_toml(scenario), encoding="utf-8")
    name = str(cfg.scenario) if cfg.scenario is not None else "default (loopback_cpu)"
    desc = name + (f" with {', '.join(cfg.overrides)}" if cfg.overrides else "") + f"; world size {cfg.world_from}"
    return desc, tuple(describe_changes(cfg.scenario, cfg.overrides, scenario))


def _merge_collectives(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum the real ranks' rows by (collective, algorithm, bytes); counts and times are per real rank
    (averaged over the real ranks), so they read as "what one rank of the job did"."""
    rows: dict[tuple[str, str, float], dict[str, Any]] = {}
    for rep in reports:
        for r in rep.get("collectives", []):
            key = (str(r["collective"]), str(r["algorithm"]), float(r["bytes"]))
            row = rows.setdefault(key, {"collective": key[0], "algorithm": key[1], "bytes": key[2],
                                        "count": 0.0, "modeled_us": 0.0, "overrun_us": 0.0})
            for k in ("count", "modeled_us", "overrun_us"):
                row[k] += float(r[k])
    n = max(len(reports), 1)
    out = []
    for row in rows.values():
        count = row["count"] / n
        out.append({**row, "count": int(count) if count.is_integer() else count,
                    "modeled_us": row["modeled_us"] / n, "overrun_us": row["overrun_us"] / n})
    return sorted(out, key=lambda r: (-r["modeled_us"], r["collective"]))


def emulate(cfg: EmulateConfig, progress: Report | None = None) -> EmulateResult:
    """Run the emulation described by ``cfg``; see the module docstring. ``progress`` is told each phase, and
    while the ranks run, how far they are (:class:`nbox_trace.progress.Step`).

    Raises:
        EmulateError: a rank failed (the message names it: real rank and the global rank it played),
            the run passed its deadline, or a rank reported nothing.
        ScenarioError / InputNotFoundError: bad scenario or script.
    """
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    script = script_path(_record_config(cfg, Path(".")))
    if cfg.out is not None:
        cfg.out.resolve().parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{cfg.out.name}.raw-" if cfg.out else "nbox-emulate-",
                                 dir=cfg.out.resolve().parent if cfg.out else None))
    log_dir = work / "logs"
    try:
        scenario_desc, changes = _scenario_toml(cfg, work / "scenario.toml")
        rcfg = _record_config(cfg, work)
        spec = launch_spec(rcfg, work, "gloo", log_dir)
        env = dict(spec.env)
        env.update({"NBOX_EMULATE": "1", "NBOX_WORLD_SIZE": str(cfg.world_size),
                    "NBOX_REAL_RANKS": ",".join(map(str, cfg.real_ranks)),
                    "NBOX_SCENARIO": str(work / "scenario.toml"), "NBOX_SCENARIO_SET": "",
                    "NBOX_CALL_TIMEOUT_S": str(cfg.call_timeout_s or max(5.0, cfg.timeout_s / 3))})
        if cfg.out is None:
            env["NBOX_NO_CAPTURE"] = "1"
        node = f" on node {cfg.node_rank} of {cfg.nnodes}" if cfg.rdzv_endpoint else ""
        say(f"launching {cfg.nproc} real rank(s) of {script.name}{node}; global rank(s) {list(cfg.real_ranks)} "
            f"real in a world of {cfg.world_size}: warm-up {cfg.warmup}, timed {cfg.iterations}; scenario "
            f"{scenario_desc}")
        total = max(cfg.warmup, 1) + cfg.iterations + (1 if cfg.out is not None else 0)
        with watch(lambda: rank_step(work, total, "emulating"), progress):
            result = run(replace(spec, env=env))
        dirs = _rank_dirs(work)
        needed = (raw.TIMINGS, EMULATE_REPORT, EMULATE_ALL) + ((raw.HOST_ET,) if cfg.out is not None else ())
        complete = result.ok and len(dirs) == cfg.nproc and all(
            (d / name).is_file() for d in dirs.values() for name in needed)
        if not complete:
            failure = _failure(rcfg, work, result)
            plays = ", ".join(f"real rank {i} = global rank {g}" for i, g in enumerate(cfg.real_ranks))
            raise EmulateError(f"{failure} [{plays}]")
        per_rank: dict[int, list[float]] = {}
        reports = []
        all_timings = {}
        for real, doc in _job_results(dirs[min(dirs)] / EMULATE_ALL, len(cfg.real_ranks)).items():
            timings = doc["timings"]
            all_timings[real] = timings
            per_rank[cfg.real_ranks[real]] = [float(x) for x in timings.get("iteration_us", [])]
            reports.append(doc["emulate"])
        n_iter = min((len(v) for v in per_rank.values()), default=0)
        job = job_iterations_us(per_rank) if n_iter else []  # the job's pace: per iteration, the mean over ranks
        seen = {rep.get("world_size_seen") for rep in reports}
        world_seen = seen.pop() if len(seen) == 1 else None
        breakdown = iteration_breakdown(all_timings)
        clocks = {cfg.real_ranks[real]: rep["clock"] for real, rep in enumerate(reports)
                  if isinstance(rep.get("clock"), dict)}
        peaks = {cfg.real_ranks[real]: rep["peak_memory"] for real, rep in enumerate(reports)
                 if isinstance(rep.get("peak_memory"), dict)}
        bundle = None
        if cfg.out is not None:
            say("converting the capture of the emulated run to Chakra ET")
            emulation = {"world_size": cfg.world_size, "real_ranks": list(cfg.real_ranks),
                         "scenario": scenario_desc, "breakdown_us": breakdown,
                         "scenario_toml": (work / "scenario.toml").read_text(encoding="utf-8")}
            bundle = str(_write_bundle(rcfg, work, script, "nbox", True, emulation)[0])
        world = int(cfg.world_size or 0)  # always settled by EmulateConfig
        return EmulateResult(world, cfg.real_ranks, world_seen if isinstance(world_seen, int) else None, job,
                             dict(sorted(per_rank.items())), _merge_collectives(reports), scenario_desc,
                             time.monotonic() - started, breakdown, bundle, cfg.world_from, clocks, changes, peaks)
    finally:
        if cfg.keep_work:
            say(f"work folder kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _job_results(path: Path, real_ranks: int) -> dict[int, dict[str, Any]]:
    """Every real rank's ``{"timings", "emulate"}`` from ``emulate_all.json`` (all nodes' ranks), by real rank."""
    doc = _read_json(path)
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    if not isinstance(ranks, dict) or sorted(ranks) != sorted(str(r) for r in range(real_ranks)):
        raise EmulateError(f"{path}: expected the results of real ranks 0..{real_ranks - 1}, got "
                           f"{sorted(ranks) if isinstance(ranks, dict) else type(ranks).__name__}")
    out = {}
    for key, entry in ranks.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("timings"), dict)
                and isinstance(entry.get("emulate"), dict)):
            raise EmulateError(f"{path}: real rank {key}: no timings or emulate report")
        out[int(key)] = entry
    return dict(sorted(out.items()))


def _record_config(cfg: EmulateConfig, work: Path) -> RecordConfig:
    """The :class:`RecordConfig` the shared launcher functions take (capture=1 is unused without ``-o``; ``-o``
    captures one iteration without a lean pass: the script's steps are the user's, and an emulated bundle is
    replayed for its collectives, whose times the model gives)."""
    return RecordConfig(out=cfg.out or work, overwrite=cfg.overwrite, script=cfg.script, script_args=cfg.script_args,
                        example=cfg.example,
                        nproc_per_node=cfg.nproc, nnodes=cfg.nnodes, node_rank=cfg.node_rank,
                        rdzv_endpoint=cfg.rdzv_endpoint, local_addr=cfg.local_addr, rdzv_host=cfg.rdzv_host,
                        warmup=cfg.warmup, iterations=cfg.iterations, capture=1, lean=0,
                        backend="gloo", timeout_s=cfg.timeout_s, extra_env=dict(cfg.extra_env))


def format_text(result: EmulateResult, top: int = 10) -> str:
    """The human report: iteration time, the world size the script saw, the modeled collectives (bytes in IEC
    units, one time unit per line or column: :mod:`nbox_trace.units`)."""
    it = [result.quantile_us(q) for q in (0.5, 0.1, 0.9)]
    unit = time_unit(it)
    lines = [result.answer()["line"],
             f"emulated world size {result.world_size} on {len(result.real_ranks)} real rank(s) "
             f"{list(result.real_ranks)}; the script saw get_world_size() = {result.world_size_seen}",
             f"scenario: {result.scenario}",
             f"iteration time (slowest real rank, {len(result.iteration_us)} timed): median "
             f"{format_in(it[0], unit)} {unit[0]} (p10 {format_in(it[1], unit)}, p90 {format_in(it[2], unit)})"]
    b = result.breakdown
    if b is not None:
        parts = [b["compute_us"], b["exposed_comm_us"], b["cpu_contention_us"], b["iteration_us"]]
        bu = time_unit(parts)
        c, e, k, t = (format_in(v, bu) for v in parts)
        lines.append(f"breakdown (mean per iteration, slowest real rank's training thread, {bu[0]}): compute {c}, "
                     f"exposed communication {e}, CPU contention {k} = {t}")
    if result.peak_memory:
        lines.append("peak memory per real rank: " + ", ".join(
            f"rank {r} {format_bytes(int(m.get('bytes', 0)))} ({m.get('device', '?')}: {m.get('source', '?')})"
            for r, m in sorted(result.peak_memory.items())))
    if len(result.clocks) > 1:
        ref = min(result.clocks)
        lines.append(f"clocks onto global rank {ref}'s timeline (estimated at start-up): " + ", ".join(
            f"rank {r} {c.get('offset_us', 0.0):+.1f} us (+-{c.get('bound_us', 0.0):.1f})"
            for r, c in result.clocks.items() if r != ref))
    if result.bundle is not None:
        lines.append(f"bundle of the emulated run: {result.bundle}")
    if result.collectives:
        lines.append("modeled collectives per real rank over the timed iterations, by total modeled time:")
        shown = result.collectives[:top]
        mu = time_unit(row["modeled_us"] for row in shown)
        ou = time_unit(row["overrun_us"] for row in shown)
        lines.append(f"  {'collective':<16} {'bytes':>10} {'algorithm':<22} {'count':>6} {'modeled ' + mu[0]:>11} "
                     f"{'overrun ' + ou[0]:>11}")
        for row in shown:
            lines.append(f"  {fit_label(row['collective'], 16):<16} {format_bytes(row['bytes']):>10} "
                         f"{fit_label(row['algorithm'], 22):<22} {row['count']:>6} "
                         f"{format_in(row['modeled_us'], mu):>11} {format_in(row['overrun_us'], ou):>11}")
        if len(result.collectives) > top:
            lines.append(f"  ... {len(result.collectives) - top} more (--json lists all)")
    else:
        lines.append("no collective was issued during the timed iterations")
    return "\n".join(lines)
