"""Recorded compute nodes as runnable operators: the ``live`` half of ``--compute live|recorded``.

A compute node recorded by the ET observer carries its operator schema (``op_schema``) and its arguments in
``inputs`` (``values``, ``shapes``, ``types``: one entry per schema argument, in schema order; strides in
``nbox_input_strides``); a tensor's value is ``[tensor_id, storage_id, offset, numel, itemsize, device]``.
:func:`prepare` turns every compute node of a rank into a :class:`Runnable` (the resolved
``torch.ops.aten.<name>.<overload>`` and argument templates) or ``None`` with a reason. Arguments are built in a
per-rank :class:`TensorPool`:

* a tensor is reused by tensor id: a node's output that a later node reads is the same object, an in-place
  operator's output is its input; one first met as an input is made once (recorded shape, dtype and strides, on the
  replay device) and kept; one first met as an output is dropped after its last use and made again next repetition;
* an input whose recorded storage is an earlier output's is a view of that output (recorded offset, shape, strides),
  made on each use; one that does not fit (another dtype, past the storage's end) is a new tensor;
* a made tensor's values follow :mod:`nbox_replay.live.values` (integers and bools zero; floats uniform in [-1, 1),
  positive for a domain-restricted operator, 1 for a recorded Python number), so no operator takes a slow path the
  real run did not; a device argument is the replay device.

A node without an ``aten`` schema, or an ``aten`` operator called on a tensor subclass (FSDP2's DTensor parameters),
that lists the ``aten`` operators it ran in ``nbox_children`` runs them as one
:class:`~nbox_replay.live.children.CompositeRunnable`. A node that cannot be built, or raises when run, falls back to
its recorded duration; fallbacks are counted per operator name and never stop the replay. Coverage is the share of
recorded compute time (microseconds) that runs live. Why views and values are made so: docs/design/live-replay.md.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import torch

from nbox_replay.inputs import COMPUTE, RankGraph
from nbox_replay.live.children import TRUNCATED_ATTR, BuildError, child_nodes
from nbox_replay.live.fastcall import choose
from nbox_replay.live.values import argument_rule, fill
from nbox_trace.chakra import attr_map
from nbox_trace.chakra import et_def_pb2 as pb

__all__ = ["BuildError", "CompositeRunnable", "LiveOps", "Runnable", "TensorPool", "TensorSpec", "build_node",
           "build_runnable", "parse_dtype", "prepare"]

#: ``Tensor(<name>)`` as the execution-trace observer writes it (caffe2 TypeMeta names), plus torch's names.
_DTYPES: dict[str, torch.dtype] = {
    "float": torch.float32, "double": torch.float64, "c10::Half": torch.float16, "c10::BFloat16": torch.bfloat16,
    "long int": torch.int64, "long": torch.int64, "int": torch.int32, "short int": torch.int16,
    "short": torch.int16, "signed char": torch.int8, "unsigned char": torch.uint8, "bool": torch.bool,
    "c10::complex<float>": torch.complex64, "c10::complex<double>": torch.complex128,
    "c10::complex<c10::Half>": torch.complex32, "c10::Float8_e4m3fn": torch.float8_e4m3fn,
    "c10::Float8_e5m2": torch.float8_e5m2, "unsigned short": torch.uint16, "unsigned int": torch.uint32,
    "unsigned long": torch.uint64,
}
for _d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128):
    _DTYPES.setdefault(str(_d).removeprefix("torch."), _d)

#: The type the observer writes for an undefined tensor (e.g. an absent ``Tensor? attn_mask``).
_UNDEFINED_TENSOR = "Tensor(nullptr (uninitialized))"
#: Namespaces whose operators are replayed; others (``c10d::``, ``fsdp::``, custom ops) fall back.
LIVE_NAMESPACES = frozenset({"aten"})


def parse_dtype(type_text: str) -> torch.dtype:
    """The dtype of a recorded ``Tensor(<name>)`` type, e.g. ``Tensor(c10::BFloat16)``; BuildError otherwise."""
    if not (type_text.startswith("Tensor(") and type_text.endswith(")")):
        raise BuildError(f"not a tensor type: {type_text[:60]!r}")
    name = type_text[7:-1]
    found = _DTYPES.get(name)
    if found is None:
        raise BuildError(f"unknown tensor dtype {name[:40]!r}")
    return found


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument: id (for reuse), shape, strides (elements), dtype."""

    tid: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ListSpec:
    """A list (or tuple) argument whose items are specs or constants."""

    items: tuple[Any, ...]
    as_tuple: bool = False


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= max(s, 1)
    return tuple(reversed(out))


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise BuildError(f"{what} is not a list of integers: {str(x)[:60]}")
    return tuple(x)


