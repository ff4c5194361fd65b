"""Unit tests of nbox_trace.chakra.attrs: the attribute contract, typed reads, make_attr/set_attr."""

from __future__ import annotations

import math

import pytest
from google.protobuf.descriptor import FieldDescriptor

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import (
    CONTRACT_KINDS,
    INT_KINDS,
    Attr,
    as_int,
    attr_map,
    attr_value,
    find_attr,
    make_attr,
    read_comm_type,
    read_int,
    set_attr,
)
from nbox_trace.errors import InvalidInputError, NboxError, TraceValueError

ONEOF_FIELDS = {f.name: f for f in pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields}

#: The table "Attribute contract consumers rely on" of ../shared/chakra-format.md.
CONTRACT_TABLE = {
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

#: A valid value for each contract kind.
GOOD_VALUE = {
    "bool_val": False,
    "int64_val": 1 << 40,
    "int32_val": -7,
    "uint64_val": (1 << 64) - 1,
    "string_val": "10",
    "bool_list": [True, False, True],
}

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT64 = (0, (1 << 64) - 1)


def node_with(*attrs: pb.AttributeProto, nid: int = 3) -> pb.Node:
    node = pb.Node(id=nid, name="n", type=pb.COMM_COLL_NODE)
    node.attr.extend(attrs)
    return node


def raw_attr(name: str, kind: str, value: object) -> pb.AttributeProto:
    """An AttributeProto with ``value`` in oneof member ``kind``, bypassing make_attr."""
    attr = pb.AttributeProto(name=name)
    if kind.endswith("_list"):
        getattr(attr, kind).values.extend(value)  # type: ignore[call-overload]
    else:
        setattr(attr, kind, value)
    return attr


# -- the contract ------------------------------------------------------------------------------
def test_contract_kinds_match_the_format_document() -> None:
    assert CONTRACT_KINDS == CONTRACT_TABLE
    assert set(CONTRACT_KINDS.values()) <= set(ONEOF_FIELDS)


def test_int_kinds_are_exactly_the_scalar_integer_members() -> None:
    integer_types = {
        FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
    scalar_ints = {name for name, f in ONEOF_FIELDS.items() if f.type in integer_types}
    assert scalar_ints == INT_KINDS
    assert len(INT_KINDS) == 10


@pytest.mark.parametrize("name", sorted(CONTRACT_TABLE))
def test_make_attr_writes_exactly_the_contract_kind(name: str) -> None:
    kind = CONTRACT_TABLE[name]
    value = pb.REDUCE_SCATTER if name == "comm_type" else GOOD_VALUE[kind]  # comm_type must be an enum value
    attr = make_attr(name, value)
    assert attr.name == name
    assert attr.WhichOneof("value") == kind
    assert attr_value(attr) == Attr(value, kind)
    # survives serialization with the same member
    back = pb.AttributeProto.FromString(attr.SerializeToString())
    assert back.WhichOneof("value") == kind
    assert back == attr


def test_contract_kind_wins_over_inference() -> None:
    # An int for comm_src is an int32_val (inference alone would say int64_val); a small
    # tensor_size is still uint64_val; num_ops never becomes uint64_val.
    assert make_attr("comm_src", 3).WhichOneof("value") == "int32_val"
    assert make_attr("tensor_size", 3).WhichOneof("value") == "uint64_val"
    assert make_attr("comm_size", 0).WhichOneof("value") == "int64_val"
    assert make_attr("involved_dim", []).WhichOneof("value") == "bool_list"  # empty list is fine with a contract name
    assert make_attr("is_cpu_op", True).bool_val is True


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("comm_src", *INT32), ("comm_dst", *INT32), ("comm_tag", *INT32), ("comm_priority", *INT32),
        ("comm_size", *INT64), ("num_ops", *INT64),
        ("tensor_size", *UINT64),
    ],
)
def test_integer_contract_ranges(name: str, low: int, high: int) -> None:
    kind = CONTRACT_TABLE[name]
    assert getattr(make_attr(name, low), kind) == low
    assert getattr(make_attr(name, high), kind) == high
    for bad in (low - 1, high + 1):
        with pytest.raises(TraceValueError, match="out of range") as info:
            make_attr(name, bad)
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("is_cpu_op", 0),
        ("is_cpu_op", 1),
        ("is_cpu_op", "false"),
        ("is_cpu_op", None),
        ("comm_size", True),  # bool is not an integer here
        ("comm_size", 1.0),
        ("comm_size", "1048576"),
        ("comm_size", None),
        ("comm_src", 2.5),
        ("tensor_size", [1]),
        ("pg_name", 1),
        ("pg_name", b"1"),
        ("pg_name", None),
        ("pg_name", "\ud800"),  # lone surrogate: not encodable as UTF-8
        ("involved_dim", True),
        ("involved_dim", (True, False)),
        ("involved_dim", ["yes"]),
        ("involved_dim", [None]),
        ("num_ops", 1e9),
    ],
)
def test_make_attr_wrong_type_raises(name: str, value: object) -> None:
    with pytest.raises(TraceValueError) as info:
        make_attr(name, value)  # type: ignore[arg-type]
    assert name in str(info.value)
    assert isinstance(info.value, InvalidInputError)
    assert isinstance(info.value, NboxError)
    assert info.value.exit_code == 3


