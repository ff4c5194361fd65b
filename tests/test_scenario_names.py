"""Clusters by name: every shipped scenario is reachable by a short name or its file stem wherever a scenario is
taken (one resolver, :func:`emulator_core.scenario.files.resolve_scenario`), carries a one-line description, and
``nbox scenario list`` shows them; a byte count is taken the way nbox prints it (``--bytes 1MiB``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulator_core.scenario.files import load_scenario, resolve_scenario, shipped_catalog, shipped_scenarios
from emulator_core.scenario.model import Scenario, ScenarioError
from nbox_trace.errors import InputNotFoundError

ROOT = Path(__file__).resolve().parents[1]
SHORT = {"dgx-h100": "dgx_h100_400g", "ethernet-100g": "ethernet_100g", "loopback-cpu": "loopback_cpu"}


def nbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, check=False)


@pytest.mark.parametrize(("short", "stem"), sorted(SHORT.items()))
def test_every_shipped_scenario_resolves_by_short_name_and_stem(short: str, stem: str) -> None:
    path = shipped_scenarios()[stem]
    assert resolve_scenario(short) == path
    assert resolve_scenario(stem) == path
    assert resolve_scenario(short.upper()) == path
    scenario = load_scenario(short)
    assert scenario.name == short and scenario.description and "\n" not in scenario.description


def test_catalog_lists_every_shipped_file() -> None:
    assert {e.path for e in shipped_catalog()} == set(shipped_scenarios().values())
    assert all(e.description for e in shipped_catalog())


def test_an_existing_path_wins_and_a_path_is_never_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "dgx-h100"
    mine.write_text((shipped_scenarios()["ethernet_100g"]).read_text())
    monkeypatch.chdir(tmp_path)
    assert resolve_scenario("dgx-h100") == Path("dgx-h100")  # the file here, not the shipped one
    assert load_scenario("dgx-h100").world_size == 64
    with pytest.raises(InputNotFoundError, match="scenario file not found"):
        load_scenario(tmp_path / "missing.toml")


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(InputNotFoundError) as info:
        resolve_scenario("dgx-a100")
    text = str(info.value)
    assert "\n" not in text and "dgx-a100" in text
    assert all(name in text for name in SHORT)


@pytest.mark.parametrize(("key", "value"), [("name", "DGX H100"), ("name", 3), ("description", "two\nlines"),
                                            ("description", 1.0)])
def test_name_and_description_are_checked(key: str, value: object) -> None:
    doc = {"world_size": 2, "topology": {"dims": [{"name": "d", "size": 2, "kind": "switch",
                                                   "bandwidth_gbps": 1.0, "latency_us": 1.0}]}, key: value}
    with pytest.raises(ScenarioError, match=key):
        Scenario.from_dict(doc)


def test_scenario_list_human_and_json() -> None:
    proc = nbox("scenario", "list")
    assert proc.returncode == 0, proc.stderr
    for short, stem in SHORT.items():
        assert short in proc.stdout and f"{stem}.toml" in proc.stdout
    doc = json.loads(nbox("scenario", "list", "--json").stdout)
    rows = {r["name"]: r for r in doc["scenarios"]}
    assert set(rows) == set(SHORT)
    assert rows["dgx-h100"]["world_size"] == 1024 and rows["ethernet-100g"]["world_size"] == 64
    assert all(r["description"] and Path(r["file"]).exists() for r in rows.values())


def test_commands_take_a_name_where_they_take_a_scenario() -> None:
    shown = nbox("scenario", "show", "dgx-h100", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["world_size"] == 1024
    assert nbox("scenario", "validate", "ethernet_100g").returncode == 0
    cost = json.loads(nbox("scenario", "cost", "all_reduce", "--bytes", "1MiB", "--what-if", "dgx-h100",
                           "--json").stdout)
    assert cost["bytes"] == 1 << 20 and cost["world_size"] == 1024
    bad = nbox("scenario", "show", "dgx-a100")
    assert bad.returncode == 4 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "dgx-h100" in bad.stderr


def test_bytes_take_sizes_as_printed() -> None:
    for text, n in (("4096", 4096), ("1KiB", 1024), ("64MiB", 64 << 20), ("1.5GiB", 3 << 29)):
        doc = json.loads(nbox("scenario", "cost", "all_reduce", "--bytes", text, "--json").stdout)
        assert doc["bytes"] == n
    bad = nbox("scenario", "cost", "all_reduce", "--bytes", "1 furlong")
    assert bad.returncode == 2 and "--bytes '1 furlong'" in bad.stderr


def test_replay_asks_a_named_cluster_at_1024_ranks() -> None:
    proc = nbox("replay", "traces/ddp_mlp", "--what-if", "dgx-h100", "--world-size", "1024", "--clock", "virtual",
                "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["what_if"]["world_size"] == 1024
    baseline = nbox("replay", "traces/ddp_mlp", "--baseline", "loopback-cpu", "--what-if", "ethernet-100g",
                    "--clock", "virtual", "--json")
    assert baseline.returncode == 0, baseline.stderr
    assert json.loads(baseline.stdout)["what_if"]["world_size"] == 64


def test_emulate_and_sweep_take_a_name_too(tmp_path: Path) -> None:
    from nbox_record.launch.emulation import EmulateConfig

    cfg = EmulateConfig(world_size=None, nproc=2, scenario=Path("ethernet-100g"))  # the file's own world size
    assert cfg.world_size == 64 and "ethernet_100g.toml" in cfg.world_from
    proc = nbox("sweep", "traces/ddp_mlp", "--what-if", "dgx-h100", "--vary", "world_size=8,16", "--out",
                str(tmp_path / "sw"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["world_size"] for r in json.loads(proc.stdout)["rows"]] == [8, 16]
