"""The host work a live replay does not re-run, padded back (nbox_replay.live.hostwork; issue 15)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from emulator_core.backend.clocksync import Clock
from nbox_replay.live.hostwork import HostPad, plan_pad
from nbox_replay.replay import ReplayConfig, ReplayConfigError, host_work_doc, run_replay

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "traces" / "ddp_mlp"


def test_the_pad_is_the_real_threads_cpu_time_less_the_replays_own_in_the_repetitions_before() -> None:
    # one repetition before, of 4 captured iterations: its figures as they are
    pad = plan_pad(10_000.0, [(24_000.0, 20_000.0)], 4)
    assert (pad.replay_us, pad.live_us, pad.pad_us) == (6_000.0, 5_000.0, 4_000.0)
    assert pad.factor == pytest.approx(1.8) and pad.why_not == ""
    # a replay that spends more than the real thread is not padded (a wait cannot be taken back)
    more = plan_pad(5_000.0, [(24_000.0, 20_000.0)], 4)
    assert more.pad_us == 0.0 and more.factor == 1.0 and more.why_not == ""


def test_match_credits_a_replay_busier_than_the_real_thread_up_to_its_operators() -> None:
    """--host-work match: the excess becomes a factor below 1 (the rank's clock falls behind by it); the credit
    is taken on the live operators and cannot exceed them; a replay less busy is padded as with pad."""
    more = plan_pad(5_000.0, [(24_000.0, 20_000.0)], 4, both_ways=True)  # 6 ms replayed, 5 of them operators
    assert more.pad_us == -1_000.0 and more.factor == pytest.approx(0.8) and more.why_not == ""
    floor = plan_pad(500.0, [(24_000.0, 20_000.0)], 4, both_ways=True)  # 5.5 ms over, 5 ms of operators
    assert floor.pad_us == -5_000.0 and floor.factor == 0.0
    less = plan_pad(10_000.0, [(24_000.0, 20_000.0)], 4, both_ways=True)
    assert less == plan_pad(10_000.0, [(24_000.0, 20_000.0)], 4)
    # the busy figure beside it: the same warm repetitions' median (the cold first left out)
    shown = plan_pad(5_000.0, [(9.0, 1.0), (6_000.0, 5_000.0), (6_200.0, 5_000.0)], 1, True, [9.0, 5_800.0, 6_000.0])
    assert shown.replay_us == 6_100.0 and shown.busy_us == 5_900.0


def test_the_pad_follows_the_median_of_the_warm_repetitions_not_the_last_one() -> None:
    """A repetition that ran fast by chance does not raise the next one's pad (hostwork's docstring: the lag's
    one-sided bias); the cold first repetition is left out once there is another."""
    cold, warm = (30_000.0, 29_000.0), [(9_000.0, 8_000.0), (7_000.0, 6_000.0), (8_000.0, 7_000.0)]
    pad = plan_pad(10_000.0, [cold, *warm, (4_000.0, 3_000.0)], 1)  # the last one fast
    assert (pad.replay_us, pad.live_us) == (7_500.0, 6_500.0)  # median of the four warm ones
    assert pad.pad_us == 2_500.0 and pad.factor == pytest.approx(1.0 + 2_500.0 / 6_500.0)
    assert plan_pad(10_000.0, [cold, warm[0]], 1).replay_us == 9_000.0  # the cold one out
    assert plan_pad(50_000.0, [cold], 1).replay_us == 30_000.0  # alone (--warmup 1): it is all there is


@pytest.mark.parametrize(("clean", "history", "why"), [
    (None, [(1.0, 1.0)], "no clean CPU time"),
    (0.0, [(1.0, 1.0)], "no clean CPU time"),
    (5_000.0, [], "--warmup 0"),
    (5_000.0, [(1_000.0, 0.0)], "no operator ran live"),
])
def test_no_pad_says_why(clean: float | None, history: list[tuple[float, float]], why: str) -> None:
    pad = plan_pad(clean, history, 1)
    assert pad.factor == 1.0 and pad.pad_us == 0.0 and why in pad.why_not


def test_the_worker_figure_round_trips_and_a_bad_one_is_none() -> None:
    pad = plan_pad(10_000.0, [(6_000.0, 5_000.0)], 1)
    assert HostPad.from_dict(json.loads(json.dumps(pad.to_dict()))) == pad
    caught = HostPad(5_000.0, 6_000.0, 5_000.0, -1_000.0, 0.8, "", 250.0)
    assert HostPad.from_dict(json.loads(json.dumps(caught.to_dict()))) == caught
    assert HostPad.from_dict(None) is None and HostPad.from_dict({"clean_us": "x"}) is None


def test_the_report_line_names_each_rank_and_why_not() -> None:
    doc = host_work_doc({0: plan_pad(10_000.0, [(6_000.0, 5_000.0)], 1), 1: plan_pad(None, [], 1)}, "")
    assert ("rank 0 +4.00 ms per iteration (x1.80: the real thread 10.00 ms on a CPU or waiting for one, the "
            "replay's 6.00 ms)") in doc["line"]
    assert "rank 1 not padded (the bundle carries no clean CPU time" in doc["line"]
    assert doc["ranks"]["0"]["pad_us"] == 4_000.0
    credited = host_work_doc({0: plan_pad(5_000.0, [(6_000.0, 5_000.0)], 1, both_ways=True)}, "", None, "match")
    assert credited["line"].startswith("live operators padded for the host work the replay does not re-run, and "
                                       "credited for the replay's own beyond the real thread's "
                                       "(replay.host_work=match)")
    assert "rank 0 credited 1.00 ms per iteration (x0.80: the real thread 5.00 ms" in credited["line"]
    assert credited["mode"] == "match" and credited["ranks"]["0"]["pad_us"] == -1_000.0
    off = host_work_doc({}, "--host-work off")
    assert off["line"] == "live operators not padded for host work: --host-work off" and off["ranks"] == {}
    assert off["mode"] == "pad" and host_work_doc({}, "--host-work off", None, "off")["mode"] == "off"


def test_host_work_is_refused_where_it_cannot_act() -> None:
    with pytest.raises(ReplayConfigError, match=r"replay.host_work='on': must be one of pad, match, off"):
        ReplayConfig(str(MLP), host_work="on")
    with pytest.raises(ReplayConfigError, match=r"replay.host_work=pad: .*--clock virtual"):
        ReplayConfig(str(MLP), clock="virtual", overrides=("replay.host_work=pad",))
    with pytest.raises(ReplayConfigError, match=r"replay.host_work=off: .*compute is recorded"):
        run_replay(ReplayConfig(str(MLP), clock="real", compute="recorded", host_work="off", iterations=1))


def test_a_walks_waits_are_not_counted_as_its_busy_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A padding's, a fallback's or a collective's wait spins its last 200 us on the rank's thread; that CPU time
    is gathered in Replayer.wait_cpu_ns, which the worker takes off its busy figure (a wait is not host work; left
    in, it under-planned the next repetition's pad). All of the wait's host time goes to wait_host_ns."""
    import time
    import types

    from nbox_replay.live import _worker as _live_worker
    from nbox_replay.live._worker import Replayer

    walk = Replayer.__new__(Replayer)  # only the wait accounting: no graph, no process group
    walk.wait_cpu_ns = walk.wait_host_ns = 0
    walk.clock, walk.catch_up = Clock(), False

    # A fake clock makes the accounting exact: each wait starts 30 us after its deadline was set (the call's own
    # cost; a loaded machine makes it anything) and spins its last 200 us.
    now = {"host": 10_000_000, "cpu": 0}
    fake_time = types.SimpleNamespace(
        perf_counter_ns=lambda: now["host"], thread_time_ns=lambda: now["cpu"], sleep=time.sleep
    )

    def fake_sleep_until(deadline_ns: int) -> None:
        now["cpu"] += 200_000
        now["host"] = max(now["host"], deadline_ns)

    monkeypatch.setattr(_live_worker, "time", fake_time)
    monkeypatch.setattr(_live_worker, "sleep_until", fake_sleep_until)
    for _ in range(5):
        deadline = now["host"] + 1_000_000
        now["host"] += 30_000
        walk._idle_until(deadline)
    assert walk.wait_cpu_ns == 5 * 200_000
    assert walk.wait_host_ns == 5 * 970_000
    monkeypatch.undo()

    # The real clock: a wait's CPU time is never more than its host time, and the sleeping part is not CPU time.
    walk.wait_cpu_ns = walk.wait_host_ns = 0
    for _ in range(5):
        walk._idle_until(time.perf_counter_ns() + 1_000_000)
    assert 0 < walk.wait_cpu_ns <= walk.wait_host_ns

    class Work:
        def wait(self, timeout: object = None) -> bool:
            time.sleep(0.001)
            return True

    walk._wait = lambda work, node: work.wait()  # type: ignore[method-assign, assignment]
    before = walk.wait_cpu_ns
    took_ns = walk._wait_for({3: Work(), 4: Work()}, [3, 4, 9])
    assert took_ns >= 2_000_000 and walk.wait_cpu_ns >= before


