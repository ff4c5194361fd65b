"""Objects received point to point from an emulated peer: refused, naming the peer and what to do.

Object collectives (``broadcast_object_list``, ``all_gather_object``, ``gather_object``,
``scatter_object_list``) need nothing special: each is a collective of a size tensor, then of a byte tensor,
and the mirror rule (:mod:`emulator_core.backend.mirror`) answers both from the same real member, so the sizes and
the bytes an emulated member contributes are its mirror's, consistent and decodable.

``recv_object_list`` from an emulated peer is different. A point-to-point message from an emulated peer is
something only that peer's own code could produce, and no process runs it (an emulated member mirrors a real
member's *tensors* in collectives; it does not run the script). For tensors the receive yields zeros (the
documented rule); for objects, zeros are a size of 0 and an empty pickle, and the script failed deep inside
torch with "EOFError: Ran out of input". That is what a ``torch.distributed.pipelining`` stage hit: stages
exchange their shapes with ``send_object_list``/``recv_object_list`` (and a warm-up vote with
``send``/``recv``), so a stage whose neighbour stage is emulated cannot learn its neighbour's shapes. Echoing
the receiver's own message back would decode, but as the wrong object (a stage sends forward metadata and
expects backward metadata). The honest answer is a refusal that names the peer and the fix: make the ranks a
process exchanges objects with real (for a pipeline: one real rank per stage, e.g. ``--real-ranks 0,1``
for a two-stage pipeline over ranks 0 and 1; the other pipelines' ranks are then emulated consistently).

:func:`guard_recv_object_list` wraps ``torch.distributed.recv_object_list`` (both names torch code calls it
by) once the ``nbox`` backend is in use; sends to emulated peers are unchanged (the data goes nowhere).
``scatter_object_list`` from an emulated root is refused the same way: no real process holds an emulated
root's list, so the mirror rule scatters zeros, which decode as an empty pickle. (``gather_object`` to an
emulated root needs nothing: the real members' gather goes nowhere and they get ``None``, as non-roots do.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from emulator_core.backend.mirror import UnsupportedCollective

__all__ = ["EmulatedPeerObjectError", "guard_recv_object_list", "refusal"]


class EmulatedPeerObjectError(UnsupportedCollective):
    """``recv_object_list`` from an emulated peer: no process runs that peer's code (the message says what to do)."""


def refusal(src: int, me: int, real_ranks: Sequence[int], call: str = "recv_object_list") -> str:
    """The one-line message for ``call`` by global rank ``me`` from emulated global rank ``src``."""
    wanted = ",".join(str(r) for r in sorted({*real_ranks, src}))
    pipelining = call == "recv_object_list"
    return (f"{call} on rank {me} from rank {src}: rank {src} is emulated, and no process runs an emulated "
            f"rank's code, so it has no object to send"
            + (" (torch.distributed.pipelining stages exchange their shapes this way)" if pipelining else "")
            + f"; make rank {src} real, e.g. --real-ranks {wanted}"
            + (" (for a pipeline: one real rank per stage)" if pipelining else ""))


def guard_recv_object_list(real_ranks: Callable[[], Sequence[int] | None]) -> None:
    """Wrap ``torch.distributed.recv_object_list`` so that a receive from a global rank not in ``real_ranks()``
    raises :class:`EmulatedPeerObjectError` before any tensor is exchanged (``real_ranks()`` returns ``None``
    while no ``nbox`` default group exists: then the call passes through). Idempotent."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = c10d.recv_object_list
    if getattr(original, "_nbox_guarded", False):
        return

    @functools.wraps(original)
    def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                         group_src: int | None = None, use_batch: bool = False) -> Any:
        real = real_ranks()
        peer = src
        if real is not None and peer is None and group_src is not None:
            peer = dist.get_global_rank(group or c10d._get_default_group(), group_src)
        # no source at all: from any rank, which the backend itself refuses by name
        if real is not None and peer is not None and peer not in real:
            raise EmulatedPeerObjectError(refusal(peer, dist.get_rank(), real))
        return original(object_list, src=src, group=group, device=device, group_src=group_src, use_batch=use_batch)

    scatter = c10d.scatter_object_list

    @functools.wraps(scatter)
    def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None = None,
                            src: int | None = None, group: Any = None, group_src: int | None = None) -> Any:
        # from an emulated root the scattered sizes and bytes are zeros (mirror rule): an empty pickle
        real = real_ranks()
        if real is not None:
            root = src if src is not None or group_src is None else dist.get_global_rank(
                group or c10d._get_default_group(), group_src)
            root = 0 if root is None else root  # torch's default source
            if root not in real:
                raise EmulatedPeerObjectError(refusal(root, dist.get_rank(), real, "scatter_object_list"))
        return scatter(scatter_object_output_list, scatter_object_input_list, src=src, group=group,
                       group_src=group_src)

    recv_object_list._nbox_guarded = True  # type: ignore[attr-defined]
    for module in (c10d, dist):
        setattr(module, "recv_object_list", recv_object_list)  # noqa: B010 - mypy: no such attribute
        setattr(module, "scatter_object_list", scatter_object_list)  # noqa: B010
