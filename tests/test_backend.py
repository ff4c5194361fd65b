"""The `nbox` torch.distributed backend: an ordinary script sees world size W while N real gloo ranks run it.

Integration tests launch tests/nbox_backend_worker.py with nbox's launcher (N = 1 or 2 real processes,
loopback, timeouts) and check what the script observed against the mirror rule (emulator_core/backend/mirror.py),
worked out by hand for W = 8: with real ranks [0, 1] every real rank stands for 4 members.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from emulator_core.backend.process_group import EmulationConfig, EmulationConfigError
from emulator_core.scenario.model import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "nbox_backend_worker.py"


def launch(nproc: int, modes: str, world_size: int, timeout_s: float = 240, **env: str) -> list[dict[str, Any]]:
    """Run the worker on ``nproc`` real ranks with nbox's one launcher (torchrun's environment, without its agent's
    2-3 s import of torch per launch); one result dict per real rank, ordered by global rank."""
    from nbox_trace.launch.launcher import Launch, run

    with tempfile.TemporaryDirectory(prefix="nbox-backend-test-") as results_dir:
        logs = Path(results_dir) / "logs"
        res = run(Launch(str(WORKER), logs, args=(modes,), nproc_per_node=nproc, timeout_s=timeout_s,
                         env={"OMP_NUM_THREADS": "1", "NBOX_WORLD_SIZE": str(world_size),
                              "NBOX_TEST_RESULTS": results_dir, **env}))
        results = [json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("rank*.json"))]
        why = "\n".join(f"--- {f.relative_to(logs)}\n{f.read_text()[-3000:]}" for f in sorted(logs.rglob("*.log")))
    assert res.ok and len(results) == nproc, f"{res.returncode} {res.timed_out}\n{res.stderr[-2000:]}\n{why}"
    return sorted(results, key=lambda r: int(r["rank"]))


# ----------------------------------------------------------------------------------------- unit tests

def test_the_backend_is_registered_through_the_torch_backends_entry_point() -> None:
    eps = [ep for ep in entry_points(group="torch.backends") if ep.name == "nbox"]
    assert [ep.value for ep in eps] == ["emulator_core._autoload:register"]
    import torch.distributed as dist

    assert "nbox" in dist.Backend.backend_list  # registered by `import torch` itself


def test_config_from_env_defaults_and_validation() -> None:
    cfg = EmulationConfig.from_env(2, {"NBOX_WORLD_SIZE": "64"})
    assert cfg.world_size == 64 and cfg.real_ranks == (0, 1) and cfg.scenario.world_size == 64
    assert EmulationConfig.from_env(2, {}).world_size == 2
    cfg = EmulationConfig.from_env(2, {"NBOX_WORLD_SIZE": "16", "NBOX_REAL_RANKS": "3,9", "NBOX_SPIN_US": "50",
                                       "NBOX_SCENARIO_SET": "topology.dims.0.latency_us=7\n"})
    assert cfg.real_ranks == (3, 9) and cfg.spin_ns == 50_000
    assert cfg.move_data and not EmulationConfig.from_env(2, {"NBOX_MOVE_DATA": "0"}).move_data
    assert cfg.scenario.topology.dims[0].latency_us == 7
    bad = [({"NBOX_WORLD_SIZE": "lots"}, "NBOX_WORLD_SIZE: not an integer"),
           ({"NBOX_WORLD_SIZE": "8", "NBOX_REAL_RANKS": "0"}, "NBOX_REAL_RANKS: lists 1 ranks but the job has 2"),
           ({"NBOX_WORLD_SIZE": "8", "NBOX_REAL_RANKS": "0,8"}, "distinct global ranks in 0..7"),
           ({"NBOX_WORLD_SIZE": "8", "NBOX_REAL_RANKS": "1,1"}, "distinct"),
           ({"NBOX_WORLD_SIZE": "8", "NBOX_REAL_RANKS": "a,b"}, "not a comma-separated list"),
           ({"NBOX_WORLD_SIZE": "0"}, "must be an integer >= 1"),
           ({"NBOX_MOVE_DATA": "no"}, "NBOX_MOVE_DATA: must be 0 or 1, got 'no'")]
    for env, message in bad:
        with pytest.raises(EmulationConfigError, match=message):
            EmulationConfig.from_env(2, env)
    with pytest.raises(ScenarioError, match="latency_us"):
        EmulationConfig.from_env(2, {"NBOX_SCENARIO_SET": "topology.dims.0.latency_us=-1"})


def test_sleep_until_never_returns_early_and_a_future_completes_at_its_deadline() -> None:
    from torch.futures import Future

    from emulator_core.backend.delay import TIMER, sleep_until

    for delay_ns in (0, 30_000, 400_000, 3_000_000):
        deadline = time.perf_counter_ns() + delay_ns
        sleep_until(deadline)
        assert time.perf_counter_ns() >= deadline
    fut: Future[int] = Future()
    deadline = time.perf_counter_ns() + 2_000_000
    TIMER.complete_at(deadline, fut, 42)
    assert fut.wait() == 42 and time.perf_counter_ns() >= deadline


# ----------------------------------------------------------------------------------- integration tests

@pytest.fixture(scope="module")
def w8_n1() -> dict[str, Any]:
    return launch(1, "collectives,ddp,fsdp2", 8, NBOX_SCENARIO_SET="topology.dims.0.latency_us=5000")[0]


@pytest.fixture(scope="module")
def w8_n2() -> list[dict[str, Any]]:
    return launch(2, "collectives,ddp,fsdp2", 8, NBOX_SCENARIO_SET="topology.dims.0.latency_us=5000")


def _decreasing(losses: list[float]) -> bool:
    """Finite, and every step no worse than the one before, the last strictly better than the first."""
    return (all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
            and all(b <= a for a, b in itertools.pairwise(losses)))


@pytest.mark.integration
def test_one_real_rank_sees_a_world_of_eight_and_mirrors_itself(w8_n1: dict[str, Any]) -> None:
    r = w8_n1
    assert (r["world_size"], r["rank"], r["real_world_size"], r["backend"]) == (8, 0, 1, "nbox")
    assert r["all_reduce_sum"] == 8.0 and r["all_reduce_avg"] == 1.0 and r["all_reduce_max"] == 0.0
    assert r["all_gather_into_tensor"] == r["all_gather"] == r["funcol_all_gather"] == [0.0] * 8
    assert r["reduce_scatter_tensor"] == 0.0  # 8 x chunk 0 of arange(8)
    assert r["all_to_all_single"] == [0.0] * 8  # every source is rank 0's mirror sending its chunk 0
    assert r["broadcast_from_0"] == r["broadcast_from_3"] == 0.0
    assert r["all_gather_object"] == [0] * 8 and r["funcol_all_reduce"] == 8.0
    assert r["recv_from_emulated"] == [0.0] * 4
    assert (r["evens_size"], r["evens_all_reduce"], r["firsts_all_reduce"]) == (4, 4.0, 4.0)


@pytest.mark.integration
def test_two_real_ranks_exchange_real_data_and_each_stands_for_four(w8_n2: list[dict[str, Any]]) -> None:
    r0, r1 = w8_n2
    assert [r["world_size"] for r in w8_n2] == [8, 8] and [r["rank"] for r in w8_n2] == [0, 1]
    for r in w8_n2:
        assert r["all_reduce_sum"] == 4 * 1 + 4 * 2 and r["all_reduce_avg"] == 1.5 and r["all_reduce_max"] == 1.0
        assert r["all_gather_into_tensor"] == r["all_gather"] == r["funcol_all_gather"] == [0.0, 1.0] * 4
        assert r["broadcast_from_0"] == 0.0 and r["broadcast_from_3"] == 1.0  # emulated 3 mirrors rank 1
        assert r["all_gather_object"] == [0, 1] * 4 and r["funcol_all_reduce"] == 12.0
        assert r["firsts_all_reduce"] == 2 * 1 + 2 * 2  # group [0..3]: 2 real, 2 each
        assert r["recv_from_emulated"] == [0.0] * 4
    assert (r0["reduce_scatter_tensor"], r1["reduce_scatter_tensor"]) == (0.0, 12.0)
    assert r0["all_to_all_single"] == [0.0, 100.0] * 4 and r1["all_to_all_single"] == [1.0, 101.0] * 4
    assert r0["evens_all_reduce"] == 4.0 and "evens_all_reduce" not in r1  # rank 1 is not in [0, 2, 4, 6]


@pytest.mark.integration
def test_work_completes_at_the_modeled_time_and_real_ranks_agree_on_it(
        w8_n1: dict[str, Any], w8_n2: list[dict[str, Any]]) -> None:
    for r in (w8_n1, *w8_n2):
        t = r["timing"]
        assert t["collective"] == "all_reduce" and t["end_us"] - t["start_us"] > 10_000  # 5 ms latency per hop
        assert t["returned_us"] < t["end_us"] <= t["waited_us"]  # async: returns at once; wait() not early
    assert w8_n2[0]["timing"]["end_us"] == w8_n2[1]["timing"]["end_us"]  # same arrivals, same answer
    assert w8_n2[0]["answered"] == w8_n2[1]["answered"] > 20


@pytest.mark.integration
def test_ddp_and_fsdp2_train_at_world_size_eight(w8_n1: dict[str, Any], w8_n2: list[dict[str, Any]]) -> None:
    for r in (w8_n1, *w8_n2):
        assert _decreasing(r["ddp_losses"]) and _decreasing(r["fsdp2_losses"]), r
    # DDP's gradient average over 8 mirrors of one rank is that rank's gradient: the same run as alone
    assert w8_n1["ddp_losses"][0] == w8_n2[0]["ddp_losses"][0]


@pytest.mark.integration
def test_ddp_and_fsdp2_train_at_world_size_1024_on_two_real_ranks() -> None:
    for r in launch(2, "ddp,fsdp2", 1024):
        assert r["world_size"] == 1024 and _decreasing(r["ddp_losses"]) and _decreasing(r["fsdp2_losses"])


@pytest.mark.integration
def test_timing_only_moves_no_data_and_a_receive_is_answered_from_its_senders_issue() -> None:
    """``NBOX_MOVE_DATA=0`` (live replay): buffers stay as they were; a receive issued 0.3 s before its send starts
    at the send's issue (its time travelled in place of the data), not at its own."""
    r0, r1 = launch(2, "timing_only", 2, NBOX_MOVE_DATA="0")
    assert r0["timing_only_all_reduce"] == [1.0] * 4 and r1["timing_only_all_reduce"] == [2.0] * 4
    assert r0["recv_buffer"] == [0.0] * 3
    assert r0["recv_start_us"] == r1["send_issue_us"] > r0["recv_issue_us"]  # one host: one perf_counter clock
    # a burst of 5, rank 1 issuing 0.2 s late (each exchange started by the resolver, not the caller): the answers
    # pair the same calls (sizes in order) and start at the later arrival, rank 1's issue, not at rank 0's
    assert [b[0] for b in r0["burst"]] == [b[0] for b in r1["burst"]] == [4.0 * (4 + k) for k in range(5)]
    first0, first1 = r0["burst"][0], r1["burst"][0]
    assert first1[1] - first0[1] > 150_000  # rank 1 issued 0.2 s later
    assert first0[2] == pytest.approx(first1[1], abs=1.0) and first1[2] == pytest.approx(first1[1], abs=1.0)
    for b0, b1 in zip(r0["burst"], r1["burst"], strict=True):
        assert b0[2] == pytest.approx(b1[2], abs=1.0) and b0[2] >= b1[1] - 1.0
    moved = launch(2, "timing_only", 2)  # the default moves data: the same script gets the real values
    assert moved[0]["timing_only_all_reduce"] == [3.0] * 4 and moved[0]["recv_buffer"] == [7.0] * 3
    assert moved[0]["recv_start_us"] == moved[0]["recv_issue_us"]  # arrivals: its own issue only


