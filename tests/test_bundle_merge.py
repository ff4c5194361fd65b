"""``nbox bundle merge``: per-node bundles of one multi-node recording join into one bundle that verifies and
replays; bundles that do not belong together are refused naming the file. The node bundles here are cut from the
shipped 2-rank ddp_mlp bundle as two nodes of one rank each would have written them (the testbed tests record
real ones: tests/test_testbed_record.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbox_trace.bundle import manifest as B
from nbox_trace.bundle.archive import pack_bundle
from nbox_trace.bundle.merge import MergeError, merge_bundles
from nbox_trace.bundle.verify import verify_bundle
from nbox_trace.errors import InputNotFoundError, UsageError

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "traces" / "ddp_mlp"


def nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def node_bundle(out: Path, ranks: list[int], node_rank: int, *, job: dict[str, Any] | None = None,
                producer: dict[str, Any] | None = None, groups: dict[str, list[int]] | None = None,
                complete: bool = True, per_rank: dict[str, list[float]] | None = None,
                thread_cpu: dict[str, Any] | None = None) -> Path:
    """One node's bundle of ``ranks`` of the shipped 2-rank recording, as a multi-node ``nbox record`` writes it."""
    m = B.read_manifest(SOURCE)
    observed = B.observed_summary({r: m.observed["per_rank_us"][str(r)] for r in ranks})
    if per_rank is not None:
        observed["per_rank_us"] = per_rank
    if thread_cpu is not None:
        observed[B.THREAD_CPU_KEY] = thread_cpu
    node = {"node_rank": node_rank, "group_rank": node_rank, "ranks": ranks, "hostname": f"host{node_rank}",
            "local_addr": f"10.77.0.{node_rank + 1}"}
    manifest = B.Manifest(
        producer={**m.producer, **(producer or {})}, hardware={**m.hardware, "hostname": f"host{node_rank}"},
        job={**m.job, "nnodes": "2", "node_rank": node_rank, "nproc_per_node": len(ranks), "ranks_recorded": ranks,
             "rdzv_endpoint": "10.77.0.1:29400", "job_id": "abc123", "run_id": "none", "nodes": [node],
             "process_groups": groups or m.job["process_groups"], **(job or {})},
        observed=observed, capture=m.capture, complete=complete)
    files: dict[str, Path | bytes] = {f"trace/trace.{r}.et": SOURCE / f"trace/trace.{r}.et" for r in ranks}
    files["comm_group.json"] = (json.dumps(groups or m.job["process_groups"], indent=1) + "\n").encode()
    return B.write_bundle(out, manifest, files)


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[Path, Path]:
    return node_bundle(tmp_path / "node0.bundle", [0], 0), node_bundle(tmp_path / "node1.bundle", [1], 1)


def test_two_node_bundles_merge_into_one_that_verifies_and_replays(tmp_path: Path, nodes: tuple[Path, Path]) -> None:
    out = tmp_path / "merged.bundle"
    result = merge_bundles([nodes[1], pack_bundle(nodes[0], tmp_path / "node0.nbox")], out)  # any order, archives
    assert result.ranks == [0, 1] and [n["node_rank"] for n in result.nodes] == [0, 1]
    report = verify_bundle(out)
    assert report.ok, report.lines()
    m = B.read_manifest(out)
    assert m.job["ranks_recorded"] == [0, 1] and m.job["world_size"] == 2 and "node_rank" not in m.job
    assert [n["hostname"] for n in m.job["nodes"]] == ["host0", "host1"]
    assert m.hardware["per_node"][1]["hostname"] == "host1"
    assert m.extra["merged"]["from"] == ["node0.nbox", "node1.bundle"]  # by rank
    source = B.read_manifest(SOURCE).observed
    whole = B.observed_summary({int(r): v for r, v in source["per_rank_us"].items()})  # over every rank of the job
    assert m.observed["iteration_time_us"] == whole["iteration_time_us"] and m.observed["rule"] == B.OBSERVED_RULE
    for r in (0, 1):
        assert (out / f"trace/trace.{r}.et").read_bytes() == (SOURCE / f"trace/trace.{r}.et").read_bytes()


def test_the_nodes_clean_vs_captured_cpu_times_are_kept_per_rank(tmp_path: Path) -> None:
    figures = {str(r): {"clean": [8000.0 + r], "captured": [10000.0], "captured_wall": [20000.0]} for r in (0, 1)}
    a = node_bundle(tmp_path / "node0.bundle", [0], 0, thread_cpu={"0": figures["0"]})
    b = node_bundle(tmp_path / "node1.bundle", [1], 1, thread_cpu={"1": figures["1"]})
    merged = B.read_manifest(merge_bundles([a, b], tmp_path / "merged.bundle").out)
    assert merged.observed[B.THREAD_CPU_KEY] == figures
    plain = B.read_manifest(merge_bundles([node_bundle(tmp_path / "p0", [0], 0), node_bundle(tmp_path / "p1", [1], 1)],
                                          tmp_path / "plain.bundle").out)
    assert B.THREAD_CPU_KEY not in plain.observed  # an old recording stays without them


