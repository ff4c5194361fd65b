"""The ``nbox`` backend's observer hook, and ``nbox emulate -o``'s collective log through it (in-process, one
real rank standing for a world of four: no real peer, no launch)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch

from emulator_core.backend import process_group as backend
from emulator_core.backend.process_group import EmulationConfig, NboxProcessGroup
from emulator_core.pricing.answer import Fabric
from nbox_record.capture import emulated_tap as emulatecapture
from nbox_record.capture.commlog import CollectiveLogger


@pytest.fixture
def pg() -> Iterator[NboxProcessGroup]:
    config = EmulationConfig.from_env(1, {"NBOX_WORLD_SIZE": "4"})
    group = NboxProcessGroup(config, Fabric(config.scenario), None, 0, None, timedelta(seconds=30))
    group.setGroupName("0")
    yield group
    group.shutdown()


def test_observers_see_each_call_by_its_canonical_name_until_removed(pg: NboxProcessGroup) -> None:
    seen: list[tuple[str, int]] = []

    def observer(group: NboxProcessGroup, method: str, args: tuple[Any, ...]) -> None:
        seen.append((method, len(args)))

    t = torch.ones(4)
    backend.add_observer(observer)
    backend.add_observer(observer)  # registered once
    try:
        pg.allreduce([t]).wait()
        pg._allgather_base(torch.empty(16), t).wait()  # an alias of all_gather_single
    finally:
        backend.remove_observer(observer)
    pg.allreduce([t]).wait()
    backend.remove_observer(observer)  # removing twice is harmless
    assert seen == [("allreduce", 1), ("all_gather_single", 2)]


def test_tap_logs_the_collectives_of_the_emulated_world_and_untap_stops(pg: NboxProcessGroup) -> None:
    logger = CollectiveLogger()
    observer = emulatecapture.tap(logger)
    try:
        pg.allreduce([torch.ones(8)]).wait()
        pg.alltoall_base(torch.empty(8), torch.ones(8), [], []).wait()  # the alias is logged too
    finally:
        emulatecapture.untap(observer)
    pg.allreduce([torch.ones(8)]).wait()
    assert logger.errors == []
    assert [(r["op"], r["pg_name"], r["comm_bytes"]) for r in logger.records] == [
        ("allreduce_", "0", 32), ("alltoall_base_", "0", 32)]


def test_a_call_with_keyword_arguments_reaches_the_method_and_observers_see_them_by_position(
        pg: NboxProcessGroup) -> None:
    """torch calls ``barrier(opts=...)`` by keyword: the observed wrapper once refused it (TypeError in every
    rank of the backend's integration tests)."""
    seen: list[tuple[str, tuple[Any, ...]]] = []

    def observer(group: NboxProcessGroup, method: str, args: tuple[Any, ...]) -> None:
        seen.append((method, args))

    import torch.distributed as dist

    opts = dist.BarrierOptions()
    backend.add_observer(observer)
    try:
        pg.barrier(opts=opts).wait()
        pg.allreduce([torch.ones(2)], opts=dist.AllreduceOptions()).wait()
        pg.barrier().wait()
    finally:
        backend.remove_observer(observer)
    assert [m for m, _ in seen] == ["barrier", "allreduce", "barrier"]
    assert seen[0][1] == (opts,) and len(seen[1][1]) == 2 and seen[2][1] == ()
