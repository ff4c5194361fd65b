"""Issue 13: "A GPU trace treated as CPU": an imported GPU bundle said "recorded on cpu", was compared with this
machine's ``loopback_cpu`` and replayed with live compute on the CPU, and ``bundle inspect`` showed an empty
hardware line. A bundle whose traces hold CUDA work is a CUDA bundle: ``nbox record convert`` fills the
manifest's hardware from the traces (device, GPU model and count from Kineto's ``deviceProperties``), ``bundle
inspect`` shows it, and ``nbox replay`` on a machine without CUDA uses the GPU baseline and recorded compute,
with a one-line notice.

Uses the real Megatron TP8 sample (Kineto: ``ncclDevKernel`` kernels, ``deviceProperties`` of 8 x
NVIDIA A100-SXM4-80GB), PARAM's 2-GPU ResNet host ET (no Kineto: the ET's ``cuda:1`` tensors and ``nccl:``
operators say it) and Chakra's CPU/gloo pipeline (host ET + Kineto, CPU only).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nbox_record.convert.importer import ConvertConfig, import_traces
from nbox_trace.bundle.manifest import read_manifest, write_bundle

ROOT = Path(__file__).resolve().parents[1]
A100 = {"device": "cuda", "gpu_name": "NVIDIA A100-SXM4-80GB", "gpu_count": 8}


def _nbox(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


@pytest.fixture(scope="module")
def megatron(samples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = samples / "pytorch_et" / "megatron_tp8_nccl"
    out = tmp_path_factory.mktemp("meg") / "megatron.bundle"
    pairs = tuple((m / f"megatron_et_{r}.json.gz", m / f"megatron_kineto_{r}.json.gz") for r in (0, 1))
    import_traces(ConvertConfig(pairs, out))
    return out


def test_convert_fills_the_hardware_from_kineto(megatron: Path) -> None:
    assert read_manifest(megatron).hardware == A100


def test_bundle_inspect_shows_the_hardware(megatron: Path, tmp_path: Path) -> None:
    """Issue 13: "`bundle inspect` shows an empty hardware line"."""
    r = _nbox("bundle", "inspect", str(megatron), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hardware: device cuda, gpu_count 8, gpu_name NVIDIA A100-SXM4-80GB" in r.stdout + r.stderr
    doc = json.loads(_nbox("bundle", "inspect", str(megatron), "--json", cwd=tmp_path).stdout)
    assert doc["hardware"] == A100


def test_replay_of_an_imported_gpu_bundle_on_this_cpu_machine(megatron: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13's must-show: CUDA, GPU baseline, recorded compute, a notice (it said "recorded on cpu",
    compared with loopback_cpu, live compute on the CPU)."""
    import nbox_replay.replay as replay

    monkeypatch.setattr(replay, "_cuda_available", lambda: False)  # this machine, as CI's: no CUDA
    rep = replay.run_replay(replay.ReplayConfig(str(megatron), clock="virtual", iterations=1))
    assert (rep.device, rep.compute, rep.baseline.scenario, rep.what_if.scenario) == (
        "cuda", "recorded", "dgx_h100_400g", "dgx_h100_400g")
    assert rep.notices == ["recorded on CUDA (8 x NVIDIA A100-SXM4-80GB), and this machine has no CUDA: recorded "
                           "compute (kernels not re-executed), baseline dgx_h100_400g"]
    # the default real clock: compute "auto" is decided before any rank starts (recorded, same notice)
    notices: list[str] = []
    source = replay.open_source(str(megatron))
    assert replay._cuda_compute(replay.ReplayConfig(str(megatron)), source, "auto", notices) == "recorded"
    assert len(notices) == 1 and "no CUDA" in notices[0]
    with pytest.raises(replay.ReplayConfigError, match=r"--compute live: .* has no CUDA to .* use --compute recorded"):
        replay._cuda_compute(replay.ReplayConfig(str(megatron), compute="live"), source, "live", [])
    monkeypatch.setattr(replay, "_cuda_available", lambda: True)  # CUDA here, but the user asked for the CPU
    notices = []
    assert replay._cuda_compute(replay.ReplayConfig(str(megatron), device="cpu"), source, "auto", notices) == \
        "recorded"
    assert "and --device cpu: recorded compute" in notices[0]
    assert replay._cuda_compute(replay.ReplayConfig(str(megatron)), source, "auto", []) == "auto"  # CUDA: live
    r = _nbox("replay", str(megatron), "--clock", "virtual", "--iterations", "1", cwd=tmp_path)
    out = r.stdout + r.stderr
    if not _has_cuda():
        assert r.returncode == 0 and "recorded on cuda" in out and "baseline (dgx_h100_400g, 8 ranks)" in out
        assert "notice: recorded on CUDA (8 x NVIDIA A100-SXM4-80GB), and this machine has no CUDA" in out


def _has_cuda() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


def test_a_host_et_alone_is_cuda_by_its_tensors(samples: Path, tmp_path: Path) -> None:
    """PARAM's 2-GPU ResNet host ET, no Kineto: tensors on ``cuda:1`` and ``nccl:`` operators."""
    host = tmp_path / "resnet_et_1.json.gz"
    shutil.copyfile(samples / "pytorch_et" / "param_resnet_2gpu_et_1.1.0.json.gz", host)
    out, _ = import_traces(ConvertConfig(((host, None),), tmp_path / "resnet.bundle"))
    assert read_manifest(out).hardware == {"device": "cuda"}  # no deviceProperties: no model or count
    import nbox_replay.replay as replay

    notices: list[str] = []
    config = replay.ReplayConfig(str(out), device="cpu")
    assert replay._cuda_compute(config, replay.open_source(str(out)), "auto", notices) == "recorded"
    assert notices == ["recorded on CUDA, and --device cpu: recorded compute (kernels not re-executed), baseline "
                       "dgx_h100_400g"]


def test_a_cpu_trace_stays_cpu(samples: Path, tmp_path: Path) -> None:
    g = samples / "cpu_gloo_official_pipeline"
    out, _ = import_traces(ConvertConfig(((g / "host.0.json", g / "device.0.json"),), tmp_path / "cpu.bundle"))
    assert read_manifest(out).hardware == {"device": "cpu"}


def test_a_bundle_imported_before_the_fix_is_read_off_its_traces(megatron: Path, tmp_path: Path) -> None:
    """Bundles imported with an empty hardware part: the replay looks at the traces' GPU nodes."""
    from nbox_replay.inputs.source import open_source

    old = tmp_path / "old.bundle"
    manifest = read_manifest(megatron)
    files: dict[str, Path | bytes] = {f.path: megatron / f.path for f in manifest.files}
    write_bundle(old, replace(manifest, hardware={}), files)
    assert open_source(str(old)).device == "cuda"
    assert open_source(str(ROOT / "traces" / "ddp_mlp")).device == "cpu"
