"""Where replay loses time on the namespace testbed (issue 15, item 5): measured sizes of candidate causes.

    flock /tmp/nbox-ranks.lock python bench/probes/testbed_causes.py --scenario CAL.toml [--sizes 1181952,526336]
                                  [--cpu-bytes 1638400]

Two nodes x one rank, pinned, 1 Gb/s. Prints, per all-reduce size (default: ddp_mlp's two DDP buckets), gloo's
median time alone and the scenario's price (``nbox scenario cost``); the buckets issued together (as DDP does:
gloo runs them on its worker threads at once) against the model's serialized sum; and a matmul loop's time
alone and while a 16 MiB all-reduce is in flight (gloo's CPU cost on the rank's one core); and what one
all_gather, reduce_scatter and all_reduce of ``--cpu-bytes`` (the full buffer; default 1.6 MB, about one
fsdp2_transformer block) cost in wall time and in the rank process's own CPU time (all its threads, user +
system; the kernel's TCP work done in softirq on either core is not in it, so it is a lower bound); and the
same calls' wall time on an idle core and while a thread of the rank computes on it (a collective slowed by
compute on its core, which the calibration, timed on an idle core, does not see); when an async all_reduce
completes (gloo's completion callback) if its rank waits at once, computes past the call's end, or only its peer
computes (whether a member's compute holds back a gloo collective, which needs every member's threads).
Medians are the slower rank's, except ``peer``: the waiting rank's.

A probe (bench/README.md; its worker: ``testbed_causes_worker.py`` beside it). Its findings: the profiler's
inflation, gloo's CPU cost and the buckets issued together in docs/journal/2026-11-23.md, "Replay fidelity on the
two-node testbed: earlier runs"; the later sizes in docs/journal/2026-11-24.md ("Runs B and B0", "Emulate, runs
R to T") and docs/journal/2026-11-27.md ("A collective beside its members' compute"); the rules they justify in
docs/journal/earlier.md, "Moved from the code's docstrings".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity_testbed import pct  # noqa: E402


def price(scenario: Path, size: int) -> float:
    out = subprocess.run([sys.executable, "-m", "nbox", "scenario", "cost", "all_reduce", "--bytes", str(size),
                          "--what-if", str(scenario), "--json"], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    doc = json.loads(out.stdout)
    return float(next(a["time_us"] for a in doc["algorithms"] if a["algorithm"] == doc["auto"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, required=True)
    ap.add_argument("--sizes", default="1181952,526336")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--gloo-loop", choices=("batch", "default"), default="batch",
                    help="gloo's device-loop threads at SCHED_BATCH (the testbed's default) or the kernel's default")
    ap.add_argument("--cpu-bytes", type=int, default=1638400)
    args = ap.parse_args()
    from nbox_trace.testbed.namespaces import Testbed

    sizes = [int(s) for s in args.sizes.split(",")]
    batch = args.gloo_loop == "batch"
    with tempfile.TemporaryDirectory(prefix="nbox-causes-") as tmp, \
            Testbed(2, rate=args.rate, gloo_loop_batch=batch) as tb:
        out = Path(tmp) / "causes.json"
        ep = f"{tb.node(0).addr}:29491"
        procs = [tb.run_on(k, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                               "1", "--node-rank", str(k), "--rdzv-backend", "c10d", "--rdzv-endpoint", ep,
                               "--rdzv-conf", f"is_host={int(k == 0)}", "--local-addr", tb.node(k).addr,
                               str(Path(__file__).resolve().parent / "testbed_causes_worker.py"), str(out), args.sizes,
                               str(args.reps), str(args.cpu_bytes)], {"OMP_NUM_THREADS": "1", **tb.node(k).env()},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in range(2)]
        if any(tb.wait_all(procs, 500)):
            raise SystemExit("a rank failed")
        docs = [json.loads((Path(tmp) / f"causes.json.rank{r}").read_text()) for r in range(2)]
    med = {k: max(d[k] for d in docs) for k in docs[0] if k != "raw"}
    print(f"{'all_reduce bytes':>16} {'gloo alone ms':>13} {'model ms':>9} {'model err':>9}")
    model_sum = 0.0
    for s in sizes:
        m = price(args.scenario, s)
        model_sum += m
        alone = med[f"alone_{s}"]
        print(f"{s:>16} {alone / 1e3:13.2f} {m / 1e3:9.2f} {(m - alone) / alone * 100:+8.1f}%")
    wire = sum(sizes) * 8 / 0.95e9 * 1e6
    print(f"together (async, as DDP): gloo {med['together'] / 1e3:.2f} ms; model (serialized sum) "
          f"{model_sum / 1e3:.2f} ms ({(model_sum - med['together']) / med['together'] * 100:+.1f}%); "
          f"wire at 0.95 Gb/s {wire / 1e3:.2f} ms")
    print(f"200 x mm(32x512, 512x512): alone {med['mm_alone'] / 1e3:.2f} ms, during a 16 MiB all_reduce "
          f"{med['mm_during_comm'] / 1e3:.2f} ms ({(med['mm_during_comm'] / med['mm_alone'] - 1) * 100:+.0f}%)")
    print(f"one call of {args.cpu_bytes} bytes (full buffer), medians; CPU = the rank process's, all threads")
    print(f"{'collective':>16} {'wall ms':>9} {'CPU ms':>8} {'CPU ns/byte':>12}")
    for name in ("all_gather", "reduce_scatter", "all_reduce"):
        cpu = med[f"{name}_cpu"]
        print(f"{name:>16} {med[f'{name}_wall'] / 1e3:9.2f} {cpu / 1e3:8.2f} {cpu * 1e3 / args.cpu_bytes:12.2f}")
    print(f"one call of {args.cpu_bytes} bytes on an idle core and beside a thread computing on it, medians")
    print(f"{'collective':>16} {'idle ms':>9} {'busy ms':>9} {'slower':>7}")
    for name in ("all_gather", "reduce_scatter", "all_reduce"):
        idle, busy = med[f"{name}_idle"], med[f"{name}_busy"]
        print(f"{name:>16} {idle / 1e3:9.2f} {busy / 1e3:9.2f} {(busy / idle - 1) * 100:+6.0f}%")
    raw = [d["raw"] for d in docs]
    print("an async all_reduce's completion (issue -> gloo's callback), ms, median (p10-p90) over the calls:")
    print(f"{'bytes':>10} {'compute ms':>10} {'rank waits':>20} {'rank computes':>20} {'peer computes':>20}")
    for n in (65536, 262144, 1048576):
        cells = []
        for mode in ("idle", "self", "peer"):
            xs = raw[1][f"done_{mode}_{n}"] if mode == "peer" else \
                [max(v) for v in zip(raw[0][f"done_{mode}_{n}"], raw[1][f"done_{mode}_{n}"], strict=True)]
            cells.append(f"{pct(xs, 50) / 1e3:6.2f} ({pct(xs, 10) / 1e3:.2f}-{pct(xs, 90) / 1e3:.2f})")
        print(f"{n:>10} {8.0 if n < 1_000_000 else 12.0:>10.1f} " + " ".join(f"{c:>20}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
