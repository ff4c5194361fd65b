"""What-if sweeps: replay one trace in virtual time over a grid of scenario settings (``nbox sweep``).

A sweep varies one or more **axes**, each ``key=v1,v2,...``:

* ``world_size``: the scenario resized by :func:`emulator_core.scenario.world.resize`; without this axis the world
  size is the one ``nbox replay`` would play (:func:`emulator_core.scenario.world.load_what_if`), and each row says
  where it came from (``world_size_source``);
* ``mesh.<dim>`` (``mesh.dp=8,64,512``): the degree of one dimension of the recorded mesh, the others keeping theirs,
  replayed as ``nbox replay --mesh`` does (:mod:`emulator_core.scenario.mesh`); a what-if file's ``[mesh]`` is played at
  every point, an axis replacing its degree. Refused: with a ``world_size`` axis, on a dimension a ``--set
  mesh.<dim>`` also names, or a ``world_size`` axis with a scenario mesh (one would be silently dropped);
* any other key: a scenario override (``--set`` syntax), applied on top of the base overrides.

The grid is the cartesian product of the axes, the first varying slowest. Each point loads the base scenario with the
base and point overrides, resizes it, and replays the graphs in virtual time
(:func:`nbox_replay.virtual.engine.simulate`, recorded compute corrected for the profiler as ``nbox replay`` does:
:mod:`nbox_replay.inputs.profiler`). Points run in parallel across processes; the rows come back in grid order, the
same bit for bit whatever the number of workers.

Row figures are per iteration, in microseconds, from the point's run summary (:mod:`nbox_replay.report.summary`):
``iteration_us`` the median over repetitions of the slowest replayed rank's iteration; ``compute_us``,
``exposed_comm_us``, ``overlapped_comm_us`` the slowest rank's totals over the repetitions; ``speedup`` the first
row's iteration time over this row's (:func:`nbox_replay.report.summary.speedup`; ``None`` where a time is 0:
``null`` in JSON, empty in the CSV, ``n/a`` in the table).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator_core.scenario import (
    AskedMesh,
    MeshError,
    MeshPlan,
    Scenario,
    ScenarioError,
    WhatIfWorld,
    load_what_if,
    parse_override,
    scenario_mesh,
)
from nbox_replay.inputs import (
    MESH_AXIS,
    Correction,
    RankGraph,
    correct_graphs,
    load_rank,
    mesh_axis_name,
    plan_for,
    set_world_size,
)
from nbox_replay.report import RunSummary, speedup, summarize_sim
from nbox_replay.virtual import simulate
from nbox_trace.errors import InvalidInputError, OutputWriteError, UsageError
from nbox_trace.mesh import RecordedMesh

__all__ = ["Axis", "PlotUnavailableError", "SweepConfig", "SweepError", "SweepRow", "SweepUsageError",
           "SweepWriteError", "parse_axis", "run_sweep"]

#: An axis value: what ``key=v`` parses to (TOML scalar rules: ``2`` int, ``2.0`` float, else a string).
Value = int | float | str | bool
#: Largest grid accepted (points); a guard against a typo such as ``world_size=1,2,...`` pasted twice.
MAX_POINTS = 10_000
#: The axis key that resizes the world instead of overriding a scenario key.
WORLD_SIZE = "world_size"
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


class SweepError(InvalidInputError):
    """A sweep that cannot run as given (the message names the axis and value)."""


class SweepUsageError(UsageError, SweepError):
    """A malformed ``--vary``, ``--iterations`` or ``--jobs`` (exit code 2, like any bad argument)."""


class PlotUnavailableError(SweepError):
    """The PNG cannot be drawn: matplotlib is not installed (the CSV and the table need nothing)."""


class SweepWriteError(OutputWriteError):
    """A sweep output (CSV, PNG) could not be written."""


@dataclass(frozen=True)
class Axis:
    """One varied setting: ``key`` and its values in the order given."""

    key: str
    values: tuple[Value, ...]


def _fmt_value(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def parse_axis(text: str) -> Axis:
    """Parse ``key=v1,v2,...`` into an :class:`Axis` (values read like ``--set`` values).

    Raises:
        SweepUsageError: no ``=``, a malformed key, an empty or repeated value, or a bad ``world_size`` value.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not _KEY_RE.match(key):
        raise SweepUsageError(f"--vary {text!r}: expected KEY=V1,V2,... with a dotted scenario key or world_size, "
                         "e.g. world_size=8,64,512")
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in parts):
        raise SweepUsageError(f"--vary {key}: empty value in {raw!r} (expected V1,V2,...)")
    values: list[Value] = []
    for p in parts:
        try:
            _, value = parse_override(f"{key}={p}")
        except ScenarioError as e:
            raise SweepUsageError(f"--vary {key}: value {p!r}: {e}") from None
        values.append(value)
    if key.startswith(MESH_AXIS):
        try:
            mesh_axis_name(key)
        except UsageError as e:
            raise SweepUsageError(str(e)) from None
    if key == WORLD_SIZE or key.startswith(MESH_AXIS):
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise SweepUsageError(f"--vary {key}: values must be positive integers, got {bad[0]!r}")
    dup = [v for i, v in enumerate(values) if v in values[:i]]
    if dup:
        raise SweepUsageError(f"--vary {key}: value {dup[0]!r} is listed twice")
    return Axis(key, tuple(values))


