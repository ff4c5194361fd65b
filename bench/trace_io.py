#!/usr/bin/env python
"""Benchmark nbox's Chakra ET codec: encode and decode throughput, and decode peak memory.

Run from the repository root::

    python bench/trace_io.py                 # 1,000,000 nodes, 5 repeats, plain-text table
    python bench/trace_io.py --nodes 200000 --repeats 3 --json

What is measured:

* ENCODE: time spent inside ``EtWriter.write_all`` on pre-built batches of nodes (node
  construction is *not* counted); the writer's ``close`` (final flush, fsync, rename) is timed
  separately and reported beside it.
* DECODE: one full streaming pass of ``EtReader`` over the file written above (warm page cache),
  touching every node (counting node types and summing ``duration_micros``); opening the reader
  is included.
* PEAK MEMORY: the decode run in a fresh interpreter (``sys.executable -c ...``); reported as its
  peak RSS (``ru_maxrss``) minus its RSS right after imports, for the N-node file and for an
  N/10-node file, to show that memory does not grow with the file size.

Only sanity is asserted (counts and checksums round-trip), never a timing. Timings on a shared
machine are noisy: look at the spread, not only the median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import google.protobuf  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402

from nbox_trace.chakra import et_def_pb2 as pb  # noqa: E402
from nbox_trace.chakra.attrs import make_attr  # noqa: E402
from nbox_trace.chakra.codec import EtReader, EtWriter  # noqa: E402

TARGET_NODES_PER_S = 500_000
TARGET_PEAK_BYTES = 100 * 1000 * 1000
MEMORY_SLACK_BYTES = 5 * 1000 * 1000
COMM_EVERY = 20

# (name, op_schema, input types); shapes are generated per node from the batch/hidden sizes.
_OPS: list[tuple[str, str, str]] = [
    ("aten::addmm",
     "aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
     '["Tensor(float)", "Tensor(float)", "Tensor(float)", "Int", "Int"]'),
    ("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor",
     '["Tensor(float)", "Tensor(float)"]'),
    ("aten::linear", "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
     '["Tensor(float)", "Tensor(float)", "Tensor(float)"]'),
    ("aten::t", "aten::t(Tensor(a) self) -> Tensor(a)", '["Tensor(float)"]'),
    ("aten::relu", "aten::relu(Tensor self) -> Tensor", '["Tensor(float)"]'),
    ("aten::add_",
     "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
     '["Tensor(float)", "Tensor(float)", "Int"]'),
    ("aten::native_layer_norm",
     "aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, "
     "float eps) -> (Tensor, Tensor, Tensor)",
     '["Tensor(float)", "GenericList[Int]", "Tensor(float)", "Tensor(float)", "Double"]'),
    ("aten::_softmax", "aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
     '["Tensor(float)", "Int", "Bool"]'),
    ("aten::view", "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
     '["Tensor(float)", "GenericList[Int,Int]"]'),
    ("aten::empty",
     "aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
     "Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
     '["GenericList[Int,Int]", "Int", "Int", "Device", "Bool", "None"]'),
    ("aten::copy_", "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)",
     '["Tensor(float)", "Tensor(float)", "Bool"]'),
    ("aten::mul", "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
     '["Tensor(float)", "Tensor(float)"]'),
    ("aten::sum", "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, "
     "ScalarType? dtype=None) -> Tensor",
     '["Tensor(float)", "GenericList[Int]", "Bool", "None"]'),
    ("AddmmBackward0", "", '["Tensor(float)"]'),
    ("autograd::engine::evaluate_function: AddmmBackward0", "", '["Tensor(float)"]'),
]
_COMM = [  # (name, CollectiveCommType)
    ("nccl:all_reduce", pb.ALL_REDUCE),
    ("nccl:all_gather", pb.ALL_GATHER),
    ("nccl:reduce_scatter", pb.REDUCE_SCATTER),
    ("nccl:broadcast", pb.BROADCAST),
]


@dataclass
class GenStats:
    """What the generator produced, to check the decode against."""

    nodes: int = 0
    types: dict[int, int] = field(default_factory=dict)
    duration_sum: int = 0


MIXES = ("recorded", "compact")


def node_batches(n: int, batch: int, seed: int = 1, stats: GenStats | None = None,
                 mix: str = "recorded") -> Iterator[list[pb.Node]]:
    """Yield ``n`` nodes in lists of ``batch`` (only one batch alive at a time).

    ``recorded``: shaped like a PyTorch recording (op_schema, shapes, types, rf_id; ~270 B/node).
    ``compact``: shaped like ASTRA-sim / Chakra text-converter workloads (name, deps, duration,
    is_cpu_op, comm attributes; ~45 B/node).
    """
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
    rng = random.Random(seed)
    schema_attrs = {name: make_attr("op_schema", schema) for name, schema, _ in _OPS if schema}
    cpu_true = make_attr("is_cpu_op", True)
    cpu_false = make_attr("is_cpu_op", False)
    pg_names = ["0", "1", "2", "3"]
    t = 1_700_000_000_000_000 // 1000  # start_time_micros
    parent = 0
    out: list[pb.Node] = []
    for nid in range(n):
        if mix == "compact":
            dur = rng.randint(1, 400)
            if nid % COMM_EVERY == COMM_EVERY - 1:
                ctype = _COMM[(nid // COMM_EVERY) % len(_COMM)][1]
                node = pb.Node(id=nid, name=f"COMM_COLL_NODE_{nid}", type=pb.COMM_COLL_NODE,
                               data_deps=[nid - 1], duration_micros=dur,
                               attr=[cpu_false, make_attr("comm_type", int(ctype)),
                                     make_attr("comm_size", rng.choice((4, 8, 16)) << 20)])
            else:
                node = pb.Node(id=nid, name=f"COMP_NODE_{nid}", type=pb.COMP_NODE, duration_micros=dur,
                               data_deps=[nid - 1] if nid else [], attr=[cpu_true])
        elif nid % COMM_EVERY == COMM_EVERY - 1:
            name, ctype = _COMM[(nid // COMM_EVERY) % len(_COMM)]
            size = rng.choice((4, 8, 16, 25, 64)) << 20
            dur = rng.randint(50, 5000)
            node = pb.Node(
                id=nid, name=name, type=pb.COMM_COLL_NODE, start_time_micros=t, duration_micros=dur,
                data_deps=[nid - 1],
                inputs=pb.IOInfo(shapes=f"[[{size // 4}]]", types='["Tensor(float)"]'),
                outputs=pb.IOInfo(shapes=f"[[{size // 4}]]", types='["Tensor(float)"]'),
                attr=[cpu_false, make_attr("comm_type", int(ctype)), make_attr("comm_size", size),
                      make_attr("pg_name", rng.choice(pg_names))],
            )
        else:
            name, _schema, types = _OPS[rng.randrange(len(_OPS))]
            b = rng.choice((8, 16, 32, 64, 128))
            h = rng.choice((256, 512, 768, 1024, 4096))
            o = rng.choice((256, 512, 1024, 4096))
            dur = rng.randint(1, 400)
            attrs = [cpu_true if rng.random() < 0.7 else cpu_false]
            sa = schema_attrs.get(name)
            if sa is not None:
                attrs.append(sa)
            attrs.append(make_attr("rf_id", nid * 3 + 7))
            node = pb.Node(
                id=nid, name=name, type=pb.COMP_NODE, start_time_micros=t, duration_micros=dur,
                data_deps=[nid - 1] if nid else [],
                ctrl_deps=[parent] if nid and rng.random() < 0.3 else [],
                inputs=pb.IOInfo(shapes=f"[[{o}], [{b}, {h}], [{h}, {o}], [], []]", types=types),
                outputs=pb.IOInfo(shapes=f"[[{b}, {o}]]", types='["Tensor(float)"]'),
                attr=attrs,
            )
            if rng.random() < 0.1:
                parent = nid
        t += dur + rng.randint(0, 20)
        if stats is not None:
            stats.nodes += 1
            stats.types[node.type] = stats.types.get(node.type, 0) + 1
            stats.duration_sum += dur
        out.append(node)
        if len(out) == batch:
            yield out
            out = []
    if out:
        yield out


def metadata() -> pb.GlobalMetadata:
    return pb.GlobalMetadata(version="0.0.4", attr=[make_attr("schema", "1.1.1-chakra.0.0.4")])


def encode_once(path: Path, n: int, batch: int, mix: str = "recorded") -> tuple[float, float, GenStats]:
    """Write ``n`` nodes; return (seconds inside write_all, seconds in close, what was written)."""
    stats = GenStats()
    inside = 0.0
    clock = time.perf_counter
    with EtWriter(path, metadata()) as writer:
        for nodes in node_batches(n, batch, stats=stats, mix=mix):
            t0 = clock()
            writer.write_all(nodes)
            inside += clock() - t0
        t0 = clock()
        writer.close()
        closing = clock() - t0
    assert writer.nodes_written == n == stats.nodes, (writer.nodes_written, n, stats.nodes)
    return inside, closing, stats


def decode_once(path: Path) -> tuple[float, dict[int, int], int, int]:
    """One streaming pass; return (seconds, type counts, duration sum, zero-length messages)."""
    clock = time.perf_counter
    t0 = clock()
    counts = [0] * 16
    dsum = 0
    with EtReader(path) as reader:
        for node in reader:
            counts[node.type] += 1
            dsum += node.duration_micros
        zero = len(reader.zero_length_messages)
    elapsed = clock() - t0
    return elapsed, {i: c for i, c in enumerate(counts) if c}, dsum, zero


_MEM_CODE = r"""
import json, resource, sys
sys.path.insert(0, {root!r})
from nbox_trace.chakra.codec import EtReader
import gc
gc.collect()
def rss_now():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None
base_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base_now = rss_now()
n = 0
with EtReader({path!r}) as reader:
    for node in reader:
        n += node.type > 0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hwm = None
