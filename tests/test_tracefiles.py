"""Tests of nbox_trace.chakra.tracefiles: from what a user typed to the per-rank files of one trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbox_trace.chakra.tracefiles import TraceSet, resolve_trace_set, split_rank_name
from nbox_trace.errors import InputNotFoundError, InvalidInputError, NboxError

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "samples"


def touch(directory: Path, *names: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        p = directory / name
        p.write_bytes(b"\x00")  # content is irrelevant to resolution
        out.append(p)
    return out


@pytest.mark.parametrize(("name", "expected"), [
    ("trace.3.et", ("trace", 3)),
    ("trace.0.et", ("trace", 0)),
    ("my.trace.12.et", ("my.trace", 12)),
    ("trace.01.et", ("trace", 1)),
    ("trace.et", ("trace", None)),
    ("trace.x.et", ("trace.x", None)),
    ("3.et", ("3", None)),
    ("notes.txt", ("notes.txt", None)),
])
def test_split_rank_name(name: str, expected: tuple[str, int | None]) -> None:
    assert split_rank_name(name) == expected


def test_single_file_with_rank(tmp_path: Path) -> None:
    (f,) = touch(tmp_path, "run.5.et")
    touch(tmp_path, "run.0.et")  # a sibling is not pulled in when one file is named
    ts = resolve_trace_set(f)
    assert isinstance(ts, TraceSet)
    assert ts.prefix == "run"
    assert ts.directory == tmp_path
    assert ts.files == {5: f}
    assert ts.ranks == [5]


def test_single_file_without_rank_is_rank_0(tmp_path: Path) -> None:
    (f,) = touch(tmp_path, "solo.et")
    ts = resolve_trace_set(str(f))  # a str works as well as a Path
    assert (ts.prefix, ts.files, ts.ranks) == ("solo", {0: f}, [0])


def test_directory_with_one_prefix(tmp_path: Path) -> None:
    files = touch(tmp_path, "t.0.et", "t.2.et", "t.10.et", "t.1.et", "README.md", "comm_group.json")
    (tmp_path / "sub.3.et").mkdir()  # a directory named like a trace file is not a file
    ts = resolve_trace_set(tmp_path)
    assert ts.prefix == "t"
    assert ts.directory == tmp_path
    assert ts.ranks == [0, 1, 2, 10]  # numeric order, not lexical
    assert list(ts.files) == [0, 1, 2, 10]
    assert ts.files == {0: files[0], 1: files[3], 2: files[1], 10: files[2]}


def test_directory_with_two_prefixes_lists_both(tmp_path: Path) -> None:
    touch(tmp_path, "alpha.0.et", "alpha.1.et", "alpha.2.et", "beta.0.et", "beta.4.et")
    with pytest.raises(InvalidInputError) as info:
        resolve_trace_set(tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg
    assert "2 traces" in msg
    assert "alpha (ranks 0-2)" in msg
    assert "beta (ranks 0,4)" in msg
    assert "<prefix>" in msg
    assert info.value.exit_code == 3


def test_directory_without_et_files(tmp_path: Path) -> None:
    touch(tmp_path, "notes.txt", "trace.json", "x.et.gz")
    with pytest.raises(InputNotFoundError) as info:
        resolve_trace_set(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert info.value.exit_code == 4


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        resolve_trace_set(tmp_path)


def test_prefix_path(tmp_path: Path) -> None:
    files = touch(tmp_path, "t.0.et", "t.1.et", "t.x.0.et", "tt.0.et", "t.et", "t.2.et.bak")
    ts = resolve_trace_set(tmp_path / "t")
    assert ts.prefix == "t"
    assert ts.directory == tmp_path
    assert ts.files == {0: files[0], 1: files[1]}  # not t.x.*, tt.*, t.et or t.2.et.bak


def test_prefix_with_dots(tmp_path: Path) -> None:
    files = touch(tmp_path, "my.trace.0.et", "my.trace.1.et", "my.0.et")
    ts = resolve_trace_set(tmp_path / "my.trace")
    assert (ts.prefix, ts.files) == ("my.trace", {0: files[0], 1: files[1]})
    ts = resolve_trace_set(tmp_path / "my")
    assert (ts.prefix, ts.files) == ("my", {0: files[2]})


def test_relative_prefix_in_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    touch(tmp_path, "t.0.et", "t.1.et")
    monkeypatch.chdir(tmp_path)
    ts = resolve_trace_set("t")
    assert ts.prefix == "t"
    assert ts.ranks == [0, 1]
    assert all(p.resolve() == (tmp_path / p.name).resolve() for p in ts.files.values())


def test_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "trace"
    with pytest.raises(InputNotFoundError) as info:
        resolve_trace_set(missing)
    assert str(missing) in str(info.value)


def test_prefix_matching_nothing(tmp_path: Path) -> None:
    touch(tmp_path, "other.0.et")
    with pytest.raises(InputNotFoundError) as info:
        resolve_trace_set(tmp_path / "t")
    assert "t.<rank>.et" in str(info.value)


@pytest.mark.parametrize("pair", [("t.1.et", "t.01.et"), ("t.et", "t.0.et"), ("t.2.et", "t.002.et")])
def test_two_files_claim_one_rank_in_a_directory(tmp_path: Path, pair: tuple[str, str]) -> None:
    touch(tmp_path, *pair)
    with pytest.raises(InvalidInputError) as info:
        resolve_trace_set(tmp_path)
    msg = str(info.value)
    assert pair[0] in msg and pair[1] in msg
    assert "rank" in msg


def test_two_files_claim_one_rank_via_prefix(tmp_path: Path) -> None:
    touch(tmp_path, "t.0.et", "t.1.et", "t.01.et")
    with pytest.raises(InvalidInputError) as info:
        resolve_trace_set(tmp_path / "t")
    assert "t.1.et" in str(info.value) and "t.01.et" in str(info.value)


def test_implausible_rank_is_refused(tmp_path: Path) -> None:
    touch(tmp_path, "t.0.et", "t.99999999999.et")
    with pytest.raises(InvalidInputError) as info:
        resolve_trace_set(tmp_path)
    assert "99999999999" in str(info.value)


def test_errors_are_nbox_errors(tmp_path: Path) -> None:
    with pytest.raises(NboxError):
        resolve_trace_set(tmp_path / "missing.0.et")


def test_samples_resolve() -> None:
    t3d = resolve_trace_set(SAMPLES / "chakra_et" / "multi_pg_T3D" / "trace")
    assert (t3d.prefix, t3d.ranks) == ("trace", list(range(8)))
    # the gloo folder mixes two traces (chakra_trace.{0,1}.et and typetest.0.et)
    with pytest.raises(InvalidInputError) as info:
        resolve_trace_set(SAMPLES / "cpu_gloo_official_pipeline")
    assert "chakra_trace (ranks 0-1)" in str(info.value) and "typetest (ranks 0)" in str(info.value)
    gloo = resolve_trace_set(SAMPLES / "cpu_gloo_official_pipeline" / "chakra_trace")
    assert gloo.ranks == [0, 1]
    # a folder holding only sub-folders has no .et of its own
    with pytest.raises(InputNotFoundError):
        resolve_trace_set(SAMPLES / "chakra_et" / "astra-sim_microbenchmarks")