def _override_text(key: str, value: Value) -> str:
    return f"{key}={_fmt_value(value)}" if not isinstance(value, str) else f"{key}={value}"


Traces = tuple[tuple[int, str], ...]
Groups = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; validated when built (errors name the bad axis and value).

    Build it with :meth:`build` (mappings and ``"key=v1,v2"`` strings); the fields hold the normalized form.

    Attributes:
        traces: (replayed rank, its ``.et`` file) pairs, sorted by rank.
        groups: (process group name, member global ranks at the recorded world size) pairs.
        recorded_world: the world size the traces were recorded at.
        vary: the axes, in order (the first varies slowest in the grid).
        scenario: the what-if scenario TOML the user named (its ``world_size`` counts, see the module docstring);
            None: ``baseline``, played at the recorded world size.
        baseline: the scenario used when ``scenario`` is None (None: the shipped default, ``loopback_cpu``).
        overrides: base ``--set`` overrides (``key=value``), applied before each point's own.
        repetitions: times each rank's graph runs back to back per point (the median is reported).
        jobs: worker processes (1: evaluate in this process; capped at the CPU count and the grid size).
        mesh: the recorded mesh, for ``mesh.<dim>`` axes (None: such an axis is refused).
        placement: the mesh dimensions outermost first as laid on ranks (None: tensor parallel innermost).
        batch_size: the recorded per-rank batch of a fixed global batch (strong scaling at each point's mesh,
            :mod:`emulator_core.scenario.mesh`); None: weak scaling.
        profiler: the correction of recorded compute for the profiler's overhead
            (:func:`nbox_replay.inputs.profiler.plan_correction`); None: none.
    """

    traces: Traces
    groups: Groups
    recorded_world: int
    vary: tuple[Axis, ...]
    scenario: Path | None = None
    overrides: tuple[str, ...] = ()
    repetitions: int = 3
    jobs: int = 1
    baseline: Path | None = None
    mesh: RecordedMesh | None = None
    placement: tuple[str, ...] | None = None
    batch_size: int | None = None
    profiler: Correction | None = field(default=None, compare=False)
    #: The what-if scenario's own mesh (set when built).
    asked: AskedMesh | None = field(default=None, init=False, compare=False)

    @classmethod
    def build(cls, traces: Mapping[int, str | os.PathLike[str]], groups: Mapping[str, Sequence[int]],
              recorded_world: int, vary: Sequence[str | Axis], *, scenario: str | os.PathLike[str] | None = None,
              overrides: Sequence[str] = (), repetitions: int = 3, jobs: int = 1,
              baseline: str | os.PathLike[str] | None = None, mesh: RecordedMesh | None = None,
              placement: Sequence[str] | None = None, batch_size: int | None = None,
              profiler: Correction | None = None) -> SweepConfig:
        """A config from mappings and axis texts (``"world_size=8,64"``).

        Raises:
            SweepError: a bad axis (named), value, grid size, repetitions or jobs; or an axis value that makes
                the base scenario invalid.
        """
        return cls(tuple((int(r), os.fspath(p)) for r, p in traces.items()),
                   tuple((str(n), tuple(int(m) for m in ms)) for n, ms in groups.items()), recorded_world,
                   tuple(a if isinstance(a, Axis) else parse_axis(a) for a in vary),
                   Path(scenario) if scenario is not None else None, tuple(overrides), repetitions, jobs,
                   Path(baseline) if baseline is not None else None, mesh,
                   tuple(placement) if placement is not None else None, batch_size, profiler)

    def __post_init__(self) -> None:
        pairs = tuple(sorted((int(r), str(p)) for r, p in self.traces))
        if not pairs:
            raise SweepError("no trace to replay (traces is empty)")
        if len({r for r, _ in pairs}) != len(pairs):
            raise SweepError("a rank is given more than one trace file")
        group_pairs = tuple(sorted((str(n), tuple(sorted(int(m) for m in ms))) for n, ms in self.groups))
        if isinstance(self.recorded_world, bool) or not isinstance(self.recorded_world, int) \
                or self.recorded_world < 1:
            raise SweepError(f"recorded_world must be a positive integer, got {self.recorded_world!r}")
        axes = tuple(a if isinstance(a, Axis) else parse_axis(str(a)) for a in self.vary)
        if not axes:
            raise SweepUsageError("nothing to vary: give at least one --vary KEY=V1,V2,...")
        keys = [a.key for a in axes]
        dup = [k for i, k in enumerate(keys) if k in keys[:i]]
        if dup:
            raise SweepUsageError(f"--vary {dup[0]}: the axis is given twice (list all its values in one --vary)")
        if WORLD_SIZE in keys and any(k.startswith(MESH_AXIS) for k in keys):
            raise SweepUsageError("--vary world_size and --vary mesh.*: the mesh makes the world size; vary one")
        try:
            asked = scenario_mesh(self.scenario, self.overrides)
        except ScenarioError as e:
            raise SweepError(str(e)) from None
        object.__setattr__(self, "asked", asked)
        if asked is not None and WORLD_SIZE in keys:
            raise SweepUsageError(f"--vary world_size and the what-if's mesh ({asked.text}): the mesh makes the "
                                  f"world size; vary mesh.<dim> instead")
        clash = [k for k in keys if k.startswith(MESH_AXIS) and asked is not None
                 and mesh_axis_name(k) in asked.set_dims]
        if clash:
            dim = mesh_axis_name(clash[0])
            raise SweepUsageError(f"--vary {clash[0]} and --set mesh.{dim}: both give the {dim} degree; drop one")
        if self.batch_size is not None and asked is None and not any(k.startswith(MESH_AXIS) for k in keys):
            raise SweepUsageError("--global-batch fixed: strong scaling changes the data-parallel degree of a mesh; "
                                  "vary mesh.<dim> (or give a [mesh] in the what-if)")
        for a in axes:
            if not a.values:
                raise SweepError(f"--vary {a.key}: no values")
        points = math.prod(len(a.values) for a in axes)
        if points > MAX_POINTS:
            raise SweepError(f"the grid has {points} points, over the limit of {MAX_POINTS}; vary fewer values")
        if isinstance(self.repetitions, bool) or not isinstance(self.repetitions, int) or self.repetitions < 1:
            raise SweepUsageError(f"--iterations must be a positive integer, got {self.repetitions!r}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise SweepUsageError(f"--jobs must be a positive integer, got {self.jobs!r}")
        object.__setattr__(self, "traces", pairs)
        object.__setattr__(self, "groups", group_pairs)
        object.__setattr__(self, "vary", axes)
        object.__setattr__(self, "overrides", tuple(self.overrides))
        self._check_axes()

    def grid(self) -> list[tuple[Value, ...]]:
        """The grid points in order (first axis slowest): one value per axis."""
        return list(itertools.product(*(a.values for a in self.vary)))

    def point_mesh(self, point: Sequence[Value]) -> MeshPlan | None:
        """The what-if mesh of one grid point (None: it has no ``mesh.<dim>`` axis).

        Raises:
            MeshError: the point's mesh cannot be played on the recording (names the dimension).
        """
        degrees = [(mesh_axis_name(a.key), int(v)) for a, v in zip(self.vary, point, strict=True)
                   if a.key.startswith(MESH_AXIS)]
        asked = self.asked
        if not degrees and asked is None:
            return None
        text = "--vary " + ",".join(f"{MESH_AXIS}{n}={d}" for n, d in degrees) if degrees else ""
        if asked is not None:
            text = f"{text} on {asked.text}" if text else asked.text
            degrees = [*((n, d) for n, d in asked.degrees if n not in dict(degrees)), *degrees]
        if self.mesh is None:
            raise MeshError(f"{text}: no recorded mesh was given to the sweep")
        placement = self.placement or (asked.placement if asked is not None and asked.placement else None)
        return plan_for(self.mesh, degrees, groups=dict(self.groups), replayed=[r for r, _ in self.traces],
                        placement=placement, text=text, set_world=set_world_size(self.overrides),
                        placement_by="--placement" if self.placement else "mesh_placement",
                        batch_size=self.batch_size)

    def _build(self, point: Sequence[Value]) -> tuple[Scenario, WhatIfWorld]:
        overrides = list(self.overrides)
        world: int | None = None
        by = "--vary world_size"
        for axis, value in zip(self.vary, point, strict=True):
            if axis.key == WORLD_SIZE:
                world = int(value)
            elif not axis.key.startswith(MESH_AXIS):
                overrides.append(_override_text(axis.key, value))
        try:
            plan = self.point_mesh(point)
        except MeshError as e:
            raise ScenarioError("mesh", str(e)) from None
        if plan is not None:
            world, by = plan.world, plan.text
        scenario, settled = load_what_if(self.scenario, overrides, recorded_world=self.recorded_world,
                                         requested=world, requested_by=by, default=self.baseline)
        bad = [r for r, _ in self.traces if not 0 <= r < scenario.world_size]
        if bad:
            raise ScenarioError(WORLD_SIZE, f"replayed rank {bad[0]} is outside a world of "
                                f"{settled.describe()}")
        return scenario, settled

    def point_scenario(self, point: Sequence[Value]) -> Scenario:
        """The scenario of one grid point (one value per axis, in axis order).

        Raises:
            SweepError: the point's scenario is invalid (the message names the point's axes and values).
            InputNotFoundError: the base scenario file does not exist.
        """
        return self.point_world(point)[0]

    def point_world(self, point: Sequence[Value]) -> tuple[Scenario, WhatIfWorld]:
        """The scenario of one grid point and where its world size came from (see :meth:`point_scenario`)."""
        try:
            return self._build(point)
        except ScenarioError as e:
            where = ", ".join(f"{a.key}={_fmt_value(v)}" for a, v in zip(self.vary, point, strict=True))
            raise SweepError(f"sweep point {where}: {e}") from None

    def _check_axes(self) -> None:
        """Build each axis value with the other axes at their first value, so that a bad key or value is
        named by its axis before anything runs; other combinations are checked when each point is built."""
        first = tuple(a.values[0] for a in self.vary)
        for n, axis in enumerate(self.vary):
            for value in axis.values:
                try:
                    self._build((*first[:n], value, *first[n + 1:]))
                except ScenarioError as e:
                    try:  # the base scenario and --set alone may be what is wrong: then say so, not the axis
                        load_what_if(self.scenario, self.overrides, recorded_world=self.recorded_world,
                                     default=self.baseline)
                    except ScenarioError as base_error:
                        raise SweepError(str(base_error)) from None
                    raise SweepError(f"--vary {axis.key}: value {_fmt_value(value)} is not valid: {e}") from None


@dataclass(frozen=True)
class SweepRow:
    """One grid point's prediction. Times in microseconds per iteration (module docstring)."""

    values: tuple[tuple[str, Value], ...]  # (axis key, value) per axis, in axis order
    world_size: int
    iteration_us: float
    compute_us: float
    exposed_comm_us: float
    overlapped_comm_us: float
    slowest_rank: int
    speedup: float | None = 1.0
    world_size_source: str = "recorded"  # emulator_core.scenario.world.WORLD_SOURCES

    def to_dict(self) -> dict[str, Any]:
        """Flat record: the axis values by key, then the figures."""
        out: dict[str, Any] = dict(self.values)
        out.update({"world_size": self.world_size, "iteration_us": self.iteration_us,
                    "compute_us": self.compute_us, "exposed_comm_us": self.exposed_comm_us,
                    "overlapped_comm_us": self.overlapped_comm_us, "slowest_rank": self.slowest_rank,
                    "speedup": self.speedup, "world_size_source": self.world_size_source})
        return out


