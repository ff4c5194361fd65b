"""The live replay's warm-up (nbox_replay.replay.warmup_repetitions): --warmup repetitions, or as many as
--warmup-s asks for at the recorded iteration time (default 1 s on CUDA, 0 on a CPU), the same on every rank."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from nbox_replay.inputs.graph import captured_iterations
from nbox_replay.inputs.source import open_source
from nbox_replay.live import run as live_module
from nbox_replay.replay import (
    CUDA_WARMUP_S,
    MAX_WARMUP_REPETITIONS,
    ReplayConfig,
    ReplayConfigError,
    _load,
    run_replay,
    warmup_repetitions,
)
from nbox_trace.bundle import OBSERVED_RULE, observed_iteration_us

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "traces" / "ddp_mlp"


def _per_repetition_us() -> float:
    source = open_source(BUNDLE)
    graphs = _load(source, None)
    captured = max(captured_iterations(g)[1] for g in graphs.values())
    assert source.manifest is not None
    observed = observed_iteration_us(source.manifest.observed)  # the shipped bundle predates the rule: remade
    assert observed is not None
    return float(observed["median"]) * captured


def _reps(device: str, said: list[str] | None = None, **kw: Any) -> int:
    config = ReplayConfig(str(BUNDLE), **kw)
    source = open_source(BUNDLE)
    return warmup_repetitions(config, source, _load(source, None), device, said.append if said is not None else None)


def test_on_cuda_the_warmup_lasts_a_second_at_the_recorded_iteration_time() -> None:
    said: list[str] = []
    assert _reps("cuda", said) == max(4, math.ceil(CUDA_WARMUP_S * 1e6 / _per_repetition_us()))
    assert len(said) == 1 and "--warmup-s" in said[0] and "cuda" in said[0]
    assert _reps("cpu") == 4  # a CPU replay: --warmup alone
    assert _reps("cuda", warmup_s=0.0) == 4  # asked for none


def test_warmup_s_acts_on_a_cpu_too_and_never_shortens_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbox_replay import replay as replay_module

    half = math.ceil(0.5e6 / _per_repetition_us())
    assert _reps("cpu", warmup_s=0.5) == max(4, half) > 4
    assert _reps("cpu", warmup=half + 50, warmup_s=0.5) == half + 50
    assert 5e6 / _per_repetition_us() > 100  # 5 s asks for more than a cap of 100 allows
    monkeypatch.setattr(replay_module, "MAX_WARMUP_REPETITIONS", 100)
    assert _reps("cpu", warmup_s=5.0) == 100


def test_a_bad_warmup_s_is_refused_naming_the_flag() -> None:
    for bad in (-1.0, 601.0):
        with pytest.raises(ReplayConfigError, match="--warmup-s"):
            ReplayConfig(str(BUNDLE), warmup_s=bad)
    with pytest.raises(ReplayConfigError, match="--warmup-s 1: warms operators that run live"):
        ReplayConfig(str(BUNDLE), clock="virtual", warmup_s=1.0)  # recorded compute: nothing to warm
    ReplayConfig(str(BUNDLE), clock="virtual", compute="live", warmup_s=1.0)  # the measuring worker: it acts
    with pytest.raises(ReplayConfigError, match="--warmup-s 30 leaves no time inside --timeout 30"):
        ReplayConfig(str(BUNDLE), warmup_s=30.0, timeout_s=30.0)


@pytest.mark.parametrize("times", ["x", {"median": "1"}, {"median": 1e-300}, {"median": float("nan")}, None])
def test_an_untrusted_recorded_median_falls_back_or_is_bounded(tmp_path: Path, times: Any) -> None:
    import json
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(BUNDLE, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["observed"]["iteration_time_us"] = times
    manifest["observed"]["rule"] = OBSERVED_RULE  # read as stored (else remade from the ranks' own times)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    source = open_source(copy)
    graphs = _load(source, None)
    said: list[str] = []
    reps = warmup_repetitions(ReplayConfig(str(copy)), source, graphs, "cuda", said.append)
    assert 4 < reps <= MAX_WARMUP_REPETITIONS
    assert "the recorded compute" in said[0]  # not believed: sized at the recorded compute instead


class _Stop(Exception):
    pass


def test_the_live_workers_get_the_warmup_it_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake(base: Any, what_if: Any, pairs: int, say: Any) -> Any:
        seen.extend([base, what_if])
        raise _Stop

    monkeypatch.setattr(live_module, "replay_paired", fake)
    with pytest.raises(_Stop):
        run_replay(ReplayConfig(str(BUNDLE), clock="real", compute="live", device="cpu", warmup_s=0.5))
    assert [c.warmup for c in seen] == [_reps("cpu", warmup_s=0.5)] * 2
