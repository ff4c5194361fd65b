"""The rank side of ``nbox emulate`` (``NBOX_EMULATE=1``): the backend redirection and the end-of-run report.

:func:`redirect_backend` runs when torch is imported in a rank (from :mod:`nbox_record.capture.recorder`), so
whatever backend the script names reaches the ``nbox`` backend; :func:`emulated_collectives` summarizes
the process groups' records of the timed iterations into ``emulate.json`` (:data:`EMULATE_REPORT`), which
:mod:`nbox_record.launch.emulation` reads.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from nbox_trace.files import write_json_atomic

__all__ = ["EMULATE_ALL", "EMULATE_REPORT", "emulated_collectives", "present_emulated_world", "redirect_backend",
           "share_results", "write_emulate_report"]

#: Where the launcher's real rank and world size are kept once ``RANK``/``WORLD_SIZE`` show the emulated world.
REAL_RANK_ENV, REAL_WORLD_ENV = "NBOX_REAL_RANK", "NBOX_REAL_WORLD_SIZE"


def present_emulated_world(env: dict[str, str] | None = None) -> None:
    """Make ``RANK`` and ``WORLD_SIZE`` say what the script would see in the emulated job: the global rank
    this real process plays and W. The launcher's values move to ``NBOX_REAL_RANK`` and
    ``NBOX_REAL_WORLD_SIZE``, which the redirected ``init_process_group`` uses for the rendezvous of the
    real processes. Called once, before the script runs; ``env`` defaults to ``os.environ``."""
    import os

    e = os.environ if env is None else env
    if REAL_RANK_ENV in e:
        return
    real_rank, real_world = int(e["RANK"]), int(e.get("WORLD_SIZE", "1"))
    ranks = [int(r) for r in e.get("NBOX_REAL_RANKS", "").split(",") if r.strip()] or list(range(real_world))
    e[REAL_RANK_ENV], e[REAL_WORLD_ENV] = str(real_rank), str(real_world)
    e["RANK"] = str(ranks[real_rank])
    e["WORLD_SIZE"] = e.get("NBOX_WORLD_SIZE") or str(real_world)


def _real_rendezvous(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``init_process_group`` arguments with the real rank and world size for the rendezvous: the script
    may pass ``rank=int(os.environ["RANK"])``, ``world_size=...`` of the emulated world (or nothing, and
    ``env://`` reads them from the environment, which now shows the emulated world)."""
    import os

    real_rank, real_world = os.environ.get(REAL_RANK_ENV), os.environ.get(REAL_WORLD_ENV)
    if real_rank is None or real_world is None:
        return args, kwargs
    names = ("backend", "init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options",
             "device_id")
    kwargs = {**dict(zip(names, args, strict=False)), **kwargs}
    kwargs["world_size"], kwargs["rank"] = int(real_world), int(real_rank)
    return (), kwargs

#: Written by an emulated rank next to ``timings.json``: see :func:`emulated_collectives`.
EMULATE_REPORT = "emulate.json"


