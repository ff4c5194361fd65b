"""`nbox emulate` end to end on model-parallel scripts: an all-to-all embedding exchange and a 2-stage
send/recv pipeline (the unmodified scripts are in ``tests/emulate_scripts/``).

Each script rewrites ``OUT_DIR/rank<R>.json`` with what it observed before every ``optimizer.step()``
(nbox stops the ranks inside the last timed step). The tests check that against the emulator's documented
rules (:mod:`emulator_core.backend.mirror`): emulated member ``j`` mirrors real member ``j mod n`` (a real member
itself), an all_to_all chunk from an emulated source is what its mirror sends, a recv from an emulated peer
gives zeros. Each run launches torchrun, so all are ``integration`` and run 1 warm-up + 3 timed steps.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbox_record.launch.emulation import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "emulate_scripts"
WARMUP, ITERATIONS = 1, 3
STEPS = WARMUP + ITERATIONS  # optimizer steps each rank reaches (it is stopped inside the last one)

# tests/emulate_scripts/a2a_embedding.py
SHARD, DIM = 4, 8
# tests/emulate_scripts/pipeline_sendrecv.py
BATCH, HIDDEN = 4, 16


def n_tokens(src: int, dst: int) -> int:
    """What a2a_embedding.py's rank ``src`` asks owner ``dst`` for."""
    return 1 + (src + 2 * dst) % 3


def mirror_of(j: int, real: list[int]) -> int:
    """The global rank of the real rank that global rank ``j`` mirrors (default group)."""
    return j if j in real else real[j % len(real)]


