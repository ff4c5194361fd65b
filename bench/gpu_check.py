"""Every CUDA/NCCL path of nbox in one go, for the first machine with a GPU (issue 16).

    python bench/gpu_check.py [--workdir DIR] [--logs DIR] [--lean auto|on|off] [--json] [--budget-s 480]
                              [--rounds N [--only-rounds]]
    python bench/gpu_check.py --hold [--cpu] [--dry-run] [--logs DIR] [--json]    # issue 49: bench/gpu_hold.py

Steps, each a row of one table (what ran, pass / FAIL / skipped with the reason, seconds, figures):

1. ``environment``: torch, CUDA, the GPU, NCCL; nbox importable (from this checkout: the script puts it on
   ``PYTHONPATH`` for every command it starts, nothing is installed or fetched) and its dependencies present.
2. per workload (``ddp_mlp``, ``ddp_transformer``): ``nbox record -n G --backend nccl`` (G = the GPUs, at most 2),
   ``nbox bundle verify``, ``nbox replay --clock virtual`` (recorded compute) and ``nbox replay --clock real
   --compute live --device cuda``, each with its error against the recording's observed iteration time; on CUDA
   (``--lean``) the same again for a recording with ``--lean-iterations 5 --capture 3``, fsdp2_transformer too;
   then one more launch (``fresh run``, a plain recording no replay saw), against whose clean iterations every
   variant's recorded, virtual and live iteration times are given as well (``lean_virtual_pct`` and so on).
3. ``nbox emulate --world-size 8 -n 1`` on the GPU: the iteration time.
4. ``nbox calibrate --backend nccl -n G``: the fitted bandwidth (needs two GPUs: NCCL does not put two ranks on one
   device, so one GPU skips it, saying so).
5. the GPU tests: ``pytest -m gpu``.
6. with ``--rounds N`` (after the rest, or alone with ``--only-rounds``): per workload, N paired rounds of a fresh
   recording (lean on CUDA, as ``--lean`` says) replayed virtual and live against one plain launch each, and a
   row with the paired errors over the rounds and their 90% interval (:func:`paired_rounds`). On a GPU a round
   takes about a minute per workload.

Without CUDA (this development VM), the CUDA steps are skipped with the reason, and the same pipeline runs on CPU
and gloo as a stand-in (``--no-cpu-standin`` turns that off), so the script itself is exercised here. Every step
has its own deadline, the whole run a budget (default 480 s); a step past the budget is skipped, saying so.
Exit status 0 when no step failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("ddp_mlp", "ddp_transformer")
LEAN_ONLY = ("fsdp2_transformer",)  # recorded with the lean variant only (one more minute on a GPU)
NEEDED = ("torch", "numpy", "typer", "rich", "google.protobuf")


@dataclass
class Row:
    step: str
    status: str  # "pass", "FAIL", "skipped"
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class Check:
    """Runs the steps, keeps the rows, watches the budget."""

    def __init__(self, work: Path, budget_s: float, logs: Path | None = None) -> None:
        self.work, self.budget_s, self.started = work, budget_s, time.monotonic()
        self.logs = logs
        self.rows: list[Row] = []
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def nbox(self, step: str, *args: object, timeout_s: float = 240) -> dict[str, Any] | None:
        """Run ``nbox ARGS --json``; a row for it; its JSON document, or None when it failed or was skipped."""
        if self.left_s() < 20:
            self.rows.append(Row(step, "skipped", note=f"over the {self.budget_s:g} s budget"))
            return None
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "nbox", *map(str, args), "--json"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=ROOT,
                                  timeout=min(timeout_s, self.left_s()))
        except subprocess.TimeoutExpired as exc:
            self.keep_log(step, cmd, -1, _text(exc.stdout), _text(exc.stderr))
            self.rows.append(Row(step, "FAIL", time.monotonic() - t0, note="timed out"))
            return None
        took = time.monotonic() - t0
        self.keep_log(step, cmd, proc.returncode, proc.stdout, proc.stderr)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            self.rows.append(Row(step, "FAIL", took, note=f"exit {proc.returncode}: {last[:300]}"))
            return None
        try:
            doc: dict[str, Any] = json.loads(proc.stdout)
        except ValueError:
            self.rows.append(Row(step, "FAIL", took, note="stdout is not one JSON document"))
            return None
        self.rows.append(Row(step, "pass", took))
        return doc

    def keep_log(self, step: str, cmd: list[str], rc: int, stdout: str, stderr: str) -> None:
        """With ``--logs DIR``: the step's command, exit status and whole output in DIR/NN-step.txt."""
        if self.logs is None:
            return
        self.logs.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() else "-" for c in step)[:60]
        text = f"$ {' '.join(cmd)}\nexit {rc}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n"
        (self.logs / f"{len(self.rows):02d}-{name}.txt").write_text(text)

    def figure(self, **values: Any) -> None:
        self.rows[-1].figures.update(values)


