"""The clean iterations' segments between collectives: the recorder's sampler (nbox_record.capture.segments), the
clock that cuts them (nbox_record.capture.clock), and their place in the manifest (nbox_trace.bundle.manifest). The
2-rank recording that carries them is checked in tests/test_record_bootstrap.py (the DDP examples)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from nbox_record.capture.clock import IterationClock
from nbox_trace.bundle.manifest import (
    SEGMENTS_KEY,
    BundleError,
    Manifest,
    read_manifest,
    thread_cpu_figures,
    write_bundle,
)
from nbox_trace.threadtime import ThreadTimes


def tt(cpu_us: float, queue_us: float = 0.0) -> ThreadTimes:
    return ThreadTimes(int(cpu_us * 1000), int(queue_us * 1000))


def test_the_clock_cuts_each_timed_iteration_at_its_sampled_collectives() -> None:
    clock = IterationClock(warmup=1, timed=2)
    clock.take(1, 0.0, tt(0.0), [tt(-5.0)])  # the start boundary: samples before it belong to no timed iteration
    clock.take(2, 1.0, tt(100.0, 10.0), [tt(30.0, 1.0), tt(70.0, 4.0)])
    clock.take(3, 2.0, tt(150.0, 10.0), None)  # not sampled: no segments for this iteration
    assert clock.segments_us == [[(30.0, 1.0), (40.0, 3.0), (30.0, 6.0)]]
    assert clock.split_us == [(100.0, 10.0), (50.0, 0.0)]
    other = IterationClock(warmup=1, timed=1)
    other.take(1, 0.0, tt(0.0), [])
    other.take(2, 1.0, tt(20.0), [None])  # a sample that could not be read: the iteration has none
    assert other.segments_us == [] and other.split_us == [(20.0, 0.0)]


def test_thread_cpu_figures_carry_the_segments_only_where_every_clean_iteration_has_them() -> None:
    figs = thread_cpu_figures({
        0: {"iteration_cpu_us": [100.0, 90.0], "capture_cpu_us": [200.0],
            "iteration_segments_us": [[[60.0, 1.0], [40.0, 0.0]], [[50.0, 0.0], [40.0, 2.0]]]},
        1: {"iteration_cpu_us": [100.0, 90.0], "capture_cpu_us": [200.0], "iteration_segments_us": [[[100.0, 0.0]]]},
        2: {"iteration_cpu_us": [100.0], "capture_cpu_us": [200.0]}})
    assert figs["0"][SEGMENTS_KEY] == [[[60.0, 1.0], [40.0, 0.0]], [[50.0, 0.0], [40.0, 2.0]]]
    assert SEGMENTS_KEY not in figs["1"] and SEGMENTS_KEY not in figs["2"]


def manifest(observed: dict[str, Any]) -> Manifest:
    return Manifest(producer={"nbox": "test"}, hardware={}, job={"world_size": 1, "ranks_recorded": [0]},
                    observed=observed, capture={})


def test_the_segments_round_trip_through_a_bundle(tmp_path: Path) -> None:
    segments = [[[60.5, 1.0], [40.0, 0.0]], [[50.0, 0.0], [40.0, 2.0]]]
    observed = {"thread_cpu_us": {"0": {"clean": [100.5, 90.0], "captured": [200.0], SEGMENTS_KEY: segments}}}
    out = write_bundle(tmp_path / "b", manifest(observed), {"trace/trace.0.et": b"x"})
    assert read_manifest(out).observed["thread_cpu_us"]["0"][SEGMENTS_KEY] == segments
    old = write_bundle(tmp_path / "old", manifest({"thread_cpu_us": {"0": {"clean": [1.0], "captured": [2.0]}}}),
                       {"trace/trace.0.et": b"x"})
    assert SEGMENTS_KEY not in read_manifest(old).observed["thread_cpu_us"]["0"]  # an old bundle still loads


@pytest.mark.parametrize(("bad", "said"), [
    ("not a list", "must be a list of at most"),
    ([[[1.0, 0.0]]] * 10_001, "must be a list of at most 10000 iterations"),
    ([[]], "[0] must be a list of 1 to"),
    ([[[1.0, 0.0]], [[1.0, -1.0]]], "[1][0] must be [cpu_us, run_queue_us]"),
    ([[[1.0, 0.0], [float("nan"), 0.0]]], "[0][1] must be [cpu_us, run_queue_us]"),
    ([[[1.0, 0.0, 3.0]]], "[0][0] must be"),
    ([[[True, 0.0]]], "[0][0] must be"),
    ([[["1", 0.0]]], "[0][0] must be"),
])
def test_a_malformed_segments_list_refuses_the_bundle_naming_the_key(tmp_path: Path, bad: object, said: str) -> None:
    out = write_bundle(tmp_path / "b", manifest({"thread_cpu_us": {"0": {"clean": [1.0], "captured": [2.0]}}}),
                       {"trace/trace.0.et": b"x"})
    data = json.loads((out / "manifest.json").read_text())
    data["observed"]["thread_cpu_us"]["0"][SEGMENTS_KEY] = bad
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError) as err:
        read_manifest(out)
    message = str(err.value)
    assert "observed.thread_cpu_us['0'].clean_segments" in message and said in message and "\n" not in message


def test_the_sampler_samples_the_training_threads_collectives_only_and_stops_clean(tmp_path: Path) -> None:
    """In-process, a world of one (gloo): no rank is launched."""
    import torch
    import torch.distributed as dist

    from nbox_record.capture.commlog import CollectiveLogger
    from nbox_record.capture.segments import CollectiveSampler

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        sampler = CollectiveSampler()
        sampler.start()
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        with torch.inference_mode():
            dist.all_reduce(torch.ones(2))
        other = threading.Thread(target=lambda: dist.all_reduce(torch.ones(2)))
        other.start()
        other.join()
        marks = sampler.take()
        assert len(marks) == 3 and all(m is not None for m in marks)
        assert [m.on_cpu_ns for m in marks if m is not None] == sorted(m.on_cpu_ns for m in marks if m is not None)
        assert sampler.take() == []
        sampler.stop()
        dist.all_reduce(t)
        assert sampler.take() == [] and t.tolist() == [1.0] * 4
        logger = CollectiveLogger()  # the capture's kernels can be registered once the sampler's are gone
        logger.start()
        dist.all_reduce(t)
        assert len(logger.stop()) == 1
    finally:
        dist.destroy_process_group()
