"""The virtual engine's event core: a clock, a heap of events and a tie-break counter (SimPy's core).

An event is ``(time, priority, sequence, action)`` in a binary heap (as ``simpy/core.py`` keeps
``(time, priority, eid, event)``): events run in time order, then priority order, then the order they were
scheduled (the counter), so a run is deterministic. Running an event advances the clock to its time and
calls its action, which may schedule further events, at the current time or later. An exception raised
by an action propagates out of :meth:`EventQueue.run` with the clock at that event; nothing is swallowed.

The clock's unit is the caller's: the virtual engine (:mod:`nbox_replay.virtual`) counts rounds in it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["EventQueue"]

Action = Callable[[], None]


class EventQueue:
    """A clock and the events scheduled on it. No globals: each queue is its own object.

    Example::

        q = EventQueue()
        q.schedule(2, 0, lambda: print("two"))
        q.run()          # prints "two"; q.now == 2 and q.priority == 0
    """

    def __init__(self) -> None:
        self.now = 0
        #: The priority of the event running (or last run).
        self.priority = 0
        self._heap: list[tuple[int, int, int, Action]] = []
        self._seq = 0

    def schedule(self, time: int, priority: int, action: Action) -> None:
        """Run ``action()`` at ``time`` (>= now), after the events of that time with a lower priority
        and after those of the same priority scheduled before it."""
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, action))

    def run(self) -> int:
        """Run events in (time, priority, scheduling order) until none is left; the number run."""
        heap, pop = self._heap, heapq.heappop
        ran = 0
        while heap:
            self.now, self.priority, _, action = pop(heap)
            action()
            ran += 1
        return ran
