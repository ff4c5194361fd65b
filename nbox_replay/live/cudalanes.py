"""The CUDA side of :mod:`nbox_replay.live.streams`: torch's CUDA streams as its :class:`~nbox_replay.live.streams.Streams`.

The only module of the live replay that names CUDA streams; everything it does is one torch call (the ordering
logic, tested against the fake device, is in :mod:`nbox_replay.live.streams`). A ``torch.cuda.Stream`` already has
``record_event()`` and ``wait_event(event)`` (a device-side wait: the host does not block) and its events
``query()``.
"""

from __future__ import annotations

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
