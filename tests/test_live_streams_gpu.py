"""The CUDA live replay's stream walk on a real GPU (nbox_replay.live.cudalanes): skipped without CUDA (CI has
none; the GPU kit runs it with ``pytest -m gpu``). The ordering logic itself is tested on the fake device
(tests/test_live_streams.py); this checks that torch's CUDA streams play it: the walk returns while the device still
works, and a kernel on the main stream waits for the side stream's through an event, not through the host."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_side_streams_kernel_is_waited_for_by_an_event_and_the_host_does_not_block() -> None:
    from nbox_replay.live.cudalanes import CudaLanes
    from nbox_replay.live.streams import StreamWalk, plan_streams
    from tests.test_live_streams import _fsdp_like

    g = _fsdp_like()
    g.comm.clear()
    g.kind[2] = 0  # no collective here: a host operator on the thread instead
    g.resource[2] = g.resource[0]
    x = torch.zeros(1 << 20, device="cuda")
    y = torch.zeros_like(x)
    torch.cuda.synchronize()
    lanes = CudaLanes("cuda")

    class Runner:
        def at(self, i: int) -> None:
            pass

        def launch(self, i: int) -> int:
            if i == 0:  # on the side stream: a long sleep, then the value the main stream reads
                torch.cuda._sleep(200_000_000)
                x.fill_(1.0)
            elif i == 5:  # on the main stream, after the side stream's event
                y.copy_(x)
            return 1

        def issue(self, i: int) -> Any:
            return None

        def wait(self, work: Any, i: int) -> int:
            return 0

        def idle(self, ns: int) -> None:
            pass

    walk = StreamWalk(g, plan_streams(g), lanes)
    walk.repetition(Runner())
    side = walk.lanes.streams[0]
    assert not side.record_event().query()  # the host came back before the side stream's sleep ended
    lanes.synchronize()
    assert bool((y == 1.0).all())  # the copy waited for the fill: ordered by the event