def _extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements of storage a tensor of ``shape`` and ``strides`` spans from its offset (0 when it is empty)."""
    return 0 if any(d == 0 for d in shape) else 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


def _is_tensor_value(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 6 and isinstance(v[0], int) and isinstance(v[5], str)


def _split_list_type(t: str) -> list[str]:
    """``GenericList[Tensor(float),Int]`` -> ``["Tensor(float)", "Int"]`` (top-level commas only)."""
    inner = t[t.index("[") + 1: -1]
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def _arg(value: Any, shape: Any, type_text: str, strides: Any, device: str) -> Any:
    """The spec or constant for one recorded argument (BuildError for a kind that cannot be made)."""
    t = type_text.strip()
    if t == _UNDEFINED_TENSOR:  # an undefined tensor (an absent ``Tensor?``): None
        return None
    if t.startswith("Tensor("):
        if not _is_tensor_value(value):
            raise BuildError(f"tensor argument without a tensor value: {str(value)[:60]}")
        dims = _ints(shape, "tensor shape")
        if any(d < 0 for d in dims):
            raise BuildError(f"negative tensor shape {list(dims)}")
        st = _ints(strides, "tensor strides") if isinstance(strides, list) and len(strides) == len(dims) \
            else _contiguous(dims)
        if any(s < 0 for s in st):
            raise BuildError(f"negative tensor strides {list(st)}")
        return TensorSpec(int(value[0]), dims, st, parse_dtype(t))
    if t.startswith(("GenericList[", "Tuple[")):
        kinds = _split_list_type(t)
        if not isinstance(value, list) or len(value) != len(kinds):
            raise BuildError(f"list argument {t[:60]} does not match its value {str(value)[:60]}")
        shapes = shape if isinstance(shape, list) and len(shape) == len(kinds) else [[] for _ in kinds]
        strs = strides if isinstance(strides, list) and len(strides) == len(kinds) else [None for _ in kinds]
        return ListSpec(tuple(_arg(v, s, k, st, device) for v, s, k, st in zip(value, shapes, kinds, strs,
                                                                                  strict=True)),
                        as_tuple=t.startswith("Tuple["))
    if t == "None":
        return None
    if t == "Int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise BuildError(f"Int argument with value {str(value)[:40]}")
        return value
    if t == "Double":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise BuildError(f"Double argument with value {str(value)[:40]}")
        return float(value)
    if t == "Bool":
        if not isinstance(value, bool):
            raise BuildError(f"Bool argument with value {str(value)[:40]}")
        return value
    if t == "String":
        if not isinstance(value, str):
            raise BuildError(f"String argument with value {str(value)[:40]}")
        return value
    if t == "Device":
        return torch.device(device)
    raise BuildError(f"argument of kind {t[:40]!r} cannot be built")


@dataclass
class TensorPool:
    """One rank's live tensors by recorded tensor id, on ``device``."""

    device: str
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    created: int = 0  # tensors made from a spec (not produced by an operator)
    #: tensor id -> (the id of the live tensor it is a view of, its storage offset minus that tensor's, elements):
    #: inputs no operator produced that share a recorded storage with an earlier output (:class:`LiveOps`)
    aliases: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: tensor id -> its value rule when an operator's argument asks for one (:func:`nbox_replay.live.values.fill`)
    rules: dict[int, str] = field(default_factory=dict)

    def get(self, spec: TensorSpec) -> torch.Tensor:
        """The tensor with ``spec.tid``: a view of the live tensor it aliases (:meth:`view`), else the pooled
        one when its shape and dtype match, else a new one."""
        alias = self.aliases.get(spec.tid)
        if alias is not None:
            view = self.view(spec, *alias)
            if view is not None:
                return view
        t = self.tensors.get(spec.tid)
        if t is not None and t.shape == spec.shape and t.dtype == spec.dtype:
            return t
        t = self.make(spec)
        self.tensors[spec.tid] = t
        return t

    def make(self, spec: TensorSpec) -> torch.Tensor:
        """A new tensor of the spec's shape, strides and dtype with valid values (module docstring)."""
        base = torch.empty(_extent(spec.shape, spec.strides), dtype=spec.dtype, device=self.device)
        fill(base, not spec.shape, self.rules.get(spec.tid))
        self.created += 1
        return base.as_strided(spec.shape, spec.strides)

    def view(self, spec: TensorSpec, base_tid: int, delta: int) -> torch.Tensor | None:
        """``spec`` as a view of the live tensor ``base_tid`` (storage offset ``delta`` elements from it), as the
        recorded tensor was a view of that storage; None when the base is gone or the view would not fit
        (dtype differs, offset before its storage, extent past its end)."""
        base = self.tensors.get(base_tid)
        if base is None or base.dtype != spec.dtype:
            return None
        offset = base.storage_offset() + delta
        end = offset + _extent(spec.shape, spec.strides)
        if offset < 0 or end * base.element_size() > base.untyped_storage().nbytes():
            return None
        return base.as_strided(spec.shape, spec.strides, offset)

    def keep(self, tid: int, result: Any) -> None:
        """Pool an operator's tensor ``result`` as tensor id ``tid`` (a view of another: made on use, not kept)."""
        if isinstance(result, torch.Tensor) and tid not in self.aliases:
            self.tensors[tid] = result

    def put(self, recorded: Any, result: Any) -> None:
        """Pool the tensors of an operator's ``result`` under the recorded output tensor ids."""
        if _is_tensor_value(recorded):
            self.keep(int(recorded[0]), result)
            return
        if isinstance(recorded, list) and isinstance(result, (list, tuple)) and len(recorded) == len(result):
            for r, x in zip(recorded, result, strict=True):
                self.put(r, x)

    def materialize(self, arg: Any) -> Any:
        if isinstance(arg, TensorSpec):
            return self.get(arg)
        if isinstance(arg, ListSpec):
            items = [self.materialize(a) for a in arg.items]
            return tuple(items) if arg.as_tuple else items
        return arg


