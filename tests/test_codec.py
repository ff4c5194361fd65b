"""Unit tests of nbox_trace.chakra.codec: real sample files, round trips, bad input, the atomic writer."""

from __future__ import annotations

import gzip
import json
import os
import stat
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import Attr, attr_map, find_attr, read_comm_type, read_int
from nbox_trace.chakra.codec import (
    MAX_KNOWN_NODE_TYPE,
    EtReader,
    EtWriter,
    ZeroLengthMessage,
    encode_delimited,
    read_et,
    write_et,
)
from nbox_trace.errors import NboxError, TraceDecodeError, TraceLimitError, TraceWriteError

MiB = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"


# -- helpers ---------------------------------------------------------------------------------
def mknode(nid: int, name: str | None = None, ntype: int = pb.COMP_NODE, **fields: object) -> pb.Node:
    return pb.Node(id=nid, name=f"n{nid}" if name is None else name, type=ntype, **fields)  # type: ignore[arg-type]


def et_bytes(metadata: pb.GlobalMetadata, *messages: pb.Node) -> bytes:
    return encode_delimited(metadata) + b"".join(encode_delimited(m) for m in messages)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def bad_type_body(nid: int, ntype: int = 99) -> bytes:
    """A Node message (id ``nid``, name "x") whose NodeType is ``ntype``."""
    return pb.Node(id=nid, name="x").SerializeToString() + b"\x18" + varint(ntype & ((1 << 64) - 1))


def load(path: Path, **kwargs: int) -> tuple[EtReader, pb.GlobalMetadata, list[pb.Node]]:
    with EtReader(path, **kwargs) as reader:
        nodes = list(reader)
    return reader, reader.metadata, nodes


def read_fully(path: Path, **kwargs: int) -> list[pb.Node]:
    """Open and iterate ``path`` to the end (errors may come from either step)."""
    with EtReader(path, **kwargs) as reader:
        return list(reader)


def assert_located(
    exc: TraceDecodeError, path: Path, *, offset: int | None = None, node_index: int | None = None
) -> None:
    """The error names the file, and where given the byte offset and node index (attribute and text)."""
    text = str(exc)
    assert str(path) in text
    assert exc.path == str(path)
    if offset is not None:
        assert exc.offset == offset
        assert f"byte offset {offset}" in text
    if node_index is not None:
        assert exc.node_index == node_index
        if node_index < 0:
            assert "GlobalMetadata message" in text
        else:
            assert f"node index {node_index}" in text


META = pb.GlobalMetadata(version="0.0.4")

COLL_BY_FOLDER = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "all_to_all": pb.ALL_TO_ALL,
                  "reduce_scatter": pb.REDUCE_SCATTER}


def rank_of(path: Path) -> int:
    prefix, rank, ext = path.name.rsplit(".", 2)
    assert ext == "et" and prefix
    return int(rank)


def ranked(folder: Path, pattern: str = "*.et") -> list[Path]:
    return sorted(folder.glob(pattern), key=rank_of)


# -- 1. sample files decode with the facts of MANIFEST.md -------------------------------------
def test_sample_inventory(samples: Path) -> None:
    micro = samples / "chakra_et" / "astra-sim_microbenchmarks"
    assert len(list(micro.rglob("*.et"))) == 112
    for coll in COLL_BY_FOLDER:
        for npus in (4, 8, 16):
            folder = micro / coll / f"{npus}npus_1MB"
            assert [rank_of(p) for p in ranked(folder)] == list(range(npus)), folder


def test_every_sample_decodes_cleanly(sample_et: Path) -> None:
    reader, metadata, nodes = load(sample_et)
    assert not reader.compressed
    assert reader.zero_length_messages == []
    assert reader.messages_read == len(nodes) > 0
    assert all(n.name for n in nodes)
    assert all(pb.METADATA_NODE <= n.type <= pb.COMM_COLL_NODE for n in nodes)
    ids = [n.id for n in nodes]
    assert all(a < b for a, b in pairwise(ids)), "ids strictly increasing in every sample"
    # read_et gives the same as streaming
    assert read_et(sample_et) == (metadata, nodes)


