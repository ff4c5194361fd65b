"""The seeds' table on the four real architectures (issue 48): BERT, ResNet-152, DeepLight and T5 (the built-in
examples ``bert``, ``resnet152``, ``deeplight``, ``t5``, full size, DDP; docs/models.md), each as

* real: fresh plain launches across two ranks (``torch.distributed.run``, no nbox, ``--report-times``): per
  iteration the slower rank's wall time after warm-up;
* emulate: ``nbox emulate --world-size 2 -n 1`` (one real rank, its peer emulated);
* replay live: a fresh ``nbox record`` of the two ranks, replayed with its operators re-executed
  (``nbox replay --clock real --compute live``);
* replay virtual: the same recording replayed on the virtual clock with its recorded compute.

Where it runs:

* ``--testbed``: the two-node namespace testbed (:mod:`nbox_trace.testbed.namespaces`: a node per CPU, one shaped link,
  ``--rate``; root), one rank per node, under the scenario ``nbox calibrate`` measures across the nodes once
  (``--calibration FILE``: reused when it exists, else written there). The launches are the ones of
  ``bench/fidelity_testbed.py`` and ``bench/emulate_fidelity_testbed.py`` (their functions, reused).
* ``--device cuda``: two ranks on this machine's first two GPUs (nccl), every prediction under the default
  scenario of the device (no calibration). Needs two GPUs.

``--script PATH`` adds a row for a user's script, an architecture nbox was not built around, run through the same
commands (``nbox record -- PATH``, ``nbox emulate -- PATH``; ``--script-args``, its own arguments, one shell-quoted
string). It must take ``--steps`` and ``--report-times PATH`` as the examples do (``bench/workloads/hf_decoder.py``:
GPT-2 or Llama from transformers); its row has no seeds' figures.

R rounds (``--rounds``), interleaved per model: the real launch first in even rounds and last in odd ones, each
round with its own fresh recording. Per side: the median of the pooled iterations, their standard deviation and
p10-p90, the error of the median against the real median, and the paired figure (:mod:`roundstats`): each
round's median against that round's real one, their geometric mean error and its 90% interval. The seeds'
published figures (NeuronaBox: observed and emulated iteration ms, two nodes) stand beside each row. Target:
|error| <= 2% and inside the real launches' p10-p90 ("met"). Nothing is asserted.

Every launch holds ``/tmp/nbox_ranks.lock`` (``fcntl.flock``) while it runs, so that on a shared machine only one
rank-launching job runs at a time. ``--workdir DIR`` keeps every launch's files and, after each model, its rows
(``rows.json``); ``--rebuild`` makes the table again from a stopped ``--testbed`` run's workdir (its complete rounds
per model; the virtual replay re-run on its bundles), launching nothing. ``--out DIR`` writes ``seeds_table.csv``
and ``seeds_table.png`` (the errors with their intervals, beside the seeds' own; matplotlib). ``--json``: one
document on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from roundstats import Paired, paired  # noqa: E402

from nbox_trace.bundle import job_iterations_us  # noqa: E402

MODELS = ("bert", "resnet152", "deeplight", "t5")
#: NeuronaBox's table (two nodes; observed and emulated iteration ms, mean and sd).
SEEDS: dict[str, tuple[float, float, float, float]] = {
    "bert": (628.0, 1.1, 629.0, 3.0),
    "resnet152": (1063.0, 16.3, 1061.0, 19.8),
    "deeplight": (726.0, 13.8, 727.0, 15.0),
    "t5": (4174.0, 4.4, 4175.0, 0.7),
}
SIDES = ("emulate", "live", "virtual")
LOCK = Path("/tmp/nbox_ranks.lock")
TARGET_PCT = 2.0


@contextlib.contextmanager
def ranks_lock(path: Path = LOCK) -> Iterator[None]:
    """Hold ``path`` exclusively (``fcntl.flock``, as ``flock(1)`` takes it) for one launch."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _nbox(*args: object) -> list[str]:
    return [sys.executable, "-m", "nbox", *map(str, args)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def virtual(bundle: Path, scenario: Path | None) -> list[float]:
    """The bundle's virtual-clock replay with its recorded compute (under ``scenario``, or the device's default):
    its iteration times (us), one per captured iteration."""
    from nbox_replay.replay import ReplayConfig, run_replay

    rep = run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", baseline=scenario,
                                  iterations=1))
    return [float(x) for x in rep.baseline.iteration_us]


