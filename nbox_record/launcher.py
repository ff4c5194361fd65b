"""``nbox record``: launch a script through torch.distributed.run with the capture bootstrap
injected, wait with a deadline, convert each rank's raw capture to Chakra ET, and write a bundle.

The script is not edited: ``nbox_record/_inject`` goes first on ``PYTHONPATH``, so its
``sitecustomize`` starts :mod:`nbox_record.bootstrap` in every rank when ``NBOX_RECORD_DIR`` is set
(see ``rawformat`` for what each rank writes). The launch is torchrun's own machinery
(``python -m torch.distributed.run``), so ``--nnodes/--node-rank/--rdzv-endpoint`` work the way
users already launch multi-node jobs; each node's ``nbox record`` writes a bundle of its own ranks.

Faults never hang: the whole run has a deadline, after which the process group of torchrun and
every rank is terminated (SIGTERM, then SIGKILL); the error names the ranks that had not finished
and what each last reported. A rank that raises writes ``error.json``; the first such error is
reported with its rank. No bundle is written unless every rank's capture is complete
(``keep_partial`` writes one marked ``complete: false``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox_record import rawformat as raw
from nbox_record.recordenv import record_env
from nbox_trace import __version__
from nbox_trace.errors import InputNotFoundError, NboxError
from nbox_trace.procs import root_error, run_with_deadline

EXAMPLES = ("ddp_mlp", "ddp_transformer", "fsdp2_transformer")
_EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


class RecordError(NboxError):
    """The recorded run failed: a rank raised, died or hung, or its capture is unusable."""

    exit_code = 1


@dataclass(frozen=True)
class RecordConfig:
    """Everything ``nbox record`` needs. Times in seconds."""

    out: Path
    script: Path | None = None          # None: the built-in example
    script_args: tuple[str, ...] = ()
    example: str = "ddp_mlp"
    nproc_per_node: int = 2
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    warmup: int = 3
    iterations: int = 10
    capture: int = 1
    backend: str = "auto"               # auto | gloo | nccl
    run_to_end: bool = False
    keep_partial: bool = False
    keep_raw: bool = False
    overwrite: bool = False
    timeout_s: float = 900.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.warmup < 0 or self.iterations < 1 or self.capture < 1:
            raise ValueError(f"need warmup >= 0, iterations >= 1, capture >= 1; got {self.warmup}, "
                             f"{self.iterations}, {self.capture}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        if self.script is None and self.example not in EXAMPLES:
            raise ValueError(f"unknown example {self.example!r}; choose from {', '.join(EXAMPLES)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class RecordResult:
    bundle: Path
    ranks: list[int]
    observed_median_us: float
    complete: bool
    wall_s: float
    nodes_per_rank: dict[int, int]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def script_path(cfg: RecordConfig) -> Path:
    if cfg.script is not None:
        if not cfg.script.is_file():
            raise InputNotFoundError(f"{cfg.script}: script not found")
        return cfg.script
    return _EXAMPLES_DIR / f"{cfg.example}.py"


def _resolve_backend(cfg: RecordConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    import torch  # only here: the CLI must not import torch for --help

    return "nccl" if torch.cuda.is_available() else "gloo"


def launch_command(cfg: RecordConfig, log_dir: Path) -> list[str]:
    """The torch.distributed.run command line (rendezvous: c10d endpoint, or a free local port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc_per_node),
           "--nnodes", cfg.nnodes, "--node-rank", str(cfg.node_rank), "--max-restarts", "0",
           "--log-dir", str(log_dir), "--redirects", "3"]
    if cfg.rdzv_endpoint:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", cfg.rdzv_endpoint]
    else:
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    args = list(cfg.script_args)
    if cfg.script is None:  # a built-in example runs exactly the iterations the capture needs, plus slack
        args = ["--steps", str(max(cfg.warmup, 1) + cfg.iterations + cfg.capture + 2), *args]
    return [*cmd, str(script_path(cfg)), *args]


