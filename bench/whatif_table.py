"""The answer under a what-if against real runs under that what-if (issue 59): ``--testbed``.

Each job is recorded on 2 nodes of the quota testbed (:mod:`nbox_trace.testbed`: every node ``--share`` of one
CPU by a cgroup quota, links of ``--rate``; root) and the fabric calibrated there once (``nbox calibrate`` across
the 2 nodes, ``--calibration FILE`` reused). Then, per what-if, fresh real launches under that what-if and nbox's
answers from the 2-node recording:

============  =============================================  ===============================================
what-if       the real cluster (testbed)                     nbox's question (``--world-size``, ``--set``)
============  =============================================  ===============================================
base          2 nodes, one link (the recorded setting)        the calibrated scenario at W = 2
nodes4        4 nodes behind one switch                       W = 4
nodes8        8 nodes behind one switch                       W = 8
link4         2 nodes, every link at 1/4 of its rate          the dimension's bandwidth / 4
racks2        4 nodes, two racks of 2, a 4:1 uplink           W = 4, ``racks = 2``, ``oversubscription = 4``
racks4        8 nodes, two racks of 4, a 4:1 uplink           W = 8, ``racks = 2``, ``oversubscription = 4``
straggler     2 nodes, node 1 at half the share               rank 1 a straggler of slowdown 2
============  =============================================  ===============================================

nbox's paths (``--paths``): ``virtual`` (``nbox replay --clock virtual`` of the round's recording), ``live``
(``nbox replay --clock real --compute live`` on the 2 recording nodes: its baseline launch is the base setting's
answer, its what-if launch the what-if's), ``emulate1`` (``nbox emulate --world-size W -n 1`` on node 0) and
``emulate2`` (``-n 1 --nnodes 2`` on nodes 0 and 1, where W > 2).

``--rounds`` rounds per job, each with a fresh recording; within a round the what-ifs come in an order that turns
round by round, and each what-if's real launch comes first in even rounds and last in odd ones. Per cell (job,
what-if, path): the median of the pooled iterations against the real median (absolute error), the ratio error
(the path's what-if / its base against the real what-if / the real base), and the paired figure over rounds
(:mod:`roundstats`: the geometric mean of each round's ratio with its 90% interval). Target: |error| <= 5% on
both. Nothing is asserted.

A real launch's (and ``emulate2``'s) iteration is the job's pace, per iteration the mean of its ranks' times
(``nbox_trace.bundle.job_iterations_us``); every table build remakes it from the launch's rank files when they are
there (a log written under the earlier rule, the largest rank's time, stays comparable).

Every launch's result is appended to ``WORKDIR/launches.jsonl`` (``--workdir``); a run started again with the same
workdir skips the launches already there, and ``--rebuild`` makes the table from it without launching. ``--out
DIR`` writes ``whatif_table.csv``; ``--json`` prints one document.

    python bench/whatif_table.py --testbed --jobs resnet152,gpt2 --rounds 3 --workdir /tmp/wi --out docs/figures
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fidelity_testbed import PORT, calibrate, on_nodes, pct, plain_run, record  # noqa: E402
from roundstats import Paired, paired  # noqa: E402
from seeds_table import ranks_lock  # noqa: E402

TARGET_PCT = 5.0
PATHS = ("virtual", "live", "emulate1", "emulate2")


@dataclass(frozen=True)
class Setting:
    """One what-if: the real testbed's shape and nbox's question about it."""

    name: str
    nodes: int
    racks: int = 1
    rate_div: float = 1.0
    slow_node: int | None = None
    oversubscription: float = 4.0

    @property
    def world(self) -> int:
        return self.nodes

    def sets(self, bandwidth_gbps: float) -> tuple[str, ...]:
        """nbox's ``--set`` overrides for this what-if on the calibrated scenario (dimension 0 of
        ``bandwidth_gbps``)."""
        out: list[str] = []
        if self.rate_div != 1.0:
            out.append(f"topology.dims.0.bandwidth_gbps={bandwidth_gbps / self.rate_div:.6g}")
        if self.racks > 1:
            out += [f"topology.dims.0.racks={self.racks}",
                    f"topology.dims.0.oversubscription={self.oversubscription:g}"]
        if self.slow_node is not None:
            out += [f"stragglers.0.rank={self.slow_node}", "stragglers.0.slowdown=2"]
        return tuple(out)

    def describe(self, rate: str) -> str:
        parts = [f"{self.nodes} nodes"]
        if self.racks > 1:
            parts.append(f"{self.racks} racks of {self.nodes // self.racks}, {self.oversubscription:g}:1 uplink")
        if self.rate_div != 1.0:
            parts.append(f"links at 1/{self.rate_div:g} of {rate}")
        if self.slow_node is not None:
            parts.append(f"node {self.slow_node} at half share")
        return ", ".join(parts)


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("base", 2), Setting("nodes4", 4), Setting("nodes8", 8), Setting("link4", 2, rate_div=4.0),
    Setting("racks2", 4, racks=2), Setting("racks4", 8, racks=2), Setting("straggler", 2, slow_node=1))}


@dataclass(frozen=True)
class Job:
    """A job of the table: a built-in example or a script (``bench/workloads``), with its own arguments."""

    name: str
    example: str
    args: tuple[str, ...]


#: The jobs, sized so that an iteration at a node's share of 0.25 takes 1-5 s on the development VM.
JOBS: dict[str, Job] = {j.name: j for j in (
    Job("resnet152", "resnet152", ("--batch", "2", "--image-size", "64", "--width", "32")),
    Job("bert", "bert", ("--plain", "--layers", "4", "--hidden", "384", "--heads", "6", "--ffn", "1536",
                         "--batch", "2", "--seq-len", "128")),
    Job("deeplight", "deeplight", ("--batch", "2048",)),
    Job("t5", "t5", ("--plain", "--layers", "2", "--d-model", "512", "--heads", "8", "--ffn", "2048",
                     "--batch", "2")),
    Job("gpt2", str(ROOT / "bench" / "workloads" / "hf_decoder.py"),
        ("--arch", "gpt2", "--layers", "4", "--hidden", "512", "--heads", "8", "--vocab", "16384")),
    Job("llama_fsdp", str(ROOT / "bench" / "workloads" / "hf_decoder.py"),
        ("--arch", "llama", "--layers", "4", "--hidden", "512", "--heads", "8", "--vocab", "16384", "--fsdp")),
)}


def _nbox(*args: object) -> list[str]:
    return [sys.executable, "-m", "nbox", *map(str, args)]


class Log:
    """``launches.jsonl``: one line per launch, keyed (job, round, setting, path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple[str, int, str, str], dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    d = json.loads(line)
                    self.done[(d["job"], d["round"], d["setting"], d["path"])] = d

    def get(self, job: str, rnd: int, setting: str, path: str) -> dict[str, Any] | None:
        return self.done.get((job, rnd, setting, path))

    def refresh(self, workdir: Path, warmup: int) -> int:
        """Each real and ``emulate2`` launch's iteration times made again from its ranks' own files under
        ``workdir``, by the job's rule (``nbox_trace.bundle.job_iterations_us``): a log written under an older
        rule keeps its launches comparable. Returns how many were made again; a launch without its files keeps
        its logged times."""
        from nbox_trace.bundle import job_iterations_us

        made = 0
        for (job, rnd, setting, path), d in self.done.items():
            where = workdir / job / f"r{rnd}"
            per_rank: dict[int, list[float]] = {}
            if path == "real":
                files = sorted((f for f in (where / f"real-{setting}").glob("plain-*.json.rank*")
                                if f.name.rsplit("rank", 1)[1].isdigit()),
                               key=lambda f: int(f.name.rsplit("rank", 1)[1]))
                per_rank = {k: [float(x) for x in json.loads(f.read_text())][warmup:] for k, f in enumerate(files)}
            elif path == "emulate2" and (where / f"emulate2-{setting}.n0.out").is_file():
                doc = json.loads((where / f"emulate2-{setting}.n0.out").read_text())
                per_rank = {int(k): [float(x) for x in v] for k, v in doc.get("per_rank_iteration_us", {}).items()}
            if per_rank and all(per_rank.values()):
                d["us"] = job_iterations_us(per_rank)
                made += 1
        return made

    def put(self, job: str, rnd: int, setting: str, path: str, **values: Any) -> dict[str, Any]:
        d = {"job": job, "round": rnd, "setting": setting, "path": path, "at": time.strftime("%H:%M:%S"), **values}
        self.done[(job, rnd, setting, path)] = d
        with self.path.open("a") as f:
            f.write(json.dumps(d) + "\n")
        return d


@contextlib.contextmanager
def testbed(setting: Setting, args: argparse.Namespace) -> Iterator[Any]:
    """The quota testbed of ``setting`` (built, torn down after)."""
    from nbox_trace.testbed import Testbed

    rate_bits = _bits(args.rate)
    rate = f"{rate_bits / setting.rate_div / 1e6:g}mbit"
    uplink = None
    if setting.racks > 1:  # the rack's links' sum over the oversubscription
        per_rack = setting.nodes // setting.racks
        uplink = f"{rate_bits / setting.rate_div * per_rack / setting.oversubscription / 1e6:g}mbit"
    with Testbed(setting.nodes, rate=rate, cpu_share=args.share, racks=setting.racks, uplink_rate=uplink) as tb:
        if setting.slow_node is not None:
            tb.set_share(setting.slow_node, args.share / 2)
        yield tb


def _bits(rate: str) -> float:
    from nbox_trace.testbed.namespaces import _rate_bits

    return float(_rate_bits(rate))


def bandwidth_of(scenario: Path) -> float:
    from emulator_core.scenario.files import load_scenario

    return float(load_scenario(scenario).topology.dims[0].bandwidth_gbps)


def virtual(bundle: Path, scenario: Path, setting: Setting) -> list[float]:
    """The virtual replay's what-if iteration times (us) of ``bundle`` under ``setting``'s question."""
    from nbox_replay.replay import ReplayConfig, run_replay

    rep = run_replay(ReplayConfig(str(bundle), clock="virtual", compute="recorded", baseline=scenario,
                                  what_if=scenario, world_size=setting.world,
                                  overrides=setting.sets(bandwidth_of(scenario)), iterations=1))
    return [float(x) for x in rep.what_if.iteration_us]


def live(tb: Any, tmp: Path, tag: str, bundle: Path, scenario: Path, setting: Setting,
         warmup: int) -> tuple[list[float], list[float]]:
    """``nbox replay --clock real --compute live`` of ``bundle`` on the 2 recording nodes: (baseline, what-if)
    iteration times (us), the baseline under the calibrated scenario at W = 2, the what-if under ``setting``."""
    ep = f"{tb.node(0).addr}:{PORT + 20}"
    sets = [a for kv in setting.sets(bandwidth_of(scenario)) for a in ("--set", kv)]
    outs = on_nodes(tb, tmp, tag, lambda k: _nbox(
        "replay", bundle, "--clock", "real", "--compute", "live", "--baseline", scenario, "--what-if", scenario,
        "--world-size", setting.world, *sets, "--iterations", 1, "--warmup", warmup, "--nnodes", len(tb.nodes),
        "--node-rank", k, "--rdzv-endpoint", ep, "--timeout", 900, "--json"), timeout_s=1000)
    doc = json.loads(outs[0])
    return ([float(x) for x in doc["baseline"]["iteration_us"]["values"]],
            [float(x) for x in doc["what_if"]["iteration_us"]["values"]])


def emulate(tb: Any, tmp: Path, tag: str, job: Job, scenario: Path, setting: Setting, nodes: int, warmup: int,
            iterations: int) -> list[float]:
    """``nbox emulate --world-size W -n 1`` on the first ``nodes`` nodes under ``setting``'s question."""
    from emulate_fidelity_testbed import emulate_on

    return emulate_on(tb, tmp, tag, job.example, setting.world, nodes, scenario, warmup, iterations,
                      sets=setting.sets(bandwidth_of(scenario)), extra=job.args)


def run_job(job: Job, args: argparse.Namespace, log: Log, scenario: Path, base: Setting,
            settings: list[Setting]) -> None:
    """Every launch of ``job`` not yet in ``log`` (module docstring's order)."""
    tmp = args.workdir / job.name
    tmp.mkdir(parents=True, exist_ok=True)
    iterations = args.steps - args.warmup
    for rnd in range(args.rounds):
        where = tmp / f"r{rnd}"
        where.mkdir(exist_ok=True)
        rec = log.get(job.name, rnd, "base", "record")
        if rec is None:
            with testbed(base, args) as tb, ranks_lock():
                bundle, observed = record(tb, where, job.example, args.warmup, iterations, 1, extra=job.args)
            rec = log.put(job.name, rnd, "base", "record", bundle=str(bundle), observed_us=observed)
            print(f"whatif: {job.name} r{rnd} recorded: {observed / 1e3:.0f} ms/iteration", file=sys.stderr)
        bundle = Path(rec["bundle"])
        turn = rnd % len(settings)
        for setting in settings[turn:] + settings[:turn]:
            steps = ("real", "nbox") if rnd % 2 == 0 else ("nbox", "real")
            for step in steps:
                if step == "real":
                    if log.get(job.name, rnd, setting.name, "real") is None:
                        fresh = where / f"real-{setting.name}"  # plain_run waits for its files: none left over
                        fresh.mkdir(exist_ok=True)
                        with testbed(setting, args) as tb, ranks_lock():
                            times, _ = plain_run(tb, fresh, job.example, args.steps, args.warmup, rnd, job.args)
                        log.put(job.name, rnd, setting.name, "real", us=times)
                        print(f"whatif: {job.name} r{rnd} {setting.name} real: "
                              f"{statistics.median(times) / 1e3:.0f} ms", file=sys.stderr)
                    continue
                if "virtual" in args.paths and log.get(job.name, rnd, setting.name, "virtual") is None:
                    log.put(job.name, rnd, setting.name, "virtual", us=virtual(bundle, scenario, setting))
                if "live" in args.paths and setting.name != "base" and \
                        log.get(job.name, rnd, setting.name, "live") is None:
                    with testbed(base, args) as tb, ranks_lock():
                        b, w = live(tb, where, f"live-{setting.name}", bundle, scenario, setting, args.live_warmup)
                    log.put(job.name, rnd, setting.name, "live", us=w, base_us=b)
                    print(f"whatif: {job.name} r{rnd} {setting.name} live: {statistics.median(w) / 1e3:.0f} ms "
                          f"(its base {statistics.median(b) / 1e3:.0f} ms)", file=sys.stderr)
                for path, nodes in (("emulate1", 1), ("emulate2", 2)):
                    if path not in args.paths or (nodes == 2 and setting.world <= 2):
                        continue
                    if log.get(job.name, rnd, setting.name, path) is None:
                        with testbed(base, args) as tb, ranks_lock():
                            us = emulate(tb, where, f"{path}-{setting.name}", job, scenario, setting, nodes,
                                         args.warmup, iterations)
                        log.put(job.name, rnd, setting.name, path, us=us)
                        print(f"whatif: {job.name} r{rnd} {setting.name} {path}: {statistics.median(us) / 1e3:.0f} ms",
                              file=sys.stderr)


# ------------------------------------------------------------------------------------------------- ablation


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _no_quota_rule() -> Any:
    """The recorder's quota ignored: a wait of 25% of the CPU time is contention, as before issue 59."""
    from nbox_replay.inputs import profiler as P

    def old(self: Any) -> bool:
        share = self.wait_share
        return share is not None and share >= P.OVERSUBSCRIBED_SHARE

    return _patched(P.RankFigures, "oversubscribed", property(old))


def _no_busy_steps() -> Any:
    """The delay beside compute not grown with the algorithm's steps at p ranks."""
    from emulator_core.pricing import answer as A

    return _patched(A, "algorithm_steps", lambda collective, algorithm, p: 1.0)


def _busy_priced() -> Any:
    """The delay beside compute priced from the call's price (the rule before busy_delay_us)."""
    from emulator_core.pricing import answer as A

    original = A.Fabric._slowdown_of

    def old(self: Any, group: Any, collective: str) -> tuple[float, float]:
        cal = self._calibration(group, collective)
        if cal is None or cal.busy_slowdown <= 1:
            return 1.0, 0.0
        measured = self.price(group, collective, cal.busy_nbytes)[1] if cal.busy_nbytes else A.BUSY_CALL_MAX_US
        return cal.busy_slowdown, (cal.busy_slowdown - 1.0) * measured

    del original
    return _patched(A.Fabric, "_slowdown_of", old)


def _no_straggler_comm() -> Any:
    """A straggler's group beside compute as any other (its library's threads not slowed with its compute)."""
    from emulator_core.pricing import answer as A

    original = A.Fabric.group

    def group(self: Any, *args: Any, **kw: Any) -> Any:
        g = original(self, *args, **kw)
        g.slowest = 1.0
        return g

    return _patched(A.Fabric, "group", group)


def _no_compute_told() -> Any:
    """The fabric not told the members' compute: a queued call counts the time since the running one began, and a
    call arriving after the running one's unslowed end starts anew (the live backend's rule)."""
    from emulator_core.pricing import answer as A

    original = A.Fabric.answer

    def answer(self: Any, *args: Any, compute_us: Any = None, **kw: Any) -> Any:
        return original(self, *args, **kw)

    return _patched(A.Fabric, "answer", answer)


def _no_busy() -> Any:
    """No loss beside compute at all."""
    from emulator_core.pricing import answer as A

    return _patched(A.Fabric, "_slowdown_of", lambda self, group, collective: (1.0, 0.0))


#: Effects of issue 59 the virtual path can be ablated by (name -> what switches it off); ``racks`` drops the racks
#: from the racks what-ifs' questions.
ABLATIONS: dict[str, Any] = {
    "quota rule (recorder's cpu_share), off": _no_quota_rule,
    "racks' uplink in the model, off": None,
    "busy delay a time (busy_delay_us), off: priced from the call": _busy_priced,
    "busy delay grown with the steps at p ranks, off": _no_busy_steps,
    "a straggler's library threads slowed with it, off": _no_straggler_comm,
    "busy_slowdown (a delay per call beside compute), off": _no_busy,
    "the members' compute told to the fabric (a call still running once slowed), off": _no_compute_told,
}


def ablation(log: Log, jobs: list[str], settings: list[Setting], scenario: Path) -> list[dict[str, Any]]:
    """Per effect, job and what-if: the virtual path's paired error with the effect off against the default, in
    points (the same bundles, replayed again; nothing is launched)."""
    rows = []
    for effect, switch in ABLATIONS.items():
        for job in jobs:
            rounds = sorted({r for (j, r, _, p) in log.done if j == job and p == "record"})
            for setting in settings:
                pairs_on, pairs_off = [], []
                for rnd in rounds:
                    real = _round_median(log, job, rnd, setting.name, "real")
                    rec = log.get(job, rnd, "base", "record")
                    on = _round_median(log, job, rnd, setting.name, "virtual")
                    if real is None or rec is None or on is None:
                        continue
                    bundle = Path(rec["bundle"])
                    if switch is None:
                        if setting.racks == 1:
                            continue
                        flat = Setting(setting.name, setting.nodes, 1, setting.rate_div, setting.slow_node)
                        off = statistics.median(virtual(bundle, scenario, flat))
                    else:
                        with switch():
                            off = statistics.median(virtual(bundle, scenario, setting))
                    pairs_on.append((on, real))
                    pairs_off.append((off, real))
                if not pairs_on:
                    continue
                p_on = paired([a for a, _ in pairs_on], [b for _, b in pairs_on])
                p_off = paired([a for a, _ in pairs_off], [b for _, b in pairs_off])
                rows.append({"effect": effect, "job": job, "setting": setting.name,
                             "on_pct": p_on.mean_error_pct, "off_pct": p_off.mean_error_pct,
                             "moves_pts": p_off.mean_error_pct - p_on.mean_error_pct})
    return rows


def format_ablation(rows: list[dict[str, Any]]) -> str:
    lines = ["ablation on the virtual path (paired error with the effect off, and the points it moves against the "
             "default; the same recordings replayed again):"]
    for r in rows:
        lines.append(f"  {r['effect']:<62} {r['job']:<11} {r['setting']:<10} default {r['on_pct']:+6.1f}%  "
                     f"off {r['off_pct']:+6.1f}%  ({r['moves_pts']:+.1f})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- the table


def _pooled(log: Log, job: str, setting: str, path: str, rounds: list[int], key: str = "us") -> list[float]:
    return [x for r in rounds for x in (log.get(job, r, setting, path) or {}).get(key, [])]


def _round_median(log: Log, job: str, rnd: int, setting: str, path: str, key: str = "us") -> float | None:
    d = log.get(job, rnd, setting, path)
    return statistics.median(d[key]) if d and d.get(key) else None


def cells(log: Log, jobs: list[str], settings: list[str], paths: list[str]) -> list[dict[str, Any]]:
    """One dict per (job, what-if, path) with the figures of the module docstring (rounds complete for both the
    real side and the path)."""
    out = []
    for job in jobs:
        rounds = sorted({r for (j, r, _, _) in log.done if j == job})
        for setting in settings:
            real = _pooled(log, job, setting, "real", rounds)
            if not real:
                continue
            real_med = statistics.median(real)
            real_base = statistics.median(_pooled(log, job, "base", "real", rounds) or [math.nan])
            for path in paths:
                if path == "live" and setting == "base":  # every live launch pair's baseline launch
                    pred = [x for s in settings if s != "base" for x in _pooled(log, job, s, "live", rounds, "base_us")]
                else:
                    pred = _pooled(log, job, setting, path, rounds)
                if not pred:
                    continue
                if path == "live":
                    base_pred = [x for s in settings if s != "base" for x in _pooled(log, job, s, "live", rounds,
                                                                                     "base_us")]
                elif path == "emulate2":
                    base_pred = _pooled(log, job, "base", "emulate1", rounds)
                else:
                    base_pred = _pooled(log, job, "base", path, rounds)
                p = statistics.median(pred)
                ratio_err = None
                if base_pred and real_base > 0:
                    ratio_err = (p / statistics.median(base_pred)) / (real_med / real_base) * 100 - 100
                pairs = []
                for r in rounds:
                    o = _round_median(log, job, r, setting, "real")
                    if path == "live" and setting == "base":
                        bs = [_round_median(log, job, r, s, "live", "base_us") for s in settings if s != "base"]
                        bs = [b for b in bs if b is not None]
                        pr = statistics.median(bs) if bs else None
                    else:
                        pr = _round_median(log, job, r, setting, path)
                    if o and pr:
                        pairs.append((pr, o))
                pr_ = paired([a for a, _ in pairs], [b for _, b in pairs]).as_dict() if pairs else None
                out.append({"job": job, "setting": setting, "path": path, "real_us": real_med,
                            "real_p10_us": pct(real, 10), "real_p90_us": pct(real, 90),
                            "real_ratio": real_med / real_base,
                            "predicted_us": p, "error_pct": (p - real_med) / real_med * 100,
                            "ratio_error_pct": ratio_err, "paired": pr_, "rounds": len(pairs)})
    return out


def format_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"what-if table: quota testbed, share {args.share:g} of a CPU per node, links {args.rate}; each job "
             f"recorded and calibrated on 2 nodes; error: the path's median against the real median; ratio: the path's "
             f"what-if/base against the real one; paired: per round, geometric mean and 90% CI; target |err| <= "
             f"{TARGET_PCT:g}%"]
    head = (f"{'job':<11} {'what-if':<10} {'real ms (p10-p90)':>24} {'real x':>7} {'path':<9} {'pred ms':>9} "
            f"{'err':>7} {'ratio err':>9}  paired")
    lines.append(head)
    for r in rows:
        rr = f"{r['real_us'] / 1e3:.0f} ({r['real_p10_us'] / 1e3:.0f}-{r['real_p90_us'] / 1e3:.0f})"
        ratio = f"{r['ratio_error_pct']:+.1f}%" if r["ratio_error_pct"] is not None else "-"
        pr = Paired.from_dict(r["paired"]).describe(TARGET_PCT) if r["paired"] else "-"
        lines.append(f"{r['job']:<11} {r['setting']:<10} {rr:>24} {r['real_ratio']:6.3f}x {r['path']:<9} "
                     f"{r['predicted_us'] / 1e3:9.0f} {r['error_pct']:+6.1f}% {ratio:>9}  {pr}")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (what-if, path) over the jobs: the paired errors' median and worst |value|, absolute and ratio."""
    out = []
    keys = list(dict.fromkeys((r["setting"], r["path"]) for r in rows))
    for setting, path in keys:
        cell = [r for r in rows if (r["setting"], r["path"]) == (setting, path)]
        err = [(r["paired"] or {}).get("mean_error_pct", r["error_pct"]) for r in cell]
        ratio = [r["ratio_error_pct"] for r in cell if r["ratio_error_pct"] is not None and setting != "base"]
        out.append({"setting": setting, "path": path, "jobs": len(cell),
                    "median_abs_error_pct": statistics.median(abs(e) for e in err),
                    "worst_error_pct": max(err, key=abs),
                    "median_abs_ratio_error_pct": statistics.median(abs(e) for e in ratio) if ratio else None,
                    "worst_ratio_error_pct": max(ratio, key=abs) if ratio else None})
    return out


def format_summary(cells: list[dict[str, Any]]) -> str:
    lines = ["summary over the jobs (paired error per job; |median| and the worst, absolute and ratio):",
             f"  {'what-if':<10} {'path':<9} {'jobs':>4} {'|err| median':>12} {'worst':>8} {'|ratio| median':>14} "
             f"{'worst':>8}"]
    for c in cells:
        ratio = "-" if c["median_abs_ratio_error_pct"] is None else f"{c['median_abs_ratio_error_pct']:.1f}%"
        worst = "-" if c["worst_ratio_error_pct"] is None else f"{c['worst_ratio_error_pct']:+.1f}%"
        lines.append(f"  {c['setting']:<10} {c['path']:<9} {c['jobs']:>4} {c['median_abs_error_pct']:11.1f}% "
                     f"{c['worst_error_pct']:+7.1f}% {ratio:>14} {worst:>8}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], out: Path) -> Path:
    """One panel per path, one group of bars per what-if, a bar per job (its paired error, with its 90% interval),
    the +-5% band behind; written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = list(dict.fromkeys(r["path"] for r in rows))
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    jobs = list(dict.fromkeys(r["job"] for r in rows))
    fig, axes = plt.subplots(len(paths), 1, figsize=(10, 2.6 * len(paths)), sharex=True, squeeze=False)
    width = 0.8 / max(1, len(jobs))
    for ax, path in zip(axes[:, 0], paths, strict=True):
        ax.axhspan(-TARGET_PCT, TARGET_PCT, color="0.9", zorder=0)
        ax.axhline(0, color="0.5", linewidth=0.8)
        for j, job in enumerate(jobs):
            xs, ys, lo, hi = [], [], [], []
            for i, setting in enumerate(settings):
                r = next((r for r in rows if (r["path"], r["setting"], r["job"]) == (path, setting, job)), None)
                if r is None:
                    continue
                pr = r["paired"] or {}
                y = pr.get("mean_error_pct", r["error_pct"])
                ci = pr.get("ci90_pct") or [y, y]
                xs.append(i + (j - (len(jobs) - 1) / 2) * width)
                ys.append(y)
                lo.append(y - ci[0])
                hi.append(ci[1] - y)
            ax.bar(xs, ys, width, label=job, yerr=[lo, hi], capsize=2)
        ax.set_ylabel(f"{path}\nerror %")
    axes[-1, 0].set_xticks(range(len(settings)), settings)
    axes[0, 0].legend(ncol=len(jobs), fontsize=8, loc="upper left")
    fig.suptitle("nbox's answer under a what-if against real runs under it (quota testbed)", fontsize=10)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", action="store_true", help="run on the quota testbed (the only place it runs)")
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)}")
    ap.add_argument("--whatifs", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="iterations per launch, warm-up included")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--live-warmup", type=int, default=2, help="warm-up repetitions of a live replay")
    ap.add_argument("--share", type=float, default=0.25, help="each node's fraction of one CPU")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--calibration", type=Path, default=None, help="reused when it exists, else written there")
    ap.add_argument("--sizes", default="1KiB..64MiB")
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast")
    ap.add_argument("--budget", type=float, default=1.0,
                    help="nbox calibrate --budget: timed seconds per (collective, size)")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--rebuild", action="store_true", help="the table from --workdir's launches, launching nothing")
    ap.add_argument("--revirtual", action="store_true",
                    help="with --rebuild: the virtual replays run again on the rounds' bundles (this code's model)")
    ap.add_argument("--ablation", action="store_true",
                    help="with --rebuild: each effect of the virtual path switched off in turn, on the same bundles")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    jobs = [j for j in args.jobs.split(",") if j]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        ap.error(f"--jobs: unknown {unknown} (known: {', '.join(JOBS)})")
    names = [s for s in args.whatifs.split(",") if s]
    if "base" not in names:
        names.insert(0, "base")
    if any(s not in SETTINGS for s in names):
        ap.error(f"--whatifs: known: {', '.join(SETTINGS)}")
    args.paths = [p for p in args.paths.split(",") if p]
    if any(p not in PATHS for p in args.paths):
        ap.error(f"--paths: known: {', '.join(PATHS)}")
    if not args.testbed and not args.rebuild:
        ap.error("--testbed (root: network namespaces and cgroups) or --rebuild")
    args.workdir.mkdir(parents=True, exist_ok=True)
    log = Log(args.workdir / "launches.jsonl")
    settings = [SETTINGS[s] for s in names]
    if not args.rebuild:
        scenario = args.calibration or args.workdir / "calibration.toml"
        if not scenario.exists():
            with testbed(SETTINGS["base"], args) as tb, ranks_lock():
                made = calibrate(tb, args.workdir, args.sizes, args.collectives, args.budget)
            scenario.write_text(made.read_text())
            print(f"whatif: calibrated on 2 nodes -> {scenario}", file=sys.stderr)
        for j in jobs:
            run_job(JOBS[j], args, log, scenario, SETTINGS["base"], settings)
    if args.revirtual:
        scenario = args.calibration or args.workdir / "calibration.toml"
        for (job, rnd, _, path), rec in list(log.done.items()):
            if path == "record" and job in jobs:
                for setting in settings:
                    key = (job, rnd, setting.name, "virtual")
                    log.done[key] = {**log.done.get(key, {}), "job": job, "round": rnd, "setting": setting.name,
                                     "path": "virtual", "us": virtual(Path(rec["bundle"]), scenario, setting)}
    remade = log.refresh(args.workdir, args.warmup)
    print(f"whatif: {remade} real and emulate launches' iterations made from their ranks' files", file=sys.stderr)
    rows = cells(log, jobs, names, args.paths)
    cells_summary = summary(rows) if rows else []
    if args.out is not None and rows:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(rows, args.out / "whatif_table.png")
        with (args.out / "whatif_table.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["job", "what_if", "path", "real_ms", "real_ratio", "predicted_ms", "error_pct",
                        "ratio_error_pct", "paired_pct", "ci90_lo_pct", "ci90_hi_pct", "rounds"])
            for r in rows:
                ci = (r["paired"] or {}).get("ci90_pct") or [None, None]
                w.writerow([r["job"], r["setting"], r["path"], f"{r['real_us'] / 1e3:.1f}", f"{r['real_ratio']:.4f}",
                            f"{r['predicted_us'] / 1e3:.1f}", f"{r['error_pct']:.2f}",
                            "" if r["ratio_error_pct"] is None else f"{r['ratio_error_pct']:.2f}",
                            f"{(r['paired'] or {}).get('mean_error_pct', float('nan')):.2f}",
                            "" if ci[0] is None else f"{ci[0]:.2f}", "" if ci[1] is None else f"{ci[1]:.2f}",
                            r["rounds"]])
    abl = ablation(log, jobs, settings, args.calibration or args.workdir / "calibration.toml") \
        if args.ablation else []
    if args.json:
        print(json.dumps({"share": args.share, "rate": args.rate, "rows": rows, "summary": cells_summary,
                          "ablation": abl}, indent=1))
    else:
        print(format_table(rows, args))
        print(format_summary(cells_summary))
        if abl:
            print(format_ablation(abl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
