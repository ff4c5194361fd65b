"""The format contract nbox's writers and its checker share: names and shapes a Chakra trace must use.

The recorder and the importer write these; ``nbox_trace.check`` checks them; replay and the bundle tools read
them. One copy, so a writer and the checker can never disagree on a name (see ``../shared/chakra-format.md``).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from nbox_trace.chakra import et_def_pb2 as pb

PG_INIT_NODE = "## process_group:init ##"
#: Attributes that mark an all-to-all with per-peer split sizes (sizes may differ across ranks).
SPLIT_ATTRS = ("nbox_in_split_sizes", "nbox_out_split_sizes", "in_split_size", "out_split_size")
MAX_PG_JSON_BYTES = 16 << 20

NODE_TYPE_NAMES = {v: k for k, v in pb.NodeType.items()}
COMM_TYPE_NAMES = {v: k for k, v in pb.CollectiveCommType.items()}
COMM_NODE_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


def node_type_name(value: int) -> str:
    return NODE_TYPE_NAMES.get(value, f"NODE_TYPE_{value}")


def comm_type_name(value: int) -> str:
    return COMM_TYPE_NAMES.get(value, f"COMM_TYPE_{value}")


def json_loads(text: str | bytes) -> Any:
    """json.loads for untrusted text: every failure (deep nesting, huge integers, bad bytes) is a ValueError."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not valid JSON: {type(exc).__name__}: {str(exc)[:120]}") from None


def parse_pg_init(values: str) -> list[dict[str, Any]]:
    """Parse the ``inputs.values`` of a ``## process_group:init ##`` node into a list of dicts.

    PyTorch writes a JSON list of process groups; Chakra's converter wraps it as a Python-literal list
    holding that JSON string (``['[{"pg_name": "0", ...}]']``). Both are accepted; nothing is evaluated
    (``ast.literal_eval`` parses literals only, and the input is size-capped).

    Raises:
        ValueError: not one of those shapes.
    """
    if len(values) > MAX_PG_JSON_BYTES:
        raise ValueError(f"process-group config is {len(values)} bytes, over the {MAX_PG_JSON_BYTES} cap")
    try:
        data: Any = json_loads(values)
    except ValueError:
        try:
            data = ast.literal_eval(values)
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError) as exc:
            raise ValueError(f"neither JSON nor a literal list: {type(exc).__name__}") from None
    out: list[dict[str, Any]] = []
    stack = [data]
    while stack:  # flatten lists and JSON strings nested inside lists, without recursion
        item = stack.pop()
        if isinstance(item, str):
            stack.append(json_loads(item))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            out.append(item)
        else:
            raise ValueError(f"unexpected {type(item).__name__} in process-group config")
    return out



__all__ = ["COMM_NODE_TYPES", "COMM_TYPE_NAMES", "MAX_PG_JSON_BYTES", "NODE_TYPE_NAMES", "PG_INIT_NODE", "SPLIT_ATTRS",
           "comm_type_name", "json_loads", "node_type_name", "parse_pg_init"]
