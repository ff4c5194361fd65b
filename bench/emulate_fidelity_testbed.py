"""Emulation fidelity on the namespace testbed (``bench/emulate_fidelity.py --testbed``; issue 15).

A real job across nodes against ``nbox emulate`` of the same example on fewer real ranks, under the scenario
calibrated on the testbed's own link (``nbox calibrate -n 1 --nnodes 2``, or ``--calibration FILE`` reused):

* W = 2: real, 2 nodes x 1 rank (plain ``torch.distributed.run --nnodes 2``, no nbox, ``--report-times``), against
  ``nbox emulate --world-size 2 -n 1`` on node 0 (its CPU, its namespace).
* W = 4 (``--world 4``): real, 4 nodes x 1 rank behind one switch, every node's link shaped; 4 nodes on this
  machine's 2 CPUs, so two nodes share each CPU (the oversubscription is the real side's, named in the table);
  against ``nbox emulate --world-size 4 -n 1`` on node 0 and ``nbox emulate --world-size 4 -n 1 --nnodes 2``
  across nodes 0 and 1 (multi-node emulate: 2 real ranks on 2 nodes, 2 emulated).

``--max-of-nodes`` adds a diagnostic side: a one-rank ``nbox emulate`` on every node at once, each on its own, and
per iteration the slowest node's time. It is what emulate would answer if each emulated peer carried the luck of
a CPU of its own, as the real job's ranks do; its distance from ``emulate -n 1`` is what the mirror rule (an
emulated member arrives with its mirror) leaves out on this machine.

``--variant NAME:K=V,...`` (repeatable) makes one emulated side per variant with those scenario overrides,
e.g. ``--variant slow:topology.dims.0.bandwidth_gbps=0.5``. Rounds are interleaved, the real run first in
even rounds and last in odd ones. Per side: median and p10-p90 of the job's
per-iteration time (slowest real rank), the error of the emulated median against the real one, and whether it
lies inside the real spread. Target: |error| <= 5% and inside the spread. Below, the paired figure
(:mod:`roundstats`): each round's emulated median against that round's real one, their geometric mean error and
its 90% interval over the rounds (each side is a fresh launch every round, so each pair carries both launches'
luck once). Nothing is asserted.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from fidelity_testbed import PORT, calibrate, on_nodes, pct, plain_run, workload  # noqa: E402
from roundstats import Paired, paired  # noqa: E402


def _nbox(*args: object) -> list[str]:
    return [sys.executable, "-m", "nbox", *map(str, args)]


#: The diagnostic side's name (``--max-of-nodes``).
MAX_OF_NODES = "slowest of W x emulate -n 1 (diagnostic)"


def emulate_on(tb: Any, tmp: Path, tag: str, example: str, world: int, nodes: int, scenario: Path, warmup: int,
               iterations: int, sets: tuple[str, ...] = (), extra: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> list[float]:
    """``nbox emulate`` of ``example`` (a built-in example or a script's path with its arguments ``extra``:
    :func:`fidelity_testbed.workload`) as a world of ``world``, one real rank on each of the first ``nodes`` nodes,
    with ``--set`` overrides ``sets``; the job's per-iteration times (us) as node 0 reports them (every node
    reports the whole job); ``env``: more environment for the launches."""
    ep = f"{tb.node(0).addr}:{PORT + 7}"
    _, tail, _ = workload(example, extra)

    def cmd(k: int) -> list[str]:
        multi = ["--nnodes", nodes, "--node-rank", k, "--rdzv-endpoint", ep] if nodes > 1 else []
        return _nbox("emulate", "--world-size", world, "-n", 1, *multi, "--what-if", scenario,
                     *[a for kv in sets for a in ("--set", kv)], "--warmup", warmup, "--iterations", iterations,
                     "--timeout", 400, "--json", *tail)

    class Some:  # on_nodes runs on every node of the testbed; emulate runs on the first `nodes` only
        def __init__(self) -> None:
            self.nodes = tb.nodes[:nodes]

        def __getattr__(self, name: str) -> Callable[..., Any]:
            return getattr(tb, name)  # type: ignore[no-any-return]

    outs = on_nodes(Some(), tmp, tag, cmd, timeout_s=500, env=env)
    docs = [json.loads(o) for o in outs]
    if any(d["iteration_time_us"]["values"] != docs[0]["iteration_time_us"]["values"] for d in docs):
        raise RuntimeError(f"{tag}: the nodes report different iteration times")
    return [float(x) for x in docs[0]["iteration_time_us"]["values"]]


def emulate_max_of_nodes(tb: Any, tmp: Path, tag: str, example: str, world: int, scenario: Path, warmup: int,
                         iterations: int) -> list[float]:
    """A diagnostic, not a prediction: ``nbox emulate --world-size W -n 1`` on every node at once, each on its own
    (no rendezvous: W independent one-rank emulations, each node's CPU busy as in the real job); per iteration,
    the slowest node's time (us). What emulate would answer if each emulated peer carried the luck of a CPU of its
    own, as the real job's ranks do (docs/journal/2026-11-26.md, "Emulate and the slowest of two CPUs")."""
    outs = on_nodes(tb, tmp, tag, lambda k: _nbox(
        "emulate", "--example", example, "--world-size", world, "-n", 1, "--what-if", scenario, "--warmup", warmup,
        "--iterations", iterations, "--timeout", 400, "--json"), timeout_s=500)
    per_node = [[float(x) for x in json.loads(o)["iteration_time_us"]["values"]] for o in outs]
    return [max(xs) for xs in zip(*per_node, strict=False)]


def run(examples: list[str], world: int, rounds: int, steps: int, warmup: int, rate: str, calibration: Path | None,
        sizes: str, collectives: str, budget: float, tmp: Path,
        variants: tuple[tuple[str, tuple[str, ...]], ...] = (("", ()),),
        gloo_loop_batch: bool = True, max_of_nodes: bool = False) -> list[dict[str, Any]]:
    """The rows of the table (module docstring); each of ``variants`` ((name, ``--set`` overrides)) is one more
    emulated side per real-rank layout, named ``emulate -n 1 [NAME]``; ``max_of_nodes`` adds the diagnostic side
    of :func:`emulate_max_of_nodes`."""
    from nbox_trace.testbed.namespaces import Testbed

    rows = []
    with Testbed(world, rate=rate, gloo_loop_batch=gloo_loop_batch) as tb:
        if calibration is not None and calibration.exists():
            scenario = calibration
            print(f"calibration: reusing {scenario}", file=sys.stderr)
        else:
            if world != 2:
                raise SystemExit("--world 4 needs --calibration FILE (measured on two nodes: run --world 2 first)")
            scenario = calibrate(tb, tmp, sizes, collectives, budget)
            if calibration is not None:
                calibration.write_text(scenario.read_text())
                scenario = calibration
            print(f"calibration: measured -> {scenario}", file=sys.stderr)
        layouts = [("emulate -n 1", 1)] + ([("emulate -n 1 --nnodes 2", 2)] if world > 2 else [])
        sides = [(f"{label} [{name}]" if name else label, nodes, sets)
                 for label, nodes in layouts for name, sets in variants]
        if max_of_nodes:
            sides.append((MAX_OF_NODES, world, ()))  # every node runs its own one-rank emulate
        cpus = sorted({c for n in tb.nodes for c in n.cpus})
        shared = f"{world} nodes on {len(cpus)} CPU(s)" + (" (oversubscribed)" if world > len(cpus) else "")
        for ex in examples:
            real: list[float] = []
            emu: dict[str, list[float]] = {name: [] for name, _, _ in sides}
            per_round: dict[str, list[float]] = {name: [] for name in ["real", *emu]}
            for rnd in range(rounds):
                # counterbalanced: the real run first in even rounds, last in odd ones (a drift within a round
                # then favours neither side)
                if rnd % 2 == 1:
                    _emulate_round(tb, tmp, ex, world, scenario, warmup, steps, sides, rnd, emu, per_round)
                job, _ = plain_run(tb, tmp, ex, steps, warmup, rnd)
                real += job
                per_round["real"].append(statistics.median(job))
                if rnd % 2 == 0:
                    _emulate_round(tb, tmp, ex, world, scenario, warmup, steps, sides, rnd, emu, per_round)
            obs = statistics.median(real)
            row: dict[str, Any] = {"example": ex, "world": world, "nodes": shared, "observed_median_us": obs,
                                   "observed_p10_us": pct(real, 10), "observed_p90_us": pct(real, 90),
                                   "n_observed": len(real), "round_medians_us": per_round, "sides": {}}
            for name, xs in emu.items():
                m = statistics.median(xs)
                row["sides"][name] = {"median_us": m, "p10_us": pct(xs, 10), "p90_us": pct(xs, 90), "n": len(xs),
                                      "error_pct": (m - obs) / obs * 100,
                                      "round_errors_pct": [(e - r) / r * 100 for e, r in
                                                           zip(per_round[name], per_round["real"], strict=True)],
                                      "paired": paired(per_round[name], per_round["real"]).as_dict(),
                                      "in_spread": row["observed_p10_us"] <= m <= row["observed_p90_us"]}
            rows.append(row)
            print(format_rows([row]), file=sys.stderr)
    return rows


def _emulate_round(tb: Any, tmp: Path, ex: str, world: int, scenario: Path, warmup: int, steps: int,
                   sides: list[tuple[str, int, tuple[str, ...]]], rnd: int, emu: dict[str, list[float]],
                   per_round: dict[str, list[float]]) -> None:
    """One round's emulated sides, their iterations appended to ``emu`` and their medians to ``per_round``."""
    for i, (name, nodes, sets) in enumerate(sides):
        tag = f"emu-{ex}-{i}-{rnd}"
        got = (emulate_max_of_nodes(tb, tmp, tag, ex, world, scenario, warmup, steps - warmup)
               if name == MAX_OF_NODES else
               emulate_on(tb, tmp, tag, ex, world, nodes, scenario, warmup, steps - warmup, sets))
        emu[name] += got
        per_round[name].append(statistics.median(got))


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'example':<18} {'W':>2} {'real ms (p10-p90)':>22} {'side':<30} {'emulated ms (p10-p90)':>22} "
             f"{'err':>7}  per-round err       target |err| <= 5%, inside the spread"]
    for r in rows:
        o, lo, hi = (r[k] / 1e3 for k in ("observed_median_us", "observed_p10_us", "observed_p90_us"))
        for name, s in r["sides"].items():
            met = ("(no target: a diagnostic)" if name == MAX_OF_NODES else
                   "met" if abs(s["error_pct"]) <= 5 and s["in_spread"] else "NOT met")
            rounds = " ".join(f"{e:+.0f}%" for e in s["round_errors_pct"])
            real = f"{o:.2f} ({lo:.2f}-{hi:.2f})"
            emu = f"{s['median_us'] / 1e3:.2f} ({s['p10_us'] / 1e3:.2f}-{s['p90_us'] / 1e3:.2f})"
            lines.append(f"{r['example']:<18} {r['world']:>2} {real:>22} {name:<30} {emu:>22} "
                         f"{s['error_pct']:+6.1f}%  {rounds:<18}  {met}")
        for name, s in r["sides"].items():
            if "paired" in s:
                lines.append(f"  paired rounds, {name}: {Paired.from_dict(s['paired']).describe()}")
        lines.append(f"  real side: {r['nodes']}, 1 rank per node")
    return "\n".join(lines)
