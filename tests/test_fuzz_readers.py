"""Structure-aware fuzzing of the readers of untrusted bytes: bundle manifests and Chakra ET graphs.

Complements ``test_codec_fuzz.py`` (random bytes, mutated samples and framing through ``EtReader``) with
inputs that get past the decoders and reach the checks behind them:

* manifests: byte mutations of the shipped manifests; JSON built close to the real schema (right keys with
  wrong types, huge/negative numbers, deep nesting, odd versions, hostile file paths) through
  :func:`nbox_trace.bundle.manifest.parse_manifest`; real directories whose listed files are missing, symlinks,
  directories or the wrong size through :func:`read_manifest` + :func:`verify_files`;
* ET: valid ``Node`` messages with hostile graphs and attributes (self/missing/cyclic deps, duplicate
  ids, out-of-range enums, wrong attribute kinds, huge sizes, process-group METADATA payloads), framed with
  :func:`encode_delimited`, sometimes with a lying length prefix or gzip, through ``inspect_rank`` and
  ``inspect_trace``.

The contract in every case: the reader returns, or raises an :class:`~nbox_trace.errors.NboxError` whose message
names the file; never another exception, and nothing is written outside the case's own directory.

``NBOX_FUZZ_EXAMPLES`` overrides the number of examples of every test
(the defaults add up to 3,300; with tests/test_archive.py, 5,900 a run).
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbox_trace.bundle.manifest import MANIFEST_NAME, Manifest, parse_manifest, read_manifest, verify_files
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import CONTRACT_KINDS
from nbox_trace.chakra.codec import _varint, encode_delimited
from nbox_trace.check import inspect_rank, inspect_trace
from nbox_trace.contract import PG_INIT_NODE, SPLIT_ATTRS
from nbox_trace.errors import NboxError

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST_SOURCES = sorted((REPO_ROOT / "traces").glob("*/manifest.json"))

_OVERRIDE = os.environ.get("NBOX_FUZZ_EXAMPLES")


def fuzz_settings(default: int) -> settings:
    return settings(
        deadline=None,
        max_examples=int(_OVERRIDE) if _OVERRIDE else default,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                               HealthCheck.function_scoped_fixture],
    )


_counter = itertools.count()


# -- the contract ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_readers")


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@contextlib.contextmanager
def confined(workdir: Path) -> Iterator[Path]:
    """A fresh case directory, the working directory while the reader runs; afterwards checks that nothing
    appeared in the shared work directory besides it, nor in it besides what the case wrote itself, and
    removes it."""
    case = workdir / f"case{next(_counter)}"
    case.mkdir()
    before = _tree(workdir)
    cwd = os.getcwd()
    try:
        yield case
    finally:
        os.chdir(cwd)
    after = _tree(workdir)
    shutil.rmtree(case)
    new = {p for p in after - before if not p.startswith(f"{case.name}/")}
    assert not new, f"reader wrote outside its case directory: {sorted(new)[:5]}"


def expect_refusal(exc: BaseException, *names: str) -> None:
    """An exception that escaped a reader: must be an NboxError naming one of ``names``."""
    if not isinstance(exc, NboxError):
        raise AssertionError(f"reader raised {type(exc).__name__} (not an NboxError): {exc!r:.300}") from exc
    msg = str(exc)
    assert any(n in msg for n in names), f"error message does not name the file {names}: {msg[:300]}"


# -- manifests: byte mutation ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manifest_sources() -> list[bytes]:
    if not MANIFEST_SOURCES:
        pytest.skip("no shipped bundle under traces/")
    return [p.read_bytes() for p in MANIFEST_SOURCES]


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("insert"), st.integers(min_value=0),
              st.binary(min_size=1, max_size=8)
              | st.sampled_from([b"[", b"{", b"\"", b"\\ud800", b"1e999", b"-", b"\xff", b"\x00", b",", b"99999999"])),
    st.tuples(st.just("delete"), st.integers(min_value=0), st.integers(min_value=1, max_value=32)),
    st.tuples(st.just("truncate"), st.integers(min_value=0), st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(data)
    for op, where, arg in ops:
        pos = where % (len(buf) + 1)
        if op == "flip" and pos < len(buf):
            buf[pos] ^= arg
        elif op == "insert":
            buf[pos:pos] = arg
        elif op == "delete":
            del buf[pos : pos + arg]
        elif op == "truncate":
            del buf[pos:]
    return bytes(buf)


def check_manifest(m: Manifest) -> None:
    """What a caller may rely on when parse_manifest returns."""
    assert isinstance(m, Manifest)
    assert m.schema == "nbox.bundle"
    major, minor = (int(x) for x in m.version.split("."))
    assert (major, minor) >= (1, 1) and major == 1
    assert m.kind in ("recorded", "imported", "emulated")
    assert isinstance(m.complete, bool)
    seen = set()
    for f in m.files:
        p = PurePosixPath(f.path)
        assert f.path and not p.is_absolute() and ".." not in p.parts and "\\" not in f.path and "\0" not in f.path
        assert f.path not in seen and f.path != MANIFEST_NAME
        seen.add(f.path)
        assert type(f.bytes) is int and f.bytes >= 0 and len(f.sha256) == 64


def run_parse(raw: bytes, where: str = "fuzz/manifest.json") -> None:
    try:
        m = parse_manifest(raw, where)
    except Exception as exc:
        expect_refusal(exc, where)
    else:
        check_manifest(m)


@fuzz_settings(1200)
@given(which=st.integers(min_value=0, max_value=7), ops=st.lists(mutation, min_size=1, max_size=5))
def test_mutated_manifest_bytes(manifest_sources: list[bytes], which: int, ops: list[tuple[str, int, Any]]) -> None:
    run_parse(mutate(manifest_sources[which % len(manifest_sources)], ops))


def test_unmutated_manifests_parse(manifest_sources: list[bytes]) -> None:
    """Guards the mutation test: the sources themselves parse."""
    for raw in manifest_sources:
        check_manifest(parse_manifest(raw, "src"))


# -- manifests: structure-aware -------------------------------------------------------------------
#: Raw JSON text placed where a value goes (things json.dumps cannot produce from Python objects).
RAW_JSON = st.one_of(
    st.integers(min_value=1, max_value=10_000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=10_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(min_value=4290, max_value=5000).map(lambda n: "1" * n),  # past int_max_str_digits
    st.sampled_from([
        '"\\ud800"', '"\\udc80x"', '"\\udbff\\udfff"', '"a\\u0000b"', "1e999", "-1e999", "NaN", "Infinity",
        "-0", "1.0", "18446744073709551616", "-9223372036854775809", '{"a": 1, "a": 2}', "true", "null",
    ]),
)
HOSTILE_PATHS = st.sampled_from([
    "../x", "a/../../x", "/etc/passwd", "C:\\x", "a\\b", "a\x00b", "", ".", "./a", "a//b", "trace/", "manifest.json",
    "\ud800", "\udc80", "é/é", "x" * 300, "a/" + "y" * 256, "a/" * 300 + "b", " ", "\n", "trace/trace.0.et",
])
VERSIONS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([
        "1.0", "1.1", "1.2", "2.0", "0.9", "1", "01.0", "1.0.0", 1.0, 1, "9999999999.0", "999999.999999", "1.1 ",
        " 1.1", "+1.1", "-1.1", "1.-1", "", None, [], {}, True, "\u00b2.0", "1.\u00b9", "\u0661.\u0661",
        "\uff11.\uff11", "1.\u0660", "\ud800.1",
    ]),
    st.text(alphabet="0123456789.", max_size=12),
)
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
    st.integers(min_value=10_000, max_value=100_000).map(lambda n: "s" * n),
)
JSON_ANY = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
SHA = st.one_of(st.just("ab" * 32), st.text(alphabet="0123456789abcdefABCDEF", min_size=63, max_size=65),
                st.just("\u0661" * 64), JSON_ANY)


@st.composite
def file_entries(draw: st.DrawFn) -> Any:
    choice = draw(st.integers(min_value=0, max_value=9))
    if choice == 0:
        return draw(JSON_ANY)
    entry: dict[str, Any] = {
        "path": draw(HOSTILE_PATHS | st.text(max_size=20) | st.just("trace/trace.0.et") | JSON_LEAF),
        "bytes": draw(st.one_of(st.integers(min_value=-(1 << 66), max_value=1 << 66), st.just(True),
                                st.just(1.0), st.just("10"), st.none())),
        "sha256": draw(SHA),
    }
    for key in draw(st.lists(st.sampled_from(["path", "bytes", "sha256"]), max_size=2)):
        entry.pop(key, None)
    return entry


@st.composite
def manifest_texts(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    data: dict[str, Any] = json.loads(json.dumps(base))
    raws: list[str] = []

    def raw(text: str) -> str:
        raws.append(text)
        return f"@@RAW{len(raws) - 1}@@"

    data["version"] = draw(VERSIONS)
    if draw(st.booleans()):
        data["kind"] = draw(st.sampled_from(["recorded", "imported", "emulated", "other", None, 1, ""]))
    if draw(st.booleans()):
        data["anonymized"] = draw(st.none() | JSON_ANY | st.just({"level": "hash", "key_id": "k", "nbox": "0"}))
    keys = ["schema", "version", "producer", "hardware", "job", "observed", "capture", "complete", "files", "kind",
            "anonymized", "extra_key"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        action = draw(st.sampled_from(["delete", "value", "raw"]))
        if action == "delete":
            data.pop(key, None)
        elif action == "value":
            data[key] = draw(JSON_ANY)
        else:
            data[key] = raw(draw(RAW_JSON))
    if draw(st.booleans()):
        files: list[Any] = list(data["files"]) if isinstance(data.get("files"), list) else []
        files += draw(st.lists(file_entries(), max_size=4))
        if len(files) > 0 and draw(st.booleans()):
            files.append(dict(files[0]) if isinstance(files[0], dict) else files[0])  # duplicate path
        if draw(st.integers(min_value=0, max_value=20)) == 0:
            files = files * (4097 // max(len(files), 1) + 1)  # over MAX_FILES
        data["files"] = draw(st.permutations(files))
    if draw(st.integers(min_value=0, max_value=10)) == 0:
        nested: dict[str, Any] = data["job"] if isinstance(data.get("job"), dict) else {}
        nested["deep"] = raw(draw(RAW_JSON))
        data["job"] = nested
    text = json.dumps(data, ensure_ascii=draw(st.booleans()), sort_keys=draw(st.booleans()))
    for i, snippet in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', snippet)
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "utf-32", "utf-8-sig"]))
    return text.encode(encoding, errors="surrogatepass")


_BASE = json.loads(MANIFEST_SOURCES[0].read_text()) if MANIFEST_SOURCES else {"schema": "nbox.bundle"}


@fuzz_settings(1000)
@given(raw=manifest_texts(_BASE))
def test_structured_manifests(raw: bytes) -> None:
    run_parse(raw)


#: Crashes found by the fuzz tests above (kept as plain cases so a regression names itself).
KNOWN_MANIFEST_CASES = {
    "superscript-digit-version": {"version": "\u00b2.0"},
    "current-version-without-anonymized": {"version": "1.1", "kind": "recorded", "anonymized": "@@DROP@@"},
    "arabic-indic-digit-version": {"version": "\u0661.\u0661"},
}


@pytest.mark.parametrize("name", sorted(KNOWN_MANIFEST_CASES))
def test_manifest_regressions(name: str) -> None:
    data = {**_BASE, **KNOWN_MANIFEST_CASES[name]}
    data = {k: v for k, v in data.items() if v != "@@DROP@@"}
    run_parse(json.dumps(data).encode())


# -- manifests on disk: read_manifest + verify_files ------------------------------------------------
FILE_STATES = ["ok", "missing", "dir", "short", "long", "hash", "symlink-in", "symlink-out", "dangling",
               "loop", "via-dir-link", "long-name", "fifo"]


@st.composite
def bundle_layouts(draw: st.DrawFn) -> tuple[list[tuple[str, str, int]], str, list[str]]:
    n = draw(st.integers(min_value=0, max_value=5))
    states = draw(st.lists(st.sampled_from(FILE_STATES), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(min_value=0, max_value=3000), min_size=n, max_size=n))
    entries = [(f"d{i % 2}/f{i}.bin", s, size) for i, (s, size) in enumerate(zip(states, sizes, strict=True))]
    manifest_state = draw(st.sampled_from(["file", "file", "file", "file", "missing", "dir", "symlink", "huge",
                                           "garbage"]))
    extras = draw(st.lists(st.sampled_from(["unlisted.txt", "d0/unlisted", "d9/deep/x"]), max_size=2, unique=True))
    return entries, manifest_state, extras


def _build_bundle(case: Path, entries: list[tuple[str, str, int]], manifest_state: str, extras: list[str]) -> Path:
    import hashlib

    root = case / "bundle"
    outside = case / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"s" * 100)
    listed: list[dict[str, Any]] = []
    for rel, state, size in entries:
        body = bytes(i % 251 for i in range(size))
        declared = size
        digest = hashlib.sha256(body).hexdigest()
        if state == "long-name":
            rel = rel.replace("f", "F" * 300, 1)
        p = root / rel
        if state != "long-name":
            p.parent.mkdir(parents=True, exist_ok=True)
        if state in ("ok", "short", "long", "hash"):
            p.write_bytes(body)
            declared = {"short": size + 1, "long": max(size - 1, 0) if size else 5}.get(state, size)
            if state == "hash":
                digest = "0" * 64
        elif state == "dir":
            p.mkdir()
        elif state == "symlink-in":
            (root / f"target{len(listed)}").write_bytes(body)
            p.symlink_to(root / f"target{len(listed)}")
        elif state == "symlink-out":
            p.symlink_to(outside / "secret")
        elif state == "dangling":
            p.symlink_to(case / "nowhere")
        elif state == "loop":
            p.symlink_to(p)
        elif state == "via-dir-link":
            link = root / f"dl{len(listed)}"
            link.symlink_to(outside, target_is_directory=True)
            rel = f"{link.name}/secret"
            body = (outside / "secret").read_bytes()
            declared, digest = len(body), hashlib.sha256(body).hexdigest()
        elif state == "fifo":
            os.mkfifo(p)
        listed.append({"path": rel, "bytes": declared, "sha256": digest})
    for rel in extras:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    data = {**_BASE, "files": listed}
    text = json.dumps(data).encode()
    mpath = root / MANIFEST_NAME
    if manifest_state == "file":
        mpath.write_bytes(text)
    elif manifest_state == "dir":
        mpath.mkdir()
    elif manifest_state == "symlink":
        (outside / "m.json").write_bytes(text)
        mpath.symlink_to(outside / "m.json")
    elif manifest_state == "huge":
        with open(mpath, "wb") as f:
            f.truncate((16 << 20) + 1)  # sparse: over the cap without writing 16 MiB
    elif manifest_state == "garbage":
        mpath.write_bytes(b"\xff\xfe{" + text[:50])
    return root


@fuzz_settings(300)
@given(layout=bundle_layouts())
def test_bundle_directory_files(workdir: Path, layout: tuple[list[tuple[str, str, int]], str, list[str]]) -> None:
    entries, manifest_state, extras = layout
    with confined(workdir) as case:
        root = _build_bundle(case, entries, manifest_state, extras)
        outside_before = {p.name: p.read_bytes() for p in (case / "outside").iterdir()}
        os.chdir(case)
        try:
            manifest = read_manifest(root)
        except Exception as exc:
            expect_refusal(exc, str(root))
            assert manifest_state != "file", f"a valid manifest was refused: {exc}"
            return
        assert manifest_state == "file"
        try:
            problems = verify_files(root, manifest)
        except Exception as exc:
            expect_refusal(exc, str(root), *(e.path for e in manifest.files))
            return
        finally:
            assert {p.name: p.read_bytes() for p in (case / "outside").iterdir()} == outside_before
        bad = {e.path for e, (_, state, _) in zip(manifest.files, entries, strict=True)
               if state != "ok"}
        flagged = {p.split(": ", 1)[0] for p in problems}
        assert bad <= flagged, f"unflagged bad files: {sorted(bad - flagged)}"
        ok = {e.path for e, (_, state, _) in zip(manifest.files, entries, strict=True) if state == "ok"}
        assert not ok & flagged, f"good files flagged: {problems}"
        if extras:
            assert any("not listed" in p for p in problems)


@pytest.mark.parametrize("rel", ["x" * 256, "d/" + "y" * 300])
def test_verify_files_overlong_name(workdir: Path, rel: str) -> None:
    """Found by test_bundle_directory_files: a listed name longer than the file system allows (ENAMETOOLONG)."""
    with confined(workdir) as case:
        (case / "d").mkdir()
        manifest = parse_manifest(json.dumps({**_BASE, "files": [{"path": rel, "bytes": 0, "sha256": "0" * 64}]})
                                  .encode(), "m.json")
        try:
            problems = verify_files(case, manifest)
        except Exception as exc:
            expect_refusal(exc, str(case))
        else:
            assert any(p.startswith(rel) for p in problems)


# -- ET: structure-aware graphs ---------------------------------------------------------------------
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
I32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
INT_EDGE = st.sampled_from([0, 1, -1, 7, 9, 10, 11, 100, (1 << 31) - 1, -(1 << 31), (1 << 63) - 1, -(1 << 63)])

#: oneof member -> a strategy of values it accepts.
KINDS: dict[str, st.SearchStrategy[Any]] = {
    "bool_val": st.booleans(),
    "int32_val": INT_EDGE.filter(lambda v: -(1 << 31) <= v < (1 << 31)) | I32,
    "int64_val": INT_EDGE | I64,
    "uint32_val": st.integers(min_value=0, max_value=(1 << 32) - 1),
    "uint64_val": U64 | st.just((1 << 64) - 1),
    "sint32_val": I32,
    "sint64_val": I64,
    "fixed32_val": st.integers(min_value=0, max_value=(1 << 32) - 1),
    "fixed64_val": U64,
    "sfixed32_val": I32,
    "sfixed64_val": I64,
    "float_val": st.floats(width=32, allow_nan=True),
    "double_val": st.floats(allow_nan=True),
    "string_val": st.text(max_size=20),
    "bytes_val": st.binary(max_size=20),
}
LIST_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "bool_list": st.lists(st.booleans(), max_size=4),
    "int64_list": st.lists(I64, max_size=4),
    "string_list": st.lists(st.text(max_size=5), max_size=4),
    "double_list": st.lists(st.floats(), max_size=4),
}
ATTR_NAMES = st.sampled_from([*sorted(CONTRACT_KINDS), *SPLIT_ATTRS, "schema", "x", ""])


_DOC = st.sampled_from(["", "d"])
_CHOICE10 = st.integers(min_value=0, max_value=9)
_LIST_KIND_NAMES = st.sampled_from(sorted(LIST_KINDS))
_KIND_NAMES = st.sampled_from(sorted(KINDS))


@st.composite
def attributes(draw: st.DrawFn) -> pb.AttributeProto:
    attr = pb.AttributeProto(name=draw(ATTR_NAMES), doc_string=draw(_DOC))
    choice = draw(_CHOICE10)
    if choice == 0:
        return attr  # no value set
    if choice == 1:
        kind = draw(_LIST_KIND_NAMES)
        getattr(attr, kind).values.extend(draw(LIST_KINDS[kind]))
        return attr
    kind = draw(_KIND_NAMES)
    if attr.name in CONTRACT_KINDS and choice > 5:
        want = CONTRACT_KINDS[attr.name]
        kind = want if want in KINDS else kind  # mostly the right kind, with hostile values
    setattr(attr, kind, draw(KINDS[kind]))
    return attr


PG_VALUES = st.one_of(
    st.just('[{"pg_name": "0", "ranks": [0, 1]}]'),
    st.just("['[{\"pg_name\": \"1\", \"ranks\": [0]}]']"),
    st.sampled_from(["[", "{[]: 1}", "{{}}", "[1]*10", "__import__('os')", "[{'ranks': 'x'}]", "[[[]]]", "\x00",
                     '["[\\"[]\\"]"]', "[{1: 2}]", "[{'pg_name': 10**5000}]", "(1,)", "{1, 2}", "b'x'", "1j",
                     '[{"pg_name": "a", "ranks": [true, 1e400]}]']),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=3000).map(lambda n: '["' + '[\\"' * n + '"]'),
    st.integers(min_value=4300, max_value=4400).map(lambda n: "[" + "9" * n + "]"),
    st.text(max_size=40),
)


NODE_TYPES = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 7, 7, 5, 6]) | st.integers(min_value=0, max_value=10)
NODE_NAMES = st.sampled_from(["n", "", PG_INIT_NODE, "x" * 200])
#: A dependency: an index into the file's ids, or -1 itself, -2 an id absent from the file, -3 the largest id.
DEPS = st.lists(st.integers(min_value=-3, max_value=16), max_size=3)
TIMES = st.sampled_from([0, 1, 5, 1 << 63, (1 << 64) - 1]) | U64
IDS = st.lists(st.integers(min_value=0, max_value=30) | U64, max_size=12)
ATTR_LISTS = st.lists(attributes(), max_size=5)
SOMETIMES = st.integers(min_value=0, max_value=5)


def _dep(code: int, i: int, ids: list[int]) -> int:
    if code == -1:
        return ids[i]
    if code == -2:
        return 999_999
    if code == -3:
        return (1 << 64) - 1
    return ids[code % len(ids)]


@st.composite
def graphs(draw: st.DrawFn) -> list[pb.Node]:
    """Nodes with hostile graphs: duplicate ids (when drawn), self/missing/forward deps (cycles), any type."""
    ids = draw(IDS)
    if draw(st.booleans()):
        ids = list(range(len(ids)))
    nodes = []
    for i, nid in enumerate(ids):
        ntype = draw(NODE_TYPES)
        node = pb.Node(id=nid, name=draw(NODE_NAMES))
        node.type = ntype  # type: ignore[assignment]  # any int, out-of-enum values included
        node.data_deps.extend(_dep(c, i, ids) for c in draw(DEPS))
        node.ctrl_deps.extend(_dep(c, i, ids) for c in draw(DEPS))
        node.start_time_micros = draw(TIMES)
        node.duration_micros = draw(TIMES)
        if ntype == pb.METADATA_NODE or draw(SOMETIMES) == 0:
            node.inputs.values = draw(PG_VALUES)
        node.attr.extend(draw(ATTR_LISTS))
        nodes.append(node)
    return nodes


_META_VERSIONS = st.sampled_from(["0.0.4", "", "x" * 100])
_META_ATTRS = st.lists(attributes(), max_size=2)
_DAMAGE_COUNT = st.sampled_from([0, 0, 0, 1, 2])
_POS = st.integers(min_value=0, max_value=1 << 20)
_DAMAGE = st.sampled_from(["lie", "zero", "truncate"])
#: a length prefix: below 2,000 it is the true length shifted by -1,000..+999, else as drawn (huge).
_LIE = st.integers(min_value=990, max_value=1_064) | st.sampled_from([1 << 30, 1 << 63, (1 << 64) - 1])
_PACKING = st.sampled_from(["raw", "raw", "gzip", "gzip-cut"])


@st.composite
def et_files(draw: st.DrawFn, nodes: list[pb.Node]) -> tuple[bytes, bool]:
    """Frame the nodes: returns (file bytes, whether the bytes were damaged on purpose)."""
    meta = pb.GlobalMetadata(version=draw(_META_VERSIONS))
    meta.attr.extend(draw(_META_ATTRS))
    frames = [encode_delimited(meta)] + [encode_delimited(node) for node in nodes]
    bodies = [meta.SerializeToString()] + [node.SerializeToString() for node in nodes]
    # a node of default fields only (id 0, no name, type 0, no deps, times 0) encodes to nothing: its frame is
    # b"\x00", which the reader takes (as Chakra's does) for the end of the nodes, like the "zero" damage below
    damaged = any(not body for body in bodies[1:])
    for _ in range(draw(_DAMAGE_COUNT)):
        i = draw(_POS) % len(frames)
        how = draw(_DAMAGE)
        body = bodies[i]
        if how == "lie":
            length = draw(_LIE)
            length = max(0, length - 1_000 + len(body)) if length < 2_000 else length
            frames[i] = _varint(length) + body
        elif how == "zero":
            frames.insert(i + 1, b"\x00")
            bodies.insert(i + 1, b"")
        else:
            frames[i] = frames[i][: draw(_POS) % (len(frames[i]) + 1)]
        damaged = True
    data = b"".join(frames)
    packing = draw(_PACKING)
    if packing != "raw":
        data = gzip.compress(data, mtime=0)
        if packing == "gzip-cut":
            data = data[: draw(_POS) % (len(data) + 1)]
            damaged = True
    return data, damaged


def run_inspect_rank(path: Path, rank: int, nodes: list[pb.Node], damaged: bool) -> None:
    try:
        report = inspect_rank(path, rank)
    except Exception as exc:
        expect_refusal(exc, str(path))
        assert damaged or any(not 0 <= node.type <= 10 for node in nodes), f"undamaged file refused: {exc}"
        return
    if not damaged:
        assert report.node_count == len(nodes)
    assert report.rank == rank and report.path == str(path)
    assert all(p.severity in ("error", "warning") for p in report.problems)
    assert report.critical_path_us >= 0 and report.depth <= report.node_count


@fuzz_settings(600)
@given(data=st.data(), rank=st.integers(min_value=-2, max_value=70))
def test_structured_graphs_inspect_rank(workdir: Path, data: st.DataObject, rank: int) -> None:
    nodes = data.draw(graphs())
    payload, damaged = data.draw(et_files(nodes))
    with confined(workdir) as case:
        path = case / f"trace.{rank}.et"
        path.write_bytes(payload)
        os.chdir(case)
        run_inspect_rank(path, rank, nodes, damaged)


COMM_GROUP_TEXTS = st.one_of(
    st.just('{"0": [0, 1]}'),
    st.sampled_from(["[]", "{", '{"0": "x"}', '{"0": [true]}', '{"0": [1e999]}', '{"0": [' + "9" * 5000 + "]}",
                     "\xff", '{"0": [0, 0, 0]}', '{"1": [-1, 99]}', "[" * 5000]),
    JSON_ANY.map(json.dumps),
)


@fuzz_settings(200)
@given(data=st.data(), world=st.integers(min_value=1, max_value=3), comm_group=st.none() | COMM_GROUP_TEXTS)
def test_structured_graphs_inspect_trace(workdir: Path, data: st.DataObject, world: int,
                                         comm_group: str | None) -> None:
    """Several ranks, so the cross-rank checks (collective order, p2p pairs, group membership) see hostile
    graphs too; optionally a hostile comm_group.json beside them."""
    with confined(workdir) as case:
        for rank in range(world):
            payload, _ = data.draw(et_files(data.draw(graphs())))
            (case / f"trace.{rank}.et").write_bytes(payload)
        if comm_group is not None:
            (case / "comm_group.json").write_bytes(comm_group.encode("utf-8", errors="surrogatepass"))
        os.chdir(case)
        try:
            report = inspect_trace(case / "trace")
        except Exception as exc:
            expect_refusal(exc, str(case))
        else:
            assert len(report.ranks) == world