def emulate_script(script: str, world: int, real: list[int], out: Path,
                   *extra: object) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Run ``nbox emulate --json`` on ``script``; returns the report and each real rank's observations."""
    args = ["emulate", "--json", "--warmup", WARMUP, "--iterations", ITERATIONS, "--timeout", 90,
            "--world-size", world, "--real-ranks", ",".join(map(str, real)), "--", SCRIPTS / script, out, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=150, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["schema"] == SCHEMA
    obs = {r: json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in real}
    return doc, obs


def check_report(doc: dict[str, Any], world: int, real: list[int], collectives: set[str]) -> list[dict[str, Any]]:
    """The report's common facts; returns its collective rows."""
    assert doc["world_size"] == world and doc["real_ranks"] == real
    assert doc["world_size_seen"] == world
    times = doc["iteration_time_us"]
    assert times["count"] == ITERATIONS and all(math.isfinite(t) and t > 0 for t in times["values"])
    assert sorted(doc["per_rank_iteration_us"]) == sorted(str(r) for r in real)
    rows: list[dict[str, Any]] = doc["collectives"]
    assert {r["collective"] for r in rows} >= collectives, rows
    assert all(r["count"] > 0 and r["modeled_us"] > 0 and r["bytes"] > 0 for r in rows), rows
    return rows


def check_common_obs(o: dict[str, Any], world: int, rank: int) -> None:
    assert o["world_size"] == world and o["rank"] == rank
    assert o["steps"] == STEPS and len(o["losses"]) == STEPS
    assert all(math.isfinite(x) for x in o["losses"]) and o["loss_finite"]


# ----------------------------------------------------------------------------------------- all-to-all embedding

def check_a2a(world: int, real: list[int], tmp_path: Path, *extra: object) -> None:
    doc, obs = emulate_script("a2a_embedding.py", world, real, tmp_path, *extra)
    rows = check_report(doc, world, real, {"all_to_all", "all_to_all_v", "all_reduce"})
    by_kind: dict[str, set[float]] = {}
    for r in rows:
        by_kind.setdefault(r["collective"], set()).add(r["bytes"])
    # the counts (int64) and the list-form tags (1 x 2 float32) are both 8 bytes per member
    assert by_kind["all_to_all"] == {8.0 * world}
    assert by_kind["all_reduce"] == {DIM * 4.0, 4.0}  # the dense layer's weight and bias gradients
    expected_v: set[float] = set()
    for rank, o in obs.items():
        check_common_obs(o, world, rank)
        in_splits = [n_tokens(rank, d) for d in range(world)]
        out_splits = [n_tokens(mirror_of(s, real), rank) for s in range(world)]
        assert o["in_splits"] == in_splits
        assert o["out_splits"] == out_splits  # an emulated source's count is its mirror's
        assert o["ids_in_shard"]  # every id a peer (or a mirror) asked this rank for is one of its rows
        assert o["asked_shape"] == [sum(out_splits)]
        assert o["got_shape"] == [sum(in_splits), DIM]
        assert o["grad_back_shape"] == [sum(out_splits), DIM]
        assert o["tag_shapes"] == [[1, 2]] * world
        assert o["tags"] == [[float(mirror_of(s, real)), float(rank)] for s in range(world)]
        # the three uneven exchanges, priced by their input bytes: ids, rows, row gradients
        expected_v |= {8.0 * sum(in_splits), 4.0 * DIM * sum(out_splits), 4.0 * DIM * sum(in_splits)}
    assert by_kind["all_to_all_v"] == expected_v, rows


@pytest.mark.integration
@pytest.mark.parametrize(("world", "real"), [(8, [0]), (64, [5])], ids=["w8-r0", "w64-r5"])
def test_a2a_embedding_one_real_rank(world: int, real: list[int], tmp_path: Path) -> None:
    check_a2a(world, real, tmp_path)


@pytest.mark.integration
def test_a2a_embedding_two_real_ranks_2d_rows(tmp_path: Path) -> None:
    check_a2a(8, [0, 1], tmp_path)


@pytest.mark.integration
@pytest.mark.parametrize(("world", "real"), [(8, [0, 1]), (64, [0, 9])], ids=["w8-r01", "w64-r09"])
def test_a2a_embedding_two_real_ranks_flat_rows(world: int, real: list[int], tmp_path: Path) -> None:
    check_a2a(world, real, tmp_path, "--flat-rows")


# ----------------------------------------------------------------------------------------- send/recv pipeline

@pytest.mark.integration
@pytest.mark.parametrize(("world", "real"), [
    (8, [0]),        # stage 0 alone: its peer is emulated
    (64, [1]),       # stage 1 alone
    (8, [0, 1]),     # one pair, both stages real
    (64, [0, 1]),
    (64, [0, 3]),    # a stage 0 and a stage 1 of two pairs, each with an emulated peer
], ids=["w8-r0", "w64-r1", "w8-r01", "w64-r01", "w64-r03"])
def test_pipeline_sendrecv(world: int, real: list[int], tmp_path: Path) -> None:
    doc, obs = emulate_script("pipeline_sendrecv.py", world, real, tmp_path)
    rows = check_report(doc, world, real, {"send_recv"})
    assert [(r["collective"], r["bytes"], r["count"]) for r in rows] == [
        ("send_recv", 4.0 * BATCH * HIDDEN, 2 * ITERATIONS)]  # activations out and gradients back (or in)
    for rank, o in obs.items():
        check_common_obs(o, world, rank)
        assert o["stage"] == rank % 2 and o["peer"] == rank ^ 1
        assert o["recv_shape"] == [BATCH, HIDDEN]
        if o["peer"] in real:  # real data from the real peer
            assert all(s > 0 for s in o["recv_abs_sum"]), o
        else:  # a recv from an emulated peer gives zeros
            assert o["recv_abs_sum"] == [0.0] * STEPS, o


# ----------------------------------------------------------------------------------------- DDP and FSDP2

@pytest.mark.integration
@pytest.mark.parametrize("mode,world,real", [
    ("ddp", 64, [0]),
    ("ddp", 64, [0, 33]),
    ("fsdp2", 8, [0]),
    ("fsdp2", 64, [5]),
    ("fsdp2", 64, [0, 1]),
], ids=["ddp-w64-r0", "ddp-w64-r0.33", "fsdp2-w8-r0", "fsdp2-w64-r5", "fsdp2-w64-r01"])
def test_ddp_and_fsdp2_see_the_world_and_gather_from_every_rank(mode: str, world: int, real: list[int],
                                                               tmp_path: Path) -> None:
    doc, obs = emulate_script("ddp_fsdp2.py", world, real, tmp_path, STEPS, mode)
    wanted = {"all_reduce", "all_gather"} if mode == "ddp" else {"all_gather", "reduce_scatter"}
    check_report(doc, world, real, wanted)
    for rank, o in obs.items():
        check_common_obs(o, world, rank)
        # all_gather_into_tensor: W slots, each from its rank (an emulated one: the real rank it mirrors)
        assert len(o["gathered"]) == 2 * world
        assert o["gathered"] == [float(mirror_of(j, real)) for j in range(world) for _ in range(2)]
        if mode == "fsdp2":  # Linear(16, 24).weight: dim 0 sharded over W ranks, gathered back whole
            assert o["full_shape"] == [24, 16] and o["unsharded_shape"] == [24, 16]
            assert o["shard_shape"] == [max(0, min(-(-24 // world), 24 - rank * -(-24 // world))), 16]
