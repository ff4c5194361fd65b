"""Tests of the ``nbox`` command line, run as a real process (``python -m nbox``).

Conventions checked: ``--json`` prints exactly one JSON document on stdout; human text goes to
stderr; library errors become one or two ``nbox: error:`` lines (never a traceback) and the exit
code of their class (3 invalid input, 4 not found); ``--strict`` exits 1 when problems are found;
``--help`` does not import torch or numpy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.chakra.attrs import make_attr
from nbox_trace.chakra.codec import write_et
from nbox_trace.check import REPORT_SCHEMA

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "samples"
CHAKRA_ET = SAMPLES / "chakra_et"
GLOO = SAMPLES / "cpu_gloo_official_pipeline"
T3D = CHAKRA_ET / "multi_pg_T3D" / "trace"

#: The samples are part of the repository: a test that needs them fails, not skips, without them.
needs_samples = pytest.mark.usefixtures("samples")

EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INVALID = 3
EXIT_NOT_FOUND = 4


def nbox(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    return subprocess.run(
        [sys.executable, "-m", "nbox", *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False,
    )


def assert_error(proc: subprocess.CompletedProcess[str], code: int, *must_contain: str) -> str:
    """One or two 'nbox: error:' lines on stderr, nothing on stdout, no traceback, the right code."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, proc.stderr
    assert lines[0].startswith("nbox: error:"), proc.stderr
    for text in must_contain:
        assert text in proc.stderr, (text, proc.stderr)
    return proc.stderr


def _node(nid: int, **kw: object) -> pb.Node:
    node = pb.Node(id=nid, name=f"n{nid}", type=pb.COMP_NODE, duration_micros=5, **kw)  # type: ignore[arg-type]
    node.attr.append(make_attr("is_cpu_op", True))
    return node


@pytest.fixture
def clean_trace(tmp_path: Path) -> Path:
    d = tmp_path / "clean"
    d.mkdir()
    for rank in range(2):
        ar = pb.Node(id=2, name="ar", type=pb.COMM_COLL_NODE, data_deps=[1])
        ar.attr.extend([make_attr("is_cpu_op", False), make_attr("comm_type", pb.ALL_REDUCE),
                        make_attr("comm_size", 4096)])
        write_et(d / f"t.{rank}.et", pb.GlobalMetadata(version="1.0.0"), [_node(1), ar])
    return d


@pytest.fixture
def dangling_trace(tmp_path: Path) -> Path:
    d = tmp_path / "dangling"
    d.mkdir()
    write_et(d / "bad.0.et", pb.GlobalMetadata(version="1.0.0"), [_node(1), _node(2, data_deps=[1, 99])])
    return d / "bad.0.et"


# ------------------------------------------------------------------------------------------------
# help, version, imports
# ------------------------------------------------------------------------------------------------


def test_help_exits_0() -> None:
    proc = nbox("--help")
    assert proc.returncode == 0, proc.stderr
    assert "trace" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_trace_inspect_help_exits_0() -> None:
    proc = nbox("trace", "inspect", "--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--json", "--strict", "--comm-group"):
        assert flag in proc.stdout


