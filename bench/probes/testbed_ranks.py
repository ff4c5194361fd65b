"""Run a bench's own worker as one rank per node of the namespace testbed, and read what each rank wrote.

For the probes beside it that time collectives themselves (``allgather_modes``, ``busy_sizes``, ``library_cpu``,
``stream_pair``; bench/README.md): each is a script that, run as ``SCRIPT --worker OUT ARGS...`` under torchrun,
joins a gloo group from torchrun's environment and writes ``OUT.rank<R>`` as JSON. :func:`run_worker_ranks` brings
up the testbed (:mod:`nbox_trace.testbed`, root), starts one torchrun per node (pinned, ``OMP_NUM_THREADS=1``),
waits, and returns the ranks' documents in rank order; the testbed and the files are gone after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_worker_ranks(script: Path, worker_args: Sequence[str], *, rate: str, port: int, timeout_s: float,
                     nodes: int = 2, cpu_share: float | None = None) -> list[Any]:
    """``script --worker OUT *worker_args`` as one rank on each of ``nodes`` testbed nodes joined by ``rate`` links
    (rendezvous on node 0's ``port``), each node ``cpu_share`` of one CPU by a cgroup quota where given; each rank's
    ``OUT.rank<R>`` document, in rank order. A rank that fails, or a run past ``timeout_s``, ends the bench."""
    from nbox_trace.testbed import Testbed

    with tempfile.TemporaryDirectory(prefix=f"nbox-{script.stem}-") as tmp, \
            Testbed(nodes, rate=rate, cpu_share=cpu_share) as tb:
        out = Path(tmp) / "worker.json"
        ep = f"{tb.node(0).addr}:{port}"
        procs = [tb.run_on(k, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                               "--nproc-per-node", "1", "--node-rank", str(k), "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", ep, "--rdzv-conf", f"is_host={int(k == 0)}", "--local-addr",
                               tb.node(k).addr, str(script.resolve()), "--worker", str(out), *worker_args],
                           {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **tb.node(k).env()},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in range(nodes)]
        if any(tb.wait_all(procs, timeout_s)):
            raise SystemExit(f"{script.name}: a rank failed")
        return [json.loads((Path(tmp) / f"worker.json.rank{r}").read_text()) for r in range(nodes)]
