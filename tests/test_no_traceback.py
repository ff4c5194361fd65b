"""Issue 13, Build 8: "No traceback for any input". Every command (trace inspect, bundle inspect/verify/pack/
unpack/diff/anonymize, scenario show/validate/cost, replay --clock virtual, sweep, record convert, and the argument
errors of calibrate, record and emulate, which never launch a rank here) is driven over a corpus of bad inputs:
missing and truncated files, foreign JSON, an empty file, a folder where a file is expected, empty bundles, a
truncated and a garbage ``.nbox`` archive, a manifest of the wrong schema or not JSON, a bundle with a truncated
trace, bad ``--set`` values, unknown algorithm names, outputs that clash. Each must exit with the documented code
(docs/output.md / nbox_trace/errors.py: 1 a check failed, 2 usage, 3 invalid input, 4 not found, 5 output not written),
print no traceback, and say what is wrong in one or two ``nbox: error:`` lines (the parser's own usage errors end
in one ``Error:`` line after its usage line).

The commands run in this process through the console-script entry point (``nbox.cli.main``), so an exception that
escapes it is a traceback a user would see; that keeps the corpus fast enough to run on every change.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import pytest

from nbox.cli import main

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_mlp"
SC = ROOT / "emulator_core" / "scenarios" / "loopback_cpu.toml"

#: Bad inputs (names under the corpus folder) -> expected exit code per command, in the order of COMMANDS.
#: "1" for bundle verify: the report (stdout) names the failed check, like any failed verification.
COMMANDS = ("trace inspect", "bundle inspect", "bundle verify", "bundle diff", "bundle unpack", "bundle pack",
            "bundle anonymize", "replay", "sweep", "scenario show", "scenario validate", "scenario cost",
            "record convert", "replay --what-if", "replay --baseline", "scenario import", "scenario export")
EXPECTED = {
    "nope": "44444444444444444",
    "empty.et": "33133433333333333",
    "trunc.et": "33133433333333333",
    "foreign.json": "33133433333333333",
    "adir": "44444444433343333",
    "emptybundle": "44444444433343333",
    "wrongschema": "33134333333343333",
    "badjson": "33134333333343333",
    "trunctrace": "33134333333343333",
    "garbage.nbox": "33133433333333333",
    "empty.nbox": "33133433333333333",
    "trunc.nbox": "33133433333333333",
}


def _args(command: str, p: str, t: str) -> list[str]:
    return {
        "trace inspect": ["trace", "inspect", p], "bundle inspect": ["bundle", "inspect", p],
        "bundle verify": ["bundle", "verify", p], "bundle diff": ["bundle", "diff", str(DDP), p],
        "bundle unpack": ["bundle", "unpack", p, f"{t}/out/unpacked"],
        "bundle pack": ["bundle", "pack", p, "-o", f"{t}/out/packed.nbox"],
        "bundle anonymize": ["bundle", "anonymize", p, "-o", f"{t}/out/anon"],
        "replay": ["replay", p, "--clock", "virtual"],
        "sweep": ["sweep", p, "--vary", "world_size=2,4", "--out", f"{t}/out/sweep"],
        "scenario show": ["scenario", "show", p], "scenario validate": ["scenario", "validate", p],
        "scenario cost": ["scenario", "cost", "all_reduce", "--bytes", "1", "--what-if", p],
        "record convert": ["record", "convert", p, p, "-o", f"{t}/out/converted"],
        "replay --what-if": ["replay", str(DDP), "--clock", "virtual", "--what-if", p],
        "replay --baseline": ["replay", str(DDP), "--clock", "virtual", "--baseline", p],
        "scenario import": ["scenario", "import", p, "-o", f"{t}/out/imported.toml"],
        "scenario export": ["scenario", "export", p, "-o", f"{t}/out/exported"],
    }[command]


#: Argument errors and outputs that clash: (args with {T} for the corpus folder, {DDP}, {SC}; expected code; a text
#: the message must hold).
ARGUMENT_CASES: list[object] = [
    ("replay {DDP} --clock bogus", 2, "--clock 'bogus'"),
    ("replay {DDP} --compute x", 2, "--compute 'x'"),
    ("replay {DDP} --device tpu", 2, "--device 'tpu'"),
    ("replay {DDP} --ranks a,b", 2, "--ranks 'a,b'"),
    ("replay {DDP} --clock virtual --world-size 0", 2, "--world-size"),
    ("replay {DDP} --clock virtual --ranks 0,9", 3, "rank 9"),
    ("replay {DDP} --clock virtual --set nonsense", 3, "--set nonsense"),
    ("replay {DDP} --clock virtual --set topology.dims.0.bandwidth_gbps=abc", 3, "must be a number"),
    ("replay {DDP} --clock virtual --set algorithms.all_reduce=tree", 3, '"tree": no cost model for all_reduce'),
    ("replay {DDP} --clock virtual --out {T}/empty.et", 2, "--out"),
    ("sweep {DDP} --vary algorithms.all_reduce=tree --out {T}/out/s1", 3, '"tree": no cost model for all_reduce'),
    ("sweep {DDP} --vary nonsense --out {T}/out/s2", 2, "--vary 'nonsense'"),
    ("sweep {DDP} --vary world_size=0 --out {T}/out/s3", 2, "--vary world_size"),
    ("sweep {DDP} --vary world_size=2 --out {T}/empty.et", 2, "--out"),
    ("sweep {DDP} --vary world_size=2 --iterations 0 --out {T}/out/s4", 2, "--iterations"),
    ("scenario cost allreduce --bytes 1", 2, "'allreduce'"),
    ("scenario cost all_reduce --bytes 1 --algorithm tree", 2, "--algorithm 'tree'"),
    ("scenario cost all_reduce --bytes -1", 2, "--bytes"),
    ("scenario show --set world_size=abc", 3, "world_size"),
    ("scenario show --set x", 3, "--set x"),
    ("scenario validate {SC} --set algorithms.all_reduce=tree", 3, '"tree": no cost model for all_reduce'),
    ("calibrate -o {T}/c.toml --sizes 12XB", 2, "--sizes '12XB'"),
    ("calibrate -o {T}/c.toml --collectives gatherx", 2, "--collectives 'gatherx'"),
    ("calibrate -o {T}/c.toml -n 1", 2, "--nproc"),
    ("calibrate -o {T}/c.toml --backend mpi", 2, "--backend 'mpi'"),
    ("calibrate -o {T}/adir --backend gloo", 2, "-o/--out"),
    ("bundle anonymize {DDP} -o {T}/out/a1 --level loose", 2, "--level 'loose'"),
    ("bundle anonymize {DDP} -o {T}/out/a2 --key-file {T}/nope", 3, "cannot read the key"),
    ("bundle anonymize {DDP} -o {T}/out/a3 --key-file {T}/empty.et", 3, "at least 16 bytes"),
    ("bundle anonymize {DDP} -o {DDP}", 2, "is the input"),
    ("bundle anonymize {DDP} -o {T}/out/a4 --save-key {T}/out/a4", 2, "same path"),
    ("bundle anonymize {DDP} -o {T}/out/a5 --key-file {T}/k --save-key {T}/k2", 2, "--key-file and --save-key"),
    ("bundle pack {DDP} -o {DDP}", 2, "a file is needed"),
    ("bundle pack {DDP} -o {T}/empty.et", 5, "--overwrite"),
    ("bundle unpack {T}/ok.nbox {T}/empty.et", 2, "a folder is needed"),
    ("record convert {T}/foreign.json -o {T}/out/c1 --no-kineto", 3, "not a host execution trace"),
    ("record convert {T}/foreign.json -o {T}/out/c2", 2, "HOST_ET KINETO pairs"),
    ("record convert {T}/adir {T}/adir -o {T}/out/c3", 4, "a folder, not a trace file"),
    ("record -o {T}/empty.et", 2, "a folder is needed"),
    ("record --backend mpi", 2, "--backend 'mpi'"),
    ("record --example nope", 2, "--example 'nope'"),
    ("record -n 0", 2, "--nproc-per-node"),
    ("emulate --world-size 0", 2, "--world-size"),
    ("emulate --world-size 8 --real-ranks 0,x", 2, "--real-ranks '0,x'"),
    ("emulate --world-size 8 --real-ranks 0,8", 2, "real rank 8"),
    ("emulate --world-size 8 -o {T}/empty.et", 2, "a folder is needed"),
    ("emulate --world-size 8 --example nope", 2, "--example 'nope'"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("corpus")
    et = (DDP / "trace" / "trace.0.et").read_bytes()
    (t / "empty.et").write_bytes(b"")
    (t / "trunc.et").write_bytes(et[: len(et) // 2])
    (t / "foreign.json").write_text(json.dumps({"hello": 1}))
    (t / "adir").mkdir()
    (t / "emptybundle").mkdir()
    for name, manifest in (("wrongschema", json.dumps({"schema": "other/9"})), ("badjson", "{not json")):
        shutil.copytree(DDP, t / name)
        (t / name / "manifest.json").write_text(manifest)
    shutil.copytree(DDP, t / "trunctrace")
    (t / "trunctrace" / "trace" / "trace.1.et").write_bytes(et[:40])
    (t / "garbage.nbox").write_bytes(os.urandom(3000))
    (t / "empty.nbox").write_bytes(b"")
    (t / "k").write_bytes(b"k" * 32)
    assert run("bundle", "pack", str(DDP), "-o", str(t / "ok.nbox"))[0] == 0
    packed = (t / "ok.nbox").read_bytes()
    (t / "trunc.nbox").write_bytes(packed[: len(packed) // 2])
    return t


def run(*args: str) -> tuple[int | str, str, str]:
    """(exit code or "traceback", stdout, stderr) of ``nbox ARGS`` through the console-script entry point."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["nbox", *args]
    code: int | str = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            except BaseException:
                err.write(traceback.format_exc())
                code = "traceback"
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def check(args: list[str], code: int | str, out: str, err: str, expected: int, text: str | None = None) -> None:
    where = f"nbox {' '.join(args)}"
    assert "Traceback" not in err and code != "traceback", f"{where}:\n{err}"
    assert code == expected, f"{where}: exit {code}, expected {expected}\n{err}"
    if expected == 1:  # a failed check: the report on stdout says which
        assert out.strip() and "FAIL" in out.upper(), f"{where}: {out}"
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if lines and lines[-1].startswith("Error:"):  # the parser's usage error: Usage/Try lines, then one Error line
        assert expected == 2 and len(lines) <= 4, f"{where}:\n{err}"
        message = lines[-1]
    else:
        start = next((i for i, ln in enumerate(lines) if ln.startswith("nbox: error:")), None)
        assert start is not None, f"{where}: no 'nbox: error:' line:\n{err}"
        message = "\n".join(lines[start:])
        assert 1 <= len(lines) - start <= 2, f"{where}: the message is longer than two lines:\n{err}"
    if text is not None:
        assert text in message, f"{where}: {text!r} not in {message!r}"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_command_on_a_bad_input_exits_with_its_code_and_a_short_message(corpus: Path, name: str) -> None:
    """Issue 13: "Tracebacks and dead ends" (e.g. `nbox replay x.nbox` failed with a protobuf error); every
    command that reads a trace, bundle, archive, scenario or host ET is fed the bad input ``name``."""
    for command, expected in zip(COMMANDS, EXPECTED[name], strict=True):
        args = _args(command, str(corpus / name), str(corpus))
        code, out, err = run(*args)
        check(args, code, out, err, int(expected))
    assert not (corpus / "out").exists() or not any((corpus / "out").rglob("*")), "a failed command wrote output"


def _id(case: object) -> str:
    values = case.values if hasattr(case, "values") else case
    return str(values[0])[:60]  # type: ignore[index]


@pytest.mark.parametrize(("line", "expected", "text"), ARGUMENT_CASES, ids=[_id(c) for c in ARGUMENT_CASES])
def test_bad_arguments_and_clashing_outputs_are_refused_with_the_flag_named(corpus: Path, line: str, expected: int,
                                                                          text: str) -> None:
    """Issue 13: "a bad `--clock` exits 3 where the README says 2", "messages say "pass overwrite" instead of
    `--overwrite`", "`--set algorithms.all_reduce=tree` ... crashes replay and sweep with a 60-line `ValueError`
    traceback", and outputs must be checked for clashes before anything is written (no rank is launched here:
    every case is refused before)."""
    args = line.replace("{T}", str(corpus)).replace("{DDP}", str(DDP)).replace("{SC}", str(SC)).split()
    before = sorted(p.name for p in corpus.iterdir())
    code, out, err = run(*args)
    check(args, code, out, err, expected, text)
    assert "launching" not in err and "measuring" not in err, f"{line}: started work before refusing:\n{err}"
    assert sorted(p.name for p in corpus.iterdir()) == before, f"{line}: wrote something"
