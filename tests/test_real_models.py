"""The real-architecture examples (``nbox_record/examples/{bert,resnet152,t5,deeplight}.py``, docs/models.md).

Unit tests: the plain-torch models have the published parameter counts of the full architectures (built on the
meta device: no memory, no time), and the library's where it is installed; the one line a rank prints when the
library is missing. Integration tests, each model in a tiny configuration (two layers, small widths) on 2 gloo
ranks: one recording per model (module-scoped) is verified, its collectives checked against the model's own
parameters, replayed on the virtual clock and live; ``nbox emulate`` runs it at W = 4; BERT, T5 and ResNet-152
also under FSDP2 (``--fsdp``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nbox_record.examples import EXAMPLES, MODEL_EXAMPLES, bert, deeplight, resnet152, t5
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra import read_et
from nbox_trace.chakra.attrs import attr_map

ROOT = Path(__file__).resolve().parents[1]
WARMUP, ITERATIONS = 1, 2


@dataclass(frozen=True)
class Tiny:
    """A model's tiny configuration: the script's arguments and the same model built here."""

    args: tuple[str, ...]
    build: Callable[[], nn.Module]


TINY: dict[str, Tiny] = {
    "bert": Tiny(("--layers", "2", "--hidden", "64", "--heads", "2", "--ffn", "128", "--seq-len", "16"),
                 lambda: bert.build_model(2, 64, 2, 128)),
    "resnet152": Tiny(("--blocks", "1,1,1,1", "--width", "8", "--image-size", "32", "--classes", "10"),
                      lambda: resnet152.build_model((1, 1, 1, 1), 8, 10)),
    "t5": Tiny(("--layers", "2", "--d-model", "64", "--heads", "2", "--d-kv", "32", "--ffn", "128",
                "--src-len", "16", "--tgt-len", "8"), lambda: t5.build_model(2, 64, 2, 32, 128)),
    "deeplight": Tiny(("--vocab", "100", "--dim", "4", "--layers", "2", "--hidden", "16", "--batch", "64"),
                      lambda: deeplight.build_model(100, 4, (16, 16))),
}


def param_bytes(model: nn.Module) -> int:
    """float32 bytes of the model's parameters (a tied weight once, as DDP reduces it)."""
    return 4 * sum(p.numel() for p in model.parameters())


def meta_count(build: Callable[[], nn.Module]) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def have_transformers() -> bool:
    return bert.have_transformers() and t5.have_transformers()


# -------------------------------------------------------------------------------------------------- unit tests

def test_the_models_are_built_in_examples() -> None:
    from nbox_record.launch.launcher import EXAMPLES as LAUNCHABLE

    assert set(MODEL_EXAMPLES) <= set(LAUNCHABLE) and set(MODEL_EXAMPLES) <= set(EXAMPLES)
    assert all(EXAMPLES[m].is_file() for m in MODEL_EXAMPLES)


@pytest.mark.parametrize(("build", "published"), [
    (lambda: bert.build_model(plain=True), 109_514_298),        # bert-base-uncased, BertForMaskedLM
    (lambda: resnet152.build_model(plain=True), 60_192_808),    # torchvision resnet152
    (lambda: t5.build_model(plain=True), 222_903_552),          # t5-base, T5ForConditionalGeneration
], ids=["bert", "resnet152", "t5"])
def test_the_plain_models_have_the_published_parameter_counts(build: Callable[[], nn.Module], published: int) -> None:
    assert meta_count(build) == published


def test_deeplight_has_criteo_fields_and_a_field_pair_matrix() -> None:
    m = deeplight.build_model(100, 4, (16, 16))
    assert len(m.sparse_embeddings) == 26 and m.dense_embedding.shape == (13, 4)
    assert m.field_pair.shape == (39, 39) and m.dnn[0].in_features == 39 * 4
    dense, sparse, _ = deeplight.make_batch(8, 100, torch.Generator().manual_seed(0))
    assert m(dense, sparse).shape == (8,) and int(sparse.max()) < 100
    with torch.no_grad():  # the pairwise term reads only i < j: the lower triangle does not move the output
        before = m(dense, sparse)
        m.field_pair.copy_(torch.triu(m.field_pair, 1) + torch.tril(torch.randn(39, 39)))
        assert torch.equal(m(dense, sparse), before)
        m.field_pair[0, 1] += 1.0
        assert not torch.equal(m(dense, sparse), before)