@pytest.mark.parametrize(("name", "value"), [("involved_dim", [2]), ("involved_dim", [1, 0]), ("x", [True, 2])])
def test_make_attr_list_elements_are_type_checked(name: str, value: list[object]) -> None:
    with pytest.raises(TraceValueError):
        make_attr(name, value)  # type: ignore[arg-type]


# -- inference for names outside the contract ----------------------------------------------------
@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "bool_val"),
        (False, "bool_val"),
        (0, "int64_val"),
        (-1, "int64_val"),
        (INT64[0], "int64_val"),
        (INT64[1], "int64_val"),
        (INT64[1] + 1, "uint64_val"),
        (UINT64[1], "uint64_val"),
        (1.25, "double_val"),
        (-0.0, "double_val"),
        ("text", "string_val"),
        ("", "string_val"),
        (b"\x00\xff", "bytes_val"),
        ([True, False], "bool_list"),
        ([1, -2, 3], "int64_list"),
        ([INT64[1] + 1], "uint64_list"),
        ([0.5, 1.5], "double_list"),
        (["a", "b"], "string_list"),
        ([b"a", b""], "bytes_list"),
    ],
)
def test_make_attr_infers_kind_for_other_names(value: object, kind: str) -> None:
    attr = make_attr("custom", value)  # type: ignore[arg-type]
    assert attr.WhichOneof("value") == kind
    assert attr_value(attr) == Attr(value, kind)  # type: ignore[arg-type]


def test_make_attr_double_keeps_special_values() -> None:
    assert math.isnan(make_attr("x", math.nan).double_val)
    assert make_attr("x", math.inf).double_val == math.inf


@pytest.mark.parametrize(
    "value",
    [
        UINT64[1] + 1,  # too big for any integer kind
        INT64[0] - 1,  # too small for int64
        [],  # empty list: kind unknown without a contract name
        [1, INT64[1] + 1],  # kind from the first element, second does not fit int64
        [1, 1.5],
        [b"a", "b"],
        None,
        (1, 2),
        {"a": 1},
        object(),
        "\udcff",
    ],
)
def test_make_attr_inference_refuses(value: object) -> None:
    with pytest.raises(TraceValueError, match="custom"):
        make_attr("custom", value)  # type: ignore[arg-type]


# -- set_attr ----------------------------------------------------------------------------------
def test_set_attr_appends_then_replaces_in_place() -> None:
    node = pb.Node(id=1, name="n", type=pb.COMM_COLL_NODE)
    set_attr(node, "is_cpu_op", False)
    set_attr(node, "comm_size", 10)
    set_attr(node, "custom", "a")
    assert [a.name for a in node.attr] == ["is_cpu_op", "comm_size", "custom"]
    set_attr(node, "comm_size", 20)
    set_attr(node, "custom", 5)  # kind changes with the value
    assert [a.name for a in node.attr] == ["is_cpu_op", "comm_size", "custom"]
    assert attr_map(node.attr) == {
        "is_cpu_op": Attr(False, "bool_val"),
        "comm_size": Attr(20, "int64_val"),
        "custom": Attr(5, "int64_val"),
    }


def test_set_attr_fixes_a_wrong_kind() -> None:
    node = node_with(raw_attr("comm_size", "uint64_val", 1048576), raw_attr("is_cpu_op", "int32_val", 0))
    set_attr(node, "comm_size", 1048576)
    set_attr(node, "is_cpu_op", False)
    assert len(node.attr) == 2
    assert read_int(node, "comm_size") == (1048576, "int64_val")
    assert read_int(node, "is_cpu_op") == (0, "bool_val")


