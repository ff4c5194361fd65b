"""The stand-in for a script's own torch.profiler.profile while nbox records (nbox_record/capture/scriptprofiler.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbox_record.capture.scriptprofiler import ScriptProfiler, ScriptProfilerDisabled
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


def test_torch_own_code_gets_the_real_profiler(tmp_path: Path) -> None:
    import torch

    from nbox_record.capture.scriptprofiler import real_profile

    bound = type("profile", (ScriptProfiler,), {})
    assert isinstance(bound(), ScriptProfiler)  # from this file: the script's side
    fake = Path(torch.__file__).parent / "_inductor" / "nbox_test_caller.py"  # never written: a code name only
    code = compile("made = bound(activities=[torch.profiler.ProfilerActivity.CPU])", str(fake), "exec")
    scope: dict[str, object] = {"bound": bound, "torch": torch}
    exec(code, scope)
    assert type(scope["made"]) is real_profile()
