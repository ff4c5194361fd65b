"""Bundle format: atomic write, validating read, file verification, observed-time summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbox_trace.bundle import manifest as B
from nbox_trace.errors import InputNotFoundError, NboxError


def _manifest() -> B.Manifest:
    return B.Manifest(producer={"nbox": "0.1.0", "torch": "2.13.0", "backend": "gloo"},
                      hardware={"cpu_count": 2}, job={"world_size": 2, "ranks_recorded": [0, 1]},
                      observed=B.observed_summary({0: [100.0, 120.0, 110.0], 1: [105.0, 115.0, 130.0]}),
                      capture={"warmup": 3, "iterations_timed": 3, "iterations_captured": 1})


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "a.et"
    src.write_bytes(b"\x00" * 10)
    out = B.write_bundle(tmp_path / "b", _manifest(), {"trace/trace.0.et": src, "comm_group.json": b"{}"})
    m = B.read_manifest(out)
    assert [f.path for f in m.files] == ["comm_group.json", "trace/trace.0.et"]
    assert {f.path: f.bytes for f in m.files} == {"comm_group.json": 2, "trace/trace.0.et": 10}
    assert m.job["world_size"] == 2 and m.complete is True and m.version == B.BUNDLE_VERSION
    assert B.verify_files(out, m) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_observed_summary_takes_the_jobs_pace_the_mean_over_ranks_per_iteration() -> None:
    s = B.observed_summary({0: [100.0, 120.0, 110.0], 1: [105.0, 115.0, 130.0]})
    it = s["iteration_time_us"]
    assert (it["median"], it["min"], it["max"], it["n"]) == (117.5, 102.5, 120.0, 3)
    assert it["p10"] <= it["median"] <= it["p90"] and s["rule"] == B.OBSERVED_RULE
    with pytest.raises(ValueError):
        B.observed_summary({0: []})


def test_the_jobs_iteration_is_never_longer_than_every_ranks_own_window() -> None:
    """Two ranks in lock step whose boundaries wobble: each rank's window is 300 us for 3 iterations, so the job's
    pace is 100 us. The largest rank's time per iteration makes it 113 us on average, longer than either rank
    took; the mean over ranks keeps each rank's window."""
    per_rank = {0: [80.0, 120.0, 100.0], 1: [120.0, 80.0, 100.0]}
    slowest = [max(a, b) for a, b in zip(per_rank[0], per_rank[1], strict=True)]
    assert sum(slowest) / 3 == pytest.approx(340.0 / 3) and sum(slowest) / 3 > 100.0
    job = B.job_iterations_us(per_rank)
    assert job == [100.0, 100.0, 100.0] and sum(job) == sum(per_rank[0]) == sum(per_rank[1])
    assert B.job_iterations_us({0: [1.0, 2.0, 3.0], 1: [3.0, 4.0]}) == [2.0, 3.0]  # the shortest rank sets the count
    with pytest.raises(ValueError):
        B.job_iterations_us({})


def test_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    class Exploding(dict[str, bytes]):
        def items(self):  # type: ignore[override]
            yield "trace/trace.0.et", b"x"
            raise Boom

    with pytest.raises(Boom):
        B.write_bundle(tmp_path / "b", _manifest(), Exploding())
    assert list(tmp_path.iterdir()) == []


def test_existing_target_needs_overwrite(tmp_path: Path) -> None:
    B.write_bundle(tmp_path / "b", _manifest(), {"x.txt": b"1"})
    with pytest.raises(B.BundleWriteError, match="already exists"):
        B.write_bundle(tmp_path / "b", _manifest(), {"x.txt": b"2"})
    B.write_bundle(tmp_path / "b", _manifest(), {"x.txt": b"22"}, overwrite=True)
    assert (tmp_path / "b" / "x.txt").read_bytes() == b"22"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.parametrize("rel", ["/etc/passwd", "../x", "a/../../x", "", "a\\b", "manifest.json"])
def test_write_refuses_bad_member_names(tmp_path: Path, rel: str) -> None:
    with pytest.raises(NboxError):
        B.write_bundle(tmp_path / "b", _manifest(), {rel: b"1"})
    assert not (tmp_path / "b").exists()


def test_verify_files_reports_tampering(tmp_path: Path) -> None:
    out = B.write_bundle(tmp_path / "b", _manifest(), {"a.bin": b"abc", "b.bin": b"xyz"})
    m = B.read_manifest(out)
    (out / "a.bin").write_bytes(b"abcd")         # size differs
    (out / "b.bin").write_bytes(b"XYZ")          # same size, hash differs
    (out / "extra.bin").write_bytes(b"!")        # not listed
    problems = B.verify_files(out, m)
    assert any("a.bin: 4 bytes, manifest says 3" in p for p in problems)
    assert any("b.bin: sha256 differs" in p for p in problems)
    assert any("extra.bin: present but not listed" in p for p in problems)


def _rewrite(out: Path, **changes: object) -> None:
    data = json.loads((out / B.MANIFEST_NAME).read_text())
    data.update(changes)
    (out / B.MANIFEST_NAME).write_text(json.dumps(data))


@pytest.mark.parametrize(("changes", "match"), [
    ({"version": "2.0"}, "newer than this nbox"),
    ({"version": "one"}, "MAJOR.MINOR"),
    ({"schema": "other"}, "'schema'"),
    ({"job": []}, "'job'"),
    ({"complete": "yes"}, "'complete'"),
    ({"files": [{"path": "../../etc/passwd", "bytes": 1, "sha256": "0" * 64}]}, "not a plain relative path"),
    ({"files": [{"path": "a", "bytes": 1}]}, r"files\[0\]"),
    ({"files": [{"path": "a", "bytes": 1, "sha256": "0" * 64}] * 2}, "twice"),
])
def test_read_manifest_refuses_bad_manifests(tmp_path: Path, changes: dict[str, object], match: str) -> None:
    out = B.write_bundle(tmp_path / "b", _manifest(), {"a": b"1"})
    _rewrite(out, **changes)
    with pytest.raises(B.BundleError, match=match):
        B.read_manifest(out)


def test_read_manifest_names_missing_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="not a bundle"):
        B.read_manifest(tmp_path)
    (tmp_path / B.MANIFEST_NAME).write_bytes(b"\xff{")
    with pytest.raises(B.BundleError, match="not valid JSON"):
        B.read_manifest(tmp_path)
    (tmp_path / B.MANIFEST_NAME).write_text("[" * 100_000)
    with pytest.raises(B.BundleError):
        B.read_manifest(tmp_path)