@dataclass
class Runner:
    """One round's launches of a model; each returns iteration times (us). ``record`` returns the bundle."""

    real: Callable[[str, int], list[float]]
    record: Callable[[str, int], Path]
    live: Callable[[Path, int], list[float]]
    emulate: Callable[[str, int], list[float]]
    scenario: Path | None
    where: str


def recorded_wait_ms(bundle: Path) -> float:
    """The median over a recording's ranks and clean iterations of the training thread's run-queue wait (ms): a
    recording made while another process shared its cores waited here; nan where the bundle lacks the figure."""
    from nbox_trace.bundle import manifest as B

    per_rank = (B.read_manifest(bundle).observed or {}).get(B.THREAD_CPU_KEY, {})
    waits = [x / 1e3 for lists in per_rank.values() for x in lists.get("clean_run_queue", [])]
    return statistics.median(waits) if waits else float("nan")


def name_of(model: str) -> str:
    """A row's name: the built-in example's, or a script's stem (the name its launches' files carry)."""
    from fidelity_testbed import workload

    return workload(model)[0]


def testbed_runner(tb: Any, tmp: Path, args: argparse.Namespace) -> Runner:
    """The launches on the namespace testbed (bench/fidelity_testbed.py's and bench/emulate_fidelity_testbed.py's)."""
    import emulate_fidelity_testbed as eft
    import fidelity_testbed as ft

    if args.calibration is not None and args.calibration.exists():
        scenario = args.calibration
        print(f"seeds_table: calibration reused: {scenario}", file=sys.stderr)
    else:
        with ranks_lock():
            scenario = ft.calibrate(tb, tmp, args.sizes, args.collectives, args.budget)
        if args.calibration is not None:
            args.calibration.write_text(scenario.read_text())
            scenario = args.calibration
        print(f"seeds_table: calibration measured: {scenario}", file=sys.stderr)
    iterations = args.steps - args.warmup
    extra = tuple(shlex.split(args.script_args))

    def real(model: str, rnd: int) -> list[float]:
        with ranks_lock():
            job, splits = ft.plain_run(tb, tmp, model, args.steps, args.warmup, rnd, extra)
        waits_ms = [s[1] / 1e3 for rank in splits for s in rank]  # examples that write the (on-CPU, run-queue) split
        if waits_ms:  # a launch slowed by another process on its cores, not by the model, shows here
            print(f"seeds_table: real {name_of(model)} round {rnd}: {statistics.median(job) / 1e3:.0f} ms/iteration, "
                  f"the training threads waited {statistics.median(waits_ms):.1f} ms/iteration for a CPU (median)",
                  file=sys.stderr)
        return list(job)

    def record(model: str, rnd: int) -> Path:
        where = tmp / f"r{rnd}"
        where.mkdir(exist_ok=True)
        with ranks_lock():
            bundle, observed_us = ft.record(tb, where, model, args.warmup, iterations, args.capture, extra=extra)
        print(f"seeds_table: record {name_of(model)} round {rnd}: {observed_us / 1e3:.0f} ms/iteration observed, the "
              f"training threads waited {recorded_wait_ms(Path(bundle)):.1f} ms/iteration for a CPU (median)",
              file=sys.stderr)
        return Path(bundle)

    def live(bundle: Path, rnd: int) -> list[float]:
        with ranks_lock():
            return list(ft.live_replay(tb, tmp, bundle, scenario, rnd))

    def emulate(model: str, rnd: int) -> list[float]:
        with ranks_lock():
            return list(eft.emulate_on(tb, tmp, f"emu-{name_of(model)}-{rnd}", model, 2, 1, scenario, args.warmup,
                                       iterations, extra=extra))

    return Runner(real, record, live, emulate, scenario, f"testbed: 2 nodes x 1 rank, {args.rate}, scenario {scenario}")


