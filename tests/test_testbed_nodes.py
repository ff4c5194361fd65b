"""Multi-node for real on the namespace testbed (issue 15): two nodes, one rank each, a tbf-shaped link.
``nbox record`` on each node through torchrun's rendezvous, then ``nbox bundle merge``, ``verify`` and a replay;
``nbox calibrate`` across the two nodes measures the shaped link."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from emulator_core.calibration._worker import BUSY_MIN_PAIRS
from emulator_core.scenario.files import load_scenario
from nbox_trace.bundle import manifest as B
from nbox_trace.testbed.namespaces import Testbed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.testbed
PORT = 29471


def nbox_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "nbox", *map(str, args)]


def on_both(tb: Testbed, tmp_path: Path, make: Callable[[int], list[str]],
            timeout_s: float = 300, env: Callable[[int], dict[str, str]] | None = None,
            ) -> list[subprocess.CompletedProcess[str]]:
    """Run ``make(k)`` (a command) on nodes 0 and 1 at once (``env(k)`` added to node k's environment); their exit
    codes, stdout and stderr."""
    procs, logs = [], []
    for k in range(2):
        out, err = tmp_path / f"node{k}.out", tmp_path / f"node{k}.err"
        logs.append((out, err))
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(tb.run_on(k, make(k), {"PYTHONPATH": str(ROOT), **(env(k) if env else {})}, cwd=ROOT,
                                   stdout=o, stderr=e))
    codes = tb.wait_all(procs, timeout_s)
    return [subprocess.CompletedProcess(p.args, c, o.read_text(), e.read_text())
            for p, c, (o, e) in zip(procs, codes, logs, strict=True)]


def run_nbox(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(nbox_cmd(*args), capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_two_node_record_merges_into_one_bundle_that_verifies_and_replays(tmp_path: Path) -> None:
    with Testbed(2, rate="1gbit") as tb:
        endpoint = f"{tb.node(0).addr}:{PORT}"
        done = on_both(tb, tmp_path, lambda k: nbox_cmd(
            "record", "-n", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint, "--warmup", 2,
            "--iterations", 5, "--timeout", 240, "-o", tmp_path / f"node{k}.bundle", "--json"))
    for k, res in enumerate(done):
        assert res.returncode == 0, f"node {k}: {res.stderr[-3000:]}"
    docs = [json.loads(res.stdout) for res in done]
    assert sorted(docs[0]["ranks"] + docs[1]["ranks"]) == [0, 1]
    manifests = [B.read_manifest(tmp_path / f"node{k}.bundle") for k in range(2)]
    assert manifests[0].job["job_id"] == manifests[1].job["job_id"] and manifests[0].job["job_id"]
    assert [m.job["nodes"][0]["local_addr"] for m in manifests] == [tb.node(0).addr, tb.node(1).addr]
    assert all(m.job["world_size"] == 2 and m.job["nnodes"] == "2" for m in manifests)

    merged = tmp_path / "run.bundle"
    res = run_nbox("bundle", "merge", tmp_path / "node1.bundle", tmp_path / "node0.bundle", "-o", merged, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ranks"] == [0, 1]
    verify = run_nbox("bundle", "verify", merged, "--json")
    assert verify.returncode == 0, verify.stdout
    assert json.loads(verify.stdout)["ok"] is True
    replay = run_nbox("replay", merged, "--clock", "virtual", "--json")
    assert replay.returncode == 0, replay.stderr
    doc = json.loads(replay.stdout)
    assert doc["ranks_replayed"] == [0, 1] and doc["baseline"]["iteration_us"]["median"] > 0

    # bundles of another run do not merge with these, and the message names the file
    again = tmp_path / "again"
    again.mkdir()
    with Testbed(2, rate="1gbit") as tb:
        endpoint = f"{tb.node(0).addr}:{PORT}"
        redo = on_both(tb, again, lambda k: nbox_cmd(
            "record", "-n", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint, "--warmup", 1,
            "--iterations", 2, "--timeout", 240, "-o", again / f"node{k}.bundle"))
    assert [r.returncode for r in redo] == [0, 0], [r.stderr[-2000:] for r in redo]
    mixed = run_nbox("bundle", "merge", tmp_path / "node0.bundle", again / "node1.bundle", "-o", tmp_path / "mixed")
    assert mixed.returncode == 3 and "node1.bundle: job.job_id is" in mixed.stderr, mixed.stderr
    assert not (tmp_path / "mixed").exists()


def test_two_node_calibrate_measures_the_shaped_link(tmp_path: Path) -> None:
    """The scenario written describes the fabric: its bandwidth is the tbf rate's (sanity bounds only: timing is
    not a unit test's business; bench figures are in docs/results.md)."""
    with Testbed(2, rate="200mbit") as tb:
        endpoint = f"{tb.node(0).addr}:{PORT}"
        done = on_both(tb, tmp_path, lambda k: nbox_cmd(
            "calibrate", "-n", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint, "--sizes",
            "256KiB..4MiB", "--collectives", "all_reduce,send_recv", "--budget", 0.1, "--timeout", 240,
            "-o", tmp_path / f"node{k}.toml", "--json"))
    for k, res in enumerate(done):
        assert res.returncode == 0, f"node {k}: {res.stderr[-3000:]}"
    docs = [json.loads(res.stdout) for res in done]
    assert [d["world_size"] for d in docs] == [2, 2] and docs[0]["fits"] == docs[1]["fits"]  # one measurement
    scenario = load_scenario(tmp_path / "node0.toml")
    dim = scenario.topology.dims[0]
    assert scenario.world_size == 2 and dim.name == "network"
    # the 200 Mb/s link, not loopback's (several Gb/s): fits of 0.19 and 0.23 seen, as tbf's burst lets the
    # smaller sizes through above the rate (a CI run failed a bound of 0.22)
    assert 0.1 < dim.bandwidth_gbps < 0.3, dim.bandwidth_gbps
    assert scenario.calibrated("send_recv", "network") is not None
    assert "2 ranks on 2 nodes (1 per node)" in (tmp_path / "node1.toml").read_text()
    # across nodes each collective is timed beside compute by default (its busy_slowdown; no figure asserted)
    busy = docs[0]["beside_compute"]
    assert [b["collective"] for b in busy] == ["all_reduce"] and busy[0]["pairs"] >= BUSY_MIN_PAIRS, busy
    assert busy[0]["busy_slowdown"] == scenario.calibrated("all_reduce", "network").busy_slowdown  # type: ignore[union-attr]


def test_a_node_killed_mid_run_ends_the_job_with_an_error_naming_it_and_its_rank(tmp_path: Path) -> None:
    """Every process of node 1 is killed (the node dies) once both ranks train: node 0's nbox record ends at once
    (not at its deadline), exit 1, naming node 1 and its rank, and leaves no bundle."""
    from nbox_trace.testbed.namespaces import _kill_inside

    with Testbed(2, rate="1gbit") as tb:
        endpoint = f"{tb.node(0).addr}:{PORT}"
        procs = []
        for k in range(2):
            cmd = nbox_cmd("record", "-n", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint,
                           "--iterations", 5000, "--timeout", 240, "-o", tmp_path / f"node{k}.bundle")
            with open(tmp_path / f"node{k}.err", "w") as e:
                procs.append(tb.run_on(k, cmd, {"PYTHONPATH": str(ROOT)}, cwd=ROOT, stderr=e))
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".node0.bundle.raw-*/rank*/peers.json")):  # both ranks are in the warm-up
            assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "node0.err").read_text()
            time.sleep(0.2)
        killed = time.monotonic()
        _kill_inside(tb.node(1).netns)
        assert tb.wait_all(procs[:1], 120) == [1]
        took = time.monotonic() - killed
    err = (tmp_path / "node0.err").read_text().strip().splitlines()[-1]
    assert err.startswith(f"nbox: error: rank 0 on node 0 ({tb.node(0).addr}) failed because node 1 "
                          f"({tb.node(1).addr}, rank(s) [1]) went away first"), err
    assert took < 60 and not (tmp_path / "node0.bundle").exists()


