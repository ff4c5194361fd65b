"""What a virtual replay returns: each rank's times and intervals, each answered collective, the whole run.

Split from :mod:`nbox_replay.virtual.engine`, which fills them in (:func:`~nbox_replay.virtual.engine.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbox_replay.virtual.breakdown import RankIntervals, job_windows

__all__ = ["CollectiveAnswer", "RankResult", "SimResult"]


@dataclass
class RankResult:
    """One replayed rank. Times in microseconds of virtual time; ``iteration_us`` per repetition of the graph.

    ``intervals`` is what the breakdown (:mod:`nbox_replay.virtual.breakdown`) partitions: every compute node's
    (start, end) and every communication's (issue, modeled start, modeled end), all repetitions;
    ``comm_answers[k]`` is the answer of ``intervals.comms[k]`` (None: an unpriced node, its recorded
    duration). ``iteration_end_us``: when the rank ended each captured iteration of each repetition
    (absolute virtual time; see :func:`nbox_replay.inputs.graph.captured_iterations`).
    """

    rank: int
    iteration_us: list[float] = field(default_factory=list)
    start_us: list[float] = field(default_factory=list)  # per node of the last repetition
    end_us: list[float] = field(default_factory=list)
    issue_end_us: dict[int, float] = field(default_factory=dict)  # comm node -> when its issue finished
    waited_on: dict[int, int] = field(default_factory=dict)  # node -> the comm node it waited for
    intervals: RankIntervals = field(default_factory=RankIntervals)
    comm_answers: list[CollectiveAnswer | None] = field(default_factory=list)
    iteration_end_us: list[float] = field(default_factory=list)


@dataclass
class CollectiveAnswer:
    """One answered collective (the same for every member)."""

    pg: str
    seq: int
    collective: str
    nbytes: float
    rule: str
    algorithm: str
    start_us: float
    end_us: float
    recorded_us: float | None = None  # the recording's own time of the call (nbox_replay.inputs.recorded_calls)


@dataclass
class SimResult:
    """The outcome of one virtual replay."""

    world_size: int
    ranks: dict[int, RankResult]
    collectives: list[CollectiveAnswer]
    unpriced: int
    nodes_replayed: int
    captured: int = 1  # captured iterations per repetition (1 when the trace marks none)
    iterations_note: str = ""  # how the iterations were found, for the report

    def windows(self) -> list[tuple[float, float]]:
        """The job's iteration windows, captured iterations of every repetition in order
        (:func:`nbox_replay.virtual.breakdown.job_windows`: an iteration ends when its last rank ends it)."""
        return job_windows({r: rr.iteration_end_us for r, rr in self.ranks.items()})

    def iteration_us(self) -> list[float]:
        """Per captured iteration of every repetition, the job's iteration time (its window's length)."""
        return [e - s for s, e in self.windows()]