def workdir_runner(tmp: Path, args: argparse.Namespace) -> Runner:
    """``--rebuild``: the launches of a stopped ``--testbed`` run, read back from its ``--workdir`` (the files the
    launches above leave there); nothing is launched. The virtual replay is re-run on the round's bundle (it is
    deterministic), under ``--calibration``."""

    def read(path: Path) -> Any:
        if not path.exists():
            raise FileNotFoundError(path)
        return json.loads(path.read_text())

    def real(model: str, rnd: int) -> list[float]:
        per_rank = [read(tmp / f"plain-{name_of(model)}-{rnd}.json.rank{r}") for r in range(2)]
        return job_iterations_us({r: p[args.warmup:] for r, p in enumerate(per_rank)})

    def record(model: str, rnd: int) -> Path:
        bundle = tmp / f"r{rnd}" / f"{name_of(model)}.bundle"
        if not (bundle / "manifest.json").exists():
            raise FileNotFoundError(bundle)
        return bundle

    def live(bundle: Path, rnd: int) -> list[float]:
        doc = read(tmp / f"live-pad-{bundle.stem}-{rnd}.n0.out")
        return [float(x) for part in ("baseline", "what_if") for x in doc[part]["iteration_us"]["values"]]

    def emulate(model: str, rnd: int) -> list[float]:
        return [float(x) for x in read(tmp / f"emu-{name_of(model)}-{rnd}.n0.out")["iteration_time_us"]["values"]]

    return Runner(real, record, live, emulate, args.calibration,
                  f"testbed: 2 nodes x 1 rank, {args.rate}, scenario {args.calibration} (rebuilt from {tmp})")


def rounds_in(runner: Runner, model: str, rounds: int) -> int:
    """``--rebuild``: how many of the first ``rounds`` rounds of ``model`` left every file (a stopped run's last
    round may be partial)."""
    for rnd in range(rounds):
        try:
            runner.real(model, rnd), runner.emulate(model, rnd), runner.live(runner.record(model, rnd), rnd)
        except (FileNotFoundError, KeyError, ValueError):
            return rnd
    return rounds


