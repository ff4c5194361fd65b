"""Every rank's result on every node: small JSON documents exchanged through the run's rendezvous store.

A run over several nodes leaves each rank's files on its own node, but each node's nbox command must report the
whole job (its iteration is made from every rank's, on whichever node each runs). So, at its end, every rank puts
its result in the store that torch.distributed already shares (``set``), waits until every rank has (``wait``)
and reads them all (``get``): no collective is added to the job, and the store is the one the ranks rendezvoused
through. Rank 0 leaves last (:func:`leave_last`): on one node its process hosts the store
(``nbox_trace.launch.localrun``: no agent store), and a rank still reading when rank 0 exits would lose it. Used by
``nbox emulate`` (:mod:`nbox_record.capture.emulated_rank`) and live replay (:mod:`nbox_replay.live._worker`); this
module takes the store as an argument and imports no torch.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from typing import Any, Protocol

from nbox_trace.errors import NboxError

__all__ = ["ResultsMissing", "Store", "count_in", "leave_last", "share_results"]


class ResultsMissing(NboxError):
    """Some ranks' results did not reach the store in time (their rank failed or their node went away)."""


class Store(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None: ...
    def add(self, key: str, amount: int) -> int: ...


def share_results(store: Store, prefix: str, rank: int, nranks: int, doc: Any, timeout_s: float) -> dict[int, Any]:
    """Put ``doc`` (JSON-able) under ``<prefix>/<rank>``, wait for ranks ``0..nranks-1``, return all by rank.

    Raises:
        ResultsMissing: naming the ranks whose results did not arrive within ``timeout_s``.
    """
    store.set(f"{prefix}/{rank}", json.dumps(doc))
    keys = [f"{prefix}/{r}" for r in range(nranks)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # torch raises its own DistStoreError / RuntimeError on a timeout
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise ResultsMissing(f"the results of rank(s) {missing} did not arrive within {timeout_s:g} s "
                             f"({type(exc).__name__})") from None
    raws = [store.get(k) for k in keys]
    leave_last(store, f"{prefix}/read", rank, nranks, timeout_s)
    out = {}
    for r, raw in enumerate(raws):
        try:
            out[r] = json.loads(raw)
        except ValueError:
            raise ResultsMissing(f"the result of rank {r} in the store is not JSON") from None
    return out


def count_in(store: Store, key: str, nranks: int) -> str:
    """Add this rank to the count under ``key``; the last of ``nranks`` sets ``<key>/all``, which is returned (the
    key to wait for)."""
    done = f"{key}/all"
    if store.add(key, 1) >= nranks:
        store.set(done, "1")
    return done


def leave_last(store: Store, key: str, rank: int, nranks: int, timeout_s: float) -> None:
    """Count this rank out under ``key``; rank 0 then waits (at most ``timeout_s`` seconds) until all ``nranks``
    have, so that its process, which may host the store, does not exit while another rank still uses it. A rank
    that never arrives costs rank 0 the timeout, not an error: it has its results."""
    done = count_in(store, key, nranks)
    if rank == 0:  # torch's timeout error: the others went away, there is nothing left to protect
        with contextlib.suppress(Exception):
            store.wait([done], datetime.timedelta(seconds=timeout_s))