def test_two_node_emulate_with_clocks_seconds_apart_gets_the_same_answers(tmp_path: Path) -> None:
    """``nbox emulate`` across two nodes (one real rank each, W = 8) whose clocks read 3.7 s and -1.2 s off (the
    test-only NBOX_TEST_CLOCK_OFFSET_S): each node reports the whole job, the same numbers on both, the offset
    between the nodes is estimated (within its bound), and the answers match a run with true clocks: the same
    modeled collectives, and an iteration time of the same order (an unsynchronized 4.9 s would stall every
    collective into the call timeout)."""
    def emulate_both(where: Path, skews: tuple[str, str] | None) -> list[dict[str, object]]:
        where.mkdir()
        with Testbed(2, rate="1gbit") as tb:
            endpoint = f"{tb.node(0).addr}:{PORT}"
            done = on_both(tb, where, lambda k: nbox_cmd(
                "emulate", "--world-size", 8, "-n", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint,
                "--warmup", 2, "--iterations", 5, "--timeout", 200, "--call-timeout", 30, "--json"),
                env=(lambda k: {"NBOX_TEST_CLOCK_OFFSET_S": skews[k]}) if skews else None)
        for k, res in enumerate(done):
            assert res.returncode == 0, f"node {k}: {res.stderr[-3000:]}"
        return [json.loads(res.stdout) for res in done]

    skewed = emulate_both(tmp_path / "skewed", ("-1.2", "3.7"))
    true = emulate_both(tmp_path / "true", None)
    for docs in (skewed, true):
        assert docs[0]["iteration_time_us"] == docs[1]["iteration_time_us"]  # each node reports the whole job
        assert sorted(docs[0]["per_rank_iteration_us"]) == ["0", "1"] and docs[0]["world_size_seen"] == 8
    sync = skewed[0]["clock_sync"]
    assert sync == skewed[1]["clock_sync"]
    assert abs(sync["1"]["offset_us"] + 4.9e6) <= sync["1"]["bound_us"] + 1000, sync  # node 1 reads 4.9 s ahead
    assert abs(true[0]["clock_sync"]["1"]["offset_us"]) <= true[0]["clock_sync"]["1"]["bound_us"] + 1000

    def rows(doc: dict[str, object]) -> list[tuple[object, ...]]:
        return sorted((r["collective"], r["bytes"], r["count"]) for r in doc["collectives"])  # type: ignore[attr-defined]
    assert rows(skewed[0]) == rows(true[0])
    medians = [d[0]["iteration_time_us"]["median"] for d in (skewed, true)]  # type: ignore[index]
    assert medians[0] < 3 * medians[1] and medians[1] < 3 * medians[0], medians


