"""A tiny discrete-event timeline for virtual time: a clock, an event heap and a tie-break counter.

Modeled on SimPy's core (``simpy/core.py``): events are ``(time, sequence, callback, args)`` in a binary
heap; the sequence number (a counter, incremented per scheduled event) breaks ties so events at the same
time run in the order they were scheduled, which makes a run deterministic. No globals: every timeline is
its own object. Time is in microseconds (float). An exception raised by a callback propagates out of
:meth:`Timeline.run` with the clock at that event's time; nothing is swallowed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

__all__ = ["Timeline"]


class Timeline:
    """A virtual clock (microseconds) and the events scheduled on it.

    Example::

        t = Timeline()
        t.after(5.0, print, "five")
        t.run()          # prints "five"; t.now_us == 5.0
    """

    def __init__(self, start_us: float = 0.0) -> None:
        if isinstance(start_us, bool) or not isinstance(start_us, (int, float)) or not math.isfinite(start_us):
            raise ValueError(f"start_us must be a finite number, got {start_us!r}")
        self._now = float(start_us)
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._cancelled: set[int] = set()

    @property
    def now_us(self) -> float:
        """The current virtual time, microseconds."""
        return self._now

    def __len__(self) -> int:
        """Events still scheduled (cancelled ones excluded)."""
        return len(self._heap) - len(self._cancelled)

    def at(self, time_us: float, callback: Callable[..., Any], *args: Any) -> int:
        """Schedule ``callback(*args)`` at ``time_us`` (>= now); returns the event's id (for :meth:`cancel`).

        Raises:
            ValueError: ``time_us`` is not finite or lies in the past.
        """
        if isinstance(time_us, bool) or not isinstance(time_us, (int, float)) or not math.isfinite(time_us):
            raise ValueError(f"time_us must be a finite number, got {time_us!r}")
        if time_us < self._now:
            raise ValueError(f"time_us {time_us} is in the past (now {self._now})")
        if not callable(callback):
            raise ValueError(f"callback must be callable, got {callback!r}")
        self._seq += 1
        heapq.heappush(self._heap, (float(time_us), self._seq, callback, args))
        return self._seq

    def after(self, delay_us: float, callback: Callable[..., Any], *args: Any) -> int:
        """Schedule ``callback(*args)`` ``delay_us`` (>= 0) after now; returns the event's id."""
        if isinstance(delay_us, bool) or not isinstance(delay_us, (int, float)) or not delay_us >= 0:
            raise ValueError(f"delay_us must be a number >= 0, got {delay_us!r}")
        return self.at(self._now + delay_us, callback, *args)

    def cancel(self, event_id: int) -> None:
        """Cancel a scheduled event (an unknown or already-run id is an error)."""
        if not any(seq == event_id for _, seq, _, _ in self._heap) or event_id in self._cancelled:
            raise ValueError(f"no scheduled event with id {event_id}")
        self._cancelled.add(event_id)

    def peek_us(self) -> float:
        """Time of the next event (``inf`` when none is scheduled)."""
        while self._heap and self._heap[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap)[1])
        return self._heap[0][0] if self._heap else math.inf

    def step(self) -> bool:
        """Run the next event (advancing the clock to it); ``False`` when none is left."""
        if self.peek_us() == math.inf:
            return False
        time_us, _, callback, args = heapq.heappop(self._heap)
        self._now = time_us
        callback(*args)
        return True

    def run(self, until_us: float | None = None) -> int:
        """Run events in (time, scheduling order) until none is left or the next lies after ``until_us``
        (then the clock stops at ``until_us``). Returns the number of events run."""
        if until_us is not None and (isinstance(until_us, bool) or not isinstance(until_us, (int, float))
                                     or not math.isfinite(until_us) or until_us < self._now):
            raise ValueError(f"until_us must be a finite number >= now ({self._now}), got {until_us!r}")
        ran = 0
        while True:
            nxt = self.peek_us()
            if nxt == math.inf or (until_us is not None and nxt > until_us):
                break
            self.step()
            ran += 1
        if until_us is not None:
            self._now = float(until_us)
        return ran
