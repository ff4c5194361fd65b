"""Does the testbed's tbf bucket split GSO packets, and what does that cost the receiving node? (issue 59)

    flock /tmp/nbox-ranks.lock python bench/probes/tbf_gso.py [--share 0.25] [--mib 32] [--reps 5]

Raw TCP (no torch, no gloo; worker: ``tbf_gso_worker.py`` beside it) on two testbeds, each built with tbf's bucket at
the old default (64 KiB, which a 64 KiB GSO packet with its segments' headers exceeds) and at this code's default:
two racks of 2 behind a 500 Mb/s uplink (the what-if table's ``racks2``) and two nodes on 250 Mb/s links (its
``link4``); and the same 4 nodes on one switch at 1 Gb/s as the reference the racks' ratio is taken against. Per
traffic pattern: the median over repetitions of the slowest node's time, the rate that makes, and each node's CPU
seconds over all repetitions. Nothing is asserted. Needs root. Findings: docs/design/testbed.md, "tbf's bucket
and GSO".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity_testbed import on_nodes  # noqa: E402

OLD_MIN_BURST_BYTES = 64 * 1024
MIB = 1 << 20


def _run(tb: Any, tmp: Path, nbytes: int, reps: int, pattern: str) -> tuple[float, list[float]]:
    subnet = tb.node(0).addr.rsplit(".", 1)[0]
    worker = str(Path(__file__).with_name("tbf_gso_worker.py"))
    outs = on_nodes(tb, tmp, "tbf_gso", lambda k: [sys.executable, worker, str(k), str(len(tb.nodes)), subnet,
                                                  str(nbytes), str(reps), pattern])
    docs = [json.loads(o) for o in outs]
    slowest = [max(d["times_s"][r] for d in docs) for r in range(reps)]
    return statistics.median(slowest), [d["cpu_s"] for d in docs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--share", type=float, default=0.25, help="each node's fraction of one CPU (0: no quota)")
    ap.add_argument("--mib", type=int, default=32, help="MiB each sender moves per repetition")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    from nbox_trace.testbed import Testbed, namespaces

    share = args.share or None
    default_min = namespaces.MIN_BURST_BYTES
    nbytes = args.mib * MIB
    settings: list[tuple[str, dict[str, Any], list[str]]] = [
        ("4 nodes, 1 switch, 1 Gb/s", {"nodes": 4}, ["ring"]),
        ("racks of 2, 500 Mb/s uplink", {"nodes": 4, "racks": 2, "uplink_rate": "500mbit"},
         ["ring", "1-2", "1-2,3-0", "0-1"]),
        ("2 nodes, 250 Mb/s", {"nodes": 2, "rate": "250mbit"}, ["ring"]),
    ]
    print("| testbed | minimum bucket | pattern | median ms | Mb/s per flow | CPU s per node |")
    print("|---|---|---|---|---|---|")
    for name, kw, patterns in settings:
        for old in (True, False):
            if old and "racks" not in kw and "rate" not in kw:
                continue  # the 1 Gb/s reference: 1 ms there (125 KB) exceeds a GSO packet under either rule
            # the old rule: 1 ms at the link's rate, at least 64 KiB (1 Gb/s links keep their 125 KB)
            namespaces.MIN_BURST_BYTES = OLD_MIN_BURST_BYTES if old else default_min
            try:
                with Testbed(cpu_share=share, **{"rate": "1gbit", **kw}) as tb, \
                        tempfile.TemporaryDirectory(prefix="nbox-tbf-gso-") as tmp:
                    for pattern in patterns:
                        med, cpu = _run(tb, Path(tmp), nbytes, args.reps, pattern)
                        print(f"| {name} | {'old, 64 KiB' if old else 'this code'} | {pattern} | {med * 1e3:.1f} | "
                              f"{nbytes * 8 / med / 1e6:.0f} | {' '.join(f'{c:.2f}' for c in cpu)} |", flush=True)
            finally:
                namespaces.MIN_BURST_BYTES = default_min
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
