"""Child processes: stopping a launcher (torch.distributed.run) together with every rank it started.

The launchers (``nbox record``, ``nbox calibrate``, ``nbox replay --clock real``) start torchrun with
``start_new_session=True``, so torchrun and its ranks form one process group that can be stopped as one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["is_consequence", "root_error", "run_with_deadline", "terminate_group"]

#: How a rank's error reads when it only reports that a peer went away first (gloo's "Connection closed by
#: peer", a reset socket, NCCL's remote error): a consequence, never the root cause of a failed run.
_CONSEQUENCE = re.compile(r"connection closed by peer|connection reset by peer|broken pipe|remote worker crash"
                          r"|remote process exited|ncclRemoteError", re.I)


def is_consequence(message: str) -> bool:
    """Whether a rank's error message only says that a peer failed first (see :data:`_CONSEQUENCE`)."""
    return _CONSEQUENCE.search(message) is not None


def root_error(errors: Sequence[tuple[float, int, str]]) -> int:
    """Index into ``errors`` ((time, rank, message) per failed rank) of the root cause of a failed run.

    The earliest error that is not a consequence of a peer's failure; when all are consequences, the earliest.
    Time alone is not enough: when a rank's call times out, gloo closes its sockets before that rank has
    written its own error, so its peer's "Connection closed by peer" can be written first.
    """
    if not errors:
        raise ValueError("root_error needs at least one error")
    return min(range(len(errors)),
               key=lambda i: (is_consequence(errors[i][2]), errors[i][0], errors[i][1]))


def terminate_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM ``proc``'s whole process group, wait up to ``grace_s`` seconds, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_with_deadline(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float, *, quiet_stdout: bool = True,
                      stderr_log: Path | None = None) -> tuple[int | None, bool, bytes]:
    """Run ``cmd`` (a launcher) in its own session; past ``timeout_s`` seconds, or if the caller is interrupted,
    stop its whole process group. Its stderr is captured (and kept in ``stderr_log`` when given).

    Returns:
        ``(exit code, timed out, stderr bytes)``; the exit code is None when it was stopped.
    """
    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL if quiet_stdout else None, stderr=subprocess.PIPE)
    timed_out = False
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out, err = True, b""
        terminate_group(proc)
    except BaseException:
        terminate_group(proc)
        raise
    err = err or b""
    if stderr_log is not None:
        stderr_log.parent.mkdir(parents=True, exist_ok=True)
        stderr_log.write_bytes(err)
    return (None if timed_out else proc.returncode), timed_out, err
