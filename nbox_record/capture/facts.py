"""``timings.json`` of a recording rank: its timed iterations and the facts of its torch installation."""

from __future__ import annotations

import os
import platform
import socket
import uuid
from typing import Any

from nbox_record.capture.clock import IterationClock
from nbox_record.handoff import Config, rawformat
from nbox_trace.threadtime import cpu_share


def optimizer_device(optimizer: Any) -> str | None:
    """The device of the optimizer's first parameter (``"cpu"`` or e.g. ``"cuda:0"``), if any."""
    for group in getattr(optimizer, "param_groups", []):
        for param in group.get("params", []):
            device = getattr(param, "device", None)
            if device is not None:
                return "cpu" if device.type == "cpu" else str(device)
    return None


def _backend_and_device(device: str | None) -> tuple[str, str]:
    import torch
    import torch.distributed as dist

    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_initialized() else "cpu"  # type: ignore[no-untyped-call]
    backend = ""
    if dist.is_available() and dist.is_initialized():
        config = str(dist.get_backend())
        if ":" in config:  # "cpu:gloo,cuda:nccl": the backend of the device the model trains on
            per_device = dict(part.split(":", 1) for part in config.split(",") if ":" in part)
            backend = per_device.get(device.split(":")[0], next(iter(per_device.values()), config))
        else:
            backend = config
    return backend, device


def _nccl_version() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except Exception:
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


#: Key of the run's identity in the job's rendezvous store (see :func:`job_identity`).
JOB_ID_KEY = "nbox/job_id"


def job_identity() -> dict[str, str | int | None]:
    """Which run this rank belonged to, the same on every rank of the run on every node, so that bundles written by
    the nodes of one multi-node recording can be told from those of another: ``job_id``, a random id the first rank
    to ask puts in the job's store (``compare_set``: no rank waits for another), torchrun's ``run_id``, this
    node's ``group_rank`` (the node rank torchrun's rendezvous gave it) and ``master_addr`` (the node hosting the
    job's store). ``job_id`` is None when the default process group is not initialized or its store refuses."""
    import torch.distributed as dist

    job_id = None
    if dist.is_available() and dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            job_id = store.compare_set(JOB_ID_KEY, "", uuid.uuid4().hex).decode()
        except Exception:  # a store without compare_set (a custom one): the run stays unidentified
            job_id = None
    group_rank = os.environ.get("GROUP_RANK", "")
    return {"job_id": job_id, "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
            "group_rank": int(group_rank) if group_rank.isdigit() else None,
            "master_addr": os.environ.get("MASTER_ADDR")}


def rank_timings(clock: IterationClock, config: Config, rank: int, local_rank: int, world_size: int,
                 device: str | None) -> rawformat.RankTimings:
    """The ``timings.json`` record (``device``: the optimizer's, else the current CUDA device or CPU)."""
    import torch

    backend, device = _backend_and_device(device)
    return {
        "version": rawformat.RAW_FORMAT_VERSION,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "backend": backend,
        "device": device,
        "boundary": clock.kind or "optimizer_step",
        "warmup": config.effective_warmup,
        "iteration_us": list(clock.iteration_us),
        "iteration_cpu_us": [c for c, _ in clock.split_us],
        "iteration_run_queue_us": [q for _, q in clock.split_us],
        "iteration_segments_us": [[[c, q] for c, q in segs] for segs in clock.segments_us],
        "captured_iterations": config.capture,
        "capture_iteration_us": list(clock.capture_us),
        "capture_cpu_us": [c for c, _ in clock.capture_split_us],
        "capture_run_queue_us": [q for _, q in clock.capture_split_us],
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "job": job_identity(),
        "cpu_share": cpu_share(),
    }
