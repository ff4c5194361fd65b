"""The training thread's time between the collectives it issues, sampled in the clean timed iterations.

Role: the figures of the replay's ``segments`` rules (:mod:`nbox_replay.inputs.profiler`), which scale each stretch
of a captured iteration between two collectives to its own clean time. Written to the bundle as
``observed.thread_cpu_us.<rank>.clean_segments``: per clean iteration, ``[on CPU, run queue]`` (microseconds) of
each segment (iteration start -> first collective, between consecutive ones, last -> iteration end).

How: while the timed iterations run, a Python kernel for every ``c10d`` collective and point-to-point operator
(:mod:`nbox_record.capture.commlog`'s mechanism and :data:`~.commlog.OPS`: the ``Autograd`` key, and
``BackendSelect`` for calls made in inference mode) reads the calling thread's times
(:func:`nbox_trace.threadtime.thread_times_ns`) when that thread is the training thread (the one that reached the
clock's start boundary), then redispatches below itself; nothing else is recorded. Collectives issued on another
thread (a CUDA backward on the autograd engine's device thread) are not sampled.

Only in a recording with a capture, not under ``nbox emulate`` (nbox_record/capture/recorder.py). The kernels are
removed when the timed iterations end, before the lean pass or the capture registers its own (torch refuses a
second Python kernel for the same operator and key). Imports torch: only imported once the script has. Why:
docs/design/profiler-correction.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from nbox_record.capture.commlog import OPS
from nbox_trace.threadtime import ThreadTimes, ThreadTimesReader

__all__ = ["CollectiveSampler"]


class CollectiveSampler:
    """Samples the training thread's :class:`ThreadTimes` at each collective it issues, between :meth:`start`
    and :meth:`stop`; :meth:`take` hands over the samples since the previous call."""

    def __init__(self) -> None:
        self._lib: torch.library.Library | None = None
        self._ident: int | None = None
        self._reader: ThreadTimesReader | None = None
        self._marks: list[ThreadTimes | None] = []

    @property
    def running(self) -> bool:
        return self._lib is not None

    def start(self) -> None:
        """Register the kernels; sample the calling thread (the training thread)."""
        if self._lib is not None:
            raise RuntimeError("CollectiveSampler already started")
        self._reader = ThreadTimesReader()
        self._ident = self._reader.ident
        self._marks = []
        lib = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
        try:
            for name in OPS:
                packet = getattr(torch.ops.c10d, name, None)
                if packet is None or "default" not in packet.overloads():
                    continue
                lib.impl(name, self._kernel(packet.default), "Autograd", with_keyset=True)  # type: ignore[no-untyped-call]
                lib.impl(name, self._inference_kernel(packet.default),  # type: ignore[no-untyped-call]
                         "BackendSelect", with_keyset=True)
        except Exception:
            lib._destroy()  # type: ignore[no-untyped-call]
            self._reader.close()
            raise
        self._lib = lib

    def stop(self) -> None:
        """Remove the kernels (the dispatch table is as before :meth:`start`); the samples not taken stay."""
        if self._lib is not None:
            self._lib._destroy()  # type: ignore[no-untyped-call]
            self._lib = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def take(self) -> list[ThreadTimes | None]:
        """The samples since the previous call, in issue order (None: the thread's times could not be read)."""
        marks, self._marks = self._marks, []
        return marks

    def _sample(self) -> None:
        reader = self._reader
        if reader is not None and threading.get_ident() == self._ident:
            self._marks.append(reader.read())

    def _kernel(self, op: torch._ops.OpOverload[Any, Any]) -> Callable[..., Any]:
        after_autograd = torch._C._after_autograd_keyset
        backend_select = torch._C.DispatchKey.BackendSelect  # the inference kernel below must not sample again
        sample = self._sample

        def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
            sample()
            return op.redispatch((keyset & after_autograd).remove(backend_select), *args, **kwargs)

        return kernel

    def _inference_kernel(self, op: torch._ops.OpOverload[Any, Any]) -> Callable[..., Any]:
        """``BackendSelect``: samples a call made inside ``torch.inference_mode()`` (the ``Autograd`` kernel never
        saw it), passes any other call straight through."""
        backend_select = torch._C.DispatchKey.BackendSelect
        inference = torch.is_inference_mode_enabled
        sample = self._sample

        def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
            if inference():
                sample()
            return op.redispatch(keyset.remove(backend_select), *args, **kwargs)

        return kernel
