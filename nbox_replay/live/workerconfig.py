"""What a live replay's worker processes are told: one frozen dataclass each, written by the parent as JSON and
read back as the same dataclass (never a dict read by string key).

:class:`WorkerConfig` is the replay worker's (``nbox_replay.live._worker``: one per replayed rank), built from a
:class:`nbox_replay.live.run.LiveConfig` by :func:`nbox_replay.live.run.replay_live`; :class:`MeasureConfig` the
compute-measuring worker's (``nbox_replay.live._measure_worker``). :meth:`WorkerConfig.write` and
:meth:`WorkerConfig.read` are inverses (``read(write(c)) == c``), as are :class:`MeasureConfig`'s. The file is the
parent's own, in its private work directory: it is trusted, and read back with the types its fields name.

Times in seconds (``timeout_s``) and microseconds (``host_cpu_us``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["MeasureConfig", "WorkerConfig"]


@dataclass(frozen=True)
class WorkerConfig:
    """One live replay's settings as its workers need them.

    Attributes:
        ranks: the replayed global ranks, ascending; the worker of torchrun rank i replays ``ranks[i]``.
        traces: replayed rank -> its ``.et`` file.
        factors: replayed rank -> its compute factor (a straggler's slowdown over the scenario's ``compute_scale``).
        serialize: the scenario's ``overlap = "serialize"``.
        groups: process group name -> members (global ranks at the recorded world size).
        recorded_world, world: the recorded world size and the what-if's.
        compute: ``live`` or ``recorded``; device: ``cpu`` or ``cuda``.
        warmup, iterations: untimed and timed repetitions.
        timeout_s: the run's deadline (a wait gives up after 3/4 of it).
        result_dir: where each worker writes ``rank<R>.json`` (or its error file).
        profiler: the profiler correction's worker document (``nbox_replay.inputs.Correction.worker_doc``; None: none).
        host_cpu_us: replayed rank -> the real thread's time on or waiting for a CPU per clean iteration (None: no
            host-work pad); host_credit: ``replay.host_work=match``.
    """

    ranks: tuple[int, ...]
    traces: dict[int, str]
    factors: dict[int, float]
    groups: dict[str, tuple[int, ...]]
    recorded_world: int
    world: int
    compute: str
    device: str
    warmup: int
    iterations: int
    timeout_s: float
    result_dir: str
    serialize: bool = False
    profiler: dict[str, Any] | None = None
    host_cpu_us: dict[int, float] | None = None
    host_credit: bool = False

    def write(self, path: Path) -> Path:
        """Write this config to ``path`` (JSON; integer keys as strings) and return ``path``."""
        doc = asdict(self)
        for key in ("traces", "factors", "host_cpu_us"):
            if doc[key] is not None:
                doc[key] = {str(k): v for k, v in doc[key].items()}
        path.write_text(json.dumps(doc))
        return path

    @classmethod
    def read(cls, path: str | Path) -> WorkerConfig:
        """The config :meth:`write` wrote at ``path``."""
        doc = json.loads(Path(path).read_text())
        host = doc.get("host_cpu_us")
        return cls(ranks=tuple(int(r) for r in doc["ranks"]),
                   traces={int(k): str(v) for k, v in doc["traces"].items()},
                   factors={int(k): float(v) for k, v in doc["factors"].items()},
                   groups={str(k): tuple(int(r) for r in v) for k, v in doc["groups"].items()},
                   recorded_world=int(doc["recorded_world"]), world=int(doc["world"]), compute=str(doc["compute"]),
                   device=str(doc["device"]), warmup=int(doc["warmup"]), iterations=int(doc["iterations"]),
                   timeout_s=float(doc["timeout_s"]), result_dir=str(doc["result_dir"]),
                   serialize=bool(doc.get("serialize", False)), profiler=doc.get("profiler"),
                   host_cpu_us=None if host is None else {int(k): float(v) for k, v in host.items()},
                   host_credit=bool(doc.get("host_credit", False)))


@dataclass(frozen=True)
class MeasureConfig:
    """The compute-measuring worker's settings: the ranks and their traces, the device, the repetitions, and the
    result file."""

    ranks: tuple[int, ...]
    traces: dict[int, str]
    device: str
    warmup: int
    iterations: int
    result: str

    def write(self, path: Path) -> Path:
        doc = asdict(self)
        doc["traces"] = {str(k): v for k, v in self.traces.items()}
        path.write_text(json.dumps(doc))
        return path

    @classmethod
    def read(cls, path: str | Path) -> MeasureConfig:
        doc = json.loads(Path(path).read_text())
        return cls(ranks=tuple(int(r) for r in doc["ranks"]), traces={int(k): str(v) for k, v in doc["traces"].items()},
                   device=str(doc["device"]), warmup=int(doc["warmup"]), iterations=int(doc["iterations"]),
                   result=str(doc["result"]))
