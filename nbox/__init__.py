"""nbox: record-and-replay emulator for distributed deep-learning training.

This package is the face: the command line (``nbox.cli``, one module per command group) and the public API
(``nbox.chakra``, re-exported from the base ``nbox_trace``). It never imports torch at import time.
"""

from nbox_trace import __version__

__all__ = ["__version__"]