def redirect_backend() -> None:
    """Make ``torch.distributed.init_process_group`` and ``new_group`` use the ``nbox`` backend, whatever
    backend the script names ("gloo", "nccl", "cpu:gloo,cuda:nccl" or none). Idempotent."""
    import functools

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from emulator_core._autoload import register

    register()  # normally done by `import torch` (entry point); not with TORCH_DEVICE_BACKEND_AUTOLOAD=0
    init, new_group = c10d.init_process_group, c10d.new_group
    if getattr(init, "_nbox_redirected", False):
        return

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _real_rendezvous(args, kwargs)
        if args:
            args = ("nbox", *args[1:])
        else:
            kwargs["backend"] = "nbox"
        return init(*args, **kwargs)

    @functools.wraps(new_group)
    def nbox_new_group(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 2:  # new_group(ranks, timeout, backend, ...)
            args = (*args[:2], None if args[2] is None else "nbox", *args[3:])
        elif kwargs.get("backend") is not None:
            kwargs["backend"] = "nbox"
        return new_group(*args, **kwargs)

    init_process_group._nbox_redirected = True  # type: ignore[attr-defined]
    for module in (c10d, dist):
        setattr(module, "init_process_group", init_process_group)  # noqa: B010 - mypy: no such attribute
        setattr(module, "new_group", nbox_new_group)  # noqa: B010
    mesh = sys.modules.get("torch.distributed.device_mesh")  # init_device_mesh() initializes the default group
    if mesh is not None and getattr(mesh, "init_process_group", None) is init:
        setattr(mesh, "init_process_group", init_process_group)  # noqa: B010


def peak_memory() -> dict[str, Any]:
    """This rank's peak memory so far, the first question at a new scale ("will it fit?"): on CUDA (where the
    script used the device) the caching allocator's peak reserved bytes, what the device had to hold, with the
    peak allocated beside; elsewhere the process's peak resident set (``ru_maxrss``)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        dev = torch.cuda.current_device()
        return {"device": f"cuda:{dev}", "bytes": int(torch.cuda.max_memory_reserved(dev)),
                "allocated_bytes": int(torch.cuda.max_memory_allocated(dev)),
                "source": "CUDA caching allocator, peak reserved"}
    import resource

    rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return {"device": "cpu", "bytes": rss if sys.platform == "darwin" else rss * 1024,  # Linux counts KiB
            "source": "process peak resident set"}


def emulated_collectives(t0_us: float, t1_us: float) -> dict[str, Any]:
    """What the ``nbox`` process groups of this rank answered between ``t0_us`` and ``t1_us`` (issue time,
    ``perf_counter`` microseconds, i.e. the timed iterations): the world size the script saw, and one row
    per (collective, algorithm, bytes) with its count, total modeled time and total overrun (microseconds); and
    the rank's peak memory (:func:`peak_memory`).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    seen = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    rows: dict[tuple[str, str, float], dict[str, Any]] = {}
    groups: list[Any] = []
    for pg in list(getattr(c10d._world, "pg_map", {})):
        records = getattr(pg, "records", None)
        if records is None:
            with contextlib.suppress(Exception):
                records = getattr(pg._get_backend(torch.device("cpu")), "records", None)
        if records is None or any(records is g for g in groups):
            continue
        groups.append(records)
        for rec in list(records):
            if not t0_us <= rec.issue_us <= t1_us:
                continue
            row = rows.setdefault((rec.collective, rec.algorithm, float(rec.nbytes)), {
                "collective": rec.collective, "algorithm": rec.algorithm, "bytes": float(rec.nbytes),
                "count": 0, "modeled_us": 0.0, "overrun_us": 0.0})
            row["count"] += 1
            row["modeled_us"] += max(0.0, rec.end_us - rec.start_us)
            row["overrun_us"] += rec.overrun_us
    from emulator_core.backend import clock_report

    return {"world_size_seen": seen, "nbox_groups": len(groups), "window_us": [t0_us, t1_us],
            "clock": clock_report(), "peak_memory": peak_memory(),
            "collectives": sorted(rows.values(), key=lambda r: -r["modeled_us"])}


def write_emulate_report(out_dir: Path, window_s: tuple[float, float]) -> None:
    """Write ``emulate.json``: :func:`emulated_collectives` of the timed iterations (``perf_counter`` seconds)."""
    t0, t1 = window_s
    write_json_atomic(out_dir / EMULATE_REPORT, emulated_collectives(t0 * 1e6, t1 * 1e6), durable=True)


#: Written by every emulated rank once all real ranks' results are in: ``{"ranks": {rank: {"timings": ...,
#: "emulate": ...}}}`` (see :func:`share_results`).
EMULATE_ALL = "emulate_all.json"


def share_results(out_dir: Path, rank: int, real_world_size: int, timeout_s: float) -> None:
    """Share this rank's ``timings.json`` and ``emulate.json`` with every real rank through the rendezvous store
    (:func:`nbox_trace.share.share_results`) and write them all to ``emulate_all.json``: the launcher of each
    node then reports the whole job (its slowest real rank per iteration), not only the ranks it started.

    Raises:
        nbox_trace.share.ResultsMissing: a rank's results did not arrive within ``timeout_s``.
    """
    import torch.distributed as dist

    from nbox_record.handoff import TIMINGS
    from nbox_trace import share
    from nbox_trace.jsonio import read_json_object

    mine = {"timings": read_json_object(out_dir / TIMINGS), "emulate": read_json_object(out_dir / EMULATE_REPORT)}
    ranks = share.share_results(dist.distributed_c10d._get_default_store(), "nbox_emulate/result", rank,
                                real_world_size, mine, timeout_s)
    write_json_atomic(out_dir / EMULATE_ALL, {"ranks": {str(r): d for r, d in ranks.items()}}, durable=True)
