"""The one atomic writer (nbox_trace.files): four copies disagreed before issue 12.

- calibrate's left a calibrated scenario at mode 0600 (mkstemp's), sweep's and timeline's chmod'ed 0644;
- timeline's let a raw OSError escape from a folder it could not write into (the library raises only NboxError);
- only the in-rank writer fsynced, and it named its temporary by pid (two threads of a rank could collide).
One writer now: 0644, OutputWriteError (or the caller's subclass) naming the path, fsync on request, no leftovers.
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from emulator_core.calibration.spec import CalibrationWriteError
from nbox_replay.report.timeline import TimelineWriteError
from nbox_replay.sweep import SweepWriteError
from nbox_trace.errors import NboxError, OutputWriteError
from nbox_trace.files import write_atomic, write_json_atomic


def test_writes_text_and_bytes_with_shared_permissions(tmp_path: Path) -> None:
    a = write_atomic(tmp_path / "new" / "a.txt", "héllo")
    b = write_atomic(tmp_path / "b.bin", b"\x00\x01", durable=True)
    assert a.read_text(encoding="utf-8") == "héllo" and b.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(a.stat().st_mode) == 0o644 == stat.S_IMODE(b.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "new"]


def test_replaces_whole_and_leaves_no_temporary_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(ValueError):  # NaN is not JSON: refused before anything is written
        write_json_atomic(target, {"a": float("nan")})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_path_under_a_file_is_an_output_error_with_the_callers_class(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for cls in (OutputWriteError, TimelineWriteError, SweepWriteError, CalibrationWriteError):
        with pytest.raises(cls, match=re.escape("file/sub/out.txt: cannot write")) as info:
            write_atomic(blocker / "sub" / "out.txt", "x", error=cls)
        assert isinstance(info.value, NboxError) and info.value.exit_code == 5


def test_a_configs_path_fields_given_as_strings_become_paths(tmp_path: Path) -> None:
    """Library callers may pass str where the CLI passes Path: every command's config turns them into Paths, so a
    missing file is the command's clear error naming it (before: an AttributeError from ``str.read_text``)."""
    from nbox_record.launch.emulation import EmulateConfig
    from nbox_record.launch.launcher import RecordConfig
    from nbox_replay.replay import ReplayConfig
    from nbox_trace.errors import InputNotFoundError

    rec = RecordConfig(out=str(tmp_path / "b"), script="train.py")  # type: ignore[arg-type]
    assert rec.out == tmp_path / "b" and rec.script == Path("train.py")
    rep = ReplayConfig("bundle", what_if="w.toml", baseline="b.toml", out="o")  # type: ignore[arg-type]
    assert (rep.what_if, rep.baseline, rep.out) == (Path("w.toml"), Path("b.toml"), Path("o"))
    with pytest.raises(InputNotFoundError, match=r"nowhere\.toml: scenario file not found"):
        EmulateConfig(world_size=4, nproc=1, scenario=str(tmp_path / "nowhere.toml"))  # type: ignore[arg-type]
    emu = EmulateConfig(world_size=4, nproc=1, script="t.py", out="o")  # type: ignore[arg-type]
    assert emu.script == Path("t.py") and emu.out == Path("o")