def _text(out: str | bytes | None) -> str:
    """A timed-out child's partial output (``TimeoutExpired`` may hold bytes even with ``text=True``)."""
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def environment() -> tuple[Row, dict[str, Any]]:
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if "torch" in missing:
        return Row("environment", "FAIL", note="torch is not installed"), facts
    import torch

    facts["torch"] = torch.__version__
    facts["cuda"] = bool(torch.cuda.is_available())
    if facts["cuda"]:
        facts["gpus"] = torch.cuda.device_count()
        facts["gpu"] = torch.cuda.get_device_name(0)
        try:
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        except Exception as exc:  # reported, not fatal: the NCCL steps then fail and say why
            facts["nccl"] = f"unknown ({type(exc).__name__})"
    if missing:
        return Row("environment", "FAIL", figures=facts, note=f"missing Python packages: {', '.join(missing)}"), facts
    return Row("environment", "pass", figures=facts), facts


def err_pct(predicted: float | None, observed: float | None) -> float | None:
    if not predicted or not observed:
        return None
    return round((predicted - observed) / observed * 100, 1)


#: The lean variant's recording flags: Kineto-alone operator times over 5 iterations, 3 captured iterations. On the
#: first GPU (docs/results.md, "The GPU kit") a one-iteration capture ran 8x its clean time (the thread blocked
#: inside the operators under CUDA activity tracing) and replayed +41% to +284%; this variant replayed live within
#: 1.3% on the DDP examples, so the kit measures both.
LEAN_FLAGS: tuple[object, ...] = ("--lean-iterations", 5, "--capture", 3)


def _launch_shape(device: str, gpus: int) -> tuple[str, int]:
    """The backend and rank count of the kit's launches: NCCL on up to two GPUs, or gloo on two CPU ranks."""
    return ("nccl", max(1, min(gpus, 2))) if device == "cuda" else ("gloo", 2)


def pipeline(chk: Check, device: str, gpus: int, label: str, lean: bool = False) -> None:
    """Record, verify, replay (virtual and live), emulate and calibrate on ``device`` ("cuda" or "cpu"); with
    ``lean``, each workload is also recorded with :data:`LEAN_FLAGS` and replayed both ways."""
    backend, nproc = _launch_shape(device, gpus)
    variants: list[tuple[str, tuple[object, ...]]] = [("", ())] + ([("lean ", LEAN_FLAGS)] if lean else [])
    for wl in WORKLOADS + (LEAN_ONLY if lean else ()):
        made: dict[str, dict[str, float]] = {}
        for tag, flags in variants:
            if wl in LEAN_ONLY and not tag:
                continue
            made[tag.strip() or "default"] = _one_workload(chk, device, backend, nproc, label + tag, wl, flags)
        _fresh_run(chk, device, backend, nproc, label, wl, made)
    _emulate_and_calibrate(chk, device, gpus, label)


