"""Issue 13: "Traces without durations replay as 0.00 ms with "infx (faster)" and `--json` emits `Infinity`
(not JSON)". Every command's ``--json`` output must parse with a strict parser (no NaN, no Infinity), also on a
trace with no durations; a ratio over a zero time is ``null`` in JSON, ``n/a`` in text, with a warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nbox_replay.report.summary import format_speedup, speedup
from nbox_trace.bundle.manifest import read_manifest, write_bundle
from nbox_trace.chakra.codec import read_et, write_et

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_mlp"
SCENARIO = ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml"


def _reject(constant: str) -> Any:
    raise ValueError(f"not strict JSON: {constant}")


def strict_loads(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` (RFC 8259 JSON)."""
    return json.loads(text, parse_constant=_reject)


def test_the_strict_parser_refuses_what_python_writes_for_infinities() -> None:
    for bad in ("Infinity", "-Infinity", "NaN"):
        with pytest.raises(ValueError, match="not strict JSON"):
            strict_loads(json.dumps({"speedup": float(bad.replace("Infinity", "inf"))}))


def test_a_ratio_over_a_zero_time_is_undefined_not_infinite() -> None:
    """Issue 13: "infx (faster)": a zero run time after a non-zero reference was ``inf``."""
    assert speedup(10.0, 0.0) is None and speedup(0.0, 0.0) is None and speedup(0.0, 5.0) is None
    assert speedup(10.0, 5.0) == 2.0
    assert format_speedup(None) == "n/a" and format_speedup(2.0) == "2.000x" and format_speedup(2.0, 2) == "2.00x"


@pytest.fixture(scope="module")
def no_durations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``traces/ddp_mlp`` with every node's duration (and issue cost) set to 0, as a trace imported without
    Kineto has, and no ``comm_size`` (so no collective is priced either): it replays in 0 us."""
    out = tmp_path_factory.mktemp("zero") / "zero.bundle"
    staging = out.parent / "staging"
    staging.mkdir()
    files: dict[str, Path | bytes] = {"comm_group.json": DDP / "comm_group.json"}
    for et in sorted((DDP / "trace").glob("trace.*.et")):
        meta, nodes = read_et(et)
        for node in nodes:
            node.duration_micros = 0
            for a in [a for a in node.attr if a.name in ("nbox_cpu_duration_micros", "comm_size")]:
                node.attr.remove(a)
        files[f"trace/{et.name}"] = write_et(staging / et.name, meta, nodes)
    write_bundle(out, read_manifest(DDP), files)
    return out


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


COMMANDS: list[tuple[str, list[str]]] = [
    ("trace inspect", ["trace", "inspect", "{b}/trace/trace", "--json"]),
    ("bundle inspect", ["bundle", "inspect", "{b}", "--json"]),
    ("bundle verify", ["bundle", "verify", "{b}", "--json"]),
    ("bundle diff", ["bundle", "diff", str(DDP), "{b}", "--json"]),
    ("scenario show", ["scenario", "show", str(SCENARIO), "--json"]),
    ("scenario cost", ["scenario", "cost", "all_reduce", "--bytes", "1048576", "--what-if", str(SCENARIO), "--json"]),
    ("replay", ["replay", "{b}", "--clock", "virtual", "--iterations", "1", "--json"]),
    ("replay what-if", ["replay", "{b}", "--clock", "virtual", "--iterations", "1", "--world-size", "8", "--json"]),
    ("sweep", ["sweep", "{b}", "--vary", "world_size=2,8", "--iterations", "1", "--out", "{out}", "--json"]),
]


@pytest.mark.parametrize("bundle", ["recorded", "no durations"])
@pytest.mark.parametrize(("name", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_commands_json_is_strict_json(name: str, args: list[str], bundle: str, no_durations: Path,
                                            tmp_path: Path) -> None:
    b = DDP if bundle == "recorded" else no_durations
    r = _run([a.format(b=b, out=tmp_path / "sweep") for a in args], tmp_path)
    assert r.returncode in (0, 1), (r.returncode, r.stderr)  # 1: bundle diff found differences
    doc = strict_loads(r.stdout)  # one strict document, nothing else on stdout
    assert isinstance(doc, dict)


def test_a_trace_without_durations_warns_and_prints_no_ratio(no_durations: Path, tmp_path: Path) -> None:
    """Issue 13: "Traces without durations replay as 0.00 ms with "infx (faster)"."""
    r = _run(["replay", str(no_durations), "--clock", "virtual", "--iterations", "1", "--json"], tmp_path)
    doc = strict_loads(r.stdout)
    assert doc["baseline"]["iteration_us"]["median"] == 0.0
    assert doc["speedup"] is None
    assert any("no durations" in n for n in doc["notices"])
    text = _run(["replay", str(no_durations), "--clock", "virtual", "--iterations", "1"], tmp_path)
    out = text.stdout + text.stderr
    assert text.returncode == 0 and "WARNING: the trace holds no durations" in out
    assert "no ratio to the baseline's" in out and "inf" not in out
    sweep = _run(["sweep", str(no_durations), "--vary", "world_size=2,8", "--iterations", "1", "--out",
                  str(tmp_path / "s"), "--json"], tmp_path)
    rows = strict_loads(sweep.stdout)["rows"]
    assert rows[0]["iteration_us"] == 0.0 and rows[0]["speedup"] is None and rows[1]["speedup"] is None
    assert (tmp_path / "s" / "sweep.csv").read_text().splitlines()[1].endswith(",")  # an empty cell, not inf
