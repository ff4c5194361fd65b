"""Replay fidelity on the namespace testbed (``bench/fidelity.py --testbed``; issue 15).

Two nodes x one rank (network namespaces, each node pinned to its own CPU, one tbf-shaped link, 1 Gb/s by
default: :mod:`nbox_trace.testbed`); with ``--world 4``, four nodes x one rank behind one switch, every link shaped,
on the machine's CPUs (on this 2-CPU VM two nodes share each CPU: real runs, recordings and live replays are all
oversubscribed alike, and the calibration measures the four-node fabric from the same nodes). Once per bench run
(or read from ``--calibration``, then reused):

1. ``nbox calibrate -n 1 --nnodes N`` across the nodes: the scenario of the shaped links.

Then for each built-in example, R rounds; each round, in an order that alternates (the real run first in even
rounds, last in odd ones):

2. ``nbox record -n 1 --nnodes N`` on every node through torchrun's c10d rendezvous, ``nbox bundle merge`` (a
   fresh recording every round; ``--one-recording``: one before the rounds, as the bench did until 2026-11-26);
3. the prediction: ``nbox replay`` of that round's merged bundle under the calibrated scenario, virtual clock,
   recorded compute (deterministic: same bundle, same scenario, same answer), with the default profiler
   correction (``nbox_replay.inputs.profiler``) and also with each rule and with none (the last recording's, in the
   last lines of the table). With ``live`` (``--live``), the round also replays its bundle live (real clock,
   operators re-executed and padded for the host work the replay does not re-run, nbox_replay/live/hostwork.py;
   collectives answered by the calibrated scenario) across the nodes: ``nbox replay --nnodes N`` on each node,
   one replayed rank per node, pinned in its namespace like the real ranks (``--host-work A,B``: one live replay
   per mode each round, the modes' order turning round by round; the table's live figure is the first mode's, each
   mode gets its own paired line);
4. a fresh plain run across the nodes (``torch.distributed.run --nnodes N``, no nbox, ``--report-times``): per
   iteration the job's pace after warm-up (the mean over ranks: ``nbox_trace.bundle.job_iterations_us``).

The table's figures are the issue's: the rounds' median prediction against the pooled real iterations' median,
with their p10-p90. Below it, the paired figure (:mod:`roundstats`): each round's prediction against that round's
real run, their geometric mean error and its 90% interval over the rounds. A launch's median is a draw here (a
standard deviation of 7-9% between back-to-back launches, half of it the address-space layout), so one recording
against a few real launches cannot tell a 5% error from launch luck; fresh recordings put each recording's luck
into one pair, where the interval counts it.

The recorder's own observed figure (its un-instrumented iterations) is printed beside it, with the prediction's
error against it (``vs rec``): the recording's clean iterations ran in the same launch, minutes before the
prediction's inputs were captured, so that error is the model's own, without the drift of this VM between the
recording's moment and the real runs' (medians of back-to-back launches of one example move by up to 30% here,
docs/journal/2026-11-24.md, run D). The rules' line gives both errors. Nothing is asserted.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from roundstats import Paired, paired

ROOT = Path(__file__).resolve().parents[1]
PORT = 29481


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _nbox(*args: object) -> list[str]:
    return [sys.executable, "-m", "nbox", *map(str, args)]


def workload(example: str, extra: tuple[str, ...] = ()) -> tuple[str, list[str], list[str]]:
    """What a launch of ``example`` runs: a built-in example's name, or the path of a user's script (``*.py``),
    with ``extra`` as its own arguments. Returns its name in file tags, the tail of an ``nbox record`` or ``nbox
    emulate`` command line (after the options), and the plain launch's script and arguments."""
    if example.endswith(".py"):
        script = Path(example).resolve()
        return script.stem, ["--", str(script), *extra], [str(script), *extra]
    tail = ["--example", example, *(["--", *extra] if extra else [])]
    return example, tail, [str(ROOT / "nbox_record" / "examples" / f"{example}.py"), *extra]


