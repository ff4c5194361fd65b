"""Issue 13, Build 7: "Conventions". Results on stdout, progress and notices on stderr; bytes in IEC units and one
time unit per column; every command that takes a bundle takes a directory or a ``.nbox`` archive; sweep writes its
CSV and table without matplotlib; outputs checked for clashes before anything is written."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_trace.errors import OutputWriteError, UsageError
from nbox_trace.files import Output, check_outputs

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_mlp"


def nbox(*args: object, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{pre}\nfrom nbox.cli import main\nsys.argv = ['nbox', *sys.argv[1:]]\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_sweep_without_matplotlib_writes_the_csv_and_the_table_and_says_the_png_needs_it(tmp_path: Path) -> None:
    """Issue 13: "`nbox sweep` on the README install exits 3 without CSV or table because matplotlib is absent"."""
    proc = nbox("sweep", DDP, "--vary", "world_size=2,8", "--out", tmp_path / "sw",
                pre="sys.modules['matplotlib'] = None  # import matplotlib raises ImportError")
    assert proc.returncode == 0, proc.stderr
    assert "needs matplotlib" in proc.stderr and "pip install" in proc.stderr  # a notice, on stderr
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["sweep.csv"]
    with (tmp_path / "sw" / "sweep.csv").open(newline="") as f:
        assert [int(r["world_size"]) for r in csv.DictReader(f)] == [2, 8]
    table = proc.stdout.splitlines()  # the table is the result: stdout
    assert table[0].startswith("world_size") and len(table) == 4 and "matplotlib" not in proc.stdout


def test_replay_and_sweep_take_a_nbox_archive_like_its_directory(tmp_path: Path) -> None:
    """Issue 13: "`nbox replay x.nbox` fails with a protobuf error"; one helper (traces_directory) for every
    command that reads traces."""
    archive = tmp_path / "ddp.nbox"
    assert nbox("bundle", "pack", DDP, "-o", archive).returncode == 0
    docs = []
    for src in (DDP, archive):
        proc = nbox("replay", src, "--clock", "virtual", "--json")
        assert proc.returncode == 0, proc.stderr
        docs.append(json.loads(proc.stdout))
    assert docs[0]["what_if"] == docs[1]["what_if"] and docs[0]["baseline"] == docs[1]["baseline"]
    assert str(archive) in json.dumps(docs[1])  # the report names the archive the user gave, not a temp folder
    text = nbox("replay", archive, "--clock", "virtual")
    assert text.returncode == 0 and "what-if" in text.stdout and str(archive) in text.stdout
    assert "virtual replay: baseline" in text.stderr and "what-if W=" not in text.stderr  # progress only
    sweep = nbox("sweep", archive, "--vary", "world_size=2,4", "--out", tmp_path / "sw", "--json")
    assert sweep.returncode == 0, sweep.stderr
    assert [r["world_size"] for r in json.loads(sweep.stdout)["rows"]] == [2, 4]
    assert not list(tmp_path.glob(".nbox-bundle-*"))


@pytest.mark.parametrize("args", [
    ("trace", "inspect", DDP), ("bundle", "inspect", DDP), ("bundle", "verify", DDP),
    ("bundle", "diff", DDP, ROOT / "traces" / "ddp_transformer"), ("scenario", "show"),
    ("scenario", "validate", ROOT / "emulator_core" / "scenarios" / "loopback_cpu.toml"),
    ("scenario", "cost", "all_reduce", "--bytes", 1 << 20),
])
def test_results_are_on_stdout(args: tuple[object, ...]) -> None:
    """Issue 13: "all human output goes to stderr, so `nbox scenario cost ... | grep ring` prints nothing"."""
    proc = nbox(*args)
    assert proc.returncode == 0, proc.stderr
    # stderr holds notices only (e.g. a calibration applied beyond the ranks it measured), never the result
    assert proc.stdout.strip() and all(line.startswith("nbox: note: ") for line in proc.stderr.splitlines())


def test_bytes_in_iec_units_and_one_time_unit_per_column() -> None:
    """Issue 13: bytes were "1708288 B", "1.6 MiB" and "0.526 MB" in three commands; "11.0 ms" and "6467 us"
    shared a column (the two ranks of traces/ddp_mlp in `bundle inspect`)."""
    inspect = nbox("bundle", "inspect", DDP).stdout
    ranks = [ln for ln in inspect.splitlines() if ln.startswith("rank ")]
    assert len(ranks) == 2 and all("1.6 MiB" in ln for ln in ranks)
    units = {ln.split("compute ")[1].split(",")[0].split()[1] for ln in ranks}
    assert len(units) == 1, ranks  # both ranks' compute in one unit
    assert "1708288" not in inspect and " MB" not in inspect and "bytes" not in inspect.split("size on disk")[1]
    trace = nbox("trace", "inspect", DDP).stdout
    assert "1.6 MiB" in trace and "comp time ms" in trace and " us " not in trace.split("comp time")[1][:400]
    diff = nbox("bundle", "diff", DDP, ROOT / "traces" / "ddp_transformer").stdout
    assert "MiB" in diff and " MB" not in diff


def test_labels_end_in_an_ellipsis_at_a_word_boundary() -> None:
    """Issue 13: 'row labels are cut mid-word ("(loopback_cpu topolog")': bundle diff's operator names."""
    args = ("bundle", "diff", DDP, ROOT / "traces" / "ddp_transformer", "--top", 30)
    diff = nbox(*args).stdout
    names = [o["name"] for o in json.loads(nbox(*args, "--json").stdout)["operators"]]
    rows = diff.split("time by operator")[1].split("collectives (")[0].splitlines()[1:]
    assert rows
    for row in rows:
        label = row.strip().rsplit(None, 3)[0]
        if "…" in label:  # cut: what is left is a whole-word prefix of a real name
            head = label.removesuffix("…")
            assert any(n.startswith(head) and n[len(head)] in " _/,:" for n in names), row
        else:
            assert label in names, row  # never cut mid-word: either whole or ending in an ellipsis


