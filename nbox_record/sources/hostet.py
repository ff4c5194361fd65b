"""Read a PyTorch host execution trace (``ExecutionTraceObserver`` JSON) into a checked, typed model.

Two layouts exist in the wild and both are read:

* schema >= 1.0.2 (torch 2.13 writes "1.1.1-chakra.0.0.4"): ``ctrl_deps`` is the parent id,
  ``inputs``/``outputs`` are objects ``{values, shapes, types[, strides]}``, and ``rf_id``, ``tid``,
  ``scope``, ``op_schema``... are entries of an ``attrs`` list of ``{name, type, value}``;
* schema 1.0.1 (older PyTorch, e.g. the Megatron sample): flat keys ``parent``, ``inputs`` (values),
  ``input_shapes``, ``input_types``, ``outputs``... and the attributes as top-level keys; no strides.

A tensor value is ``[tensor_id, storage_id, offset, numel, itemsize, device]``. The parent links
form a forest (the ``[...process]`` node is its own parent); :meth:`HostEt.children` gives the
children in start order (``rf_id``, a global counter taken when an operator starts), and
:meth:`HostEt.roots` the nodes whose parent is themselves or absent. Nothing here recurses over the
graph: the walkers are iterative.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nbox_trace.errors import InvalidInputError
from nbox_trace.jsonio import DEFAULT_MAX_JSON_BYTES, load_json

#: RecordScope of ``record_function`` annotations (PyTorch's USER_SCOPE).
USER_SCOPE = 7
_INT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid")


@dataclass(frozen=True)
class IO:
    """Inputs or outputs of one node: parallel lists; ``strides`` is None when the schema has none."""

    values: list[Any]
    shapes: list[Any]
    types: list[Any]
    strides: list[Any] | None


@dataclass(frozen=True)
class EtNode:
    """One host-ET node. ``parent`` is None for a root; ``attrs`` holds every attribute by name."""

    id: int
    name: str
    parent: int | None
    rf_id: int
    tid: int
    scope: int
    op_schema: str
    fw_parent: int
    seq_id: int
    fw_tid: int
    inputs: IO
    outputs: IO
    attrs: dict[str, Any]

    @property
    def order(self) -> int:
        """Start-order key: ``rf_id`` when the trace has one, else the node id (also taken at start)."""
        return self.rf_id if self.rf_id > 0 else self.id


@dataclass
class HostEt:
    """A checked host ET: nodes by id, the schema string and the JSON's top-level facts."""

    path: Path
    schema: str
    pid: int | None
    nodes: dict[int, EtNode]
    _children: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        kids: dict[int, list[int]] = {}
        for node in self.nodes.values():
            if node.parent is not None:
                kids.setdefault(node.parent, []).append(node.id)
        for ids in kids.values():
            ids.sort(key=lambda i: (self.nodes[i].order, i))
        self._children = kids

    def children(self, node_id: int) -> list[int]:
        return self._children.get(node_id, [])

    def roots(self) -> list[int]:
        """Nodes whose parent is themselves, absent or not a node of the file, in start order."""
        out = [n.id for n in self.nodes.values() if n.parent is None]
        return sorted(out, key=lambda i: (self.nodes[i].order, i))


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _bad(path: Path, where: str, what: str) -> InvalidInputError:
    return InvalidInputError(f"{path}: {where}: {what}")


def _list(path: Path, where: str, key: str, value: Any, *, optional: bool = False) -> list[Any] | None:
    if value is None and optional:
        return None
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(path, where, f"{key!r} must be a list, got {type(value).__name__}")
    return value


def _parse_io(path: Path, where: str, raw: dict[str, Any], side: str) -> IO:
    """``side`` is "inputs" or "outputs"; reads either layout."""
    obj = raw.get(side)
    if isinstance(obj, dict):  # schema >= 1.0.2
        values = _list(path, where, f"{side}.values", obj.get("values"))
        shapes = _list(path, where, f"{side}.shapes", obj.get("shapes"))
        types = _list(path, where, f"{side}.types", obj.get("types"))
        strides = _list(path, where, f"{side}.strides", obj.get("strides"), optional=True)
    else:  # schema 1.0.1: inputs / input_shapes / input_types
        stem = side[:-1]  # "input" / "output"
        values = _list(path, where, side, obj)
        shapes = _list(path, where, f"{stem}_shapes", raw.get(f"{stem}_shapes"))
        types = _list(path, where, f"{stem}_types", raw.get(f"{stem}_types"))
        strides = _list(path, where, f"{stem}_strides", raw.get(f"{stem}_strides"), optional=True)
    assert values is not None and shapes is not None and types is not None
    return IO(values, shapes, types, strides)


