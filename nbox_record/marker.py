"""The fallback iteration marker for scripts that never call ``optimizer.step()`` (torch.optim).

Call it once at the end of every training iteration::

    import nbox_record
    nbox_record.step()

It costs one attribute lookup and does nothing unless the process is being recorded by ``nbox record``
(the bootstrap is installed), so the script runs unchanged without nbox. The first call makes markers the
only boundaries for the rest of the run (optimizer steps are then ignored) and restarts the warm-up count.
"""

from __future__ import annotations

import sys


def step() -> None:
    """Mark the end of one training iteration (a no-op when not recording)."""
    bootstrap = sys.modules.get("nbox_record.capture.bootstrap")
    if bootstrap is not None:
        bootstrap.marker_step()
