"""The CUDA side of :mod:`nbox_replay.live.streams`: torch's CUDA streams as its ``Streams``.

The only module of the live replay that names CUDA streams; everything it does is one torch call (the ordering
logic, tested against the fake device, is in :mod:`nbox_replay.live.streams`). A ``torch.cuda.Stream`` already has
``record_event()`` and ``wait_event(event)`` (a device-side wait: the host does not block) and its events
``query()``. Memory a live operator frees is kept from reuse until the work every lane has queued is done
(:meth:`CudaLanes.keep_for`, ``Tensor.record_stream``): the caching allocator would otherwise hand it to the
next allocation of the stream it was made on while another stream still reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any, cast

import torch

from nbox_replay.live.streams import Stream

__all__ = ["CudaLanes"]


class CudaLanes:
    """One CUDA device's streams (:class:`nbox_replay.live.streams.Streams`)."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)

    def current_stream(self) -> Stream:
        return cast(Stream, torch.cuda.current_stream(self.device))

    def new_stream(self) -> Stream:
        return cast(Stream, torch.cuda.Stream(device=self.device))  # type: ignore[no-untyped-call]

    def use_stream(self, stream: Stream) -> ContextManager[None]:
        raw: Any = stream
        return cast(ContextManager[None], torch.cuda.stream(raw))

    def synchronize(self) -> None:
        """Block the host until every stream of the device is done (once per repetition, to read its time)."""
        torch.cuda.synchronize(self.device)

    @staticmethod
    def keep_for(tensors: Sequence[object], streams: Sequence[Stream]) -> None:
        """Keep the CUDA ``tensors`` (others are skipped) from reuse until the work each of ``streams`` has queued
        so far is done."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                for s in streams:
                    raw: Any = s
                    t.record_stream(raw)