def test_set_attr_replaces_only_the_first_duplicate() -> None:
    node = node_with(raw_attr("pg_name", "string_val", "1"), raw_attr("pg_name", "string_val", "2"))
    set_attr(node, "pg_name", "7")
    assert [a.string_val for a in node.attr] == ["7", "2"]
    assert attr_map(node.attr)["pg_name"] == Attr("7", "string_val")


def test_set_attr_on_global_metadata() -> None:
    metadata = pb.GlobalMetadata(version="1.0.0")
    set_attr(metadata, "schema", "1.1.1-chakra.0.0.4")
    set_attr(metadata, "schema", "x")
    assert list(metadata.attr) == [make_attr("schema", "x")]
    assert find_attr(metadata, "schema") == make_attr("schema", "x")


def test_set_attr_invalid_value_leaves_node_unchanged() -> None:
    node = node_with(make_attr("comm_src", 1))
    before = node.SerializeToString()
    with pytest.raises(TraceValueError):
        set_attr(node, "comm_src", 1 << 40)
    with pytest.raises(TraceValueError):
        set_attr(node, "comm_dst", "2")
    assert node.SerializeToString() == before


# -- reading -------------------------------------------------------------------------------------
SIGNED_KINDS = {"int32_val", "int64_val", "sint32_val", "sint64_val", "sfixed32_val", "sfixed64_val"}


@pytest.mark.parametrize("kind", sorted(INT_KINDS))
def test_read_int_on_every_integer_kind(kind: str) -> None:
    for value in (0, 1048576, -5 if kind in SIGNED_KINDS else 4_000_000_000):
        node = node_with(make_attr("other", "x"), raw_attr("comm_size", kind, value))
        assert read_int(node, "comm_size") == (value, kind)
        assert as_int(attr_value(find_attr(node, "comm_size"))) == value  # type: ignore[arg-type]


def test_read_int_bool_absent_and_non_integer() -> None:
    node = node_with(
        raw_attr("is_cpu_op", "bool_val", True),
        raw_attr("pg_name", "string_val", "3"),
        raw_attr("ratio", "double_val", 2.0),
        raw_attr("dims", "int64_list", [1, 2]),
        pb.AttributeProto(name="unset"),
    )
    assert read_int(node, "is_cpu_op") == (1, "bool_val")
    assert read_int(node, "pg_name") == (None, "string_val")
    assert read_int(node, "ratio") == (None, "double_val")
    assert read_int(node, "dims") == (None, "int64_list")
    assert read_int(node, "unset") == (None, None)
    assert read_int(node, "missing") == (None, None)


def test_attr_map_first_wins_and_lists_come_back_as_lists() -> None:
    attrs = [
        raw_attr("a", "int32_val", 1),
        raw_attr("a", "string_val", "second"),
        raw_attr("l", "uint64_list", [1, 2]),
        raw_attr("f", "float_list", [0.5]),
        pb.AttributeProto(name="empty"),
    ]
    found = attr_map(attrs)
    assert found == {
        "a": Attr(1, "int32_val"),
        "l": Attr([1, 2], "uint64_list"),
        "f": Attr([0.5], "float_list"),
        "empty": Attr(None, None),
    }
    assert isinstance(found["l"].value, list)
    assert find_attr(node_with(*attrs), "a") == attrs[0]
    assert find_attr(node_with(*attrs), "zzz") is None


@pytest.mark.parametrize("value", range(10))
def test_read_comm_type_accepts_every_collective(value: int) -> None:
    assert read_comm_type(node_with(make_attr("comm_type", value))) == value
    # any integer kind is readable
    assert read_comm_type(node_with(raw_attr("comm_type", "uint64_val", value))) == value


@pytest.mark.parametrize("value", [42, 10, -1, 1 << 40])
def test_read_comm_type_rejects_unknown_values(value: int) -> None:
    node = node_with(pb.AttributeProto(name="comm_type", int64_val=value), nid=17)  # make_attr would refuse it
    with pytest.raises(TraceValueError, match=str(value)) as info:
        read_comm_type(node)
    assert "node id 17" in str(info.value)


def test_read_comm_type_absent_and_wrong_kind() -> None:
    assert read_comm_type(node_with()) is None
    assert read_comm_type(node_with(make_attr("comm_size", 4))) is None
    with pytest.raises(TraceValueError, match="string_val"):
        read_comm_type(node_with(raw_attr("comm_type", "string_val", "ALL_REDUCE")))


@pytest.mark.parametrize("value", [-1, 10, 42, 1 << 40])
def test_make_attr_refuses_a_comm_type_outside_the_enum(value: int) -> None:
    with pytest.raises(TraceValueError, match="comm_type"):
        make_attr("comm_type", value)
