"""One rank's raw capture, joined: the host ET walked (:mod:`nbox_record.toplevel`), its operators matched
to Kineto's CPU events (:mod:`nbox_record.kineto`), and nbox's collective log when there is one."""

from __future__ import annotations

from dataclasses import dataclass, field

from nbox_record.comms import CollectiveLogData
from nbox_record.hostet import EtNode, HostEt
from nbox_record.kineto import CpuEvent, KinetoTrace, join_host_ops
from nbox_record.toplevel import BOOKKEEPING, Walk, walk


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

    @classmethod
    def join(cls, et: HostEt, trace: KinetoTrace | None, log: CollectiveLogData | None, rank: int) -> RankInputs:
        """Walk the ET, then match its operators (bookkeeping markers left out) to Kineto's events."""
        inputs = cls(et, trace, log, rank, walk(et))
        if trace is not None:
            nodes = sorted((n for n in et.nodes.values() if not n.name.startswith(BOOKKEEPING)),
                           key=lambda n: (n.order, n.id))
            inputs.ev_of, inputs.join_method = join_host_ops(nodes, trace)
        return inputs

    def ev(self, n: EtNode) -> CpuEvent | None:
        """The Kineto CPU event of an ET node, if the join found one (times in microseconds)."""
        assert self.trace is not None or not self.ev_of
        i = self.ev_of.get(n.id)
        return None if i is None or self.trace is None else self.trace.cpu[i]
