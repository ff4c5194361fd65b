"""The in-rank capture: injected into an unmodified training script, writes the raw per-rank files.

How it gets in
--------------
The launcher puts :func:`inject_dir` (``nbox_record/_inject``, holding a ``sitecustomize.py``) first on
``PYTHONPATH`` of ``python -m torch.distributed.run``. Every Python process started with that path
imports the ``sitecustomize``, which first runs any ``sitecustomize`` it shadows, then, only when
``NBOX_RECORD_DIR`` is set, calls :func:`install`. :func:`install` does nothing in a process without
``RANK`` (the torchrun agent) and nothing in a child of an already recording rank (DataLoader workers
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
                               the rank writes ``emulate.json`` (``nbox_record/emulaterank.py``)

Iterations
----------
A boundary is the end of ``optimizer.step()`` (a global optimizer step post-hook; with several optimizers
only the first one that steps counts), or a call of the marker :func:`nbox_record.marker.step` for scripts
without a torch optimizer. The first marker call switches to marker boundaries for good and restarts the
count (warm-up again from there). Boundary n (1-based): n < W warm-up; n = W starts the clock; each
boundary up to W+K closes one timed iteration (``time.perf_counter``; on CUDA, after a device
synchronize); boundary W+K starts the capture; W+K+C stops it and writes the files. So the script must
run at least W+K+C iterations. Between captured boundaries, a zero-length
``## nbox:iteration_boundary ##`` record function marks the boundary in both the ET and Kineto.

Not supported: a script that runs its own ``torch.profiler`` (only one profiler session can exist; its
``ProfilerStep`` boundaries are not used): the capture fails with ``ProfilerInUse``.

Capture
-------
``torch.profiler.profile(activities=[CPU (+CUDA)], execution_trace_observer=ExecutionTraceObserver(),
record_shapes=True)`` plus :class:`nbox_record.commlog.CollectiveLogger` (gloo emits no
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
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import platform
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TypedDict

from nbox_record import rawformat
from nbox_record.emulaterank import EMULATE_REPORT, emulated_collectives, present_emulated_world, redirect_backend
from nbox_record.hooks import PostImportHook, after_frame_returns, optimizer_step_frame
from nbox_record.recordenv import (  # noqa: F401 - re-exported: the bootstrap's configuration API
    ENV_BOUNDARY_TIMEOUT,
    ENV_CAPTURE,
    ENV_DIR,
    ENV_EMULATE,
    ENV_EXIT_BARRIER_TIMEOUT,
    ENV_ITERATIONS,
    ENV_NO_CAPTURE,
    ENV_OWNER,
    ENV_RUN_TO_END,
    ENV_WARMUP,
    Config,
    ConfigError,
    config_from_env,
    inject_dir,
    record_env,
)
from nbox_record.threadtime import ThreadTimes, thread_times_ns
from nbox_trace.errors import OutputWriteError
from nbox_trace.files import write_json_atomic

if TYPE_CHECKING:
    from nbox_record.commlog import CollectiveLogger

#: Exit code of a rank that nbox stops because of a failure (a script's own exception also gives 1).
EXIT_FAILURE = 1

BOUNDARY_MARKER = "## nbox:iteration_boundary ##"


MARKER_HINT = (
    "nbox finds iterations at the end of each optimizer.step() (torch.optim). If the script updates its "
    "parameters another way, call the marker once at the end of every training iteration: "
    "`import nbox_record; nbox_record.step()`."
)


class ErrorRecord(TypedDict):
    """``error.json`` (see :mod:`nbox_record.rawformat`)."""

    rank: int
    type: str
    message: str
    traceback: str
    time_us: float  # wall clock when written: the earliest error of a run is its root cause



# -- files --------------------------------------------------------------------------------------------


def _flush_everything() -> None:
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


# -- the recorder ----------------------------------------------------------------------------------------


class Recorder:
    """One rank's capture state machine (see the module docstring). Created by :func:`install`."""

    def __init__(self, config: Config, rank: int, local_rank: int, world_size: int) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.out_dir = config.record_dir / f"rank{rank}"
        self.pid = os.getpid()
        self.boundary_kind: str | None = None     # "optimizer_step" | "marker"
        self.boundaries = 0
        self.iteration_us: list[float] = []
        self.phase = "warmup"                     # warmup | timing | capture | done | failed
        self._t_prev: float | None = None
        self._tt_prev: ThreadTimes | None = None  # the training thread's CPU accounting at the last boundary
        self.iteration_split_us: list[tuple[float, float]] = []  # per timed iteration: (on CPU, run queue)
        self._window: list[float] = []            # perf_counter seconds: start and end of the timed iterations
        self._optimizer: weakref.ReferenceType[Any] | None = None
        self._hook_handle: Any = None
        self._device: str | None = None
        self._prof: Any = None
        self._et: Any = None
        self._comm: CollectiveLogger | None = None
        self._lock = threading.RLock()
        self._first_boundary = threading.Event()
        self._error_written = False
        self._prev_excepthook: Callable[..., Any] = sys.excepthook

    # -- setup --------------------------------------------------------------------------------------

    def arm(self) -> None:
        """Hooks that need no torch: excepthook, atexit, the boundary watchdog, the torch import hook."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        watchdog = threading.Thread(target=self._watchdog, name="nbox-boundary-watchdog", daemon=True)
        watchdog.start()
        reporter = threading.Thread(target=self._report_progress, name="nbox-progress", daemon=True)
        reporter.start()
        if "torch" in sys.modules:
            self.on_torch_imported(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, PostImportHook("torch", self._on_torch_import_safe))

    def _on_torch_import_safe(self, module: ModuleType) -> None:
        try:
            self.on_torch_imported(module)
        except Exception as exc:
            self.fail("CaptureFailed", f"nbox could not hook into torch: {type(exc).__name__}: {exc}",
                      traceback.format_exc())

    def on_torch_imported(self, _module: ModuleType) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self.config.emulate:
            redirect_backend()
        self._hook_handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    # -- boundaries -----------------------------------------------------------------------------------

    def _on_optimizer_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self.phase in ("done", "failed") or self.boundary_kind == "marker" or os.getpid() != self.pid:
            return
        tracked = self._optimizer() if self._optimizer is not None else None
        if tracked is None:
            self._optimizer = weakref.ref(optimizer)
            self._device = self._device or _optimizer_device(optimizer)
        elif tracked is not optimizer:
            return
        self.boundary_kind = "optimizer_step"
        action = self._boundary()
        if action is not None and not after_frame_returns(optimizer_step_frame(sys._getframe(1)), action):
            action()

    def on_marker(self) -> None:
        """``nbox_record.step()``: the first call switches to marker boundaries and restarts the count."""
        if self.phase in ("done", "failed") or os.getpid() != self.pid:
            return
        if self.boundary_kind != "marker":
            self._abort_capture()
            self.boundary_kind = "marker"
            self.boundaries = 0
            self.iteration_us = []
            self._t_prev = None
            self.phase = "warmup"
        action = self._boundary()
        if action is not None:
            action()

    def _now(self) -> float:
        if self._cuda_in_use():  # time what the device did, not what the host queued
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    @staticmethod
    def _cuda_in_use() -> bool:
        torch_module = sys.modules.get("torch")
        return bool(torch_module is not None and torch_module.cuda.is_initialized())

    def _boundary(self) -> Callable[[], None] | None:
        """Count one boundary and take its time; returns the capture action it calls for, if any.

        The action (start / mark / finish) runs once the ``Optimizer.step`` wrapper has returned, so that
        its ``Optimizer.step#...`` record function is either wholly inside the capture or wholly outside:
        a record function still open when the profiler stops leaves children whose parent id is no node of
        the ET (dangling ``ctrl_deps``).
        """
        now = self._now()
        tt = thread_times_ns()
        cfg = self.config
        warmup, timed, captured = cfg.effective_warmup, cfg.iterations, cfg.capture
        with self._lock:
            if self.phase == "failed":
                return None
            self.boundaries += 1
            self._first_boundary.set()
            n = self.boundaries
        if n == warmup:
            self._t_prev, self._tt_prev = now, tt
            self._window = [now]
            self.phase = "timing"
        elif warmup < n <= warmup + timed and self._t_prev is not None:
            self.iteration_us.append((now - self._t_prev) * 1e6)
            if tt is not None and self._tt_prev is not None:
                self.iteration_split_us.append(((tt.on_cpu_ns - self._tt_prev.on_cpu_ns) / 1e3,
                                                (tt.run_queue_ns - self._tt_prev.run_queue_ns) / 1e3))
            self._t_prev, self._tt_prev = now, tt
            if n == warmup + timed:
                self._window.append(now)
        step: Callable[[], None] | None = None
        if cfg.no_capture:
            step = self._finish_timing if n == warmup + timed else None
        elif n == warmup + timed:
            step = self._start_capture
        elif warmup + timed < n < warmup + timed + captured:
            step = self._mark_boundary
        elif n == warmup + timed + captured:
            step = self._finish_capture
        if step is None:
            return None

        def action(step: Callable[[], None] = step) -> None:
            try:
                step()
            except Exception as exc:
                self.fail("CaptureFailed",
                          f"nbox capture failed at iteration boundary {n}: {type(exc).__name__}: {exc}",
                          traceback.format_exc())

        return action

    # -- capture --------------------------------------------------------------------------------------

    def _start_capture(self) -> None:
        import torch
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

        from nbox_record.commlog import CollectiveLogger

        self._write_emulate_report()  # the timed iterations are over (nbox emulate -o captures after them)
        if torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled():
            self.fail("ProfilerInUse",
                      "the script runs its own torch.profiler session; nbox needs the profiler for its capture. "
                      "Run the script without its profiler for `nbox record`.")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._et = ExecutionTraceObserver().register_callback(str(self._tmp_et()))
        self._prof = profile(activities=activities, execution_trace_observer=self._et, record_shapes=True)
        self._comm = CollectiveLogger()
        self._comm.start()
        if self.config.emulate:
            from nbox_record import emulatecapture

            emulatecapture.tap(self._comm)
        self.phase = "capture"
        self._prof.start()
        self._mark_boundary()

    def _tmp_et(self) -> Path:
        return self.out_dir / f".{rawformat.HOST_ET}.{os.getpid()}.partial.json"

    @staticmethod
    def _mark_boundary() -> None:
        import torch

        with torch.profiler.record_function(BOUNDARY_MARKER):
            pass

    def _abort_capture(self) -> None:
        """Stop a capture in progress without writing anything (marker switch, failure)."""
        if self._prof is not None:
            with contextlib.suppress(Exception):
                self._prof.stop()
            self._prof = None
        if self._et is not None:
            with contextlib.suppress(Exception):
                self._et.unregister_callback()
            self._et = None
            with contextlib.suppress(OSError):
                self._tmp_et().unlink()
        if self._comm is not None:
            with contextlib.suppress(Exception):
                self._comm.stop()
            self._untap()
            self._comm = None

    def _untap(self) -> None:
        if self.config.emulate:
            from nbox_record import emulatecapture

            emulatecapture.untap()

    def _finish_capture(self) -> None:
        self._mark_boundary()
        prof, et, comm = self._prof, self._et, self._comm
        assert prof is not None and et is not None and comm is not None
        prof.stop()
        self._untap()
        records = comm.stop()
        et.unregister_callback()
        self._prof = self._et = self._comm = None

        tmp_et = self._tmp_et()
        if not tmp_et.is_file() or tmp_et.stat().st_size == 0:
            raise RuntimeError(f"the execution trace observer wrote nothing to {tmp_et}")
        os.replace(tmp_et, self.out_dir / rawformat.HOST_ET)

        tmp_kineto = self.out_dir / f".{rawformat.KINETO}.{os.getpid()}.partial.json"
        prof.export_chrome_trace(str(tmp_kineto))
        os.replace(tmp_kineto, self.out_dir / rawformat.KINETO)

        import torch.distributed as dist

        # Under nbox emulate, the rank as the script's world sees it: the global rank played in a world of W.
        seen = self.config.emulate and dist.is_available() and dist.is_initialized()
        log: rawformat.CollectiveLog = {
            "version": rawformat.RAW_FORMAT_VERSION,
            "rank": dist.get_rank() if seen else self.rank,
            "world_size": dist.get_world_size() if seen else self.world_size,
            "process_groups": _process_groups(),
            "collectives": records,
        }
        write_json_atomic(self.out_dir / rawformat.COLLECTIVES, log, durable=True)
        if comm.errors:
            print(f"nbox: rank {self.rank}: {len(comm.errors)} collective(s) could not be described; first: "
                  f"{comm.errors[0]}", file=sys.stderr)
        self._done()

    def _finish_timing(self) -> None:
        """``NBOX_NO_CAPTURE``: the timed iterations are over; write the files and stop (no capture)."""
        self._write_emulate_report()
        self._done()

    def _write_emulate_report(self) -> None:
        """``NBOX_EMULATE``: what the ``nbox`` backend answered during the timed iterations."""
        if self.config.emulate:
            t0, t1 = [*self._window, 0.0, 0.0][:2]
            write_json_atomic(self.out_dir / EMULATE_REPORT, emulated_collectives(t0 * 1e6, t1 * 1e6), durable=True)

    def _done(self) -> None:
        write_json_atomic(self.out_dir / rawformat.TIMINGS, self._timings(), durable=True)
        self.phase = "done"
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
        if not self.config.run_to_end:
            self._stop_process()

    def _timings(self) -> rawformat.RankTimings:
        import torch

        backend, device = _backend_and_device(self._device)
        return {
            "version": rawformat.RAW_FORMAT_VERSION,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "backend": backend,
            "device": device,
            "boundary": self.boundary_kind or "optimizer_step",
            "warmup": self.config.effective_warmup,
            "iteration_us": list(self.iteration_us),
            "iteration_cpu_us": [c for c, _ in self.iteration_split_us],
            "iteration_run_queue_us": [q for _, q in self.iteration_split_us],
            "captured_iterations": self.config.capture,
            "torch": str(torch.__version__),
            "cuda": torch.version.cuda,
            "nccl": _nccl_version(),
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
        }

    def _stop_process(self) -> None:
        """All ranks done (store barrier), then a clean process-group teardown and ``os._exit(0)``."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                _store_barrier(self.world_size, self.config.exit_barrier_timeout_s)
            except Exception as exc:  # a peer died or is late: our files are complete anyway
                print(f"nbox: rank {self.rank}: not all ranks reached the end of the capture "
                      f"({type(exc).__name__}: {exc}); stopping anyway", file=sys.stderr)
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        _flush_everything()
        os._exit(0)

    # -- failures ------------------------------------------------------------------------------------

    def write_error(self, kind: str, message: str, tb: str = "") -> None:
        """Write ``error.json`` once (the first failure wins)."""
        with self._lock:
            if self._error_written or os.getpid() != self.pid:
                return
            self._error_written = True
        record: ErrorRecord = {"rank": self.rank, "type": kind, "message": message, "traceback": tb,
                               "time_us": time.time() * 1e6}
        try:
            write_json_atomic(self.out_dir / rawformat.ERROR, record, durable=True)
        except OutputWriteError as exc:
            print(f"nbox: rank {self.rank}: cannot write {self.out_dir / rawformat.ERROR}: {exc}", file=sys.stderr)

    def fail(self, kind: str, message: str, tb: str = "") -> None:
        """An nbox-detected failure: ``error.json``, a message on stderr, exit :data:`EXIT_FAILURE`."""
        self.phase = "failed"
        self.write_error(kind, message, tb)
        print(f"nbox: rank {self.rank}: {kind}: {message}", file=sys.stderr)
        self._abort_capture()
        _flush_everything()
        os._exit(EXIT_FAILURE)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if os.getpid() == self.pid and self.phase != "done":
            self.phase = "failed"
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            self.write_error(exc_type.__name__, str(exc), text)
        self._prev_excepthook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        if os.getpid() != self.pid or self.phase in ("done", "failed"):
            return
        if self.boundaries == 0 or self.boundary_kind is None:
            kind, message = "NoIterationBoundary", (
                "the script ended without a single iteration boundary. " + MARKER_HINT)
        else:
            captured = 0 if self.config.no_capture else self.config.capture
            needed = self.config.effective_warmup + self.config.iterations + captured
            kind, message = "TooFewIterations", (
                f"the script ended after {self.boundaries} iteration(s) ({self.boundary_kind} boundaries); nbox "
                f"needs {needed} = warm-up {self.config.effective_warmup} + timed {self.config.iterations} + "
                f"captured {captured}. Run more steps, or lower --warmup / --iterations "
                "(NBOX_WARMUP / NBOX_ITERATIONS).")
        self.fail(kind, message)

    def _report_progress(self, period_s: float = 1.0) -> None:
        """Keep ``progress.json`` (phase, iteration) current, so a launcher that must stop a hung run can
        say where each rank was. Written from this thread at most once a period and only on change, never
        from the training thread, so it does not disturb the timed iterations."""
        last: tuple[str, int] | None = None
        while True:
            state = (self.phase, self.boundaries)
            if state != last:
                try:
                    write_json_atomic(self.out_dir / rawformat.PROGRESS, {"phase": state[0], "iteration": state[1],
                                                                "time_us": time.time() * 1e6},
                                      durable=False)  # diagnostic only: no fsync stalls during timing
                except OutputWriteError:
                    return
                last = state
            if state[0] in ("done", "failed"):
                return
            time.sleep(period_s)

    def _watchdog(self) -> None:
        if self._first_boundary.wait(self.config.boundary_timeout_s):
            return
        with self._lock:
            if self.boundaries or self.phase in ("done", "failed"):
                return
        self.fail("NoIterationBoundary",
                  f"no iteration boundary within {self.config.boundary_timeout_s:g} s "
                  f"({ENV_BOUNDARY_TIMEOUT}). " + MARKER_HINT)