def on_nodes(tb: Any, tmp: Path, tag: str, make: Callable[[int], list[str]], timeout_s: float = 600,
             env: dict[str, str] | None = None) -> list[str]:
    """Run ``make(k)`` on every node at once; their stdouts. A failure raises with the node's stderr tail."""
    procs, logs = [], []
    for k in range(len(tb.nodes)):
        out, err = tmp / f"{tag}.n{k}.out", tmp / f"{tag}.n{k}.err"
        logs.append((out, err))
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(tb.run_on(k, make(k), {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})},
                                   cwd=ROOT, stdout=o, stderr=e))
    codes = tb.wait_all(procs, timeout_s)
    for k, (c, (_, err)) in enumerate(zip(codes, logs, strict=True)):
        if c != 0:
            raise RuntimeError(f"{tag}: node {k} exited {c}: {err.read_text()[-2000:]}")
    return [o.read_text() for o, _ in logs]


def calibrate(tb: Any, tmp: Path, sizes: str, collectives: str, budget: float) -> Path:
    """``nbox calibrate`` across the testbed's nodes (its defaults across nodes: each collective also timed beside
    compute)."""
    out = tmp / "testbed.toml"
    ep = f"{tb.node(0).addr}:{PORT}"
    on_nodes(tb, tmp, "calibrate", lambda k: _nbox(
        "calibrate", "-n", 1, "--nnodes", len(tb.nodes), "--node-rank", k, "--rdzv-endpoint", ep, "--sizes", sizes,
        "--collectives", collectives, "--budget", budget, "--timeout", 500,
        "-o", out if k == 0 else tmp / f"testbed.n{k}.toml"))
    return out


def record(tb: Any, tmp: Path, example: str, warmup: int, iterations: int, capture: int,
           lean: int = 0, extra: tuple[str, ...] = ()) -> tuple[Path, float]:
    """The merged bundle of a recording across the nodes (``capture`` iterations captured: the replay's median over them
    keeps one slow captured operator from setting the prediction), and its observed median (us). ``example``
    and ``extra`` as in :func:`workload`."""
    ep = f"{tb.node(0).addr}:{PORT}"
    name, tail, _ = workload(example, extra)
    parts = [tmp / f"{name}.n{k}.bundle" for k in range(len(tb.nodes))]
    on_nodes(tb, tmp, f"record-{name}", lambda k: _nbox(
        "record", "-n", 1, "--nnodes", len(tb.nodes), "--node-rank", k, "--rdzv-endpoint", ep,
        "--warmup", warmup, "--iterations", iterations, "--capture", capture, "--lean-iterations", lean,
        "--timeout", 500, "-o", parts[k], "--overwrite", *tail))
    merged = tmp / f"{name}.bundle"
    subprocess.run(_nbox("bundle", "merge", *parts, "-o", merged, "--overwrite"), check=True, cwd=ROOT,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=300)
    from nbox_trace.bundle import manifest as B

    observed = B.read_manifest(merged).observed or {}
    return merged, float(observed.get("iteration_time_us", {}).get("median", float("nan")))


def plain_run(tb: Any, tmp: Path, example: str, steps: int, warmup: int, rnd: int,
              extra: tuple[str, ...] = ()) -> tuple[list[float], list[Any]]:
    """A plain torchrun of the example (or script, :func:`workload`) across the nodes: the job's iteration times
    (us) after warm-up, and each rank's (on-CPU, run-queue) split per iteration. The script must take ``--steps``
    and ``--report-times`` as the built-in examples do."""
    example, _, script_argv = workload(example, extra)
    times = tmp / f"plain-{example}-{rnd}.json"
    ep = f"{tb.node(0).addr}:{PORT}"

    def cmd(k: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(tb.nodes)), "--nproc-per-node",
                "1", "--node-rank", str(k), "--rdzv-backend", "c10d", "--rdzv-endpoint", ep, "--rdzv-conf",
                f"is_host={int(k == 0)}", "--local-addr", tb.node(k).addr, *script_argv, "--steps", str(steps),
                "--report-times", str(times)]

    procs, logs = [], []
    for k in range(len(tb.nodes)):
        err = tmp / f"plain-{example}.n{k}.err"
        logs.append(err)
        with open(err, "w") as e:
            procs.append(tb.run_on(k, cmd(k), {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **tb.node(k).env()},
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=e))
    ranks = len(tb.nodes)
    written = [tmp / f"{times.name}.rank{r}" for r in range(ranks)]
    deadline = time.monotonic() + 600
    while not all(f.exists() for f in written) and any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    try:  # a rank that wrote its times and then aborted in teardown (seen: SIGABRT in gloo's destructor while
        # node 0's agent waits on) still measured its run: accept it, stop what is left
        codes = tb.wait_all(procs, 30)
    except Exception:
        codes = [p.poll() for p in procs]
    if not all(f.exists() for f in written):
        raise RuntimeError(f"plain {example}: exit codes {codes}: {logs[-1].read_text()[-1500:]}")
    if any(codes):
        print(f"plain {example}: exit codes {codes} after every rank wrote its times (teardown)", file=sys.stderr)
    per_rank = [json.loads((tmp / f"{times.name}.rank{r}").read_text()) for r in range(ranks)]
    split_files = [tmp / f"{times.name}.rank{r}.split" for r in range(ranks)]  # not every example writes them
    splits = [json.loads(f.read_text()) for f in split_files if f.exists()]
    from nbox_trace.bundle import job_iterations_us

    return job_iterations_us({r: p[warmup:] for r, p in enumerate(per_rank)}), [s[warmup:] for s in splits]


