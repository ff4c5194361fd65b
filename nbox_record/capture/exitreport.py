"""How a recording rank ends: ``error.json`` for a failure (the first one wins) and the exit itself.

Why ``os._exit`` and not ``sys.exit``: see :mod:`nbox_record.capture.bootstrap`, "Stopping". Every nbox file is
written and closed (temp + rename) before it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from nbox_record.handoff import rawformat
from nbox_trace.errors import OutputWriteError
from nbox_trace.files import write_json_atomic

#: Exit code of a rank that nbox stops because of a failure (a script's own exception also gives 1).
EXIT_FAILURE = 1


class ErrorRecord(TypedDict):
    """``error.json`` (see :mod:`nbox_record.handoff.rawformat`)."""

    rank: int
    type: str
    message: str
    traceback: str
    time_us: float  # wall clock when written: the earliest error of a run is its root cause


class ErrorFile:
    """This rank's ``error.json``, written once, by the recording process only."""

    def __init__(self, out_dir: Path, rank: int, pid: int) -> None:
        self.path = out_dir / rawformat.ERROR
        self.rank, self.pid = rank, pid
        self._lock = threading.Lock()
        self._written = False

    def write(self, kind: str, message: str, tb: str = "") -> None:
        """Write ``error.json`` unless a failure was already written (the first failure wins)."""
        with self._lock:
            if self._written or os.getpid() != self.pid:
                return
            self._written = True
        record: ErrorRecord = {"rank": self.rank, "type": kind, "message": message, "traceback": tb,
                               "time_us": time.time() * 1e6}
        try:
            write_json_atomic(self.path, record, durable=True)
        except OutputWriteError as exc:
            print(f"nbox: rank {self.rank}: cannot write {self.path}: {exc}", file=sys.stderr)


def flush_everything() -> None:
    """Flush logging and stdio before ``os._exit`` (which skips Python's own shutdown)."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def die(message: str) -> NoReturn:
    """``message`` on stderr, then exit :data:`EXIT_FAILURE`."""
    print(message, file=sys.stderr)
    flush_everything()
    os._exit(EXIT_FAILURE)


def stop_process(rank: int, world_size: int, barrier_timeout_s: float) -> NoReturn:
    """All ranks done (store barrier), then a clean process-group teardown and ``os._exit(0)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            _store_barrier(world_size, barrier_timeout_s)
        except Exception as exc:  # a peer died or is late: our files are complete anyway
            print(f"nbox: rank {rank}: not all ranks reached the end of the capture "
                  f"({type(exc).__name__}: {exc}); stopping anyway", file=sys.stderr)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    flush_everything()
    os._exit(0)


def _store_barrier(world_size: int, timeout_s: float) -> None:
    """Every rank adds 1 to a key of the rendezvous store, then waits until all have (no collective)."""
    import datetime

    import torch.distributed as dist

    from nbox_trace.share import count_in, leave_last

    store: Any = dist.distributed_c10d._get_default_store()
    key = "nbox_record/capture_done"
    store.wait([count_in(store, key, world_size)], datetime.timedelta(seconds=timeout_s))
    leave_last(store, key + "/left", dist.get_rank(), world_size, timeout_s)  # rank 0 may host the store
