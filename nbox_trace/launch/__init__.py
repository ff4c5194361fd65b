"""The one launcher of ranks: a deadline, the root cause of a failure, a run over several nodes.

:func:`run` a :class:`Launch` (``launcher``); one node's ranks started without torchrun's agent (``localrun``).

May import: the base's own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "launcher": ("Launch", "LaunchResult", "Nodes", "check_nodes", "is_consequence", "python_path", "run",
        "seconds_text", "then_failed"),
    "localrun": ("stop_group",),
}

__all__ = ["Launch", "LaunchResult", "Nodes", "check_nodes", "is_consequence", "python_path", "run",
    "seconds_text", "stop_group", "then_failed"]

if TYPE_CHECKING:
    from nbox_trace.launch.launcher import (
        Launch,
        LaunchResult,
        Nodes,
        check_nodes,
        is_consequence,
        python_path,
        run,
        seconds_text,
        then_failed,
    )
    from nbox_trace.launch.localrun import stop_group
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
