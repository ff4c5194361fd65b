"""One rank's raw capture, joined: the host ET walked (:mod:`nbox_record.convert.toplevel`), its operators matched
to Kineto's CPU events (:mod:`nbox_record.sources.kineto`), and nbox's collective log when there is one."""

from __future__ import annotations

from dataclasses import dataclass, field

from nbox_record.convert.toplevel import BOOKKEEPING, Walk, walk
from nbox_record.sources import (
    CollectiveLogData,
    CpuEvent,
    EtNode,
    HostEt,
    KinetoTrace,
    LeanTime,
    join_host_ops,
    lean_times,
    repair_nesting,
)


@dataclass
class RankInputs:
    """The inputs of one rank's conversion and what reading them together found."""

    et: HostEt
    trace: KinetoTrace | None
    log: CollectiveLogData | None
    rank: int
    w: Walk
    ev_of: dict[int, int] = field(default_factory=dict)  # ET node id -> index in ``trace.cpu``
    join_method: str = "none"  # how the ET was joined to Kineto (``nbox_kineto_join``)
    nesting_repaired: int = 0  # ET nodes re-parented by Kineto's clock (:mod:`nbox_record.sources.nesting`)
    lean: dict[int, LeanTime] = field(default_factory=dict)  # index in ``trace.cpu`` -> lean figures
    lean_iterations: int = 0  # iterations of the lean pass (0: none)

    @classmethod
    def join(cls, et: HostEt, trace: KinetoTrace | None, log: CollectiveLogData | None, rank: int,
             lean: KinetoTrace | None = None) -> RankInputs:
        """Match the ET's operators (bookkeeping markers left out) to Kineto's events, repair the ET's nesting by
        their times (:mod:`nbox_record.sources.nesting`), then walk it; with the lean pass's trace, the captured events'
        lean figures (:mod:`nbox_record.sources.leantiming`)."""
        ev_of: dict[int, int] = {}
        method, repaired = "none", 0
        if trace is not None:
            nodes = sorted((n for n in et.nodes.values() if not n.name.startswith(BOOKKEEPING)),
                           key=lambda n: (n.order, n.id))
            ev_of, method = join_host_ops(nodes, trace)
            if method == "rf_id":  # an order join can pair an operator with another call of the same name
                et, repaired = repair_nesting(et, ev_of, trace)
        found: dict[int, LeanTime] = {}
        iterations = 0
        if trace is not None and lean is not None:
            found = lean_times(trace, lean)
            iterations = max((t.samples for t in found.values()), default=0)
        return cls(et, trace, log, rank, walk(et), ev_of, method, repaired, found, iterations)

    def ev(self, n: EtNode) -> CpuEvent | None:
        """The Kineto CPU event of an ET node, if the join found one (times in microseconds)."""
        assert self.trace is not None or not self.ev_of
        i = self.ev_of.get(n.id)
        return None if i is None or self.trace is None else self.trace.cpu[i]

    def lean_of(self, n: EtNode) -> LeanTime | None:
        """The lean pass's figures for an ET node (its Kineto event's counterpart), if any."""
        i = self.ev_of.get(n.id)
        return None if i is None else self.lean.get(i)
