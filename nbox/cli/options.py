"""Options more than one command takes, defined once: the multi-node flags of ``nbox record``, ``nbox calibrate``,
``nbox emulate`` and ``nbox replay --clock real`` (all launch through ``nbox_trace.launch``, so they must read the same
flags the same way)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

__all__ = ["LocalAddrOpt", "NnodesOpt", "NodeRankOpt", "RdzvEndpointOpt", "RdzvHostOpt"]

NnodesOpt = Annotated[str, typer.Option(help="torchrun --nnodes (e.g. 2 or 1:4); across nodes, run on each.")]
NodeRankOpt = Annotated[int, typer.Option(help="torchrun --node-rank.", min=0)]
RdzvEndpointOpt = Annotated[Optional[str], typer.Option(help="torchrun c10d rendezvous host:port.")]  # noqa: UP045
LocalAddrOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    help="This node's address, as the other nodes reach it (default: its address on the route to the "
         "rendezvous endpoint).")]
RdzvHostOpt = Annotated[Optional[bool], typer.Option(  # noqa: UP045
    "--rdzv-host/--no-rdzv-host",
    help="Whether this node hosts the rendezvous store (default: yes when the endpoint's address is this "
         "node's own and --node-rank is 0).")]