def test_the_merged_bundle_replays_in_virtual_time_like_the_single_node_one(tmp_path: Path,
                                                                          nodes: tuple[Path, Path]) -> None:
    out = merge_bundles(list(nodes), tmp_path / "merged.bundle").out
    docs = []
    for bundle in (out, SOURCE):
        res = nbox("replay", bundle, "--clock", "virtual", "--json")
        assert res.returncode == 0, res.stderr
        docs.append(json.loads(res.stdout))
    assert docs[0]["baseline"]["iteration_us"] == docs[1]["baseline"]["iteration_us"]


def _refused(tmp_path: Path, a: Path, b: Path, match: str) -> MergeError:
    with pytest.raises(MergeError, match=match) as err:
        merge_bundles([a, b], tmp_path / "merged.bundle")
    assert err.value.exit_code == 3 and "\n" not in str(err.value)
    assert not (tmp_path / "merged.bundle").exists() and not list(tmp_path.glob(".merged.bundle*"))
    return err.value


@pytest.mark.parametrize(("node1", "match"), [
    ({"job": {"job_id": "other"}}, r"node1.bundle: job.job_id is other, but .*node0.bundle has abc123"),
    ({"job": {"world_size": 4}}, r"node1.bundle: job.world_size is 4"),
    ({"job": {"rdzv_endpoint": "10.0.0.9:1"}}, "node1.bundle: job.rdzv_endpoint"),
    ({"producer": {"torch": "2.4.0"}}, r"node1.bundle: the producer's torch version is 2.4.0"),
    ({"groups": {"0": [0, 1, 2]}}, r"node1.bundle: process group '0' has members \[0, 1, 2\]"),
])
def test_bundles_of_different_runs_are_refused_naming_the_file(tmp_path: Path, node1: dict[str, Any],
                                                              match: str) -> None:
    a = node_bundle(tmp_path / "node0.bundle", [0], 0)
    b = node_bundle(tmp_path / "node1.bundle", [1], 1, **node1)
    _refused(tmp_path, a, b, match)


def test_overlapping_and_missing_ranks_are_refused(tmp_path: Path) -> None:
    a = node_bundle(tmp_path / "node0.bundle", [0], 0)
    again = node_bundle(tmp_path / "again.bundle", [0], 1)
    _refused(tmp_path, a, again, r"again.bundle: rank 0 is also recorded by .*node0.bundle")
    four = node_bundle(tmp_path / "four.bundle", [1], 1, job={"world_size": 4})
    a4 = node_bundle(tmp_path / "a4.bundle", [0], 0, job={"world_size": 4})
    _refused(tmp_path, a4, four, r"rank\(s\) \[2, 3\] of the world of 4 are in none of the bundles")


def test_incomplete_single_node_and_tampered_bundles_are_refused(tmp_path: Path) -> None:
    a = node_bundle(tmp_path / "node0.bundle", [0], 0)
    partial = node_bundle(tmp_path / "partial.bundle", [1], 1, complete=False)
    _refused(tmp_path, a, partial, "partial.bundle: an incomplete bundle")
    single = tmp_path / "single.bundle"
    shutil.copytree(SOURCE, single)
    _refused(tmp_path, single, a, "single.bundle: not one node's bundle of a multi-node recording")
    b = node_bundle(tmp_path / "node1.bundle", [1], 1)
    (b / "trace/trace.1.et").write_bytes(b"garbage")
    _refused(tmp_path, a, b, r"node1.bundle: does not verify .*trace/trace.1.et")


def test_a_nodes_malformed_per_rank_times_are_refused_naming_the_file_and_rank(tmp_path: Path) -> None:
    """observed.per_rank_us is untrusted: a time that is not finite and positive, or a list that is not one, is
    refused naming the bundle and the rank (nbox_trace.bundle.manifest.per_rank_times, shared with the replay)."""
    a = node_bundle(tmp_path / "node0.bundle", [0], 0)
    for k, bad in enumerate(([1000.0, float("nan")], [0.0], "1000", [])):
        b = node_bundle(tmp_path / f"bad{k}.bundle", [1], 1, per_rank={"1": bad})  # type: ignore[dict-item]
        _refused(tmp_path, a, b, rf"bad{k}.bundle: observed.per_rank_us\['1'\] is not a list of times")


def test_usage_errors_and_missing_inputs(tmp_path: Path, nodes: tuple[Path, Path]) -> None:
    with pytest.raises(UsageError, match="two or more bundles"):
        merge_bundles([nodes[0]], tmp_path / "m")
    with pytest.raises(UsageError, match="named twice"):
        merge_bundles([nodes[0], nodes[0]], tmp_path / "m")
    with pytest.raises(InputNotFoundError, match=r"nope\.bundle"):
        merge_bundles([nodes[0], tmp_path / "nope.bundle"], tmp_path / "m")


def test_cli_merge_then_verify(tmp_path: Path, nodes: tuple[Path, Path]) -> None:
    out = tmp_path / "run.bundle"
    res = nbox("bundle", "merge", nodes[0], nodes[1], "-o", out, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ranks"] == [0, 1]
    assert nbox("bundle", "verify", out).returncode == 0
    again = nbox("bundle", "merge", nodes[0], nodes[1], "-o", out)
    assert again.returncode != 0 and "already exists" in again.stderr
    bad = node_bundle(tmp_path / "other.bundle", [1], 1, job={"job_id": "zzz"})
    res = nbox("bundle", "merge", nodes[0], bad, "-o", tmp_path / "x")
    assert res.returncode == 3 and "other.bundle: job.job_id is zzz" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