#: Per worker process: the loaded graphs (set by :func:`_init_worker`).
_WORKER_GRAPHS: dict[int, RankGraph] = {}


def _load_graphs(traces: Sequence[tuple[int, str]], profiler: Correction | None = None) -> dict[int, RankGraph]:
    graphs = {r: load_rank(p, r) for r, p in traces}
    return correct_graphs(graphs, profiler) if profiler is not None else graphs


def _init_worker(traces: Sequence[tuple[int, str]], profiler: Correction | None = None) -> None:
    global _WORKER_GRAPHS
    _WORKER_GRAPHS = _load_graphs(traces, profiler)


def _evaluate(graphs: Mapping[int, RankGraph], scenario: Scenario, groups: Sequence[tuple[str, tuple[int, ...]]],
              recorded_world: int, reps: int, mesh: MeshPlan | None = None) -> RunSummary:
    result = simulate(graphs, scenario, groups=dict(groups), recorded_world=recorded_world, repetitions=reps,
                      mesh=mesh)
    return summarize_sim(result, label="sweep point", scenario="", top=0)


def _worker_task(scenario: Scenario, groups: Sequence[tuple[str, tuple[int, ...]]], recorded_world: int,
                 reps: int, mesh: MeshPlan | None) -> RunSummary:
    return _evaluate(_WORKER_GRAPHS, scenario, groups, recorded_world, reps, mesh)


