"""nbox: record-and-replay emulator for distributed deep-learning training.

This package holds the face (``cli``), the error family (``errors``) and the shared trace model
(``chakra``). It never imports torch at import time.
"""

__version__ = "0.1.0"