@pytest.mark.skipif(not have_transformers(), reason="transformers is not installed (the optional extra "
                    "'.[models]'); the plain-torch BERT and T5 are checked against the published counts instead")
@pytest.mark.parametrize("name", ["bert", "t5"])
def test_the_plain_models_match_transformers(name: str) -> None:
    mod: Any = {"bert": bert, "t5": t5}[name]
    for args in ((), (2, 64, 2, 128) if name == "bert" else (2, 64, 2, 32, 128)):
        with torch.device("meta"):
            plain, lib = mod.build_model(*args, plain=True), mod.build_model(*args, plain=False)
        mine = {n: tuple(p.shape) for n, p in plain.named_parameters()}
        theirs = {n: tuple(p.shape) for n, p in lib.named_parameters()}
        assert mine == theirs  # the same modules, names, shapes and weight tying
        assert abs(sum(p.numel() for p in plain.parameters()) / sum(p.numel() for p in lib.parameters()) - 1) < 0.01


@pytest.mark.skipif(not resnet152.have_torchvision(), reason="torchvision is not installed (its PyPI wheels pin "
                    "their own torch); the plain-torch ResNet-152 is checked against the published count instead")
def test_the_plain_resnet_matches_torchvision() -> None:
    with torch.device("meta"):
        plain, lib = resnet152.build_model(plain=True), resnet152.build_model(plain=False)
    assert {n: tuple(p.shape) for n, p in plain.named_parameters()} == \
        {n: tuple(p.shape) for n, p in lib.named_parameters()}


