"""Chakra execution trace (ET) model: protobuf schema, streaming codec, attribute contract, validation.

Imports neither torch nor typer. ``et_def_pb2`` is generated from ``et_def.proto`` (see ``_regen``).

The room's door: the codec (``codec``), the attribute contract (``attrs``), a trace's per-rank files (``tracefiles``)
and the generated protobuf module (``et_def_pb2``, imported ``as pb``). ``nbox.chakra`` re-exports the part users
import. May import: ``nbox_trace.errors`` only.
"""

from nbox_trace.chakra import et_def_pb2
from nbox_trace.chakra.attrs import (
    CONTRACT_KINDS,
    Attr,
    AttrValue,
    as_int,
    attr_map,
    find_attr,
    make_attr,
    read_int,
    set_attr,
)
from nbox_trace.chakra.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    EtReader,
    EtWriter,
    GlobalMetadata,
    Node,
    encode_delimited,
    read_et,
    write_et,
)
from nbox_trace.chakra.tracefiles import TraceSet, resolve_trace_set

__all__ = [
    "CONTRACT_KINDS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Attr",
    "AttrValue",
    "TraceSet",
    "as_int",
    "et_def_pb2",
    "resolve_trace_set",
    "EtReader",
    "EtWriter",
    "GlobalMetadata",
    "Node",
    "attr_map",
    "encode_delimited",
    "find_attr",
    "make_attr",
    "read_et",
    "read_int",
    "set_attr",
    "write_et",
]
