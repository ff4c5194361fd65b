"""One recording rank's state machine: iteration boundaries in, capture steps and failures out.

The rules (iterations, capture, stopping, failures) are in :mod:`nbox_record.capture.bootstrap`; the parts are
:mod:`~nbox_record.capture.clock` (counting and timing), :mod:`~nbox_record.capture.session` (the capture),
:mod:`~nbox_record.capture.watch` (progress and watchdog threads), :mod:`~nbox_record.capture.facts`
(``timings.json``), :mod:`~nbox_record.capture.exitreport` (``error.json`` and the exit) and
:mod:`~nbox_record.capture.emulated_rank` (the emulate-side report).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from types import FrameType, ModuleType, TracebackType
from typing import Any, NoReturn

from nbox_record.capture.clock import IterationClock, now_s, step_at
from nbox_record.capture.emulated_rank import redirect_backend, share_results, write_emulate_report
from nbox_record.capture.exitreport import EXIT_FAILURE, ErrorFile, flush_everything, stop_process
from nbox_record.capture.facts import optimizer_device, rank_timings
from nbox_record.capture.hooks import PostImportHook, after_frame_returns, optimizer_step_frame
from nbox_record.capture.scriptprofiler import install as install_script_profiler
from nbox_record.capture.session import CaptureSession, LeanSession, mark_boundary, profiler_in_use
from nbox_record.capture.watch import report_progress, start_daemon, watch_first_boundary
from nbox_record.handoff import (
    ENV_BOUNDARY_TIMEOUT,
    SCRIPT_EXIT,
    Config,
    announce,
    collect,
    ended_by_exception,
    main_frame,
    rawformat,
)
from nbox_trace.files import write_json_atomic
from nbox_trace.threadtime import thread_times_ns

MARKER_HINT = (
    "nbox finds iterations at the end of each optimizer.step() (torch.optim). If the script updates its "
    "parameters another way, call the marker once at the end of every training iteration: "
    "`import nbox_record; nbox_record.step()`."
)


class Recorder:
    """One rank's capture state machine. Created by :func:`nbox_record.capture.bootstrap.install`."""

    def __init__(self, config: Config, rank: int, local_rank: int, world_size: int) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.out_dir = config.record_dir / f"rank{rank}"
        self.pid = os.getpid()
        self.phase = "warmup"                     # warmup | timing | lean | capture | done | failed
        self.clock = IterationClock(config.effective_warmup, config.iterations,
                                    config.effective_capture, config.effective_lean)
        self.session = CaptureSession(self.out_dir, config.emulate)
        self.lean = LeanSession(self.out_dir)
        self.errors = ErrorFile(self.out_dir, rank, self.pid)
        self._optimizer: weakref.ReferenceType[Any] | None = None
        self._hook_handle: Any = None
        self._device: str | None = None
        self._lock = threading.RLock()
        self._first_boundary = threading.Event()
        self._progress_wake = threading.Event()  # wakes the progress thread for its last write (_end_progress)
        self._progress: threading.Thread | None = None
        self._peers_known = False
        self._prev_excepthook: Callable[..., Any] = sys.excepthook
        self._main_frame: FrameType | None = None  # the script's module frame: how it ended (scriptexit)
        self._sampler: Any = None  # the timed iterations' CollectiveSampler (nbox_record.capture.segments)

    # -- setup --------------------------------------------------------------------------------------

    def arm(self) -> None:
        """Hooks that need no torch: excepthook, atexit, the boundary watchdog, the torch import hook."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        start_daemon(lambda: watch_first_boundary(self._first_boundary, self.config.boundary_timeout_s,
                                                  self._no_boundary_in_time), "nbox-boundary-watchdog")
        self._progress = start_daemon(lambda: report_progress(self.out_dir, lambda: (self.phase, self.clock.count),
                                                              self._progress_wake), "nbox-progress")
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

        self._main_frame = main_frame()  # the script's own `import torch` runs this, inside its module
        if self.config.emulate:
            redirect_backend()
        if not self.config.no_capture:  # the script's own profiler would hold the one session the capture needs
            install_script_profiler(self.on_profiler_step)
        self._hook_handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    # -- boundaries -----------------------------------------------------------------------------------

    def _on_optimizer_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if (self.phase in ("done", "failed") or self.clock.kind in ("marker", "profiler_step")
                or os.getpid() != self.pid):
            return
        tracked = self._optimizer() if self._optimizer is not None else None
        if tracked is None:
            self._optimizer = weakref.ref(optimizer)
            self._device = self._device or optimizer_device(optimizer)
        elif tracked is not optimizer:
            return
        self.clock.kind = "optimizer_step"
        action = self._boundary()
        if action is not None and not after_frame_returns(optimizer_step_frame(sys._getframe(1)), action):
            action()

    def on_profiler_step(self) -> None:
        """The script's ``prof.step()`` (:mod:`nbox_record.capture.scriptprofiler`): the boundary when no
        ``optimizer.step()`` came first; a marker call still overrides it."""
        if (self.phase in ("done", "failed") or self.clock.kind in ("marker", "optimizer_step")
                or os.getpid() != self.pid):
            return
        self.clock.kind = "profiler_step"
        action = self._boundary()
        if action is not None:
            action()

    def on_marker(self) -> None:
        """``nbox_record.step()``: the first call switches to marker boundaries and restarts the count."""
        if self.phase in ("done", "failed") or os.getpid() != self.pid:
            return
        if self.clock.kind != "marker":
            self._stop_sampler()
            self.lean.abort()
            self.session.abort()
            self.clock.restart("marker")
            self.phase = "warmup"
        action = self._boundary()
        if action is not None:
            action()

    def _boundary(self) -> Callable[[], None] | None:
        """Count one boundary and take its time; returns the capture action it calls for, if any.

        The action (start / mark / finish) runs once the ``Optimizer.step`` wrapper has returned, so that
        its ``Optimizer.step#...`` record function is either wholly inside the capture or wholly outside:
        a record function still open when the profiler stops leaves children whose parent id is no node of
        the ET (dangling ``ctrl_deps``).

        The timed iterations' collective sampler (:mod:`nbox_record.capture.segments`) starts before the start
        boundary takes its time (its set-up is no timed iteration's work) and stops at the last timed boundary,
        before the lean pass or the capture registers its own kernels. Not under ``nbox emulate`` nor without a
        capture: there the timed iterations are the measurement, and no replay reads the segments.
        """
        if (self.clock.count + 1 == self.config.effective_warmup and self.phase != "failed"
                and not self.config.emulate and not self.config.no_capture):
            self._start_sampler()
        marks = self._sampler.take() if self._sampler is not None else None
        now = now_s()
        tt = thread_times_ns()
        with self._lock:
            if self.phase == "failed":
                return None
            self.clock.count += 1
            self._first_boundary.set()
            n = self.clock.count
        self.clock.take(n, now, tt, marks)
        if n >= self.config.effective_warmup + self.config.iterations:
            self._stop_sampler()
        if n == 1:
            announce(self.rank)  # multi-node runs only; in the warm-up, like the read below
        elif n <= self.config.effective_warmup:
            self._collect_peers()
        if n == self.config.effective_warmup:
            self.phase = "timing"
        steps: dict[str, Callable[[], None]] = {
            "start_lean": self._start_lean, "finish_lean": self._finish_lean,
            "start_capture": self._start_capture, "mark": mark_boundary,
            "finish_capture": self._finish_capture, "finish_timing": self._finish_timing}
        found = step_at(n, self.config)
        if found is None:
            return None

        def action(step: Callable[[], None] = steps[found]) -> None:
            try:
                step()
            except Exception as exc:
                self.fail("CaptureFailed",
                          f"nbox capture failed at iteration boundary {n}: {type(exc).__name__}: {exc}",
                          traceback.format_exc())

        return action

    def _start_sampler(self) -> None:
        """Sample the training thread (this one) at each collective it issues (a failure only costs the figures)."""
        self._stop_sampler()
        try:
            from nbox_record.capture.segments import CollectiveSampler

            sampler = CollectiveSampler()
            sampler.start()
        except Exception as exc:
            print(f"nbox: rank {self.rank}: the clean iterations' collectives cannot be sampled "
                  f"({type(exc).__name__}: {exc}); the replay scales each captured iteration by one factor",
                  file=sys.stderr)
            return
        self._sampler = sampler

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    # -- capture steps ---------------------------------------------------------------------------------

    def _collect_peers(self) -> None:
        if not self._peers_known:
            self._peers_known = collect(self.out_dir, self.world_size)

    def _timed_over(self) -> None:
        """The timed iterations are over: peers known, the emulate report written (``nbox emulate -o`` captures
        after them), and no other profiler session running."""
        self._collect_peers()
        self._write_emulate_report()
        if profiler_in_use():
            self.fail("ProfilerInUse",
                      "a profiler session is already running (torch.autograd.profiler, or one started before "
                      "nbox could stand in for torch.profiler.profile); nbox needs the profiler for its capture. "
                      "Run the script without that profiler for `nbox record`.")

    def _start_lean(self) -> None:
        self._timed_over()
        self.phase = "lean"
        self.lean.start()

    def _finish_lean(self) -> None:
        self.lean.finish()
        self._open_capture()

    def _start_capture(self) -> None:
        self._timed_over()
        self._open_capture()

    def _open_capture(self) -> None:
        self.session.open()
        self.phase = "capture"
        self.session.start()
        self.clock.capture_started(now_s(), thread_times_ns())

    def _finish_capture(self) -> None:
        self.session.finish(self.rank, self.world_size)
        self._done()

    def _finish_timing(self) -> None:
        """``NBOX_NO_CAPTURE``: the timed iterations are over; write the files and stop (no capture)."""
        self._collect_peers()
        self._write_emulate_report()
        self._done()

    def _write_emulate_report(self) -> None:
        """``NBOX_EMULATE``: what the ``nbox`` backend answered during the timed iterations."""
        if self.config.emulate:
            write_emulate_report(self.out_dir, self.clock.window_s())

    def _done(self) -> None:
        self._stop_sampler()
        timings = rank_timings(self.clock, self.config, self.rank, self.local_rank, self.world_size, self._device)
        write_json_atomic(self.out_dir / rawformat.TIMINGS, timings, durable=True)
        if self.config.emulate:
            try:
                share_results(self.out_dir, self.rank, self.world_size, self.config.exit_barrier_timeout_s)
            except Exception as exc:  # the launcher names the rank that never reported
                print(f"nbox: rank {self.rank}: {exc}", file=sys.stderr)
        self.phase = "done"
        self._end_progress()
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
        if not self.config.run_to_end:
            stop_process(self.rank, self.world_size, self.config.exit_barrier_timeout_s)

    # -- failures ------------------------------------------------------------------------------------

    def fail(self, kind: str, message: str, tb: str = "", say: bool = True) -> NoReturn:
        """An nbox-detected failure: ``error.json``, a message on stderr (unless ``say`` is False: the script's own
        last lines are the news), exit :data:`EXIT_FAILURE`."""
        self.phase = "failed"
        self.errors.write(kind, message, tb)
        if say:
            print(f"nbox: rank {self.rank}: {kind}: {message}", file=sys.stderr)
        self.lean.abort()
        self.session.abort()
        self._end_progress()
        flush_everything()
        os._exit(EXIT_FAILURE)

    def _end_progress(self, timeout_s: float = 2.0) -> None:
        """Let the progress thread write the final phase and return before this process may exit (a daemon
        thread is killed where it stands; mid-write, its temporary file stayed in the rank's folder)."""
        thread = self._progress
        self._progress_wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if os.getpid() == self.pid and self.phase != "done":
            self.phase = "failed"
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            self.errors.write(exc_type.__name__, str(exc), text)
            self._end_progress()
        self._prev_excepthook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        if os.getpid() != self.pid or self.phase in ("done", "failed"):
            return
        count, kind = self.clock.count, self.clock.kind
        if ended_by_exception(self._main_frame):  # SystemExit: the script gave up (nbox_record.handoff.scriptexit)
            when = ("before its first iteration boundary" if count == 0 or kind is None else
                    f"after {count} iteration(s), of the {self.config.needed} nbox needs")
            self.fail(SCRIPT_EXIT, f"the script exited (sys.exit or raise SystemExit) {when}; its last lines of "
                                   "stderr say why", say=False)
        if count == 0 or kind is None:
            self.fail("NoIterationBoundary", "the script ended without a single iteration boundary. " + MARKER_HINT)
        captured, lean = self.config.effective_capture, self.config.effective_lean
        self.fail("TooFewIterations",
                  f"the script ended after {count} iteration(s) ({kind} boundaries); nbox needs "
                  f"{self.config.needed} = warm-up {self.config.effective_warmup} + timed {self.config.iterations} "
                  + (f"+ lean {lean} " if lean else "") + f"+ captured {captured}. Run more steps, or lower "
                  "--warmup / --iterations / --lean-iterations (NBOX_WARMUP / NBOX_ITERATIONS / NBOX_LEAN_ITERATIONS).")

    def _no_boundary_in_time(self) -> None:
        """The watchdog's timeout: fail unless a boundary came meanwhile or the rank is over."""
        with self._lock:
            if self.clock.count or self.phase in ("done", "failed"):
                return
        self.fail("NoIterationBoundary",
                  f"no iteration boundary within {self.config.boundary_timeout_s:g} s "
                  f"({ENV_BOUNDARY_TIMEOUT}). " + MARKER_HINT)