def test_an_example_takes_its_own_arguments_after_the_double_dash() -> None:
    from nbox.cli.record import _script_and_args

    assert _script_and_args(Path("--layers"), ["2"]) == (None, ("--layers", "2"))
    assert _script_and_args(Path("train.py"), ["--lr", "1"]) == (Path("train.py"), ("--lr", "1"))
    assert _script_and_args(None, []) == (None, ())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_rank(script: str, args: tuple[str, ...], hide: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """One gloo rank of ``script`` for one step; ``hide``: a module made unimportable (a stub that raises)."""
    path = os.environ.get("PYTHONPATH", "")
    if hide:
        (tmp_path / f"{hide}.py").write_text("raise ImportError('hidden by the test')\n", encoding="utf-8")
        path = f"{tmp_path}{os.pathsep}{path}"
    env = {**os.environ, "PYTHONPATH": path, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1", "NBOX_BACKEND": "gloo"}
    return subprocess.run([sys.executable, str(EXAMPLES[script]), "--steps", "1", *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)


@pytest.mark.integration
def test_without_the_library_a_rank_says_which_model_runs_in_one_line(tmp_path: Path) -> None:
    done = _one_rank("bert", TINY["bert"].args, "transformers", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("bert:")]
    assert len(lines) == 1 and "plain-torch" in lines[0] and "pip install" in lines[0], done.stderr
    asked = _one_rank("bert", (*TINY["bert"].args, "--plain"), None, tmp_path)  # asked for: no notice
    assert asked.returncode == 0 and "bert:" not in asked.stderr, asked.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- integration

def nbox(*args: object, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBOX_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def record(name: str, out: Path, *extra: str) -> Path:
    bundle = out / f"{name}.bundle"
    done = nbox("record", "--example", name, "-n", 2, "--warmup", WARMUP, "--iterations", ITERATIONS,
                "-o", bundle, "--json", "--", *TINY[name].args, *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["complete"] is True
    return bundle


def collective_bytes(bundle: Path) -> dict[int, dict[str, int]]:
    """Per rank, the captured iteration's bytes per collective name (the comm_type enum's name)."""
    out: dict[int, dict[str, int]] = {}
    for rank in (0, 1):
        _, nodes = read_et(bundle / "trace" / f"trace.{rank}.et")
        sums: dict[str, int] = defaultdict(int)
        for n in nodes:
            if n.type == pb.COMM_COLL_NODE:
                a = attr_map(n.attr)
                sums[pb.CollectiveCommType.Name(int(a["comm_type"].value))] += int(a["comm_size"].value)  # type: ignore[arg-type]
        out[rank] = dict(sums)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One DDP recording per model, made when a test first asks for it."""

    class Lazy(dict[str, Path]):
        def __missing__(self, name: str) -> Path:
            self[name] = record(name, tmp_path_factory.mktemp(name))
            return self[name]

    return Lazy()


@pytest.mark.integration
@pytest.mark.parametrize("name", MODEL_EXAMPLES)
def test_recorded_and_verified_with_one_gradient_all_reduce_of_the_whole_model(name: str,
                                                                               recorded: dict[str, Path]) -> None:
    bundle = recorded[name]
    verify = nbox("bundle", "verify", bundle)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    torch.manual_seed(0)
    expected = param_bytes(TINY[name].build())
    for rank, sums in collective_bytes(bundle).items():
        assert sums.get("ALL_REDUCE") == expected, (rank, sums)  # DDP's buckets cover every parameter once


@pytest.mark.integration
@pytest.mark.parametrize("name", MODEL_EXAMPLES)
def test_replayed_on_the_virtual_clock_and_live(name: str, recorded: dict[str, Path]) -> None:
    bundle = recorded[name]
    docs = {}
    for clock in ("virtual", "real"):
        done = nbox("replay", bundle, "--clock", clock, "--iterations", 1, "--warmup", 1, "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        docs[clock] = json.loads(done.stdout)
    virtual, live = docs["virtual"], docs["real"]
    assert virtual["ranks_replayed"] == [0, 1] and live["ranks_replayed"] == [0, 1]
    assert virtual["unpriced_collectives"] == 0
    assert live["compute"] == "live" and live["clock"] == "real"
    for doc in (virtual, live):
        assert doc["baseline"]["iteration_us"]["median"] > 0
        assert doc["baseline"]["world_size"] == 2


@pytest.mark.integration
@pytest.mark.parametrize("name", MODEL_EXAMPLES)
def test_emulated_at_world_size_four(name: str) -> None:
    done = nbox("emulate", "--world-size", 4, "-n", 2, "--example", name, "--warmup", WARMUP, "--iterations",
                ITERATIONS, "--json", "--", *TINY[name].args)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["world_size"] == 4 and doc["world_size_seen"] == 4 and doc["real_ranks"] == [0, 1]
    assert doc["iteration_time_us"]["count"] == ITERATIONS
    torch.manual_seed(0)
    reduced = [r for r in doc["collectives"] if r["collective"] == "all_reduce"]
    # one gradient all-reduce of the whole model per timed iteration, priced at W = 4
    assert sum(r["bytes"] * r["count"] for r in reduced) == ITERATIONS * param_bytes(TINY[name].build())
    assert all(r["modeled_us"] > 0 for r in reduced)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["bert", "t5", "resnet152"])
def test_fsdp2_gathers_and_reduce_scatters_the_whole_model(name: str, tmp_path: Path) -> None:
    bundle = record(name, tmp_path, "--fsdp")
    verify = nbox("bundle", "verify", bundle)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    expected = param_bytes(TINY[name].build())
    for rank, sums in collective_bytes(bundle).items():
        assert "ALL_REDUCE" not in sums, (rank, sums)
        # every parameter is gathered at least once (forward; the resharded blocks again in backward: the
        # recorded size is this rank's shard, half of it) and its gradient reduce-scattered once (the recorded
        # size is the whole input); FSDP2 pads each parameter's dim 0 to a multiple of the world size
        assert expected <= 2 * sums.get("ALL_GATHER", 0) <= 2 * expected * 1.01, (rank, sums)
        assert expected <= sums.get("REDUCE_SCATTER", 0) <= expected * 1.01, (rank, sums)
    done = nbox("replay", bundle, "--clock", "virtual", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["unpriced_collectives"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(TINY))
def test_a_model_reports_each_iterations_cpu_and_run_queue_time(name: str, tmp_path: Path) -> None:
    """The real launch writes, beside its iteration times, the training thread's on-CPU and run-queue time per
    iteration: the run-queue share is what tells a launch slowed by another process on its core from the model."""
    times = tmp_path / "times.json"
    done = _one_rank(name, (*TINY[name].args, "--steps", "4", "--report-times", str(times)), None, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    iterations = json.loads((tmp_path / "times.json.rank0").read_text())
    split = json.loads((tmp_path / "times.json.rank0.split").read_text())
    assert len(iterations) == 3 and len(split) == len(iterations)
    for (on_cpu_us, waiting_us), wall_us in zip(split, iterations, strict=True):
        assert 0 < on_cpu_us <= wall_us * 1.05 and waiting_us >= 0