#: How :meth:`Runnable.run` builds an argument (:meth:`Runnable.bind`).
_POOLED, _CONSTANT, _BUILT = 0, 1, 2


@dataclass
class Runnable:
    """One recorded operator call, ready to run on a :class:`TensorPool`."""

    position: int
    node_id: int
    name: str
    op: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[Any]  # the recorded output values (tensor ids where the results go)
    rules: tuple[tuple[int, str], ...] = ()  # (tensor id, value rule) of its arguments that ask for one (values)

    def __post_init__(self) -> None:
        # The per-call path is the replay's own overhead, which the real run does not have: the operator's
        # C++ entry (OpOverload.__call__ only forwards to it), or torch's generated binding where a check on meta
        # tensors shows that it dispatches the same (nbox_replay.live.fastcall), and the one-tensor output's id.
        self._call: Callable[..., Any] = getattr(self.op, "_op", self.op)
        if getattr(self.op, "_schema", None) is not None:  # an OpOverload: pick its entry now, on meta tensors
            meta = TensorPool("meta")  # the arguments as a run builds them, of their recorded layout, no data
            try:
                args = [meta.materialize(a) for a in self.args]
                kwargs = {k: meta.materialize(v) for k, v in self.kwargs.items()}
            except (RuntimeError, ValueError, TypeError):  # not buildable on meta: keep _op
                args = None
            if args is not None:
                self._call = choose(self.op, self._call, args, kwargs)
        single: Any = self.outputs[0] if len(self.outputs) == 1 else None
        self._out_tid: int | None = int(single[0]) if _is_tensor_value(single) else None
        self.bind(None)

    def bind(self, aliased: AbstractSet[int] | None) -> None:
        """Plan the argument building once the pool's aliased tensor ids are known (:class:`LiveOps`; None: not
        known, every tensor through :meth:`TensorPool.get`): a tensor that is no view is looked up in the pool
        inline (its shape and dtype checked, else :meth:`TensorPool.get`); a constant is passed as is; a view or a
                list goes through :meth:`TensorPool.materialize`. With every operator call stubbed, the walk's own
        Python is a few
        percent of a ddp_transformer iteration, and this plan takes a little of it off (docs/results.md)."""
        plan: list[tuple[int, Any, Any, Any, Any]] = []
        for a in self.args:
            if type(a) is TensorSpec and aliased is not None and a.tid not in aliased:
                plan.append((_POOLED, a.tid, a.shape, a.dtype, a))
            elif isinstance(a, (TensorSpec, ListSpec)):
                plan.append((_BUILT, None, None, None, a))
            else:
                plan.append((_CONSTANT, None, None, None, a))
        self._plan = tuple(plan)

    def run(self, pool: TensorPool) -> None:
        """Build the arguments (reusing pooled tensors) and call the operator; its outputs join the pool."""
        tensors = pool.tensors
        args: list[Any] = []
        append = args.append
        for kind, tid, shape, dtype, a in self._plan:
            if kind == _POOLED:
                t = tensors.get(tid)
                append(t if t is not None and t.shape == shape and t.dtype == dtype else pool.get(a))
            elif kind == _CONSTANT:
                append(a)
            else:
                append(pool.materialize(a))
        if self.kwargs:
            materialize = pool.materialize
            result = self._call(*args, **{k: materialize(v) for k, v in self.kwargs.items()})
        else:
            result = self._call(*args)
        if self._out_tid is not None:
            pool.keep(self._out_tid, result)
        elif len(self.outputs) == 1:
            pool.put(self.outputs[0], result)
        else:
            pool.put(self.outputs, result if isinstance(result, (list, tuple)) else [result])


