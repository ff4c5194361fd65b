"""Two small interpreter mechanisms the record bootstrap builds on, kept apart from its state machine.

- :class:`PostImportHook`: run a callback right after a module is first imported (the bootstrap
  waits for the script's own ``import torch`` instead of importing torch itself at start-up).
- :func:`after_frame_returns`: run an action when a given frame returns (the capture starts and
  stops only once ``Optimizer.step`` has returned, so its record function is wholly inside or
  outside the capture).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import FrameType, ModuleType
from typing import Any

# -- the import hook -------------------------------------------------------------------------------------


class CallbackLoader:
    """Wraps the real loader of one module; calls ``callback(module)`` once the module has executed."""

    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # Hide the wrapper: the module keeps its real loader.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportHook:
    """A one-shot ``sys.meta_path`` finder: runs a callback right after ``name`` is first imported."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != self._name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = CallbackLoader(spec.loader, self._callback)  # type: ignore[assignment]
        return spec


# -- deferring to the end of Optimizer.step -------------------------------------------------------------------


def optimizer_step_frame(frame: FrameType | None) -> FrameType | None:
    """The outermost ``Optimizer.step`` profiling wrapper frame (torch/optim/optimizer.py) on the stack.

    Outermost: an optimizer that steps another one (``ZeroRedundancyOptimizer``) has both record
    functions open; the capture must wait until both have closed.
    """
    found: FrameType | None = None
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "wrapper" and "profile_name" in code.co_varnames
                and code.co_filename.replace(os.sep, "/").endswith("torch/optim/optimizer.py")):
            found = frame
        frame = frame.f_back
    return found


def after_frame_returns(frame: FrameType | None, action: Callable[[], None]) -> bool:
    """Run ``action`` when ``frame`` returns (a one-shot ``sys.setprofile`` on this thread).

    Returns False, doing nothing, when there is no frame or another profile function is installed
    (a Python profiler or coverage tool): the caller then runs the action at once.
    """
    if frame is None or sys.getprofile() is not None:
        return False

    def profile(current: FrameType, event: str, _arg: object) -> None:
        if event == "return" and current is frame:
            sys.setprofile(None)
            action()

    sys.setprofile(profile)
    return True