def captured(bundle: Path) -> dict[str, float]:
    """What the profiler did to the captured iterations: per (rank, captured iteration), the sum of the recorded
    compute durations and the span from the first operator's start to the last one's end; medians (us)."""
    from collections import defaultdict

    from nbox_trace.chakra.codec import read_et

    comps, spans = [], []
    for et in sorted((bundle / "trace").glob("*.et")):
        per: dict[int, list[Any]] = defaultdict(list)
        for n in read_et(et)[1]:
            if n.type == 4:  # COMP_NODE
                per[next((a.int64_val for a in n.attr if a.name == "nbox_iteration"), -1)].append(n)
        for ns in per.values():
            comps.append(sum(n.duration_micros for n in ns))
            first = min(n.start_time_micros for n in ns)
            spans.append(max(n.start_time_micros + n.duration_micros for n in ns) - first)
    return {"captured_compute_us": statistics.median(comps), "captured_span_us": statistics.median(spans)}


def live_replay(tb: Any, tmp: Path, bundle: Path, scenario: Path, rnd: int, host_work: str = "pad") -> list[float]:
    """``nbox replay --clock real --compute live`` across the nodes (one replayed rank per node, in its namespace
    and on its CPU, through the same rendezvous as the real runs): the measured iteration times (us) of both
    launches of the pair as node 0 reports them (every node reports the whole job). One interleaved pair: launches
    at port + 20 and + 21, both under the calibrated scenario (there is no what-if).
    Six warm-up repetitions: the host-work pad is planned from the median of the warm ones (the first is cold; the
    second of a worker was still 2-15% slower than the third on ddp_transformer, its operators' first passes), and a
    rank's repetitions vary by about 9% one to the next (nbox_replay/live/hostwork.py), so five of them steady it. One
    pair (``--iterations`` counts pairs of launches, each with one timed repetition: run P6 used 3, six launches a
    round, and took twice as long for a live figure whose round-to-round spread is mostly the real run's own launch)."""
    ep = f"{tb.node(0).addr}:{PORT + 20}"
    outs = on_nodes(tb, tmp, f"live-{host_work}-{bundle.stem}-{rnd}", lambda k: _nbox(
        "replay", bundle, "--clock", "real", "--compute", "live", "--baseline", scenario, "--iterations", 1,
        "--warmup", 6, "--nnodes", len(tb.nodes), "--node-rank", k, "--rdzv-endpoint", ep, "--timeout", 400,
        "--set", f"replay.host_work={host_work}", "--json"), timeout_s=500)
    docs = [json.loads(o) for o in outs]
    if docs[0].get("host_work"):
        print(f"live {bundle.stem} round {rnd}: {docs[0]['host_work']['line']}", file=sys.stderr)
    # no --what-if: the what-if launch replays the same bundle under the same scenario, a second draw of the
    # launch's luck (sd 7-16% per launch): both count (P1-P4, 40 rounds: what-if / baseline +1.3% (se 0.7) /
    # +4.1% (se 2.4; median +1.3%) / -0.4% (se 1.1) on the three examples)
    return [float(x) for part in ("baseline", "what_if") for x in docs[0][part]["iteration_us"]["values"]]