def test_check_outputs_refuses_clashes_before_anything_is_written(tmp_path: Path) -> None:
    """Issue 13: "outputs are checked for clashes before anything is written" (`anonymize --save-key` onto an
    existing file failed after writing the bundle): one check, named by the flag as typed."""
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match=r"--out .*: is an existing file, but a folder is needed"):
        check_outputs([Output("--out", f, "dir")])
    with pytest.raises(UsageError, match=r"-o/--out .*: is an existing folder, but a file is needed"):
        check_outputs([Output("-o/--out", tmp_path, "file")])
    with pytest.raises(UsageError, match="is a file, so nothing can be written under it"):
        check_outputs([Output("-o", f / "sub" / "x.toml", "file")])
    with pytest.raises(UsageError, match=r"--save-key .*: -o/--out names the same path"):
        check_outputs([Output("-o/--out", tmp_path / "a", "dir"), Output("--save-key", tmp_path / "a", "file")])
    with pytest.raises(UsageError, match="is the input"):
        check_outputs([Output("-o/--out", DDP, "dir", True)], inputs=[DDP])
    with pytest.raises(UsageError, match="holds the input"):  # a folder holding the input, replaced whole
        check_outputs([Output("-o/--out", DDP.parent, "dir", True)], inputs=[DDP])
    check_outputs([Output("--out", DDP.parent, "dir")], inputs=[DDP])  # written into, not replaced: fine
    with pytest.raises(OutputWriteError, match=r"already exists \(use --overwrite to replace it\)") as err:
        check_outputs([Output("-o/--out", f, "file", False)])
    assert err.value.exit_code == 5
    check_outputs([Output("-o/--out", f, "file", True), Output("--out", None, "dir")])
    assert list(tmp_path.iterdir()) == [f]
