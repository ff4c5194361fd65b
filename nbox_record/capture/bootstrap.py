"""The in-rank capture: injected into an unmodified training script, writes the raw per-rank files.

The launcher puts :func:`inject_dir` (``nbox_record/_inject``, a ``sitecustomize.py``) first on the ranks'
``PYTHONPATH``; with ``NBOX_RECORD_DIR`` set it calls :func:`install` (which does nothing without ``RANK`` or in a child
of a recording rank, :data:`ENV_OWNER`, and waits for the script's own ``import torch``). Configuration
(environment, :func:`record_env`):

``NBOX_RECORD_DIR``            output folder; this rank writes ``<dir>/rank<RANK>/`` (files: :mod:`rawformat`)
``NBOX_WARMUP``                W iterations skipped (default 3; W=0 acts as W=1)
``NBOX_ITERATIONS``            K clean, timed iterations, no profiler attached (default 10, >= 1)
``NBOX_CAPTURE``               C iterations captured with the ET observer + Kineto (default 1, >= 1)
``NBOX_RUN_TO_END``            "1": let the script run to its end after the capture (default: stop)
``NBOX_BOUNDARY_TIMEOUT_S``    fail if no iteration boundary within this many seconds (default 120)
``NBOX_EXIT_BARRIER_TIMEOUT_S`` how long a rank waits for the others before stopping (default 60)
``NBOX_NO_CAPTURE``            "1": no capture; the rank stops after the K timed iterations (``nbox emulate``)
``NBOX_EMULATE``               "1": the script's backend becomes ``nbox`` (:mod:`emulator_core.backend`); at the end
                               the rank writes ``emulate.json`` (``nbox_record/capture/emulated_rank.py``)

Iterations: a boundary is the end of ``optimizer.step()`` (the first optimizer to step), a call of
:func:`nbox_record.marker.step` (from then on, the only boundaries), or a ``prof.step()`` of the script's own profiler
(:mod:`nbox_record.capture.scriptprofiler`) when no optimizer step came first. Boundary W starts the clock, each one
up to W+K closes a timed iteration (``time.perf_counter``, after a device synchronize on CUDA), W+K starts the
capture and W+K+C stops it. After writing, unless ``NBOX_RUN_TO_END=1``, the rank meets the others at a store
barrier, destroys the process group and ends with ``os._exit(0)``. Failures write ``error.json`` (``{rank, type,
message, traceback}``) and exit non-zero: the script raised, no boundary in time (``NoIterationBoundary``), too few
iterations (``TooFewIterations``), the capture failed (``ProfilerInUse``, ``CaptureFailed``), bad configuration
(``ConfigError``). ``timings.json`` is written last: its presence means the capture is complete. Times microseconds.

This module is the entry point only (:func:`install`, :func:`marker_step`); the state machine is
:class:`nbox_record.capture.recorder.Recorder`. Why it works so: docs/design/recording.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from nbox_record.capture.emulated_rank import present_emulated_world
from nbox_record.capture.exitreport import die
from nbox_record.capture.recorder import Recorder
from nbox_record.handoff import ENV_DIR, ENV_OWNER, ConfigError, config_from_env, rawformat
from nbox_trace.errors import OutputWriteError
from nbox_trace.files import write_json_atomic

_ACTIVE: Recorder | None = None


def active() -> Recorder | None:
    """The recorder of this process, if recording."""
    return _ACTIVE


def install(env: Mapping[str, str] | None = None) -> Recorder | None:
    """Start recording this rank if the environment asks for it; see the module docstring.

    Returns the recorder, or ``None`` when this process must not record (no ``NBOX_RECORD_DIR``, no
    ``RANK``, a child of a recording process, or already installed). A bad configuration writes
    ``error.json`` when the folder is known and ends the process with
    :data:`~nbox_record.capture.exitreport.EXIT_FAILURE`.
    """
    global _ACTIVE
    env = os.environ if env is None else env
    if _ACTIVE is not None or not env.get(ENV_DIR) or "RANK" not in env:
        return None
    owner = env.get(ENV_OWNER)
    if owner and owner != str(os.getpid()):
        return None
    try:
        rank = int(env["RANK"])
        local_rank = int(env.get("LOCAL_RANK", "0"))
        world_size = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        die(f"nbox: bad RANK / LOCAL_RANK / WORLD_SIZE in the environment: {env.get('RANK')!r}")
    try:
        config = config_from_env(env)
    except ConfigError as exc:
        out_dir = Path(env[ENV_DIR]) / f"rank{rank}"
        with contextlib.suppress(OutputWriteError):
            write_json_atomic(out_dir / rawformat.ERROR,
                              {"rank": rank, "type": "ConfigError", "message": str(exc), "traceback": ""}, durable=True)
        die(f"nbox: rank {rank}: ConfigError: {exc}")
    os.environ[ENV_OWNER] = str(os.getpid())
    recorder = Recorder(config, rank, local_rank, world_size)
    if config.emulate:
        present_emulated_world()
    try:
        recorder.arm()
    except OSError as exc:
        die(f"nbox: rank {rank}: cannot prepare {recorder.out_dir}: {exc}")
    _ACTIVE = recorder
    return recorder


def marker_step() -> None:
    """Implementation of :func:`nbox_record.marker.step`."""
    if _ACTIVE is not None:
        _ACTIVE.on_marker()