def test_microbenchmark_facts(microbench_et: Path) -> None:
    npus_dir = microbench_et.parent.name  # e.g. "8npus_1MB"
    coll = microbench_et.parent.parent.name  # e.g. "all_reduce"
    rank = rank_of(microbench_et)
    # MANIFEST says 81-86 bytes; the reduce_scatter files are 87-88 bytes (longer node name).
    assert 81 <= microbench_et.stat().st_size <= 88
    _, metadata, nodes = load(microbench_et)
    assert metadata.version == "0.0.4"
    assert list(metadata.attr) == []
    assert len(nodes) == 1
    (node,) = nodes
    assert node.type == pb.COMM_COLL_NODE
    assert node.id == rank
    assert node.name == f"{coll}_{npus_dir}"
    assert attr_map(node.attr) == {
        "is_cpu_op": Attr(False, "bool_val"),
        "comm_type": Attr(COLL_BY_FOLDER[coll], "int64_val"),
        "comm_size": Attr(1048576, "int64_val"),
    }
    assert read_comm_type(node) == COLL_BY_FOLDER[coll]


def test_custom_ring_allreduce(samples: Path) -> None:
    files = ranked(samples / "chakra_et" / "astra-sim_custom_ring_allreduce_8npus_1MB")
    assert [rank_of(p) for p in files] == list(range(8))
    for path in files:
        rank = rank_of(path)
        _, metadata, nodes = load(path)
        assert metadata.version == ""
        assert attr_map(metadata.attr)["schema"] == Attr("1.0.2-chakra.0.0.4", "string_val")
        assert len(nodes) == 35
        assert Counter(n.type for n in nodes) == {pb.COMM_SEND_NODE: 14, pb.COMM_RECV_NODE: 14, pb.COMP_NODE: 7}
        assert [n.id for n in nodes] == list(range(35))
        for prev, node in pairwise(nodes):
            assert list(node.data_deps) == [prev.id]
        for node in nodes:
            attrs = attr_map(node.attr)
            if node.type == pb.COMP_NODE:
                assert node.duration_micros == 7
                continue
            # comm_type holds the NodeType number here, not a CollectiveCommType
            assert attrs["comm_type"] == Attr(node.type, "int64_val")
            assert attrs["comm_size"] == Attr(131072, "int64_val")
            assert attrs["comm_tag"] == Attr(0, "int32_val")
            if node.type == pb.COMM_SEND_NODE:
                assert attrs["comm_dst"] == Attr((rank + 1) % 8, "int32_val")
            else:
                assert attrs["comm_src"] == Attr((rank - 1) % 8, "int32_val")
            for name in ("comm_src", "comm_dst", "comm_tag"):
                assert read_int(node, name)[1] in (None, "int32_val")


def test_tutorial_allreduce(samples: Path) -> None:
    cases = {"tutorial_allreduce_8npus": (8, [True, True]), "tutorial_allreduce_128": (1, [True])}
    for folder, (nfiles, dims) in cases.items():
        files = ranked(samples / "chakra_et" / folder)
        assert [rank_of(p) for p in files] == list(range(nfiles))
        for path in files:
            _, metadata, nodes = load(path)
            assert metadata.version == "0.0.4"
            assert len(nodes) == 1 and nodes[0].type == pb.COMM_COLL_NODE
            assert read_comm_type(nodes[0]) == pb.ALL_REDUCE
            assert read_int(nodes[0], "comm_size") == (1 << 20, "int64_val")
            assert attr_map(nodes[0].attr)["involved_dim"] == Attr(dims, "bool_list")


def test_tutorial_mlp_model_parallel(samples: Path) -> None:
    files = ranked(samples / "chakra_et" / "tutorial_mlp_model_parallel")
    assert [rank_of(p) for p in files] == [0, 1]
    for path in files:
        _, metadata, nodes = load(path)
        assert attr_map(metadata.attr)["schema"] == Attr("1.0.2-chakra.0.0.4", "string_val")
        assert len(nodes) == 29
        assert Counter(n.type for n in nodes) == {pb.COMP_NODE: 18, pb.COMM_COLL_NODE: 11}
        colls = Counter(read_comm_type(n) for n in nodes if n.type == pb.COMM_COLL_NODE)
        assert colls == {pb.ALL_GATHER: 6, pb.ALL_REDUCE: 5}
        assert all(find_attr(n, "is_cpu_op") is None for n in nodes)
        # data_deps chain: every node but the first depends on earlier nodes only
        seen: set[int] = set()
        for i, node in enumerate(nodes):
            assert (len(node.data_deps) > 0) == (i > 0)
            assert set(node.data_deps) <= seen
            seen.add(node.id)


