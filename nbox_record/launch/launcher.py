"""``nbox record``: launch a script's ranks with the capture bootstrap injected, wait with a deadline, convert
each rank's raw capture to Chakra ET, and write a bundle.

The script is not edited: ``nbox_record/_inject`` goes first on ``PYTHONPATH``, so its
``sitecustomize`` starts :mod:`nbox_record.capture.bootstrap` in every rank when ``NBOX_RECORD_DIR`` is set
(see ``rawformat`` for what each rank writes). The launch is nbox's one launcher (:mod:`nbox_trace.launch`:
the ranks get torchrun's environment on one node, and go through torchrun's rendezvous across nodes), so
``--nnodes/--node-rank/--rdzv-endpoint`` work the way users already launch multi-node jobs; each node's
``nbox record`` writes a bundle of its own ranks.

Faults never hang: the whole run has a deadline, after which the ranks' process group (torchrun's, across nodes) is
terminated (SIGTERM, then SIGKILL); the error names the ranks that had not finished and what each last reported. A
rank that raises writes ``error.json``; the root cause among them (:func:`nbox_trace.launch.launcher.root_error`, or the
rank the launcher saw die first) is reported with its rank. No bundle is written unless every rank's capture is
complete (``keep_partial`` writes one marked ``complete: false``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox_record.examples import EXAMPLES as _EXAMPLE_SCRIPTS
from nbox_record.examples import EXAMPLES_DIR as _EXAMPLES_DIR
from nbox_record.handoff import SCRIPT_EXIT, read_peers, record_env
from nbox_record.handoff import rawformat as raw
from nbox_trace import __version__
from nbox_trace.errors import InputNotFoundError, NboxError, UsageError
from nbox_trace.files import Output, as_paths, check_outputs
from nbox_trace.launch import Launch, LaunchResult, check_nodes, is_consequence, run, seconds_text, then_failed
from nbox_trace.progress import Report, Step, watch

EXAMPLES = tuple(_EXAMPLE_SCRIPTS)


class RecordError(NboxError):
    """The recorded run failed: a rank raised, died or hung, or its capture is unusable."""

    exit_code = 1


@dataclass(frozen=True)
class RecordConfig:
    """Everything ``nbox record`` needs. Times in seconds."""

    out: Path
    script: Path | None = None          # None: the built-in example
    script_args: tuple[str, ...] = ()
    example: str = "ddp_convnet"
    nproc_per_node: int = 2
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_addr: str | None = None       # None: this node's address on the route to the endpoint
    rdzv_host: bool | None = None       # None: when the endpoint's address is this node's own and node_rank is 0
    warmup: int = 3
    iterations: int = 10
    capture: int = 1
    lean: int = 0                       # iterations profiled by Kineto alone before the capture (leantiming)
    backend: str = "auto"               # auto | gloo | nccl
    run_to_end: bool = False
    keep_partial: bool = False
    keep_raw: bool = False
    overwrite: bool = False
    timeout_s: float = 900.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises UsageError (exit 2) naming the ``nbox record`` flag as typed."""
        as_paths(self, "out", "script")
        if self.nproc_per_node < 1:
            raise UsageError(f"-n/--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        check_nodes(self.nnodes, self.node_rank, self.rdzv_endpoint, self.local_addr)
        for flag, value, lo in (("--warmup", self.warmup, 0), ("--iterations", self.iterations, 1),
                                ("--capture", self.capture, 1), ("--lean-iterations", self.lean, 0)):
            if value < lo:
                raise UsageError(f"{flag} must be >= {lo}, got {value}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise UsageError(f"--backend {self.backend!r}: must be auto, gloo or nccl")
        if self.script is None and self.example not in EXAMPLES:
            raise UsageError(f"--example {self.example!r}: unknown example; choose from {', '.join(EXAMPLES)}")
        if not self.timeout_s > 0:
            raise UsageError(f"--timeout must be > 0 (seconds), got {self.timeout_s}")


@dataclass(frozen=True)
class RecordResult:
    bundle: Path
    ranks: list[int]
    observed_median_us: float
    complete: bool
    wall_s: float
    nodes_per_rank: dict[int, int]


def script_path(cfg: RecordConfig) -> Path:
    if cfg.script is not None:
        if not cfg.script.is_file():
            raise InputNotFoundError(f"{cfg.script}: script not found")
        return cfg.script
    return _EXAMPLES_DIR / f"{cfg.example}.py"


def recorded_backend(flag: str, timings: dict[int, dict[str, Any]]) -> str | None:
    """The backend the bundle names (manifest ``producer.backend``): the one the ranks' default process group
    used, as each rank wrote it in its timings (:func:`nbox_record.capture.facts.rank_timings`), else ``--backend``
    unless that was ``auto``. The flag only reaches a script through ``NBOX_BACKEND`` (the built-in examples read
    it; a script picks its own in ``init_process_group``), so the ranks are the witness, not the flag."""
    seen = sorted({str(t["backend"]) for t in timings.values() if t.get("backend")})
    if seen:
        return ",".join(seen)
    return None if flag == "auto" else flag


def backend_notice(flag: str, timings: dict[int, dict[str, Any]]) -> str | None:
    """A notice when ``--backend`` named a backend and the ranks used another (None otherwise): the flag sets
    ``NBOX_BACKEND``, which a script that chooses its own backend does not read."""
    used = recorded_backend("auto", timings)
    if flag == "auto" or used is None or used == flag:
        return None
    return (f"--backend {flag}: the ranks used {used} (the flag sets NBOX_BACKEND, which the built-in examples "
            f"read; this script chose its own backend in init_process_group); the bundle says {used}")


def launch_spec(cfg: RecordConfig, work: Path, backend: str, log_dir: Path) -> Launch:
    """The launch of ``cfg``'s script (:mod:`nbox_trace.launch`): rendezvous at ``rdzv_endpoint`` or standalone;
    the environment adds ``extra_env``, then :func:`nbox_record.handoff.env.record_env` (the injected bootstrap
    first on ``PYTHONPATH``) and ``NBOX_BACKEND`` = ``backend`` (``auto``, ``gloo`` or ``nccl``; the built-in
    examples resolve ``auto`` in the rank: nccl where CUDA is available, else gloo). ``auto`` is not resolved
    here: that meant importing torch in the ``nbox record`` process, 2.5-3.5 s before any rank started."""
    args = list(cfg.script_args)
    if cfg.script is None:  # a built-in example runs exactly the iterations the capture needs, plus slack
        args = ["--steps", str(max(cfg.warmup, 1) + cfg.iterations + cfg.lean + cfg.capture + 2), *args]
    inherited = cfg.extra_env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    env = {**cfg.extra_env,
           **record_env(work, warmup=cfg.warmup, iterations=cfg.iterations, capture=cfg.capture, lean=cfg.lean,
                        run_to_end=cfg.run_to_end, pythonpath=inherited),
           "NBOX_BACKEND": backend}  # read by the built-in examples
    return Launch(str(script_path(cfg)), log_dir, args=tuple(args), nproc_per_node=cfg.nproc_per_node,
                  nnodes=cfg.nnodes, node_rank=cfg.node_rank, rdzv_endpoint=cfg.rdzv_endpoint,
                  local_addr=cfg.local_addr, rdzv_host=cfg.rdzv_host, env=env, timeout_s=cfg.timeout_s)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise RecordError(f"{path}: unreadable capture file: {str(exc)[:200]}") from None


def _rank_dirs(work: Path) -> dict[int, Path]:
    out = {}
    for d in work.glob("rank*"):
        if d.is_dir() and d.name[4:].isdigit():
            out[int(d.name[4:])] = d
    return dict(sorted(out.items()))


def _expected_ranks(cfg: RecordConfig) -> int:
    return cfg.nproc_per_node


def _rank_status(d: Path) -> str:
    progress = d / "progress.json"
    if progress.is_file():
        try:
            p = json.loads(progress.read_bytes())
            return f"last seen in phase {p.get('phase')!r} at iteration {p.get('iteration')}"
        except (OSError, ValueError):
            pass
    return "no progress reported"


class _NodeNames:
    """How a multi-node run's failure names nodes: ``node <group rank> (<address>)``, from this node's settings and
    ``peers.json`` (every rank's node, :mod:`nbox_record.handoff.peers`); nothing on one node."""

    def __init__(self, cfg: RecordConfig, result: LaunchResult, peers: dict[int, dict[str, Any]]) -> None:
        self.multi = bool(cfg.rdzv_endpoint)
        self.cfg, self.addr, self.peers = cfg, result.launch.local_addr, peers

    def _node(self, addr: Any, group: Any) -> str:
        return f"node {group if group is not None else '?'}" + (f" ({addr})" if addr else "")

    def of(self, rank: int) -> str:
        """`` on node 1 (10.0.0.2)`` for a rank of this node (a multi-node run), else empty."""
        if not self.multi:
            return ""
        me = self.peers.get(rank, {})
        return " on " + self._node(self.addr or me.get("addr"), me.get("group_rank", self.cfg.node_rank))

    def lost_peer(self, message: str) -> str:
        """`` because node 1 (10.0.0.2, rank(s) [1]) went away first`` when ``message`` names a peer's address."""
        if not self.multi:
            return ""
        found = _PEER_ADDR.search(message)
        if found is None:
            return " because a peer on another node went away first (its node's own report names the rank)"
        addr = found.group(1)
        ranks = sorted(r for r, p in self.peers.items() if p.get("addr") == addr)
        group = next((self.peers[r].get("group_rank") for r in ranks), None)
        what = (f"node {group if group is not None else '?'} ({addr}, rank(s) {ranks})" if ranks
                else f"the node at {addr}")
        return f" because {what} went away first (that node, or its rank, failed)"


#: A peer's address in gloo's socket errors: ``Read error [10.77.0.2]:19637: Connection reset by peer``.
_PEER_ADDR = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")


def _failure(cfg: RecordConfig, work: Path, result: LaunchResult) -> RecordError:
    """The error of a failed run, from what its ranks left in ``work`` (see :meth:`LaunchResult.failure`)."""
    dirs = _rank_dirs(work)
    f = result.failure({rank: d / raw.ERROR for rank, d in dirs.items()})
    node = _NodeNames(cfg, result, read_peers(list(dirs.values())))
    if f.root_rank is not None and f.exit_text is not None:
        return RecordError(f"rank {f.root_rank}{node.of(f.root_rank)} {f.exit_text}{then_failed(f.others)}"
                           f"{f.root_tail_text()}")
    if f.root_error is not None:
        err = f.root_error
        lost = node.lost_peer(err.message) if is_consequence(err.message) else ""
        own = f.root_tail_text() if err.type == SCRIPT_EXIT else ""  # the script's own words say why
        return RecordError(f"rank {err.rank}{node.of(err.rank)} failed{lost}: {err.type}: {err.message}"
                           f"{then_failed(f.others)}{own}")
    if cfg.rdzv_endpoint:  # this node's ranks have global ranks torchrun's rendezvous chose: those that started
        unfinished = [r for r, d in _rank_dirs(work).items() if not (d / raw.TIMINGS).is_file()]
    else:
        unfinished = [r for r in range(_expected_ranks(cfg)) if not (work / f"rank{r}" / raw.TIMINGS).is_file()]
    if f.timed_out:
        states = "; ".join(f"rank {r}{node.of(r)}: {_rank_status(work / f'rank{r}')}" for r in unfinished)
        silent = (" (a multi-node run: a node that went silent, or never joined the rendezvous, looks like this; "
                  "check the other nodes)" if node.multi else "")
        return RecordError(f"the run did not finish within {seconds_text(cfg.timeout_s)} s (--timeout) and was "
                           f"stopped; unfinished ranks: {states or 'none'}{silent}")
    return RecordError(f"the run exited with code {f.returncode}; ranks without a capture: {unfinished or 'none'}"
                       f"{f.tail_text()}")


def rank_step(work: Path, total: int, what: str) -> Step | None:
    """How far the recording ranks writing into ``work`` are: the least advanced rank's phase and iteration
    boundaries of ``total`` (from their ``progress.json``; None before any rank wrote one)."""
    least: tuple[int, str] | None = None
    for d in _rank_dirs(work).values():
        p = json.loads((d / raw.PROGRESS).read_bytes()) if (d / raw.PROGRESS).is_file() else None
        if isinstance(p, dict) and isinstance(p.get("iteration"), int) and (least is None or p["iteration"] < least[0]):
            least = (p["iteration"], str(p.get("phase")))
    if least is None:
        return None
    phase = _PHASES.get(least[1], least[1])
    return Step(f"{what}, {phase}", min(least[0], total), total, "iterations")


#: The recorder's phases (nbox_record.capture.recorder) as a progress line says them.
_PHASES = {"warmup": "warm-up", "timing": "timed iterations", "lean": "lean iterations", "capture": "capture",
           "done": "writing", "failed": "failed"}


def record(cfg: RecordConfig, progress: Report | None = None) -> RecordResult:
    """Run the recording described by ``cfg`` and write the bundle; see the module docstring. ``progress`` is told
    each phase, and while the ranks run, how far they are (:class:`nbox_trace.progress.Step`)."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    script = script_path(cfg)
    check_outputs([Output("-o/--out", cfg.out, "dir", cfg.overwrite)], inputs=[script])  # before any rank starts
    cfg.out.resolve().parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{cfg.out.name}.raw-", dir=cfg.out.resolve().parent))
    log_dir = work / "logs"
    try:
        say(f"launching {cfg.nproc_per_node} rank(s) of {script.name} (backend {cfg.backend}): warm-up "
            f"{cfg.warmup}, timed {cfg.iterations}, lean {cfg.lean}, captured {cfg.capture}")
        needed = max(cfg.warmup, 1) + cfg.iterations + cfg.lean + cfg.capture
        with watch(lambda: rank_step(work, needed, "recording"), progress):
            result = run(launch_spec(cfg, work, cfg.backend, log_dir))
        dirs = _rank_dirs(work)
        complete = result.ok and len(dirs) == cfg.nproc_per_node and all(
            (d / raw.TIMINGS).is_file() and (d / raw.HOST_ET).is_file() for d in dirs.values())
        if not complete and not cfg.keep_partial:
            raise _failure(cfg, work, result)
        say("converting the capture to Chakra ET")
        bundle, ranks, median_us, nodes_per_rank = _write_bundle(cfg, work, script, None, complete,
                                                                 local_addr=result.launch.local_addr, say=say)
        return RecordResult(bundle, ranks, median_us, complete, time.monotonic() - started, nodes_per_rank)
    finally:
        if cfg.keep_raw:
            say(f"raw capture kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _node_facts(cfg: RecordConfig, timings: dict[int, dict[str, Any]], local_addr: str | None) -> dict[str, Any]:
    """The manifest's ``job`` keys of a multi-node recording: the rendezvous, the run's identity (the same on every
    node, :func:`nbox_record.capture.facts.job_identity`) and this node (``nbox bundle merge`` reads them)."""
    if not cfg.rdzv_endpoint:
        return {}
    first = timings[min(timings)]
    job = first.get("job")
    ident: dict[str, Any] = job if isinstance(job, dict) else {}
    node = {"node_rank": cfg.node_rank, "group_rank": ident.get("group_rank"), "ranks": sorted(timings),
            "hostname": first.get("hostname"), "local_addr": local_addr}
    return {"rdzv_endpoint": cfg.rdzv_endpoint, "job_id": ident.get("job_id"), "run_id": ident.get("run_id"),
            "nodes": [node]}


def _write_bundle(cfg: RecordConfig, work: Path, script: Path, backend: str | None, complete: bool,
                  emulation: dict[str, Any] | None = None, local_addr: str | None = None,
                  say: Callable[[str], None] | None = None) -> tuple[Path, list[int], float, dict[int, int]]:
    """Convert the ranks' captures in ``work`` and write the bundle ``cfg.out``.

    ``backend``: the manifest's ``producer.backend``; None: the one the ranks used (:func:`recorded_backend`),
    with :func:`backend_notice` passed to ``say`` where ``--backend`` named another.

    ``emulation`` (from ``nbox emulate -o``): {"world_size": W, "real_ranks": [global rank of each real
    process], ...}. The traces are then named by the global rank each real process played, the job's
    world size is W, the bundle's ``kind`` is "emulated" and the dict is kept as the manifest's
    ``emulation`` key.
    """
    from nbox_record.convert import RankInput, convert_ranks
    from nbox_trace.bundle import THREAD_CPU_KEY, Manifest, observed_summary, thread_cpu_figures, write_bundle

    staging = work / "staging"
    staging.mkdir()
    timings: dict[int, dict[str, Any]] = {}
    inputs: dict[int, RankInput] = {}
    for real, d in _rank_dirs(work).items():
        if not (d / raw.TIMINGS).is_file() or not (d / raw.HOST_ET).is_file():
            continue  # keep_partial: ranks without a capture are left out and listed in the manifest
        rank = int(emulation["real_ranks"][real]) if emulation else real
        timings[rank] = _read_json(d / raw.TIMINGS)
        if emulation:
            timings[rank]["world_size"] = int(emulation["world_size"])
        kineto, coll, lean = d / raw.KINETO, d / raw.COLLECTIVES, d / raw.KINETO_LEAN
        inputs[rank] = RankInput(d / raw.HOST_ET, kineto if kineto.is_file() else None,
                                 coll if coll.is_file() else None,
                                 int(timings[rank].get("world_size", 0)) or None,
                                 lean if lean.is_file() else None)
    if not timings:
        raise RecordError(f"no rank produced a usable capture in {work}")
    conv = convert_ranks(inputs, staging)
    groups, nodes_per_rank = conv.process_groups, conv.nodes_per_rank
    first = timings[min(timings)]
    if backend is None:
        backend = recorded_backend(cfg.backend, timings)
        notice = backend_notice(cfg.backend, timings)
        if notice and say is not None:
            say(notice)
    observed = observed_summary({r: t["iteration_us"] for r, t in timings.items()})
    cpu = thread_cpu_figures(timings)  # the profiler's overhead, for the replay (nbox_replay.inputs.profiler)
    if cpu:
        observed[THREAD_CPU_KEY] = cpu
    manifest = Manifest(
        producer={"nbox": __version__, "torch": first.get("torch"), "backend": backend,
                  "cuda": first.get("cuda"), "nccl": first.get("nccl"), "python": first.get("python")},
        hardware={"hostname": first.get("hostname"), "machine": platform.machine(),
                  "processor": platform.processor(), "cpu_count": os.cpu_count(), "device": first.get("device"),
                  **(conv.hardware if conv.hardware.get("device") == "cuda" else {})},  # CUDA seen in the traces
        job={"world_size": first.get("world_size"), "ranks_recorded": sorted(timings),
             "nproc_per_node": cfg.nproc_per_node, "nnodes": cfg.nnodes, "node_rank": cfg.node_rank,
             "process_groups": groups,
             "script": str(script) if cfg.script is not None else f"nbox example {cfg.example}",
             "args": list(cfg.script_args), **_node_facts(cfg, timings, local_addr)},
        observed=observed,
        capture={"warmup": cfg.warmup, "iterations_timed": cfg.iterations, "iterations_captured": cfg.capture,
                 "iterations_lean": cfg.lean,
                 "boundary": first.get("boundary"), "raw_format": raw.RAW_FORMAT_VERSION},
        complete=complete,
        kind="emulated" if emulation else "recorded",
        extra={"emulation": emulation} if emulation else {},
    )
    out = write_bundle(cfg.out, manifest, conv.files, overwrite=cfg.overwrite)
    return out, sorted(timings), float(observed["iteration_time_us"]["median"]), nodes_per_rank