def _parse_node(path: Path, index: int, raw: Any) -> EtNode:
    if not isinstance(raw, dict):
        raise _bad(path, f"node index {index}", f"expected an object, got {type(raw).__name__}")
    nid = raw.get("id")
    if not isinstance(nid, int) or isinstance(nid, bool) or nid < 0:
        raise _bad(path, f"node index {index}", f"missing or invalid 'id' ({nid!r:.40})")
    where = f"node id {nid}"
    name = raw.get("name")
    if not isinstance(name, str):
        raise _bad(path, where, f"missing or invalid 'name' ({name!r:.40})")
    attrs: dict[str, Any] = {}
    raw_attrs = raw.get("attrs")
    if raw_attrs is not None:
        if not isinstance(raw_attrs, list):
            raise _bad(path, where, f"'attrs' must be a list, got {type(raw_attrs).__name__}")
        for i, attr in enumerate(raw_attrs):
            if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
                raise _bad(path, where, f"attrs[{i}] is not an object with a string 'name'")
            attrs.setdefault(attr["name"], attr.get("value"))
    for key in (*_INT_ATTRS, "op_schema"):  # schema 1.0.1 keeps them at the top level
        if key in raw and key not in attrs:
            attrs[key] = raw[key]
    parent_raw = raw.get("ctrl_deps", raw.get("parent"))
    if parent_raw is not None and (not isinstance(parent_raw, int) or isinstance(parent_raw, bool)):
        raise _bad(path, where, f"parent ('ctrl_deps'/'parent') must be an integer id, got {parent_raw!r:.40}")
    parent = None if parent_raw is None or parent_raw == nid else parent_raw
    op_schema = attrs.get("op_schema", "")
    if not isinstance(op_schema, str):
        raise _bad(path, where, f"'op_schema' must be a string, got {type(op_schema).__name__}")
    ints = {k: _int(attrs.get(k), -1 if k == "seq_id" else 0) for k in _INT_ATTRS}
    return EtNode(
        id=nid, name=name, parent=parent, op_schema=op_schema,
        inputs=_parse_io(path, where, raw, "inputs"), outputs=_parse_io(path, where, raw, "outputs"),
        attrs=attrs, **ints,
    )


def read_host_et(path: str | Path, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> HostEt:
    """Read and check one host ET file (plain or gzip JSON).

    Raises:
        InputNotFoundError: no such file.
        InvalidInputError: not JSON, over the cap, or not a host ET (the message names the file and
            the node id or index).
    """
    p = Path(path)
    data = load_json(p, max_bytes=max_bytes, what="host execution trace")
    if not isinstance(data, dict):
        raise InvalidInputError(f"{p}: not a host execution trace: top level is a {type(data).__name__}, "
                                "expected an object with 'nodes'")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise InvalidInputError(f"{p}: not a host execution trace: no 'nodes' list at the top level")
    schema = data.get("schema", "")
    nodes: dict[int, EtNode] = {}
    for index, raw in enumerate(raw_nodes):
        node = _parse_node(p, index, raw)
        if node.id in nodes:
            raise _bad(p, f"node id {node.id}", f"appears twice (node indices {index} and an earlier one)")
        nodes[node.id] = node
    # a parent id that names no node makes its child a root
    for nid, node in list(nodes.items()):
        if node.parent is not None and node.parent not in nodes:
            nodes[nid] = replace(node, parent=None)
    return HostEt(p, schema if isinstance(schema, str) else str(schema), _int(data.get("pid"), 0) or None, nodes)


# -- values -----------------------------------------------------------------------------------------
def is_tensor_value(value: Any) -> bool:
    """``[tensor_id, storage_id, offset, numel, itemsize, device]``."""
    return (
        isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:5])
    )


def iter_tensors(value: Any, *, limit: int = 1 << 16) -> Iterator[list[int]]:
    """Every tensor value inside ``value`` (a tensor, or lists of them, nested), without recursion."""
    stack = [value]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if is_tensor_value(item):
            yield item
        elif isinstance(item, list):
            stack.extend(reversed(item))


def tensor_bytes(value: Any) -> int:
    """Total bytes (numel * itemsize) of the tensors inside ``value``."""
    return sum(max(t[3], 0) * max(t[4], 0) for t in iter_tensors(value))


def tensor_numel(value: Any) -> int:
    return sum(max(t[3], 0) for t in iter_tensors(value))


def schema_arg_names(op_schema: str) -> list[str]:
    """Argument names of a TorchScript schema ``ns::op(Type a, Type b=1, *, Type c) -> ...``.

    The keyword-only marker ``*`` is skipped, so names line up with the ET's input positions.
    Returns [] when the string is not a schema.
    """
    start = op_schema.find("(")
    if start < 0:
        return []
    depth = 0
    args: list[str] = []
    current: list[str] = []
    for ch in op_schema[start + 1:]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:  # the closing parenthesis of the argument list
                args.append("".join(current))
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current))
            current = []
            continue
        current.append(ch)
    names = []
    for arg in args:
        text = arg.split("=", 1)[0].strip()
        if not text or text == "*":
            continue
        names.append(text.split()[-1])
    return names
