"""Whether the training script ended by returning or by ``SystemExit`` (``sys.exit(...)``, ``raise SystemExit``).

Python runs ``atexit`` handlers after a ``SystemExit`` has left the script's main module, and a ``SystemExit``
never reaches ``sys.excepthook``: the recorder's exit handler alone cannot tell "the script gave up" from "the
script ran to its end". The main module's frame can: :func:`main_frame` finds it while the script runs (from the
torch import hook, which the script's own ``import torch`` calls), and after the script is over the frame's last
instruction (:func:`ended_by_exception`) is a return when the module ran to its end, and the raising instruction
(a ``raise``, the ``sys.exit`` call, the call that raised) when an exception left it. An uncaught exception other
than ``SystemExit`` went through ``sys.excepthook`` first, so at exit this means ``SystemExit``.
"""

from __future__ import annotations

import dis
import sys
from types import FrameType

__all__ = ["SCRIPT_EXIT", "ended_by_exception", "main_frame"]

#: ``error.json``'s type when the script itself exited (``SystemExit``) before the recording was complete.
SCRIPT_EXIT = "ScriptExit"

_RETURNS = frozenset(op for op in ("RETURN_VALUE", "RETURN_CONST") if op in dis.opmap)


def main_frame() -> FrameType | None:
    """The outermost running frame of the ``__main__`` module's own code (the script's), or None (not found:
    called outside the script's execution)."""
    found = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            found = frame
        frame = frame.f_back
    return found


def ended_by_exception(frame: FrameType | None) -> bool:
    """Whether ``frame`` (of a module that has finished) was left by an exception: its last instruction is not a
    return. False for None or an instruction offset it cannot read."""
    if frame is None:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    if not 0 <= at < len(code):
        return False
    return dis.opname[code[at]] not in _RETURNS
