"""The device a captured rank ran on, read off its traces (issue 13: a GPU trace must not be taken for CPU).

A rank is a **CUDA** rank when its traces show CUDA work, any of:

* Kineto GPU events (``kernel``, ``gpu_memcpy``, ``gpu_memset``; :mod:`nbox_record.sources.kineto`);
* Kineto's ``deviceProperties`` (the GPUs the profiler saw: their model names and count);
* host-ET tensors on a ``cuda`` device (a tensor value's last field, e.g. ``"cuda:0"``);
* host-ET ``nccl:<collective>`` operators (NCCL runs on CUDA devices only).

Otherwise it is a CPU rank. :func:`hardware_facts` turns the ranks' findings into the manifest's ``hardware``
part: ``device`` (``"cuda"`` or ``"cpu"``) and, where Kineto listed the devices, ``gpu_name`` (the model, or
the models joined by ``", "`` when they differ) and ``gpu_count`` (how many ``deviceProperties`` lists).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nbox_record.sources import HostEt, KinetoTrace, iter_tensors

__all__ = ["DeviceFacts", "device_facts", "hardware_facts"]


@dataclass(frozen=True)
class DeviceFacts:
    """What one rank's traces say about its device (counts of each kind of evidence)."""

    gpu_events: int = 0  # Kineto kernels, memcpys and memsets
    cuda_tensors: int = 0  # host-ET tensor values on a cuda device
    nccl_ops: int = 0  # host-ET ``nccl:`` operators
    gpu_names: tuple[str, ...] = ()  # Kineto deviceProperties, one per device

    @property
    def device(self) -> str:
        """``"cuda"`` when any evidence of CUDA work is there, else ``"cpu"``."""
        return "cuda" if self.gpu_events or self.cuda_tensors or self.nccl_ops or self.gpu_names else "cpu"


def device_facts(et: HostEt, trace: KinetoTrace | None) -> DeviceFacts:
    """Count the evidence of CUDA work in one rank's host ET and Kineto trace (module docstring)."""
    cuda_tensors = nccl = 0
    for node in et.nodes.values():
        nccl += node.name.startswith("nccl:")
        for io in (node.inputs, node.outputs):
            cuda_tensors += sum(1 for t in iter_tensors(io.values) if str(t[5]).startswith("cuda"))
    if trace is None:
        return DeviceFacts(0, cuda_tensors, nccl)
    return DeviceFacts(len(trace.gpu), cuda_tensors, nccl, trace.device_names)


def hardware_facts(ranks: Iterable[DeviceFacts]) -> dict[str, Any]:
    """The manifest's ``hardware`` facts from every rank's findings (module docstring); ``{}`` for no rank."""
    facts = list(ranks)
    if not facts:
        return {}
    if not any(f.device == "cuda" for f in facts):
        return {"device": "cpu"}
    out: dict[str, Any] = {"device": "cuda"}
    listed = max((f.gpu_names for f in facts), key=len)
    if listed:
        out["gpu_name"] = ", ".join(dict.fromkeys(listed))
        out["gpu_count"] = len(listed)
    return out
