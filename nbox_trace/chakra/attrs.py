"""Typed access to Chakra node attributes, following the attribute contract.

Consumers look attributes up by name and read one specific ``oneof`` member; Chakra's first feeder
reads a wrong member as 0 without an error. So nbox *writes* exactly the kind the contract names
(:data:`CONTRACT_KINDS`, from ``../shared/chakra-format.md``) and *reads* any integer kind, reporting
a wrong kind instead of reading 0: :func:`read_int` returns the value together with the kind it
found, and :func:`attr_map` lists every attribute once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import TraceValueError

#: The oneof member each contract attribute must be written with.
CONTRACT_KINDS: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "pg_name": "string_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "involved_dim": "bool_list",
}

#: Scalar integer oneof members; any of them is readable as an integer.
INT_KINDS = frozenset(
    {"int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
     "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val"}
)
_INT32_RANGE = (-(1 << 31), (1 << 31) - 1)
_INT64_RANGE = (-(1 << 63), (1 << 63) - 1)
_UINT64_RANGE = (0, (1 << 64) - 1)

AttrScalar = bool | int | float | str | bytes
AttrValue = AttrScalar | list[bool] | list[int] | list[float] | list[str] | list[bytes]


@dataclass(frozen=True)
class Attr:
    """One attribute as found on a node: its value and the oneof member (kind) holding it."""

    value: AttrValue | None
    kind: str | None  # None when the attribute has no value set


def attr_value(attr: pb.AttributeProto) -> Attr:
    """The value of one AttributeProto and its kind (lists come back as Python lists)."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return Attr(None, None)
    value = getattr(attr, kind)
    if kind.endswith("_list"):
        value = list(value.values)
    return Attr(value, kind)


def attr_map(attrs: Sequence[pb.AttributeProto]) -> dict[str, Attr]:
    """All attributes of a node (or GlobalMetadata) by name; the first wins on duplicate names."""
    out: dict[str, Attr] = {}
    for attr in attrs:
        if attr.name not in out:
            out[attr.name] = attr_value(attr)
    return out


def find_attr(node: pb.Node | pb.GlobalMetadata, name: str) -> pb.AttributeProto | None:
    """The first attribute named ``name``, or None."""
    for attr in node.attr:
        if attr.name == name:
            return attr
    return None


def as_int(found: Attr) -> int | None:
    """An attribute's value as an integer if it has any integer kind (or bool), else None."""
    if found.kind in INT_KINDS or found.kind == "bool_val":
        return int(found.value)  # type: ignore[arg-type]
    return None


def read_int(node: pb.Node, name: str) -> tuple[int | None, str | None]:
    """Read an integer attribute of any integer kind: ``(value, kind)``.

    ``(None, None)`` when absent; ``(None, kind)`` when present with a non-integer kind. The caller
    compares ``kind`` with :data:`CONTRACT_KINDS` to report a wrong kind.
    """
    attr = find_attr(node, name)
    if attr is None:
        return None, None
    found = attr_value(attr)
    return as_int(found), found.kind


def read_comm_type(node: pb.Node) -> int | None:
    """A comm node's CollectiveCommType, or None if absent.

    Raises:
        TraceValueError: the value is not a CollectiveCommType.
    """
    value, kind = read_int(node, "comm_type")
    if value is None:
        if kind is not None:
            raise TraceValueError(f"node id {node.id}: comm_type has non-integer kind {kind}")
        return None
    if value not in pb.CollectiveCommType.values():
        raise TraceValueError(f"node id {node.id}: comm_type {value} is not a CollectiveCommType (0-9)")
    return value


def _check_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise TraceValueError(f"attribute {name!r}: value {value} out of range [{low}, {high}]")


def make_attr(name: str, value: AttrValue) -> pb.AttributeProto:
    """Build an AttributeProto, with the contract's kind for contract names.

    Other names get a kind inferred from the Python type: bool -> bool_val, int -> int64_val
    (uint64_val above 2**63-1), float -> double_val, str -> string_val, bytes -> bytes_val, and the
    matching ``*_list`` for lists (an empty list needs a contract name to know its kind).

    Raises:
        TraceValueError: the value does not fit the kind (wrong type or out of range).
    """
    attr = pb.AttributeProto(name=name)
    kind = CONTRACT_KINDS.get(name) or _infer_kind(name, value)
    try:
        if kind.endswith("_list"):
            if not isinstance(value, list):
                raise TraceValueError(f"attribute {name!r} needs a list for {kind}, got {type(value).__name__}")
            scalar_kind = kind[: -len("_list")] + "_val"
            for item in value:
                _check_scalar(name, scalar_kind, item)
            getattr(attr, kind).values.extend(value)
        else:
            _check_scalar(name, kind, value)
            setattr(attr, kind, value)
    except (TypeError, ValueError) as exc:
        raise TraceValueError(f"attribute {name!r}: {value!r} does not fit {kind}: {exc}") from exc
    return attr


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "bool_val": (bool,), "string_val": (str,), "bytes_val": (bytes,), "double_val": (float, int),
    "float_val": (float, int),
}


def _check_scalar(name: str, kind: str, value: object) -> None:
    """Refuse a value that the oneof member ``kind`` would silently convert (e.g. 2 -> True, True -> 1)."""
    if kind in INT_KINDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceValueError(f"attribute {name!r} needs an integer for {kind}, got {value!r}")
        bounds = {"int32_val": _INT32_RANGE, "uint64_val": _UINT64_RANGE}.get(kind, _INT64_RANGE)
        _check_range(name, value, bounds)
        if name == "comm_type" and value not in pb.CollectiveCommType.values():
            raise TraceValueError(f"attribute 'comm_type': {value} is not a CollectiveCommType (0-9)")
        return
    allowed = _PY_TYPES.get(kind)
    if allowed is not None and (not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool))):
        raise TraceValueError(f"attribute {name!r} needs {allowed[0].__name__} for {kind}, got {value!r}")


def _infer_kind(name: str, value: AttrValue) -> str:
    if isinstance(value, list):
        if not value:
            raise TraceValueError(f"attribute {name!r}: cannot infer the kind of an empty list")
        return _infer_kind(name, value[0]).replace("_val", "_list")
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "uint64_val" if value > _INT64_RANGE[1] else "int64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, bytes):
        return "bytes_val"
    raise TraceValueError(f"attribute {name!r}: unsupported value type {type(value).__name__}")


def set_attr(node: pb.Node | pb.GlobalMetadata, name: str, value: AttrValue) -> None:
    """Set (replace or append) attribute ``name`` on a node with the contract's kind."""
    new = make_attr(name, value)
    for attr in node.attr:
        if attr.name == name:
            attr.CopyFrom(new)
            return
    node.attr.append(new)
