"""``nbox replay`` and ``nbox sweep``: thin commands over :mod:`nbox_replay`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nbox.cli.app import ADVANCED, PanelCommand, app
from nbox.cli.options import LocalAddrOpt, NnodesOpt, NodeRankOpt, RdzvEndpointOpt, RdzvHostOpt

_SCENARIO = "a TOML file or a shipped one by name (nbox scenario list)"


@app.command("replay", cls=PanelCommand)
def replay_cmd(
    bundle: Annotated[str, typer.Argument(help="A bundle directory or .nbox archive, or a bare Chakra ET (directory "
                                          "or <prefix>).")],
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--what-if", help=f"The cluster asked about: {_SCENARIO}.")] = None,
    world_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="Ranks in the what-if (default: --set world_size, else the --what-if's, else the recorded).")]
    = None,
    set_: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--set", metavar="KEY=VALUE",
        help="Change a what-if key, e.g. topology.dims.0.bandwidth_gbps=10; replay.* keys: docs/cli.md.")] = None,
    clock: Annotated[str, typer.Option(
        help="real: replay live on this machine; virtual: simulate (fast, any world size).")] = "real",
    compute: Annotated[str, typer.Option(
        help="auto | recorded | live (virtual clock: operators measured here, then simulated).")] = "auto",
    baseline: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help=f"The cluster recorded on: {_SCENARIO}; default: by the recorded device.")] = None,
    mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="What-if mesh, e.g. dp=512,tp=2: each collective scales by its dimension (virtual clock; default: "
             "the what-if's [mesh]).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write per-rank Perfetto timelines here.")] = None,  # noqa: UP045
    rank: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "--rank", help="The rank whose breakdown is shown (default: the one that ends the iteration last).")] = None,
    iterations: Annotated[int, typer.Option(
        help="Timed repetitions per run (real clock: interleaved baseline/what-if pairs).", min=1)] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    ranks: Annotated[str, typer.Option(help="Ranks to replay: all, or a comma list (0,1).",
                                       rich_help_panel=ADVANCED)] = "all",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (real clock).", rich_help_panel=ADVANCED)] = "auto",
    warmup: Annotated[int, typer.Option(
        help="Untimed repetitions first (real clock; the first is cold, the host-work pad plans from the others).",
        min=0, rich_help_panel=ADVANCED)] = 4,
    warmup_s: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Warm up for at least this long too (s), so GPU clocks and caches settle (default: 1 on cuda, 0 on "
             "cpu).", rich_help_panel=ADVANCED)] = None,
    timeout: Annotated[float, typer.Option(help="Deadline of a real-clock run (s).", rich_help_panel=ADVANCED)]
    = 600.0,
    placement: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Mesh dimensions outermost first as laid on ranks (default: pp,dp,fsdp,ep,cp,tp: TP innermost).",
        rich_help_panel=ADVANCED)] = None,
    recorded_mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name the recorded mesh's dimensions, outermost first (e.g. dp,tp), where inference guesses.",
        rich_help_panel=ADVANCED)] = None,
    global_batch: Annotated[str, typer.Option(
        help="weak: each rank keeps its batch; fixed: strong scaling at --mesh (needs --batch-size).",
        rich_help_panel=ADVANCED)] = "weak",
    batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="The recorded per-rank batch (samples), for --global-batch fixed.", rich_help_panel=ADVANCED)] = None,
    truth: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Check the prediction against a bundle recorded at the what-if's world size.",
        rich_help_panel=ADVANCED)] = None,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
) -> None:
    """Replay a bundle under the baseline and a what-if, and compare them with the recorded run.

    The report's first line answers the question; then a row per run: compute, exposed communication,
    waiting for a peer, idle (docs/cli.md).

    Examples:

      nbox replay traces/ddp_mlp --what-if dgx-h100 --world-size 1024 --clock virtual

      nbox replay traces/ddp_mlp --world-size 64 --set topology.dims.0.bandwidth_gbps=10

      nbox replay traces/fsdp2_transformer --clock virtual --mesh dp=512,tp=2 --what-if dgx-h100 --out tl/

      nbox replay small.bundle --world-size 8 --clock virtual --truth big.bundle
    """
    from nbox_replay.replay import ReplayConfig, run_replay
    from nbox_trace.errors import UsageError
    from nbox_trace.launch import Nodes

    try:
        chosen = None if ranks == "all" else tuple(int(r) for r in ranks.split(","))
    except ValueError:
        raise UsageError(f"--ranks {ranks!r}: 'all' or a comma list of ranks") from None
    cfg = ReplayConfig(bundle=bundle, what_if=what_if, overrides=tuple(set_ or ()), world_size=world_size,
                       baseline=baseline, compute=compute, clock=clock, ranks=chosen, iterations=iterations,
                       warmup=warmup, warmup_s=warmup_s, device=device, out=out, timeout_s=timeout, rank=rank,
                       mesh=mesh, placement=placement, recorded_mesh=recorded_mesh, global_batch=global_batch,
                       batch_size=batch_size, truth=truth,
                       nodes=Nodes(nnodes, node_rank, rdzv_endpoint, local_addr, rdzv_host))
    from nbox.cli.progress import ProgressLines

    with ProgressLines("replay") as say:
        report = run_replay(cfg, progress=None if json_out else say)
    # The report is the result: stdout (--json: one document); progress and notices went to stderr.
    sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n" if json_out else report.format_text() + "\n")


@app.command("sweep", cls=PanelCommand)
def sweep_cmd(
    ctx: typer.Context,
    bundle: Annotated[str, typer.Argument(help="A bundle directory or .nbox archive, or a bare Chakra ET.")],
    vary: Annotated[list[str], typer.Option(
        "--vary", metavar="KEY=V1,V2", help="An axis: world_size or any --set key, with its values (repeatable).")],
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--what-if", help=f"The cluster the points start from: {_SCENARIO}.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--set", metavar="KEY=VALUE", help="Change a key at every point (repeatable).")] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes.", min=1)] = 1,
    iterations: Annotated[int, typer.Option(help="Repetitions of the captured iteration per point.", min=1)] = 3,
    out: Annotated[Path, typer.Option(help="Directory for sweep.csv and sweep.png (the PNG needs matplotlib).")]
    = Path("sweep"),
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    placement: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="With mesh.<dim> axes: mesh dimensions outermost first as laid on ranks (default: TP innermost).",
        rich_help_panel=ADVANCED)] = None,
    recorded_mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name the recorded mesh's dimensions, outermost first (e.g. dp,tp), where inference guesses.",
        rich_help_panel=ADVANCED)] = None,
    global_batch: Annotated[str, typer.Option(
        help="weak: each rank keeps its batch; fixed: strong scaling at each point's mesh (needs --batch-size).",
        rich_help_panel=ADVANCED)] = "weak",
    batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="The recorded per-rank batch (samples), for --global-batch fixed.", rich_help_panel=ADVANCED)] = None,
) -> None:
    """Replay a bundle in virtual time over a grid of what-ifs; write a CSV (and a PNG plot when matplotlib is
    installed), print a table on stdout.

    Examples:

      nbox sweep traces/ddp_mlp --vary world_size=2,8,64,512 --vary topology.dims.0.bandwidth_gbps=10,100,400

      nbox sweep BUNDLE --vary mesh.dp=2,8,64,512 --what-if dgx-h100
    """
    from emulator_core.scenario import parse_placement
    from nbox_replay.inputs import open_source
    from nbox_replay.replay import baseline_path, global_batch_size
    from nbox_replay.replay import profiler_correction as correction_for
    from nbox_replay.settings import PROFILER_CORRECTION, split_settings
    from nbox_replay.sweep import SweepConfig, run_sweep
    from nbox_replay.sweep_outputs import format_table, write_outputs
    from nbox_trace.bundle import traces_directory
    from nbox_trace.files import Output, check_outputs
    from nbox_trace.mesh import parse_names

    check_outputs([Output("--out", out, "dir")], inputs=[Path(bundle)])  # before anything runs
    overrides, settings = split_settings(set_ or (), allowed=(PROFILER_CORRECTION,))
    root = ctx.with_resource(traces_directory(bundle))  # an archive stays unpacked until the command ends
    names = parse_names(recorded_mesh) if recorded_mesh is not None else None
    places = parse_placement(placement) if placement is not None else None
    source = open_source(root, name=bundle)
    cfg = SweepConfig.build(dict(source.trace_set.files), source.groups, source.recorded_world, list(vary),
                            scenario=what_if, baseline=baseline_path(source), overrides=overrides,
                            repetitions=iterations, jobs=jobs, mesh=source.mesh(names), placement=places,
                            batch_size=global_batch_size(global_batch, batch_size),
                            profiler=correction_for(settings.get(PROFILER_CORRECTION, "on"), source, "recorded"))

    from nbox.cli.progress import ProgressLines
    from nbox_trace.progress import Step

    def notice(message: str) -> None:
        sys.stderr.write(f"nbox sweep: {message}\n")

    with ProgressLines("sweep") as say:
        rows = run_sweep(cfg, progress=None if json_out else lambda done, total: say(
            Step("evaluating the grid", done, total, "points")))
    if cfg.profiler is not None and not json_out:
        notice(cfg.profiler.describe())
    written = write_outputs(rows, out, notice)
    if json_out:
        sys.stdout.write(json.dumps({"schema": "nbox.sweep/1", "bundle": bundle, "files": [str(w) for w in written],
                                     "rows": [r.to_dict() for r in rows],
                                     "profiler_correction": cfg.profiler.to_dict() if cfg.profiler else None},
                                    indent=1) + "\n")
        return
    sys.stdout.write(format_table(rows))
    sys.stderr.write("".join(f"nbox sweep: wrote {w}\n" for w in written))
