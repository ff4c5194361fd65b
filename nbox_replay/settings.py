"""What ``nbox replay`` was asked: :class:`ReplayConfig`, validated at construction, and the replay settings given
as ``--set replay.<key>=<value>`` beside the scenario's own keys.

Some choices of a replay are corrections a user rarely needs to change (how recorded compute sheds the profiler's
overhead, whether a live replay pads for host work it does not re-run). They have good defaults and no flag of
their own; a user who must change one says so with ``--set``, like any other setting of the question:

* ``replay.profiler_correction``: ``on`` (default), ``off``, ``proportional``, ``per_op``, ``to_clean``, ``to_wall``,
  ``segments``, ``segments_runnable`` (:mod:`nbox_replay.inputs.profiler`);
* ``replay.host_work``: ``pad`` (default with live compute), ``match``, ``off`` (:mod:`nbox_replay.live.hostwork`).

:func:`split_settings` takes them out of the overrides; the rest go to the scenario as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator_core.scenario import parse_mesh, parse_placement
from nbox_replay.inputs import MODES as PROFILER_MODES
from nbox_replay.live import HOST_WORK_MODES
from nbox_trace.errors import UsageError
from nbox_trace.files import Output, as_paths, check_outputs
from nbox_trace.launch import Nodes
from nbox_trace.mesh import parse_names

__all__ = ["HOST_WORK", "MAX_WARMUP_S", "PREFIX", "PROFILER_CORRECTION", "ReplayConfig", "ReplayConfigError",
           "global_batch_size", "split_settings"]

#: The key prefix of a replay setting.
PREFIX = "replay."
#: ``--set replay.profiler_correction=MODE``.
PROFILER_CORRECTION = "replay.profiler_correction"
#: ``--set replay.host_work=MODE``.
HOST_WORK = "replay.host_work"


def split_settings(overrides: Iterable[str], allowed: Sequence[str] = (PROFILER_CORRECTION, HOST_WORK),
                   ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The scenario's overrides, and the replay settings (``replay.<key>`` -> value, the last one given wins).

    Raises:
        UsageError: a ``replay.`` key that is not one of ``allowed`` (the message lists them), or an empty value.
    """
    scenario: list[str] = []
    settings: dict[str, str] = {}
    for text in overrides:
        key, _, value = text.partition("=")
        key, value = key.strip(), value.strip().strip("\"'")
        if not key.startswith(PREFIX):
            scenario.append(text)
            continue
        if key not in allowed:
            raise UsageError(f"--set {text}: unknown replay setting (known here: {', '.join(allowed)})")
        if not value:
            raise UsageError(f"--set {text}: give a value, e.g. {key}=off")
        settings[key] = value
    return tuple(scenario), settings


CLOCKS = ("real", "virtual")
COMPUTES = ("auto", "live", "recorded")
DEVICES = ("auto", "cpu", "cuda")
GLOBAL_BATCH = ("weak", "fixed")
#: Bounds of ``--warmup-s`` (seconds).
MAX_WARMUP_S = 600.0


