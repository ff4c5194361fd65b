"""``nbox replay`` and ``nbox sweep``: thin commands over :mod:`nbox_replay`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nbox.cli.app import app
from nbox.cli.options import LocalAddrOpt, NnodesOpt, NodeRankOpt, RdzvEndpointOpt, RdzvHostOpt


@app.command("replay")
def replay_cmd(
    bundle: Annotated[str, typer.Argument(help="A bundle directory or .nbox archive, or a bare Chakra ET (directory "
                                          "or <prefix>).")],
    what_if: Annotated[Optional[Path], typer.Option("--what-if", help="What-if scenario TOML.")] = None,  # noqa: UP045
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override key=value (repeatable).")]  # noqa: UP045
    = None,
    world_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="What-if world size (default: --set world_size, else the --what-if file's, else the recorded one).")]
    = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Baseline scenario (default: from the device).")]  # noqa: UP045
    = None,
    compute: Annotated[str, typer.Option(help="live | recorded | auto. live with --clock virtual: operators "
                                              "measured on this device, then simulated.")] = "auto",
    clock: Annotated[str, typer.Option(help="real (live, on this machine) | virtual (simulated time).")] = "real",
    ranks: Annotated[str, typer.Option(help="Ranks to replay: all, or a comma list (0,1).")] = "all",
    iterations: Annotated[int, typer.Option(help="Timed repetitions per run (--clock real: interleaved "
                                                 "baseline/what-if pairs).", min=1)] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed repetitions first (real clock; a worker's first is cold, "
                                             "and the --host-work pad plans from the median of the warm ones).",
                                        min=0)] = 4,
    warmup_s: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Warm up for at least this long too (s; repetitions at the recorded iteration time). Default: 1 on "
             "cuda (on an H100 a one-iteration replay took 4.8 ms after one warm-up repetition, 2.4 ms after 300, "
             "recorded 2.65), 0 on cpu.")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (real clock).")] = "auto",
    out: Annotated[Optional[Path], typer.Option(help="Write per-rank Perfetto timelines here.")] = None,  # noqa: UP045
    timeout: Annotated[float, typer.Option(help="Deadline of a real-clock run (s).")] = 600.0,
    rank: Annotated[Optional[int], typer.Option("--rank", help="The rank whose breakdown is shown "  # noqa: UP045
                                                "(default: the slowest).")] = None,
    mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="What-if mesh, e.g. dp=512,tp=2: groups along a scaled dimension grow, the others keep their size, "
             "each collective follows its dimension's rule (--clock virtual). Default: the what-if's [mesh] "
             "(--set mesh.dp=512).")] = None,
    placement: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Mesh dimensions outermost first as laid on ranks (default: pp,dp,fsdp,ep,cp,tp: TP innermost, "
             "on the innermost topology dimension).")] = None,
    recorded_mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name the recorded mesh's dimensions, outermost first (e.g. dp,tp), where inference guesses.")]
    = None,
    global_batch: Annotated[str, typer.Option(
        help="weak (each rank keeps its batch) | fixed (strong scaling at --mesh: recorded compute and activation "
             "collectives scaled by the per-rank batch's ratio; needs --batch-size).")] = "weak",
    batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="The recorded per-rank batch (samples), for --global-batch fixed.")] = None,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
    profiler_correction: Annotated[str, typer.Option(
        help="on | off | proportional | per_op | to_clean | to_wall: recorded compute without the profiler's "
             "overhead. on: the lean pass's times and gaps where the bundle has them, else the default rule from the "
             "bundle's clean vs captured CPU times (to_clean; proportional for a rank with lean-timed operators); a "
             "rank with GPU work: its host work per captured iteration scaled to its clean iterations' wall time "
             "(to_wall); "
             "a named rule: every rank's operators' profiled times under it (lean figures set aside); off: as the "
             "bundle carries them.")]
    = "on",
    host_work: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="pad | match | off (--clock real --compute live): pad the re-executed operators for the training "
             "thread's host work the replay does not re-run (framework hooks between operators), sized by the "
             "bundle's clean CPU time per iteration against the replay's own, measured in the warm-up; match also "
             "credits a rank whose replay is busier than the real thread (its own clock falls behind by the "
             "excess). Default: pad.")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Replay a bundle under the baseline and a what-if, and compare them with the recorded run.

    Each captured iteration the recorder marked is one replayed iteration (a trace without marks: one pass
    over the capture); the report shows the median iteration and one rank's breakdown of it (the rank that
    ended it last, or --rank). The four parts add up to the iteration time: compute (at least one compute
    operation of the rank runs; streams and threads at once count once), exposed (no compute, a
    communication of the rank is running), waiting (neither, and a collective the rank issued has not
    started because a peer or the group's previous collective is late), idle (the rest). Overlapped
    (communication hidden behind compute) is shown beside them, not in the sum.

    Examples:

      nbox replay traces/ddp_mlp --world-size 64 --set topology.dims.0.bandwidth_gbps=10

      nbox replay traces/fsdp2_transformer --clock virtual --what-if emulator_core/scenarios/dgx_h100_400g.toml
      --world-size 1024 --out timelines/

      nbox replay BUNDLE --clock virtual --mesh dp=512,tp=2 --what-if emulator_core/scenarios/dgx_h100_400g.toml

      nbox replay traces/tp_dp_mlp --clock virtual --mesh dp=8 --global-batch fixed --batch-size 32

      nbox replay run.bundle --nnodes 2 --node-rank K --rdzv-endpoint 10.0.0.1:29400  (on each node K; launch k
      of the interleaved pairs rendezvouses at port 29400 + k)
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
                       batch_size=batch_size, profiler_correction=profiler_correction, host_work=host_work,
                       nodes=Nodes(nnodes, node_rank, rdzv_endpoint, local_addr, rdzv_host))
    def say(message: str) -> None:
        sys.stderr.write(f"nbox replay: {message}\n")

    report = run_replay(cfg, progress=None if json_out else say)
    # The report is the result: stdout (--json: one document); progress and notices went to stderr.
    sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n" if json_out else report.format_text() + "\n")


@app.command("sweep")
def sweep_cmd(
    ctx: typer.Context,
    bundle: Annotated[str, typer.Argument(help="A bundle directory or .nbox archive, or a bare Chakra ET.")],
    vary: Annotated[list[str], typer.Option("--vary", help="key=v1,v2,... (repeatable; world_size or any --set key).")],
    what_if: Annotated[Optional[Path], typer.Option("--what-if", help="Base scenario TOML.")] = None,  # noqa: UP045
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override key=value (repeatable).")]  # noqa: UP045
    = None,
    jobs: Annotated[int, typer.Option(help="Worker processes.", min=1)] = 1,
    iterations: Annotated[int, typer.Option(help="Repetitions of the captured iteration per point.", min=1)] = 3,
    out: Annotated[Path, typer.Option(help="Directory for sweep.csv and sweep.png (the PNG needs matplotlib).")]
    = Path("sweep"),
    placement: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="With mesh.<dim> axes: mesh dimensions outermost first as laid on ranks (default: TP innermost).")]
    = None,
    recorded_mesh: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name the recorded mesh's dimensions, outermost first (e.g. dp,tp), where inference guesses.")]
    = None,
    global_batch: Annotated[str, typer.Option(
        help="weak (each rank keeps its batch) | fixed (strong scaling at each point's mesh; needs --batch-size).")]
    = "weak",
    batch_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        help="The recorded per-rank batch (samples), for --global-batch fixed.")] = None,
    profiler_correction: Annotated[str, typer.Option(
        help="on | off | proportional | per_op | to_clean: correct recorded compute for the profiler's overhead "
             "(as nbox replay does).")] = "on",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Replay a bundle in virtual time over a grid of what-ifs; write a CSV (and a PNG plot when matplotlib is
    installed), print a table on stdout.

    Examples:

      nbox sweep traces/ddp_mlp --vary world_size=2,8,64,512 --vary topology.dims.0.bandwidth_gbps=10,100,400

      nbox sweep BUNDLE --vary mesh.dp=2,8,64,512 --what-if emulator_core/scenarios/dgx_h100_400g.toml
    """
    from emulator_core.mesh import parse_placement
    from nbox_replay.replay import baseline_path, global_batch_size
    from nbox_replay.replay import profiler_correction as correction_for
    from nbox_replay.source import open_source
    from nbox_replay.sweep import SweepConfig, format_table, run_sweep, write_outputs
    from nbox_trace.archive import traces_directory
    from nbox_trace.files import Output, check_outputs
    from nbox_trace.mesh import parse_names

    check_outputs([Output("--out", out, "dir")], inputs=[Path(bundle)])  # before anything runs
    root = ctx.with_resource(traces_directory(bundle))  # an archive stays unpacked until the command ends
    names = parse_names(recorded_mesh) if recorded_mesh is not None else None
    places = parse_placement(placement) if placement is not None else None
    source = open_source(root, name=bundle)
    cfg = SweepConfig.build(dict(source.trace_set.files), source.groups, source.recorded_world, list(vary),
                            scenario=what_if, baseline=baseline_path(source), overrides=tuple(set_ or ()),
                            repetitions=iterations, jobs=jobs, mesh=source.mesh(names), placement=places,
                            batch_size=global_batch_size(global_batch, batch_size),
                            profiler=correction_for(profiler_correction, source, "recorded"))

    def progress(done: int, total: int) -> None:
        if json_out:
            return
        if sys.stderr.isatty():  # one line that counts up
            sys.stderr.write(f"\rnbox sweep: {done}/{total} points" + ("\n" if done == total else ""))
        elif done == total:  # a log: one line, not a run of carriage returns
            sys.stderr.write(f"nbox sweep: {total} points evaluated\n")
        sys.stderr.flush()

    def notice(message: str) -> None:
        sys.stderr.write(f"nbox sweep: {message}\n")

    rows = run_sweep(cfg, progress=progress)
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
