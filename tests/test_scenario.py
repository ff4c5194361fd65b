"""What-if scenarios: shipped examples, validation errors naming the key, overrides, TOML round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator_core.network.costmodels import algorithms_for
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import (
    COLLECTIVES,
    DIMENSION_KINDS,
    Dimension,
    Scenario,
    ScenarioError,
    Straggler,
    Topology,
)
from emulator_core.scenario.overrides import parse_override
from emulator_core.scenario.tomltext import dump_toml, loads_scenario
from nbox_trace.errors import InputNotFoundError, InvalidInputError

BASE = """\
world_size = 16
compute_scale = 1.0
overlap = "overlap"

[algorithms]
all_reduce = "ring"

[[topology.dims]]
name = "node"
size = 8
kind = "switch"
bandwidth_gbps = 3600.0
latency_us = 2.0
links_per_rank = 18

[[topology.dims]]
name = "net"
size = 2
kind = "ring"
bandwidth_gbps = 400.0
latency_us = 5.0

[[stragglers]]
rank = 3
slowdown = 1.5
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def dim(**kw: object) -> Dimension:
    args: dict[str, object] = {"name": "d", "size": 4, "kind": "switch", "bandwidth_gbps": 100.0, "latency_us": 1.0}
    args.update(kw)
    return Dimension(**args)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ shipped scenarios


def test_shipped_scenarios_present() -> None:
    assert set(shipped_scenarios()) >= {"dgx_h100_400g", "ethernet_100g", "loopback_cpu"}


@pytest.mark.parametrize("name", sorted(shipped_scenarios()))
def test_shipped_scenario_loads_and_round_trips(name: str) -> None:
    path = shipped_scenarios()[name]
    s = load_scenario(path)
    assert s.topology.world_size == s.world_size
    assert loads_scenario(dump_toml(s)) == s
    text = path.read_text(encoding="utf-8")
    assert "# source:" in text


def test_dgx_figures() -> None:
    s = load_scenario(shipped_scenarios()["dgx_h100_400g"])
    assert s.world_size == 1024
    nvlink, ib = s.topology.dims
    assert (nvlink.size, ib.size) == (8, 128)
    assert nvlink.bandwidth_bytes_per_us == 450e9 / 1e6  # 450 GB/s per direction
    assert ib.bandwidth_bytes_per_us == 50e9 / 1e6  # 400 Gb/s = 50 GB/s
    assert nvlink.link_bytes_per_us == pytest.approx(25e9 / 1e6)


def test_default_is_loopback_and_fills_size() -> None:
    s = load_scenario(None, ["world_size=64"])
    assert s.world_size == 64
    assert s.topology.dims[-1].size == 64


def test_size_zero_fills_product() -> None:
    s = Scenario(world_size=1024, topology=Topology((dim(size=8), dim(name="n", size=0))))
    assert s.topology.dims[1].size == 128
    with pytest.raises(ScenarioError, match=r"topology\.dims\[1\]\.size = 0: cannot fill"):
        Scenario(world_size=12, topology=Topology((dim(size=8), dim(name="n", size=0))))


# ------------------------------------------------------------------------------------------- basics


def test_round_trip_and_accessors(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, BASE))
    assert s.algorithm("all_reduce") == "ring"
    assert s.algorithm("all_gather") == "auto"
    assert s.slowdown(3) == 1.5 and s.slowdown(0) == 1.0
    assert load_scenario(write(tmp_path, dump_toml(s), "again.toml")) == s
    assert Scenario.from_dict(s.to_dict()) == s
    assert hash(s) == hash(loads_scenario(dump_toml(s)))


def test_mapping_algorithms_accepted() -> None:
    s = Scenario(world_size=4, topology=Topology((dim(),)),
                 algorithms={"broadcast": "binomial_tree", "all_reduce": "ring"})  # type: ignore[arg-type]
    assert s.algorithms == (("all_reduce", "ring"), ("broadcast", "binomial_tree"))


