"""For tests and benches: a cluster of network namespaces on one machine.

The nodes, their shaped links and their CPUs (``namespaces``), a node's CPU share (``cpu``) and the thread CPUs of
a node (``threads``).

May import: ``nbox_trace.launch`` and the base's own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "namespaces": ("Testbed", "unavailable"),
    "threads": ("ThreadPolicy", "netns_inode"),
}

__all__ = ["Testbed", "ThreadPolicy", "netns_inode", "unavailable"]

if TYPE_CHECKING:
    from nbox_trace.testbed.namespaces import Testbed, unavailable
    from nbox_trace.testbed.threads import ThreadPolicy, netns_inode
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