@dataclass
class CompositeRunnable:
    """A recorded node run as its children, in recorded order, on one pool (module docstring)."""

    position: int
    node_id: int
    name: str
    children: list[Runnable]
    sources: list[pb.Node]  # the child nodes (their recorded inputs and outputs: tensor lifetimes)

    def run(self, pool: TensorPool) -> None:
        """Run every child; the first that raises stops the node (the caller then falls back)."""
        for child in self.children:
            child.run(pool)


def _json_list(text: str, what: str) -> list[Any]:
    if not text:
        return []
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise BuildError(f"{what} is not JSON: {text[:60]!r}") from None
    if not isinstance(value, list):
        raise BuildError(f"{what} is not a JSON list")
    return value


def _resolve(schema_text: str) -> tuple[Any, Any]:
    """``(OpOverload, FunctionSchema)`` for a schema string; BuildError when it is not a replayable op."""
    try:
        schema = torch._C.parse_schema(schema_text)
    except RuntimeError as err:
        raise BuildError(f"unparsable op_schema: {str(err).splitlines()[0][:80]}") from None
    ns, _, name = schema.name.partition("::")
    if ns not in LIVE_NAMESPACES:
        raise BuildError(f"not an aten operator ({ns}::)")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        op = getattr(packet, schema.overload_name or "default")
    except (AttributeError, RuntimeError):
        raise BuildError(f"unknown operator {schema.name}.{schema.overload_name or 'default'}") from None
    return op, schema