def launch_env(cfg: RecordConfig, work: Path, backend: str) -> dict[str, str]:
    """The caller's environment plus :func:`nbox_record.recordenv.record_env` and one thread per rank."""
    env = dict(os.environ)
    env.update(cfg.extra_env)
    env.update(record_env(work, warmup=cfg.warmup, iterations=cfg.iterations, capture=cfg.capture,
                          run_to_end=cfg.run_to_end, pythonpath=env.get("PYTHONPATH")))
    env.setdefault("OMP_NUM_THREADS", "1")  # two ranks x two threads on two cores run ~50x slower
    env["NBOX_BACKEND"] = backend  # read by the built-in examples
    env["PYTHONUNBUFFERED"] = "1"
    return env


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


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)"
                         r"[^\n]*?(?:\((SIG\w+)\))?\s*$", re.S | re.M)


def root_cause(torchrun_stderr: str) -> tuple[int, str] | None:
    """torchrun's own verdict on a failed run: (rank, "rank 1 exited with code -9 (SIGKILL)"), if it gave one."""
    match = _ROOT_CAUSE.search(torchrun_stderr)
    if match is None:
        return None
    rank, code, sig = match.groups()
    return int(rank), f"rank {rank} exited with code {code}" + (f" ({sig})" if sig else "")


def _failure(cfg: RecordConfig, work: Path, log_dir: Path, rc: int | None, timed_out: bool,
             torchrun_stderr: str = "") -> RecordError:
    dirs = _rank_dirs(work)
    verdict = root_cause(torchrun_stderr)
    errors = []
    for rank, d in dirs.items():
        if (d / raw.ERROR).is_file():
            err = _read_json(d / raw.ERROR)
            if isinstance(err, dict):
                errors.append((float(err.get("time_us") or (d / raw.ERROR).stat().st_mtime * 1e6), rank, err))
    if verdict is not None and verdict[0] not in {r for _, r, _ in errors}:
        # The first rank to fail left no error.json (a signal, os._exit): its peers' errors are consequences.
        others = sorted(r for _, r, _ in errors)
        return RecordError(verdict[1] + (f" (then rank(s) {others} failed too)" if others else ""))
    if errors:
        # When one rank fails, its peers fail next (e.g. gloo "Connection closed by peer"): the earliest
        # error that is not such a consequence is the root cause.
        _, rank, err = errors[root_error([(t, r, str(e.get("message", ""))) for t, r, e in errors])]
        msg = f"rank {rank} failed: {err.get('type', 'error')}: {err.get('message', '')}"
        others = sorted(r for _, r, _ in errors if r != rank)
        if others:
            msg += f" (then rank(s) {others} failed too)"
        return RecordError(msg)
    if timed_out:
        unfinished = [r for r in range(_expected_ranks(cfg)) if not (work / f"rank{r}" / raw.TIMINGS).is_file()]
        states = "; ".join(f"rank {r}: {_rank_status(work / f'rank{r}')}" for r in unfinished)
        return RecordError(f"the run did not finish within {cfg.timeout_s:.0f} s (--timeout) and was stopped; "
                           f"unfinished ranks: {states or 'none'}")
    missing = [r for r in range(_expected_ranks(cfg)) if not (work / f"rank{r}" / raw.TIMINGS).is_file()]
    logs = sorted(log_dir.rglob("stderr.log"))
    detail = ""
    for log in logs:
        tail = _tail(log)
        if tail:
            detail = f"\n  last lines of {log.parent.name}/stderr.log:\n    " + tail.replace("\n", "\n    ")
            break
    return RecordError(f"the run exited with code {rc}; ranks without a capture: {missing or 'none'}{detail}")


def run_torchrun(cmd: list[str], env: dict[str, str], log_dir: Path, timeout_s: float,
                 quiet_stdout: bool = False) -> tuple[int | None, bool, bytes]:
    """Run torchrun with a deadline (:func:`nbox_trace.procs.run_with_deadline`); keep its stderr in
    ``log_dir/torchrun.stderr.log``. Returns (exit code, timed out, stderr)."""
    return run_with_deadline(cmd, env, timeout_s, quiet_stdout=quiet_stdout,
                             stderr_log=log_dir / "torchrun.stderr.log")