def _local(cmd: list[str], tag: str, tmp: Path, timeout_s: float = 900) -> str:
    """Run ``cmd`` here under the ranks lock; its stdout (a failure raises with its stderr's tail)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NBOX_BACKEND": "nccl"}
    with ranks_lock():
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **env})
    (tmp / f"{tag}.err").write_text(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{tag}: exit {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def cuda_runner(tmp: Path, args: argparse.Namespace) -> Runner:
    """Two ranks on this machine's GPUs (nccl); predictions under the device's default scenario."""
    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit(f"seeds_table: --device cuda needs two GPUs here, found {torch.cuda.device_count()}")
    from fidelity_testbed import workload

    iterations = args.steps - args.warmup
    extra = tuple(shlex.split(args.script_args))

    def real(model: str, rnd: int) -> list[float]:
        name, _, argv = workload(model, extra)
        times = tmp / f"plain-{name}-{rnd}.json"
        _local([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *argv,
                "--steps", str(args.steps), "--report-times", str(times)], f"real-{name}-{rnd}", tmp)
        per_rank = [json.loads((tmp / f"{times.name}.rank{r}").read_text()) for r in (0, 1)]
        return job_iterations_us({r: p[args.warmup:] for r, p in enumerate(per_rank)})

    def record(model: str, rnd: int) -> Path:
        name, tail, _ = workload(model, extra)
        bundle = tmp / f"r{rnd}" / f"{name}.bundle"
        _local(_nbox("record", "-n", 2, "--backend", "nccl", "--warmup", args.warmup, "--iterations", iterations,
                     "--capture", args.capture, "-o", bundle, "--overwrite", *tail), f"record-{name}-{rnd}", tmp)
        return bundle

    def live(bundle: Path, rnd: int) -> list[float]:
        doc = json.loads(_local(_nbox("replay", bundle, "--clock", "real", "--compute", "live", "--device", "cuda",
                                      "--iterations", 1, "--warmup", 6, "--json"), f"live-{bundle.stem}-{rnd}", tmp))
        return [float(x) for part in ("baseline", "what_if") for x in doc[part]["iteration_us"]["values"]]

    def emulate(model: str, rnd: int) -> list[float]:
        name, tail, _ = workload(model, extra)
        doc = json.loads(_local(_nbox("emulate", "--world-size", 2, "-n", 1, "--warmup", args.warmup,
                                      "--iterations", iterations, "--json", *tail), f"emu-{name}-{rnd}", tmp))
        return [float(x) for x in doc["iteration_time_us"]["values"]]

    return Runner(real, record, live, emulate, None, "cuda: 2 ranks on this machine's GPUs, nccl, default scenario")


def run_model(runner: Runner, model: str, rounds: int) -> dict[str, Any]:
    """R interleaved rounds of one model: the real launch first in even rounds, last in odd ones."""
    got: dict[str, list[list[float]]] = {side: [] for side in ("real", *SIDES)}
    for rnd in range(rounds):
        order = ("real", "emulate", "record") if rnd % 2 == 0 else ("record", "emulate", "real")
        for step in order:
            t0 = time.monotonic()
            if step == "real":
                got["real"].append(runner.real(model, rnd))
            elif step == "emulate":
                got["emulate"].append(runner.emulate(model, rnd))
            else:
                bundle = runner.record(model, rnd)
                got["virtual"].append(virtual(bundle, runner.scenario))
                got["live"].append(runner.live(bundle, rnd))
            print(f"seeds_table: {name_of(model)} round {rnd + 1}/{rounds} {step}: {time.monotonic() - t0:.0f} s",
                  file=sys.stderr)
    return summarize(name_of(model), got)


def summarize(model: str, got: dict[str, list[list[float]]]) -> dict[str, Any]:
    """The row of one model from each side's per-round iteration times (us)."""
    def stats(rounds: list[list[float]]) -> dict[str, Any]:
        pooled = [x for r in rounds for x in r]
        return {"median_us": statistics.median(pooled), "sd_us": statistics.stdev(pooled) if len(pooled) > 1 else 0.0,
                "p10_us": pct(pooled, 10), "p90_us": pct(pooled, 90), "n": len(pooled),
                "round_medians_us": [statistics.median(r) for r in rounds]}

    real = stats(got["real"])
    seeds = SEEDS.get(model)
    row: dict[str, Any] = {"model": model, "real": real, "seeds": None if seeds is None else dict(zip(
        ("observed_ms", "observed_sd_ms", "emulated_ms", "emulated_sd_ms"), seeds, strict=True))}
    for side in SIDES:
        s = stats(got[side])
        s["error_pct"] = (s["median_us"] / real["median_us"] - 1) * 100
        s["in_spread"] = real["p10_us"] <= s["median_us"] <= real["p90_us"]
        s["paired"] = paired(s["round_medians_us"], real["round_medians_us"]).as_dict()
        s["met"] = abs(s["error_pct"]) <= TARGET_PCT and s["in_spread"]
        row[side] = s
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    def ms(s: dict[str, Any]) -> str:
        return f"{s['median_us'] / 1e3:.0f}±{s['sd_us'] / 1e3:.0f}"

    lines = [f"{'model':<10} {'real ms':>11} {'p10-p90':>11} " + " ".join(
        f"{side + ' ms':>11} {'err':>6}" for side in SIDES) + f"  {'seeds obs vs emu ms':>24}"]
    for r in rows:
        real, sd = r["real"], r["seeds"]
        lines.append(f"{r['model']:<10} {ms(real):>11} {real['p10_us'] / 1e3:>5.0f}-{real['p90_us'] / 1e3:<5.0f} "
                     + " ".join(f"{ms(r[side]):>11} {r[side]['error_pct']:+5.1f}%" for side in SIDES)
                     + (f"  {sd['observed_ms']:.0f}±{sd['observed_sd_ms']:.1f} vs "
                        f"{sd['emulated_ms']:.0f}±{sd['emulated_sd_ms']:.1f}" if sd else f"  {'-':>24}"))
    lines.append(f"paired rounds (each round's median against that round's real launch): geometric mean error, "
                 f"90% CI; met: |err| <= {TARGET_PCT:g}% and inside the real p10-p90")
    for r in rows:
        for side in SIDES:
            verdict = "met" if r[side]["met"] else "NOT met"
            lines.append(f"  {r['model']:<10} {side:<8} {Paired.from_dict(r[side]['paired']).describe(TARGET_PCT)}"
                         f"  {verdict}")
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    fields = ["model", "real_ms", "real_sd_ms", "real_p10_ms", "real_p90_ms"]
    for side in SIDES:
        fields += [f"{side}_ms", f"{side}_sd_ms", f"{side}_err_pct", f"{side}_ci90_lo_pct", f"{side}_ci90_hi_pct",
                   f"{side}_met"]
    fields += ["seeds_observed_ms", "seeds_observed_sd_ms", "seeds_emulated_ms", "seeds_emulated_sd_ms"]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in rows:
            line: list[object] = [r["model"], *(round(r["real"][k] / 1e3, 2) for k in ("median_us", "sd_us", "p10_us",
                                                                                       "p90_us"))]
            for side in SIDES:
                s, ci = r[side], r[side]["paired"]["ci90_pct"] or (math.nan, math.nan)
                line += [round(s["median_us"] / 1e3, 2), round(s["sd_us"] / 1e3, 2), round(s["error_pct"], 2),
                         round(ci[0], 2), round(ci[1], 2), s["met"]]
            line += list(SEEDS.get(r["model"], ("",) * 4))
            w.writerow(line)
    tmp.replace(path)