def build_runnable(node: pb.Node, position: int, device: str) -> Runnable:
    """The :class:`Runnable` for one compute node; BuildError (with the reason) when there is none."""
    attrs = attr_map(node.attr)
    schema_attr = attrs.get("op_schema")
    schema_text = str(schema_attr.value) if schema_attr is not None and schema_attr.value is not None else ""
    if not schema_text.strip():
        raise BuildError("no op_schema")
    op, schema = _resolve(schema_text)
    values = _json_list(node.inputs.values, "inputs.values")
    shapes = _json_list(node.inputs.shapes, "inputs.shapes")
    types = _json_list(node.inputs.types, "inputs.types")
    strides_attr = attrs.get("nbox_input_strides")
    strides = _json_list(str(strides_attr.value), "nbox_input_strides") if strides_attr is not None else []
    if len(types) != len(values):
        raise BuildError(f"inputs.values has {len(values)} entries, inputs.types {len(types)}")
    params = list(schema.arguments)
    if len(values) > len(params):
        raise BuildError(f"{len(values)} recorded inputs for {len(params)} schema arguments")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    rules: dict[int, str] = {}
    for k, (v, t) in enumerate(zip(values, types, strict=True)):
        spec = _arg(v, shapes[k] if k < len(shapes) else [], str(t), strides[k] if k < len(strides) else None,
                    device)
        rule = argument_rule(schema.name, params[k].name)
        if rule is not None:
            rules.update((tid, rule) for tid in _tids(spec))
        if params[k].kwarg_only:
            kwargs[params[k].name] = spec
        elif kwargs:
            raise BuildError("a positional argument after a keyword-only one")
        else:
            args.append(spec)
    outputs = _json_list(node.outputs.values, "outputs.values")
    return Runnable(position, node.id, node.name, op, args, kwargs, outputs, tuple(rules.items()))


def _tids(spec: Any) -> list[int]:
    """The tensor ids in an argument spec (a tensor or a list of them)."""
    if isinstance(spec, TensorSpec):
        return [spec.tid]
    return [t for item in spec.items for t in _tids(item)] if isinstance(spec, ListSpec) else []


def _schema_text(node: pb.Node) -> str:
    attr = attr_map(node.attr).get("op_schema")
    return str(attr.value) if attr is not None and attr.value is not None else ""


def build_node(node: pb.Node, position: int, device: str) -> Runnable | CompositeRunnable:
    """The composite of the node's ``nbox_children`` when it lists them, else :func:`build_runnable`.

    BuildError when there is neither (or one child cannot be built: the reason names it).
    """
    schema = _schema_text(node).strip()
    kids = child_nodes(node)  # an aten operator lists them when it ran on a tensor subclass (its local operators)
    if kids is None and schema and schema.split("(", 1)[0].split("::", 1)[0] in LIVE_NAMESPACES:
        return build_runnable(node, position, device)
    if kids is None:
        if TRUNCATED_ATTR in attr_map(node.attr):
            raise BuildError(("no op_schema" if not schema else "not an aten operator")
                             + "; its operators were over the recording cap (nbox_children_truncated)")
        return build_runnable(node, position, device)
    children: list[Runnable] = []
    for k, kid in enumerate(kids):
        try:
            children.append(build_runnable(kid, position, device))
        except (BuildError, RuntimeError, ValueError, TypeError) as err:
            raise BuildError(f"child {k} ({kid.name[:60]}): {err}") from None
    return CompositeRunnable(position, node.id, node.name, children, kids)


def _tensor_values(x: Any, out: list[tuple[int, int, int]]) -> None:
    """``(tensor_id, storage_id, offset)`` of each recorded tensor value in ``x`` (storage -1, offset 0 when
    those are not integers)."""
    if _is_tensor_value(x):
        ints = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in x[1:3]]
        out.append((int(x[0]), -1 if ints[0] is None else ints[0], max(ints[1] or 0, 0)))
    elif isinstance(x, list):
        for item in x:
            _tensor_values(item, out)


