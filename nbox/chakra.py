"""The documented Chakra ET entry points (``from nbox.chakra import EtReader, ...``), re-exported from their home,
:mod:`nbox_trace.chakra`."""

from nbox_trace.chakra import (
    CONTRACT_KINDS,
    Attr,
    EtReader,
    EtWriter,
    GlobalMetadata,
    Node,
    attr_map,
    encode_delimited,
    find_attr,
    make_attr,
    read_et,
    read_int,
    set_attr,
    write_et,
)
from nbox_trace.chakra import et_def_pb2 as pb

__all__ = [
    "CONTRACT_KINDS", "Attr", "EtReader", "EtWriter", "GlobalMetadata", "Node", "attr_map", "encode_delimited",
    "find_attr", "make_attr", "pb", "read_et", "read_int", "set_attr", "write_et",
]