def _one_workload(chk: Check, device: str, backend: str, nproc: int, label: str, wl: str,
                  flags: tuple[object, ...]) -> dict[str, float]:
    """Record ``wl`` (with ``flags``), verify it, replay it virtual and live: a row each. The iteration times
    (us) it got: ``virtual`` and ``live`` predictions, ``recorded`` (the recording's own clean iterations)."""
    got: dict[str, float] = {}
    bundle = chk.work / f"{wl}.{device}.{label.strip().replace(' ', '-') or 'default'}.bundle"
    rec = chk.nbox(f"{label}record {wl} ({nproc} x {device}, {backend})", "record", "--example", wl, "-n", nproc,
                   "--backend", backend, "--warmup", 3, "--iterations", 10, *flags, "-o", bundle, "--overwrite",
                   "--timeout", 200)
    if rec is None:
        return got
    observed = rec.get("observed_iteration_median_us")
    if observed:
        got["recorded"] = observed
    chk.figure(observed_ms=round(observed / 1e3, 3) if observed else None)
    chk.nbox(f"{label}verify {wl}", "bundle", "verify", bundle, timeout_s=120)
    virt = chk.nbox(f"{label}replay {wl} virtual", "replay", bundle, "--clock", "virtual", "--compute",
                    "recorded", "--iterations", 1)
    if virt is not None:
        pred = virt["baseline"]["iteration_us"]["median"]
        got["virtual"] = pred
        chk.figure(predicted_ms=round(pred / 1e3, 3), error_pct=err_pct(pred, observed))
    live = chk.nbox(f"{label}replay {wl} live ({device})", "replay", bundle, "--clock", "real", "--compute", "live",
                    "--device", device, "--iterations", 3, "--warmup", 1, "--timeout", 200)
    if live is not None:
        meas = live["baseline"]["iteration_us"]["median"]
        got["live"] = meas
        chk.figure(replayed_ms=round(meas / 1e3, 3), error_pct=err_pct(meas, observed))
    return got


def _fresh_run(chk: Check, device: str, backend: str, nproc: int, label: str, wl: str,
               made: dict[str, dict[str, float]]) -> None:
    """One more launch of ``wl`` (a plain recording: its clean iterations are a real run the replays never saw)
    and every variant's recorded, virtual and live iteration time against it (``<variant>_<what>_pct``). On a
    host-bound GPU the virtual replay is scaled to its own recording's clean iterations (nbox_replay/inputs/profiler.py,
    ``to_wall``), so its error against that recording says little; against this launch it says what a user
    gets."""
    fresh = _plain_launch(chk, f"{label}fresh run {wl} (a launch no replay saw)", device, backend, nproc, wl,
                          chk.work / f"{wl}.{device}.fresh.bundle")
    if not fresh:
        return
    chk.figure(fresh_ms=round(fresh / 1e3, 3))
    for variant, got in made.items():
        for what, value in got.items():
            chk.figure(**{f"{variant}_{what}_pct": err_pct(value, fresh)})


def _plain_launch(chk: Check, step: str, device: str, backend: str, nproc: int, wl: str, bundle: Path) -> float | None:
    """A plain recording of ``wl`` (no lean pass): its clean iterations' median (us), a real run no replay saw;
    None when it failed."""
    rec = chk.nbox(step, "record", "--example", wl, "-n", nproc, "--backend", backend, "--warmup", 3,
                   "--iterations", 10, "-o", bundle, "--overwrite", "--timeout", 200)
    got = rec.get("observed_iteration_median_us") if rec is not None else None
    return float(got) if got else None


