"""The GPU kit's issue-49 steps (``python bench/gpu_check.py --hold``): the device hold measured where it matters.

1. ``hold precision``: 1,000 holds on one GPU (``python bench/gpu_hold.py precision``, a process of its own):
   the deadline error of holds whose deadline was written ahead (the kernel's own precision: release time minus
   deadline on the device timer, p50 / p99), the lateness of holds released the way the backend releases them (the
   host polls the device's arrival stamp, then writes arrival + 100 us), the host's cost of enqueuing one, that the
   host returned at once while a 50 ms hold ran, and the clock offset's bracket and drift.
2. ``ddp zero-cost``: a GPU-bound DDP job (``bench/llama3_fsdp2.py --config small --parallel ddp``) run plain on
   one GPU (torchrun, world size 1) and under ``nbox emulate --world-size 2 -n 1`` with a network that costs nothing
   (``bench/data/zero_cost.toml``), the device hold on and off (``NBOX_DEVICE_HOLD``), interleaved; each run's own
   iteration times (the script's ``--report``, the device synchronized at each step). The emulated run should be
   within 2% of the plain one: what is left is the emulator's own cost.
3. ``llama3-8b fsdp2 W=8``: ``nbox emulate --world-size 8 -n 1 --what-if dgx-h100`` of ``bench/llama3_fsdp2.py``
   (Llama 3 8B's architecture, FSDP2, bf16, per-op selective activation checkpointing, sequence 8192, local batch
   2): tokens/s per GPU (``batch x seq`` over the median iteration) and the peak memory beside TorchTitan's
   published figures for that configuration on 8 H100 (``bench/data/torchtitan_t1a.json``: 5,762 tokens/s per GPU,
   82.4 GiB). It needs more memory than an 80 GB card: on a smaller one it is skipped, saying so.

``--cpu`` runs steps 2 and 3 in tiny sizes on CPU (gloo), so the kit itself is checked without a GPU (its figures
mean nothing there); step 1 needs CUDA and is skipped without it. ``--dry-run`` lists the commands and runs none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
SCRIPT = Path(__file__).resolve().parent / "llama3_fsdp2.py"
GIB = 1 << 30
#: The Llama step's card must hold TorchTitan's published peak (82.4 GiB) with room: an 80 GB H100 does not.
LLAMA_MIN_GIB = 90.0


def _pct(got: float | None, ref: float | None) -> float | None:
    return None if not got or not ref else round((got - ref) / ref * 100.0, 2)


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# ---------------------------------------------------------------------------------------------- the kit's steps

class Steps:
    """Runs the issue-49 steps into ``chk`` (bench/gpu_check.py's Check; ``row`` its Row class)."""

    def __init__(self, chk: Any, row: Any, cuda: bool, tiny: bool, dry: bool) -> None:
        self.chk, self.row, self.cuda, self.tiny, self.dry = chk, row, cuda, tiny, dry
        self.planned: list[str] = []

    def run(self, step: str, cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str] | None:
        """One command; None (a FAIL or skipped row added) when it did not end with 0."""
        if self.dry:
            self.planned.append(" ".join(cmd))
            return None
        if self.chk.left_s() < 20:
            self.chk.rows.append(self.row(step, "skipped", note=f"over the {self.chk.budget_s:g} s budget"))
            return None
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**self.chk.env, **(env or {})},
                                  timeout=min(timeout_s, self.chk.left_s()))
        except subprocess.TimeoutExpired:
            self.chk.rows.append(self.row(step, "FAIL", time.monotonic() - t0, note="timed out"))
            return None
        self.chk.keep_log(step, cmd, proc.returncode, proc.stdout, proc.stderr)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            self.chk.rows.append(self.row(step, "FAIL", time.monotonic() - t0, note=f"exit {proc.returncode}: "
                                                                                      f"{last[:300]}"))
            return None
        return proc

    def all(self) -> None:
        self.precision()
        self.ddp_zero_cost()
        self.llama()

    def precision(self) -> None:
        step = "hold precision (1,000 holds)"
        if not self.cuda:
            self.chk.rows.append(self.row(step, "skipped", note="needs CUDA (the hold kernel)"))
            return
        t0 = time.monotonic()
        proc = self.run(step, [sys.executable, str(Path(__file__)), "precision", "--holds", "1000"], 180)
        if proc is None:
            return
        figures = json.loads(proc.stdout)
        ok = figures.get("deadline_err_p99_us", 1e9) <= 20.0
        self.chk.rows.append(self.row(step, "pass", time.monotonic() - t0, figures,
                                      note=f"p99 <= 20 us: {'yes' if ok else 'NO'}"))

    def _times(self, report: Path, skip: int, count: int) -> float | None:
        try:
            times = json.loads(report.read_text())["iteration_us"][skip:skip + count]
        except (OSError, ValueError, KeyError):
            return None
        return statistics.median(times) if times else None

    def ddp_zero_cost(self) -> None:
        step = "ddp zero-cost: emulate W=2 -n 1 vs plain (1 device)"
        warmup, timed = (3, 15) if not self.tiny else (1, 3)
        job = ["--config", "small", "--parallel", "ddp", "--seq-len", "2048", "--batch-size", "4"] if not self.tiny \
            else ["--config", "tiny", "--parallel", "ddp", "--param-dtype", "fp32"]
        t0 = time.monotonic()
        got: dict[str, list[float]] = {"plain": [], "device_hold": [], "host_hold": []}
        with tempfile.TemporaryDirectory(prefix="nbox-gpu-hold-") as tmp:
            order = ("plain", "device_hold", "host_hold", "plain", "device_hold")
            for i, what in enumerate(order):
                report = Path(tmp) / f"{i}-{what}.json"
                args = [*job, "--steps", str(warmup + timed + 1), "--report", str(report)]
                if what == "plain":
                    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(SCRIPT), *args]
                    env = None
                else:
                    cmd = [sys.executable, "-m", "nbox", "emulate", "--world-size", "2", "-n", "1", "--what-if",
                           str(DATA / "zero_cost.toml"), "--warmup", str(warmup), "--iterations", str(timed + 1),
                           "--timeout", "200", "--", str(SCRIPT), *args]
                    env = {"NBOX_DEVICE_HOLD": "auto" if what == "device_hold" else "off"}
                if self.run(f"{step}: {what} run {i + 1}", cmd, 240, env) is None:
                    if self.dry:
                        continue
                    return
                median = self._times(report, warmup, timed)
                if median is not None:
                    got[what].append(median)
        if self.dry:
            return
        med = {k: statistics.median(v) for k, v in got.items() if v}
        plain = med.get("plain")
        figures: dict[str, Any] = {f"{k}_ms": round(v / 1e3, 3) for k, v in med.items()}
        figures["device_hold_pct"] = _pct(med.get("device_hold"), plain)
        figures["host_hold_pct"] = _pct(med.get("host_hold"), plain)
        within = figures["device_hold_pct"] is not None and abs(figures["device_hold_pct"]) <= 2.0
        self.chk.rows.append(self.row(step, "pass" if plain else "FAIL", time.monotonic() - t0, figures,
                                      note=f"device hold within 2% of plain: {'yes' if within else 'NO'}"))

    def llama(self) -> None:
        published = json.loads((DATA / "torchtitan_t1a.json").read_text())
        step = "llama3-8b fsdp2: emulate W=8 -n 1" + (" (tiny, cpu)" if self.tiny else "")
        card = ""
        if self.cuda and not self.tiny:
            import torch

            props = torch.cuda.get_device_properties(0)
            card = f"{props.name}, {props.total_memory / GIB:.0f} GiB"
            if props.total_memory / GIB < LLAMA_MIN_GIB:
                self.chk.rows.append(self.row(step, "skipped", note=f"{card}: TorchTitan's run peaked at "
                                              f"{published['peak_memory_gib']} GiB; needs >= {LLAMA_MIN_GIB:g} GiB"))
                return
        seq, batch = (8192, 2) if not self.tiny else (32, 2)
        job = ["--seq-len", str(seq), "--batch-size", str(batch), "--steps", "100"] + \
            (["--config", "tiny"] if self.tiny else [])
        cmd = [sys.executable, "-m", "nbox", "emulate", "--world-size", "8", "-n", "1", "--what-if", "dgx-h100",
               "--warmup", "2" if not self.tiny else "1", "--iterations", "4" if not self.tiny else "2",
               "--timeout", "420", "--json", "--", str(SCRIPT), *job]
        t0 = time.monotonic()
        proc = self.run(step, cmd, 450)
        if proc is None:
            return
        doc = json.loads(proc.stdout)
        median_us = float(doc["iteration_time_us"]["median"])
        tps = batch * seq / (median_us / 1e6)
        peak = max((int(m.get("bytes", 0)) for m in doc.get("peak_memory", {}).values()), default=0)
        figures = {"iteration_ms": round(median_us / 1e3, 1), "tokens_per_s_per_gpu": round(tps, 1),
                   "published_tokens_per_s": published["tokens_per_s_per_gpu"],
                   "tps_pct": _pct(tps, published["tokens_per_s_per_gpu"]),
                   "peak_gib": round(peak / GIB, 2), "published_peak_gib": published["peak_memory_gib"],
                   "peak_pct": _pct(peak / GIB, published["peak_memory_gib"]), "card": card or "cpu"}
        self.chk.rows.append(self.row(step, "pass", time.monotonic() - t0, figures,
                                      note="TorchTitan T1a ran on 8 H100 at 500 W" if not self.tiny else
                                      "tiny sizes on CPU: the figures mean nothing"))