def write_png(rows: list[dict[str, Any]], path: Path, where: str) -> None:
    """Per model, each side's error against the real launches with its paired 90% interval, and the seeds'
    emulated-vs-observed error beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [*SIDES, "seeds (emulated)"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(rows))]
        if label in SIDES:
            errs = [r[label]["error_pct"] for r in rows]
            cis = [r[label]["paired"]["ci90_pct"] or (e, e) for r, e in zip(rows, errs, strict=True)]
            yerr = [[max(0.0, e - lo) for e, (lo, _) in zip(errs, cis, strict=True)],
                    [max(0.0, hi - e) for e, (_, hi) in zip(errs, cis, strict=True)]]
            ax.bar(xs, errs, width, yerr=yerr, capsize=3, label=label)
        else:
            seeds = [SEEDS.get(r["model"]) for r in rows]
            ax.bar(xs, [(s[2] / s[0] - 1) * 100 if s else math.nan for s in seeds], width, label=label, color="0.6")
    ax.axhspan(-TARGET_PCT, TARGET_PCT, color="green", alpha=0.08)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r["model"] for r in rows])
    ax.set_ylabel("error vs real launches (%)")
    ax.set_title(f"nbox on the seeds' models ({where.split(':')[0]}); bars: paired 90% CI", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--testbed", action="store_true", help="two-node namespace testbed, one rank per node (root)")
    ap.add_argument("--device", choices=("cuda",), default=None, help="cuda: two ranks on this machine's GPUs")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--script", action="append", default=[], metavar="PATH",
                    help="also a user's training script (a row named by its stem; repeatable)")
    ap.add_argument("--script-args", default="", help="--script's own arguments, one shell-quoted string")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds per model (default 4)")
    ap.add_argument("--steps", type=int, default=8, help="iterations per launch, warm-up included (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations per launch (default 2)")
    ap.add_argument("--capture", type=int, default=2, help="iterations each recording captures (default 2)")
    ap.add_argument("--rate", default="1gbit", help="--testbed: the link's tbf rate")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="--testbed: the calibrated scenario; reused when it exists, else measured and written here")
    ap.add_argument("--sizes", default="4KiB..32MiB", help="--testbed: nbox calibrate --sizes")
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast",
                    help="--testbed: nbox calibrate --collectives")
    ap.add_argument("--budget", type=float, default=0.3, help="--testbed: nbox calibrate --budget")
    ap.add_argument("--out", type=Path, default=None, help="write seeds_table.csv and seeds_table.png here")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep the bundles, logs and rows.json (the rows so far, after each model) here")
    ap.add_argument("--rebuild", action="store_true",
                    help="--testbed: the table from a stopped run's --workdir files, launching nothing")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for script in args.script:
        if not script.endswith(".py") or not Path(script).is_file():
            ap.error(f"--script {script!r}: not a Python file")
    if args.script_args and not args.script:
        ap.error("--script-args needs --script")
    if args.testbed == (args.device == "cuda"):
        ap.error("choose where: --testbed or --device cuda")
    if any(m not in MODELS for m in models) or not models + args.script:
        ap.error(f"--models {args.models!r}: choose from {', '.join(MODELS)}")
    models += args.script
    if args.rounds < 2 or not 0 <= args.warmup < args.steps - 1 or args.capture < 1:
        ap.error("need --rounds >= 2 (a paired interval), 0 <= --warmup < --steps - 1, --capture >= 1")
    if args.rebuild and not (args.testbed and args.workdir is not None and args.calibration is not None):
        ap.error("--rebuild reads a --testbed run's --workdir and needs its --calibration")
    if args.out is not None:
        import matplotlib  # noqa: F401  (fail before hours of launches, not after)

    with tempfile.TemporaryDirectory(prefix="nbox-seeds-") as tmp_name:
        tmp = args.workdir or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, Any]] = []
        with contextlib.ExitStack() as stack:
            if args.rebuild:
                runner = workdir_runner(tmp, args)
                for model in models:
                    n = rounds_in(runner, model, args.rounds)
                    if n < 2:
                        print(f"seeds_table: {model}: {n} complete round(s) in {tmp}, left out", file=sys.stderr)
                        continue
                    rows.append(run_model(runner, model, n))
                    print(format_table(rows[-1:]), file=sys.stderr)
                models = []
            elif args.testbed:
                from nbox_trace.testbed.namespaces import Testbed

                tb = stack.enter_context(Testbed(2, rate=args.rate))
                runner = testbed_runner(tb, tmp, args)
            else:
                runner = cuda_runner(tmp, args)
            for model in models:
                rows.append(run_model(runner, model, args.rounds))
                print(format_table(rows[-1:]), file=sys.stderr)
                if args.workdir is not None:  # each model's rows as soon as they exist: a stopped run keeps them
                    part = tmp / "rows.json.tmp"
                    part.write_text(json.dumps({"where": runner.where, "rounds": args.rounds, "rows": rows}))
                    part.replace(tmp / "rows.json")
    rounds = "each model's complete rounds" if args.rebuild else f"{args.rounds} rounds"
    text = f"{runner.where}; {rounds}, {args.steps - args.warmup} timed iterations per launch\n" \
           + format_table(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, args.out / "seeds_table.csv")
        write_png(rows, args.out / "seeds_table.png", runner.where)
    if args.json:
        print(json.dumps({"where": runner.where, "rounds": args.rounds, "rows": rows}))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