def paired_rounds(chk: Check, device: str, gpus: int, rounds: int, lean: bool) -> None:
    """``--rounds N``: per workload, N rounds of a fresh recording (with :data:`LEAN_FLAGS` when ``lean``) replayed
    virtual and live, and one plain launch (the real run, first in odd rounds and last in even ones, as
    ``bench/fidelity.py`` pairs them); then a row with the real launches' median and each prediction's paired error
    over the rounds (``bench/roundstats.py``: the geometric mean of the rounds' ratios, a 90% interval). One launch
    against one recording says little where a launch's median moves by a quarter (docs/results.md, "The GPU kit")."""
    from roundstats import paired

    backend, nproc = _launch_shape(device, gpus)
    flags = LEAN_FLAGS if lean else ()
    for wl in WORKLOADS + (LEAN_ONLY if lean else ()):
        observed: list[float] = []
        predicted: dict[str, list[float]] = {"recorded": [], "virtual": [], "live": []}
        for r in range(rounds):
            step, bundle = f"round {r + 1} real {wl}", chk.work / f"{wl}.{device}.round-real.bundle"
            real = _plain_launch(chk, step, device, backend, nproc, wl, bundle) if r % 2 == 0 else None
            got = _one_workload(chk, device, backend, nproc, f"round {r + 1} ", wl, flags)
            if r % 2 == 1:
                real = _plain_launch(chk, step, device, backend, nproc, wl, bundle)
            if real and all(got.get(k) for k in predicted):
                observed.append(real)
                for k in predicted:
                    predicted[k].append(got[k])
        row = Row(f"paired rounds {wl} ({'lean, ' if lean else ''}{len(observed)} of {rounds})",
                  "pass" if len(observed) >= 2 else "FAIL" if rounds >= 2 else "skipped")
        if observed:
            row.figures["real_ms"] = round(statistics.median(observed) / 1e3, 3)
            for k, values in predicted.items():
                row.figures[f"{k}_ms"] = round(statistics.median(values) / 1e3, 3)
                row.figures[f"{k}_paired"] = paired(values, observed).describe()
        if len(observed) < 2:
            row.note = "fewer than two complete rounds: no interval" if rounds >= 2 else "one round: no interval"
        chk.rows.append(row)


def _emulate_and_calibrate(chk: Check, device: str, gpus: int, label: str) -> None:
    """``nbox emulate --world-size 8 -n 1`` and ``nbox calibrate`` rows."""
    backend, nproc = _launch_shape(device, gpus)
    emu = chk.nbox(f"{label}emulate ddp_mlp --world-size 8 -n 1 ({device})", "emulate", "--world-size", 8, "-n", 1,
                   "--warmup", 3, "--iterations", 10, "--timeout", 200)
    if emu is not None:
        chk.figure(iteration_ms=round(emu["iteration_time_us"]["median"] / 1e3, 3),
                   world_size_seen=emu["world_size_seen"])
    if device == "cuda" and gpus < 2:
        chk.rows.append(Row(f"{label}calibrate --backend nccl", "skipped",
                            note="one GPU: NCCL does not put two ranks on one device (needs >= 2 GPUs)"))
        return
    out = chk.work / f"calibrated.{device}.toml"
    out.unlink(missing_ok=True)
    cal = chk.nbox(f"{label}calibrate --backend {backend} -n {max(nproc, 2)}", "calibrate", "--backend", backend,
                   "-n", max(nproc, 2), "--sizes", "64KiB..64MiB", "--collectives", "all_reduce", "--budget", 0.2,
                   "-o", out, timeout_s=200)
    if cal is not None:
        fits = cal.get("fits") or []
        bw = next((f.get("bandwidth_gbps") for f in fits if f.get("collective") == "all_reduce"), None)
        chk.figure(bandwidth_gbps=bw)


def gpu_tests(chk: Check, cuda: bool) -> None:
    if not cuda:
        chk.rows.append(Row("pytest -m gpu", "skipped", note="no CUDA device (torch.cuda.is_available() is False)"))
        return
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "gpu", str(ROOT / "tests")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=chk.env, cwd=ROOT,
                              timeout=max(30.0, chk.left_s()))
    except subprocess.TimeoutExpired as exc:
        chk.keep_log("pytest -m gpu", cmd, -1, _text(exc.stdout), _text(exc.stderr))
        chk.rows.append(Row("pytest -m gpu", "FAIL", time.monotonic() - t0, note="timed out"))
        return
    chk.keep_log("pytest -m gpu", cmd, proc.returncode, proc.stdout, proc.stderr)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    chk.rows.append(Row("pytest -m gpu", "pass" if proc.returncode == 0 else "FAIL", time.monotonic() - t0,
                        note=last[:200]))


