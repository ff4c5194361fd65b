"""Issue 48: live replay of a GPT-2-shaped model (tests/workloads/ddp_gpt_adamw.py: DDP or FSDP2, AdamW) runs each
recorded top-level operator once, never an operator together with one inside it, nothing inside a fallback, and
never an operator called on a tensor subclass itself (FSDP2's DTensor optimizer step: its local operator runs); and
the optimizer's made-up state keeps its ``sqrt`` in its domain (nbox_replay.live.values). Counts and values, no
times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from nbox_record.convert.comp import SUBCLASS_NODE
from nbox_record.convert.inputs import RankInputs
from nbox_record.sources.hostet import read_host_et
from nbox_record.sources.kineto import read_kineto
from nbox_replay.inputs.graph import COMPUTE, load_rank
from nbox_replay.live.ops import CompositeRunnable, Runnable, TensorPool, prepare
from nbox_replay.live.values import POSITIVE
from nbox_trace.chakra.attrs import attr_map

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
REPETITIONS = 2


def _record(tmp_path: Path, *script_args: str) -> tuple[Path, Path]:
    bundle = tmp_path / "gpt.bundle"
    done = subprocess.run([sys.executable, "-m", "nbox", "record", "-n", "2", "--warmup", "2", "--iterations", "2",
                           "--keep-raw", "-o", str(bundle), "--", "tests/workloads/ddp_gpt_adamw.py", *script_args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    raw = next(tmp_path.glob(".gpt.bundle.raw-*"))
    return bundle, raw


def _attr(node: Any, name: str) -> Any:
    found = attr_map(node.attr).get(name)
    return None if found is None else found.value


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_live_replay_runs_each_recorded_operator_once_and_nothing_inside_a_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: str) -> None:
    bundle, raw = _record(tmp_path, *(["--fsdp"] if parallel == "fsdp" else []))
    ran: Counter[int] = Counter()  # host ET id of each operator run
    et_of: dict[int, int] = {}  # id() of a runnable -> the host ET id of the operator it stands for
    run = Runnable.run

    def counted(self: Runnable, pool: TensorPool) -> None:
        ran[et_of[id(self)]] += 1
        run(self, pool)

    monkeypatch.setattr(Runnable, "run", counted)
    for rank in (0, 1):
        # the host ET as the converter read it: nesting repaired by Kineto's clock (nbox_record/sources/nesting.py)
        et = RankInputs.join(read_host_et(raw / f"rank{rank}" / "host_et.json"),
                             read_kineto(raw / f"rank{rank}" / "kineto.json"), None, rank).et
        g = load_rank(bundle / "trace" / f"trace.{rank}.et", rank, keep_nodes=True)
        assert g.nodes is not None
        ops = prepare(g, "cpu")
        et_of.clear()
        owner: dict[int, int] = {}  # host ET id of a composite's child -> the recorded node that lists it
        tops = [int(_attr(g.nodes[i], "nbox_et_id")) for i in range(len(g)) if g.kind[i] == COMPUTE]
        assert len(tops) == len(set(tops)), "a recorded operator is two nodes of the trace"
        fallbacks = {int(_attr(g.nodes[i], "nbox_et_id")) for i in ops.reasons}
        assert fallbacks and all(g.names[i].startswith("autograd::engine::evaluate_function:") for i in ops.reasons)
        for i, r in enumerate(ops.runnables):
            if isinstance(r, CompositeRunnable):
                kids = json.loads(str(_attr(g.nodes[i], "nbox_children")))
                et_of.update((id(leaf), int(kid["et_id"])) for leaf, kid in zip(r.children, kids, strict=True))
                owner.update((int(kid["et_id"]), int(_attr(g.nodes[i], "nbox_et_id"))) for kid in kids)
            elif r is not None:
                et_of[id(r)] = int(_attr(g.nodes[i], "nbox_et_id"))
        ran.clear()
        for _ in range(REPETITIONS):
            for i in range(len(g)):
                if g.kind[i] == COMPUTE:
                    ops.run(i)
        assert set(ops.reasons) == {i for i, r in enumerate(ops.runnables) if r is None and g.kind[i] == COMPUTE}
        assert set(ran) == set(et_of.values()) and set(ran.values()) == {REPETITIONS}  # every one, once a pass
        # nothing run lies inside another operator that ran or another recorded node (but the one listing it)
        around = set(ran) | set(tops)
        subclassed = 0
        for op_id in ran:
            assert all(et.nodes[c].name != SUBCLASS_NODE for c in et.children(op_id)), \
                f"rank {rank}: {et.nodes[op_id].name} ran at its subclass's global shape"
            subclassed += et.nodes[et.nodes[op_id].parent or op_id].name == SUBCLASS_NODE
            parent = et.nodes[op_id].parent
            while parent is not None:
                assert parent not in around or parent == owner.get(op_id), \
                    f"rank {rank}: {et.nodes[op_id].name} ran inside {et.nodes[parent].name}"
                parent = et.nodes[parent].parent
        assert (subclassed > 0) == (parallel == "fsdp")  # FSDP2's optimizer ran its shards' operators
        for fb in fallbacks:  # a fallback plays its recorded time: no operator under it is replayed
            inside = {c for c in et.children(fb)}
            while inside:
                c = inside.pop()
                assert c not in ran, f"rank {rank}: {et.nodes[c].name} ran inside fallback {et.nodes[fb].name}"
                inside.update(et.children(c))
        # AdamW's second moments, made by the replay and updated in place each pass, stay in sqrt's domain
        moments = [t for tid, t in ops.pool.tensors.items() if ops.pool.rules.get(tid) == POSITIVE]
        assert moments and all(not bool((t < 0).any()) for t in moments)
        assert all(float(ops.pool.tensors[tid]) == 1.0 for tid in ops.pool.tensors
                   if ops.pool.tensors[tid].dim() == 0 and ops.pool.tensors[tid].dtype == torch.float64)

    live = subprocess.run([sys.executable, "-m", "nbox", "replay", str(bundle), "--json", "--warmup", "1",
                           "--iterations", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert live.returncode == 0, live.stderr[-2000:]
    doc = json.loads(live.stdout)
    assert all(name.startswith("autograd::engine::evaluate_function:") for name in doc["fallbacks"])
    assert doc["coverage"] > 0.9