def test_match_credits_a_wait_that_ends_past_the_answered_end() -> None:
    """--host-work match: the answer came late in host time (a peer behind by its own credit, the exchange's round
    trip), so the rank's timeline is credited the overshoot and the wait ends where the model put it; a wait that
    ends on time is not credited, and without match nothing is."""
    import time

    from emulator_core.backend.delay import NboxWork
    from nbox_replay.live._worker import Replayer

    walk = Replayer.__new__(Replayer)
    walk.wait_cpu_ns = walk.caught_up_ns = walk.wait_host_ns = 0
    walk.clock, walk.catch_up = Clock(), True
    walk._wait = lambda work, node: work.wait()  # type: ignore[method-assign, assignment]

    def work(in_ms: float) -> NboxWork:  # answered to end in_ms from now on the rank's timeline
        end = walk.clock.to_reference_ns(time.perf_counter_ns()) + int(in_ms * 1e6)
        return NboxWork(lambda: "all_reduce", [], 5.0, 200_000, end, walk.clock)

    class Late:  # its answer comes in 5 ms after the wait begins, for a call that ended before it
        deadline_ns = walk.clock.to_reference_ns(time.perf_counter_ns()) - 3_000_000

        def wait(self, timeout: object = None) -> bool:
            time.sleep(0.005)
            return True

    h0 = time.perf_counter_ns()
    took_ns = walk._wait_for({1: Late()}, [1])
    waited_ns = time.perf_counter_ns() - h0
    # credited the 5 ms the wait took (at most the host time around it), not the 3 ms before it began too: the
    # timeline does not run backward
    assert 5_000_000 <= walk.clock.lag_ns <= waited_ns and walk.caught_up_ns == walk.clock.lag_ns
    assert 0 <= took_ns < walk.clock.lag_ns // 2  # on the timeline the wait ended about where it began
    assert walk.wait_host_ns >= 5_000_000  # in host time it waited (not counted as time outside the waits)
    before = walk.clock.lag_ns
    walk._wait_for({2: work(20.0)}, [2])  # on time: slept to its end, only the spin's last microseconds over
    assert walk.clock.lag_ns - before < 10_000_000  # not the 20 ms it slept (a loaded machine may overshoot some)
    walk.catch_up, before = False, walk.clock.lag_ns
    walk._wait_for({3: Late()}, [3])
    assert walk.clock.lag_ns == before


