"""``nbox record``, ``nbox record convert`` and ``nbox emulate``: thin commands over :mod:`nbox_record`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nbox.cli.app import ADVANCED, EXIT_PROBLEMS, PanelCommand, app
from nbox.cli.options import LocalAddrOpt, NnodesOpt, NodeRankOpt, RdzvEndpointOpt, RdzvHostOpt

_RECORD_EPILOG = """Examples:

  nbox record  (the built-in DDP MLP on 2 gloo ranks)

  nbox record --example fsdp2_transformer -o fsdp.bundle

  nbox record -n 2 --iterations 20 -o run.bundle -- train.py --lr 0.1

  nbox record -n 1 --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 -o node0.bundle  (on each node; then
  nbox bundle merge node0.bundle node1.bundle -o run.bundle)

  nbox record convert et_0.json.gz kineto_0.json.gz et_1.json.gz kineto_1.json.gz -o imported.bundle
"""


def _script_and_args(script: Path | None, extra: list[str]) -> tuple[Path | None, tuple[str, ...]]:
    """The script and its arguments; a first word after ``--`` that is an option (``nbox record --example bert --
    --layers 2``) starts the built-in example's arguments, not a script path."""
    if script is not None and str(script).startswith("-"):
        return None, (str(script), *extra)
    return script, tuple(extra)


@app.command("record", cls=PanelCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog=_RECORD_EPILOG)
def record_cmd(
    ctx: typer.Context,
    script: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Training script, launched like torchrun (put `--` before it); none: --example (its own "
             "arguments after `--`, e.g. `--example bert -- --layers 2`).")] = None,
    nproc_per_node: Annotated[int, typer.Option("-n", "--nproc-per-node", min=1, help="Ranks on this node.")] = 2,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
    warmup: Annotated[int, typer.Option(help="Iterations skipped before timing.", min=0)] = 3,
    iterations: Annotated[int, typer.Option(help="Clean (un-instrumented) iterations timed.", min=1)] = 10,
    capture: Annotated[int, typer.Option(help="Iterations captured with the ET observer + Kineto.", min=1,
                                         rich_help_panel=ADVANCED)] = 1,
    lean_iterations: Annotated[int, typer.Option(
        help="Iterations profiled by Kineto alone first; captured operators take their wall times (default 0: "
             "those include waits for communication).", min=0, rich_help_panel=ADVANCED)] = 0,
    backend: Annotated[str, typer.Option(
        help="auto | gloo | nccl: the built-in examples' backend (auto: nccl with CUDA, else gloo).")] = "auto",
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Bundle directory to write.")] = None,  # noqa: UP045
    example: Annotated[str, typer.Option(
        help="Built-in workload (all in docs/models.md), e.g. ddp_convnet, fsdp2_transformer, bert, "
             "resnet152.")] = "ddp_convnet",
    run_to_end: Annotated[bool, typer.Option("--run-to-end", help="Let the script finish after the capture.",
                                             rich_help_panel=ADVANCED)] = False,
    keep_partial: Annotated[bool, typer.Option("--keep-partial", help="On failure, write a bundle marked incomplete.",
                                               rich_help_panel=ADVANCED)] = False,
    keep_raw: Annotated[bool, typer.Option("--keep-raw", help="Keep the raw per-rank capture (debugging).",
                                           rich_help_panel=ADVANCED)] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing bundle.")] = False,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.",
                                           rich_help_panel=ADVANCED)] = 900.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Record a short real run of an unmodified training script into a Chakra trace bundle.

    Launches the script's ranks (as torchrun would; across nodes, through torchrun) with nbox's capture
    injected: W warm-up iterations, K clean timed iterations (the observed iteration time), L lean iterations (Kineto
    alone, --lean-iterations, default none), then the captured iteration(s) with the execution-trace observer
    and Kineto (the graph); then the run stops (--run-to-end
    lets it finish). Iterations end at each optimizer step; a script without one can call
    `nbox_record.step()` once per iteration. `nbox record convert --help`: import existing traces.
    """
    from nbox_record.launch import RecordConfig, record

    script, script_args = _script_and_args(script, ctx.args)
    name = script.stem if script is not None else example
    cfg = RecordConfig(out=out or Path(f"nbox-{name}.bundle"), script=script, script_args=script_args,
                       example=example, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                       rdzv_endpoint=rdzv_endpoint, local_addr=local_addr, rdzv_host=rdzv_host, warmup=warmup,
                       iterations=iterations, capture=capture, lean=lean_iterations,
                       backend=backend, run_to_end=run_to_end, keep_partial=keep_partial, keep_raw=keep_raw,
                       overwrite=overwrite, timeout_s=timeout)  # a bad option: UsageError naming the flag (exit 2)
    from nbox.cli.progress import ProgressLines

    with ProgressLines("record") as say:
        result = record(cfg, progress=say)
    doc = {"bundle": str(result.bundle), "ranks": result.ranks, "complete": result.complete,
           "observed_iteration_median_us": result.observed_median_us, "wall_s": round(result.wall_s, 3),
           "nodes_per_rank": {str(k): v for k, v in result.nodes_per_rank.items()}}
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        from nbox_trace.units import format_us

        state = "" if result.complete else " (INCOMPLETE: --keep-partial)"
        sys.stdout.write(f"nbox record: wrote {result.bundle}{state}: ranks {result.ranks}, observed iteration "
                         f"median {format_us(result.observed_median_us)}, {result.wall_s:.1f} s wall\n"
                         f"  inspect it: nbox trace inspect {result.bundle}\n")
    if not result.complete:
        raise typer.Exit(EXIT_PROBLEMS)


_EMULATE_EPILOG = """Examples:

  nbox emulate --world-size 8 -n 2  (the built-in DDP MLP: 2 real gloo ranks, 6 emulated)

  nbox emulate --world-size 64 --real-ranks 0,32 --example fsdp2_transformer --json

  nbox emulate --world-size 1024 --what-if dgx-h100 -n 2

  nbox emulate --world-size 16 --set topology.dims.0.bandwidth_gbps=10 -- train.py --lr 0.1

  nbox emulate --world-size 64 -n 2 -o emulated.bundle && nbox replay emulated.bundle --world-size 1024
