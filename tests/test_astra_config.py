"""``nbox scenario import/export``: ASTRA-sim's analytical network and system configs <-> a scenario (issue 14).

The inputs are ASTRA-sim's own example configs, copied into tests/data/astra/ (its README names the source
repositories, commits and paths); every one is imported, or refused with the message asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator_core.astra.config import astra_configs, export_astra, import_astra
from emulator_core.astra.flatyaml import read_flat_yaml
from emulator_core.pricing.pricer import group_shape, make_pricer, price
from emulator_core.scenario.files import load_scenario
from emulator_core.scenario.model import Calibration, Scenario, ScenarioError, Straggler
from emulator_core.scenario.tomltext import loads_scenario
from nbox_trace.errors import InputNotFoundError, InvalidInputError, UsageError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "astra"
SIM, ANA = DATA / "astra-sim", DATA / "astra-network-analytical"
NET, SYS = SIM / "inputs" / "network", SIM / "inputs" / "system" / "analytical"
EX_NET, EX_SYS = SIM / "examples" / "network" / "analytical", SIM / "examples" / "system"
AWARE, UNAWARE = "analytical_congestion_aware", "analytical_congestion_unaware"

#: (network, system or None) -> (world size, kinds innermost first, chunks, all_reduce algorithm).
LOADS: dict[tuple[Path, Path | None], tuple[int, list[str], int, Any]] = {
    (EX_NET / "HGX-H100-validated.yml", EX_SYS / "native_collectives" / "HGX-H100-validated.json"):
        (8, ["switch"], 4, "ring"),
    (EX_NET / "Ring_4npus.yml", EX_SYS / "native_collectives" / "Ring_4chunks.json"): (4, ["ring"], 4, "ring"),
    (NET / "hgx_h100_16gpu.yml", SYS / "hgx_h100_16gpu.json"): (16, ["switch", "ring"], 4, ("ring", "ring")),
    (NET / "tpu_v3_32_2dtorus.yml", SYS / "tpu_v3_32_2dtorus.json"): (32, ["ring", "ring"], 1, ("ring", "ring")),
    (NET / "dgx_v100_4gpu.yml", SYS / "dgx_v100_4gpu.json"): (4, ["ring"], 1, "ring"),
    (ANA / "input" / "Ring_FullyConnected_Switch.yml", SYS / "dgx_v100_8gpu.json"):
        (64, ["ring", "fully_connected", "switch"], 1, ("ring", "ring", "ring")),
    (ANA / "input" / "Switch.yml", None): (16, ["switch"], 1, "auto"),
    (ANA / "input" / "FullyConnected.yml", None): (16, ["fully_connected"], 1, "auto"),
}
#: (network, system or None) -> what the refusal says (after the file name).
REFUSED: dict[tuple[Path, Path | None], str] = {
    (NET / "dgx_v100_8gpu.yml", None): 'dgx_v100_8gpu.yml:11: bandwidth[0] = "tbd": must be a number',
    (EX_NET / "Ring_4npus.yml", EX_SYS / "custom_collectives" / "custom_collective.json"):
        "custom_collective.json: all-reduce-implementation-custom: a custom collective (a Chakra ET per "
        "collective) has no nbox model",
    (NET / "hgx_h100_16gpu.yml", EX_SYS / "native_collectives" / "HGX-H100-validated.json"):
        "HGX-H100-validated.json: all-reduce-implementation = ['ring']: 1 entry for the network's 2 dimension(s)",
}


def nbox(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=env)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_every_copied_example_is_exercised() -> None:
    used = {p for pair in [*LOADS, *REFUSED] for p in pair if p is not None}
    shipped = {p for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert used == shipped
    readme = (DATA / "README.md").read_text()
    assert all(f"`{p.relative_to(SIM if p.is_relative_to(SIM) else ANA)}`" in readme for p in shipped)


@pytest.mark.parametrize("pair", list(LOADS), ids=lambda p: "+".join(x.name for x in p if x))
def test_astra_examples_import(pair: tuple[Path, Path | None]) -> None:
    world, kinds, chunks, all_reduce = LOADS[pair]
    scenario, notes = import_astra(*pair)
    assert scenario.world_size == world and [d.kind for d in scenario.topology.dims] == kinds
    assert [d.name for d in scenario.topology.dims] == [f"dim{i}" for i in range(len(kinds))]
    assert all(d.forwarding == "store_and_forward" for d in scenario.topology.dims)
    assert scenario.network.congestion == "aware" and scenario.network.chunks == chunks
    assert dict(scenario.algorithms).get("all_reduce", "auto") == all_reduce
    if pair[1] is not None and "scheduling-policy" in pair[1].read_text():  # unmapped keys are named, not dropped
        assert any("scheduling-policy" in n for n in notes)
    if pair[1] is not None and "local-mem-bw" in pair[1].read_text():
        assert any("local-mem-bw" in n and "not the network" in n for n in notes)


@pytest.mark.parametrize("pair", list(REFUSED), ids=lambda p: "+".join(x.name for x in p if x))
def test_astra_examples_refused_with_a_named_reason(pair: tuple[Path, Path | None]) -> None:
    with pytest.raises(ScenarioError) as info:
        import_astra(*pair)
    assert REFUSED[pair] in str(info.value)


def test_switch_figures_in_nbox_units() -> None:
    """50 GB/s (2^30 bytes) = 429.4967296 Gb/s; 500 ns per link = 1.0 us per switch traversal (2 links)."""
    s = import_astra(ANA / "input" / "Switch.yml").scenario
    (d,) = s.topology.dims
    assert (d.size, d.kind, d.bandwidth_gbps, d.latency_us) == (16, "switch", 429.4967296, 1.0)
    ring = import_astra(EX_NET / "Ring_4npus.yml").scenario.topology.dims[0]
    assert (ring.bandwidth_gbps, ring.latency_us) == (429.4967296, 0.5)  # a ring link is one link
    unaware = import_astra(ANA / "input" / "Switch.yml", backend=UNAWARE).scenario
    assert unaware.network.congestion == "unaware" and unaware.topology.dims[0].forwarding == "cut_through"


@pytest.mark.parametrize("backend", [AWARE, UNAWARE])
@pytest.mark.parametrize("pair", list(LOADS), ids=lambda p: "+".join(x.name for x in p if x))
def test_round_trip_import_export_import(tmp_path: Path, pair: tuple[Path, Path | None], backend: str) -> None:
    first = import_astra(*pair, backend=backend).scenario
    paths, written_backend, _ = export_astra(first, tmp_path / "out")
    assert [p.name for p in paths] == ["network.yml", "system.json"] and written_backend == backend
    again = import_astra(*paths, backend=backend).scenario
    assert again == first
    original, written = read_flat_yaml(pair[0]), read_flat_yaml(paths[0])  # figures go back as ASTRA-sim wrote them
    for key in ("topology", "npus_count", "bandwidth", "latency"):
        assert written[key][0] == original[key][0]


def test_flat_one_implementations_are_one_flat_algorithm(tmp_path: Path) -> None:
    system = write(tmp_path, "s.json", json.dumps({"all-reduce-implementation": ["oneRing"],
                                                   "all-gather-implementation": ["oneDirect", "ring"],
                                                   "reduce-scatter-implementation": ["oneHalvingDoubling"],
                                                   "all-to-all-implementation": ["direct", "ring"]}))
    s = import_astra(NET / "hgx_h100_16gpu.yml", system).scenario
    assert dict(s.algorithms) == {"all_reduce": "ring", "all_gather": "direct",
                                  "reduce_scatter": "recursive_halving_doubling", "all_to_all": ("direct", "ring")}
    doc = json.loads(astra_configs(s).system_json)
    assert doc["all-reduce-implementation"] == ["oneRing"] and doc["all-to-all-implementation"] == ["direct", "ring"]
    assert doc["reduce-scatter-implementation"] == ["oneHalvingDoubling"] and doc["preferred-dataset-splits"] == 1


def test_imported_scenario_prices_as_the_parity_bench_does() -> None:
    """One rule: ``import`` and bench/astra_parity.py's ``scenario_for`` build the same scenario, same price."""
    spec = importlib.util.spec_from_file_location("astra_parity", ROOT / "bench" / "astra_parity.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for backend in (AWARE, UNAWARE):
        for name, topology in (("Switch", "Switch"), ("FullyConnected", "FullyConnected")):
            row = {"backend": backend, "topology": topology, "npus": "16", "bandwidth_GBps": "50.0",
                   "latency_ns": "500.0"}
            expected = bench.scenario_for(row)
            imported = import_astra(ANA / "input" / f"{name}.yml", backend=backend).scenario
            assert imported == expected
            for n in (1 << 10, 1 << 20, 1 << 26):
                assert make_pricer(imported, "all_reduce", group_shape(imported), "ring")(n) == \
                    make_pricer(expected, "all_reduce", group_shape(expected), "ring")(n)
                assert price(imported, "all_reduce", n, "ring") == price(expected, "all_reduce", n, "ring")


# ------------------------------------------------------------------------------------------------ bad input

NETWORK = "topology: [ Switch ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"


@pytest.mark.parametrize(("text", "message"), [
    (NETWORK.replace("Switch", "Torus"), 'n.yml:1: topology[0] = "Torus": unknown topology; known: Ring, Switch, '
                                         "FullyConnected"),
    (NETWORK.replace("[ 8 ]", "[ 8, 2 ]"), "n.yml:2: npus_count = [8, 2]: has 2 entries but topology has 1"),
    (NETWORK.replace("[ 50.0 ]", "[ -50.0 ]"), "n.yml:3: bandwidth[0] = -50.0: must be > 0"),
    (NETWORK.replace("[ 50.0 ]", "[ 0 ]"), "n.yml:3: bandwidth[0] = 0: must be > 0"),
    (NETWORK.replace("[ 500.0 ]", "[ -1 ]"), "n.yml:4: latency[0] = -1: must be >= 0"),
    (NETWORK.replace("[ 50.0 ]", "[ nan ]"), 'n.yml:3: bandwidth[0] = "nan": must be a number'),
    (NETWORK.replace("[ 50.0 ]", "[ .inf ]"), "n.yml:3: '.inf' is neither a number nor a plain word"),
    (NETWORK.replace("[ 8 ]", "[ 1 ]"), "n.yml:2: npus_count[0] = 1: must be >= 2"),
    (NETWORK.replace("[ 8 ]", "[ 8.5 ]"), "n.yml:2: npus_count[0] = 8.5: must be an integer"),
    (NETWORK.replace("[ Switch ]", "[ Switch, Ring ]").replace("[ 8 ]", "[ 8192, 8192 ]")
     .replace("[ 50.0 ]", "[ 1, 1 ]").replace("[ 500.0 ]", "[ 1, 1 ]"),
     "n.yml:2: npus_count = [8192, 8192]: the product must be <= 16777216"),
    (NETWORK.replace("latency: [ 500.0 ]\n", ""), "n.yml: latency: missing"),
    (NETWORK.replace("[ Switch ]", "Switch"), 'n.yml:1: topology = "Switch": must be a [ list ]'),
    (NETWORK.replace("[ Switch ]", "[ ]"), "n.yml:1: topology = []: must be a [ list ]"),
    (NETWORK + "topology: [ Ring ]\n", "n.yml:5: topology: given twice (first on line 1)"),
    (NETWORK.replace("[ 8 ]", "[ 8"), "n.yml:2: a [ list ] must close on its own line"),
    (NETWORK.replace("[ 8 ]", "[ 8, ]"), "n.yml:2: an empty entry"),
    (NETWORK.replace("[ 8 ]", "[ [8] ]"), "n.yml:2: nested lists are not supported"),
    (NETWORK + "  indented: 1\n", "n.yml:5: an indented line: nested YAML is not supported"),
    ("topology:\n  - Switch\n", "n.yml:1: topology: no value (nested YAML is not supported)"),
    ("- Switch\n", "n.yml:1: '- Switch': not a 'key: value' line"),
    ("{topology: [Switch]}\n", "n.yml:1: '{topology: [Switch]}': not a 'key: value' line"),
    ("topology: &a [ Switch ]\n", "n.yml:1: '&a [ Switch ]': not supported"),
    ("topology: !!str Switch\n", "n.yml:1: '!!str Switch': not supported"),
    ('topology: [ "Sw\\itch" ]\n', "a quoted string must close on its line, without escapes"),
    ("topology: [ Switch ]\x00\n", "n.yml:1: control character U+0000"),
    ("GIF89a\x01\x02", "n.yml:1: control character U+0001"),
    ("just some prose, not yaml\n", "n.yml:1: 'just some prose, not yaml': not a 'key: value' line"),
])
def test_bad_network_configs_are_refused_naming_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "n.yml", text)
    with pytest.raises(ScenarioError) as info:
        import_astra(path)
    assert message in str(info.value) and str(tmp_path) in str(info.value)


