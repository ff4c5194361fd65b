"""A user's own check of a what-if: ``nbox replay small.bundle --world-size 8 --truth big.bundle``.

Role: before trusting nbox at a scale one does not have, set its answer from a small recording against a real run
at the largest scale one does have. The truth is a second bundle recorded at the what-if's world size (the same
job, the same cluster); its un-instrumented iterations (``observed``) are what really happened there.

Contract (:func:`open_truth` before anything runs, :func:`compare_truth` after the replay; the figures and the report's
lines: :class:`nbox_replay.report.Truth`):

* the truth bundle must be a bundle with observed iterations, recorded on the same kind of device, at the world
  size the what-if plays; anything else is refused in one line naming the file and what differs (exit 2);
* the figures: the prediction (the what-if's median iteration) against the truth's observed median, as an
  absolute error; the predicted scaling (what-if over baseline) against the real one (the truth's observed median
  over the small recording's), as a ratio error; and the breakdown of the prediction beside that of the truth's
  own recording replayed in virtual time under the same what-if's network (compute, exposed communication, waiting,
  idle of its slowest rank; its compute as it recorded it: the what-if's compute keys, stragglers and
  ``compute_scale``, are what the truth measured, not applied again), which tells whether a miss is in the compute or
  in the communication.

Times in microseconds.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from nbox_replay.report import RunSummary, Truth
from nbox_trace.errors import UsageError

if TYPE_CHECKING:
    from emulator_core.scenario import Scenario
    from nbox_replay.inputs import ReplaySource

__all__ = ["TruthError", "compare_truth", "open_truth"]


class TruthError(UsageError):
    """``--truth`` names a bundle that cannot serve as the what-if's truth (the message names the file and why)."""


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def open_truth(path: Path, source: ReplaySource, world: int) -> tuple[ReplaySource, dict[str, float]]:
    """The truth bundle's source and its observed iteration figures (median, p10, p90, n), checked against the
    small recording ``source`` and the what-if's world size ``world`` (module docstring).

    Raises:
        TruthError: not a bundle, no observed iterations, another device, another world size.
    """
    from nbox_replay.inputs import open_source
    from nbox_trace.errors import NboxError

    try:
        truth = open_source(path, name=str(path))
    except NboxError as e:
        raise TruthError(f"--truth {path}: {e}") from None
    if truth.manifest is None:
        raise TruthError(f"--truth {path}: a bare Chakra ET has no observed iterations; give a bundle recorded "
                         f"at the what-if's world size")
    obs = truth.observed if isinstance(truth.observed, dict) else {}
    if not all(_number(obs.get(k)) for k in ("median", "p10", "p90")):
        raise TruthError(f"--truth {path}: its manifest carries no observed iteration time (observed."
                         f"iteration_time_us); record it with nbox record")
    if truth.recorded_world != world:
        raise TruthError(f"--truth {path}: recorded at world size {truth.recorded_world}, the what-if plays "
                         f"{world}; give --world-size {truth.recorded_world} (or a truth recorded at {world})")
    if truth.device != source.device:
        raise TruthError(f"--truth {path}: recorded on {truth.device}, the replayed bundle on {source.device}: "
                         f"not the same job on the same kind of device")
    n = obs.get("n")
    figures = {k: float(obs[k]) for k in ("median", "p10", "p90")}
    return truth, {**figures, "n": float(n) if isinstance(n, (int, float)) and _number(n) else math.nan}


def compare_truth(path: Path, truth: ReplaySource, observed: dict[str, float], scenario: Scenario,
                  prediction: RunSummary, baseline: RunSummary, recorded_us: float | None,
                  correction_mode: str) -> Truth:
    """The :class:`Truth` of a finished replay: ``prediction`` and ``baseline`` its what-if and baseline runs,
    ``recorded_us`` the small recording's observed median; the truth's own recording is replayed in virtual time
    under ``scenario`` (the what-if at the truth's world size) with its recorded compute, corrected for the profiler
    by ``correction_mode`` as the replay's own."""
    from nbox_replay.inputs import correct_graphs, load_rank, plan_correction
    from nbox_replay.report import summarize_sim
    from nbox_replay.virtual import simulate
    from nbox_trace.errors import NboxError

    result = Truth(str(path), truth.recorded_world, observed, prediction.median_us, baseline.median_us, recorded_us,
                   prediction)
    try:
        graphs = {r: load_rank(truth.trace_set.files[r], r) for r in truth.ranks}
        correction = plan_correction(correction_mode, truth.manifest.observed if truth.manifest else None)
        graphs = correct_graphs(graphs, correction)
        network = dataclasses.replace(scenario, stragglers=(), compute_scale=1.0)  # its compute is as it measured
        sim = simulate(graphs, network, groups=truth.groups, recorded_world=truth.recorded_world, repetitions=1)
        result.own = summarize_sim(sim, label="truth", scenario="what-if")
    except NboxError as e:
        result.own_why = str(e)
    return result
