"""The in-rank capture: injected into an unmodified training script, writes the raw per-rank files.

How it gets in
--------------
The launcher puts :func:`inject_dir` (``nbox_record/_inject``, holding a ``sitecustomize.py``) first on
``PYTHONPATH`` of the ranks (and of torchrun's agent across nodes). Every Python process started with that path
imports the ``sitecustomize``, which first runs any ``sitecustomize`` it shadows, then, only when
``NBOX_RECORD_DIR`` is set, calls :func:`install`. :func:`install` does nothing in a process without
``RANK`` (torchrun's agent) and nothing in a child of an already recording rank (DataLoader workers
inherit the environment: :data:`ENV_OWNER` names the recording process). It does not import torch: it
waits for the script to import it (a one-shot import hook), so a script that sets environment variables
before ``import torch`` (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``) behaves as without nbox.

Configuration (environment, see :func:`record_env`)
--------------------------------------------------
``NBOX_RECORD_DIR``            output folder; this rank writes ``<dir>/rank<RANK>/`` (files: :mod:`rawformat`)
``NBOX_WARMUP``                W iterations skipped (default 3; at least 1 is always skipped: the first
                               iteration has no start boundary, so W=0 acts as W=1)
``NBOX_ITERATIONS``            K clean, timed iterations, no profiler attached (default 10, >= 1)
``NBOX_CAPTURE``               C iterations captured with the ET observer + Kineto (default 1, >= 1)
``NBOX_RUN_TO_END``            "1": let the script run to its end after the capture (default: stop)
``NBOX_BOUNDARY_TIMEOUT_S``    fail if no iteration boundary within this many seconds (default 120)
``NBOX_EXIT_BARRIER_TIMEOUT_S`` how long a rank waits for the others before stopping (default 60)
``NBOX_NO_CAPTURE``            "1": no capture; the rank stops after the K timed iterations (``nbox emulate``)
``NBOX_EMULATE``               "1": whatever backend the script passes to ``init_process_group`` / ``new_group``
                               becomes ``nbox`` (the emulated world, :mod:`emulator_core.backend`); at the end
                               the rank writes ``emulate.json`` (``nbox_record/capture/emulated_rank.py``)

Iterations
----------
A boundary is the end of ``optimizer.step()`` (a global optimizer step post-hook; with several optimizers
only the first one that steps counts), or a call of the marker :func:`nbox_record.marker.step` for scripts
without a torch optimizer. The first marker call switches to marker boundaries for good and restarts the
count (warm-up again from there). Boundary n (1-based): n < W warm-up; n = W starts the clock; each
boundary up to W+K closes one timed iteration (``time.perf_counter``; on CUDA, after a device
synchronize); boundary W+K starts the capture; W+K+C stops it and writes the files. So the script must
run at least W+K+C iterations. Between captured boundaries, a zero-length
``## nbox:iteration_boundary ##`` record function (:data:`nbox_record.handoff.rawformat.BOUNDARY_MARKER`) marks
the boundary in both the ET and Kineto.

A script that runs its own ``torch.profiler.profile`` gets a stand-in that collects nothing (a process has
one profiler session and the capture needs it; :mod:`nbox_record.capture.scriptprofiler`); its ``prof.step()`` calls
are boundaries (``profiler_step``) when no ``optimizer.step()`` came before the first of them. A profiler
session nbox cannot stand in for (``torch.autograd.profiler``) fails the capture with ``ProfilerInUse``.

Capture
-------
``torch.profiler.profile(activities=[CPU (+CUDA)], execution_trace_observer=ExecutionTraceObserver(),
record_shapes=True)`` plus :class:`nbox_record.capture.commlog.CollectiveLogger` (gloo emits no
``record_param_comms``; see that module for why it is not a ``TorchDispatchMode``).

Stopping
--------
After the files are written, unless ``NBOX_RUN_TO_END=1``, the rank waits for all ranks at a store
barrier (the rendezvous store, never the process group: no collective is added to the job), destroys the
process group, flushes stdio and logging, and ends with ``os._exit(0)``. Why ``os._exit`` and not
``sys.exit``: the stop happens inside ``optimizer.step()`` in the middle of the script's loop; a
``SystemExit`` would unwind through the script's ``finally`` blocks, context managers and atexit handlers
(checkpoint saving, final evaluations, collectives that the peers, already gone, never match) and can
hang or take long. Every nbox file is written and closed (temp + rename) before ``os._exit``.

Failures
--------
``error.json`` (``{rank, type, message, traceback}``) and a non-zero exit when: the script raises
(``sys.excepthook``: the script's exception type; exit 1 as Python does); no boundary within
``NBOX_BOUNDARY_TIMEOUT_S`` (``NoIterationBoundary``, checked by a daemon thread, which then ends the
process with exit 1) or by the script's end (same type, from ``atexit``); the script ends before W+K+C
boundaries (``TooFewIterations``); the capture itself fails (``ProfilerInUse``, ``CaptureFailed``);
bad configuration (``ConfigError``). ``timings.json`` is written last: its presence means the rank's
capture is complete.

Where
-----
This module is the entry point only (:func:`install`, :func:`marker_step`); the rank's state machine is
:class:`nbox_record.capture.recorder.Recorder`.
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
