"""The recording rank's progress thread (nbox_record.capture.watch): woken for its last write, nothing left behind."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from nbox_record.capture.watch import report_progress, start_daemon
from nbox_record.handoff import rawformat


def test_the_progress_thread_writes_the_final_phase_at_once_when_woken(tmp_path: Path) -> None:
    """A rank ends with os._exit, which kills a daemon thread where it stands (a CI run found the atomic
    write's temporary file left in the rank's folder): the recorder sets the phase, wakes the thread and joins
    it. With a period of an hour, only the wake-up can end it within the join."""
    phase = ["timing", 3]
    wake = threading.Event()
    thread = start_daemon(lambda: report_progress(tmp_path, lambda: (str(phase[0]), int(phase[1])), wake,
                                                  period_s=3600.0), "test-progress")
    for _ in range(200):  # the first state is written before the thread sleeps
        if (tmp_path / rawformat.PROGRESS).exists():
            break
        threading.Event().wait(0.01)
    assert json.loads((tmp_path / rawformat.PROGRESS).read_text())["phase"] == "timing"
    phase[:] = ["done", 5]
    wake.set()
    thread.join(10.0)
    assert not thread.is_alive()
    doc = json.loads((tmp_path / rawformat.PROGRESS).read_text())
    assert (doc["phase"], doc["iteration"]) == ("done", 5)
    assert [p.name for p in tmp_path.iterdir()] == [rawformat.PROGRESS]  # no temporary file
