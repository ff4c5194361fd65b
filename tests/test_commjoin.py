"""The collective log joins the host ET by identity (issue 16): orders and nesting on the two sides differ."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nbox_record.convert.comm import by_identity
from nbox_record.convert.toplevel import walk
from nbox_record.handoff.rawformat import identity_marker, parse_identity_marker
from nbox_record.sources.hostet import read_host_et
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


def _et_node(nid: int, name: str, parent: int, rf_id: int, tid: int = 1, schema: str = "") -> dict[str, Any]:
    empty = {"values": [], "shapes": [], "types": []}
    return {"id": nid, "name": name, "ctrl_deps": parent, "inputs": empty, "outputs": empty,
            "attrs": [{"name": "rf_id", "type": "uint64", "value": rf_id},
                      {"name": "tid", "type": "uint64", "value": tid},
                      {"name": "op_schema", "type": "string", "value": schema}]}


def test_identity_goes_to_the_collective_it_was_opened_in_not_to_its_et_parent(tmp_path: Path) -> None:
    """Nodes as a real capture of tests/workloads/ddp_bn_nosync.py had them (rank 0, 2 of 20 recordings failed
    with "1 collective(s) absent from the host ET"): the observer hung DDP's second buffer broadcast (952) and
    that broadcast's identity marker (953) under the first broadcast (941), whose own marker is 942."""
    b = "c10d::broadcast_(Tensor[] tensors, ...) -> (Tensor[], Work)"
    nodes = [_et_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0),
             _et_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0),
             _et_node(928, "DistributedDataParallel.forward", 2, 600),
             _et_node(941, "c10d::broadcast_", 928, 605, schema=b),
             _et_node(942, "nbox::collective/0/4/broadcast_", 941, 606),
             _et_node(952, "c10d::broadcast_", 941, 612, schema=b),
             _et_node(953, "nbox::collective/0/5/broadcast_", 941, 613),
             _et_node(954, "gloo:broadcast", 953, 614),
             _et_node(960, "aten::add", 928, 620, tid=1, schema="aten::add(...)"),
             # another thread: its collective and its marker pair on that thread
             _et_node(970, "c10d::allreduce_", 2, 630, tid=2, schema="c10d::allreduce_(...)"),
             _et_node(971, "nbox::collective/0/6/allreduce_", 2, 631, tid=2)]
    path = tmp_path / "host_et.json"
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    w = walk(read_host_et(path))
    got = {a.node.id: a.identity for a in w.anchors}
    assert got == {941: ("0", 4, "broadcast_"), 952: ("0", 5, "broadcast_"), 970: ("0", 6, "allreduce_")}
    records = [_rec(4, "broadcast_"), _rec(5, "broadcast_"), _rec(6, "allreduce_")]
    assert {nid: r["seq"] for nid, r in by_identity(w.anchors, records, "log", "et").items()} == {
        941: 4, 952: 5, 970: 6}
