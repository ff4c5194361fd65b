"""Emulator-core figures: answer latency, backend overhead, delay precision, cost vs world size, calibration.

    python bench/emulator.py [--quick] [--no-calibration] [--json]

Prints one table per figure (medians, p99, spread) and the targets from the emulator-core issue:

1. time to answer one collective through the cost model (``Fabric.answer``): a size already priced on
   the group (a dictionary hit, the steady state of a training loop) and a size never seen (closed forms
   evaluated); target <= 5 us;
2. the backend path excluding the modeled delay: the ``dist.all_reduce(..., async_op=True)`` call on the
   ``nbox`` backend (1 real rank, W = 8) until it returns the work; target <= 20 us;
3. delay precision: ``|time wait() returned - modeled completion|`` for modeled delays of 50 us to 5 ms,
   through ``Work.wait()`` (sleep then spin) and through ``get_future().wait()`` (timer thread, no spin);
   target p50 <= 5 us, p99 <= 50 us;
4. the cost of answering at W = 8 ... 1,048,576 (should be flat);
   and a group shape never seen on 1,024 ranks with link contention (a torus of rings, one ring, the DGX
   example, whose ``library = "nccl"`` replays NCCL's channel search once per system shape: shown cached and
   not): ``make_pricer`` plus its first call, target <= 50 us (the membership scan ``group_shape``, once per
   process group, apart);
5. the calibrated model against measured gloo collectives on 2 ranks, 1 KiB - 64 MiB (bench/calibration.py),
   target: median |error| <= 10% on held-out sizes.

Timings are wall-clock on a shared machine: each figure is many repetitions; medians and percentiles are
reported, nothing is asserted beyond sanity.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator_core.pricing.answer import Fabric, FabricGroup  # noqa: E402
from emulator_core.scenario.files import SCENARIOS_DIR, load_scenario  # noqa: E402
from emulator_core.scenario.world import resize  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": statistics.median(xs), "p10": pct(xs, 10), "p90": pct(xs, 90), "p99": pct(xs, 99),
            "max": max(xs)}


def answer_times_us(fabric: Fabric, group: FabricGroup, collective: str, reps: int, new_size: bool) -> list[float]:
    """Time ``reps`` answers of ``collective`` on ``group``: the same 1 MiB each time, or a new size each time."""
    clock = time.perf_counter_ns
    out = []
    fabric.answer(group, collective, 1 << 20, (0.0, 0.0))
    for i in range(1, reps + 1):
        size = (1 << 20) + i if new_size else 1 << 20
        t0 = clock()
        fabric.answer(group, collective, size, (float(i), float(i)))
        out.append((clock() - t0) / 1000)
    return out


def bench_answer(reps: int) -> list[dict[str, Any]]:
    rows = []
    scenario = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 1024)
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        fabric = Fabric(scenario)
        group = fabric.group(None, [0, 1])
        for new_size, case in ((False, "size seen before"), (True, "new size")):
            rows.append({"collective": collective, "case": case,
                         **summary(answer_times_us(fabric, group, collective, reps, new_size))})
    return rows


def bench_world_sizes(reps: int) -> list[dict[str, Any]]:
    rows = []
    base = load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml")
    for w in (8, 64, 1024, 16384, 131072, 1048576):
        fabric = Fabric(resize(base, w))
        builds = []
        for _ in range(21):
            t0 = time.perf_counter_ns()
            group = fabric.group(None, [0, 1])
            builds.append((time.perf_counter_ns() - t0) / 1000)
        build_us = statistics.median(builds)
        rows.append({"world_size": w, "group_build_us": build_us,
                     **summary(answer_times_us(fabric, group, "all_reduce", reps, True))})
    return rows


def bench_new_shape(reps: int) -> list[dict[str, Any]]:
    """Price a group shape never seen (``make_pricer`` + its first call) on 1,024 ranks with link contention:
    a 32 x 32 torus of rings, a 1,024-rank ring, and the DGX example (8 x 128 switches); the membership scan
    (``group_shape``, once per process group) is timed apart."""
    from emulator_core.pricing.pricer import group_shape, make_pricer
    from emulator_core.scenario.model import Dimension, Scenario, Topology

    torus = Scenario(world_size=1024, topology=Topology((Dimension("x", 32, "ring", 400.0, 1.0),
                                                         Dimension("y", 32, "ring", 400.0, 1.0))))
    ring = Scenario(world_size=1024, topology=Topology((Dimension("r", 1024, "ring", 400.0, 1.0),)))
    dgx = resize(load_scenario(SCENARIOS_DIR / "dgx_h100_400g.toml"), 1024)
    rows = []
    for name, scenario in (("torus 32x32", torus), ("ring 1024", ring), ("dgx 8x128", dgx)):
        scans = []
        for _ in range(21):
            t0 = time.perf_counter_ns()
            shape = group_shape(scenario, range(1024))
            scans.append((time.perf_counter_ns() - t0) / 1000)
        for collective in ("all_reduce", "all_to_all", "all_gather"):
            times = []
            for i in range(reps):
                t0 = time.perf_counter_ns()
                make_pricer(scenario, collective, shape)((1 << 20) + i)
                times.append((time.perf_counter_ns() - t0) / 1000)
            rows.append({"topology": name, "collective": collective, "group_shape_us": statistics.median(scans),
                         **summary(times)})
    from emulator_core.pricing import nccl_tuner

    shape = group_shape(dgx, range(1024))
    first = []
    for i in range(max(1, reps // 4)):
        nccl_tuner._graphs.cache_clear()  # a system shape never seen: NCCL's channel search replayed
        t0 = time.perf_counter_ns()
        make_pricer(dgx, "all_reduce", shape)((1 << 20) + i)
        first.append((time.perf_counter_ns() - t0) / 1000)
    rows.append({"topology": "dgx 8x128, NCCL search not cached", "collective": "all_reduce",
                 "group_shape_us": statistics.median(scans), **summary(first)})
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_backend(reps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                      NBOX_WORLD_SIZE="8")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("nbox")
    pg: Any = dist.group.WORLD
    x = torch.ones(256)
    opts = dist.AllreduceOptions()
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def compute_until(deadline_ns: int) -> None:  # the script computing while the collective is in flight
        while time.perf_counter_ns() < deadline_ns:
            torch.mm(a, b)

    rows: dict[tuple[str, str], list[float]] = {}
    for i in range(reps):
        busy = i % 2 == 0
        for name, issue in (("dist.all_reduce(async_op=True) (torch's wrapper + backend)",
                             lambda: dist.all_reduce(x, async_op=True)),
                            ("NboxProcessGroup.allreduce (the backend alone)", lambda: pg.allreduce([x], opts))):
            t0 = time.perf_counter_ns()
            work = issue()
            rows.setdefault((name, "computing" if busy else "idle (waited)"), []).append(
                (time.perf_counter_ns() - t0) / 1000)
            assert work is not None
            if busy:
                compute_until(pg.records[-1].end_us * 1000 + 100_000)
            work.wait()
    call_rows = [{"path": name, "before the call": state, **summary(v)} for (name, state), v in rows.items()]
    wait_err: list[float] = []
    fut_err: list[float] = []
    modeled: list[float] = []
    tensors = [torch.ones(n) for n in (256, 16384, 131072, 524288)]  # 1 KiB .. 2 MiB of float32
    for i in range(reps):
        t = tensors[i % len(tensors)]
        work = dist.all_reduce(t, async_op=True)
        assert work is not None
        work.wait()
        done = time.perf_counter_ns() / 1000
        rec = pg.records[-1]
        wait_err.append(abs(done - rec.end_us))
        modeled.append(rec.end_us - rec.issue_us)
        work = dist.all_reduce(t, async_op=True)
        assert work is not None
        work.get_future().wait()
        done = time.perf_counter_ns() / 1000
        fut_err.append(abs(done - pg.records[-1].end_us))
        t.fill_(1.0)
    dist.destroy_process_group()
    span = f"modeled delays {min(modeled):.0f}-{max(modeled):.0f} us"
    precision = [{"path": "Work.wait() (sleep + spin)", "delays": span, **summary(wait_err)},
                 {"path": "get_future().wait() (timer thread)", "delays": span, **summary(fut_err)}]
    return call_rows, precision


def bench_calibration(quick: bool) -> list[dict[str, Any]]:
    path = ROOT / "bench" / "calibration.py"
    spec = importlib.util.spec_from_file_location("nbox_bench_calibration", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows: list[dict[str, Any]] = mod.run(nproc=2, quick=quick) if quick else mod.run(nproc=2)
    print(mod.format_table(rows), file=sys.stderr)
    return rows


def table(title: str, rows: list[dict[str, Any]], keys: list[str]) -> str:
    lines = [title, "  " + " | ".join(f"{k:>14}" for k in keys)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k, "")
            cells.append(f"{v:>14.2f}" if isinstance(v, float) else f"{v!s:>14}")
        lines.append("  " + " | ".join(cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--no-calibration", action="store_true", help="skip the 2-rank gloo calibration figure")
    ap.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = ap.parse_args()
    reps = 2000 if args.quick else 20000
    doc: dict[str, Any] = {"machine": f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}"}
    doc["answer_us"] = bench_answer(reps)
    doc["world_size_us"] = bench_world_sizes(reps // 4)
    doc["new_shape_us"] = bench_new_shape(reps // 20)
    doc["backend_call_us"], doc["delay_error_us"] = bench_backend(reps // 20 if args.quick else reps // 10)
    if not args.no_calibration:
        doc["calibration"] = bench_calibration(args.quick)
    cols = ["p50", "p10", "p90", "p99", "max"]
    out = [
        table("1. answer one collective through the cost model (us; target p50 <= 5)", doc["answer_us"],
              ["collective", "case", *cols]),
        table("2. backend call path, modeled delay excluded (us; target p50 <= 20)", doc["backend_call_us"],
              ["path", "before the call", *cols]),
        table("3. delay precision |returned - modeled completion| (us; target p50 <= 5, p99 <= 50)",
              doc["delay_error_us"], ["path", *cols, "delays"]),
        table("4. answering cost vs world size (new size each call, us; flat is the target)", doc["world_size_us"],
              ["world_size", "group_build_us", "p50", "p99"]),
        table("5. a new group shape on 1,024 ranks with link contention: make_pricer + first call (us; target "
              "p50 <= 50)", doc["new_shape_us"], ["topology", "collective", "group_shape_us", *cols]),
    ]
    print("\n\n".join(out), file=sys.stderr)
    if args.json:
        print(json.dumps(doc))


if __name__ == "__main__":
    main()
