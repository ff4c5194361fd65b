"""Recognize collectives in a host ET and gather their facts from the three sources nbox knows.

A collective shows up in a host ET as a ``c10d::<op>`` operator (``c10d::allreduce_``,
``c10d::_allgather_base_``, ``c10d::send``...; functional collectives as ``_c10d_functional::<op>``),
with, under NCCL, a ``record_param_comms`` node inside it that PyTorch fills with the collective's
parameters, and a ``nccl:<op>`` / ``gloo:<op>`` marker. Its facts come, in order of preference, from:

1. ``record_param_comms`` (NCCL): collective name, dtype, element counts, split sizes, process group
   (name, description, size, global rank start/stride). Its layout changed over PyTorch versions:
   schema >= 1.1.0 repeats the facts as named attributes; older traces only have positional inputs
   ``[tensors, seq, pg, rank, name, in_splits, out_splits, (rank_start, rank_stride,) group_size]``
   where ``pg`` is a ``(name, desc)`` pair, or a bare pointer in schema 1.0.1/1.0.2. Every collective
   call also records a second ``record_param_comms`` named ``wait`` when the caller waits on it
   (hence 170 of them for 85 all-reduces in the Megatron sample): those are not collectives.
2. nbox's own ``collectives.json`` (:class:`nbox_record.handoff.rawformat.CollectiveLog`), for gloo, which
   records no ``record_param_comms``.
3. The ``c10d::<op>`` operator's own inputs: tensor shapes and item sizes give the bytes, the
   op schema's argument names tell which input is the send buffer, the root, the peer, the tag.

``comm_size`` convention (what ASTRA-sim's analytical backend expects): the bytes of **this rank's
input buffer** for all-reduce, reduce-scatter (the whole input, all chunks), all-to-all, broadcast,
reduce, gather and send/recv; for ALL_GATHER the **per-rank input** (one shard, not the gathered
output); for SCATTER the per-rank output (one chunk); 0 for a barrier. All-to-all split sizes are
carried as elements per peer (``nbox_in_split_sizes``/``nbox_out_split_sizes``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nbox_record.sources.hostet import EtNode, iter_tensors, schema_arg_names, tensor_bytes, tensor_numel
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import InvalidInputError
from nbox_trace.jsonio import DEFAULT_MAX_JSON_BYTES, load_json

#: Collective kinds: CollectiveCommType names, plus SEND and RECV (point-to-point node types).
COLL_TYPES: dict[str, int] = dict(pb.CollectiveCommType.items())
P2P_KINDS = ("SEND", "RECV")
RPC_NAME = "record_param_comms"
_NAMESPACES = ("c10d::", "_c10d_functional::", "c10d_functional::")

#: c10d / functional collective ops (name without namespace) -> kind.
OP_KINDS: dict[str, str] = {
    "allreduce_": "ALL_REDUCE", "allreduce_coalesced_": "ALL_REDUCE", "all_reduce": "ALL_REDUCE",
    "all_reduce_": "ALL_REDUCE", "all_reduce_coalesced": "ALL_REDUCE", "all_reduce_coalesced_": "ALL_REDUCE",
    "allgather_": "ALL_GATHER", "_allgather_base_": "ALL_GATHER", "allgather_coalesced_": "ALL_GATHER",
    "allgather_into_tensor_coalesced_": "ALL_GATHER", "all_gather_into_tensor": "ALL_GATHER",
    "all_gather_into_tensor_out": "ALL_GATHER", "all_gather_into_tensor_coalesced": "ALL_GATHER",
    "reduce_scatter_": "REDUCE_SCATTER", "_reduce_scatter_base_": "REDUCE_SCATTER",
    "reduce_scatter_tensor_coalesced_": "REDUCE_SCATTER", "reduce_scatter_tensor": "REDUCE_SCATTER",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER",
    "alltoall_": "ALL_TO_ALL", "alltoall_base_": "ALL_TO_ALL", "all_to_all_single": "ALL_TO_ALL",
    "broadcast_": "BROADCAST", "broadcast": "BROADCAST", "reduce_": "REDUCE", "gather_": "GATHER",
    "scatter_": "SCATTER", "barrier": "BARRIER", "monitored_barrier_": "BARRIER",
    "send": "SEND", "recv_": "RECV", "recv_any_source_": "RECV",
}

# Canonical dtype names (torch.<name>) from ET tensor types and from record_param_comms' dtype.
_DTYPES: dict[str, str] = {
    "float": "float32", "double": "float64", "c10::half": "float16", "half": "float16",
    "c10::bfloat16": "bfloat16", "bfloat16": "bfloat16", "long int": "int64", "long": "int64", "int": "int32",
    "short int": "int16", "short": "int16", "signed char": "int8", "char": "int8", "unsigned char": "uint8",
    "byte": "uint8", "bool": "bool", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "complexfloat": "complex64", "complexdouble": "complex128", "c10::float8_e4m3fn": "float8_e4m3fn",
    "c10::float8_e5m2": "float8_e5m2", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}
ELEM_BYTES: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
_TENSOR_TYPE = re.compile(r"Tensor\(([^)]*)\)")
_INT32 = (-(1 << 31), (1 << 31) - 1)


def op_kind(name: str) -> str | None:
    """The kind of a c10d / functional collective op name, or None for anything else."""
    for ns in _NAMESPACES:
        if name.startswith(ns):
            return OP_KINDS.get(name[len(ns):].removesuffix(".default"))
    return None


def short_op(name: str) -> str:
    """``c10d::allreduce_`` -> ``allreduce_`` (``collectives.json`` names ops this way)."""
    for ns in _NAMESPACES:
        if name.startswith(ns):
            name = name[len(ns):]
            break
    name = name.removeprefix("c10d.").removeprefix("_c10d_functional.")
    return name.removesuffix(".default")


def kind_of_collective_name(name: str) -> str | None:
    """``record_param_comms`` collective name or marker suffix -> kind; ``"WAIT"``; None if unknown."""
    key = name.lower().lstrip("_").replace("_", "")
    if key == "wait":
        return "WAIT"
    for prefix, kind in (("allreduce", "ALL_REDUCE"), ("allgather", "ALL_GATHER"), ("reducescatter", "REDUCE_SCATTER"),
                         ("alltoall", "ALL_TO_ALL"), ("broadcast", "BROADCAST"), ("reduce", "REDUCE"),
                         ("gather", "GATHER"), ("scatter", "SCATTER"), ("barrier", "BARRIER"),
                         ("send", "SEND"), ("recv", "RECV")):
        if key.startswith(prefix):
            return kind
    return None


def collective_kind(node: EtNode) -> str | None:
    """The kind of collective ``node`` is: a c10d / functional collective op's (:func:`op_kind`), or the one a
    ``record_param_comms`` names; None for anything else (a ``wait`` ``record_param_comms`` included)."""
    if node.name == RPC_NAME:
        kind = kind_of_collective_name(rpc_collective_name(node) or "")
        return None if kind == "WAIT" else kind
    return op_kind(node.name)


def marker_kind(name: str) -> str | None:
    """``gloo:all_reduce`` / ``nccl:all_reduce`` markers -> kind; None for other names."""
    for prefix in ("gloo:", "nccl:"):
        if name.startswith(prefix):
            return kind_of_collective_name(name[len(prefix):]) or "UNKNOWN"
    return None


def canonical_dtype(text: str) -> str:
    return _DTYPES.get(text.strip().lower(), text.strip())


def dtype_of_type(type_text: Any) -> str | None:
    """``GenericList[Tensor(c10::Half)]`` -> ``float16``."""
    if not isinstance(type_text, str):
        return None
    match = _TENSOR_TYPE.search(type_text)
    return canonical_dtype(match.group(1)) if match else None


@dataclass
class CommFacts:
    """What is known about one collective; None = unknown. Ranks are global unless named otherwise."""

    kind: str
    size: int | None = None  # bytes (see comm_size above)
    op: str = ""
    source: str = "host_et_inputs"
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    pg_size: int | None = None
    dtype: str | None = None
    async_op: bool | None = None
    root: int | None = None  # group rank until resolved
    peer: int | None = None  # group rank until resolved
    peer_is_global: bool = False
    root_is_global: bool = False
    tag: int | None = None
    in_splits: list[int] = field(default_factory=list)
    out_splits: list[int] = field(default_factory=list)
    seq: int | None = None
    issue_us: float | None = None
    wait_us: float | None = None
    done_us: float | None = None

    def overlay(self, other: CommFacts) -> None:
        """Take every field ``other`` knows (not None / not empty)."""
        for f in fields(self):
            value = getattr(other, f.name)
            if value is None or value == [] or (f.name in ("peer_is_global", "root_is_global") and not value):
                continue
            setattr(self, f.name, value)


# -- source 3: the c10d op's own inputs -------------------------------------------------------------
_SEND_BUF = ("input_tensors", "input_tensor", "input", "inputs", "input_list", "tensors", "tensor", "self")
_POSITIONAL_INPUT = {"ALL_GATHER": 1, "REDUCE_SCATTER": 1, "GATHER": 1, "ALL_TO_ALL": 1}


def _arg(node: EtNode, names: list[str], wanted: tuple[str, ...], fallback: int | None) -> int | None:
    """Index of the first ``wanted`` argument by schema name; by position only when there is no schema."""
    for w in wanted:
        if w in names:
            i = names.index(w)
            return i if i < len(node.inputs.values) else None
    if not names and fallback is not None and fallback < len(node.inputs.values):
        return fallback
    return None


def _int_input(node: EtNode, index: int | None) -> int | None:
    if index is None:
        return None
    v = node.inputs.values[index]
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _int_list(v: Any) -> list[int]:
    return [x for x in v if isinstance(x, int) and not isinstance(x, bool)] if isinstance(v, list) else []


def _rows_to_elements(splits: list[int], value: Any, shape: Any) -> list[int]:
    """all_to_all split sizes are rows of dim 0; convert to elements per peer."""
    if not splits:
        return []
    tensors = list(iter_tensors(value))
    rows = shape[0] if isinstance(shape, list) and shape and isinstance(shape[0], int) else None
    if len(tensors) != 1 or not rows:
        return splits
    per_row = tensors[0][3] // rows
    return [s * per_row for s in splits]


def facts_from_op_inputs(node: EtNode, kind: str) -> CommFacts:
    """Facts of a c10d / functional collective op from its inputs (source 3)."""
    names = schema_arg_names(node.op_schema)
    facts = CommFacts(kind=kind, op=short_op(node.name))
    values, types = node.inputs.values, node.inputs.types
    if kind == "SCATTER":
        buf = _arg(node, names, ("output_tensors", "output"), 0)
    elif kind == "BARRIER":
        buf = None
        facts.size = 0
    else:
        buf = _arg(node, names, _SEND_BUF, _POSITIONAL_INPUT.get(kind, 0))
    if buf is not None:
        facts.size = tensor_bytes(values[buf])
        facts.dtype = dtype_of_type(types[buf]) if buf < len(types) else None
    if kind in P2P_KINDS:
        facts.peer = _int_input(node, _arg(node, names, ("dstRank", "dst", "srcRank", "src"), 2))
        facts.tag = _int_input(node, _arg(node, names, ("tag",), 3))
    elif kind in ("BROADCAST", "REDUCE", "GATHER", "SCATTER"):
        default = {"BROADCAST": 2, "REDUCE": 3}.get(kind, 3)
        facts.root = _int_input(node, _arg(node, names, ("root_rank", "root", "src", "dst"), default))
    a = _arg(node, names, ("asyncOp", "async_op"), None)
    if a is not None and isinstance(values[a], bool):
        facts.async_op = values[a]
    g = _arg(node, names, ("group_name", "tag"), None) if node.name.startswith(("_c10d_functional", "c10d_f")) else None
    if g is not None and isinstance(values[g], str):
        facts.pg_name = values[g]
    if kind == "ALL_TO_ALL":
        o = _arg(node, names, ("output_split_sizes",), 3)
        i = _arg(node, names, ("input_split_sizes",), 4)
        shapes = node.inputs.shapes
        if i is not None and buf is not None:
            facts.in_splits = _rows_to_elements(_int_list(values[i]), values[buf],
                                                shapes[buf] if buf < len(shapes) else None)
        out_buf = _arg(node, names, ("output", "output_tensor", "output_tensors"), 0)
        if out_buf is None:  # _c10d_functional::all_to_all_single has no output argument: its rows are the input's
            out_buf = buf
        if o is not None and out_buf is not None:
            facts.out_splits = _rows_to_elements(_int_list(values[o]), values[out_buf],
                                                 shapes[out_buf] if out_buf < len(shapes) else None)
    return facts


# -- source 1: record_param_comms -------------------------------------------------------------------
def rpc_collective_name(node: EtNode) -> str | None:
    """The collective name a ``record_param_comms`` node carries (attribute, else the String input)."""
    name = node.attrs.get("collective_name")
    if isinstance(name, str) and name:
        return name
    for v, t in zip(node.inputs.values, node.inputs.types, strict=False):
        if t == "String" and isinstance(v, str):
            return v
    return None


def _split_attr(v: Any) -> list[int]:
    if isinstance(v, list):
        return _int_list(v)
    if isinstance(v, str) and len(v) < 1 << 20:
        try:
            return _int_list(json.loads(v))
        except ValueError:
            return []
    return []


def facts_from_rpc(node: EtNode, kind: str) -> CommFacts:
    """Facts of a ``record_param_comms`` node (source 1); see the module docstring for its layouts."""
    values, types = node.inputs.values, node.inputs.types
    facts = CommFacts(kind=kind, source="record_param_comms", op=rpc_collective_name(node) or "")
    k = next((i for i, t in enumerate(types) if t == "String"), None)
    rank_arg: int | None = None
    group_size: int | None = None
    tensors_in: Any = None
    if k is not None and k >= 3:
        seq = values[k - 3] if k - 3 < len(values) else None
        facts.seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        pg = values[k - 2]
        if isinstance(pg, list) and len(pg) == 2 and all(isinstance(x, str) for x in pg) and pg[0]:
            facts.pg_name, facts.pg_desc = pg[0], pg[1] or None
        r = values[k - 1]
        rank_arg = r if isinstance(r, int) and not isinstance(r, bool) else None
        tensors_in = values[0] if k - 3 >= 1 else None
        facts.in_splits = _int_list(values[k + 1]) if k + 1 < len(values) else []
        facts.out_splits = _int_list(values[k + 2]) if k + 2 < len(values) else []
        tail = [v for v in values[k + 3:] if isinstance(v, int) and not isinstance(v, bool)]
        if len(tail) >= 3 and tail[1] > 0:
            start, stride, group_size = tail[-3], tail[-2], tail[-1]
            if start >= 0 and group_size > 0:
                facts.pg_ranks = [start + i * stride for i in range(min(group_size, 1 << 20))]
        elif tail:
            group_size = tail[-1]
    a = node.attrs
    dtype = a.get("dtype")
    facts.dtype = canonical_dtype(dtype) if isinstance(dtype, str) and dtype else (
        dtype_of_type(types[0]) if tensors_in is not None and types else None)
    for key, attr in (("pg_name", "pg_name"), ("pg_desc", "pg_desc")):
        v = a.get(attr)
        if isinstance(v, str) and v:
            setattr(facts, key, v)
    size_attr = a.get("pg_size")
    if isinstance(size_attr, int) and not isinstance(size_attr, bool) and size_attr > 0:
        group_size = size_attr
    first, step = a.get("global_rank_start"), a.get("global_rank_stride")
    if isinstance(first, int) and isinstance(step, int) and group_size and first >= 0 and step > 0:
        facts.pg_ranks = [first + i * step for i in range(min(group_size, 1 << 20))]
    facts.pg_size = group_size if group_size and group_size > 0 else None
    if "in_split_size" in a:
        facts.in_splits = _split_attr(a.get("in_split_size"))
    if "out_split_size" in a:
        facts.out_splits = _split_attr(a.get("out_split_size"))
    in_n, out_n = a.get("in_msg_nelems"), a.get("out_msg_nelems")
    elem = ELEM_BYTES.get(facts.dtype or "")
    if elem is None:
        tensors = list(iter_tensors(tensors_in if tensors_in is not None else values))
        elem = tensors[0][4] if tensors else None
    n = out_n if kind == "SCATTER" else in_n
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0 and elem:
        facts.size = n * elem
        numel = n
    elif tensors_in is not None:
        facts.size = tensor_bytes(tensors_in)
        numel = tensor_numel(tensors_in)
    else:
        numel = 0  # size stays unknown: the c10d op's inputs tell
    if kind == "BARRIER":
        facts.size = 0
    if kind in P2P_KINDS:
        facts.peer = rank_arg
    elif kind in ("BROADCAST", "REDUCE", "GATHER", "SCATTER"):
        facts.root = rank_arg
    if kind == "ALL_TO_ALL" and facts.in_splits and numel and sum(facts.in_splits):
        # PyTorch records dim-0 split sizes: scale to elements per peer
        per = numel // sum(facts.in_splits)
        facts.in_splits = [s * per for s in facts.in_splits]
        facts.out_splits = [s * per for s in facts.out_splits]
    return facts


# -- source 2: nbox's collectives.json --------------------------------------------------------------
_RECORD_KEYS: dict[str, tuple[type, ...]] = {
    "seq": (int,), "op": (str,), "comm_type": (str,), "pg_name": (str,), "dtype": (str,), "in_numel": (int,),
    "out_numel": (int,), "elem_bytes": (int,), "comm_bytes": (int,), "in_split_sizes": (list,),
    "out_split_sizes": (list,), "async_op": (bool,), "issue_us": (int, float),
}
_OPTIONAL_INT = ("peer", "tag", "root")
_OPTIONAL_NUM = ("wait_us", "done_us")


@dataclass(frozen=True)
class CollectiveLogData:
    """A checked ``collectives.json``: the records in issue order and the process groups."""

    path: Path
    world_size: int
    records: list[dict[str, Any]]
    groups: dict[str, tuple[str, list[int]]]  # pg_name -> (desc, global ranks)


def _is(v: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)


def load_collective_log(path: str | Path, *, rank: int, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> CollectiveLogData:
    """Read and check nbox's ``collectives.json`` (:class:`nbox_record.handoff.rawformat.CollectiveLog`).

    Raises:
        InputNotFoundError: no such file.
        InvalidInputError: not that shape (the message names the file and the key), or written by
            another rank.
    """
    p = Path(path)
    data = load_json(p, max_bytes=max_bytes, what="collective log")
    if not isinstance(data, dict):
        raise InvalidInputError(f"{p}: collective log: expected an object, got {type(data).__name__}")
    for key in ("version", "rank", "world_size"):
        if not _is(data.get(key), (int,)):
            raise InvalidInputError(f"{p}: collective log: key {key!r} must be an integer")
    if data["rank"] != rank:
        raise InvalidInputError(f"{p}: collective log of rank {data['rank']}, converting rank {rank}")
    groups: dict[str, tuple[str, list[int]]] = {}
    raw_groups = data.get("process_groups", [])
    if not isinstance(raw_groups, list):
        raise InvalidInputError(f"{p}: collective log: 'process_groups' must be a list")
    for i, g in enumerate(raw_groups):
        if not isinstance(g, dict) or not isinstance(g.get("pg_name"), str):
            raise InvalidInputError(f"{p}: collective log: process_groups[{i}] needs a string 'pg_name'")
        ranks = g.get("ranks")
        if not isinstance(ranks, list) or not all(_is(r, (int,)) and r >= 0 for r in ranks):
            raise InvalidInputError(f"{p}: collective log: process_groups[{i}].ranks must be a list of ranks")
        desc = g.get("pg_desc")
        groups[g["pg_name"]] = (desc if isinstance(desc, str) else "", list(ranks))
    records = data.get("collectives")
    if not isinstance(records, list):
        raise InvalidInputError(f"{p}: collective log: 'collectives' must be a list")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise InvalidInputError(f"{p}: collective log: collectives[{i}] is not an object")
        for key, kinds in _RECORD_KEYS.items():
            if not _is(rec.get(key), kinds):
                raise InvalidInputError(f"{p}: collective log: collectives[{i}].{key} is missing or not "
                                        f"{'/'.join(k.__name__ for k in kinds)}")
        for key in _OPTIONAL_INT:
            if rec.get(key) is not None and not _is(rec[key], (int,)):
                raise InvalidInputError(f"{p}: collective log: collectives[{i}].{key} must be an integer or null")
        for key in _OPTIONAL_NUM:
            if rec.get(key) is not None and not _is(rec[key], (int, float)):
                raise InvalidInputError(f"{p}: collective log: collectives[{i}].{key} must be a number or null")
        if rec["comm_type"] not in COLL_TYPES and rec["comm_type"] not in P2P_KINDS:
            raise InvalidInputError(f"{p}: collective log: collectives[{i}].comm_type {rec['comm_type']!r} is not "
                                    "a CollectiveCommType name, SEND or RECV")
        if rec["comm_bytes"] < 0:
            raise InvalidInputError(f"{p}: collective log: collectives[{i}].comm_bytes is negative")
    return CollectiveLogData(p, data["world_size"], records, groups)


def facts_from_record(rec: dict[str, Any]) -> CommFacts:
    """Facts of one ``collectives.json`` record (source 2); ranks in it are global."""
    kind = rec["comm_type"]
    return CommFacts(
        kind=kind, size=rec["comm_bytes"], op=rec["op"], source="collectives.json", pg_name=rec["pg_name"],
        dtype=canonical_dtype(rec["dtype"]), async_op=rec["async_op"], root=rec.get("root"), peer=rec.get("peer"),
        peer_is_global=rec.get("peer") is not None, root_is_global=rec.get("root") is not None,
        tag=rec.get("tag"), in_splits=_int_list(rec["in_split_sizes"]), out_splits=_int_list(rec["out_split_sizes"]),
        issue_us=float(rec["issue_us"]),
        wait_us=float(rec["wait_us"]) if rec.get("wait_us") is not None else None,
        done_us=float(rec["done_us"]) if rec.get("done_us") is not None else None,
    )


def collective_facts(node: EtNode, kind: str, rpc: EtNode | None, rec: dict[str, Any] | None) -> CommFacts:
    """What is known of the collective ``node`` (of ``kind``) from the three sources: its own inputs (source 3),
    overlaid by its ``record_param_comms`` node ``rpc`` (source 1), then by its ``collectives.json`` record ``rec``
    (source 2). Its process group is as the sources name it (the caller resolves it)."""
    f = facts_from_op_inputs(node, kind) if node.name != RPC_NAME else CommFacts(kind=kind)
    from_rpc = facts_from_rpc(rpc, kind_of_collective_name(rpc_collective_name(rpc) or "") or kind) \
        if rpc is not None else None
    if from_rpc is not None:
        f.overlay(from_rpc)
        f.op = short_op(node.name) if node.name != RPC_NAME else from_rpc.op
    if rec is not None:
        r = facts_from_record(rec)
        if from_rpc is None:
            f.kind, f.size, f.dtype, f.in_splits, f.out_splits = r.kind, r.size, r.dtype, r.in_splits, r.out_splits
            f.source = r.source
        for name in ("pg_name", "async_op", "issue_us", "wait_us", "done_us", "tag", "peer", "root"):
            if getattr(r, name) is not None:
                setattr(f, name, getattr(r, name))
        f.peer_is_global = f.peer_is_global or r.peer_is_global
        f.root_is_global = f.root_is_global or r.root_is_global
    return f


def in_int32(value: int) -> bool:
    return _INT32[0] <= value <= _INT32[1]