@pytest.mark.integration
def test_a_bad_setting_fails_the_script_with_the_variable_named(tmp_path: Path) -> None:
    from nbox_trace.launch.launcher import Launch, run

    res = run(Launch(str(WORKER), tmp_path / "logs", args=("ddp",), timeout_s=120,
                     env={"OMP_NUM_THREADS": "1", "NBOX_WORLD_SIZE": "8", "NBOX_REAL_RANKS": "0,9"}))
    stderr = "".join(f.read_text() for f in (tmp_path / "logs").rglob("stderr.log"))
    assert not res.ok
    assert "NBOX_REAL_RANKS: lists 2 ranks but the job has 1 real processes" in stderr


#: loopback_cpu's all-reduce slowed 2x beside compute (its delay per call large enough for the cap to set the rate),
#: and a 2-rank all-reduce of 256 KiB priced at about 100 ms
BESIDE = "calibration.0.busy_slowdown=2\ncalibration.0.busy_delay_us=1000000\ntopology.dims.0.latency_us=50000"


@pytest.mark.integration
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_call_still_running_once_slowed_by_the_computing_thread_holds_the_next_one(nproc: int) -> None:
    """The live backend tells the fabric each real member's compute (its issuing thread's time on or waiting for
    a CPU between its calls, exchanged with the arrivals): a first all-reduce beside a thread that computes for
    1.25x its price still runs, slowed 2x, when the second is issued, and the second starts at its slowed end; beside
    a thread that sleeps instead, the second starts at its own issue (one real rank, and two exchanging)."""
    for how, held in (("spin", True), ("sleep", False)):
        for r in launch(nproc, how, 2, NBOX_SCENARIO_SET=BESIDE):
            b = r["beside_compute"]
            issue, start = b["second_issue_us"], b["second_start_us"]
            first_start, first_end = b["first_start_us"], b["first_end_us"]
            if held:  # T = end + compute since the first's start x (1 - 1/2), the compute up to the issue
                slowed = first_end + (issue - first_start) * 0.5
                assert start > issue + 10_000.0, b
                assert start - issue == pytest.approx(slowed - issue, abs=15_000.0), b  # about 37 ms after it
            else:
                assert start == pytest.approx(issue, abs=15_000.0), b
