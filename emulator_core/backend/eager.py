"""Keep ``torch.compile`` (Dynamo) out of the backend's own Python code.

Why: the ``nbox`` process group and its work objects are Python subclasses of c10d's ``ProcessGroup`` and
``Work``. C++ calls back into them (DDP's reducer broadcasts bucket layouts from ``_rebuild_buckets()``,
all-reduces gradients, waits on works), and it does so while a compiled module runs: DDP's ``forward`` is
called from a frame Dynamo compiled, with Dynamo's frame-evaluation hook installed on the thread. Every
Python frame started under that hook is offered to Dynamo, so Dynamo tried to compile
``NboxProcessGroup.broadcast`` as a fresh frame and failed on its ``self`` ("UnsafeScriptObjectError:
Attempted to access unregistered member on an OpaqueObject": torch registers ``ProcessGroup`` as an opaque
type whose members Dynamo may not touch). Native backends never hit this: their methods are C++.

The fix marks the code of every method C++ can call (and, recursively, everything those call) as run
eagerly, never traced: what ``torch.compiler.disable`` does, without importing ``torch._dynamo`` (two
seconds) in every emulated run that never compiles. It uses Dynamo's per-code execution strategy
(``torch._C._dynamo.eval_frame.set_code_exec_strategy``, the call behind ``torch._dynamo.eval_frame.skip_code``)
with the recursive action ``SKIP``. Where a torch build lacks it, nothing is marked and
:data:`AVAILABLE` is False.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["AVAILABLE", "never_compiled"]

try:
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    _STRATEGY: Any = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    AVAILABLE = True
except (ImportError, AttributeError, TypeError):  # a torch without Dynamo's C hooks
    _STRATEGY, AVAILABLE = None, False


def _codes(obj: Any) -> Iterator[types.CodeType]:
    if isinstance(obj, type):
        for value in vars(obj).values():
            yield from _codes(value)
    elif isinstance(obj, (staticmethod, classmethod)):
        yield from _codes(obj.__func__)
    elif isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _codes(f)
    elif isinstance(obj, types.FunctionType):
        yield obj.__code__


def never_compiled(*objs: type | Callable[..., Any]) -> None:
    """Run the code of these functions, and of every method defined on these classes, eagerly under
    ``torch.compile``: Dynamo neither traces them nor anything they call (a no-op without Dynamo's hooks)."""
    if not AVAILABLE:
        return
    for obj in objs:
        for code in _codes(obj):
            set_code_exec_strategy(code, _STRATEGY)