def run_sweep(config: SweepConfig, progress: Callable[[int, int], None] | None = None) -> list[SweepRow]:
    """Evaluate every grid point in virtual time; rows in grid order (deterministic, any ``jobs``).

    Args:
        progress: called as ``progress(done, total)`` in this process after each point completes.

    Raises:
        SweepError: a grid point's scenario is invalid (names the point).
        ReplayInputError, ReplayDeadlock, InputNotFoundError, TraceDecodeError: from loading or replaying.
    """
    grid = config.grid()
    settled = [config.point_world(p) for p in grid]
    plans = [config.point_mesh(p) for p in grid]
    scenarios = [s for s, _ in settled]
    total = len(grid)
    figures: list[RunSummary | None] = [None] * total
    groups, reps = config.groups, config.repetitions
    if config.jobs == 1 or total == 1:
        graphs = _load_graphs(config.traces, config.profiler)
        for i, scenario in enumerate(scenarios):
            figures[i] = _evaluate(graphs, scenario, groups, config.recorded_world, reps, plans[i])
            if progress is not None:
                progress(i + 1, total)
    else:
        _load_graphs(config.traces, config.profiler)  # fail early on an unreadable trace; fills profiler.factors
        workers = min(config.jobs, total, os.cpu_count() or 1)
        pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                   initargs=(config.traces, config.profiler))
        try:
            futures: dict[Future[RunSummary], int] = {
                pool.submit(_worker_task, s, groups, config.recorded_world, reps, plans[i]): i
                for i, s in enumerate(scenarios)}
            for done, fut in enumerate(as_completed(futures), 1):
                figures[futures[fut]] = fut.result()
                if progress is not None:
                    progress(done, total)
        except BaseException:  # a failed point or Ctrl-C: drop the points not started yet
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    rows: list[SweepRow] = []
    for point, fig, (_, world) in zip(grid, figures, settled, strict=True):
        assert fig is not None
        it = fig.median_us
        rows.append(SweepRow(tuple((a.key, v) for a, v in zip(config.vary, point, strict=True)), fig.world_size, it,
                             fig.compute_us, fig.exposed_comm_us, fig.overlapped_comm_us, fig.slowest_rank,
                             speedup(rows[0].iteration_us if rows else it, it), world.source))
    return rows