def test_multi_pg_t1d(samples: Path) -> None:
    base = samples / "chakra_et" / "multi_pg_T1D"
    groups = json.loads((base / "inputs" / "comm_group.json").read_text())
    assert groups == {"0": list(range(8))}
    files = ranked(base / "trace")
    assert [rank_of(p) for p in files] == list(range(8))
    for path in files:
        _, _, nodes = load(path)
        assert len(nodes) == 1
        assert read_comm_type(nodes[0]) == pb.ALL_REDUCE
        assert attr_map(nodes[0].attr)["pg_name"] == Attr("0", "string_val")


def test_multi_pg_t3d(samples: Path) -> None:
    base = samples / "chakra_et" / "multi_pg_T3D"
    groups = json.loads((base / "inputs" / "comm_group.json").read_text())
    assert len(groups) == 12 and all(len(ranks) == 2 for ranks in groups.values())
    files = ranked(base / "trace")
    assert [rank_of(p) for p in files] == list(range(8))
    used: set[str] = set()
    for path in files:
        rank = rank_of(path)
        _, _, nodes = load(path)
        assert [n.type for n in nodes] == [pb.COMM_COLL_NODE, pb.COMP_NODE] * 2 + [pb.COMM_COLL_NODE]
        assert [n.duration_micros for n in nodes if n.type == pb.COMP_NODE] == [100, 100]
        pgs = []
        for node in nodes[::2]:
            assert read_comm_type(node) == pb.ALL_REDUCE
            found = attr_map(node.attr)["pg_name"]
            assert found.kind == "string_val"
            assert rank in groups[found.value], f"rank {rank} is not in process group {found.value}"
            pgs.append(found.value)
        used.update(pgs)
        if rank == 2:
            # MANIFEST's example ("1", "4", "10") is rank 2's; each rank uses the 3 groups it belongs to.
            assert pgs == ["1", "4", "10"]
    assert used == set(groups)


def test_chakra_converter_old(samples: Path) -> None:
    _, _, nodes = load(samples / "chakra_et" / "chakra_converter_old" / "chakra.0.et")
    assert len(nodes) == 3664
    assert Counter(n.type for n in nodes) == {pb.COMP_NODE: 3643, pb.COMM_COLL_NODE: 21}
    colls = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
    with_type = [n for n in colls if find_attr(n, "comm_type") is not None]
    with_size = [n for n in colls if find_attr(n, "comm_size") is not None]
    assert len(with_type) == 7 and [n.id for n in with_size] == [n.id for n in with_type]
    assert Counter(read_comm_type(n) for n in with_type) == {pb.ALL_REDUCE: 5, pb.BROADCAST: 2}
    ids = {n.id for n in nodes}
    assert any(dep not in ids for n in nodes for dep in n.ctrl_deps), "dangling ctrl_deps expected"


def test_cpu_gloo_official_pipeline(samples: Path) -> None:
    for rank in (0, 1):
        _, metadata, nodes = load(samples / "cpu_gloo_official_pipeline" / f"chakra_trace.{rank}.et")
        assert attr_map(metadata.attr)["schema"] == Attr("1.1.1-chakra.0.0.4", "string_val")
        assert len(nodes) == 425
        assert Counter(n.type for n in nodes) == {pb.COMP_NODE: 423, pb.METADATA_NODE: 2}
        assert [n.name for n in nodes if n.type == pb.METADATA_NODE] == ["## process_group:init ##"] * 2
        assert all(n.start_time_micros == 0 for n in nodes)
        ids = {n.id for n in nodes}
        assert sum(dep not in ids for n in nodes for dep in n.ctrl_deps) == 2


def test_typetest_wrong_kinds_are_read_not_zeroed(samples: Path) -> None:
    _, metadata, nodes = load(samples / "cpu_gloo_official_pipeline" / "typetest.0.et")
    assert metadata.version == "1.0.0"
    assert [n.type for n in nodes] == [pb.COMM_COLL_NODE] * 2
    wrong, right = nodes
    assert read_int(wrong, "comm_size") == (1048576, "uint64_val")
    assert read_int(wrong, "is_cpu_op") == (0, "int32_val")
    assert read_comm_type(wrong) == pb.ALL_REDUCE
    assert read_int(right, "comm_size") == (2097152, "int64_val")
    assert read_int(right, "is_cpu_op") == (0, "bool_val")
    assert read_comm_type(right) == pb.ALL_GATHER


