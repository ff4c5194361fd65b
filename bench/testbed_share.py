"""Do the quota testbed's nodes compute as separate machines? (issue 59; ``nbox_trace.testbed.cpu``)

Each node of a testbed built with ``cpu_share=S`` runs the same fixed compute (``--work``: torch matmuls of
``--size``, one thread, the work a node of a full core finishes in about ``--work-s`` seconds), first one node
alone, then all ``--nodes`` at once, ``--rounds`` times interleaved. If the quota holds, a node takes as long
whatever the others do: the table gives, per case, the median wall time of a node's work (over nodes and rounds),
its p10-p90, its ratio to one node alone, and what the quota throttled. The last line is the speed a node of
share S has against a full core (alone, no quota: the same work run unconfined first).

    python bench/testbed_share.py --nodes 8 --share 0.25 --rounds 3

Needs root (namespaces, cgroups). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORK = """
import sys, time, torch
torch.set_num_threads(1)
n, reps = int(sys.argv[1]), int(sys.argv[2])
a = torch.randn(n, n); b = torch.randn(n, n)
for _ in range(3): a @ b
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(reps): a @ b
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _one(tb: object, nodes: list[int], size: int, reps: int) -> list[tuple[float, float]]:
    procs = [tb.run_on(k, [sys.executable, "-c", WORK, str(size), str(reps)],  # type: ignore[attr-defined]
                       {"OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in nodes]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=900)
        if p.returncode:
            raise SystemExit(f"testbed_share: a node failed: {e.decode()[-800:]}")
        wall, cpu = map(float, o.split())
        out.append((wall, cpu))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--period-us", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--work-s", type=float, default=0.5, help="seconds of the work on a full core")
    args = ap.parse_args(argv)
    from nbox_trace.testbed import Testbed

    # the work's size: timed unconfined once (one process, full core)
    probe = subprocess.run([sys.executable, "-c", WORK, str(args.size), "50"], capture_output=True, text=True,
                           env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, check=True)
    per_rep = float(probe.stdout.split()[0]) / 50
    reps = max(10, round(args.work_s / per_rep))
    full = float(subprocess.run([sys.executable, "-c", WORK, str(args.size), str(reps)], capture_output=True,
                                text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                                check=True).stdout.split()[0])
    alone: list[float] = []
    together: list[float] = []
    cpu_alone: list[float] = []
    cpu_together: list[float] = []
    with Testbed(args.nodes, cpu_share=args.share, cpu_period_us=args.period_us) as tb:
        for rnd in range(args.rounds):
            order = ("alone", "together") if rnd % 2 == 0 else ("together", "alone")
            for case in order:
                if case == "alone":
                    got = _one(tb, [rnd % args.nodes], args.size, reps)
                    alone += [w for w, _ in got]
                    cpu_alone += [c for _, c in got]
                else:
                    got = _one(tb, list(range(args.nodes)), args.size, reps)
                    together += [w for w, _ in got]
                    cpu_together += [c for _, c in got]
        throttled = [tb.quota.throttled(k) for k in range(args.nodes)] if tb.quota else []
    a = statistics.median(alone)
    print(f"testbed_share: {args.nodes} nodes of share {args.share:g} (cgroup quota, period {args.period_us} us), "
          f"{reps} matmuls of {args.size}x{args.size} per node ({full:.2f} s on a full core), {args.rounds} rounds")
    print(f"{'case':<24} {'wall s (median)':>15} {'p10-p90':>15} {'vs alone':>9} {'CPU s':>7} {'n':>4}")
    for case, xs, cs in (("one node alone", alone, cpu_alone), (f"all {args.nodes} at once", together, cpu_together)):
        m = statistics.median(xs)
        print(f"{case:<24} {m:15.3f} {f'{pct(xs, 10):.3f}-{pct(xs, 90):.3f}':>15} {m / a:8.3f}x "
              f"{statistics.median(cs):7.3f} {len(xs):4d}")
    print(f"a node of share {args.share:g} computes at {full / a:.3f} of a full core (the quota's {args.share:g}: "
          f"{full / a / args.share:.3f} of it)")
    if throttled:
        print("throttled periods per node: " + ", ".join(f"{t[1]}/{t[0]}" if t else "-" for t in throttled))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
