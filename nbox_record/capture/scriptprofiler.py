"""A stand-in for the script's own ``torch.profiler.profile`` while ``nbox record`` captures the rank.

A process has one profiler session. Training scripts often run their own
(``with profile(schedule=...) as prof: ... prof.step()``); nbox's capture needs that session, so while a
rank is recorded :func:`install` puts :class:`ScriptProfiler` in place of ``torch.profiler.profile`` (both
names torch code reaches it by). The script's profiler then collects nothing; its ``step()`` calls are
passed on as iteration boundaries (``ProfilerStep``): the recorder uses them where the script has no
``optimizer.step()`` before them (``nbox_record.capture.recorder``). Anything that reads profiling results
(``key_averages``, ``export_chrome_trace``, ...) raises :class:`ScriptProfilerDisabled`, naming why.
The script's ``on_trace_ready`` is never called. torch's own code that makes a profile (inductor's kernel
benchmarking) gets the real class.

Only ``torch.profiler.profile`` is stood in for: a legacy ``torch.autograd.profiler.profile`` session, or
one started before ``import torch`` finished, is still refused at the capture (``ProfilerInUse``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from nbox_trace.errors import NboxError

__all__ = ["ScriptProfiler", "ScriptProfilerDisabled", "install", "real_profile"]

_REAL: Any = None  # torch's own profile class, once install() has replaced it


class ScriptProfilerDisabled(NboxError, AttributeError):
    """The script read results from its own profiler, which ``nbox record`` stood in for.

    Also an ``AttributeError``, so ``hasattr(prof, name)`` answers False instead of raising."""


class ScriptProfiler:
    """Takes ``torch.profiler.profile``'s arguments, profiles nothing, reports each ``step()``.

    ``on_step`` is the recorder's boundary callback; it runs on every ``step()`` (also before ``start()``
    and after ``stop()``: the script's iterations go on either way).
    """

    on_step: Callable[[], None] = staticmethod(lambda: None)  # set by install()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # torch's own code (inductor's kernel benchmarking times kernels with a profile) gets the real class: it
        # reads the events it asked for, and it profiles outside the captured iterations
        if _from_torch(sys._getframe(1).f_code.co_filename):
            return real_profile()(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.step_num = 0
        self._args, self._kwargs = args, kwargs

    def __enter__(self) -> ScriptProfiler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Nothing to start: the capture's session is nbox's."""

    def stop(self) -> None:
        """Nothing to stop; ``on_trace_ready`` is not called."""

    def step(self) -> None:
        """One ``ProfilerStep``: an iteration boundary for the recorder."""
        self.step_num += 1
        type(self).on_step()

    def add_metadata(self, key: str, value: str) -> None:
        """Accepted and dropped (there is no trace of the script's own to add it to)."""

    def add_metadata_json(self, key: str, value: str) -> None:
        """Accepted and dropped."""

    def toggle_collection_dynamic(self, enable: bool, activities: Any) -> None:
        """Accepted; nothing is collected either way."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ScriptProfilerDisabled(
            f"torch.profiler.profile.{name}: the script's own profiler collects nothing under `nbox record` "
            "(a process has one profiler session and nbox's capture uses it); run the script without nbox "
            "to profile it")


def install(on_step: Callable[[], None]) -> None:
    """Put :class:`ScriptProfiler` (a subclass bound to ``on_step``) where scripts find the profiler.

    Call once torch is imported (the script's ``from torch.profiler import profile`` comes after).
    """
    global _REAL
    import torch.profiler as tp
    import torch.profiler.profiler as tpp

    if _REAL is None:
        _REAL = tpp.profile
    bound = type("profile", (ScriptProfiler,), {"on_step": staticmethod(on_step),
                                                "__module__": ScriptProfiler.__module__,
                                                "__qualname__": "ScriptProfiler"})
    for module in (tp, tpp):
        setattr(module, "profile", bound)  # noqa: B010 - the attribute is torch's


def _from_torch(filename: str) -> bool:
    """Whether a caller's file is inside the installed torch package."""
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", "") or "")
    return bool(root) and os.path.abspath(filename).startswith(root + os.sep)


def real_profile() -> Any:
    """torch's ``torch.profiler.profile`` class (nbox's capture runs it), whether or not :func:`install` ran."""
    if _REAL is not None:
        return _REAL
    import torch.profiler.profiler as tpp

    return tpp.profile
