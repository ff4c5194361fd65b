"""Options more than one command takes, defined once: the multi-node flags of ``nbox record``, ``nbox calibrate``,
``nbox emulate`` and ``nbox replay --clock real`` (all launch through ``nbox_trace.launch``, so they must read the same
flags the same way)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from nbox.cli.app import ADVANCED

__all__ = ["LocalAddrOpt", "NnodesOpt", "NodeRankOpt", "RdzvEndpointOpt", "RdzvHostOpt"]

NnodesOpt = Annotated[str, typer.Option(help="torchrun --nnodes (e.g. 2 or 1:4); across nodes, run on each.",
                                         rich_help_panel=ADVANCED)]
NodeRankOpt = Annotated[int, typer.Option(help="torchrun --node-rank.", min=0, rich_help_panel=ADVANCED)]
RdzvEndpointOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    help="torchrun c10d rendezvous host:port.", rich_help_panel=ADVANCED)]
LocalAddrOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    help="This node's address as the others reach it (default: its address toward the rendezvous endpoint).",
    rich_help_panel=ADVANCED)]
RdzvHostOpt = Annotated[Optional[bool], typer.Option(  # noqa: UP045
    "--rdzv-host/--no-rdzv-host",
    help="Host the rendezvous store here (default: when the endpoint is this node and --node-rank is 0).",
    rich_help_panel=ADVANCED)]
