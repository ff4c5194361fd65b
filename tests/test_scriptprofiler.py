"""The stand-in for a script's own torch.profiler.profile while nbox records (nbox_record/scriptprofiler.py)."""

from __future__ import annotations

import pytest

from nbox_record.scriptprofiler import ScriptProfiler, ScriptProfilerDisabled
from nbox_trace.errors import NboxError


def test_the_script_profiler_stand_in_counts_steps_and_names_what_it_cannot_give() -> None:
    steps: list[int] = []
    bound = type("profile", (ScriptProfiler,), {"on_step": staticmethod(lambda: steps.append(1))})
    with bound(activities=[], schedule=None, on_trace_ready=lambda p: steps.append(99)) as prof:
        prof.step()
        prof.step()
    assert steps == [1, 1] and prof.step_num == 2  # on_trace_ready never runs: nothing was collected
    assert not hasattr(prof, "key_averages")
    with pytest.raises(ScriptProfilerDisabled, match="key_averages: the script's own profiler collects nothing"):
        prof.key_averages()
    assert issubclass(ScriptProfilerDisabled, NboxError)
