"""The collective log joins the host ET by identity (issue 16): orders and nesting on the two sides differ."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nbox_record.convertcomm import by_identity
from nbox_record.rawformat import identity_marker, parse_identity_marker
from nbox_trace.errors import InvalidInputError


def _rec(seq: int, op: str, pg: str = "0") -> dict[str, Any]:
    return {"seq": seq, "op": op, "pg_name": pg}


def _op(nid: int, op: str, ident: tuple[str, int, str] | None) -> Any:
    return SimpleNamespace(node=SimpleNamespace(id=nid, name=f"c10d::{op}"), identity=ident)


# one iteration: DDP buffer broadcasts (2), reducer all-reduce, user broadcast; the second group a subgroup
RECORDS = [_rec(0, "broadcast_"), _rec(1, "broadcast_"), _rec(2, "allreduce_"), _rec(3, "broadcast_"),
           _rec(4, "allreduce_", "1")]


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [3, 2, 1, 0, 4], [2, 0, 4, 3, 1], [4, 3, 0, 2, 1]])
def test_pairs_whatever_the_et_order(order: list[int]) -> None:
    ops = [_op(100 + s, RECORDS[s]["op"], (RECORDS[s]["pg_name"], s, RECORDS[s]["op"])) for s in order]
    got = by_identity(ops, RECORDS, "log", "et")
    assert {nid: r["seq"] for nid, r in got.items()} == {100 + s: s for s in range(5)}


def test_unmarked_et_collective_is_left_out() -> None:
    ops = [_op(1, "allreduce_", None)] + [_op(10 + r["seq"], r["op"], (r["pg_name"], r["seq"], r["op"]))
                                          for r in RECORDS]
    assert 1 not in by_identity(ops, RECORDS, "log", "et")


def test_divergence_is_named() -> None:
    ops = [_op(10 + r["seq"], r["op"], (r["pg_name"], r["seq"], r["op"])) for r in RECORDS]
    ops[2] = _op(12, "allreduce_", ("0", 2, "broadcast_"))
    with pytest.raises(InvalidInputError, match="diverge"):
        by_identity(ops, RECORDS, "log", "et")
    with pytest.raises(InvalidInputError, match="absent from the host ET"):
        by_identity([o for o in ops if o.node.id not in (12, 14)], RECORDS, "l", "e")
    with pytest.raises(InvalidInputError, match="diverge"):
        by_identity([_op(1, "broadcast_", ("1", 0, "broadcast_"))], [_rec(0, "broadcast_")], "l", "e")


def test_marker_round_trip() -> None:
    rec: Any = {"pg_name": "a/b", "seq": 7, "op": "allreduce_"}
    assert parse_identity_marker(identity_marker(rec)) == ("a/b", 7, "allreduce_")
    assert parse_identity_marker("nbox::collective/x/y/z") is None
    assert parse_identity_marker("c10d::allreduce_") is None