try:
    with open("/proc/self/status") as f:
        hwm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(json.dumps({{"nodes": n, "base_peak": base_peak, "base_now": base_now, "peak": peak, "vm_hwm": hwm}}))
"""


def decode_memory(path: Path) -> dict[str, Any]:
    """Decode ``path`` in a fresh interpreter and return its RSS figures (bytes)."""
    code = _MEM_CODE.format(root=str(ROOT), path=str(path))
    argv = [sys.executable, "-c", code]
    if os.name == "posix" and os.path.exists("/bin/sh"):
        # A child spawned straight from this (big) process inherits its peak RSS at exec: Linux
        # folds the old address space's high-water mark into ru_maxrss. Let a small shell fork it
        # (two commands, so the shell cannot exec in place) to get a clean ru_maxrss.
        argv = ["/bin/sh", "-c", '"$0" "$@"; exit $?', *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["baseline"] = out["base_now"] if out["base_now"] is not None else out["base_peak"]
    out["delta"] = out["peak"] - out["baseline"]
    return out


def protobuf_floor(path: Path, sample: int, repeats: int) -> dict[str, Any]:
    """Reference only: bare protobuf cost per node, without nbox's framing, checks or I/O.

    Reads up to ``sample`` node payloads of ``path`` into memory, then times ``Node.FromString``
    on each and ``SerializeToString`` on the parsed nodes. Shows how much of the encode/decode
    time is protobuf itself (the part the codec cannot make faster in Python).
    """
    payloads: list[bytes] = []
    with EtReader(path) as reader:
        for node in reader:
            payloads.append(node.SerializeToString())
            if len(payloads) == sample:
                break
    parse = pb.Node.FromString
    nodes = [parse(p) for p in payloads]
    clock = time.perf_counter
    parse_rates, ser_rates = [], []
    for _ in range(repeats):
        t0 = clock()
        for p in payloads:
            parse(p)
        parse_rates.append(len(payloads) / (clock() - t0))
        t0 = clock()
        for node in nodes:
            node.SerializeToString()
        ser_rates.append(len(nodes) / (clock() - t0))
    return {"sample_nodes": len(payloads), "parse_nodes_per_s": summarize(parse_rates),
            "serialize_nodes_per_s": summarize(ser_rates)}


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "protobuf": google.protobuf.__version__,
        "protobuf_api": api_implementation.Type(),
    }


def run(n: int, repeats: int, batch: int, progress: bool, mix: str = "recorded") -> dict[str, Any]:
    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    result: dict[str, Any] = {"machine": machine(), "nodes": n, "repeats": repeats, "batch": batch, "mix": mix}
    with tempfile.TemporaryDirectory(prefix="nbox-bench-") as tmp:
        big = Path(tmp) / "bench.0.et"
        enc_rates, close_s, enc_s = [], [], []
        stats = GenStats()
        for r in range(repeats):
            inside, closing, stats = encode_once(big, n, batch, mix)
            enc_s.append(inside)
            enc_rates.append(n / inside)
            close_s.append(closing)
            say(f"encode {r + 1}/{repeats}: {n / inside:,.0f} nodes/s (close {closing * 1000:.1f} ms)")
        size = big.stat().st_size
        result["file"] = {"bytes": size, "bytes_per_node": size / n,
                          "comm_nodes": stats.types.get(pb.COMM_COLL_NODE, 0),
                          "comp_nodes": stats.types.get(pb.COMP_NODE, 0)}
        result["encode"] = {"nodes_per_s": summarize(enc_rates), "seconds": summarize(enc_s),
                            "close_seconds": summarize(close_s),
                            "counted": "time inside EtWriter.write_all on pre-built batches; node construction "
                                       "excluded; close (flush+fsync+rename) reported separately"}

        dec_rates, dec_s = [], []
        for r in range(repeats):
            elapsed, counts, dsum, zero = decode_once(big)
            # Sanity only: everything written comes back.
            assert sum(counts.values()) == n, (sum(counts.values()), n)
            assert counts == stats.types, (counts, stats.types)
            assert dsum == stats.duration_sum, (dsum, stats.duration_sum)
            assert zero == 0, zero
            dec_s.append(elapsed)
            dec_rates.append(n / elapsed)
            say(f"decode {r + 1}/{repeats}: {n / elapsed:,.0f} nodes/s")
        result["decode"] = {"nodes_per_s": summarize(dec_rates), "seconds": summarize(dec_s),
                            "counted": "EtReader open + full streaming iteration, counting node types and "
                                       "summing duration_micros (warm page cache)"}

        result["protobuf_floor"] = protobuf_floor(big, min(n, 100_000), repeats)

        small_n = max(1, n // 10)
        small = Path(tmp) / "bench-small.0.et"
        encode_once(small, small_n, batch, mix)
        mem = {}
        for label, path, count in (("large", big, n), ("small", small, small_n)):
            m = decode_memory(path)
            assert m["nodes"] == count, (m["nodes"], count)
            m["file_nodes"] = count
            m["file_bytes"] = path.stat().st_size
            mem[label] = m
            say(f"memory {label} ({count:,} nodes): peak {m['peak'] / 1e6:.1f} MB, +{m['delta'] / 1e6:.2f} MB")
        result["decode_memory"] = mem
        result["bench_process_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["targets"] = {
        "encode_nodes_per_s": TARGET_NODES_PER_S,
        "decode_nodes_per_s": TARGET_NODES_PER_S,
        "decode_peak_bytes": TARGET_PEAK_BYTES,
        "encode_met": result["encode"]["nodes_per_s"]["median"] >= TARGET_NODES_PER_S,
        "decode_met": result["decode"]["nodes_per_s"]["median"] >= TARGET_NODES_PER_S,
        # "Independent of file size": the 10x larger file must not need more than 5 MB more.
        "memory_met": all(m["peak"] < TARGET_PEAK_BYTES for m in mem.values())
        and mem["large"]["delta"] - mem["small"]["delta"] < MEMORY_SLACK_BYTES,
    }
    return result


def _fmt_rate(s: dict[str, float]) -> str:
    return f"{s['median']:>12,.0f}  {s['min']:>12,.0f} - {s['max']:<12,.0f}"


def print_table(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(f"machine:  {m['platform']} ({m['machine']}), {m['cpu_count']} CPUs")
    print(f"python:   {m['python']} ({m['python_implementation']}); protobuf {m['protobuf']} "
          f"(api_implementation {m['protobuf_api']})")
    f = res["file"]
    print(f"trace:    {res['mix']} mix, {res['nodes']:,} nodes ({f['comp_nodes']:,} COMP_NODE, "
          f"{f['comm_nodes']:,} COMM_COLL_NODE), "
          f"{f['bytes']:,} bytes = {f['bytes'] / 1e6:.1f} MB, {f['bytes_per_node']:.1f} bytes/node")
    print(f"repeats:  {res['repeats']} (median, min - max)")
    print()
    t = res["targets"]
    print(f"{'measure':<10}{'median':>14}  {'min - max':>27}  {'target':>12}  met")
    print(f"{'encode':<10}{_fmt_rate(res['encode']['nodes_per_s'])}  {'>= 500,000':>12}  "
          f"{'yes' if t['encode_met'] else 'NO'}   nodes/s")
    print(f"{'decode':<10}{_fmt_rate(res['decode']['nodes_per_s'])}  {'>= 500,000':>12}  "
          f"{'yes' if t['decode_met'] else 'NO'}   nodes/s")
    fl = res["protobuf_floor"]
    print(f"{'(floor)':<10}parse only {fl['parse_nodes_per_s']['median']:,.0f} nodes/s, serialize only "
          f"{fl['serialize_nodes_per_s']['median']:,.0f} nodes/s: bare protobuf on {fl['sample_nodes']:,} "
          "in-memory nodes, no framing/checks/I/O")
    print()
    print(f"encode:   {res['encode']['counted']}.")
    cs = res["encode"]["close_seconds"]
    es = res["encode"]["seconds"]
    print(f"          write_all total {es['median']:.3f} s; close {cs['median'] * 1000:.1f} ms "
          f"(min {cs['min'] * 1000:.1f}, max {cs['max'] * 1000:.1f})")
    ds = res["decode"]["seconds"]
    print(f"decode:   {res['decode']['counted']}; {ds['median']:.3f} s per pass.")
    print()
    print("decode peak memory (fresh interpreter; delta = peak RSS - RSS after imports):")
    print(f"  {'file':<28}{'after imports':>15}{'peak RSS':>12}{'delta':>12}{'VmHWM':>12}")
    for label in ("large", "small"):
        mm = res["decode_memory"][label]
        desc = f"{mm['file_nodes']:,} nodes, {mm['file_bytes'] / 1e6:.1f} MB"
        base = mm["baseline"]
        hwm = f"{mm['vm_hwm'] / 1e6:>9.1f} MB" if mm.get("vm_hwm") else f"{'n/a':>12}"
        print(f"  {desc:<28}{base / 1e6:>12.1f} MB{mm['peak'] / 1e6:>9.1f} MB{mm['delta'] / 1e6:>9.2f} MB{hwm}")
    print("  (MB = 10^6 bytes; VmHWM from /proc/self/status cross-checks ru_maxrss)")
    print(f"  target: peak < 100 MB, and the 10x larger file adds < 5 MB: {'yes' if t['memory_met'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000, help="nodes in the trace (default 1,000,000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats of encode and decode (default 5)")
    ap.add_argument("--batch", type=int, default=10_000, help="nodes per write_all call (default 10,000)")
    ap.add_argument("--mix", choices=MIXES, default="recorded",
                    help="node shapes: 'recorded' (PyTorch-like, ~270 B/node) or 'compact' (ASTRA-sim-like)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.nodes < 10 or args.repeats < 1 or args.batch < 1:
        ap.error("--nodes must be >= 10, --repeats and --batch >= 1")
    res = run(args.nodes, args.repeats, args.batch, progress=not args.quiet, mix=args.mix)
    if args.json:
        json.dump(res, sys.stdout, indent=2)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
