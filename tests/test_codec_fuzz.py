"""Property tests of the codec: untrusted bytes only ever raise NboxError; valid nodes round-trip exactly."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nbox_trace.chakra import codec
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import CONTRACT_KINDS, make_attr
from nbox_trace.chakra.codec import EtReader, ZeroLengthMessage, encode_delimited, read_et, write_et
from nbox_trace.errors import NboxError, TraceDecodeError

#: A few real samples covering the shapes seen in the wild (small comm nodes, SEND/RECV, a data_deps DAG,
#: wrong attribute kinds, a METADATA node with big IOInfo strings).
MUTATION_SOURCES = [
    "chakra_et/astra-sim_microbenchmarks/all_reduce/4npus_1MB/all_reduce.1.et",
    "chakra_et/astra-sim_custom_ring_allreduce_8npus_1MB/custom_allreduce.3.et",
    "chakra_et/tutorial_mlp_model_parallel/MLP_ModelParallel.0.et",
    "chakra_et/multi_pg_T3D/trace/trace.2.et",
    "cpu_gloo_official_pipeline/typetest.0.et",
]

FUZZ = settings(
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_counter = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def drain(path: Path, **caps: int) -> int:
    """Read ``path`` to the end; return the number of nodes. Only NboxError may escape."""
    try:
        with EtReader(path, **caps) as reader:
            count = sum(1 for _ in reader)
    except NboxError as exc:
        event(type(exc).__name__)
        assert str(path) in str(exc)
        return -1
    event("read to the end")
    return count


caps_strategy = st.fixed_dictionaries(
    {},
    optional={
        "max_message_bytes": st.sampled_from([1, 16, 200, 4096]),
        "max_inflated_bytes": st.sampled_from([1, 64, 1024, 1 << 16]),
    },
)


# -- random bytes --------------------------------------------------------------------------------
@FUZZ
@given(
    data=st.binary(max_size=600),
    prefix=st.sampled_from([b"", encode_delimited(pb.GlobalMetadata(version="0.0.4")), b"\x00"]),
    compress=st.booleans(),
    caps=caps_strategy,
)
def test_random_bytes_raise_only_nbox_errors(
    workdir: Path, data: bytes, prefix: bytes, compress: bool, caps: dict[str, int]
) -> None:
    payload = prefix + data
    if compress:
        payload = gzip.compress(payload, mtime=0)
    path = workdir / f"rand.{next(_counter)}.et"
    path.write_bytes(payload)
    try:
        drain(path, **caps)
    finally:
        path.unlink()


@FUZZ
@given(frames=st.lists(st.binary(max_size=40), max_size=12), tail=st.binary(max_size=4))
def test_random_framed_messages_raise_only_nbox_errors(workdir: Path, frames: list[bytes], tail: bytes) -> None:
    """Well-framed but random payloads reach the protobuf parser and the enum checks."""
    payload = b"".join(bytes([len(f)]) + f for f in frames) + tail
    path = workdir / f"framed.{next(_counter)}.et"
    path.write_bytes(payload)
    try:
        drain(path)
    finally:
        path.unlink()


# -- mutated real samples ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sources(samples: Path) -> list[bytes]:
    return [(samples / rel).read_bytes() for rel in MUTATION_SOURCES]


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("insert"), st.integers(min_value=0), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(min_value=0), st.integers(min_value=1, max_value=16)),
    st.tuples(st.just("truncate"), st.integers(min_value=0), st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, object]]) -> bytes:
    buf = bytearray(data)
    for op, where, arg in ops:
        pos = where % (len(buf) + 1)
        if op == "flip" and pos < len(buf):
            buf[pos] ^= arg  # type: ignore[operator]
        elif op == "insert":
            buf[pos:pos] = arg  # type: ignore[assignment]
        elif op == "delete":
            del buf[pos : pos + arg]  # type: ignore[operator]
        elif op == "truncate":
            del buf[pos:]
    return bytes(buf)


@FUZZ
@given(
    which=st.integers(min_value=0, max_value=len(MUTATION_SOURCES) - 1),
    ops=st.lists(mutation, min_size=1, max_size=4),
    compress=st.booleans(),
    mutate_compressed=st.booleans(),
)
def test_mutated_samples_raise_only_nbox_errors(
    workdir: Path,
    sources: list[bytes],
    which: int,
    ops: list[tuple[str, int, object]],
    compress: bool,
    mutate_compressed: bool,
) -> None:
    data = sources[which]
    if compress and mutate_compressed:
        data = mutate(gzip.compress(data, mtime=0), ops)  # corrupt the gzip stream itself
    elif compress:
        data = gzip.compress(mutate(data, ops), mtime=0)
    else:
        data = mutate(data, ops)
    path = workdir / f"mut.{next(_counter)}.et"
    path.write_bytes(data)
    try:
        drain(path)
    finally:
        path.unlink()


def test_unmutated_sources_read_cleanly(sources: list[bytes], workdir: Path) -> None:
    """Guards the fuzz test above: with no mutation the sources decode (so mutations are what break them)."""
    for i, data in enumerate(sources):
        path = workdir / f"src.{i}.et"
        path.write_bytes(data)
        with EtReader(path) as reader:
            assert sum(1 for _ in reader) > 0


# -- valid nodes round-trip ----------------------------------------------------------------------
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
I32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
TEXT = st.text(max_size=20)
FLOATS = st.floats(allow_nan=False)

KIND_VALUES = {
    "bool_val": st.booleans(),
    "int64_val": I64,
    "int32_val": I32,
    "uint64_val": U64,
    "string_val": TEXT,
    "bool_list": st.lists(st.booleans(), max_size=4),
}
contract_attr = st.sampled_from(sorted(CONTRACT_KINDS)).flatmap(
    lambda name: (st.sampled_from(sorted(pb.CollectiveCommType.values())) if name == "comm_type"
                  else KIND_VALUES[CONTRACT_KINDS[name]]).map(lambda value: (name, value))
)
free_value = st.one_of(
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    FLOATS,
    TEXT,
    st.binary(max_size=10),
    st.lists(st.booleans(), min_size=1, max_size=4),
    st.lists(I64, min_size=1, max_size=4),
    st.lists(FLOATS, min_size=1, max_size=4),
    st.lists(TEXT, min_size=1, max_size=4),
    st.lists(st.binary(max_size=5), min_size=1, max_size=4),
)
free_attr = st.tuples(st.text(min_size=1, max_size=12).filter(lambda n: n not in CONTRACT_KINDS), free_value)
io_info = st.none() | st.builds(pb.IOInfo, values=TEXT, shapes=TEXT, types=TEXT)


@st.composite
def valid_nodes(draw: st.DrawFn) -> list[pb.Node]:
    count = draw(st.integers(min_value=0, max_value=12))
    steps = draw(st.lists(st.integers(min_value=1, max_value=1 << 40), min_size=count, max_size=count))
    start = draw(st.integers(min_value=0, max_value=1 << 20))
    nodes = []
    nid = start
    for step in steps:
        nid += step
        if nid > (1 << 64) - 1:
            break
        node = pb.Node(
            id=nid,
            name=draw(st.text(min_size=1, max_size=30)),
            type=draw(st.integers(min_value=1, max_value=7)),
            ctrl_deps=draw(st.lists(U64, max_size=3)),
            data_deps=draw(st.lists(U64, max_size=3)),
            start_time_micros=draw(U64),
            duration_micros=draw(U64),
        )
        for field in ("inputs", "outputs"):
            info = draw(io_info)
            if info is not None:
                getattr(node, field).CopyFrom(info)
        for name, value in draw(st.lists(contract_attr | free_attr, max_size=5)):
            node.attr.append(make_attr(name, value))
        nodes.append(node)
    return nodes


metadata_strategy = st.builds(
    lambda version, attrs: pb.GlobalMetadata(version=version, attr=[make_attr(n, v) for n, v in attrs]),
    TEXT,
    st.lists(free_attr, max_size=3),
)


@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(metadata=metadata_strategy, nodes=valid_nodes(), compress=st.booleans())
def test_valid_nodes_round_trip(
    workdir: Path, metadata: pb.GlobalMetadata, nodes: list[pb.Node], compress: bool
) -> None:
    path = write_et(workdir / f"rt.{next(_counter)}.et", metadata, nodes, compress=compress)
    try:
        with EtReader(path) as reader:
            back = list(reader)
        assert reader.compressed == compress
        assert reader.zero_length_messages == []
        assert reader.metadata == metadata
        assert back == nodes
        assert [n.SerializeToString() for n in back] == [n.SerializeToString() for n in nodes]
        assert read_et(path) == (metadata, nodes)
    finally:
        path.unlink()


# -- framing: offsets and zero-length messages at every position of the read buffer -------------------
#: Name lengths giving 1-, 2- and 3-byte length prefixes (message sizes around 127/128 and 16383/16384).
NAME_LENGTHS = st.one_of(
    st.integers(min_value=1, max_value=140), st.integers(min_value=16370, max_value=16390)
)


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(st.none() | NAME_LENGTHS, max_size=14),
    chunk=st.integers(min_value=1, max_value=300),
    compress=st.booleans(),
    bad_tail=st.sampled_from(["", "bad-type", "truncated"]),
)
def test_framing_with_tiny_read_chunks(
    workdir: Path, frames: list[int | None], chunk: int, compress: bool, bad_tail: str
) -> None:
    """Zero-length messages are recorded with their exact offset and index, nodes come back in order,
    and an error after them names the right offset and index, whatever the read-chunk size."""
    if not hasattr(codec, "_CHUNK_BYTES"):
        pytest.skip("nbox_trace.chakra.codec._CHUNK_BYTES (the read-chunk size this test shrinks) is gone")
    metadata = pb.GlobalMetadata(version="0.0.4")
    data = bytearray(encode_delimited(metadata))
    expected_nodes: list[pb.Node] = []
    expected_zero: list[ZeroLengthMessage] = []
    for index, name_len in enumerate(frames):
        if name_len is None:
            expected_zero.append(ZeroLengthMessage(offset=len(data), node_index=index))
            data += b"\x00"
        else:
            node = pb.Node(id=index, name="n" * name_len, type=pb.COMP_NODE)
            expected_nodes.append(node)
            data += encode_delimited(node)
    tail_offset = len(data)
    if bad_tail == "bad-type":
        body = pb.Node(id=999, name="x").SerializeToString() + b"\x18\x63"  # NodeType 99
        data += bytes([len(body)]) + body
    elif bad_tail == "truncated":
        data += encode_delimited(pb.Node(id=999, name="y" * 200, type=pb.COMP_NODE))[:-1]
    path = workdir / f"frames.{next(_counter)}.et"
    path.write_bytes(gzip.compress(bytes(data), mtime=0) if compress else bytes(data))
    try:
        with mock.patch.object(codec, "_CHUNK_BYTES", chunk), EtReader(path) as reader:
            nodes: list[pb.Node] = []
            if bad_tail:
                with pytest.raises(TraceDecodeError) as info:
                    nodes.extend(reader)
                assert info.value.offset == tail_offset
                assert info.value.node_index == len(frames)
            else:
                nodes.extend(reader)
        assert reader.metadata == metadata
        assert nodes == expected_nodes
        assert reader.zero_length_messages == expected_zero
    finally:
        path.unlink()
