"""Bundle schema versions: a frozen 1.0 bundle keeps loading (migrated), a newer major is refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_trace import __version__
from nbox_trace.bundle.manifest import (
    BUNDLE_VERSION,
    MANIFEST_NAME,
    BundleError,
    parse_manifest,
    read_manifest,
    verify_files,
)
from nbox_trace.bundle.verify import verify_bundle

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ROOT / "traces" / "frozen-1.0-ddp_mlp"
#: sha256 of every file of the frozen bundle: it must never be regenerated.
FROZEN_MANIFEST_SHA256 = "3accb3660de7f7bc0ab2b88b3d6fc9d5427e502a7418f4678d38ad350620ced5"


def nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_frozen_bundle_is_still_the_one_recorded_with_version_1_0() -> None:
    raw = (FROZEN / MANIFEST_NAME).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == FROZEN_MANIFEST_SHA256
    assert json.loads(raw)["version"] == "1.0" and "kind" not in json.loads(raw)


def test_a_1_0_bundle_is_migrated_on_read_and_verifies() -> None:
    m = read_manifest(FROZEN)
    assert m.version == BUNDLE_VERSION != "1.0"
    assert m.extra["migrated_from"] == "1.0"
    assert m.kind == "recorded" and m.anonymized is None
    assert verify_files(FROZEN, m) == []
    report = verify_bundle(FROZEN)
    assert report.ok and report.migrated_from == "1.0", report.lines()
    assert "migrated_from" not in m.to_dict()  # a fact about the file read, not written back


def test_a_1_0_bundle_replays_in_virtual_time_like_its_migrated_copy(tmp_path: Path) -> None:
    from nbox_replay.replay import ReplayConfig, run_replay
    from nbox_trace.bundle.manifest import write_bundle

    m = read_manifest(FROZEN)
    copy = write_bundle(tmp_path / "migrated", m, {f.path: FROZEN / f.path for f in m.files})
    assert json.loads((copy / MANIFEST_NAME).read_text())["version"] == BUNDLE_VERSION
    times = []
    for bundle in (FROZEN, copy):
        report = run_replay(ReplayConfig(bundle=str(bundle), clock="virtual", compute="recorded"))
        times.append(report.what_if.to_dict()["iteration_us"])
    assert times[0] == times[1]


def _with_version(tmp_path: Path, version: object, producer_nbox: str = "9.1.0") -> Path:
    out = tmp_path / "b"
    shutil.copytree(FROZEN, out)
    data = json.loads((out / MANIFEST_NAME).read_text())
    data["version"] = version
    data["producer"]["nbox"] = producer_nbox
    (out / MANIFEST_NAME).write_text(json.dumps(data))
    return out


def test_a_newer_major_is_refused_naming_the_nbox_that_reads_it(tmp_path: Path) -> None:
    b = _with_version(tmp_path, "2.0")
    with pytest.raises(BundleError, match=r"bundle version 2\.0 \(written by nbox 9\.1\.0\) is newer than this nbox") \
            as err:
        read_manifest(b)
    assert f"({__version__})" in str(err.value) and "read it with nbox 9.1.0 or later" in str(err.value)
    report = verify_bundle(b)
    assert not report.ok and report.checks[0].name == "manifest" and "9.1.0" in report.checks[0].problems[0]
    proc = nbox("bundle", "verify", b)
    assert proc.returncode == 1 and "newer than this nbox" in proc.stdout  # issue 13: the report is on stdout
    proc = nbox("replay", b, "--clock", "virtual")
    assert proc.returncode == 3 and "newer than this nbox" in proc.stderr


def test_a_newer_minor_is_read_and_its_new_keys_kept(tmp_path: Path) -> None:
    b = _with_version(tmp_path, "1.7")
    data = json.loads((b / MANIFEST_NAME).read_text())
    data.update(kind="recorded", anonymized=None, added_in_1_7={"x": 1})
    (b / MANIFEST_NAME).write_text(json.dumps(data))
    m = read_manifest(b)
    assert m.version == "1.7" and m.extra["added_in_1_7"] == {"x": 1}


@pytest.mark.parametrize("version", ["0.9", "1", "1.0.0", "01.x", 1.0, None, "1." + "9" * 40])
def test_unreadable_versions_are_refused_by_name(version: object) -> None:
    raw = json.loads((FROZEN / MANIFEST_NAME).read_text())
    raw["version"] = version
    with pytest.raises(BundleError, match="version"):
        parse_manifest(json.dumps(raw).encode(), "m.json")
