"""`nbox bundle inspect|verify|pack|unpack|diff|anonymize` end to end on the shipped bundles, as a
receiving team runs them: exit codes, one JSON document on stdout with --json, errors naming the file."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_mlp"
FSDP = ROOT / "traces" / "fsdp2_transformer"


def nbox(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def doc(*args: object) -> dict[str, Any]:
    proc = nbox(*args, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_pack_verify_unpack_inspect_round_trip(tmp_path: Path) -> None:
    archive = tmp_path / "fsdp.nbox"
    packed = doc("bundle", "pack", FSDP, "-o", archive)
    assert packed["archive"] == str(archive) and packed["bytes"] == archive.stat().st_size
    verified = doc("bundle", "verify", archive)
    assert verified["ok"] and [c["name"] for c in verified["checks"]] == [
        "archive", "manifest", "files", "layout", "traces", "collectives"]
    doc("bundle", "unpack", archive, tmp_path / "out")
    for f in (FSDP / "trace").iterdir():
        assert (tmp_path / "out" / "trace" / f.name).read_bytes() == f.read_bytes()
    a, b = doc("bundle", "inspect", archive), doc("bundle", "inspect", tmp_path / "out")
    assert a["schema"] == "nbox.bundle-inspect/1" and a["path"] == str(archive)
    assert {k: v for k, v in a.items() if k != "path"} == {k: v for k, v in b.items() if k != "path"}
    again = nbox("bundle", "pack", FSDP, "-o", archive)
    assert again.returncode == 5 and "exists" in again.stderr


def test_verify_fails_with_exit_1_naming_the_tampered_file(tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(DDP, b)
    data = bytearray((b / "trace" / "trace.1.et").read_bytes())
    data[-3] ^= 0xFF
    (b / "trace" / "trace.1.et").write_bytes(bytes(data))
    (b / "notes.txt").write_text("not in the manifest")
    proc = nbox("bundle", "verify", b, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    files = next(c for c in report["checks"] if c["name"] == "files")
    assert not files["ok"] and any("trace/trace.1.et: sha256" in p for p in files["problems"])
    assert any("notes.txt: present but not listed" in p for p in files["problems"])
    assert next(c for c in report["checks"] if c["name"] == "traces")["skipped"]


def test_verify_finds_collective_sequences_that_disagree_across_ranks(tmp_path: Path) -> None:
    from nbox_trace.bundle.manifest import read_manifest, write_bundle
    from nbox_trace.chakra.codec import EtReader, EtWriter

    m = read_manifest(DDP)
    edited = tmp_path / "trace.1.et"
    with EtReader(DDP / "trace" / "trace.1.et") as reader, EtWriter(edited, reader.metadata) as writer:
        for node in reader:
            for a in node.attr:
                if a.name == "comm_size":
                    a.int64_val += 4
            writer.write(node)
    files = {f.path: DDP / f.path for f in m.files}
    files["trace/trace.1.et"] = edited
    out = write_bundle(tmp_path / "b", m, files)
    proc = nbox("bundle", "verify", out, "--json")
    assert proc.returncode == 1, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["files"]["ok"] and checks["traces"]["ok"] and not checks["collectives"]["ok"]
    assert any("rank" in p for p in checks["collectives"]["problems"]), checks["collectives"]


def test_a_hostile_archive_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    evil = tmp_path / "evil.nbox"
    manifest = (DDP / "manifest.json").read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("manifest.json", manifest), ("../escaped.txt", b"pwned")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    evil.write_bytes(buf.getvalue())
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = nbox("bundle", "unpack", evil, tmp_path / "out")
    assert proc.returncode == 3, proc.stderr
    assert "evil.nbox" in proc.stderr and "../escaped.txt" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    proc = nbox("bundle", "verify", evil, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["checks"][0]["name"] == "archive" and not report["checks"][0]["ok"]


def test_diff_of_a_bundle_with_its_archive_is_empty_and_with_another_explains_it(tmp_path: Path) -> None:
    archive = tmp_path / "a.nbox"
    doc("bundle", "pack", DDP, "-o", archive)
    same = doc("bundle", "diff", DDP, archive)
    assert same["schema"] == "nbox.bundle-diff/1" and same["iteration_time"]["ratio"] == 1.0
    assert not same["collectives_resized"] and not same["operators_added"]
    other = nbox("bundle", "diff", DDP, ROOT / "traces" / "ddp_transformer")
    assert other.returncode == 0 and "verdict" in other.stdout and "slower" in other.stdout  # issue 13: stdout


def test_anonymize_with_a_saved_key_is_reproducible_verifies_and_replays_the_same(tmp_path: Path) -> None:
    key = tmp_path / "team.key"
    first = doc("bundle", "anonymize", FSDP, "-o", tmp_path / "a1", "--save-key", key)
    assert oct(key.stat().st_mode & 0o777) == "0o600" and len(key.read_bytes()) == 32
    second = doc("bundle", "anonymize", FSDP, "-o", tmp_path / "a2", "--key-file", key)
    assert first["key_id"] == second["key_id"]
    for f in (tmp_path / "a1" / "trace").iterdir():
        assert f.read_bytes() == (tmp_path / "a2" / "trace" / f.name).read_bytes()
    assert doc("bundle", "verify", tmp_path / "a1")["ok"]
    strict = doc("bundle", "anonymize", FSDP, "-o", tmp_path / "s", "--level", "strict", "--key-file", key)
    assert strict["dropped_shapes"] is True
    times = [doc("replay", b, "--clock", "virtual")["what_if"]["iteration_us"]
             for b in (FSDP, tmp_path / "a1", tmp_path / "s")]
    assert times[0] == times[1] == times[2]
    live = nbox("replay", tmp_path / "s", "--compute", "live", "--iterations", 1)
    assert live.returncode == 3 and "--compute recorded" in live.stderr


def test_bundle_commands_name_a_missing_input() -> None:
    proc = nbox("bundle", "inspect", "no/such/bundle")
    assert proc.returncode == 4 and "no/such/bundle" in proc.stderr
    proc = nbox("bundle", "unpack", "no/such.nbox", "x")
    assert proc.returncode == 4 and "no/such.nbox" in proc.stderr


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX only")
def test_bundle_help_lists_every_command() -> None:
    proc = nbox("bundle", "--help")
    assert proc.returncode == 0
    for name in ("inspect", "verify", "pack", "unpack", "diff", "anonymize"):
        assert name in proc.stdout
