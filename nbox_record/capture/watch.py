"""The recording rank's two daemon threads: ``progress.json`` and the first-boundary watchdog."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from nbox_record.handoff import rawformat
from nbox_trace.errors import OutputWriteError
from nbox_trace.files import write_json_atomic


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Run ``target`` on a daemon thread called ``name``; the thread."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def report_progress(out_dir: Path, state: Callable[[], tuple[str, int]], stop: threading.Event,
                    period_s: float = 1.0) -> None:
    """Keep ``progress.json`` (phase, iteration: ``state()``) current, so a launcher that must stop a hung run
    can say where each rank was. Written from this thread at most once a period and only on change, never
    from the training thread, so it does not disturb the timed iterations; returns at phase done or
    failed, or when the file cannot be written. ``stop`` wakes it at once: the recorder sets it and joins
    this thread before its process exits (``os._exit`` kills a daemon thread mid-write, which left the
    atomic write's temporary file behind in a CI run)."""
    last: tuple[str, int] | None = None
    while True:
        current = state()
        if current != last:
            try:
                write_json_atomic(out_dir / rawformat.PROGRESS, {"phase": current[0], "iteration": current[1],
                                                                 "time_us": time.time() * 1e6},
                                  durable=False)  # diagnostic only: no fsync stalls during timing
            except OutputWriteError:
                return
            last = current
        if current[0] in ("done", "failed"):
            return
        stop.wait(period_s)


def watch_first_boundary(first: threading.Event, timeout_s: float, expired: Callable[[], None]) -> None:
    """Call ``expired()`` when ``first`` is not set within ``timeout_s`` seconds."""
    if not first.wait(timeout_s):
        expired()
