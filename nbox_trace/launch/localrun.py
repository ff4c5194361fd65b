"""nbox's own launcher for the ranks of one machine: what ``torchrun --standalone --max-restarts 0 --redirects 3``
did for a single-node launch, without torchrun's agent process.

The ranks see what torchrun's ``LocalElasticAgent`` gives its workers (torch 2.13): ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``, ``GROUP_WORLD_SIZE``,
``ROLE_WORLD_SIZE``, ``MASTER_ADDR`` (``127.0.0.1``), ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``,
``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_USE_AGENT_STORE`` (False: rank 0 hosts the
store), ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (the caller's, default 1) and ``TORCHELASTIC_ERROR_FILE``.

* The store's port is chosen before the ranks start and held by :func:`reserved_port` (bound with ``SO_REUSEADDR``,
  not listening) until the run ends: rank 0's store can bind it, another process cannot.
* Rank ``i``'s stdout and stderr go to ``<log_dir>/<run id>/attempt_0/<i>/std{out,err}.log`` (torchrun's layout).
* Each rank runs in a session of its own. Every :data:`POLL_S` seconds the launcher looks at the ranks without
  reaping them; when one has exited non-zero, that poll's failures are the verdict (killed by a signal first, then
  by rank), and every rank's process group gets SIGTERM, then SIGKILL after ``grace_s`` seconds. Past the deadline,
  or on an interrupt, likewise.
* The exit code: 0 when every rank exited 0, 1 when one failed, None when stopped at the deadline.

This module does not import torch. Why it exists and why each rule: docs/design/launcher.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["POLL_S", "LocalRun", "exit_code", "exit_text", "rank_environment", "reserved_port", "run_local",
           "stop_group"]

#: How often the launcher looks at its ranks, seconds: torchrun's agent's ``--monitor-interval`` default, so a
#: failed rank's peers get as long as they had under torchrun to write their own error files before they are stopped.
POLL_S = 0.1
#: The address ranks reach rank 0's store at.
MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class LocalRun:
    """How a local launch ended.

    Attributes:
        returncode: 0 (every rank exited 0), 1 (one failed), None (stopped at the deadline).
        timed_out: stopped at the deadline.
        failures: (local rank, "exited with code -9 (SIGKILL)") of the ranks seen failed in the first poll that saw
            any, killed by a signal first, then by rank; empty when none failed.
        log: this launcher's own lines (what it started, who failed first, what it stopped).
        run_dir: ``<log_dir>/<run id>/attempt_0``.
    """

    returncode: int | None
    timed_out: bool
    failures: tuple[tuple[int, str], ...]
    log: str
    run_dir: Path


def exit_text(code: int) -> str:
    """How a rank ended, as torchrun's verdict words it: ``exited with code 1``, ``exited with code -9 (SIGKILL)``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"exited with code {code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A free TCP port, held for rank 0's store until the block ends (module docstring: bound, not listening,
    ``SO_REUSEADDR``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def rank_environment(env: Mapping[str, str], local_rank: int, nproc: int, port: int, run_id: str,
                     error_file: Path) -> dict[str, str]:
    """``env`` plus what torchrun's agent gives worker ``local_rank`` of ``nproc`` on one node (module docstring)."""
    n = str(nproc)
    return {**env, "RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n,
            "GROUP_RANK": "0", "ROLE_RANK": str(local_rank), "ROLE_NAME": "default", "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": n, "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "TORCHELASTIC_ERROR_FILE": str(error_file)}


def exit_code(proc: subprocess.Popen[Any]) -> int | None:
    """``proc``'s exit code (negative: the signal that killed it), or None while it runs, without reaping it: an
    exited process stays a zombie, which keeps its pid and process-group id from being reused (Linux ``waitid``
    with ``WNOWAIT``; elsewhere ``poll``, which reaps)."""
    if proc.returncode is not None:
        return proc.returncode
    if not hasattr(os, "waitid"):  # pragma: no cover - not Linux
        return proc.poll()
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere
        return proc.poll()
    if info is None:
        return None
    killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    return -info.si_status if killed else info.si_status


def stop_group(procs: Sequence[subprocess.Popen[Any]], grace_s: float = 10.0) -> None:
    """SIGTERM the process group each of ``procs`` leads, wait up to ``grace_s`` seconds for ``procs`` to exit, then
    SIGKILL those groups (what is left of them: children that outlived their parent included) and reap ``procs``.
    Nothing is reaped before the SIGKILL (:func:`exit_code`), so no group id can have been reused by then."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
                os.killpg(proc.pid, sig)
        end = time.monotonic() + grace_s
        while any(exit_code(p) is None for p in procs) and time.monotonic() < end:
            time.sleep(0.02)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def _failures(codes: Sequence[int | None]) -> tuple[tuple[int, str], ...]:
    """The ranks of ``codes`` that exited non-zero, killed by a signal first, then by rank."""
    failed = [(i, c) for i, c in enumerate(codes) if c is not None and c != 0]
    return tuple((i, exit_text(c)) for i, c in sorted(failed, key=lambda f: (f[1] > 0, f[0])))


def run_local(cmd: Sequence[str], env: Mapping[str, str], nproc: int, log_dir: Path, timeout_s: float,
              grace_s: float = 10.0) -> LocalRun:
    """Start ``nproc`` ranks of ``cmd`` (each with :func:`rank_environment`), watch them until they have all
    exited, one has failed, or ``timeout_s`` seconds have passed; see the module docstring for the rules."""
    run_id = str(uuid.uuid4())
    run_dir = log_dir / f"{run_id}_local" / "attempt_0"
    log: list[str] = []
    procs: list[subprocess.Popen[Any]] = []
    with reserved_port() as port:
        try:
            for local in range(nproc):
                folder = run_dir / str(local)
                folder.mkdir(parents=True)
                renv = rank_environment(env, local, nproc, port, run_id, folder / "error.json")
                with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
                    procs.append(subprocess.Popen(list(cmd), env=renv, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=err, start_new_session=True))
            log.append(f"started {nproc} rank(s), pids {[p.pid for p in procs]}, store port {port}, run id {run_id}")
            end = time.monotonic() + timeout_s
            while True:
                codes = [exit_code(p) for p in procs]
                failures = _failures(codes)
                if failures:
                    running = [i for i, c in enumerate(codes) if c is None]
                    log.append(f"rank(s) failed: {'; '.join(f'rank {r} {t}' for r, t in failures)}; stopping "
                               f"{'rank(s) ' + str(running) if running else 'what is left of their groups'}")
                    stop_group(procs, grace_s)
                    return LocalRun(1, False, failures, "\n".join(log), run_dir)
                if all(c is not None for c in codes):
                    for proc in procs:  # reap (as torchrun, a child a rank left running is left alone)
                        proc.wait()
                    return LocalRun(0, False, (), "\n".join(log), run_dir)
                if time.monotonic() >= end:
                    log.append(f"deadline of {timeout_s:g} s passed: stopping every rank")
                    stop_group(procs, grace_s)
                    return LocalRun(None, True, (), "\n".join(log), run_dir)
                time.sleep(POLL_S)
        except BaseException:
            stop_group(procs, grace_s)
            raise
