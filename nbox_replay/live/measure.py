"""Live-measured compute for virtual time (``--compute live --clock virtual``).

:func:`measure_compute` re-executes every replayed rank's compute nodes on this device, without any
communication, in one worker process launched by nbox's one launcher (``nbox_replay.live._measure_worker``:
ranks one after another, so they never compete for the cores), and returns each rank's graph with the measured
durations in place of the recorded ones: per compute node, the median over ``iterations`` timed passes after
``warmup`` untimed ones (microseconds). A node that cannot run live keeps its recorded duration and is counted
as a fallback, as in live replay (:mod:`nbox_replay.live.ops`). The virtual replay then applies the scenario to
those durations like to recorded ones, so ``compute_scale`` acts in both directions (a factor below 1 too),
and stragglers and ``overlap`` act as in any virtual replay. This module does not import torch.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nbox_replay.inputs import COMPUTE, RankGraph
from nbox_replay.live.run import LiveReplayError
from nbox_replay.live.workerconfig import MeasureConfig
from nbox_trace.jsonio import read_json_object
from nbox_trace.launch import Launch, run, seconds_text

__all__ = ["Measured", "measure_compute"]


@dataclass(frozen=True)
class Measured:
    """Graphs with measured compute durations, and how much of the recorded compute ran live.

    Attributes:
        graphs: rank -> its graph, compute durations measured (fallbacks keep the recorded ones).
        coverage: share of the recorded compute time that was measured live (0..1).
        fallbacks: fallback nodes per operator name (all ranks).
        heap_not_held: why the measuring worker could not hold its heap (:mod:`nbox_replay.live.allocator`), or ''.
    """

    graphs: dict[int, RankGraph]
    coverage: float
    fallbacks: dict[str, int]
    heap_not_held: str = ""


def measure_compute(graphs: Mapping[int, RankGraph], files: Mapping[int, Path], *, device: str, warmup: int,
                    iterations: int, timeout_s: float) -> Measured:
    """Measure the compute nodes of ``graphs`` (loaded from ``files``) on ``device`` (module docstring).

    Raises:
        LiveReplayError: the worker failed or passed ``timeout_s``.
    """
    ranks = sorted(graphs)
    work = Path(tempfile.mkdtemp(prefix="nbox-measure-"))
    try:
        cfg = MeasureConfig(ranks=tuple(ranks), traces={r: str(Path(files[r]).resolve()) for r in ranks},
                            device=device, warmup=warmup, iterations=iterations,
                            result=str(work / "measured.json")).write(work / "config.json")
        result = run(Launch("nbox_replay.live._measure_worker", work / "logs", module=True, args=(str(cfg),),
                            nproc_per_node=1, timeout_s=timeout_s))
        out = read_json_object(work / "measured.json")
        if out is None or not result.ok:
            err = read_json_object(work / "error.json") or {}
            if result.timed_out:
                raise LiveReplayError(f"measuring compute did not finish within {seconds_text(timeout_s)} s")
            raise LiveReplayError(f"measuring compute failed (rank {err.get('rank', '?')}): "
                                  f"{err.get('type', 'exit code')}: {err.get('message', result.returncode)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    measured: dict[int, RankGraph] = {}
    fallbacks: dict[str, int] = {}
    live = recorded = 0.0
    for r in ranks:
        g = graphs[r]
        per = out["ranks"][str(r)]
        durations = list(g.duration_us)
        for i, d in enumerate(per["duration_us"]):
            if d is not None and g.kind[i] == COMPUTE:
                durations[i] = float(d)
                live += g.duration_us[i]
        recorded += g.compute_us()
        measured[r] = dataclasses.replace(g, duration_us=durations)
        for k, v in (per.get("fallbacks") or {}).items():
            fallbacks[str(k)] = fallbacks.get(str(k), 0) + int(v)
    heap = out.get("heap_not_held")
    return Measured(measured, live / recorded if recorded > 0 else 0.0, fallbacks,
                    str(heap)[:300] if isinstance(heap, str) else "")


