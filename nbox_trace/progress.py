"""Progress of long work, as the library reports it: what it is doing and how far, through a callback.

A long operation (``nbox record``, ``nbox emulate``, ``nbox calibrate``, a live replay, ``nbox sweep``) takes an
optional ``steps`` callback and calls it with a :class:`Step` each time its state changes. The library never
draws anything: the command line renders the steps (a rich progress bar on a terminal, plain lines otherwise).

Where the work runs in other processes (the ranks), :func:`watch` polls what they write (their ``progress.json``)
on a daemon thread while the caller waits, and reports each change.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Report", "Step", "StepFn", "watch"]


@dataclass(frozen=True)
class Step:
    """One state of a long operation: ``what`` it is doing ("recording, timed iterations"), and how far: ``done``
    of ``total`` units (``unit``: "iterations", "points"...; ``done`` or ``total`` None where unknown);
    ``detail``: the item at hand, which changes more often than ``what`` ("all_reduce of 64.0 KiB")."""

    what: str
    done: int | None = None
    total: int | None = None
    unit: str = ""
    detail: str = ""

    def text(self) -> str:
        """``"recording, timed iterations: 4/10 iterations"`` (with `` (detail)`` after ``what`` when given), or
        ``what`` alone where the count is unknown."""
        head = self.what + (f" ({self.detail})" if self.detail else "")
        if self.done is None:
            return head
        of = f"/{self.total}" if self.total is not None else ""
        return f"{head}: {self.done}{of}" + (f" {self.unit}" if self.unit else "")


#: A callback told only steps (None: nobody is told).
StepFn = Callable[[Step], None]
#: The callback a long operation is given: a message (a phase begins, a notice) or a :class:`Step` (how far).
Report = Callable[[str | Step], None]


@contextlib.contextmanager
def watch(read: Callable[[], Step | None], report: StepFn | None, period_s: float = 0.5) -> Iterator[None]:
    """While the block runs, call ``read()`` every ``period_s`` on a daemon thread and pass each new step (not
    None, different from the last) to ``report``; nothing when ``report`` is None. A ``read`` that raises is
    treated as "nothing new" (the files it reads are being written by other processes)."""
    if report is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        last: Step | None = None
        while not stop.wait(period_s):
            try:
                step = read()
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if step is not None and step != last:
                report(step)
                last = step

    thread = threading.Thread(target=loop, name="nbox-progress-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2 * period_s)