def test_frozen(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, BASE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.world_size = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.topology.dims[0].bandwidth_gbps = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.stragglers[0].slowdown = 2.0  # type: ignore[misc]


def test_units() -> None:
    d = dim(bandwidth_gbps=8.0)  # 8 Gb/s = 1 GB/s = 1000 bytes/us
    assert d.bandwidth_bytes_per_us == 1000.0


# ----------------------------------------------------------------------------------------- overrides


def test_overrides_apply(tmp_path: Path) -> None:
    p = write(tmp_path, BASE)
    s = load_scenario(p, ["world_size=32", "topology.dims.1.size=4", "topology.dims.1.bandwidth_gbps=800",
                          "algorithms.all_gather=ring", "algorithms.all_reduce=\"auto\"", "compute_scale=2",
                          "overlap=serialize", "stragglers.1.rank=31", "stragglers.1.slowdown=3"])
    assert s.world_size == 32
    assert s.topology.dims[1].size == 4 and s.topology.dims[1].bandwidth_gbps == 800.0
    assert s.algorithm("all_gather") == "ring" and s.algorithm("all_reduce") == "auto"
    assert s.compute_scale == 2.0 and s.overlap == "serialize"
    assert s.slowdown(31) == 3.0 and s.slowdown(3) == 1.5


def test_parse_override_values() -> None:
    assert parse_override("a=2") == (["a"], 2)
    assert parse_override("a=2.5") == (["a"], 2.5)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a.b=ring") == (["a", "b"], "ring")
    assert parse_override('a="x y"') == (["a"], "x y")


@pytest.mark.parametrize("bad", ["world_size", "=3", "a..b=3", "world_size=", "a b=3", "world_size=[1, 2]",
                                 "world_size={a = 1}"])
def test_bad_override_syntax(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ScenarioError, match="--set"):
        load_scenario(write(tmp_path, BASE), [bad])


@pytest.mark.parametrize(("override", "key"), [
    ("wrold_size=3", "wrold_size"),
    ("topology.dims.0.bandwith_gbps=3", "topology.dims.0.bandwith_gbps"),
    ("algorithms.allreduce=ring", "algorithms.allreduce"),
    ("topology.links=3", "topology.links"),
    ("stragglers.0.speed=2", "stragglers.0.speed"),
])
def test_override_unknown_key(tmp_path: Path, override: str, key: str) -> None:
    with pytest.raises(ScenarioError, match="unknown key") as e:
        load_scenario(write(tmp_path, BASE), [override])
    assert e.value.key == key
    assert "allowed:" in str(e.value)


@pytest.mark.parametrize(("override", "msg"), [
    ("topology.dims.5.size=3", "index out of range"),
    ("topology.dims.x.size=3", "list index"),
    ("topology.dims=3", "table or array"),
    ("topology.dims.0=3", "is a table"),
])
def test_override_bad_path(tmp_path: Path, override: str, msg: str) -> None:
    with pytest.raises(ScenarioError, match=msg):
        load_scenario(write(tmp_path, BASE), [override])


# ----------------------------------------------------------------------- validation names the key path


@pytest.mark.parametrize(("override", "expected"), [
    ("world_size=0", "world_size = 0: must be >= 1"),
    ("world_size=2.5", "world_size = 2.5: must be an integer"),
    ("world_size=true", "world_size = true: must be an integer"),
    ("world_size=24", "topology.dims = \"8 x 2\": the product of the sizes (16) must equal world_size (24)"),
    ("topology.dims.1.bandwidth_gbps=-3", "topology.dims[1].bandwidth_gbps = -3: must be > 0"),
    ("topology.dims.1.bandwidth_gbps=nan", "topology.dims[1].bandwidth_gbps = nan: must be finite"),
    ("topology.dims.0.latency_us=-1", "topology.dims[0].latency_us = -1: must be >= 0"),
    ("topology.dims.0.burst_bytes=0", "topology.dims.0.burst_bytes: removed key in --set "
                                      "topology.dims.0.burst_bytes=0: the token-bucket burst credit is no longer "
                                      "modeled; delete this key"),
    ("jitter=calibrated", "jitter: removed key in --set jitter=calibrated: the calibrated jitter is no longer "
                          "modeled; delete this key"),
    ("calibration.0.jitter_us=0", "calibration.0.jitter_us: removed key in --set calibration.0.jitter_us=0: the "
                                  "calibrated jitter is no longer modeled; delete this key"),
    ("jitter_seed=7", "jitter_seed: removed key in --set jitter_seed=7: emulated ranks' compute noise"),
    ("compute_noise=mirror_history", "compute_noise: removed key in --set compute_noise=mirror_history: emulated "
                                     "ranks' compute noise is no longer modeled; delete this key"),
    ("noise_seed=3", "noise_seed: removed key in --set noise_seed=3: emulated ranks' compute noise"),
    ("topology.dims.0.kind=torus", "topology.dims[0].kind = \"torus\": must be one of"),
    ("topology.dims.0.links_per_rank=0", "topology.dims[0].links_per_rank = 0: must be >= 1"),
    ("topology.dims.0.size=0", "topology.dims[0].size = 0: only the last dimension may have size 0"),
    ("topology.dims.1.name=node", "topology.dims[1].name = \"node\": duplicate dimension name"),
    ("topology.dims.1.name=2x", "topology.dims[1].name = \"2x\": must be"),
    # issue 13: names were checked for form only ("tree" validated, then crashed replay with a ValueError)
    ("algorithms.all_reduce=Ring-2", "algorithms.all_reduce = \"Ring-2\": no cost model for all_reduce; known: auto"),
    ("algorithms.all_reduce=3", "algorithms.all_reduce = 3: no cost model for all_reduce; known: auto, ring"),
    ("algorithms.all_reduce=tree", "algorithms.all_reduce = \"tree\": no cost model for all_reduce; known: auto, "
                                   "ring, double_binary_tree"),
    ("stragglers.0.rank=16", "stragglers[0].rank = 16: must be < world_size (16)"),
    ("stragglers.0.rank=-1", "stragglers[0].rank = -1: must be >= 0"),
    ("stragglers.0.slowdown=0.5", "stragglers[0].slowdown = 0.5: must be >= 1"),
    ("stragglers.1.rank=3", "stragglers[1].slowdown: missing"),
    ("compute_scale=0", "compute_scale = 0: must be > 0"),
    ("compute_scale=fast", "compute_scale = \"fast\": must be a number"),
    ("overlap=maybe", "overlap = \"maybe\": must be one of 'overlap', 'serialize'"),
    # issue 59: racks behind an oversubscribed uplink, on a switch dimension only
    ("topology.dims.0.racks=3", "topology.dims[0].racks = 3: must divide the dimension's size (8)"),
    ("topology.dims.0.racks=0", "topology.dims[0].racks = 0: must be >= 1"),
    ("topology.dims.1.racks=2", "topology.dims[1].racks = 2: needs kind = \"switch\" (this dimension is 'ring')"),
    ("topology.dims.0.oversubscription=4", "topology.dims[0].oversubscription = 4: oversubscribes the uplinks"),
    ("topology.dims.0.oversubscription=0.5", "topology.dims[0].oversubscription = 0.5: must be >= 1"),
])
def test_validation_names_key_and_file(tmp_path: Path, override: str, expected: str) -> None:
    p = write(tmp_path, BASE)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p, [override])
    msg = str(e.value)
    assert msg.startswith(f"{p}: "), msg
    assert expected in msg, msg
    assert isinstance(e.value, InvalidInputError) and e.value.exit_code == 3