class ReplayConfigError(UsageError):
    """An invalid option or combination of replay options (the message names the flag as typed; exit 2)."""


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
        warmup: untimed repetitions before them (real clock; the first is cold, the host-work pad plans from
            the median of the others: :mod:`nbox_replay.live.hostwork`).
        warmup_s: warm up for at least this long too (seconds, by repetitions at the recorded iteration time:
            :func:`nbox_replay.replay.warmup_repetitions`); None: ``CUDA_WARMUP_S`` (same module) on CUDA, 0 on
            a CPU.
        device: ``auto``, ``cpu`` or ``cuda`` (real clock).
        out: directory for the per-rank Perfetto timelines (None: none written).
        timeout_s: deadline of a real-clock run.
        rank: the rank whose breakdown the report shows (None: the slowest rank of the median iteration).
        mesh: the what-if mesh, ``"dp=512,tp=2"`` (None: the world-size rule); virtual clock only
            (:mod:`emulator_core.scenario.mesh`).
        placement: the mesh dimensions outermost first as laid on ranks (None: tensor parallel innermost).
        recorded_mesh: names of the recorded mesh's dimensions, outermost first, where inference guesses.
        global_batch: ``weak`` (each rank keeps its batch) or ``fixed`` (strong scaling at a what-if mesh:
            :mod:`emulator_core.scenario.mesh`; recorded compute only); batch_size: the recorded per-rank batch, which
            ``fixed`` needs (nbox does not infer it from the trace).
        nodes: ``--clock real`` across several nodes (:class:`nbox_trace.launch.Nodes`): run the same command on
            each node; each starts its share of the replayed ranks; launch k of the interleaved pairs
            rendezvouses at the endpoint's port + k; every node reports the whole job.
        profiler_correction: ``on`` (``segments_runnable`` where the bundle carries the clean segments between
            collectives, ``segments`` for a rank recorded on an oversubscribed machine, else ``to_clean``;
            ``to_wall`` for a rank with GPU work, ``proportional`` for lean-timed operators or unmarked
            iterations), ``off``, or a rule by name (``proportional``, ``per_op``, ``to_clean``, ``to_wall``,
            ``segments``, ``segments_runnable``) for every rank: how recorded compute is corrected for the
            profiler's overhead (:mod:`nbox_replay.inputs.profiler`; recorded compute only, bundles that carry the
            figures only).
        truth: a bundle recorded at the what-if's world size whose observed iterations the prediction is set
            against (:mod:`nbox_replay.truth`); None: none.
        host_work: ``pad``, ``match`` or ``off``: whether a live replay with live compute pads its operators for
            the host work it does not re-run, and (``match``) credits a rank whose replay is busier than the real
            thread (:mod:`nbox_replay.live.hostwork`). None: ``pad`` where it applies; named, it is refused where it
            cannot act (a virtual clock, recorded compute).
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
    warmup: int = 4
    warmup_s: float | None = None
    device: str = "auto"
    out: Path | None = None
    timeout_s: float = 600.0
    rank: int | None = None
    mesh: str | None = None
    placement: str | None = None
    recorded_mesh: str | None = None
    global_batch: str = "weak"
    batch_size: int | None = None
    nodes: Nodes = field(default_factory=Nodes)
    profiler_correction: str = "on"
    host_work: str | None = None
    truth: Path | None = None

    def __post_init__(self) -> None:
        as_paths(self, "what_if", "baseline", "out", "truth")
        overrides, settings = split_settings(self.overrides)  # --set replay.<key>: nbox_replay.settings
        object.__setattr__(self, "overrides", overrides)
        object.__setattr__(self, "profiler_correction", settings.get(PROFILER_CORRECTION, self.profiler_correction))
        object.__setattr__(self, "host_work", settings.get(HOST_WORK, self.host_work))
        for name, value, allowed in (("--clock", self.clock, CLOCKS), ("--compute", self.compute, COMPUTES),
                                     ("--device", self.device, DEVICES),
                                     (f"--set {PROFILER_CORRECTION}", self.profiler_correction, PROFILER_MODES)):
            if value not in allowed:
                raise ReplayConfigError(f"{name} {value!r}: must be one of {', '.join(allowed)}")
        if self.host_work is not None and self.host_work not in HOST_WORK_MODES:
            raise ReplayConfigError(f"--set {HOST_WORK}={self.host_work!r}: must be one of "
                                    f"{', '.join(HOST_WORK_MODES)}")
        if self.host_work is not None and self.clock != "real":
            raise ReplayConfigError(f"--set {HOST_WORK}={self.host_work}: pads the operators a live replay "
                                    f"re-executes; with --clock {self.clock} nothing is re-executed on the real clock")
        if self.warmup_s is not None:
            if not (0 <= self.warmup_s <= MAX_WARMUP_S):
                raise ReplayConfigError(f"--warmup-s must be between 0 and {MAX_WARMUP_S:g} s, got {self.warmup_s}")
            if self.clock == "virtual" and self.compute != "live":
                raise ReplayConfigError(f"--warmup-s {self.warmup_s:g}: warms operators that run live; with --clock "
                                        f"virtual --compute {self.compute} none does")
            if self.warmup_s >= self.timeout_s:
                raise ReplayConfigError(f"--warmup-s {self.warmup_s:g} leaves no time inside --timeout "
                                        f"{self.timeout_s:g}")
        if self.iterations < 1 or self.warmup < 0:
            raise ReplayConfigError(f"--iterations must be >= 1 and --warmup >= 0, got {self.iterations}, "
                                    f"{self.warmup}")
        if self.world_size is not None and self.world_size < 1:
            raise ReplayConfigError(f"--world-size must be >= 1, got {self.world_size}")
        if self.ranks is not None and (not self.ranks or len(set(self.ranks)) != len(self.ranks)):
            raise ReplayConfigError(f"--ranks must name distinct ranks, got {list(self.ranks)}")
        if self.rank is not None and (self.rank < 0 or (self.ranks is not None and self.rank not in self.ranks)):
            raise ReplayConfigError(f"--rank {self.rank}: must be one of the replayed ranks"
                                    + (f" {list(self.ranks)}" if self.ranks is not None else " (>= 0)"))
        if self.timeout_s <= 0:
            raise ReplayConfigError(f"--timeout must be > 0, got {self.timeout_s}")
        try:
            if self.mesh is not None:
                parse_mesh(self.mesh)
            if self.placement is not None:
                parse_placement(self.placement)
            if self.recorded_mesh is not None:
                parse_names(self.recorded_mesh)
        except UsageError as e:
            raise ReplayConfigError(str(e)) from None
        global_batch_size(self.global_batch, self.batch_size)
        if self.global_batch == "fixed" and self.compute == "live":
            raise ReplayConfigError("--global-batch fixed with --compute live: re-executing the operators at a "
                                    "smaller batch is not built; use --compute recorded (each compute node's "
                                    "duration is scaled by the per-rank batch's ratio)")
        if self.nodes.count > 1 and self.clock != "real":
            raise ReplayConfigError(f"--nnodes {self.nodes.nnodes}: a virtual-clock replay runs on one machine; "
                                    f"several nodes apply to --clock real")
        if self.truth is not None and self.mesh is not None:
            raise ReplayConfigError(f"--truth {self.truth}: compares a what-if world size with a recording made at "
                                    f"it; with --mesh the truth would need the same mesh (not checked): use "
                                    f"--world-size")
        if self.mesh is not None and self.clock != "virtual":
            raise ReplayConfigError(f"--mesh {self.mesh}: a what-if mesh is replayed in virtual time only; add "
                                    f"--clock virtual (a live replay scales the world with --world-size)")
        check_outputs([Output("--out", self.out, "dir")], inputs=[Path(self.bundle)])


def global_batch_size(global_batch: str, batch_size: int | None) -> int | None:
    """The recorded per-rank batch of ``--global-batch fixed`` (None: weak scaling), the flags checked together.

    Raises:
        ReplayConfigError: an unknown mode, ``fixed`` without ``--batch-size`` or ``--batch-size`` without it, a
            batch below 1.
    """
    if global_batch not in GLOBAL_BATCH:
        raise ReplayConfigError(f"--global-batch {global_batch!r}: must be one of {', '.join(GLOBAL_BATCH)}")
    if global_batch == "fixed" and batch_size is None:
        raise ReplayConfigError("--global-batch fixed: name the recorded per-rank batch with --batch-size B "
                                "(nbox does not infer it from the trace)")
    if global_batch != "fixed" and batch_size is not None:
        raise ReplayConfigError("--batch-size: only with --global-batch fixed (weak scaling keeps each rank's batch)")
    if batch_size is not None and batch_size < 1:
        raise ReplayConfigError(f"--batch-size must be >= 1, got {batch_size}")
    return batch_size
