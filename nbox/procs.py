"""Child processes: stopping a launcher (torch.distributed.run) together with every rank it started.

The launchers (``nbox record``, ``nbox calibrate``, ``nbox replay --clock real``) start torchrun with
``start_new_session=True``, so torchrun and its ranks form one process group that can be stopped as one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["terminate_group"]


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
