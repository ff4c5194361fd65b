"""`nbox record convert`: existing host-ET + Kineto pairs become a bundle (the Megatron TP8 sample)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import read_et
from nbox_trace.chakra.attrs import attr_map
from nbox_trace.check import inspect_trace

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = ROOT / "tests" / "data" / "samples" / "pytorch_et" / "megatron_tp8_nccl"


def nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_megatron_pair_becomes_a_bundle_with_85_all_reduces_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "tp8.bundle"
    pairs = [MEGATRON / f"megatron_{kind}_{r}.json.gz" for r in (0, 1) for kind in ("et", "kineto")]
    proc = nbox("record", "convert", *pairs, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bundle"] == str(out) and sorted(doc["nodes_per_rank"]) == ["0", "1"]
    manifest = read_manifest(out)
    assert manifest.complete and manifest.job["ranks_recorded"] == [0, 1]
    assert manifest.observed["iteration_time_us"] is None  # not invented for converted traces
    assert verify_files(out, manifest) == []
    assert inspect_trace(trace_prefix(out)).problem_count() == 0
    groups = json.loads((out / "comm_group.json").read_text())
    for rank in (0, 1):
        _, nodes = read_et(out / "trace" / f"trace.{rank}.et")
        reduces = [attr_map(n.attr) for n in nodes if n.type == pb.COMM_COLL_NODE
                   and attr_map(n.attr)["comm_type"].value == pb.ALL_REDUCE]
        assert len(reduces) == 85
        assert all(int(a["comm_size"].value) > 0 for a in reduces)  # type: ignore[arg-type]
        assert all(str(a["pg_name"].value) in groups for a in reduces)  # every group's members are known


def test_convert_refuses_odd_file_counts_and_duplicate_ranks(tmp_path: Path) -> None:
    et0 = MEGATRON / "megatron_et_0.json.gz"
    odd = nbox("record", "convert", et0, "-o", tmp_path / "x")
    assert odd.returncode == 2 and "pairs" in odd.stderr
    dup = nbox("record", "convert", et0, MEGATRON / "megatron_kineto_0.json.gz", et0,
               MEGATRON / "megatron_kineto_0.json.gz", "-o", tmp_path / "y")
    assert dup.returncode == 3 and "both claim rank 0" in dup.stderr
    missing = nbox("record", "convert", tmp_path / "nope.json", tmp_path / "k.json", "-o", tmp_path / "z")
    assert missing.returncode == 4 and "nope.json" in missing.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