def test_non_utf8_huge_and_missing_files(tmp_path: Path) -> None:
    binary = tmp_path / "b.yml"
    binary.write_bytes(b"topology: [ \xff\xfe ]\n")
    with pytest.raises(ScenarioError, match=r"b\.yml: not UTF-8 text \(byte 12\)"):
        import_astra(binary)
    huge = tmp_path / "huge.yml"
    huge.write_bytes(NETWORK.encode() + b"#" * (10 << 20))
    with pytest.raises(InvalidInputError, match=r"huge\.yml: ASTRA-sim network config is \d+ bytes, over the cap"):
        import_astra(huge)
    with pytest.raises(InputNotFoundError, match=r"nope\.yml"):
        import_astra(tmp_path / "nope.yml")
    with pytest.raises(UsageError, match="unknown ASTRA-sim backend 'ns3'"):
        import_astra(ANA / "input" / "Switch.yml", backend="ns3")


@pytest.mark.parametrize(("doc", "message"), [
    ("[1, 2]", "s.json: an ASTRA-sim system config is a JSON object"),
    ("{not json", "s.json: ASTRA-sim system config is not valid JSON"),
    ('{"all-reduce-implementation": "ring"}', 'all-reduce-implementation = "ring": must be a list'),
    ('{"all-reduce-implementation": ["torus"]}', "'torus': unknown; known: ring, direct, halvingDoubling, "
                                                  "doubleBinaryTree, oneRing, oneDirect, oneHalvingDoubling"),
    ('{"all-reduce-implementation": ["direct4"]}', "'direct4': a direct with a window of messages in flight has "
                                                   "no nbox model"),
    ('{"all-gather-implementation": ["doubleBinaryTree"]}', "'doubleBinaryTree' (binary_tree): nbox has no model "
                                                            "of it for all_gather"),
    ('{"all-to-all-implementation": ["halvingDoubling"]}', "nbox has no model of it for all_to_all"),
    ('{"all-reduce-implementation": []}', "an empty list"),
    ('{"all-reduce-implementation": [7]}', "7 is not an implementation name"),
    ('{"preferred-dataset-splits": 0}', "s.json: preferred-dataset-splits = 0: must be >= 1"),
    ('{"preferred-dataset-splits": "4"}', 'preferred-dataset-splits = "4": must be an integer'),
    ('{"preferred-dataset-splits": NaN}', "preferred-dataset-splits = nan: must be an integer"),
    ('{"per-node-custom-implementation": "x.yml"}', "per-node-custom-implementation: a custom collective"),
])
def test_bad_system_configs_are_refused_naming_file_and_key(tmp_path: Path, doc: str, message: str) -> None:
    path = write(tmp_path, "s.json", doc)
    with pytest.raises(InvalidInputError) as info:
        import_astra(ANA / "input" / "Switch.yml", path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_unknown_and_unmapped_system_keys_are_notes(tmp_path: Path) -> None:
    path = write(tmp_path, "s.json", json.dumps({"endpoint-delay": 10, "endpoint-delay-typo": 1, "L": 3,
                                                 "collective-optimization": "baseline", "peak-perf": 900}))
    notes = import_astra(ANA / "input" / "Switch.yml", path).notes
    text = "\n".join(notes)
    assert "not mapped: endpoint-delay = 10 (a per-packet delay" in text
    assert 'collective-optimization = "baseline"' in text and "(LogGP / memory bus model): L" in text
    assert "not the network): peak-perf" in text and "ignored: endpoint-delay-typo" in text
    many = write(tmp_path, "m.json", json.dumps({f"k{i}\n": i for i in range(25)}))
    (note,) = import_astra(ANA / "input" / "Switch.yml", many).notes  # one line, escaped, capped
    assert note.endswith("ignored: k0\\n, k1\\n, k2\\n, k3\\n, k4\\n, k5\\n, k6\\n, k7\\n, k8\\n, k9\\n (and 15 more)")
    extra = write(tmp_path, "n.yml", NETWORK + "switch_latency: [ 1 ]\n")
    assert import_astra(extra).notes[0].endswith("not an analytical network key; ignored (as ASTRA-sim does): "
                                                 "switch_latency")
    quiet = write(tmp_path, "q.json", json.dumps({"endpoint-delay": 0, "collective-optimization": "localBWAware"}))
    assert import_astra(ANA / "input" / "Switch.yml", quiet).notes == []  # what nbox models: nothing to say


# ------------------------------------------------------------------------------------------------ export


def _base() -> Scenario:
    return import_astra(NET / "hgx_h100_16gpu.yml", SYS / "hgx_h100_16gpu.json").scenario


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: replace(s, topology=replace(s.topology, dims=(replace(s.topology.dims[0], in_network_reduction=True),
                                                             s.topology.dims[1]))),
     "topology.dims[0].in_network_reduction = true: ASTRA-sim's analytical network has no in-network reduction"),
    (lambda s: replace(s, calibration=(Calibration("all_reduce", "dim0", "ring", 8, bandwidth_factor=0.9),)),
     'calibration[0] = "all_reduce": calibration factors have no ASTRA-sim form'),
    (lambda s: replace(s, network=replace(s.network, message_overhead_us=2.0)),
     "network.message_overhead_us = 2.0: ASTRA-sim's analytical network has no per-message overhead"),
    (lambda s: replace(s, algorithms={"all_reduce": "binary_tree"}),
     'algorithms.all_reduce = "binary_tree": one flat binary_tree over 2 dimensions has no ASTRA-sim'),
    (lambda s: replace(s, algorithms={"all_reduce": ("ring", "double_binary_tree")}),
     "algorithms.all_reduce = ['ring', 'double_binary_tree']: 'double_binary_tree' has no ASTRA-sim"),
    (lambda s: replace(s, algorithms={"all_to_all": ("pairwise", "ring")}), "'pairwise' has no ASTRA-sim"),
])
def test_export_refuses_what_astra_sim_cannot_express(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        export_astra(change(_base()), tmp_path / "out", source="s.toml")
    assert str(info.value).startswith("s.toml: ") and message in str(info.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_export_removes_the_first_file_when_the_second_cannot_be_written(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from nbox_trace.errors import OutputWriteError
    from nbox_trace.files import write_atomic as real

    def failing(path: Path, data: str) -> Path:
        if path.name == "system.json":
            raise OutputWriteError(f"{path}: cannot write: disk full")
        return real(path, data)

    monkeypatch.setattr("emulator_core.astra.config.write_atomic", failing)
    with pytest.raises(OutputWriteError):
        export_astra(_base(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_export_size_one_dimension_refused(tmp_path: Path) -> None:
    s = loads_scenario('world_size = 8\n[[topology.dims]]\nname = "a"\nsize = 1\nkind = "switch"\n'
                       'bandwidth_gbps = 100.0\nlatency_us = 1.0\n[[topology.dims]]\nname = "b"\nsize = 8\n'
                       'kind = "ring"\nbandwidth_gbps = 100.0\nlatency_us = 1.0\n')
    with pytest.raises(ScenarioError, match=r"topology.dims\[0\].size = 1: ASTRA-sim needs npus_count > 1"):
        astra_configs(s)


def test_export_notes_what_it_leaves_out() -> None:
    s = replace(_base(), compute_scale=2.0, stragglers=(Straggler(3, 1.5),),
                algorithms=(("all_reduce", ("ring", "direct")), ("broadcast", "ring")),
                topology=replace(_base().topology, dims=(replace(_base().topology.dims[0], links_per_rank=18,
                                                                 forwarding="cut_through"),
                                                         _base().topology.dims[1])))
    configs = astra_configs(s)
    text = "\n".join(configs.notes)
    assert "not exported (not ASTRA-sim's network or collective config): compute_scale, stragglers" in text
    assert "algorithms: auto for all_gather, reduce_scatter, all_to_all: no implementation written" in text
    assert "algorithms: not written (ASTRA-sim's system config has no such key): broadcast" in text
    assert "links_per_rank = 18: written as one link of 18 x the bandwidth" in text
    assert "dimension(s) dim0 say otherwise" in text
    assert "bandwidth: [ 7200.0, 50.0 ]" in configs.network_yml  # 18 x 400 GB/s
    assert json.loads(configs.system_json)["all-reduce-implementation"] == ["ring", "direct"]


def test_shipped_scenario_exports(tmp_path: Path) -> None:
    dgx = ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml"
    with pytest.raises(ScenarioError, match="in_network_reduction = true: ASTRA-sim's analytical network has no"):
        export_astra(load_scenario(dgx), tmp_path)  # NVLink SHARP: ASTRA-sim cannot say it
    s = load_scenario(dgx, ["topology.dims.0.in_network_reduction=false", "network.message_overhead_us=0.0"])
    paths, backend, notes = export_astra(s, tmp_path)
    assert backend == AWARE and len(notes) >= 2
    back = import_astra(*paths).scenario
    assert back.world_size == s.world_size and [d.size for d in back.topology.dims] == [8, 128]


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_import_export_round_trip(tmp_path: Path) -> None:
    net, system = NET / "hgx_h100_16gpu.yml", SYS / "hgx_h100_16gpu.json"
    proc = nbox("scenario", "import", net, system, "-o", tmp_path / "s.toml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {tmp_path / 's.toml'}: world size 16 (8 switch x 2 ring), aware backend\n"
    assert "nbox scenario import: note: " in proc.stderr and "scheduling-policy" in proc.stderr
    imported = load_scenario(tmp_path / "s.toml")
    assert imported == import_astra(net, system).scenario
    proc = nbox("scenario", "export", tmp_path / "s.toml", "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "wrote " in proc.stdout and "analytical_congestion_aware backend" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["network.yml", "system.json"]
    proc = nbox("scenario", "import", tmp_path / "out" / "network.yml", tmp_path / "out" / "system.json",
                "-o", tmp_path / "s2.toml", "--backend", "aware")
    assert proc.returncode == 0 and load_scenario(tmp_path / "s2.toml") == imported
    proc = nbox("scenario", "import", net, "-o", tmp_path / "u.toml", "--backend", "unaware")
    assert proc.returncode == 0 and load_scenario(tmp_path / "u.toml").network.congestion == "unaware"


def test_cli_errors_exit_codes_and_no_output_left(tmp_path: Path) -> None:
    out = tmp_path / "s.toml"
    proc = nbox("scenario", "import", NET / "dgx_v100_8gpu.yml", "-o", out)
    assert proc.returncode == 3 and not out.exists()
    assert proc.stderr.strip().count("\n") <= 1 and 'dgx_v100_8gpu.yml:11: bandwidth[0] = "tbd"' in proc.stderr
    proc = nbox("scenario", "import", NET / "hgx_h100_16gpu.yml", EX_SYS / "custom_collectives" /
                "custom_collective.json", "-o", out)
    assert proc.returncode == 3 and not out.exists() and "custom collective" in proc.stderr
    proc = nbox("scenario", "import", tmp_path / "missing.yml", "-o", out)
    assert proc.returncode == 4 and not out.exists()
    proc = nbox("scenario", "import", ANA / "input" / "Switch.yml", "-o", out, "--backend", "ns3")
    assert proc.returncode == 2 and "--backend 'ns3'" in proc.stderr and not out.exists()
    proc = nbox("scenario", "import", ANA / "input" / "Switch.yml")
    assert proc.returncode == 2 and "--out" in proc.stderr
    bad = write(tmp_path, "bad.toml", (ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml").read_text())
    proc = nbox("scenario", "export", bad, "-o", tmp_path / "dir", "--set", "network.message_overhead_us=1.5",
                "--set", "topology.dims.0.in_network_reduction=false")
    assert proc.returncode == 3 and not (tmp_path / "dir").exists()
    assert "bad.toml: network.message_overhead_us = 1.5" in proc.stderr
    proc = nbox("scenario", "export", bad, "-o", bad)  # a file where a folder is needed
    assert proc.returncode == 2 and "is an existing file" in proc.stderr


def test_cli_garbage_inputs_exit_3_or_4_without_a_traceback(tmp_path: Path) -> None:
    garbage = {"empty.yml": b"", "random.yml": bytes(range(256)) * 4, "zip.yml": b"PK\x03\x04" + b"\x00" * 64,
               "gzip.yml": b"\x1f\x8b\x08\x00garbage", "deep.json": b"[" * 100_000}
    for name, data in garbage.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder.yml").mkdir()
    cases = [[tmp_path / n] for n in garbage if n.endswith(".yml")] + [[tmp_path / "folder.yml"]] + \
        [[ANA / "input" / "Switch.yml", tmp_path / "deep.json"], [ANA / "input" / "Switch.yml", tmp_path]]
    for args in cases:
        proc = nbox("scenario", "import", *args, "-o", tmp_path / "out.toml")
        assert proc.returncode in (3, 4) and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith("nbox: error: ") and str(args[-1]) in proc.stderr, proc.stderr
    assert not (tmp_path / "out.toml").exists()
    proc = nbox("scenario", "import", "--help")
    assert proc.returncode == 0 and "Example: nbox scenario import" in proc.stdout


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where nothing can be created")
def test_cli_export_unwritable_folder_exit_5() -> None:
    out = Path("/proc/nbox-astra-test/out")  # even root cannot create a folder here
    proc = nbox("scenario", "export", ROOT / "emulator_core" / "scenarios" / "dgx_h100_400g.toml", "-o", out,
                "--set", "topology.dims.0.in_network_reduction=false", "--set", "network.message_overhead_us=0.0")
    assert proc.returncode == 5 and "cannot write" in proc.stderr and not out.exists()


def test_export_notes_a_fabric_kind_it_leaves_out() -> None:
    plain = "\n".join(astra_configs(_base()).notes)
    dims = _base().topology.dims
    s = replace(_base(), topology=replace(_base().topology, dims=(dims[0], replace(dims[1], fabric="efa"))))
    assert "topology.dims.fabric" not in plain
    assert "topology.dims.fabric" in "\n".join(astra_configs(s).notes)