# -- torch facts --------------------------------------------------------------------------------------------


def _optimizer_device(optimizer: Any) -> str | None:
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


def _process_groups() -> list[rawformat.ProcessGroupInfo]:
    from nbox_record.commlog import process_groups

    return process_groups()


def _store_barrier(world_size: int, timeout_s: float) -> None:
    """Every rank adds 1 to a key of the rendezvous store, then waits until all have (no collective)."""
    import datetime

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    key = "nbox_record/capture_done"
    if store.add(key, 1) >= world_size:
        store.set(key + "/all", "1")
    store.wait([key + "/all"], datetime.timedelta(seconds=timeout_s))


# -- entry points ----------------------------------------------------------------------------------------

_ACTIVE: Recorder | None = None


def active() -> Recorder | None:
    """The recorder of this process, if recording."""
    return _ACTIVE


def install(env: Mapping[str, str] | None = None) -> Recorder | None:
    """Start recording this rank if the environment asks for it; see the module docstring.

    Returns the recorder, or ``None`` when this process must not record (no ``NBOX_RECORD_DIR``, no
    ``RANK``, a child of a recording process, or already installed). A bad configuration writes
    ``error.json`` when the folder is known and ends the process with :data:`EXIT_FAILURE`.
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
        _die(f"nbox: bad RANK / LOCAL_RANK / WORLD_SIZE in the environment: {env.get('RANK')!r}")
    try:
        config = config_from_env(env)
    except ConfigError as exc:
        out_dir = Path(env[ENV_DIR]) / f"rank{rank}"
        with contextlib.suppress(OutputWriteError):
            write_json_atomic(out_dir / rawformat.ERROR,
                              {"rank": rank, "type": "ConfigError", "message": str(exc), "traceback": ""}, durable=True)
        _die(f"nbox: rank {rank}: ConfigError: {exc}")
    os.environ[ENV_OWNER] = str(os.getpid())
    recorder = Recorder(config, rank, local_rank, world_size)
    if config.emulate:
        present_emulated_world()
    try:
        recorder.arm()
    except OSError as exc:
        _die(f"nbox: rank {rank}: cannot prepare {recorder.out_dir}: {exc}")
    _ACTIVE = recorder
    return recorder


def _die(message: str) -> Any:
    print(message, file=sys.stderr)
    _flush_everything()
    os._exit(EXIT_FAILURE)


def marker_step() -> None:
    """Implementation of :func:`nbox_record.marker.step`."""
    if _ACTIVE is not None:
        _ACTIVE.on_marker()
