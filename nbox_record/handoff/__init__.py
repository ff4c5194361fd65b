"""What the launcher and the ranks it starts agree on: the raw folder, the environment, the peers, the exit.

The raw per-rank capture's layout (``rawformat``), the environment that carries a run's settings into its ranks
(``env``), which node each rank runs on (``peers``) and how the user's script ended (``scriptexit``).

May import: ``nbox_trace`` only; nothing else of ``nbox_record``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "env": ("Config", "ConfigError", "ENV_BOUNDARY_TIMEOUT", "ENV_DIR", "ENV_OWNER", "config_from_env", "record_env"),
    "peers": ("announce", "collect", "read_peers"),
    "rawformat": ("BOUNDARY_MARKER", "CollectiveRecord", "ProcessGroupInfo", "TIMINGS", "identity_marker",
        "parse_identity_marker"),
    "scriptexit": ("SCRIPT_EXIT", "ended_by_exception", "main_frame"),
}

__all__ = ["BOUNDARY_MARKER", "CollectiveRecord", "Config", "ConfigError", "ENV_BOUNDARY_TIMEOUT", "ENV_DIR",
    "ENV_OWNER", "ProcessGroupInfo", "SCRIPT_EXIT", "TIMINGS", "announce", "collect", "config_from_env",
    "ended_by_exception", "identity_marker", "main_frame", "parse_identity_marker", "rawformat", "read_peers",
    "record_env"]

if TYPE_CHECKING:
    from nbox_record.handoff import rawformat
    from nbox_record.handoff.env import (
        ENV_BOUNDARY_TIMEOUT,
        ENV_DIR,
        ENV_OWNER,
        Config,
        ConfigError,
        config_from_env,
        record_env,
    )
    from nbox_record.handoff.peers import announce, collect, read_peers
    from nbox_record.handoff.rawformat import (
        BOUNDARY_MARKER,
        TIMINGS,
        CollectiveRecord,
        ProcessGroupInfo,
        identity_marker,
        parse_identity_marker,
    )
    from nbox_record.handoff.scriptexit import SCRIPT_EXIT, ended_by_exception, main_frame
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
