"""The 2-D mesh example (``tp_dp_mlp``: tensor parallel x data parallel) recorded at W = 4 through ``nbox record``:
what was captured (collectives per group and their sizes, the groups) and the mesh read off it (dp=2 x tp=2, named
by DeviceMesh's descriptions), then a virtual replay of it at ``--mesh dp=8,tp=2``.

Launches 4 real gloo ranks (marked ``integration``); a few iterations, no timing asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_trace.bundle.manifest import read_manifest, trace_prefix, verify_files
from nbox_trace.check import inspect_trace

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
CAPTURE = 2


def nbox(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpdp") / "tpdp.bundle"
    proc = nbox("record", "-n", 4, "--example", "tp_dp_mlp", "--warmup", 1, "--iterations", 3,
                "--capture", CAPTURE, "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def expected_bytes() -> tuple[int, int]:
    """(one tp activation all-reduce, the dp gradient bucket) in bytes, from the example's own definitions:
    fc1 is split by rows of its weight and its bias, fc2 by columns of its weight (its bias is replicated)."""
    from nbox_record.examples import tp_dp_mlp as ex

    tp = 2
    model = ex.build_model()
    local = 0
    for name, p in model.named_parameters():
        split = ".fc1." in name or name.endswith("fc2.weight")
        local += p.numel() // tp if split else p.numel()
    return ex.BATCH * ex.DIM * 4, local * 4


def test_the_captured_collectives_follow_the_mesh(bundle: Path) -> None:
    from nbox_record.examples import tp_dp_mlp as ex

    manifest = read_manifest(bundle)
    assert manifest.complete and manifest.job["world_size"] == 4 and manifest.job["ranks_recorded"] == [0, 1, 2, 3]
    assert verify_files(bundle, manifest) == []
    report = inspect_trace(trace_prefix(bundle))
    assert report.problem_count() == 0, [p.message for p in report.all_problems()][:5]

    proc = nbox("bundle", "inspect", bundle, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    members = {name: sorted(ranks) for name, ranks in doc["process_groups"].items()}
    assert members.pop("0") == [0, 1, 2, 3]  # the world group, which runs nothing
    dp_groups = {(0, 2), (1, 3)}
    tp_groups = {(0, 1), (2, 3)}
    assert {tuple(m) for m in members.values() if len(m) == 2} == dp_groups | tp_groups
    by_members = {tuple(m): name for name, m in members.items()}

    act, bucket = expected_bytes()
    for r in doc["ranks"]:
        rank = r["rank"]
        tp_name = by_members[(rank & ~1, rank | 1)]
        dp_name = by_members[(rank % 2, rank % 2 + 2)]
        colls = {(c["pg_name"], c["comm_type"]): (c["count"], c["total_bytes"]) for c in r["collectives"]}
        # per iteration: each block all-reduces its activations in forward and their gradient in backward (tp),
        # and one gradient bucket is all-reduced over dp; nothing else, and nothing on the world group.
        assert colls == {(tp_name, "ALL_REDUCE"): (2 * ex.BLOCKS * CAPTURE, 2 * ex.BLOCKS * CAPTURE * act),
                         (dp_name, "ALL_REDUCE"): (CAPTURE, CAPTURE * bucket)}, rank

    mesh = doc["mesh"]
    assert mesh["ok"] and mesh["mesh"] == "dp=2 x tp=2" and not mesh["guessed"]
    dims = {d["name"]: d for d in mesh["dims"]}
    assert (dims["dp"]["degree"], dims["dp"]["stride"]) == (2, 2)
    assert (dims["tp"]["degree"], dims["tp"]["stride"]) == (2, 1)
    assert dims["dp"]["named_by"] == "description 'mesh_dp'" and dims["tp"]["named_by"] == "description 'mesh_tp'"
    assert {tuple(members[g]) for g in dims["dp"]["groups"]} == dp_groups
    assert {tuple(members[g]) for g in dims["tp"]["groups"]} == tp_groups


def test_the_recording_replays_at_a_larger_mesh_in_virtual_time(bundle: Path) -> None:
    proc = nbox("replay", bundle, "--clock", "virtual", "--mesh", "dp=8,tp=2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["what_if_world"]["world_size"] == 16
    text = json.dumps(doc)
    assert "dp group 2 -> 8 ranks: data-parallel gradient all-reduce keeps its bytes" in text
    assert "tp group not resized (2 ranks): unchanged" in text


@pytest.mark.parametrize("real", ["0,1", "0,2"])
def test_emulate_runs_the_2d_script_at_sixteen_ranks(real: str) -> None:
    """nbox emulate of dp=8 x tp=2 on 2 real ranks: a whole tp group real (0,1), or one member of each of two tp
    groups, their tp partners emulated (0,2). The script builds its mesh from the world of 16 it sees."""
    from nbox_record.examples import tp_dp_mlp as ex

    proc = nbox("emulate", "--world-size", 16, "--real-ranks", real, "--example", "tp_dp_mlp", "--warmup", 1,
                "--iterations", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["world_size_seen"] == 16
    act, bucket = expected_bytes()
    rows = {(r["collective"], r["bytes"]): r["count"] for r in doc["collectives"]}
    assert rows == {("all_reduce", act): 2 * ex.BLOCKS * 2, ("all_reduce", bucket): 2}