# -- 2. round trips ----------------------------------------------------------------------------
def test_round_trip_raw(sample_et: Path, tmp_path: Path) -> None:
    metadata, nodes = read_et(sample_et)
    out = write_et(tmp_path / sample_et.name, metadata, nodes)
    assert out == tmp_path / sample_et.name
    metadata2, nodes2 = read_et(out)
    assert metadata2 == metadata
    assert nodes2 == nodes
    # The samples are canonical serializations: re-encoding reproduces them byte for byte.
    assert out.read_bytes() == sample_et.read_bytes()


def test_round_trip_gzip(sample_et: Path, tmp_path: Path) -> None:
    metadata, nodes = read_et(sample_et)
    out = write_et(tmp_path / sample_et.name, metadata, nodes, compress=True)
    data = out.read_bytes()
    assert data[:2] == GZIP_MAGIC
    assert gzip.decompress(data) == sample_et.read_bytes()
    reader, metadata2, nodes2 = load(out)
    assert reader.compressed
    assert metadata2 == metadata
    assert nodes2 == nodes


def test_gzip_output_is_deterministic(tmp_path: Path) -> None:
    nodes = [mknode(i) for i in range(1, 50)]
    a = write_et(tmp_path / "a.0.et", META, nodes, compress=True).read_bytes()
    b = write_et(tmp_path / "b.0.et", META, nodes, compress=True).read_bytes()
    assert a == b
    assert a[4:8] == b"\x00" * 4, "gzip header MTIME is 0: same nodes give the same bytes at any time"


def test_round_trip_large_nodes_and_many_chunks(tmp_path: Path) -> None:
    """Messages >= 128 bytes (slow path), >= 16 KiB (long varint) and a file spanning several read chunks."""
    big = mknode(1, ntype=pb.COMP_NODE, inputs=pb.IOInfo(values="x" * 20000, shapes="[[1]]", types="f"))
    huge = mknode(2, ntype=pb.COMP_NODE, outputs=pb.IOInfo(values="y" * (2 * MiB)))
    many = [mknode(i, name="node-" + "z" * 150, ctrl_deps=[i - 1], data_deps=[i - 1]) for i in range(3, 20003)]
    nodes = [big, huge, *many]
    for compress in (False, True):
        path = write_et(tmp_path / f"big{int(compress)}.et", META, nodes, compress=compress)
        assert path.stat().st_size > (0 if compress else 5 * MiB)
        metadata, back = read_et(path)
        assert metadata == META
        assert back == nodes


def test_reader_accepts_draft_node_types_and_unknown_fields(tmp_path: Path) -> None:
    # Newer Chakra drafts add NodeType 8-10 and Node field 11: read, not refused; unknown fields survive.
    payloads = []
    for ntype in range(8, MAX_KNOWN_NODE_TYPE + 1):
        body = mknode(ntype, ntype=pb.COMP_NODE).SerializeToString()
        body = body.replace(bytes([0x18, pb.COMP_NODE]), bytes([0x18, ntype]))
        payloads.append(body + b"\x58\x2a")  # field 11, varint 42
    path = tmp_path / "draft.0.et"
    path.write_bytes(encode_delimited(META) + b"".join(varint(len(p)) + p for p in payloads))
    _, _, nodes = load(path)
    assert [n.type for n in nodes] == [8, 9, 10]
    out = write_et(tmp_path / "draft_copy.0.et", META, nodes)
    assert out.read_bytes() == path.read_bytes()


def test_padded_ten_byte_varint_is_accepted(tmp_path: Path) -> None:
    body = mknode(1).SerializeToString()
    assert len(body) < 0x80
    padded = bytes([len(body) | 0x80]) + b"\x80" * 8 + b"\x00"  # same value, 10 bytes
    path = tmp_path / "padded.0.et"
    path.write_bytes(encode_delimited(META) + padded + body)
    assert read_fully(path) == [mknode(1)]


def test_empty_metadata_is_a_zero_length_first_message(tmp_path: Path) -> None:
    path = write_et(tmp_path / "m.0.et", pb.GlobalMetadata(), [mknode(1)])
    assert path.read_bytes()[:1] == b"\x00"
    reader, metadata, nodes = load(path)
    assert metadata == pb.GlobalMetadata()
    assert nodes == [mknode(1)]
    assert reader.zero_length_messages == []


# -- 3. bad input ------------------------------------------------------------------------------
def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.0.et"
    path.write_bytes(b"")
    with pytest.raises(TraceDecodeError, match="empty file") as info:
        EtReader(path)
    assert_located(info.value, path, offset=0, node_index=-1)