_BURST_GONE = "the token-bucket burst credit is no longer modeled; delete this key"
_JITTER_GONE = "the calibrated jitter is no longer modeled; delete this key"
_NOISE_GONE = "emulated ranks' compute noise is no longer modeled; delete this key"
#: A [[calibration]] entry as an older ``nbox calibrate`` wrote it, with its measured spread (``jitter_us``).
_OLD_CAL_ENTRY = ('\n[[calibration]]\ncollective = "all_reduce"\ndimension = "net"\nalgorithm = "ring"\nranks = 2\n'
                  "latency_factor = 1.0\nbandwidth_factor = 1.0\nefficiency = [[1024, 0.0079], [67108864, 1.0]]\n"
                  "jitter_us = [[0.0, 0.0], [0.5, 0.0], [0.9, 3145.0], [0.99, 6628.0], [1.0, 16510.0]]\n"
                  'library = "gloo"\nsizes_bytes = [1024, 67108864]\n')


@pytest.mark.parametrize(("text", "key", "reason"), [
    (BASE.replace("latency_us = 5.0", "latency_us = 5.0\nburst_bytes = 125000.0"), "topology.dims[1].burst_bytes",
     _BURST_GONE),
    (BASE + '\n[[calibration]]\ncollective = "all_reduce"\ndimension = "net"\nalgorithm = "ring"\nranks = 2\n'
            "rest_factor = 0.5\n", "calibration[0].rest_factor", _BURST_GONE),
    (BASE + '\n[[calibration]]\ncollective = "all_gather"\ndimension = "net"\nalgorithm = "ring"\nranks = 2\n'
            "apart_rest_factor = 0.0\n", "calibration[0].apart_rest_factor", _BURST_GONE),
    (BASE + _OLD_CAL_ENTRY, "calibration[0].jitter_us", _JITTER_GONE),
    ('jitter = "calibrated"\n' + BASE, "jitter", _JITTER_GONE),
    ('jitter = "off"\njitter_seed = 7\n' + BASE, "jitter", _JITTER_GONE),
    ("jitter_seed = 7\n" + BASE, "jitter_seed", _NOISE_GONE),
    ('compute_noise = "mirror_history"\n' + BASE, "compute_noise", _NOISE_GONE),
    ("noise_seed = 42\n" + BASE, "noise_seed", _NOISE_GONE),
])
def test_a_file_with_a_removed_key_is_refused_in_one_line(tmp_path: Path, text: str, key: str, reason: str) -> None:
    """The token-bucket burst credit with its rest shares, and the calibrated jitter, are gone: a scenario or
    calibration file that still has one of their keys (e.g. a calibration an older ``nbox calibrate`` wrote, with
    ``jitter_us`` tables) is refused (exit 3, as any bad scenario input), the line naming the file and the key and
    saying what to do, rather than read as if the key still acted."""
    import subprocess
    import sys

    p = write(tmp_path, text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    assert str(e.value) == f"{p}: {key}: removed key: {reason}"
    assert e.value.exit_code == 3
    proc = subprocess.run([sys.executable, "-m", "nbox", "scenario", "validate", str(p)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(p) in lines[0] and key in lines[0] and "removed key" in lines[0], proc.stderr


def test_duplicate_straggler_rank(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"stragglers\[1\]\.rank = 3: rank listed twice"):
        load_scenario(write(tmp_path, BASE), ["stragglers.1.rank=3", "stragglers.1.slowdown=2"])


@pytest.mark.parametrize(("text", "expected"), [
    ("foo = 1\n" + BASE, "foo: unknown key (allowed: name, description, world_size, topology"),
    (BASE + "\nfoo = 1\n", "stragglers[0].foo: unknown key (allowed: rank, slowdown)"),
    (BASE.replace("latency_us = 5.0", "latency_us = 5.0\nlatency_ms = 1"),
     "topology.dims[1].latency_ms: unknown key (allowed: name, size"),
    (BASE.replace('all_reduce = "ring"', 'allreduce = "ring"'), "algorithms.allreduce: unknown collective"),
    (BASE.replace("world_size = 16\n", ""), "world_size: missing"),
    (BASE.replace("latency_us = 5.0\n", ""), "topology.dims[1].latency_us: missing"),
    ("world_size = 4\ntopology = 3\n", "topology: must be a table"),
    ("world_size = 4\n[topology]\n", "topology.dims: missing"),
    ("world_size = 4\n[topology]\ndims = []\n", "topology.dims: needs at least one dimension"),
    ("algorithms = 3\n" + BASE.replace("[algorithms]\nall_reduce = \"ring\"\n", ""), "algorithms = 3: must be a table"),
    ("stragglers = 3\n" + BASE.split("[[stragglers]]")[0], "stragglers = 3: must be an array"),
    (BASE + "\n[[stragglers]]\nrank = 5\nslowdown = 1.0\nextra = 1\n", "stragglers[1].extra: unknown key"),
    ("world_size = [", "not valid TOML"),
])
def test_file_errors(tmp_path: Path, text: str, expected: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    assert str(e.value).startswith(f"{p}: ")
    assert expected in str(e.value), str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        load_scenario(tmp_path / "nope.toml")


def test_direct_construction_errors() -> None:
    with pytest.raises(ScenarioError, match=r"^bandwidth_gbps = -3\.0: must be > 0$"):
        dim(bandwidth_gbps=-3.0)
    with pytest.raises(ScenarioError, match="unknown collective"):
        Scenario(world_size=4, topology=Topology((dim(),)), algorithms=(("nope", "ring"),))
    with pytest.raises(ScenarioError, match=r"^slowdown = 0\.9: must be >= 1$"):
        Straggler(rank=0, slowdown=0.9)


# ------------------------------------------------------------------------------------ property: round trip

_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,10}", fullmatch=True)
_pos = st.floats(min_value=1e-6, max_value=1e7, allow_nan=False, allow_infinity=False)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    sizes = draw(st.lists(st.integers(1, 16), min_size=1, max_size=4))
    names = draw(st.lists(_names, min_size=len(sizes), max_size=len(sizes), unique=True))
    dims = tuple(
        Dimension(name=n, size=s, kind=draw(st.sampled_from(DIMENSION_KINDS)), bandwidth_gbps=draw(_pos),
                  latency_us=draw(st.floats(0, 1e4, allow_nan=False)), links_per_rank=draw(st.integers(1, 64)))
        for n, s in zip(names, sizes, strict=True)
    )
    world = 1
    for s in sizes:
        world *= s
    ranks = draw(st.lists(st.integers(0, world - 1), unique=True, max_size=4))
    stragglers = tuple(Straggler(r, draw(st.floats(1.0, 100.0))) for r in ranks)
    colls = draw(st.lists(st.sampled_from(COLLECTIVES), unique=True, max_size=4))
    algos = {c: draw(st.sampled_from(("auto", *algorithms_for(c)))) for c in colls}
    return Scenario(world_size=world, topology=Topology(dims), algorithms=tuple(algos.items()),
                    compute_scale=draw(_pos), stragglers=stragglers,
                    overlap=draw(st.sampled_from(("overlap", "serialize"))))


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_property_round_trip(s: Scenario) -> None:
    assert loads_scenario(dump_toml(s)) == s
    assert Scenario.from_dict(s.to_dict()) == s


def test_live_unsupported_names_what_the_live_backend_cannot_apply() -> None:
    from dataclasses import replace as _replace

    from emulator_core.backend.live_policy import live_unsupported

    base = load_scenario(None)
    assert live_unsupported(base) is None
    assert live_unsupported(_replace(base, compute_scale=2.0)) == (
        "compute_scale = 2: the live emulation runs the script's real compute, so it cannot apply this "
        "(nbox replay can); remove it from the scenario")
    assert 'overlap = "serialize"' in str(live_unsupported(_replace(base, overlap="serialize")))


def test_racks_need_the_generic_model_and_round_trip(tmp_path: Path) -> None:
    """racks > 1 with library = "nccl" is refused (NCCL's tuner has no uplink); the keys round-trip, written only
    when not the defaults."""
    p = write(tmp_path, BASE)
    with pytest.raises(ScenarioError, match="NCCL's tuner"):
        load_scenario(p, ["topology.dims.0.racks=2", "network.library=nccl"])
    ok = load_scenario(p, ["topology.dims.0.racks=2", "topology.dims.0.oversubscription=4"])
    assert ok.topology.dims[0].racks == 2 and ok.topology.dims[0].oversubscription == 4.0
    assert loads_scenario(dump_toml(ok)) == ok
    assert "racks" not in dump_toml(load_scenario(p))


def test_a_busy_delay_is_a_time_of_at_least_zero() -> None:
    from emulator_core.scenario.model import Calibration

    with pytest.raises(ScenarioError, match="busy_delay_us = -1: must be >= 0"):
        Calibration("all_reduce", "d", "ring", 2, busy_slowdown=2.0, busy_nbytes=1024, busy_delay_us=-1)
    c = Calibration("all_reduce", "d", "ring", 2, busy_slowdown=2.0, busy_nbytes=1024, busy_delay_us=5.0)
    assert c.to_dict()["busy_delay_us"] == 5.0 and Calibration.from_dict(c.to_dict()) == c
    assert "busy_delay_us" not in Calibration("all_reduce", "d", "ring", 2).to_dict()


def test_a_size_key_takes_a_size_with_a_unit_and_any_other_key_refuses_one(tmp_path: Path) -> None:
    """--set takes sizes as nbox prints them where a key is a byte count (issue 61), and refuses a size with a unit
    in one line where the key is not one (it would reach the key as a bare string)."""
    text = BASE + ('\n[[calibration]]\ncollective = "all_reduce"\ndimension = "net"\nalgorithm = "ring"\nranks = 2\n'
                   'busy_slowdown = 2.0\n')
    p = write(tmp_path, text)
    assert load_scenario(p, ["calibration.0.busy_nbytes=1MiB"]).calibration[0].busy_nbytes == 1 << 20
    assert load_scenario(p, ["calibration.0.busy_nbytes=4096"]).calibration[0].busy_nbytes == 4096
    with pytest.raises(ScenarioError) as e:
        load_scenario(p, ["world_size=1MiB"])
    assert "'1MiB' is a size, and world_size is not a byte count" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ScenarioError, match="not a whole number of bytes"):
        load_scenario(p, ["calibration.0.busy_nbytes=1.3B"])
    assert load_scenario(p, ["topology.dims.0.name=m1"]).topology.dims[0].name == "m1"  # a name is no size
