"""emulator_core.pricing.nccl_p2p: NCCL's all-to-all as its point-to-point group, and the scenario keys it reads.

The hand-computed value redoes the module's arithmetic from NCCL's constants (data/nccl_tuning.toml) for an H100
system: NVLink 450 GB/s line rate (370.8 GB/s as NCCL counts it), a 50 GB/s NIC per GPU behind PCIe Gen5 x16
(48 GB/s in NCCL's units).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from emulator_core.pricing import make_pricer
from emulator_core.pricing.nccl_p2p import DEFAULT_P2P_CHUNK_BYTES, nccl_all_to_all_us
from emulator_core.pricing.nccl_tuner import nccl_constants
from emulator_core.pricing.pricer import group_shape
from emulator_core.scenario import Scenario, ScenarioError, load_scenario

H100: dict[str, Any] = {"intra_bw_gbps": 450.0, "inter_bw_gbps": 50.0}
MIB = 1 << 20


def test_the_arithmetic_by_hand_on_two_nodes_of_eight() -> None:
    k = nccl_constants()
    nic = min(50.0, float(k["assumed"]["gpu_nic_pcie_gbps"]["hopper"]))
    s, p, g, chunk, lat = 64 * MIB, 16, 8, 512 * 1024, 75.0
    m = s / p
    messages = (p - g) * (math.ceil(m / chunk) + 1)
    want = (float(k["hw_latency_us"]["net"]["ring"][2]) + 2 * lat + min(chunk, m) / (1000 * nic)
            + (p - g) * m / (1000 * nic) + messages * 2.0)
    got = nccl_all_to_all_us(s, p, 2, inter_latency_us=lat, cpu="amd", chunk_bytes=chunk, **H100)
    assert got == pytest.approx(want, rel=1e-12)


def test_one_node_is_nvlink_only_and_one_rank_is_free() -> None:
    one = nccl_all_to_all_us(64 * MIB, 8, 1, **H100)
    k = nccl_constants()
    nvlink = 450.0 * float(k["nvlink_link_gbps"]["hopper"]) / float(k["assumed"]["nvlink_nominal_link_gbps"]["hopper"])
    assert one == pytest.approx(float(k["hw_latency_us"]["nvlink"]["ring"][2]) + 7 * 8 * MIB / (1000 * nvlink))
    assert nccl_all_to_all_us(64 * MIB, 1, 1, **H100) == 0.0
    assert nccl_all_to_all_us(64 * MIB, 16, 2, **H100) > 2 * one  # the NIC is the narrow part


@pytest.mark.parametrize("nodes", [2, 4, 32, 128])
def test_non_decreasing_in_size_from_1kib_to_8gib(nodes: int) -> None:
    sizes = [1 << e for e in range(10, 34)]
    times = [nccl_all_to_all_us(s, 8 * nodes, nodes, inter_latency_us=75.0, cpu="amd", **H100) for s in sizes]
    assert all(b >= a for a, b in itertools.pairwise(times)), times


def test_each_setting_moves_the_answer_the_way_it_should() -> None:
    base = nccl_all_to_all_us(32 * MIB, 256, 32, **H100)
    assert nccl_all_to_all_us(32 * MIB, 256, 32, cpu="amd", **H100) > base  # 2 us a message, not 1
    assert nccl_all_to_all_us(32 * MIB, 256, 32, inter_latency_us=75.0, **H100) > base
    assert nccl_all_to_all_us(2048 * MIB, 16, 2, chunk_bytes=512 * 1024, **H100) \
        < nccl_all_to_all_us(2048 * MIB, 16, 2, **H100)  # fewer messages for the same bytes
    # more peers cost more for the same bytes through the NIC: 256 ranks on 32 nodes against 16 on 2
    many = nccl_all_to_all_us(8 * MIB, 256, 32, **H100)
    few = nccl_all_to_all_us(8 * MIB * (248 / 256) / (8 / 16), 16, 2, **H100)
    assert many > few


def test_all_to_all_v_is_priced_at_the_larger_side() -> None:
    even = nccl_all_to_all_us(16 * MIB, 16, 2, **H100)
    peers = 15
    send = [16 * MIB / 16] * peers
    same = nccl_all_to_all_us(0, 16, 2, send_bytes=send, recv_bytes=send, **H100)
    heavier = nccl_all_to_all_us(0, 16, 2, send_bytes=send, recv_bytes=[2 * x for x in send], **H100)
    assert same == pytest.approx(even, rel=0.1)
    assert heavier > same


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"nbytes": -1.0}, "nbytes"), ({"chunk_bytes": 0}, "chunk_bytes"), ({"cpu": "sparc"}, "cpu"),
    ({"nranks": 15, "nnodes": 2}, "nranks"), ({"inter_bw_gbps": 0.0}, "inter_bw_gbps"),
    ({"send_bytes": [-1.0] * 15, "recv_bytes": [0.0] * 15}, "send_bytes"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], word: str) -> None:
    args = {"nbytes": MIB, "nranks": 16, "nnodes": 2, **H100, **kwargs}
    with pytest.raises(ValueError, match=word):
        nccl_all_to_all_us(**args)


def _dgx(*sets: str) -> Scenario:
    return load_scenario("dgx-h100", sets)


def _price(collective: str, nbytes: float, *sets: str) -> tuple[str, float]:
    s = _dgx(*sets)
    return make_pricer(s, collective, group_shape(s))(nbytes)


def test_the_nccl_scenario_prices_all_to_all_as_p2p_and_reads_its_keys() -> None:
    two = ("world_size=16", "topology.dims.1.size=2")
    name, base = _price("all_to_all", 64 * MIB, *two)
    assert name == "p2p/Simple"
    assert _price("all_to_all", 64 * MIB, *two, "network.host_cpu=amd")[1] > base
    assert _price("all_to_all", 64 * MIB, *two, "network.p2p_chunk_bytes=512KiB")[1] < base
    assert _price("all_to_all", 64 * MIB, *two, "topology.dims.1.fabric=efa")[1] > base
    assert _price("all_to_all_v", 64 * MIB, *two)[0] == "p2p/Simple"
    # host_cpu reaches NCCL's tuner too: a ring's network steps pay its per-message overhead
    eight = ("world_size=64", "topology.dims.1.size=8")
    assert _price("all_reduce", 1024, *eight, "network.host_cpu=amd")[1] > _price("all_reduce", 1024, *eight)[1]


def test_nccl_keys_are_refused_where_nccl_s_model_is_not_used() -> None:
    for key, value in (("network.host_cpu", "amd"), ("network.p2p_chunk_bytes", "512KiB")):
        with pytest.raises(ScenarioError, match=f"{key.split('.')[1]}.*network.library"):
            load_scenario("ethernet-100g", [f"{key}={value}"])
    with pytest.raises(ScenarioError, match="host_cpu"):
        _dgx("network.host_cpu=sparc")
    assert _dgx("network.p2p_chunk_bytes=512KiB").network.p2p_chunk_bytes == 512 * 1024
    assert DEFAULT_P2P_CHUNK_BYTES == 1 << 17
    back = _dgx("network.host_cpu=amd").network.to_dict()
    assert back["host_cpu"] == "amd" and "p2p_chunk_bytes" not in back
