"""The capture session of one recording rank: the execution-trace observer, Kineto and the collective log.

``torch.profiler.profile(activities=[CPU (+CUDA)], execution_trace_observer=ExecutionTraceObserver(),
record_shapes=True)`` plus :class:`nbox_record.capture.commlog.CollectiveLogger` (and, under ``nbox emulate``, the
``nbox`` backend's collectives through :mod:`nbox_record.capture.emulated_tap`). :meth:`CaptureSession.finish`
writes the host ET, the Kineto trace and ``collectives.json`` (files: :mod:`nbox_record.handoff.rawformat`).
Imports torch only when used.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbox_record.handoff import BOUNDARY_MARKER, rawformat
from nbox_trace.files import write_json_atomic

if TYPE_CHECKING:
    from emulator_core.backend import Observer
    from nbox_record.capture.commlog import CollectiveLogger

def profiler_in_use() -> bool:
    """Whether a torch.profiler session (the script's own) is already running."""
    import torch

    return bool(torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled())


def mark_boundary() -> None:
    """Record :data:`~nbox_record.handoff.rawformat.BOUNDARY_MARKER`."""
    import torch

    with torch.profiler.record_function(BOUNDARY_MARKER):
        pass


class LeanSession:
    """The lean pass before the capture (:mod:`nbox_record.sources.leantiming`): Kineto alone (CPU activity, no shapes,
    no ET observer), written to ``kineto_lean.json``. :meth:`start`, then :meth:`finish` or :meth:`abort`."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._prof: Any = None

    def start(self) -> None:
        """Start Kineto and mark the first boundary."""
        from torch.profiler import ProfilerActivity

        from nbox_record.capture.scriptprofiler import real_profile

        self._prof = real_profile()(activities=[ProfilerActivity.CPU], record_shapes=False)
        self._prof.start()
        mark_boundary()

    def finish(self) -> None:
        """Mark the last boundary, stop and write the trace (atomically); nothing when no pass is running (an
        aborted one: the conversion then finds no lean trace and keeps the profiled times)."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        mark_boundary()
        prof.stop()
        tmp = self.out_dir / f".{rawformat.KINETO_LEAN}.{os.getpid()}.partial.json"
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, self.out_dir / rawformat.KINETO_LEAN)

    def abort(self) -> None:
        """Stop a lean pass in progress without writing anything."""
        if self._prof is not None:
            with contextlib.suppress(Exception):
                self._prof.stop()
            self._prof = None


class CaptureSession:
    """One capture into ``out_dir``: :meth:`open`, :meth:`start`, then :meth:`finish` or :meth:`abort`."""

    def __init__(self, out_dir: Path, emulate: bool) -> None:
        self.out_dir, self.emulate = out_dir, emulate
        self._prof: Any = None
        self._et: Any = None
        self._comm: CollectiveLogger | None = None
        self._observer: Observer | None = None

    def open(self) -> None:
        """Register the ET observer, make the profiler and start the collective log (not yet profiling)."""
        import torch
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity

        from nbox_record.capture.scriptprofiler import real_profile

        profile = real_profile()  # torch.profiler.profile may be the script's stand-in by now

        from nbox_record.capture.commlog import CollectiveLogger

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._et = ExecutionTraceObserver().register_callback(str(self._tmp_et()))
        self._prof = profile(activities=activities, execution_trace_observer=self._et, record_shapes=True)
        self._comm = CollectiveLogger()
        self._comm.start()
        if self.emulate:
            from nbox_record.capture import emulated_tap as emulatecapture

            self._observer = emulatecapture.tap(self._comm)

    def start(self) -> None:
        """Start profiling and mark the first boundary."""
        assert self._prof is not None
        self._prof.start()
        mark_boundary()

    def _tmp_et(self) -> Path:
        return self.out_dir / f".{rawformat.HOST_ET}.{os.getpid()}.partial.json"

    def _untap(self) -> None:
        if self._observer is not None:
            from nbox_record.capture import emulated_tap as emulatecapture

            emulatecapture.untap(self._observer)
            self._observer = None

    def abort(self) -> None:
        """Stop a capture in progress without writing anything (marker switch, failure)."""
        if self._prof is not None:
            with contextlib.suppress(Exception):
                self._prof.stop()
            self._prof = None
        if self._comm is not None:  # before the observer goes: the Works settle first (CollectiveLogger.stop)
            with contextlib.suppress(Exception):
                self._comm.stop()
            self._untap()
            self._comm = None
        if self._et is not None:
            with contextlib.suppress(Exception):
                self._et.unregister_callback()
            self._et = None
            with contextlib.suppress(OSError):
                self._tmp_et().unlink()

    def finish(self, rank: int, world_size: int) -> None:
        """Mark the last boundary, stop, and write the host ET, Kineto and ``collectives.json`` of this rank."""
        mark_boundary()
        prof, et, comm = self._prof, self._et, self._comm
        assert prof is not None and et is not None and comm is not None
        prof.stop()
        self._untap()
        records = comm.stop()  # waits for the capture's Works to finish: only then may the observer go
        if comm.unsettled:
            from nbox_record.capture.commlog import SETTLE_TIMEOUT_S

            first = comm.unsettled[0]
            print(f"nbox: rank {rank}: {len(comm.unsettled)} collective(s) issued in the captured iteration still "
                  f"running {SETTLE_TIMEOUT_S:g} s after it (first: {first['op']} #{first['seq']}); the trace "
                  "observer is removed anyway, and with gloo the rank may abort when they finish", file=sys.stderr)
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

        from nbox_record.capture.commlog import process_groups

        # Under nbox emulate, the rank as the script's world sees it: the global rank played in a world of W.
        seen = self.emulate and dist.is_available() and dist.is_initialized()
        log: rawformat.CollectiveLog = {
            "version": rawformat.RAW_FORMAT_VERSION,
            "rank": dist.get_rank() if seen else rank,
            "world_size": dist.get_world_size() if seen else world_size,
            "process_groups": process_groups(),
            "collectives": records,
        }
        write_json_atomic(self.out_dir / rawformat.COLLECTIVES, log, durable=True)
        if comm.errors:
            print(f"nbox: rank {rank}: {len(comm.errors)} collective(s) could not be described; first: "
                  f"{comm.errors[0]}", file=sys.stderr)
