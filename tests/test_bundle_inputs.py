"""Every command that reads traces takes a bundle the same way (issue 13's dead ends, pinned):

- `nbox trace inspect BUNDLE_DIR` said "holds no .et files" while replay accepted the same directory;
- `bundle inspect` of a bundle whose listed trace was deleted exited 0 and counted the file;
- `bundle anonymize --save-key` onto an existing file failed only after writing the bundle;
- messages said "pass overwrite" instead of naming the flag `--overwrite`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_replay.inputs.source import open_source
from nbox_trace.bundle.manifest import locate_traces
from nbox_trace.errors import InputNotFoundError

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_mlp"


def nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def _broken(tmp_path: Path) -> Path:
    bundle = tmp_path / "b"
    shutil.copytree(DDP, bundle)
    (bundle / "trace" / "trace.1.et").unlink()
    return bundle


def test_trace_inspect_reads_a_bundle_directory_and_an_archive_like_its_trace_folder(tmp_path: Path) -> None:
    plain = json.loads(nbox("trace", "inspect", DDP / "trace", "--json").stdout)
    as_bundle = nbox("trace", "inspect", DDP, "--json")
    assert as_bundle.returncode == 0, as_bundle.stderr
    assert json.loads(as_bundle.stdout) == plain
    archive = tmp_path / "ddp.nbox"
    assert nbox("bundle", "pack", DDP, "-o", archive).returncode == 0
    packed = json.loads(nbox("trace", "inspect", archive, "--json").stdout)
    assert packed["directory"] == str(archive / "trace")
    assert packed["ranks"][1]["node_count"] == plain["ranks"][1]["node_count"] and packed["rank_ids"] == [0, 1]


def test_one_rule_for_a_bundles_traces_in_trace_inspect_and_replay(tmp_path: Path) -> None:
    trace_set, manifest = locate_traces(DDP)
    assert manifest is not None and open_source(DDP).trace_set == trace_set
    broken = _broken(tmp_path)
    for call in (lambda: locate_traces(broken), lambda: open_source(broken)):
        with pytest.raises(InputNotFoundError, match=r"records rank\(s\) \[1\] but .*trace\.1\.et is missing"):
            call()
    proc = nbox("trace", "inspect", broken)
    assert proc.returncode == 4 and "trace.1.et is missing" in proc.stderr and len(proc.stderr.splitlines()) <= 2


def test_bundle_inspect_names_a_missing_listed_trace_and_exits_1(tmp_path: Path) -> None:
    broken = _broken(tmp_path)
    human = nbox("bundle", "inspect", broken)
    assert human.returncode == 1, human.stderr
    assert "MISSING: trace/trace.1.et is listed in the manifest but not on disk" in human.stdout
    assert "in 3 files" in human.stdout  # manifest, comm_group.json, trace.0.et: the missing one is not counted
    doc = nbox("bundle", "inspect", broken, "--json")
    assert doc.returncode == 1 and json.loads(doc.stdout)["missing_files"] == ["trace/trace.1.et"]
    assert json.loads(nbox("bundle", "inspect", DDP, "--json").stdout)["missing_files"] == []


def test_anonymize_save_key_onto_an_existing_file_writes_nothing(tmp_path: Path) -> None:
    key = tmp_path / "team.key"
    key.write_bytes(b"old key, keep me")
    proc = nbox("bundle", "anonymize", DDP, "-o", tmp_path / "anon", "--save-key", key)
    assert proc.returncode == 5 and "team.key: cannot write the key" in proc.stderr
    assert not (tmp_path / "anon").exists() and key.read_bytes() == b"old key, keep me"


def test_a_failed_anonymize_leaves_no_key_file_and_names_the_overwrite_flag(tmp_path: Path) -> None:
    (tmp_path / "anon").mkdir()
    key = tmp_path / "new.key"
    proc = nbox("bundle", "anonymize", DDP, "-o", tmp_path / "anon", "--save-key", key)
    assert proc.returncode == 5 and "already exists (use --overwrite to replace it)" in proc.stderr
    assert not key.exists()
    ok = nbox("bundle", "anonymize", DDP, "-o", tmp_path / "anon2", "--save-key", key)
    assert ok.returncode == 0 and len(key.read_bytes()) == 32 and (key.stat().st_mode & 0o777) == 0o600
