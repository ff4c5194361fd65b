"""nbox_trace.bundle.inspection: manifest facts, per-rank trace summaries and size on disk of a bundle."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from nbox_trace.bundle.inspection import INSPECT_SCHEMA, inspect_bundle
from nbox_trace.bundle.manifest import MANIFEST_NAME, read_manifest, trace_prefix
from nbox_trace.check import inspect_trace
from nbox_trace.errors import InputNotFoundError, InvalidInputError
from nbox_trace.units import format_bytes

TRACES = Path(__file__).resolve().parents[1] / "traces"
BUNDLES = sorted(p.name for p in TRACES.iterdir() if (p / MANIFEST_NAME).is_file())


def test_shipped_bundles_are_found() -> None:
    assert {"ddp_mlp", "ddp_transformer", "fsdp2_transformer"} <= set(BUNDLES)


@pytest.mark.parametrize("name", BUNDLES)
def test_inspect_matches_manifest_and_traces(name: str) -> None:
    root = TRACES / name
    s = inspect_bundle(root)
    m = read_manifest(root)
    report = inspect_trace(trace_prefix(root), comm_group=root / "comm_group.json")

    assert s.schema_version == m.version and s.migrated_from == m.extra.get("migrated_from")
    assert (s.kind, s.anonymized, s.complete) == (m.kind, m.anonymized, m.complete)
    assert s.producer == m.producer and s.hardware == m.hardware and s.capture == m.capture
    assert s.world_size == m.job["world_size"]
    assert list(s.ranks_recorded) == m.job["ranks_recorded"]
    assert s.script == m.job["script"] and list(s.args) == m.job["args"]
    assert s.process_groups == m.job["process_groups"]
    it = m.observed["iteration_time_us"]
    assert s.iteration_time_us == {k: it[k] for k in ("median", "p10", "p90", "n")}

    assert [r.rank for r in s.ranks] == [r.rank for r in report.ranks] == m.job["ranks_recorded"]
    for mine, theirs in zip(s.ranks, report.ranks, strict=True):
        assert mine.node_count == theirs.node_count
        assert mine.nodes_by_type == theirs.nodes_by_type
        assert mine.comp_duration_us == theirs.comp_duration_us
        assert mine.critical_path_us == theirs.critical_path_us
        assert [(c.pg_name, c.comm_type, c.count, c.total_bytes) for c in mine.collectives] == \
               [(c.pg_name, c.comm_type, c.count, c.total_bytes) for c in theirs.collectives]
        assert (mine.p2p_sends, mine.p2p_recvs, mine.p2p_bytes_sent) == \
               (theirs.p2p_sends, theirs.p2p_recvs, theirs.p2p_bytes_sent)
    assert s.problem_count == report.problem_count()

    on_disk = {f.path: (root / f.path).stat().st_size for f in m.files}
    assert {f.path: f.disk_bytes for f in s.files} == on_disk
    assert {f.path: f.listed_bytes for f in s.files} == {f.path: f.bytes for f in m.files}
    assert s.size_on_disk_bytes == sum(on_disk.values()) + (root / MANIFEST_NAME).stat().st_size

    doc = json.loads(json.dumps(s.to_dict()))
    assert doc["schema"] == INSPECT_SCHEMA
    assert doc["size_on_disk_bytes"] == s.size_on_disk_bytes
    assert len(doc["ranks"]) == len(s.ranks)
    text = "\n".join(s.lines())
    # Issue 13: bytes in IEC units everywhere (it printed "72162 bytes" here, "1.6 MiB" elsewhere).
    assert m.job["script"] in text and f"size on disk: {format_bytes(s.size_on_disk_bytes)} in" in text


def test_not_a_bundle_names_the_path(tmp_path: Path) -> None:
    for path in (TRACES / "synthetic_ddp_mlp", tmp_path / "nope"):
        with pytest.raises(InputNotFoundError, match=re.escape(str(path))):
            inspect_bundle(path)


def test_corrupt_trace_names_the_file(tmp_path: Path) -> None:
    root = shutil.copytree(TRACES / "ddp_mlp", tmp_path / "b")
    et = root / "trace" / "trace.1.et"
    data = bytearray(et.read_bytes())
    data[200:260] = b"\xff" * 60
    et.write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match=r"trace\.1\.et"):
        inspect_bundle(root)
