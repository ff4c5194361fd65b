"""nccl-tests output: the parser on real files and hostile ones, the fit's round trip, the compare command."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator_core.nccl_tests import MAX_FILE_BYTES, NcclTestsError, parse_shape, read_curve, read_curve_text
from nbox_trace.errors import NboxError

ROOT = Path(__file__).resolve().parents[1]
VP = ROOT / "bench" / "data" / "nccl_tests" / "voltage_park_h100"
AR4 = VP / "multinode_nccl_allreduce_20260224_225706.txt"


def _rows(path: Path) -> str:
    """The bare data rows of a real file, as pasted into an issue."""
    return "\n".join(line for line in path.read_text().splitlines() if line.strip()[:1].isdigit()) + "\n"


def test_real_files_give_collective_and_shape_from_the_log() -> None:
    ar = read_curve(AR4)
    assert (ar.collective, ar.nodes, ar.gpus_per_node) == ("all_reduce", 4, 8)
    assert ar.said == {"collective", "shape"} and "H100" in ar.gpu
    assert ar.points[0].size_bytes == 8 and ar.points[-1].size_bytes == 8 << 30
    one = read_curve(VP / "singlenode_nccl_allreduce_.txt")  # one process driving 8 GPUs (-g 8)
    assert (one.nodes, one.gpus_per_node) == (1, 8)
    ag = read_curve(VP / "multinode_nccl_allgather_20260224_225706.txt")  # sizes rounding to 0 are skipped
    assert ag.collective == "all_gather" and ag.points[0].size_bytes > 0
    red = read_curve(VP / "multinode_nccl_reduce_20260225_221049.txt")  # root column = 0
    assert red.collective == "reduce" and len(red.points) == 31


def test_bare_rows_need_and_take_the_flags(tmp_path: Path) -> None:
    bare = tmp_path / "rows.txt"
    bare.write_text(_rows(AR4))
    with pytest.raises(NcclTestsError, match="--collective"):
        read_curve(bare, shape=(4, 8))
    with pytest.raises(NcclTestsError, match="--shape"):
        read_curve(bare, collective="all_reduce")
    c = read_curve(bare, collective="all_reduce", shape=(4, 8))
    assert c.said == frozenset() and c.points == read_curve(AR4).points
    # the bus factor catches a wrong shape or collective even on bare rows
    with pytest.raises(NcclTestsError, match="wrong collective or shape"):
        read_curve(bare, collective="all_reduce", shape=(1, 2))
    with pytest.raises(NcclTestsError, match="wrong collective or shape"):
        read_curve(bare, collective="all_gather", shape=(4, 8))


def test_a_log_contradicting_the_flags_is_refused() -> None:
    with pytest.raises(NcclTestsError, match="not --collective all_gather"):
        read_curve(AR4, collective="all_gather")
    with pytest.raises(NcclTestsError, match="not --shape 2x8"):
        read_curve(AR4, shape=(2, 8))
    assert read_curve(AR4, collective="all_reduce", shape=(4, 8)).nodes == 4


def test_column_variants(tmp_path: Path) -> None:
    """No redop/root columns (all_gather, alltoall in several versions), only the out-of-place group, N/A wrong
    counts, times in ms (old versions' units line)."""
    text = ("#       size         count      type     time   algbw   busbw  #wrong\n"
            "#        (B)    (elements)                (us)  (GB/s)  (GB/s)\n"
            "    33554432       8388608     float    400.0   83.89   78.65     N/A\n"
            "    67108864      16777216     float    700.0   95.87   89.88     N/A\n")
    c = read_curve_text(text, "t", collective="all_to_all", shape=(2, 8))
    assert [p.time_us for p in c.points] == [400.0, 700.0]
    old = text.replace("(us)", "(ms)").replace("400.0", "0.4").replace("700.0", "0.7")
    assert [p.time_us for p in read_curve_text(old, "t", collective="all_to_all", shape=(2, 8)).points] == \
        [400.0, 700.0]


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.replace("  8589934592    2147483648     float     sum      -1  50291.8",
                         "  8589934592    2147483648     float     sum      -1"), "truncated or malformed"),
    (lambda t: t.replace("50291.8", "nan"), "not a number"),
    (lambda t: t.replace("50291.8", "1e999"), "not finite"),
    (lambda t: t.replace("#  Rank  5 Group", "#  Rank  4 Group"), "listed twice"),
    (lambda t: t.replace("#  Rank  5 Group  0 Pid 156329 on       g138", "#  Rank  5 Group  0 Pid 1 on g999"),
     "different numbers of ranks"),
    (lambda t: t + t, "second"),
    (lambda t: t.replace("all_reduce_perf", "hypercube_perf", 1), "not one of"),
    (lambda t: t.replace("       0    38.27", "       3    38.27", 1), "wrong results"),
    (lambda t: t.replace("8589934592    2147483648", "8388608    2147483648"), "does not follow"),
    (lambda t: "x" * 5000 + "\n" + t, "longer than"),
])
def test_hostile_files_get_one_line_naming_file_and_line(tmp_path: Path, mutate: object, match: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(mutate(AR4.read_text()))  # type: ignore[operator]
    with pytest.raises(NcclTestsError, match=match) as info:
        read_curve(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_non_utf8_huge_missing_and_empty(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"# nThread 1\n\xff\xfe\n")
    with pytest.raises(NcclTestsError, match=r"raw.txt:2: not UTF-8"):
        read_curve(raw)
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(NcclTestsError, match="larger than"):
        read_curve(huge)
    with pytest.raises(NcclTestsError, match="cannot read"):
        read_curve(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(NcclTestsError, match="no nccl-tests rows"):
        read_curve(tmp_path / "empty.txt", collective="all_reduce", shape=(1, 2))


@pytest.mark.parametrize("text", ["4x8", " 2 X 8 ", "1*2"])
def test_parse_shape(text: str) -> None:
    assert parse_shape(text)[0] >= 1


@pytest.mark.parametrize("text", ["4", "0x8", "4x0", "axb", "4x8x2", "9" * 80])
def test_parse_shape_refuses(text: str) -> None:
    with pytest.raises(NcclTestsError, match="--shape"):
        parse_shape(text)


_REAL = AR4.read_text()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_parser_never_tracebacks(data: st.DataObject) -> None:
    """Byte-level and line-level mutations of a real file, and random text: a curve or an NboxError, nothing else."""
    lines = _REAL.splitlines()
    how = data.draw(st.sampled_from(["cut", "swap", "token", "random", "dup"]))
    if how == "cut":
        text = _REAL[:data.draw(st.integers(0, len(_REAL)))]
    elif how == "swap":
        i, j = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        text = "\n".join(lines)
    elif how == "token":
        i = data.draw(st.integers(0, len(lines) - 1))
        toks = lines[i].split() or [""]
        k = data.draw(st.integers(0, len(toks) - 1))
        toks[k] = data.draw(st.sampled_from(["", "-1", "N/A", "1e308", "0", "inf", "Rank", "#", "sum", "9" * 30,
                                             "\x00", "é"]))
        lines[i] = " ".join(toks)
        text = "\n".join(lines)
    elif how == "dup":
        i = data.draw(st.integers(0, len(lines) - 1))
        text = "\n".join(lines[:i] + [lines[i]] * data.draw(st.integers(2, 5)) + lines[i:])
    else:
        text = data.draw(st.text(max_size=400))
    coll = data.draw(st.sampled_from([None, "all_reduce", "broadcast"]))
    shape = data.draw(st.sampled_from([None, (4, 8), (1, 2)]))
    try:
        c = read_curve_text(text, "fuzz.txt", collective=coll, shape=shape)
    except NboxError as exc:
        assert "fuzz.txt" in str(exc) or "--" in str(exc)
        assert "\n" not in str(exc)
        return
    assert c.points and c.ranks >= 2
