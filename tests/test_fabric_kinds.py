"""A dimension's ``fabric`` key: validated where it stands, kept by the TOML round trip, and each of its terms
(the transport's latency, its protocols, the network hops' slices) moves NCCL's priced time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emulator_core.network.fabric_kinds import FABRIC_KINDS, fabric_kinds, net_fabric, role
from emulator_core.pricing.nccl_tuner import nccl_plan
from emulator_core.pricing.pricer import price
from emulator_core.scenario.files import load_scenario, shipped_scenarios
from emulator_core.scenario.model import ScenarioError
from emulator_core.scenario.tomltext import dump_toml, loads_scenario
from nbox_trace.errors import NboxError

SHAPE = ("world_size=32", "topology.dims.1.size=4")


def _dgx(*sets: str):  # type: ignore[no-untyped-def]
    return load_scenario(shipped_scenarios()["dgx_h100_400g"], (*SHAPE, *sets))


def _plain():  # type: ignore[no-untyped-def]
    """The shipped DGX H100 with no ``fabric`` on its network (it ships on ``infiniband``): NCCL's model as is."""
    s = _dgx()
    dims = s.topology.dims
    return replace(s, topology=replace(s.topology, dims=(dims[0], replace(dims[1], fabric=""))))


def _time(collective: str, nbytes: int, *sets: str) -> tuple[str, float]:
    best = price(_dgx(*sets), collective, nbytes, "auto")[0][0]
    return best.algorithm, best.time_us


def _plain_time(collective: str, nbytes: int) -> float:
    return price(_plain(), collective, nbytes, "auto")[0][0].time_us


def test_the_shipped_dgx_runs_on_infiniband() -> None:
    assert [d.fabric for d in _dgx().topology.dims] == ["", "infiniband"]


def test_every_kind_in_the_data_file_and_back() -> None:
    assert tuple(fabric_kinds()["kinds"]) == FABRIC_KINDS
    assert {role(k) for k in FABRIC_KINDS} == {"node", "network"}
    for kind in FABRIC_KINDS:
        if role(kind) == "network":
            net = net_fabric(kind)
            assert net.latency_us >= 0 and net.protocols and len(net.slice_bytes) == 3


@pytest.mark.parametrize("sets, words", [
    (("topology.dims.1.fabric=ethernet",), "fabric"),
    (("topology.dims.1.fabric=3",), "fabric"),
    (("topology.dims.1.fabric=nvlink",), "node fabric"),
    (("topology.dims.0.fabric=infiniband",), "network"),
])
def test_a_wrong_fabric_is_refused_naming_the_key(sets: tuple[str, ...], words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _dgx(*sets)
    assert isinstance(err.value, NboxError)
    assert "fabric" in str(err.value) and words in str(err.value)


def test_one_dimension_topology_takes_a_network_kind_not_nvlink() -> None:
    eth = shipped_scenarios()["ethernet_100g"]
    assert load_scenario(eth, ("topology.dims.0.fabric=roce",)).topology.dims[0].fabric == "roce"
    with pytest.raises(ScenarioError):
        load_scenario(eth, ("topology.dims.0.fabric=nvlink",))


def test_fabric_survives_the_toml_round_trip() -> None:
    s = _dgx("topology.dims.0.fabric=nvlink", "topology.dims.1.fabric=efa")
    back = loads_scenario(dump_toml(s))
    assert [d.fabric for d in back.topology.dims] == ["nvlink", "efa"]
    assert "fabric" not in dump_toml(_plain())


def test_a_network_kind_slows_mid_sizes_and_the_slower_transport_more() -> None:
    for nbytes in (1 << 20, 4 << 20, 16 << 20):
        plain = _plain_time("all_reduce", nbytes)
        ib = _time("all_reduce", nbytes, "topology.dims.1.fabric=infiniband")[1]
        efa = _time("all_reduce", nbytes, "topology.dims.1.fabric=efa")[1]
        assert plain < ib < efa


def test_nvlink_on_the_node_keeps_ncclsmodel() -> None:
    assert _time("all_gather", 1 << 22, "topology.dims.0.fabric=nvlink") == _time("all_gather", 1 << 22)


def test_the_fill_term_fades_against_streaming_at_large_sizes() -> None:
    small = _time("all_gather", 4 << 20, "topology.dims.1.fabric=infiniband")[1] / _plain_time("all_gather", 4 << 20)
    large = _time("all_gather", 4 << 30, "topology.dims.1.fabric=infiniband")[1] / _plain_time("all_gather", 4 << 30)
    assert small > large >= 1.0


def _plan(**kw: object):  # type: ignore[no-untyped-def]
    return nccl_plan("all_reduce", 32, 4, intra_bw_gbps=450.0, inter_bw_gbps=50.0, nvls=True, **kw)  # type: ignore[arg-type]


def test_each_term_moves_ncclsmodel_on_its_own() -> None:
    n = 8 << 20
    base = _plan().choose(n).time_us
    assert _plan(inter_latency_us=75.0).choose(n).time_us > base
    assert _plan(net_slice_bytes=(32768.0, 576000.0, 1048576.0)).choose(n).time_us > base
    simple_only = _plan(net_protocols=("Simple",)).choose(1 << 16)
    assert simple_only.protocol == "Simple" and _plan().choose(1 << 16).protocol != "Simple"
    assert simple_only.time_us > _plan().choose(1 << 16).time_us


def test_protocols_only_bind_across_nodes() -> None:
    one_node = nccl_plan("all_reduce", 8, 1, intra_bw_gbps=450.0, inter_bw_gbps=50.0, net_protocols=("Simple",))
    assert one_node.choose(1 << 12).protocol != "Simple"


@pytest.mark.parametrize("kw", [{"net_protocols": ()}, {"net_protocols": ("Fast",)},
                                {"net_slice_bytes": (1.0, 2.0)}, {"net_slice_bytes": (0.0, 1.0, 1.0)}])
def test_bad_tuner_arguments_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _plan(**kw)


def test_tcpx_runs_simple_across_nodes() -> None:
    name, _ = _time("all_reduce", 1 << 16, "topology.dims.1.fabric=tcpx")
    assert name.endswith("/Simple")