"""


@app.command("emulate", cls=PanelCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog=_EMULATE_EPILOG)
def emulate_cmd(
    ctx: typer.Context,
    world_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="World size the script sees (W; default: --set world_size, else the scenario file's).", min=1)] = None,
    script: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Training script, unmodified (put `--` before it); none: --example (its own arguments "
             "after `--`, e.g. `--example bert -- --layers 2`).")] = None,
    nproc: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "-n", "--nproc-per-node", min=1, help="Real ranks (N <= W; default: 1, or as many as --real-ranks).")]
    = None,
    real_ranks: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Global ranks the real processes play, comma list (default 0..N-1).", rich_help_panel=ADVANCED)] = None,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--what-if", help="The cluster emulated: a TOML file or a shipped one by name (dgx-h100...; nbox scenario "
                          "list).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--set", metavar="KEY=VALUE", help="Change a scenario key, e.g. topology.dims.0.bandwidth_gbps=10 "
                                           "(repeatable).")] = None,
    example: Annotated[str, typer.Option(
        help="Built-in workload (all in docs/models.md), e.g. ddp_convnet, fsdp2_transformer, bert, "
             "resnet152.")] = "ddp_convnet",
    warmup: Annotated[int, typer.Option(help="Iterations skipped before timing.", min=0)] = 3,
    iterations: Annotated[int, typer.Option(help="Iterations timed (the run stops after them).", min=1)] = 10,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.",
                                           rich_help_panel=ADVANCED)] = 300.0,
    call_timeout: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Longest wait for one collective (s), then the waiting rank fails naming it (default: --timeout/3).",
        rich_help_panel=ADVANCED)] = None,
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "-o", "--out", help="Also capture one iteration and write a bundle of the emulated run here.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing -o bundle.",
                                            rich_help_panel=ADVANCED)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Run an unmodified training script on N real ranks as if the world were W (the rest emulated).

    Whatever backend the script passes to init_process_group becomes nbox's emulated backend: the
    script sees get_world_size() = W, its collectives complete at the time the scenario models.
    Prints the iteration time (optimizer step to optimizer step, slowest real rank), its breakdown into
    compute, exposed communication and CPU contention, and the modeled collectives. With -o, one more
    iteration is captured after the timed ones and written as a bundle (kind "emulated": the traces of
    the real ranks, named by the global ranks they played, in a world of W) that replays like a recorded one.
    """
    from nbox_record.launch import EmulateConfig, emulate, format_text
    from nbox_trace.errors import UsageError

    try:
        ranks = tuple(int(r) for r in real_ranks.split(",")) if real_ranks else ()
    except ValueError:
        raise UsageError(f"--real-ranks {real_ranks!r}: expected a comma list of global ranks, e.g. 0,32") from None
    nodes = int(nnodes) if nnodes.isdigit() and int(nnodes) > 0 else 1
    script, script_args = _script_and_args(script, ctx.args)
    cfg = EmulateConfig(world_size=world_size, nproc=nproc or len(ranks) // nodes or 1,
                        real_ranks=ranks, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                        local_addr=local_addr, rdzv_host=rdzv_host, script=script, script_args=script_args,
                        example=example,
                        scenario=what_if, overrides=tuple(set_ or ()), warmup=warmup, iterations=iterations,
                        timeout_s=timeout, out=out, overwrite=overwrite, call_timeout_s=call_timeout)

    from nbox.cli.progress import ProgressLines

    with ProgressLines("emulate") as say:
        result = emulate(cfg, progress=say)
    sys.stdout.write(json.dumps(result.to_json(), indent=1) + "\n" if json_out else format_text(result) + "\n")


@app.command("record-convert", cls=PanelCommand, hidden=True)
def record_convert_cmd(
    files: Annotated[list[Path], typer.Argument(help="HOST_ET.json[.gz] KINETO.json[.gz], one pair per rank.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Bundle directory to write.")],
    no_kineto: Annotated[bool, typer.Option("--no-kineto", help="Only host ETs are given (durations stay 0).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing bundle.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """nbox record convert: import host-ET + Kineto pairs (Chakra's recipe) into a bundle.

    Example: nbox record convert et_0.json.gz kineto_0.json.gz et_1.json.gz kineto_1.json.gz -o run.bundle
    """
    from nbox_record.convert import ConvertConfig, import_traces
    from nbox_trace.errors import UsageError
    from nbox_trace.files import Output, check_outputs

    if not no_kineto and len(files) % 2:
        raise UsageError(f"FILES: expected HOST_ET KINETO pairs, got {len(files)} file(s) (or add --no-kineto)")
    check_outputs([Output("-o/--out", out, "dir", overwrite)], inputs=list(files))
    pairs = tuple((f, None) for f in files) if no_kineto else tuple(zip(files[::2], files[1::2], strict=True))
    bundle, nodes = import_traces(ConvertConfig(pairs=pairs, out=out, overwrite=overwrite))
    if json_out:
        sys.stdout.write(json.dumps({"bundle": str(bundle), "nodes_per_rank": nodes}, indent=1) + "\n")
    else:
        sys.stdout.write(f"nbox record convert: wrote {bundle}: {len(nodes)} rank(s), nodes per rank {nodes}\n")

