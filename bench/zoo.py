"""The workload zoo through every command (issue 16): one row per training pattern.

    flock /tmp/nbox-ranks.lock python bench/zoo.py [--only NAME,NAME] [--rounds 1] [--json]

Per workload (``tests/workloads/*.py``, plain torchrun scripts, gloo on CPU): ``nbox record`` (2 ranks, or 4 for a
2-D mesh; 2 captured iterations), ``nbox bundle verify``, the collectives captured per iteration (rank 0's, from
``nbox bundle inspect``: type and count per iteration), ``nbox replay --clock virtual`` (recorded compute, the
profiler correction on) and ``--clock real --compute live`` against the recording's observed iteration time, and
``nbox emulate --world-size 8`` with ``-n 1`` and ``-n 2``. A step that fails prints its last error line in the
row; later steps of that workload that need its bundle are skipped. Nothing is asserted (the integration tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "tests" / "workloads"


@dataclass(frozen=True)
class Workload:
    name: str
    script: str
    nproc: int = 2
    steps: int = 20
    note: str = ""


ZOO = (
    Workload("ddp_bn_nosync", "ddp_bn_nosync.py", note="BatchNorm buffers, no_sync() accumulation, user broadcast"),
    Workload("ddp_static_graph", "ddp_static_graph.py", note="static_graph, gradient_as_bucket_view"),
    Workload("fsdp2_mixed_ckpt", "fsdp2_mixed_ckpt.py", note="FSDP2, bf16 params / fp32 reduce, checkpointing"),
    Workload("tp_sequence_parallel", "tp_sequence_parallel.py", note="DTensor TP + SP on a 1-D mesh"),
    Workload("tp_fsdp_2d", "tp_fsdp_2d.py", nproc=4, note="TP on tp, FSDP2 on dp, 2-D mesh 2 x 2"),
    Workload("moe_alltoall", "moe_alltoall.py", note="uneven all_to_all_single, batch_isend_irecv"),
    Workload("ddp_compile", "ddp_compile.py", note="torch.compile under DDP"),
    Workload("fsdp2_compile", "fsdp2_compile.py", note="torch.compile under FSDP2"),
    Workload("pipeline_schedule", "pipeline_schedule.py", note="torch.distributed.pipelining"),
    Workload("eval_objects", "eval_objects.py", note="inference_mode eval, object collectives"),
    Workload("own_profiler", "own_profiler.py", note="the script runs its own torch.profiler"),
)


def nbox(*args: object, timeout_s: float = 300) -> tuple[dict[str, Any] | None, str, float]:
    """``nbox ARGS --json`` (the ``--json`` goes before a ``--`` script separator): (document or None, the last
    stderr line on failure, seconds)."""
    argv = [str(a) for a in args]
    cut = argv.index("--") if "--" in argv else len(argv)
    cmd = [sys.executable, "-m", "nbox", *argv[:cut], "--json", *argv[cut:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:g} s", time.monotonic() - t0
    took = time.monotonic() - t0
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return None, f"exit {proc.returncode}: {(lines or ['(no stderr)'])[-1][:240]}", took
    try:
        return json.loads(proc.stdout), "", took
    except ValueError:
        return None, "stdout is not one JSON document", took


def per_iteration(inspect: dict[str, Any], captured: int) -> str:
    """Rank 0's collectives per captured iteration, e.g. ``all_reduce x2, broadcast x3, send/recv 1/1``."""
    rank0 = next((r for r in inspect.get("ranks", []) if r.get("rank") == 0), None)
    if rank0 is None:
        return "-"
    counts: dict[str, int] = {}
    for c in rank0.get("collectives", []):
        counts[str(c["comm_type"]).lower()] = counts.get(str(c["comm_type"]).lower(), 0) + int(c["count"])
    parts = [f"{k} x{v / captured:g}" for k, v in sorted(counts.items())]
    if rank0.get("p2p_sends") or rank0.get("p2p_recvs"):
        parts.append(f"send/recv {rank0.get('p2p_sends', 0) / captured:g}/{rank0.get('p2p_recvs', 0) / captured:g}")
    return ", ".join(parts) or "none"


def run_one(w: Workload, work: Path) -> dict[str, Any]:
    script = WORKLOADS / w.script
    row: dict[str, Any] = {"workload": w.name, "pattern": w.note, "ranks": w.nproc}
    if not script.is_file():
        row["record"] = f"no script {script.name} on this branch"
        return row
    bundle = work / f"{w.name}.bundle"
    captured = 2
    rec, err, _ = nbox("record", "-n", w.nproc, "--warmup", 3, "--iterations", 8, "--capture", captured, "-o", bundle,
                       "--overwrite", "--timeout", 240, "--", script, "--steps", w.steps + 10)
    if rec is None:
        row["record"] = f"FAIL ({err})"
    else:
        row["record"] = "ok"
        row["observed_ms"] = round(float(rec["observed_iteration_median_us"]) / 1e3, 3)
        ver, err, _ = nbox("bundle", "verify", bundle)
        row["verify"] = "ok" if ver is not None and ver.get("ok") else f"FAIL ({err or 'problems'})"
        ins, err, _ = nbox("bundle", "inspect", bundle)
        row["collectives_per_iteration"] = per_iteration(ins, captured) if ins else f"FAIL ({err})"
        for clock, extra in (("virtual", ("--compute", "recorded")), ("live", ("--clock", "real", "--compute", "live",
                                                                               "--warmup", 1))):
            args = ("--clock", "virtual", *extra) if clock == "virtual" else extra
            rep, err, _ = nbox("replay", bundle, *args, "--iterations", 2, "--timeout", 240)
            if rep is None:
                row[f"replay_{clock}"] = f"FAIL ({err})"
            else:
                pred, obs = float(rep["baseline"]["iteration_us"]["median"]) / 1e3, row["observed_ms"]
                row[f"replay_{clock}"] = f"{pred:.2f} ms, {(pred - obs) / obs * 100:+.0f}%"
    for n in (1, 2):
        emu, err, _ = nbox("emulate", "--world-size", 8, "-n", n, "--warmup", 3, "--iterations", 5, "--timeout", 240,
                           "--", script, "--steps", w.steps + 10)
        row[f"emulate_w8_n{n}"] = (f"{float(emu['iteration_time_us']['median']) / 1e3:.2f} ms"
                                   if emu is not None else f"FAIL ({err})")
    return row


def format_rows(rows: list[dict[str, Any]]) -> str:
    cols = ("workload", "record", "verify", "observed_ms", "collectives_per_iteration", "replay_virtual", "replay_live",
            "emulate_w8_n1", "emulate_w8_n2")
    return "\n".join(" | ".join(str(r.get(c, "-")) for c in cols) for r in [dict(zip(cols, cols, strict=True)), *rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma list of workload names (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    chosen = [w for w in ZOO if not args.only or w.name in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="nbox-zoo-") as tmp:
        for w in chosen:
            rows.append(run_one(w, Path(tmp)))
            print(format_rows(rows[-1:]), file=sys.stderr)
    print("\n" + format_rows(rows), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