def test_truncated_varint_at_end(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1))
    path = tmp_path / "t.0.et"
    path.write_bytes(head + b"\xd0\x86")  # continuation bit set on the last byte
    with EtReader(path) as reader:
        it = iter(reader)
        assert next(it) == mknode(1)
        with pytest.raises(TraceDecodeError, match="truncated length prefix") as info:
            next(it)
    assert_located(info.value, path, offset=len(head), node_index=1)


def test_truncated_varint_in_metadata(tmp_path: Path) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(b"\x80")
    with pytest.raises(TraceDecodeError) as info:
        EtReader(path)
    assert_located(info.value, path, offset=0, node_index=-1)


def test_length_past_end_of_file(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1), mknode(2))
    tail = encode_delimited(mknode(3))
    path = tmp_path / "short.0.et"
    path.write_bytes(head + tail[:-3])
    with pytest.raises(TraceDecodeError, match="past end of file") as info:
        read_fully(path)
    assert not isinstance(info.value, TraceLimitError)
    assert_located(info.value, path, offset=len(head), node_index=2)


def test_length_over_max_message_bytes(tmp_path: Path) -> None:
    small = mknode(1)
    big = mknode(2, name="b" * 300)
    head = et_bytes(META, small)
    path = tmp_path / "cap.0.et"
    path.write_bytes(head + encode_delimited(big))
    cap = len(big.SerializeToString()) - 1
    with pytest.raises(TraceLimitError, match="max_message_bytes") as info:
        read_fully(path, max_message_bytes=cap)
    assert isinstance(info.value, TraceDecodeError)
    assert_located(info.value, path, offset=len(head), node_index=1)
    # exactly at the cap is allowed
    assert read_fully(path, max_message_bytes=cap + 1) == [small, big]


def test_small_cap_applies_to_short_messages(tmp_path: Path) -> None:
    big = mknode(2, name="b" * 100)
    assert 100 < len(big.SerializeToString()) < 0x80
    head = et_bytes(META, mknode(1))
    path = tmp_path / "cap.0.et"
    path.write_bytes(head + encode_delimited(big))
    with pytest.raises(TraceLimitError) as info:
        read_fully(path, max_message_bytes=64)
    assert_located(info.value, path, offset=len(head), node_index=1)


def test_huge_length_prefix_hits_the_cap_before_any_allocation(tmp_path: Path) -> None:
    path = tmp_path / "huge.0.et"
    path.write_bytes(encode_delimited(META) + varint(1 << 62) + b"abc")
    with pytest.raises(TraceLimitError) as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(encode_delimited(META)), node_index=0)


def test_metadata_over_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "meta.0.et"
    path.write_bytes(encode_delimited(pb.GlobalMetadata(version="v" * 64)))
    with pytest.raises(TraceLimitError) as info:
        EtReader(path, max_message_bytes=16)
    assert_located(info.value, path, offset=0, node_index=-1)


def test_garbage_node_bytes(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1), mknode(2))
    path = tmp_path / "garbage.0.et"
    path.write_bytes(head + b"\x04\xff\xff\xff\xff")
    with pytest.raises(TraceDecodeError, match="does not decode") as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=2)


def test_garbage_metadata_bytes(tmp_path: Path) -> None:
    path = tmp_path / "garbage.0.et"
    path.write_bytes(b"\x03\xff\xff\xff" + encode_delimited(mknode(1)))
    with pytest.raises(TraceDecodeError, match="GlobalMetadata") as info:
        EtReader(path)
    assert_located(info.value, path, offset=0, node_index=-1)


def test_garbage_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.0.et"
    path.write_bytes(bytes(range(7, 256)) * 4)
    with pytest.raises(NboxError) as info:
        read_fully(path)
    assert str(path) in str(info.value)


def test_invalid_utf8_in_a_string_field(tmp_path: Path) -> None:
    body = b"\x08\x01\x12\x02\xc3\x28\x18\x04"  # id 1, name = invalid UTF-8, COMP_NODE
    head = et_bytes(META)
    path = tmp_path / "utf8.0.et"
    path.write_bytes(head + varint(len(body)) + body)
    with pytest.raises(TraceDecodeError) as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=0)


def test_bad_node_type_enum(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1))
    body = bad_type_body(2)
    path = tmp_path / "enum.0.et"
    path.write_bytes(head + varint(len(body)) + body)
    with pytest.raises(TraceDecodeError, match="NodeType 99") as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=1)


