"""How the command line shows a long operation's progress on stderr (the library only reports it:
:mod:`nbox_trace.progress`).

A terminal gets one rich progress line that counts up in place (what, a bar, done/total, elapsed) with the
messages printed above it; anything else (a log, a pipe, CI) gets plain lines, ``nbox <command>: <what>: 4/10
iterations``: one when what is being done changes, when it finishes, and otherwise at most one per
``every_s`` seconds, so a log stays short. ``--json`` does not silence it: results go to stdout, progress to
stderr.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from nbox_trace.progress import Step

__all__ = ["ProgressLines"]


class ProgressLines:
    """The ``progress`` callback of a long operation: messages and :class:`Step` s, rendered on ``stream``.

    Use it as a context manager (the live line is removed at the end). ``live``: draw with rich (default: when
    ``stream`` is a terminal). ``every_s``: the shortest time between two plain lines of the same step."""

    def __init__(self, command: str, stream: TextIO | None = None, *, live: bool | None = None,
                 every_s: float = 5.0) -> None:
        self.prefix = f"nbox {command}: "
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every_s = every_s
        self._bar: Any = None
        self._task: Any = None
        self._last: Step | None = None
        self._last_at = 0.0

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __call__(self, item: str | Step) -> None:
        if isinstance(item, Step):
            self._step(item)
        elif self._bar is not None:
            self._bar.console.print(self.prefix + item, markup=False, highlight=False)
        else:
            self.stream.write(self.prefix + item + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Remove the live line (plain lines stay as written)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _step(self, step: Step) -> None:
        if self.live:
            self._draw(step)
            return
        now = time.monotonic()
        last = self._last
        changed = last is None or step.what != last.what or step.total != last.total
        finished = step.done is not None and step.done == step.total and step != last
        if changed or finished or (step != last and now - self._last_at >= self.every_s):
            self.stream.write(self.prefix + step.text() + "\n")
            self.stream.flush()
            self._last_at = now
        self._last = step

    def _draw(self, step: Step) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._bar is None:
            console = Console(file=self.stream, highlight=False, markup=False)
            self._bar = Progress(TextColumn(self.prefix + "{task.description}", markup=False), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=step.total)
        what = step.what + (f" ({step.detail})" if step.detail else "")
        self._bar.update(self._task, description=what, total=step.total, completed=step.done or 0)