def _with_clean_cpu(tmp: Path, clean_us: float) -> Path:
    out = tmp / "ddp_mlp"
    shutil.copytree(MLP, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["observed"]["thread_cpu_us"] = {str(r): {"clean": [clean_us], "captured": [clean_us]} for r in (0, 1)}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _replay_modes(bundle: Path, modes: tuple[str, ...]) -> dict[str, Any]:
    """The live replay's report under each --host-work mode, one after the other (real gloo ranks)."""
    return {mode: run_replay(ReplayConfig(str(bundle), clock="real", compute="live", iterations=1, warmup=2,
                                          timeout_s=120.0, host_work=mode)).to_dict() for mode in modes}


@pytest.mark.integration
def test_the_pad_moves_the_live_replay_to_the_real_threads_cpu_time(tmp_path: Path) -> None:
    """A bundle whose real training thread spent 200 ms of CPU per iteration (far more than ddp_mlp's operators):
    padded, each rank's compute per iteration grows toward it; with --host-work off it stays the
    operators' own few milliseconds."""
    docs = _replay_modes(_with_clean_cpu(tmp_path, 200_000.0), ("pad", "off"))
    padded, off = docs["pad"], docs["off"]
    assert off["host_work"]["ranks"] == {} and "replay.host_work=off" in off["host_work"]["line"]
    pads = padded["host_work"]["ranks"]
    assert set(pads) == {"0", "1"} and all(p["factor"] > 5.0 and p["why_not"] is None for p in pads.values())
    for p in pads.values():
        assert p["clean_us"] == 200_000.0 and p["pad_us"] == pytest.approx(200_000.0 - p["replay_us"])
        assert p["factor"] == pytest.approx(1.0 + p["pad_us"] / p["live_us"])
    # the worker stretches its operators to fill the pad (nearly 200 ms per iteration against ddp_mlp's few ms of
    # operators: a margin no loaded machine closes)
    assert padded["baseline"]["breakdown_us"]["compute"] > 3 * off["baseline"]["breakdown_us"]["compute"]
    assert padded["baseline"]["iteration_us"]["median"] > off["baseline"]["iteration_us"]["median"]


@pytest.mark.integration
def test_match_credits_the_replays_own_excess_on_the_ranks_clocks(tmp_path: Path) -> None:
    """A bundle whose real thread spent 1 us per iteration (far less than ddp_mlp's operators): with match every
    rank is credited all of its live operators' time (factor 0), so the measured compute per iteration falls to
    the walk's own, where pad cannot take the excess back; both ranks' collectives still complete (their deadlines
    follow the credited clocks)."""
    docs = _replay_modes(_with_clean_cpu(tmp_path, 1.0), ("pad", "match"))
    pad, match = docs["pad"], docs["match"]
    assert all(p["factor"] == 1.0 and p["pad_us"] == 0.0 for p in pad["host_work"]["ranks"].values())
    credits = match["host_work"]["ranks"]
    assert set(credits) == {"0", "1"} and match["host_work"]["mode"] == "match"
    assert all(p["factor"] == 0.0 and p["pad_us"] == -p["live_us"] for p in credits.values())
    assert "credited" in match["host_work"]["line"] and "its waits caught up" in match["host_work"]["line"]
    assert all(p["caught_up_us"] >= 0.0 for p in credits.values())
    # the operators' time is credited: what the rank's timeline counts as compute is the walk's share alone
    assert match["baseline"]["breakdown_us"]["compute"] < 0.5 * pad["baseline"]["breakdown_us"]["compute"]
    # (the iteration's wall time is not compared: on a loaded machine the exchange of arrival times between the
    # ranks, in host time, can outweigh the credited operators; a test does not assert a timing)


def test_the_target_is_the_real_threads_time_on_and_waiting_for_a_cpu() -> None:
    """The recorder's run-queue figure travels in the manifest (clean_run_queue) and is added to the CPU time;
    a bundle without it pads to the CPU time alone; off and --warmup 0 say why no pad; CUDA pads, match is refused
    there."""
    from types import SimpleNamespace

    from nbox_replay.replay import _host_cpu
    from nbox_trace.bundle.manifest import thread_cpu_figures

    figs = thread_cpu_figures({
        0: {"iteration_cpu_us": [20_000.0, 22_000.0, 21_000.0], "capture_cpu_us": [30_000.0],
            "iteration_run_queue_us": [3_000.0, 1_000.0, 2_000.0]},
        1: {"iteration_cpu_us": [10_000.0], "capture_cpu_us": [15_000.0]}})
    assert figs["0"]["clean_run_queue"] == [3_000.0, 1_000.0, 2_000.0] and figs["1"]["clean_run_queue"] == []
    source = SimpleNamespace(manifest=SimpleNamespace(observed={"thread_cpu_us": figs}))
    graphs = {0: None, 1: None}

    def host(device: str = "cpu", **kw: object) -> tuple[object, str]:
        return _host_cpu(ReplayConfig(str(MLP), **kw), source, graphs, "live", device)  # type: ignore[arg-type]

    assert host() == ({0: 23_000.0, 1: 10_000.0}, "")
    assert host(host_work="off") == (None, "replay.host_work=off")
    assert host("cuda") == host()  # on CUDA too: waits on the host before launches (nbox_replay.live.streams)
    with pytest.raises(ReplayConfigError, match=r"replay.host_work=match: .*on cuda the pad only lengthens"):
        host("cuda", host_work="match")
    assert host(warmup=0)[0] is None and "--warmup 0" in host(warmup=0)[1]
    bare = SimpleNamespace(manifest=None)
    got = _host_cpu(ReplayConfig(str(MLP)), bare, graphs, "live", "cpu")  # type: ignore[arg-type]
    assert got[0] is None and "observed.thread_cpu_us" in got[1]
