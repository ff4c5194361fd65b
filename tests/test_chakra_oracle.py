"""Oracle tests: Chakra's own reader (mlc-chakra) decodes what nbox reads and writes to the same nodes.

Chakra's generated ``et_def_pb2`` and ours both define the protobuf package ``ChakraProtoMsg`` in the
default descriptor pool, so they cannot live in one process: Chakra's reader runs in a subprocess
(``python -I``) and prints the decoded messages as JSON (``MessageToDict``), which we compare with
``MessageToDict`` of nbox's messages. This module never imports ``chakra`` itself.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import make_attr
from nbox_trace.chakra.codec import EtReader, encode_delimited, read_et, write_et

_SPEC = importlib.util.find_spec("chakra")
_LOCATIONS = [Path(p) for p in (_SPEC.submodule_search_locations or [])] if _SPEC is not None else []
_HAS_READER = any(
    (loc / "src" / "third_party" / "utils" / "protolib.py").is_file()
    and (loc / "schema" / "protobuf" / "et_def_pb2.py").is_file()
    for loc in _LOCATIONS
)
if not _HAS_READER:
    pytest.skip("mlc-chakra is not installed (no chakra protolib / et_def_pb2)", allow_module_level=True)

#: Runs in a separate interpreter: reads each path with Chakra's protolib exactly like Chakra's tools
#: (``decodeMessage`` until it returns False) and prints {path: {"metadata", "nodes"}} as JSON.
CHAKRA_READER = r"""
import json, sys
from google.protobuf.json_format import MessageToDict
from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

def as_dict(message):
    return MessageToDict(message, preserving_proto_field_name=True)

out = {}
for path in json.load(sys.stdin):
    f = openFileRd(path)
    metadata = GlobalMetadata()
    decodeMessage(f, metadata)
    nodes = []
    while True:
        node = Node()
        if not decodeMessage(f, node):
            break
        nodes.append(as_dict(node))
    f.close()
    out[path] = {"metadata": as_dict(metadata), "nodes": nodes}
json.dump(out, sys.stdout)
"""

#: Writes files with Chakra's protolib.encodeMessage from JSON messages given on stdin.
CHAKRA_WRITER = r"""
import json, sys
from google.protobuf.json_format import ParseDict
from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import encodeMessage

for path, spec in json.load(sys.stdin).items():
    with open(path, "wb") as f:
        encodeMessage(f, ParseDict(spec["metadata"], GlobalMetadata()))
        for node in spec["nodes"]:
            encodeMessage(f, ParseDict(node, Node()))