class LiveOps:
    """One rank's compute nodes, runnable live: see the module docstring.

    Attributes:
        runnables: per graph position, the runnable or ``None`` (not compute, or a fallback).
        reasons: per fallback position, why it falls back.
        fallbacks: fallback nodes per operator name.
    """

    def __init__(self, graph: RankGraph, device: str) -> None:
        if graph.nodes is None:
            raise ValueError(f"{graph.path}: load the graph with keep_nodes=True for live replay")
        self.graph = graph
        self.pool = TensorPool(device)
        self.runnables: list[Runnable | CompositeRunnable | None] = [None] * len(graph)
        self.reasons: dict[int, str] = {}
        self.fallbacks: Counter[str] = Counter()
        self.release: dict[int, list[int]] = {}
        first_seen: dict[int, bool] = {}  # tensor id -> first met as an output
        last_use: dict[int, int] = {}
        latest_on: dict[int, tuple[int, int]] = {}  # recorded storage id -> (tensor id, offset) last output on it
        aliases = self.pool.aliases
        for i, node in enumerate(graph.nodes):
            if graph.kind[i] != COMPUTE:
                continue
            try:
                r = self.runnables[i] = build_node(node, i, device)
            except (BuildError, RuntimeError, ValueError, TypeError) as err:
                self._fall_back(i, str(err))
                continue
            for src in r.sources if isinstance(r, CompositeRunnable) else [node]:  # children in order
                ins: list[tuple[int, int, int]] = []
                outs: list[tuple[int, int, int]] = []
                _tensor_values(_json_list(src.inputs.values, "inputs.values"), ins)
                _tensor_values(_json_list(src.outputs.values, "outputs.values"), outs)
                for tid, storage, offset in ins:
                    if tid not in first_seen:  # no operator made it: a view of the storage's last output, if any
                        first_seen[tid] = False
                        base = latest_on.get(storage) if storage >= 0 else None
                        if base is not None and base[0] != tid:
                            aliases[tid] = (base[0], offset - base[1])
                    last_use[tid] = i
                    if tid in aliases:  # the base lives while its views are used
                        last_use[aliases[tid][0]] = i
                for tid, storage, offset in outs:
                    first_seen.setdefault(tid, True)
                    last_use[tid] = i
                    if tid not in aliases:  # an in-place operator on a view: its base stays the storage's tensor
                        latest_on[storage] = (tid, offset)
        for tid, produced in first_seen.items():
            if produced:
                self.release.setdefault(last_use[tid], []).append(tid)
        aliased = frozenset(aliases)
        for built in self.runnables:
            for leaf in built.children if isinstance(built, CompositeRunnable) else [built] if built else []:
                leaf.bind(aliased)
                self.pool.rules.update(leaf.rules)

    def _fall_back(self, i: int, reason: str) -> None:
        self.runnables[i] = None
        self.reasons[i] = reason
        self.fallbacks[self.graph.names[i]] += 1

    def run(self, i: int) -> bool:
        """Run node ``i`` live; False when it falls back (then the caller waits its recorded duration)."""
        r = self.runnables[i]
        if r is None:
            return False
        try:
            if torch.is_grad_enabled():  # the live worker turns it off once (a context per call costs ~1 us)
                with torch.no_grad():
                    r.run(self.pool)
            else:
                r.run(self.pool)
        except Exception as err:  # one operator must never stop the replay
            self._fall_back(i, f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
            return False
        for tid in self.release.get(i, ()):
            self.pool.tensors.pop(tid, None)
        return True

    def live_us(self) -> float:
        """Recorded duration (microseconds) of the compute nodes that run live."""
        g = self.graph
        return sum(g.duration_us[i] for i, r in enumerate(self.runnables) if r is not None)

    def coverage(self) -> float:
        """Share of the recorded compute time that runs live (0..1; 0 when there is no compute)."""
        total = self.graph.compute_us()
        return self.live_us() / total if total > 0 else 0.0

    def reasons_by_op(self) -> dict[str, str]:
        """One reason per fallback operator name (the first seen)."""
        out: dict[str, str] = {}
        for i, why in sorted(self.reasons.items()):
            out.setdefault(self.graph.names[i], why)
        return out


def prepare(graph: RankGraph, device: str) -> LiveOps:
    """The live operators of one rank's graph (loaded with ``keep_nodes=True``) on ``device`` ("cpu", "cuda")."""
    return LiveOps(graph, device)
