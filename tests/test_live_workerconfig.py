"""The live replay's workers get their settings as the same dataclass the parent wrote (issue 61), not a dict read by
string key: a round trip through the file keeps every field and its type."""

from __future__ import annotations

from pathlib import Path

from nbox_replay.live.workerconfig import MeasureConfig, WorkerConfig


def test_a_worker_config_reads_back_equal_with_its_types(tmp_path: Path) -> None:
    cfg = WorkerConfig(ranks=(0, 3), traces={0: "/a/trace.0.et", 3: "/a/trace.3.et"}, factors={0: 1.0, 3: 2.5},
                       groups={"0": (0, 1, 2, 3), "": (0, 3)}, recorded_world=4, world=64, compute="live",
                       device="cpu", warmup=2, iterations=3, timeout_s=90.0, result_dir=str(tmp_path),
                       serialize=True, profiler={"rule": "to_clean", "figures": {"0": [1.0, 2.0]}},
                       host_cpu_us={0: 1234.5, 3: 99.0}, host_credit=True)
    back = WorkerConfig.read(cfg.write(tmp_path / "config.json"))
    assert back == cfg
    assert isinstance(back.ranks, tuple) and all(isinstance(k, int) for k in back.traces)
    assert back.host_cpu_us is not None and back.host_cpu_us[3] == 99.0 and back.factors[3] == 2.5
    bare = WorkerConfig(ranks=(1,), traces={1: "t"}, factors={1: 1.0}, groups={}, recorded_world=2, world=2,
                        compute="recorded", device="cpu", warmup=0, iterations=1, timeout_s=1.0, result_dir="r")
    assert WorkerConfig.read(bare.write(tmp_path / "bare.json")) == bare  # the optional fields as None / False


def test_a_measure_config_reads_back_equal(tmp_path: Path) -> None:
    cfg = MeasureConfig(ranks=(0, 1), traces={0: "x.0.et", 1: "x.1.et"}, device="cpu", warmup=1, iterations=2,
                        result=str(tmp_path / "m.json"))
    assert MeasureConfig.read(cfg.write(tmp_path / "c.json")) == cfg