def predict(bundle: Path, scenario: Path) -> dict[str, Any]:
    from nbox_replay.inputs.profiler import RULES
    from nbox_replay.replay import ReplayConfig, run_replay

    def one(mode: str) -> Any:
        return run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", baseline=scenario,
                                       iterations=1, profiler_correction=mode))

    rep = one("on")
    b = rep.baseline
    bd = b.breakdowns[b.median_index] if len(b.breakdowns) == len(b.iteration_us) else None
    by_rule = {mode: one(mode).baseline.median_us for mode in ("off", *RULES)}
    return {"predicted_us": b.median_us, "breakdown": asdict(bd) if bd is not None else None,
            "top_collectives": b.top_collectives[:4], "predicted_by_rule_us": by_rule,
            "profiler_correction": rep.profiler.describe() if rep.profiler is not None else None}


def _world_size(scenario: Path) -> int:
    """The world size a calibrated scenario file was measured at (its ``world_size`` key)."""
    from emulator_core.scenario.files import load_scenario

    return int(load_scenario(scenario).world_size)


def run(examples: list[str], rounds: int, steps: int, warmup: int, rate: str, calibration: Path | None,
        sizes: str, collectives: str, budget: float, tmp: Path, capture: int = 5,
        live: bool = False, lean: int = 0, gloo_loop_batch: bool = True,
        world: int = 2, fresh: bool = True, host_work: tuple[str, ...] = ("pad",)) -> tuple[list[dict[str, Any]], Path]:
    """The rows of the table (module docstring), ``world`` nodes x one rank. ``fresh``: a new recording (and its
    prediction) every round, paired with that round's real run; else one recording before the rounds.
    ``host_work``: with ``live``, the ``--host-work`` modes replayed each round (the first is the table's)."""
    from nbox_trace.testbed.namespaces import Testbed

    rows = []
    with Testbed(world, rate=rate, gloo_loop_batch=gloo_loop_batch) as tb:
        if calibration is not None and calibration.exists():
            scenario = calibration
            measured = _world_size(scenario)
            if measured != world:
                raise SystemExit(f"--calibration {scenario}: measured at world size {measured}, the bench runs "
                                 f"{world} nodes (a fabric of another size would be priced; measure one here)")
            print(f"calibration: reusing {scenario}", file=sys.stderr)
        else:
            scenario = calibrate(tb, tmp, sizes, collectives, budget)
            if calibration is not None:
                calibration.write_text(scenario.read_text())
                scenario = calibration
            print(f"calibration: measured -> {scenario}", file=sys.stderr)
        for ex in examples:
            rounds_out: list[dict[str, Any]] = []
            real: list[float] = []
            cpu_us: list[float] = []
            live_us: dict[str, list[float]] = {m: [] for m in host_work}
            once: tuple[Path, float, dict[str, Any]] | None = None
            for rnd in range(rounds):
                # counterbalanced: the real run first in even rounds, after the recording (and its live replay)
                # in odd ones, so that a drift of the machine within a round does not favour one side
                steps_in = ("real", "record") if rnd % 2 == 0 else ("record", "real")
                got: dict[str, Any] = {"round": rnd}
                for step in steps_in:
                    if step == "real":
                        job, splits = plain_run(tb, tmp, ex, steps, warmup, rnd)
                        real += job
                        got["observed_us"] = statistics.median(job)
                        cpu_us += [s[0] for rank in splits for s in rank]
                    else:
                        if once is None or fresh:
                            where = tmp / f"r{rnd}" if fresh else tmp
                            where.mkdir(exist_ok=True)
                            made, made_obs = record(tb, where, ex, warmup, steps - warmup, capture, lean)
                            once = (made, made_obs, predict(made, scenario) | captured(made))
                        bundle, rec_obs, pred = once
                        keep = ("collective", "bytes", "count", "modeled_us", "recorded_us")
                        got |= {"recorder_observed_us": rec_obs, "predicted_us": pred["predicted_us"],
                                "collectives": [{k: c[k] for k in keep} for c in pred.get("top_collectives", [])]}
                        if live:
                            turn = rnd % len(host_work)  # each mode first in its share of the rounds
                            for mode in host_work[turn:] + host_work[:turn]:
                                lv = live_replay(tb, tmp, bundle, scenario, rnd, mode)
                                live_us[mode] += lv
                                got.setdefault("live_by_mode_us", {})[mode] = statistics.median(lv)
                            got["live_us"] = got["live_by_mode_us"][host_work[0]]
                rounds_out.append(got)
            assert once is not None
            obs = statistics.median(real)
            preds = [r["predicted_us"] for r in rounds_out]
            p = statistics.median(preds)
            recs = [r["recorder_observed_us"] for r in rounds_out]
            pred = once[2]  # the last recording's details (breakdown, rules); the figures are the rounds' medians
            row = {"example": ex, "observed_median_us": obs, "observed_p10_us": pct(real, 10),
                   "observed_p90_us": pct(real, 90), "n_observed": len(real), "fresh_recordings": fresh,
                   "rounds": rounds_out, "round_medians_us": [r["observed_us"] for r in rounds_out],
                   "recorder_observed_us": statistics.median(recs), **pred, "predicted_us": p,
                   "error_pct": (p - obs) / obs * 100,
                   "error_vs_recorder_pct": statistics.median(
                       (r["predicted_us"] - r["recorder_observed_us"]) / r["recorder_observed_us"] * 100
                       for r in rounds_out if r["recorder_observed_us"] > 0) if any(x > 0 for x in recs) else None,
                   "round_errors_pct": [(r["predicted_us"] - r["observed_us"]) / r["observed_us"] * 100
                                        for r in rounds_out],
                   "paired": paired(preds, [r["observed_us"] for r in rounds_out]).as_dict(),
                   "rank_cpu_median_us": statistics.median(cpu_us) if cpu_us else None}
            for mode in host_work if live else ():
                lv_us = statistics.median(live_us[mode])
                fig = {"live_us": lv_us, "live_error_pct": (lv_us - obs) / obs * 100,
                       "live_in_spread": row["observed_p10_us"] <= lv_us <= row["observed_p90_us"],
                       "live_paired": paired([r["live_by_mode_us"][mode] for r in rounds_out],
                                             [r["observed_us"] for r in rounds_out]).as_dict(),
                       "live_vs_recorder_paired": paired(
                           [r["live_by_mode_us"][mode] for r in rounds_out],
                           [r["recorder_observed_us"] for r in rounds_out]).as_dict()
                       if all(r["recorder_observed_us"] > 0 for r in rounds_out) else None}
                row.setdefault("live_by_mode", {})[mode] = fig
                if mode == host_work[0]:
                    row.update(fig)
                    row["live_host_work"] = mode
            row["in_spread"] = row["observed_p10_us"] <= p <= row["observed_p90_us"]
            rows.append(row)
            print(format_rows([row]), file=sys.stderr)
    return rows, scenario


