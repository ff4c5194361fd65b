"""The metadata of one converted rank: the ET's ``GlobalMetadata`` and the ``## process_group:init ##``
``METADATA_NODE`` whose ``inputs.values`` is the JSON list of process groups (the ET's own entries,
merged, plus the groups learnt from the collectives)."""

from __future__ import annotations

from nbox_record.convert.attrs import dumps
from nbox_record.convert.groups import ProcessGroups
from nbox_trace import __version__
from nbox_trace.chakra import AttrValue, make_attr
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.contract import PG_INIT_NODE

METADATA_VERSION = "1.0.0"


def pg_init_node(pgs: ProcessGroups) -> pb.Node | None:
    """The process-group metadata node, or None when no group is known."""
    entries = list(pgs.pg_entries)
    known = {str(e.get("pg_name", "")) for e in entries}
    for name, ranks in pgs.groups.items():
        if name not in known:
            entries.append({"pg_name": name, "pg_desc": pgs.group_desc.get(name, ""), "backend_config": "",
                            "ranks": ranks, "group_size": len(ranks), "group_count": len(pgs.groups)})
    if not entries:
        return None
    node = pb.Node(name=PG_INIT_NODE, type=pb.METADATA_NODE)
    node.inputs.CopyFrom(pb.IOInfo(values=dumps(entries), shapes="[[]]", types='["String"]'))
    return node


def global_metadata(schema: str, rank: int, comm_source: str, join_method: str,
                    world_size: int | None) -> pb.GlobalMetadata:
    """The ET's ``GlobalMetadata``: source schema, producer, rank, comm source, Kineto join, world size."""
    meta = pb.GlobalMetadata(version=METADATA_VERSION)
    attrs: list[tuple[str, AttrValue]] = [
        ("schema", schema), ("nbox_producer", f"nbox {__version__} convert"), ("nbox_rank", rank),
        ("nbox_comm_source", comm_source), ("nbox_kineto_join", join_method),
    ]
    if world_size is not None:
        attrs.append(("nbox_world_size", world_size))
    meta.attr.extend(make_attr(k, v) for k, v in attrs)
    return meta