def test_two_node_live_replay_with_offset_clocks_reports_the_whole_job_on_each_node(tmp_path: Path) -> None:
    """``nbox replay --clock real`` across two nodes: each node starts one of the two replayed ranks, node 1's
    clock reads 2.5 s ahead, launch k of the interleaved pairs rendezvouses at the endpoint's port + k; both nodes
    report the same measured iterations of the whole job (both ranks)."""
    with Testbed(2, rate="1gbit") as tb:
        endpoint = f"{tb.node(0).addr}:{PORT}"
        done = on_both(tb, tmp_path, lambda k: nbox_cmd(
            "replay", ROOT / "traces" / "ddp_mlp", "--clock", "real", "--compute", "recorded", "--iterations", 1,
            "--warmup", 1, "--nnodes", 2, "--node-rank", k, "--rdzv-endpoint", endpoint, "--timeout", 200, "--json"),
            env=lambda k: {"NBOX_TEST_CLOCK_OFFSET_S": "2.5" if k else "0"})
    for k, res in enumerate(done):
        assert res.returncode == 0, f"node {k}: {res.stderr[-3000:]}"
    docs = [json.loads(res.stdout) for res in done]
    for side in ("baseline", "what_if"):
        assert docs[0][side]["iteration_us"] == docs[1][side]["iteration_us"], side
        assert 0 < docs[0][side]["iteration_us"]["median"] < 1e6  # not stalled by the 2.5 s offset
    assert docs[0]["ranks_replayed"] == [0, 1]