def format_table(rows: list[Row]) -> str:
    lines = [f"{'step':<52} {'status':<8} {'s':>6}  figures / note"]
    for r in rows:
        figs = ", ".join(f"{k} {v}" for k, v in r.figures.items() if v is not None)
        lines.append(f"{r.step[:52]:<52} {r.status:<8} {r.seconds:6.1f}  {'; '.join(x for x in (figs, r.note) if x)}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None, help="keep bundles here (default: a temporary folder)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole run's budget (default 480 s)")
    ap.add_argument("--no-cpu-standin", action="store_true", help="without CUDA, skip the CPU stand-in pipeline")
    ap.add_argument("--lean", choices=("auto", "on", "off"), default="auto",
                    help="also record each workload with a lean pass and 3 captured iterations (auto: on CUDA only)")
    ap.add_argument("--logs", type=Path, default=None,
                    help="write each step's command and whole output to DIR/NN-step.txt (for a run on a lent machine)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON document on stdout")
    ap.add_argument("--rounds", type=int, default=0,
                    help="after the steps, N paired rounds per workload (fresh recording, virtual and live replay, "
                         "one real launch); 0: none")
    ap.add_argument("--only-rounds", action="store_true",
                    help="with --rounds: skip the one-launch steps (the environment row and the rounds only)")
    ap.add_argument("--hold", action="store_true",
                    help="issue 49's steps instead (bench/gpu_hold.py): the device hold's precision, a DDP job "
                         "emulated at W = 2 under a zero-cost network against the plain run, Llama 3 8B FSDP2 at W = 8")
    ap.add_argument("--cpu", action="store_true", help="with --hold: the steps in tiny sizes on CPU (a smoke test)")
    ap.add_argument("--dry-run", action="store_true", help="with --hold: print the commands, run none")
    args = ap.parse_args()
    if (args.cpu or args.dry_run) and not args.hold:
        ap.error("--cpu and --dry-run go with --hold")
    if args.hold:
        return hold_main(args)
    if args.rounds < 0 or (args.only_rounds and args.rounds < 1):
        ap.error(f"--rounds must be >= 0, and >= 1 with --only-rounds (got {args.rounds})")
    tmp = None
    if args.workdir is None:
        tmp = tempfile.mkdtemp(prefix="nbox-gpu-check-")
    work = args.workdir or Path(tmp or ".")
    work.mkdir(parents=True, exist_ok=True)
    chk = Check(work, args.budget_s, args.logs)
    try:
        row, facts = environment()
        chk.rows.append(row)
        if row.status == "pass":
            cuda = bool(facts.get("cuda"))
            device, gpus, lean = ("cuda", int(facts.get("gpus", 1)), args.lean != "off") if cuda else \
                ("cpu", 0, args.lean == "on")
            if not cuda:
                chk.rows.append(Row("CUDA steps (record/replay/emulate/calibrate on the GPU)", "skipped",
                                    note="no CUDA device (torch.cuda.is_available() is False)"))
            run_here = cuda or not args.no_cpu_standin
            if run_here and not args.only_rounds:
                pipeline(chk, device, gpus, "" if cuda else "cpu stand-in: ", lean=lean)
            if run_here and args.rounds:
                paired_rounds(chk, device, gpus, args.rounds, lean)
            if not args.only_rounds:
                gpu_tests(chk, cuda)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    took = time.monotonic() - chk.started
    print(format_table(chk.rows) + f"\n(total {took:.0f} s)", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in chk.rows], "total_s": round(took, 1)}))
    return 1 if any(r.status == "FAIL" for r in chk.rows) else 0


def hold_main(args: argparse.Namespace) -> int:
    """``--hold``: the environment row, then bench/gpu_hold.py's steps; the table (and ``--json``) as ever."""
    from gpu_hold import Steps

    chk = Check(args.workdir or Path(tempfile.gettempdir()), args.budget_s, args.logs)
    row, facts = environment()
    chk.rows.append(row)
    cuda = bool(facts.get("cuda")) and not args.cpu
    if row.status == "pass":
        if not cuda and not args.cpu:
            chk.rows.append(Row("issue 49 steps", "skipped", note="no CUDA device; --cpu runs them in tiny sizes"))
        else:
            steps = Steps(chk, Row, cuda, tiny=not cuda, dry=args.dry_run)
            steps.all()
            if args.dry_run:
                print("\n".join(steps.planned))
                return 0
    took = time.monotonic() - chk.started
    print(format_table(chk.rows) + f"\n(total {took:.0f} s)", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in chk.rows], "total_s": round(took, 1)}))
    return 1 if any(r.status == "FAIL" for r in chk.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