def _vs(us: float, ref_us: float) -> str:
    """``us``'s error against ``ref_us`` as "+1.2%"; "-" when the reference is missing (a bundle without it)."""
    return f"{(us - ref_us) / ref_us * 100:+.1f}%" if ref_us > 0 else "-"


def per_collective(rounds: list[dict[str, Any]]) -> dict[tuple[str, float, int], tuple[float, float | None]]:
    """Per (collective, bytes, calls per iteration) of the rounds' top collectives: the median over rounds of the
    modeled and of the recorded time per call (us; recorded None where no round had it)."""
    acc: dict[tuple[str, float, int], tuple[list[float], list[float]]] = {}
    for rnd in rounds:
        for c in rnd.get("collectives", []):
            if c["count"] < 1:
                continue
            mod, rec = acc.setdefault((c["collective"], c["bytes"], c["count"]), ([], []))
            mod.append(c["modeled_us"] / c["count"])
            if c.get("recorded_us") is not None:
                rec.append(c["recorded_us"] / c["count"])
    return {k: (statistics.median(m), statistics.median(r) if r else None) for k, (m, r) in acc.items()}


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (f"{'example':<18} {'observed ms (p10-p90)':>24} {'recorder ms':>11} {'predicted ms':>12} {'err':>7} "
            f"{'vs rec':>7} {'exposed comm':>12} {'rank CPU ms':>11}  per-round err  target |err| <= 5%")
    lines = [head]
    for r in rows:
        o, lo, hi = r["observed_median_us"] / 1e3, r["observed_p10_us"] / 1e3, r["observed_p90_us"] / 1e3
        bd = r.get("breakdown") or {}
        exp = f"{bd['exposed_comm_us'] / 1e3:.2f}" if bd else "-"
        cpu = f"{r['rank_cpu_median_us'] / 1e3:.2f}" if r.get("rank_cpu_median_us") else "-"
        met = "met" if abs(r["error_pct"]) <= 5 and r["in_spread"] else "NOT met"
        rounds = " ".join(f"{e:+.0f}%" for e in r["round_errors_pct"])
        lines.append(f"{r['example']:<18} {f'{o:.2f} ({lo:.2f}-{hi:.2f})':>24} "
                     f"{r['recorder_observed_us'] / 1e3:11.2f} {r['predicted_us'] / 1e3:12.2f} "
                     f"{r['error_pct']:+6.1f}% {_vs(r['predicted_us'], r['recorder_observed_us']):>7} {exp:>12} "
                     f"{cpu:>11}  {rounds:<13}  {met}")
    for r in rows:
        if "live_us" in r:
            met = "met" if abs(r["live_error_pct"]) <= 5 and r["live_in_spread"] else "NOT met"
            lines.append(f"  {r['example']:<18} live replay across the nodes (compute re-executed, --host-work "
                         f"{r.get('live_host_work', 'pad')}): {r['live_us'] / 1e3:.2f} ms, "
                         f"{r['live_error_pct']:+.1f}%  {met}")
    lines.append("paired rounds (each round's prediction against that round's real run; "
                 + ("a fresh recording every round" if all(r.get("fresh_recordings", False) for r in rows)
                    else "one recording for all rounds: its launch's luck is in every pair, not in the interval")
                 + "): geometric mean error, 90% CI")
    for r in rows:
        if "paired" in r:
            lines.append(f"  {r['example']:<18} virtual {Paired.from_dict(r['paired']).describe()}")
        for mode, fig in (r.get("live_by_mode") or {}).items():
            lines.append(f"  {'':<18} live, --host-work {mode:<5} {fig['live_us'] / 1e3:.2f} ms "
                         f"{fig['live_error_pct']:+.1f}%; paired {Paired.from_dict(fig['live_paired']).describe()}")
            if fig.get("live_vs_recorder_paired"):
                lines.append(f"  {'':<18}   against its recording's clean iterations: "
                             f"{Paired.from_dict(fig['live_vs_recorder_paired']).describe()}")
    lines.append("the model against the recordings, per collective (the top collectives of the prediction's median "
                 "iteration; per call, ms, median over the rounds' recordings; recorded: from the call's last "
                 "arrival, nbox_replay.inputs.recorded_calls):")
    for r in rows:
        calls = per_collective(r.get("rounds", []))
        for (coll, nbytes, count), (mod, rec) in calls.items():
            diff = f"{(mod - rec) / rec * 100:+.1f}%" if rec else "-"
            lines.append(f"  {r['example']:<18} {coll:<15} {nbytes / 1024:9.1f} KiB x{count}  modeled {mod / 1e3:.2f}  "
                         f"recorded {rec / 1e3 if rec else float('nan'):.2f}  model {diff}")
        if calls and all(rec for _, rec in calls.values()):  # calls gloo ran at once split their time otherwise
            mod_sum = sum(k[2] * m for k, (m, _) in calls.items())
            rec_sum = sum(k[2] * (rec or 0.0) for k, (_, rec) in calls.items())
            lines.append(f"  {r['example']:<18} {'all of them':<15} per iteration   modeled {mod_sum / 1e3:.2f}  "
                         f"recorded {rec_sum / 1e3:.2f}  model {(mod_sum - rec_sum) / rec_sum * 100:+.1f}%")
    lines.append("prediction by --profiler-correction (error against the observed median / against the recorder's; "
                 "with a lean pass, off plays its times and gaps; a named rule: the profiled times under it, as "
                 "without a lean pass; the table's prediction is the default, on):")
    for r in rows:
        by = r.get("predicted_by_rule_us") or {}
        obs, rec = r["observed_median_us"], r["recorder_observed_us"]
        lines.append(f"  {r['example']:<18} " + "  ".join(
            f"{mode} {us / 1e3:.2f} ms ({(us - obs) / obs * 100:+.1f}% / {_vs(us, rec)})" for mode, us in by.items()))
        if r.get("profiler_correction"):
            lines.append(f"  {'':<18} {r['profiler_correction']}")
    lines.append("captured iterations (profiler on) against the recorder's un-instrumented median:")
    for r in rows:
        if "captured_span_us" in r:
            obs = r["recorder_observed_us"]
            lines.append(f"  {r['example']:<18} span {r['captured_span_us'] / 1e3:.2f} ms "
                         f"({(r['captured_span_us'] / obs - 1) * 100:+.0f}%), recorded compute "
                         f"{r['captured_compute_us'] / 1e3:.2f} ms ({r['captured_compute_us'] / obs * 100:.0f}% of it)")
    return "\n".join(lines)
