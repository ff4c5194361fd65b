"""Chakra execution trace (ET) model: protobuf schema, streaming codec, attribute contract, validation.

Imports neither torch nor typer. ``et_def_pb2`` is generated from ``et_def.proto`` (see ``_regen``).
"""

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import CONTRACT_KINDS, Attr, attr_map, find_attr, make_attr, read_int, set_attr
from nbox_trace.chakra.codec import EtReader, EtWriter, GlobalMetadata, Node, encode_delimited, read_et, write_et

__all__ = [
    "CONTRACT_KINDS",
    "Attr",
    "EtReader",
    "EtWriter",
    "GlobalMetadata",
    "Node",
    "attr_map",
    "encode_delimited",
    "find_attr",
    "make_attr",
    "pb",
    "read_et",
    "read_int",
    "set_attr",
    "write_et",
]