def record(cfg: RecordConfig, progress: Callable[[str], None] | None = None) -> RecordResult:
    """Run the recording described by ``cfg`` and write the bundle; see the module docstring."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    script = script_path(cfg)
    if cfg.out.exists() and not cfg.overwrite:
        raise RecordError(f"{cfg.out}: already exists (use --overwrite to replace it)")
    backend = _resolve_backend(cfg)
    cfg.out.resolve().parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{cfg.out.name}.raw-", dir=cfg.out.resolve().parent))
    log_dir = work / "logs"
    try:
        cmd = launch_command(cfg, log_dir)
        say(f"launching {cfg.nproc_per_node} rank(s) of {script.name} ({backend}): warm-up {cfg.warmup}, "
            f"timed {cfg.iterations}, captured {cfg.capture}")
        rc, timed_out, err_bytes = run_torchrun(cmd, launch_env(cfg, work, backend), log_dir, cfg.timeout_s,
                                                quiet_stdout=cfg.run_to_end)
        dirs = _rank_dirs(work)
        complete = not timed_out and rc == 0 and len(dirs) == cfg.nproc_per_node and all(
            (d / raw.TIMINGS).is_file() and (d / raw.HOST_ET).is_file() for d in dirs.values())
        if not complete and not cfg.keep_partial:
            raise _failure(cfg, work, log_dir, rc, timed_out, (err_bytes or b"").decode(errors="replace"))
        say("converting the capture to Chakra ET")
        result = _write_bundle(cfg, work, script, backend, complete)
        return RecordResult(result[0], result[1], result[2], complete, time.monotonic() - started, result[3])
    finally:
        if cfg.keep_raw:
            say(f"raw capture kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _write_bundle(cfg: RecordConfig, work: Path, script: Path, backend: str, complete: bool,
                  emulation: dict[str, Any] | None = None) -> tuple[Path, list[int], float, dict[int, int]]:
    """Convert the ranks' captures in ``work`` and write the bundle ``cfg.out``.

    ``emulation`` (from ``nbox emulate -o``): {"world_size": W, "real_ranks": [global rank of each real
    process], ...}. The traces are then named by the global rank each real process played, the job's
    world size is W, the bundle's ``kind`` is "emulated" and the dict is kept as the manifest's
    ``emulation`` key.
    """
    from nbox_record.importer import RankInput, convert_ranks
    from nbox_trace.bundle import Manifest, observed_summary, write_bundle

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
        kineto, coll = d / raw.KINETO, d / raw.COLLECTIVES
        inputs[rank] = RankInput(d / raw.HOST_ET, kineto if kineto.is_file() else None,
                                 coll if coll.is_file() else None,
                                 int(timings[rank].get("world_size", 0)) or None)
    if not timings:
        raise RecordError(f"no rank produced a usable capture in {work}")
    conv = convert_ranks(inputs, staging)
    groups, nodes_per_rank = conv.process_groups, conv.nodes_per_rank
    first = timings[min(timings)]
    observed = observed_summary({r: t["iteration_us"] for r, t in timings.items()})
    manifest = Manifest(
        producer={"nbox": __version__, "torch": first.get("torch"), "backend": backend,
                  "cuda": first.get("cuda"), "nccl": first.get("nccl"), "python": first.get("python")},
        hardware={"hostname": first.get("hostname"), "machine": platform.machine(),
                  "processor": platform.processor(), "cpu_count": os.cpu_count(), "device": first.get("device")},
        job={"world_size": first.get("world_size"), "ranks_recorded": sorted(timings),
             "nproc_per_node": cfg.nproc_per_node, "nnodes": cfg.nnodes, "node_rank": cfg.node_rank,
             "process_groups": groups,
             "script": str(script) if cfg.script is not None else f"nbox example {cfg.example}",
             "args": list(cfg.script_args)},
        observed=observed,
        capture={"warmup": cfg.warmup, "iterations_timed": cfg.iterations, "iterations_captured": cfg.capture,
                 "boundary": first.get("boundary"), "raw_format": raw.RAW_FORMAT_VERSION},
        complete=complete,
        kind="emulated" if emulation else "recorded",
        extra={"emulation": emulation} if emulation else {},
    )
    out = write_bundle(cfg.out, manifest, conv.files, overwrite=cfg.overwrite)
    return out, sorted(timings), float(observed["iteration_time_us"]["median"]), nodes_per_rank