def test_negative_node_type_enum(tmp_path: Path) -> None:
    head = et_bytes(META)
    body = bad_type_body(2, -1)  # 10-byte varint
    assert pb.Node.FromString(body).type == -1
    path = tmp_path / "enum.0.et"
    path.write_bytes(head + varint(len(body)) + body)
    with pytest.raises(TraceDecodeError) as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=0)


def test_varint_longer_than_ten_bytes(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1))
    path = tmp_path / "varint.0.et"
    path.write_bytes(head + b"\x80" * 10 + b"\x01" + b"\x00" * 16)  # an 11-byte varint
    with pytest.raises(TraceDecodeError, match="longer than 10 bytes") as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=1)


def test_nonexistent_path(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "nothing.0.et"
    with pytest.raises(TraceDecodeError, match="cannot open") as info:
        EtReader(path)
    assert_located(info.value, path)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(TraceDecodeError) as info:
        EtReader(tmp_path)
    assert_located(info.value, tmp_path)


def test_gzip_bomb_hits_max_inflated_bytes(tmp_path: Path) -> None:
    # 4 MiB of zero-length node messages compress to a few KiB.
    data = gzip.compress(et_bytes(META, mknode(1)) + b"\x00" * (4 * MiB))
    assert len(data) < 64 * 1024
    path = tmp_path / "bomb.0.et"
    path.write_bytes(data)
    with pytest.raises(TraceLimitError, match="max_inflated_bytes") as info:
        read_fully(path, max_inflated_bytes=MiB // 2)
    assert str(path) in str(info.value)


def test_max_inflated_bytes_boundary(tmp_path: Path) -> None:
    plain = et_bytes(META, *(mknode(i) for i in range(1, 200)))
    path = tmp_path / "gz.0.et"
    path.write_bytes(gzip.compress(plain))
    assert len(read_fully(path, max_inflated_bytes=len(plain))) == 199
    with pytest.raises(TraceLimitError) as info:
        read_fully(path, max_inflated_bytes=len(plain) - 1)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("cut", ["half", "trailer", "header"])
def test_truncated_gzip(tmp_path: Path, cut: str) -> None:
    data = gzip.compress(et_bytes(META, *(mknode(i) for i in range(1, 500))))
    keep = {"half": len(data) // 2, "trailer": len(data) - 4, "header": 5}[cut]
    path = tmp_path / "trunc.0.et"
    path.write_bytes(data[:keep])
    with pytest.raises(TraceDecodeError) as info:
        read_fully(path)
    assert str(path) in str(info.value)


def test_gzip_bad_crc_and_trailing_garbage(tmp_path: Path) -> None:
    data = gzip.compress(et_bytes(META, *(mknode(i) for i in range(1, 50))))
    path = tmp_path / "crc.0.et"
    bad = bytearray(data)
    bad[-6] ^= 0xFF  # CRC32 field
    path.write_bytes(bytes(bad))
    with pytest.raises(TraceDecodeError):
        read_fully(path)
    path.write_bytes(data + b"garbage!")
    with pytest.raises(TraceDecodeError):
        read_fully(path)


def test_gzip_error_offsets_are_in_the_decompressed_stream(tmp_path: Path) -> None:
    head = et_bytes(META, *(mknode(i) for i in range(1, 100)))
    body = bad_type_body(100)
    path = tmp_path / "gz.0.et"
    path.write_bytes(gzip.compress(head + varint(len(body)) + body))
    with pytest.raises(TraceDecodeError, match="NodeType 99") as info:
        read_fully(path)
    assert_located(info.value, path, offset=len(head), node_index=99)


def test_error_offsets_past_the_first_read_chunk(tmp_path: Path) -> None:
    nodes = [mknode(i, name="n" * 100) for i in range(1, 15001)]
    head = et_bytes(META, *nodes)
    assert len(head) > MiB + 4096
    body = bad_type_body(20000)
    path = tmp_path / "long.0.et"
    path.write_bytes(head + varint(len(body)) + body)
    with EtReader(path) as reader:
        seen = 0
        with pytest.raises(TraceDecodeError) as info:
            for node in reader:
                assert node == nodes[seen]
                seen += 1
    assert seen == len(nodes)
    assert_located(info.value, path, offset=len(head), node_index=len(nodes))


def test_zero_length_messages_are_not_end_of_file(tmp_path: Path) -> None:
    meta = encode_delimited(META)
    n1 = encode_delimited(mknode(1))
    n2 = encode_delimited(mknode(2))
    n3 = encode_delimited(mknode(3))
    path = tmp_path / "zero.0.et"
    path.write_bytes(meta + n1 + b"\x00" + n2 + b"\x00\x00" + n3)
    with EtReader(path) as reader:
        nodes = list(reader)
    assert nodes == [mknode(1), mknode(2), mknode(3)]
    o1 = len(meta) + len(n1)
    o2 = o1 + 1 + len(n2)
    assert reader.zero_length_messages == [
        ZeroLengthMessage(offset=o1, node_index=1),
        ZeroLengthMessage(offset=o2, node_index=3),
        ZeroLengthMessage(offset=o2 + 1, node_index=4),
    ]
    assert reader.messages_read == 6


def test_zero_length_message_at_the_end(tmp_path: Path) -> None:
    head = et_bytes(META, mknode(1))
    path = tmp_path / "zero.0.et"
    path.write_bytes(head + b"\x00")
    with EtReader(path) as reader:
        assert list(reader) == [mknode(1)]
    assert reader.zero_length_messages == [ZeroLengthMessage(offset=len(head), node_index=1)]


def test_reader_iterates_once_and_rejects_bad_caps(tmp_path: Path) -> None:
    path = tmp_path / "once.0.et"
    path.write_bytes(et_bytes(META, mknode(1)))
    with EtReader(path) as reader:
        assert list(reader) == [mknode(1)]
        with pytest.raises(RuntimeError):
            iter(reader)
    reader.close()  # closing twice is safe
    with pytest.raises(ValueError):
        EtReader(path, max_message_bytes=0)
    with pytest.raises(ValueError):
        EtReader(path, max_inflated_bytes=-1)


# -- 4. writer ---------------------------------------------------------------------------------
def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("ids", [(1, 1), (2, 1), (0, 5, 5), (7, 3)])
def test_writer_refuses_non_increasing_ids(tmp_path: Path, ids: tuple[int, ...]) -> None:
    path = tmp_path / "w.0.et"
    with EtWriter(path, META) as writer:
        for nid in ids[:-1]:
            writer.write(mknode(nid))
        with pytest.raises(TraceWriteError, match="increasing") as info:
            writer.write(mknode(ids[-1]))
        assert str(path) in str(info.value)
        writer.write(mknode(ids[-2] + 1))  # state unchanged by the refused node
    assert [n.id for n in read_et(path)[1]] == [*ids[:-1], ids[-2] + 1]


def test_writer_refuses_non_increasing_ids_in_write_all(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    with pytest.raises(TraceWriteError), EtWriter(path, META) as writer:
        writer.write_all([mknode(1), mknode(2), mknode(2)])
    assert not path.exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "bad",
    [
        pb.Node(id=1, type=pb.COMP_NODE),  # no name
        pb.Node(id=1, name="x"),  # INVALID_NODE
        pb.Node(id=1, name="x", type=pb.INVALID_NODE, duration_micros=5),
        pb.Node(),  # all default: would serialize to zero bytes
    ],
)
def test_writer_refuses_empty_nodes(tmp_path: Path, bad: pb.Node) -> None:
    path = tmp_path / "w.0.et"
    with EtWriter(path, META) as writer:
        with pytest.raises(TraceWriteError, match="empty node"):
            writer.write(bad)
        assert writer.nodes_written == 0
        writer.write(mknode(1))
    assert read_et(path)[1] == [mknode(1)]


def test_final_file_only_on_successful_close(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    with pytest.raises(KeyError), EtWriter(path, META) as writer:
        writer.write_all(mknode(i) for i in range(1, 100))
        assert not path.exists(), "final name must not appear before close"
        assert len(leftovers(tmp_path)) == 1  # the temporary file
        raise KeyError("boom")
    assert not path.exists()
    assert leftovers(tmp_path) == []


def test_large_write_interrupted_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    with pytest.raises(RuntimeError), EtWriter(path, META, compress=True) as writer:
        writer.write_all(mknode(i, name="x" * 200) for i in range(1, 20000))  # > 1 MiB: flushed to disk
        raise RuntimeError("interrupted")
    assert leftovers(tmp_path) == []


def test_existing_file_is_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    old_nodes = [mknode(i) for i in range(1, 4)]
    write_et(path, META, old_nodes)
    old_bytes = path.read_bytes()
    old_inode = path.stat().st_ino

    # an interrupted rewrite leaves the old file untouched
    with pytest.raises(ValueError), EtWriter(path, META) as writer:
        writer.write_all(mknode(i, name="new") for i in range(10, 30000))
        raise ValueError("stop")
    assert path.read_bytes() == old_bytes
    assert leftovers(tmp_path) == [path.name]

    # a successful rewrite: the old content stays readable until close, then the new one appears
    new_nodes = [mknode(i, name="new" * 15) for i in range(10, 30000)]  # > 1 MiB: partly flushed already
    writer = EtWriter(path, pb.GlobalMetadata(version="2"))
    writer.write_all(new_nodes)
    (temp,) = [p for p in tmp_path.iterdir() if p != path]
    assert temp.stat().st_size > 0, "the new bytes go to a temporary file beside the old one"
    assert path.read_bytes() == old_bytes
    assert read_et(path)[1] == old_nodes
    assert writer.close() == path
    assert path.stat().st_ino != old_inode, "replaced by rename, not rewritten in place"
    metadata, nodes = read_et(path)
    assert metadata.version == "2"
    assert nodes == new_nodes
    assert leftovers(tmp_path) == [path.name]


def test_writer_close_is_idempotent_and_write_after_close_fails(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    writer = EtWriter(path, META)
    writer.write(mknode(1))
    assert writer.close() == path
    assert writer.close() == path
    with pytest.raises(TraceWriteError, match="closed"):
        writer.write(mknode(2))
    assert read_et(path)[1] == [mknode(1)]
    assert writer.nodes_written == 1


def test_writer_into_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteError) as info:
        EtWriter(tmp_path / "no" / "such" / "dir" / "w.0.et", META)
    assert "no/such/dir" in str(info.value)
    assert info.value.exit_code == 5


def test_write_et_round_trips_all_fields(tmp_path: Path) -> None:
    node = pb.Node(
        id=(1 << 64) - 1 - 5, name="everything", type=pb.COMM_COLL_NODE, ctrl_deps=[1, (1 << 64) - 1],
        data_deps=[2, 3], start_time_micros=(1 << 64) - 1, duration_micros=123456789,
        inputs=pb.IOInfo(values="[[1,2,3,4,5,'cpu']]", shapes="[[4]]", types="['Tensor(float)']"),
        outputs=pb.IOInfo(values="v", shapes="s", types="t"),
    )
    node.attr.add(name="d", doc_string="doc", double_list=pb.DoubleList(values=[1.5, -2.0]))
    last = mknode((1 << 64) - 1, ntype=pb.MEM_STORE_NODE)
    path = write_et(tmp_path / "all.0.et", META, [node, last])
    assert read_et(path) == (META, [node, last])


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("compress", [False, True])
def test_written_file_mode_follows_umask(tmp_path: Path, compress: bool) -> None:
    """Like open(path, "wb"): a trace is meant to be shared, not left 0600 by mkstemp."""
    path = write_et(tmp_path / "mode.0.et", META, [mknode(1)], compress=compress)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~current_umask()


def test_close_after_abort_does_not_report_success(tmp_path: Path) -> None:
    path = tmp_path / "w.0.et"
    writer = EtWriter(path, META)
    writer.write(mknode(1))
    writer.abort()
    assert leftovers(tmp_path) == []
    with pytest.raises(TraceWriteError):
        writer.close()


def test_truncated_gzip_yields_the_intact_nodes_then_names_the_node_index(tmp_path: Path) -> None:
    # ~600 KiB inflated, cut at 60% of the compressed bytes: the nodes inflated before the cut
    # come out, then the error names the file, the inflated offset and the node being read.
    nodes = [pb.Node(id=i, name=f"aten::op_{i}_" + "x" * 40, type=pb.COMP_NODE, duration_micros=i,
                     data_deps=[i - 1] if i else []) for i in range(10_000)]
    path = tmp_path / "t.0.et"
    write_et(path, pb.GlobalMetadata(version="1.0.0"), nodes, compress=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 6 // 10])
    got: list[pb.Node] = []
    with pytest.raises(TraceDecodeError) as info, EtReader(path) as reader:
        got.extend(reader)
    err = info.value
    assert 1000 < len(got) < len(nodes)
    assert got == nodes[: len(got)]
    assert str(path) in str(err) and "gzip" in str(err)
    assert err.node_index is not None and len(got) <= err.node_index <= len(got) + 1
    assert err.offset is not None and err.offset > 0