"""


def run_chakra(script: str, payload: object, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"Chakra subprocess failed:\n{proc.stderr}"
    return proc.stdout


def chakra_read(paths: list[Path], cwd: Path) -> dict[str, dict[str, Any]]:
    return json.loads(run_chakra(CHAKRA_READER, [str(p) for p in paths], cwd))  # type: ignore[no-any-return]


def as_dict(message: pb.Node | pb.GlobalMetadata) -> dict[str, Any]:
    # through JSON as well, so both sides went through the same float/str conversions
    return json.loads(json.dumps(MessageToDict(message, preserving_proto_field_name=True)))  # type: ignore[no-any-return]


def nbox_view(path: Path) -> dict[str, Any]:
    metadata, nodes = read_et(path)
    return {"metadata": as_dict(metadata), "nodes": [as_dict(n) for n in nodes]}


# -- every sample: Chakra on the original and on nbox's raw and gzip copies ---------------------------
@pytest.fixture(scope="module")
def sample_views(samples: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out_dir = tmp_path_factory.mktemp("oracle")
    sources = [*sorted((samples / "chakra_et").rglob("*.et")),
               *sorted((samples / "cpu_gloo_official_pipeline").glob("*.et"))]
    paths: list[Path] = []
    for i, src in enumerate(sources):
        metadata, nodes = read_et(src)
        raw = write_et(out_dir / f"raw{i}.{src.name}", metadata, nodes)
        gz = write_et(out_dir / f"gz{i}.{src.name}", metadata, nodes, compress=True)
        paths += [src, raw, gz]
    return {"paths": paths, "chakra": chakra_read(paths, out_dir)}


def test_chakra_reads_samples_and_nbox_copies_identically(sample_views: dict[str, Any]) -> None:
    paths: list[Path] = sample_views["paths"]
    chakra = sample_views["chakra"]
    assert len(paths) >= 3 * 150
    mismatched = []
    for src, raw, gz in zip(paths[0::3], paths[1::3], paths[2::3], strict=True):
        ours = nbox_view(src)
        assert ours["nodes"], src
        for path in (src, raw, gz):
            if chakra[str(path)] != ours:
                mismatched.append(str(path))
    assert mismatched == []


# -- hand-built nodes with every attribute kind ------------------------------------------------------
def every_kind_nodes() -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    metadata = pb.GlobalMetadata(version="1.0.0", attr=[make_attr("schema", "nbox-test"), make_attr("pid", 7)])
    kinds: dict[str, object] = {
        "double_val": -1.5, "float_val": 0.25, "int32_val": -3, "int64_val": -(1 << 62), "uint32_val": 1 << 31,
        "uint64_val": (1 << 64) - 1, "sint32_val": -9, "sint64_val": -(1 << 40), "fixed32_val": 5,
        "fixed64_val": 1 << 50, "sfixed32_val": -11, "sfixed64_val": -(1 << 45), "bool_val": True,
        "string_val": "ünïcode ✓", "bytes_val": b"\x00\xff\x10",
    }
    nodes = []
    nid = 10
    for kind, value in kinds.items():
        scalar = pb.Node(id=nid, name=f"scalar {kind}", type=pb.COMP_NODE, duration_micros=nid)
        attr = scalar.attr.add(name=kind, doc_string=f"doc of {kind}")
        setattr(attr, kind, value)
        lst = pb.Node(id=nid + 1, name=f"list {kind}", type=pb.MEM_LOAD_NODE, data_deps=[nid], ctrl_deps=[nid])
        getattr(lst.attr.add(name=kind.replace("_val", "_list")), kind.replace("_val", "_list")).values.extend(
            [value, value]
        )
        nodes += [scalar, lst]
        nid += 2
    comm = pb.Node(
        id=nid, name="allreduce", type=pb.COMM_COLL_NODE, start_time_micros=(1 << 64) - 1,
        inputs=pb.IOInfo(values="[[1,2,3,4,4,'cpu']]", shapes="[[4]]", types="['Tensor(float)']"),
        outputs=pb.IOInfo(values="x" * 20000),  # > 16 KiB: 3-byte length prefix
    )
    for name, value in (("is_cpu_op", False), ("comm_type", pb.REDUCE_SCATTER), ("comm_size", 1 << 33),
                        ("pg_name", "4"), ("involved_dim", [True, False])):
        comm.attr.append(make_attr(name, value))
    send = pb.Node(id=nid + 1, name="send", type=pb.COMM_SEND_NODE, data_deps=[nid])
    for name, value in (("is_cpu_op", False), ("comm_size", 64), ("comm_src", 0), ("comm_dst", 1), ("comm_tag", 9)):
        send.attr.append(make_attr(name, value))
    meta_node = pb.Node(id=(1 << 64) - 1, name="## process_group:init ##", type=pb.METADATA_NODE)
    return metadata, [*nodes, comm, send, meta_node]


@pytest.mark.parametrize("compress", [False, True])
def test_chakra_reads_every_attribute_kind_written_by_nbox(tmp_path: Path, compress: bool) -> None:
    metadata, nodes = every_kind_nodes()
    path = write_et(tmp_path / "kinds.0.et", metadata, nodes, compress=compress)
    chakra = chakra_read([path], tmp_path)[str(path)]
    assert chakra == {"metadata": as_dict(metadata), "nodes": [as_dict(n) for n in nodes]}
    assert len(chakra["nodes"]) == len(nodes) == 33


def test_nbox_reads_files_written_by_chakra(tmp_path: Path) -> None:
    metadata, nodes = every_kind_nodes()
    path = tmp_path / "by_chakra.0.et"
    spec = {str(path): {"metadata": as_dict(metadata), "nodes": [as_dict(n) for n in nodes]}}
    run_chakra(CHAKRA_WRITER, spec, tmp_path)
    assert read_et(path) == (metadata, nodes)
    # and nbox writes the same bytes as Chakra's encodeMessage
    assert write_et(tmp_path / "by_nbox.0.et", metadata, nodes).read_bytes() == path.read_bytes()


# -- Chakra's zero-length bug -----------------------------------------------------------------------
@pytest.mark.parametrize("compress", [False, True])
def test_zero_length_node_stops_chakra_but_not_nbox(tmp_path: Path, compress: bool) -> None:
    metadata = pb.GlobalMetadata(version="0.0.4")
    nodes = [pb.Node(id=i, name=f"n{i}", type=pb.COMP_NODE, duration_micros=i) for i in range(1, 6)]
    data = (
        encode_delimited(metadata)
        + encode_delimited(nodes[0])
        + encode_delimited(nodes[1])
        + encode_delimited(pb.Node())  # an all-default node: serialized as zero bytes
        + b"".join(encode_delimited(n) for n in nodes[2:])
    )
    path = tmp_path / "zero.0.et"
    path.write_bytes(gzip.compress(data) if compress else data)

    chakra = chakra_read([path], tmp_path)[str(path)]
    assert chakra["metadata"] == as_dict(metadata)
    assert chakra["nodes"] == [as_dict(n) for n in nodes[:2]], "Chakra's reader stops at the zero length"

    with EtReader(path) as reader:
        ours = list(reader)
    assert ours == nodes
    assert [z.node_index for z in reader.zero_length_messages] == [2]
    assert reader.zero_length_messages[0].offset == len(
        encode_delimited(metadata) + encode_delimited(nodes[0]) + encode_delimited(nodes[1])
    )


# -- bundles recorded with nbox record: Chakra's reader decodes them to the same nodes ----------------
def test_chakra_reads_the_shipped_recorded_bundles(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1] / "traces"
    paths = sorted(root.glob("*/trace/trace.*.et"))
    assert len(paths) >= 6  # ddp_mlp, ddp_transformer, fsdp2_transformer x 2 ranks
    seen = chakra_read(paths, tmp_path)
    for path in paths:
        assert seen[str(path)] == nbox_view(path), path
