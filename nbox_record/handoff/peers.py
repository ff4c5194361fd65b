"""Which node each rank of a multi-node recording runs on, so that a failure on one node can name the node and the
ranks of a peer that went away (``peers.json`` in the rank's folder; read by :mod:`nbox_record.launch.launcher`).

Only in a multi-node run (``NBOX_NODE_ADDR``, this node's address, set by :func:`nbox_trace.launch.launcher.settle`): at
its first iteration boundary each rank puts ``{"addr", "group_rank", "hostname"}`` in the job's store under
``nbox/peer/<rank>`` (no rank waits for another); at a later boundary of the warm-up (else when the timed iterations
end) it reads every rank's entry if all are there (``check``: never blocks) and writes ``peers.json``
(``{"<rank>": {...}}``). Nothing here may fail the run: any error leaves the file unwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from nbox_record.handoff import rawformat
from nbox_trace.files import write_json_atomic

ENV_NODE_ADDR = "NBOX_NODE_ADDR"
_KEY = "nbox/peer/{rank}"


def _store() -> Any:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()


def announce(rank: int) -> None:
    """Put this rank's node in the job's store (multi-node runs only)."""
    addr = os.environ.get(ENV_NODE_ADDR)
    if not addr:
        return
    with contextlib.suppress(Exception):
        store = _store()
        if store is not None:
            group = os.environ.get("GROUP_RANK", "")
            store.set(_KEY.format(rank=rank), json.dumps({"addr": addr, "hostname": socket.gethostname(),
                                                          "group_rank": int(group) if group.isdigit() else None}))


def collect(out_dir: Path, world_size: int) -> bool:
    """Write ``peers.json`` from the store if every rank has announced itself; whether it was written."""
    if not os.environ.get(ENV_NODE_ADDR) or world_size < 1:
        return False
    with contextlib.suppress(Exception):
        store = _store()
        keys = [_KEY.format(rank=r) for r in range(world_size)]
        if store is None or not store.check(keys):
            return False
        peers = {str(r): json.loads(store.get(k)) for r, k in enumerate(keys)}
        write_json_atomic(out_dir / rawformat.PEERS, peers)
        return True
    return False


def read_peers(rank_dirs: list[Path]) -> dict[int, dict[str, Any]]:
    """The first readable ``peers.json`` among ``rank_dirs``: global rank -> {"addr", "group_rank", "hostname"}."""
    for d in rank_dirs:
        with contextlib.suppress(OSError, ValueError, RecursionError, TypeError, AttributeError):
            doc = json.loads((d / rawformat.PEERS).read_bytes())
            return {int(r): v for r, v in doc.items() if str(r).isdigit() and isinstance(v, dict)}
    return {}