def test_version() -> None:
    from nbox_trace import __version__

    proc = nbox("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"nbox {__version__}"


def test_usage_error_exits_2(tmp_path: Path) -> None:
    proc = nbox("trace", "inspect", tmp_path, "--no-such-flag")
    assert proc.returncode == EXIT_USAGE
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


_IMPORT_PROBE = """
import contextlib, io, json, sys
sys.argv = ["nbox", *json.loads(sys.argv[1])]
from nbox.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy"))
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("argv", [["--help"], ["trace", "inspect", "--help"]])
def test_help_does_not_import_torch_or_numpy(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, json.dumps(argv)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None)
    assert result["heavy"] == []


@needs_samples
def test_inspect_does_not_import_torch_or_numpy() -> None:
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, json.dumps(["trace", "inspect", str(T3D), "--json"])],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}


# ------------------------------------------------------------------------------------------------
# output channels
# ------------------------------------------------------------------------------------------------


def test_json_is_one_document_on_stdout(clean_trace: Path) -> None:
    proc = nbox("trace", "inspect", clean_trace, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the whole of stdout is one document
    assert doc["schema"] == REPORT_SCHEMA == "nbox.trace-inspect/1"
    assert doc["prefix"] == "t"
    assert doc["rank_ids"] == [0, 1]
    assert doc["problem_count"] == 0
    assert [r["node_count"] for r in doc["ranks"]] == [2, 2]
    assert doc["ranks"][0]["collectives"] == [
        {"pg_name": "", "comm_type": "ALL_REDUCE", "count": 1, "total_bytes": 4096}]
    assert "Traceback" not in proc.stderr


def test_human_output_goes_to_stdout(clean_trace: Path) -> None:
    """Issue 13: "all human output goes to stderr, so `nbox scenario cost ... | grep ring` prints nothing": the
    report is the result, on stdout (it used to be asserted on stderr, the bug); stderr stays quiet."""
    proc = nbox("trace", "inspect", clean_trace)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "2 rank(s)" in proc.stdout
    assert "no problems found" in proc.stdout


def test_human_output_lists_problems(dangling_trace: Path) -> None:
    proc = nbox("trace", "inspect", dangling_trace)
    assert proc.returncode == 0  # problems alone do not fail without --strict
    assert proc.stderr == ""  # issue 13: the report is on stdout
    assert "dangling-dep" in proc.stdout
    assert "names id 99" in proc.stdout


@needs_samples
def test_json_on_a_sample_matches_library() -> None:
    from nbox_trace.check import inspect_trace

    proc = nbox("trace", "inspect", GLOO / "chakra_trace", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads(json.dumps(inspect_trace(GLOO / "chakra_trace").to_dict()))
    assert doc["problem_count"] == 4
    assert sorted(p["node_id"] for r in doc["ranks"] for p in r["problems"]) == [1, 1, 199, 199]


# ------------------------------------------------------------------------------------------------
# --strict
# ------------------------------------------------------------------------------------------------


def test_strict_exits_1_on_problems(dangling_trace: Path) -> None:
    proc = nbox("trace", "inspect", dangling_trace, "--strict")
    assert proc.returncode == EXIT_PROBLEMS
    assert "dangling-dep" in proc.stdout  # issue 13: the report is on stdout, --strict only sets the exit code
    assert "Traceback" not in proc.stderr


def test_strict_json_exits_1_and_still_prints_json(dangling_trace: Path) -> None:
    proc = nbox("trace", "inspect", dangling_trace, "--strict", "--json")
    assert proc.returncode == EXIT_PROBLEMS
    doc = json.loads(proc.stdout)
    assert doc["problem_count"] == 1
    assert doc["ranks"][0]["problems"][0]["code"] == "dangling-dep"


def test_strict_exits_0_on_clean_crafted(clean_trace: Path) -> None:
    assert nbox("trace", "inspect", clean_trace, "--strict").returncode == 0


@needs_samples
def test_strict_on_samples() -> None:
    proc = nbox("trace", "inspect", T3D, "--strict")
    assert proc.returncode == 0, proc.stderr
    assert "no problems found" in proc.stdout
    proc = nbox("trace", "inspect", GLOO / "typetest.0.et", "--strict")
    assert proc.returncode == EXIT_PROBLEMS
    assert "wrong-attr-kind" in proc.stdout


@needs_samples
def test_comm_group_option(tmp_path: Path) -> None:
    groups = json.loads((T3D.parent / "inputs" / "comm_group.json").read_text())
    groups["1"] = [3]
    cg = tmp_path / "cg.json"
    cg.write_text(json.dumps(groups))
    proc = nbox("trace", "inspect", T3D, "--comm-group", cg, "--json", "--strict")
    assert proc.returncode == EXIT_PROBLEMS
    doc = json.loads(proc.stdout)
    assert doc["process_groups_source"] == str(cg)
    assert [(p["code"], p["rank"]) for p in doc["cross_rank_problems"]] == [("pg-membership", 2)]


# ------------------------------------------------------------------------------------------------
# bad inputs: short message, documented exit code, no traceback
# ------------------------------------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "empty.0.et"
    f.write_bytes(b"")
    assert_error(nbox("trace", "inspect", f), EXIT_INVALID, str(f))


@pytest.mark.parametrize("blob", [
    pytest.param(b"\xff" * 16, id="endless-varint"),
    pytest.param(b"\x40" + b"\x00" * 3, id="truncated-message"),
    pytest.param(b"\x03\x0a\x01\xff", id="bad-utf8-metadata"),
    pytest.param(b"\x1f\x8b" + b"not really gzip", id="corrupt-gzip"),
    pytest.param(b"\x00\x02\x08", id="truncated-node"),
])
def test_garbage_bytes(tmp_path: Path, blob: bytes) -> None:
    f = tmp_path / "junk.0.et"
    f.write_bytes(blob)
    assert_error(nbox("trace", "inspect", f), EXIT_INVALID, str(f))
    assert_error(nbox("trace", "inspect", f, "--json"), EXIT_INVALID, str(f))


def test_message_over_the_cap(tmp_path: Path) -> None:
    f = tmp_path / "big.0.et"
    write_et(f, pb.GlobalMetadata(version="1.0.0"),
             [pb.Node(id=1, name="x" * (2 << 20), type=pb.COMP_NODE)])
    assert_error(nbox("trace", "inspect", f, "--max-message-mib", "1"), EXIT_INVALID, str(f), "max_message_bytes")
    assert nbox("trace", "inspect", f, "--max-message-mib", "4", "--json").returncode == 0


def test_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "trace"
    assert_error(nbox("trace", "inspect", missing), EXIT_NOT_FOUND, str(missing))


def test_directory_without_et(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    assert_error(nbox("trace", "inspect", tmp_path), EXIT_NOT_FOUND, str(tmp_path))


def test_directory_with_two_prefixes(tmp_path: Path) -> None:
    meta = pb.GlobalMetadata(version="1.0.0")
    write_et(tmp_path / "a.0.et", meta, [_node(1)])
    write_et(tmp_path / "b.0.et", meta, [_node(1)])
    err = assert_error(nbox("trace", "inspect", tmp_path, "--json"), EXIT_INVALID, str(tmp_path))
    assert "a (ranks 0)" in err and "b (ranks 0)" in err


def test_bad_comm_group_file(clean_trace: Path, tmp_path: Path) -> None:
    cg = tmp_path / "cg.json"
    cg.write_text("{not json")
    assert_error(nbox("trace", "inspect", clean_trace, "--comm-group", cg), EXIT_INVALID, str(cg))


def test_corrupt_rank_in_a_set_names_that_file(clean_trace: Path) -> None:
    bad = clean_trace / "t.1.et"
    bad.write_bytes(b"\x02\x0a")  # GlobalMetadata length 2, only 1 byte follows
    assert_error(nbox("trace", "inspect", clean_trace), EXIT_INVALID, str(bad), "truncated")


# ------------------------------------------------------------------------------------------------
# regressions: bugs found while writing these tests (missing/hostile comm-group files, rich markup)
# ------------------------------------------------------------------------------------------------


def test_missing_comm_group_file(clean_trace: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert_error(nbox("trace", "inspect", clean_trace, "--comm-group", missing), EXIT_NOT_FOUND, str(missing))


def test_comm_group_is_a_directory(clean_trace: Path, tmp_path: Path) -> None:
    proc = nbox("trace", "inspect", clean_trace, "--comm-group", tmp_path)
    assert proc.returncode in (EXIT_INVALID, EXIT_NOT_FOUND), proc.stderr
    assert_error(proc, proc.returncode, str(tmp_path))


def _markup_trace(tmp_path: Path, *, version: str = "1.0.0", pg: str | None = None, folder: str = "m") -> Path:
    d = tmp_path / folder
    d.mkdir(parents=True)
    node = pb.Node(id=1, name="ar", type=pb.COMM_COLL_NODE)
    node.attr.extend([make_attr("is_cpu_op", False), make_attr("comm_type", pb.ALL_REDUCE),
                      make_attr("comm_size", 8)])
    if pg is not None:
        node.attr.append(make_attr("pg_name", pg))
    write_et(d / "t.0.et", pb.GlobalMetadata(version=version), [node])
    return d


@pytest.mark.parametrize("case", ["version", "pg_name", "path"])
def test_human_output_prints_untrusted_text_verbatim(tmp_path: Path, case: str) -> None:
    if case == "version":
        d, text = _markup_trace(tmp_path, version="[/v]"), "[/v]"
    elif case == "pg_name":
        d, text = _markup_trace(tmp_path, pg="[/pg]"), "[/pg]"
    else:
        d, text = _markup_trace(tmp_path, folder="x[/y]"), "x[/y]"
    proc = nbox("trace", "inspect", d)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert text in proc.stdout


def test_every_path_a_help_example_names_exists() -> None:
    """Issue 12: `nbox trace inspect --help` named traces/example_ddp_mlp/trace, which does not exist. Every repo
    path an example names (traces/..., emulator_core/..., tests/data/...) must exist, relative to the repo root."""
    root = Path(__file__).resolve().parents[1]
    named = set()
    for path in (root / "nbox" / "cli").glob("*.py"):
        for line in path.read_text().splitlines():
            if line.strip().startswith("nbox "):
                named.update(re.findall(r"(?:traces|emulator_core|tests/data)/[\w./-]+", line))
    assert named, "no example names a path: the check found nothing to check"
    missing = sorted(p for p in named if not (root / p).exists())
    assert not missing, missing