# ------------------------------------------------------------------------------------ the precision measurement

def precision(holds: int) -> dict[str, Any]:
    """The hold's figures on CUDA device 0 (module docstring, step 1)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from emulator_core.device._cuda import CudaDevice
    from emulator_core.device.hold import ClockOffset, HoldEngine

    dev = CudaDevice(0)
    clock = ClockOffset(dev)
    clock.measure()
    eng = HoldEngine(dev, clock, 5_000_000_000)
    stream = dev.new_stream()
    torch.zeros(1, device="cuda")  # the context and the allocator up

    # (a) deadlines written ahead, 50 us apart: the kernel's own precision
    gap_ns, lead_ns = 50_000, 20_000_000
    works, enqueue_us = [], []
    base = clock.to_device_ns(time.perf_counter_ns()) + lead_ns
    for i in range(holds):
        t = time.perf_counter_ns()
        w, _ = eng.enqueue(True, stream)
        enqueue_us.append((time.perf_counter_ns() - t) / 1e3)
        w.hold.slot.write_deadline_ns(base + i * gap_ns)
        w.hold.deadline_device_ns = base + i * gap_ns
        works.append(w)
    dev.synchronize(stream)
    lates = [w.hold.late_ns() for w in works]
    errors = [x / 1e3 for x in lates if x is not None]
    not_released = sum(x is None for x in lates)  # timed out or never read its deadline: counted, not averaged
    for w in works:
        w.hold.slot.free()

    # (b) released as the backend does: poll the arrival, write arrival + 100 us
    late = []
    for _ in range(holds):
        w, _ = eng.enqueue(True, stream)
        arrival = w.hold.wait_arrival_host_ns(10.0)
        w.hold.release_at(arrival + 100_000)
        dev.synchronize(stream)
        got = w.hold.late_ns()
        if got is None:
            not_released += 1
        else:
            late.append(got / 1e3)
        w.hold.slot.free()

    # (c) the host returns at once while a 50 ms hold runs; a synchronize waits for it
    w, _ = eng.enqueue(False, stream)
    w.hold.release_at(time.perf_counter_ns() + 50_000_000)
    t = time.perf_counter_ns()
    torch.ones(1, device="cuda").add_(1)
    host_us = (time.perf_counter_ns() - t) / 1e3
    t = time.perf_counter_ns()
    torch.cuda.synchronize()
    sync_ms = (time.perf_counter_ns() - t) / 1e6
    offset0 = clock.offset_ns
    time.sleep(1.0)
    clock.measure()
    return {"holds": holds, "not_released": not_released,
            "deadline_err_p50_us": round(_quantile(errors, 0.5), 2),
            "deadline_err_p99_us": round(_quantile(errors, 0.99), 2), "deadline_err_max_us": round(max(errors), 2),
            "resolver_late_p50_us": round(_quantile(late, 0.5), 2),
            "resolver_late_p99_us": round(_quantile(late, 0.99), 2),
            "enqueue_p50_us": round(_quantile(enqueue_us, 0.5), 2), "host_during_hold_us": round(host_us, 1),
            "sync_after_50ms_hold_ms": round(sync_ms, 2), "clock_bracket_us": round(clock.bracket_ns / 1e3, 2),
            "offset_moved_in_1s_us": round((clock.offset_ns - offset0) / 1e3, 2),
            "device": torch.cuda.get_device_name(0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("precision", help="step 1 alone, on CUDA device 0: one JSON document on stdout")
    p.add_argument("--holds", type=int, default=1000)
    args = ap.parse_args()
    if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        print("CUDA_LAUNCH_BLOCKING=1 would block each launch on a hold the host has not released yet",
              file=sys.stderr)
        return 2
    print(json.dumps(precision(args.holds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
