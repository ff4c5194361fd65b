"""The ``nbox`` command line: thin commands that parse arguments into one frozen config and call
the library. Engines are imported lazily inside each command, so ``nbox --help`` never loads torch.

Output conventions: human text on stderr (rich), ``--json`` prints exactly one JSON document on
stdout. Library errors (``NboxError``) become one or two lines on stderr and the exit code of their
class (see ``nbox/errors.py`` and the README).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nbox import __version__
from nbox.cli_bundle import bundle_app
from nbox.errors import NboxError

if TYPE_CHECKING:
    from nbox.chakra.validate import TraceReport

app = typer.Typer(
    name="nbox",
    help="Record-and-replay emulator for distributed deep-learning training (Chakra execution traces).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
trace_app = typer.Typer(help="Read any Chakra ET (nbox's, ASTRA-sim's, Chakra's converter's).", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
app.add_typer(bundle_app, name="bundle")

EXIT_PROBLEMS = 1


def _version(value: bool) -> None:
    if value:
        print(f"nbox {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")]
    = False,
) -> None:
    """Record-and-replay emulator for distributed deep-learning training.

    Exit codes: 0 success; 1 problems found (--strict) or a check failed; 2 usage error;
    3 invalid input (undecodable or over a limit); 4 input not found; 5 output not written.
    """


@dataclass(frozen=True)
class InspectConfig:
    """Arguments of ``nbox trace inspect``."""

    path: str
    json: bool
    strict: bool
    comm_group: Path | None
    max_message_mib: int
    max_problems: int


@trace_app.command("inspect")
def trace_inspect(
    path: Annotated[str, typer.Argument(help="One .et file, a directory of <prefix>.<rank>.et files, or <prefix>.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when any problem is found.")] = False,
    comm_group: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("--comm-group", help="ASTRA-sim comm_group.json with process-group membership "
                     "(default: one beside the traces or in ../inputs/)."),
    ] = None,
    max_message_mib: Annotated[int, typer.Option(help="Refuse a message larger than this (MiB).", min=1)] = 64,
    max_problems: Annotated[int, typer.Option(help="Problems listed in the human output.", min=0)] = 40,
) -> None:
    """Summarize a Chakra trace and list what is wrong with it.

    Per rank: metadata version and schema, node counts by type, collectives per process group
    (count and bytes), compute time, roots, dependency depth and critical path, and problems with
    their node ids. Across ranks: collective sequences per process group and p2p pairing.

    Examples:

      nbox trace inspect traces/example_ddp_mlp/trace

      nbox trace inspect ../shared/samples/chakra_et/multi_pg_T3D/trace --json

      nbox trace inspect run/trace.0.et --strict
    """
    cfg = InspectConfig(path, json_out, strict, comm_group, max_message_mib, max_problems)
    from nbox.chakra.validate import inspect_trace

    report = inspect_trace(cfg.path, comm_group=cfg.comm_group, max_message_bytes=cfg.max_message_mib << 20)
    if cfg.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        _print_inspect(report, cfg.max_problems)
    if cfg.strict and report.problem_count():
        raise typer.Exit(EXIT_PROBLEMS)


_RECORD_EPILOG = """Examples:

  nbox record  (the built-in DDP MLP on 2 gloo ranks)

  nbox record --example fsdp2_transformer -o fsdp.bundle

  nbox record -n 2 --iterations 20 -o run.bundle -- train.py --lr 0.1

  nbox record convert et_0.json.gz kineto_0.json.gz et_1.json.gz kineto_1.json.gz -o imported.bundle
"""


def _say_record(msg: str) -> None:
    sys.stderr.write(f"nbox record: {msg}\n")
    sys.stderr.flush()


@app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog=_RECORD_EPILOG)
def record_cmd(
    ctx: typer.Context,
    script: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Training script, launched like torchrun (put `--` before it); none: --example.")] = None,
    nproc_per_node: Annotated[int, typer.Option("-n", "--nproc-per-node", min=1, help="Ranks on this node.")] = 2,
    nnodes: Annotated[str, typer.Option(help="torchrun --nnodes (e.g. 2 or 1:4).")] = "1",
    node_rank: Annotated[int, typer.Option(help="torchrun --node-rank.", min=0)] = 0,
    rdzv_endpoint: Annotated[Optional[str], typer.Option(help="torchrun c10d rendezvous host:port.")] = None,  # noqa: UP045
    warmup: Annotated[int, typer.Option(help="Iterations skipped before timing.", min=0)] = 3,
    iterations: Annotated[int, typer.Option(help="Clean (un-instrumented) iterations timed.", min=1)] = 10,
    capture: Annotated[int, typer.Option(help="Iterations captured with the ET observer + Kineto.", min=1)] = 1,
    backend: Annotated[str, typer.Option(help="auto | gloo | nccl (auto: nccl with CUDA, else gloo).")] = "auto",
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Bundle directory to write.")] = None,  # noqa: UP045
    example: Annotated[str, typer.Option(help="Built-in workload: ddp_mlp, ddp_transformer, fsdp2_transformer.")]
    = "ddp_mlp",
    run_to_end: Annotated[bool, typer.Option("--run-to-end", help="Let the script finish after the capture.")] = False,
    keep_partial: Annotated[bool, typer.Option("--keep-partial", help="On failure, write a bundle marked incomplete.")]
    = False,
    keep_raw: Annotated[bool, typer.Option("--keep-raw", help="Keep the raw per-rank capture (debugging).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing bundle.")] = False,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.")]
    = 900.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Record a short real run of an unmodified training script into a Chakra trace bundle.

    Launches the script through torch.distributed.run with nbox's capture injected: W warm-up
    iterations, K clean timed iterations (the observed iteration time), then the captured
    iteration(s) with the execution-trace observer and Kineto; then the run stops (--run-to-end
    lets it finish). Iterations end at each optimizer step; a script without one can call
    `nbox_record.step()` once per iteration. `nbox record convert --help`: import existing traces.
    """
    from nbox_record.launcher import RecordConfig, record

    name = script.stem if script is not None else example
    try:
        cfg = RecordConfig(out=out or Path(f"nbox-{name}.bundle"), script=script, script_args=tuple(ctx.args),
                           example=example, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                           rdzv_endpoint=rdzv_endpoint, warmup=warmup, iterations=iterations, capture=capture,
                           backend=backend, run_to_end=run_to_end, keep_partial=keep_partial, keep_raw=keep_raw,
                           overwrite=overwrite, timeout_s=timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    result = record(cfg, progress=_say_record)
    doc = {"bundle": str(result.bundle), "ranks": result.ranks, "complete": result.complete,
           "observed_iteration_median_us": result.observed_median_us, "wall_s": round(result.wall_s, 3),
           "nodes_per_rank": {str(k): v for k, v in result.nodes_per_rank.items()}}
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        state = "" if result.complete else " (INCOMPLETE: --keep-partial)"
        sys.stderr.write(f"nbox record: wrote {result.bundle}{state}: ranks {result.ranks}, observed iteration "
                         f"median {result.observed_median_us / 1000:.2f} ms, {result.wall_s:.1f} s wall\n"
                         f"  inspect it: nbox trace inspect {result.bundle}/trace/trace\n")
    if not result.complete:
        raise typer.Exit(EXIT_PROBLEMS)


_EMULATE_EPILOG = """Examples:

  nbox emulate --world-size 8 -n 2  (the built-in DDP MLP: 2 real gloo ranks, 6 emulated)

  nbox emulate --world-size 64 --real-ranks 0,32 --example fsdp2_transformer --json

  nbox emulate --world-size 16 --set topology.dims.0.bandwidth_gbps=10 -- train.py --lr 0.1

  nbox emulate --world-size 64 -n 2 -o emulated.bundle && nbox replay emulated.bundle --world-size 1024
"""


@app.command("emulate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog=_EMULATE_EPILOG)
def emulate_cmd(
    ctx: typer.Context,
    world_size: Annotated[int, typer.Option(help="World size the script sees (W).", min=1)],
    script: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Training script, unmodified (put `--` before it); none: --example.")] = None,
    nproc: Annotated[Optional[int], typer.Option(  # noqa: UP045
        "-n", "--nproc-per-node", min=1, help="Real ranks (N <= W; default: 1, or as many as --real-ranks).")]
    = None,
    real_ranks: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Global ranks the real processes play, comma list (default 0..N-1).")] = None,
    what_if: Annotated[Optional[Path], typer.Option("--what-if", help="What-if scenario TOML.")] = None,  # noqa: UP045
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override key=value (repeatable).")]  # noqa: UP045
    = None,
    example: Annotated[str, typer.Option(help="Built-in workload: ddp_mlp, ddp_transformer, fsdp2_transformer.")]
    = "ddp_mlp",
    warmup: Annotated[int, typer.Option(help="Iterations skipped before timing.", min=0)] = 3,
    iterations: Annotated[int, typer.Option(help="Iterations timed (the run stops after them).", min=1)] = 10,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.")]
    = 300.0,
    call_timeout: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Longest wait for one collective (s), then the waiting rank fails naming it (default: --timeout/3).")]
    = None,
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "-o", "--out", help="Also capture one iteration and write a bundle of the emulated run here.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing -o bundle.")] = False,
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
    from nbox_record.emulate import EmulateConfig, emulate, format_text

    try:
        ranks = tuple(int(r) for r in real_ranks.split(",")) if real_ranks else ()
        cfg = EmulateConfig(world_size=world_size, nproc=nproc or len(ranks) or 1,
                            real_ranks=ranks, script=script, script_args=tuple(ctx.args), example=example,
                            scenario=what_if, overrides=tuple(set_ or ()), warmup=warmup, iterations=iterations,
                            timeout_s=timeout, out=out, overwrite=overwrite, call_timeout_s=call_timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    def say(message: str) -> None:
        sys.stderr.write(f"nbox emulate: {message}\n")
        sys.stderr.flush()

    result = emulate(cfg, progress=say)
    if json_out:
        sys.stdout.write(json.dumps(result.to_json(), indent=1) + "\n")
    sys.stderr.write(format_text(result) + "\n")


@app.command("record-convert", hidden=True)
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
    from nbox_record.importer import ConvertConfig, import_traces

    if not no_kineto and len(files) % 2:
        raise typer.BadParameter(f"expected HOST_ET KINETO pairs, got {len(files)} files (or pass --no-kineto)")
    pairs = tuple((f, None) for f in files) if no_kineto else tuple(zip(files[::2], files[1::2], strict=True))
    bundle, nodes = import_traces(ConvertConfig(pairs=pairs, out=out, overwrite=overwrite))
    if json_out:
        sys.stdout.write(json.dumps({"bundle": str(bundle), "nodes_per_rank": nodes}, indent=1) + "\n")
    else:
        sys.stderr.write(f"nbox record convert: wrote {bundle}: {len(nodes)} rank(s), nodes per rank {nodes}\n")


scenario_app = typer.Typer(help="What-if scenarios: show, validate, and price a collective.", no_args_is_help=True)
app.add_typer(scenario_app, name="scenario")
_SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a key: a.b=c (repeatable).")]  # noqa: UP045


@scenario_app.command("show")
def scenario_show(
    file: Annotated[Optional[Path], typer.Argument(help="Scenario TOML (default: the loopback one).")] = None,  # noqa: UP045
    set_: _SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Print a scenario after overrides, as TOML (or --json) on stdout.

    Example: nbox scenario show emulator_core/scenarios/dgx_h100_400g.toml --set world_size=2048
    """
    from emulator_core.scenario import dump_toml, load_scenario

    scenario = load_scenario(file, tuple(set_ or ()))
    sys.stdout.write(json.dumps(scenario.to_dict(), indent=1) + "\n" if json_out else dump_toml(scenario))


@scenario_app.command("validate")
def scenario_validate(
    file: Annotated[Path, typer.Argument(help="Scenario TOML.")],
    set_: _SetOpt = None,
) -> None:
    """Check a scenario; exit 0 when valid, 3 with the bad key named when not."""
    from emulator_core.scenario import load_scenario

    scenario = load_scenario(file, tuple(set_ or ()))
    dims = " x ".join(f"{d.size} {d.name}" for d in scenario.topology.dims)
    sys.stderr.write(f"{file}: valid: world size {scenario.world_size} ({dims})\n")


@scenario_app.command("cost")
def scenario_cost(
    collective: Annotated[str, typer.Argument(help="all_reduce, all_gather, reduce_scatter, all_to_all, ...")],
    nbytes: Annotated[int, typer.Option("--bytes", help="Per-rank input bytes (all-gather: the shard).", min=0)],
    world_size: Annotated[Optional[int], typer.Option(help="Price at this world size.", min=1)] = None,  # noqa: UP045
    algorithm: Annotated[str, typer.Option(help="An algorithm, 'auto', or 'all'.")] = "all",
    what_if: Annotated[Optional[Path], typer.Option(help="Scenario TOML (default: loopback).")] = None,  # noqa: UP045
    set_: _SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Modeled time and bus bandwidth (nccl-tests style) of one collective, per algorithm.

    Example: nbox scenario cost all_reduce --bytes 1073741824 --what-if emulator_core/scenarios/dgx_h100_400g.toml
    """
    from emulator_core.pricing import price, with_world_size
    from emulator_core.scenario import load_scenario

    scenario = load_scenario(what_if, tuple(set_ or ()))
    if world_size is not None:
        scenario = with_world_size(scenario, world_size)
    try:
        prices, chosen = price(scenario, collective, nbytes, algorithm)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if json_out:
        doc = {"collective": collective, "bytes": nbytes, "world_size": scenario.world_size, "auto": chosen,
               "algorithms": [vars(p) for p in prices]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    sys.stderr.write(f"{collective} of {_fmt_bytes(nbytes)} per rank over {scenario.world_size} ranks "
                     f"({' x '.join(f'{d.size} {d.name}' for d in scenario.topology.dims)}); auto picks {chosen}\n")
    sys.stderr.write(f"  {'algorithm':<28}{'time':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}\n")
    for p in prices:
        mark = " *" if p.algorithm == chosen else ""
        sys.stderr.write(f"  {p.algorithm + mark:<28}{_fmt_us(round(p.time_us)):>12}{p.algbw_gbps:>12.2f}"
                         f"{p.busbw_gbps:>12.2f}\n")


@app.command("calibrate")
def calibrate_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Scenario fragment (TOML) to write.")],
    nproc: Annotated[int, typer.Option("-n", "--nproc", help="Ranks to launch on this machine.", min=2)] = 2,
    backend: Annotated[Optional[str], typer.Option(help="gloo | nccl (default: nccl with CUDA, else gloo).")]  # noqa: UP045
    = None,
    sizes: Annotated[str, typer.Option(help="Bytes per rank: a comma list (1KiB,64MiB) or ranges A..B (x4 steps).")]
    = "1KiB..64MiB",
    collectives: Annotated[str, typer.Option(help="Comma list (default: all measurable).")]
    = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,barrier,send_recv",
    budget: Annotated[float, typer.Option(help="Timed seconds per (collective, size), about.")] = 0.3,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.")]
    = 600.0,
    dimension: Annotated[str, typer.Option(help="Name of the topology dimension written.")] = "loopback",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Measure the real collectives on N local ranks, fit the cost models, write the fabric as a scenario.

    Prints the fit error per size (stderr, or --json); the TOML holds one dimension with the all_reduce
    latency/bandwidth and a [[calibration]] entry per collective (factors and efficiency curve).

    Examples:

      nbox calibrate -n 2 -o loopback.toml

      nbox calibrate --sizes 1KiB,64KiB --collectives all_reduce,all_gather -o small.toml --json
    """
    from dataclasses import replace

    from emulator_core.calibrate import CalibrateConfig, calibrate, parse_sizes

    cfg = CalibrateConfig(nproc=nproc, backend=backend or "gloo", sizes=parse_sizes(sizes), budget_s=budget,
                          collectives=tuple(c.strip() for c in collectives.split(",") if c.strip()),
                          timeout_s=timeout, dimension=dimension)  # bad input is refused before torch loads
    if backend is None:
        import torch  # only here: --help must not load torch

        cfg = replace(cfg, backend="nccl" if torch.cuda.is_available() else "gloo")
    if not json_out:
        sys.stderr.write(f"nbox calibrate: measuring {len(cfg.collectives)} collective(s) x {len(cfg.sizes)} "
                         f"size(s) on {cfg.nproc} {cfg.backend} rank(s)\n")
    cmd = "nbox calibrate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else None
    result = calibrate(cfg, out, command=cmd)
    if json_out:
        doc = {"profile": str(result.path), "backend": cfg.backend, "nproc": cfg.nproc,
               "wall_s": round(result.wall_s, 3), "torch": result.info.get("torch"),
               "scenario": result.scenario.to_dict(),
               "fits": [{"collective": f.collective, "algorithm": f.algorithm, "ranks": f.ranks,
                         "latency_us": f.latency_us, "bandwidth_gbps": f.bandwidth_gbps,
                         "median_abs_error_pct": f.median_abs_error_pct(),
                         "points": [vars(p) for p in f.points]} for f in result.fits]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    from emulator_core.calibrate import format_fits

    sys.stderr.write(format_fits(result.fits) + f"\nnbox calibrate: wrote {result.path} ({result.wall_s:.1f} s)\n")


@app.command("replay")
def replay_cmd(
    bundle: Annotated[str, typer.Argument(help="A bundle directory, or a bare Chakra ET (directory or <prefix>).")],
    what_if: Annotated[Optional[Path], typer.Option("--what-if", help="What-if scenario TOML.")] = None,  # noqa: UP045
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override key=value (repeatable).")]  # noqa: UP045
    = None,
    world_size: Annotated[Optional[int], typer.Option(help="What-if world size (default: recorded).")]  # noqa: UP045
    = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Baseline scenario (default: from the device).")]  # noqa: UP045
    = None,
    compute: Annotated[str, typer.Option(help="live | recorded | auto.")] = "auto",
    clock: Annotated[str, typer.Option(help="real (live, on this machine) | virtual (simulated time).")] = "real",
    ranks: Annotated[str, typer.Option(help="Ranks to replay: all, or a comma list (0,1).")] = "all",
    iterations: Annotated[int, typer.Option(help="Timed repetitions per run.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed repetitions first (real clock).")] = 1,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (real clock).")] = "auto",
    out: Annotated[Optional[Path], typer.Option(help="Write per-rank Perfetto timelines here.")] = None,  # noqa: UP045
    timeout: Annotated[float, typer.Option(help="Deadline of a real-clock run (s).")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Replay a bundle under the baseline and a what-if, and compare them with the recorded run.

    Examples:

      nbox replay traces/ddp_mlp --world-size 64 --set topology.dims.0.bandwidth_gbps=10

      nbox replay traces/fsdp2_transformer --clock virtual --what-if emulator_core/scenarios/dgx_h100_400g.toml
      --world-size 1024 --out timelines/
    """
    from nbox_replay.replay import ReplayConfig, run_replay

    try:
        chosen = None if ranks == "all" else tuple(int(r) for r in ranks.split(","))
    except ValueError:
        raise typer.BadParameter(f"--ranks {ranks!r}: 'all' or a comma list of ranks") from None
    cfg = ReplayConfig(bundle=bundle, what_if=what_if, overrides=tuple(set_ or ()), world_size=world_size,
                       baseline=baseline, compute=compute, clock=clock, ranks=chosen, iterations=iterations,
                       warmup=warmup, device=device, out=out, timeout_s=timeout)
    def say(message: str) -> None:
        sys.stderr.write(f"nbox replay: {message}\n")

    report = run_replay(cfg, progress=None if json_out else say)
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        sys.stderr.write(report.format_text() + "\n")


@app.command("sweep")
def sweep_cmd(
    bundle: Annotated[str, typer.Argument(help="A bundle directory, or a bare Chakra ET.")],
    vary: Annotated[list[str], typer.Option("--vary", help="key=v1,v2,... (repeatable; world_size or any --set key).")],
    what_if: Annotated[Optional[Path], typer.Option("--what-if", help="Base scenario TOML.")] = None,  # noqa: UP045
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override key=value (repeatable).")]  # noqa: UP045
    = None,
    jobs: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    iterations: Annotated[int, typer.Option(help="Repetitions of the captured iteration per point.")] = 3,
    out: Annotated[Path, typer.Option(help="Directory for sweep.csv and sweep.png.")] = Path("sweep"),
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Replay a bundle in virtual time over a grid of what-ifs; write a CSV and a PNG plot, print a table.

    Examples:

      nbox sweep traces/ddp_mlp --vary world_size=2,8,64,512 --vary topology.dims.0.bandwidth_gbps=10,100,400
    """
    from nbox_replay.replay import baseline_scenario
    from nbox_replay.source import open_source
    from nbox_replay.sweep import SweepConfig, format_table, run_sweep, write_plot

    source = open_source(bundle)
    scenario = what_if if what_if is not None else baseline_scenario(source, None)[1]
    axes = list(vary)
    if not any(a.split("=", 1)[0].strip() == "world_size" for a in axes):
        axes.insert(0, f"world_size={source.recorded_world}")
    from emulator_core.scenario import SCENARIOS_DIR

    path = scenario if isinstance(scenario, Path) else SCENARIOS_DIR / f"{scenario}.toml"
    cfg = SweepConfig.build(dict(source.trace_set.files), source.groups, source.recorded_world, axes, scenario=path,
                            overrides=tuple(set_ or ()), repetitions=iterations, jobs=jobs)

    def progress(done: int, total: int) -> None:
        if not json_out:
            sys.stderr.write(f"\rnbox sweep: {done}/{total} points")
            sys.stderr.flush()

    rows = run_sweep(cfg, progress=progress)
    written = write_plot(rows, out / "sweep.png")
    if json_out:
        sys.stdout.write(json.dumps({"schema": "nbox.sweep/1", "bundle": bundle, "files": [str(w) for w in written],
                                     "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")
        return
    sys.stderr.write("\n" + format_table(rows) + "".join(f"wrote {w}\n" for w in written))


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _fmt_us(us: int) -> str:
    return f"{us} us" if us < 10_000 else f"{us / 1000:.1f} ms" if us < 10_000_000 else f"{us / 1e6:.2f} s"


def _print_inspect(report: TraceReport, max_problems: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from nbox.chakra.validate import iter_problem_lines

    # Not a terminal (a log, a pipe): wide enough that the tables do not wrap.
    # markup=False: paths, versions and group names come from users and files, never parsed as rich markup.
    con = Console(stderr=True, highlight=False, markup=False, width=None if sys.stderr.isatty() else 150)
    ranks = [r.rank for r in report.ranks]
    con.print(f"{Path(report.directory) / report.prefix}: {len(ranks)} rank(s) {_rank_span(ranks)}",
              soft_wrap=True, style="bold")
    con.print(f"process groups from {report.process_groups_source}", soft_wrap=True)
    first = report.ranks[0]
    con.print(f"metadata version {first.version!r}, schema {first.schema!r}")
    kinds = [("COMP_NODE", "comp"), ("COMM_COLL_NODE", "coll"), ("COMM_SEND_NODE", "send"),
             ("COMM_RECV_NODE", "recv"), ("METADATA_NODE", "meta")]
    table = Table(title="per rank", title_justify="left")
    for col in ("rank", "nodes", *(k for _, k in kinds), "other", "comp time", "roots", "depth", "crit. path",
                "problems"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in report.ranks:
        known = [r.nodes_by_type.get(t, 0) for t, _ in kinds]
        table.add_row(str(r.rank), str(r.node_count), *map(str, known), str(r.node_count - sum(known)),
                      _fmt_us(r.comp_duration_us), str(r.roots), str(r.depth), _fmt_us(r.critical_path_us),
                      str(sum(p.count for p in r.problems)))
    con.print(table)
    groups: dict[tuple[str, str, int, int], list[int]] = {}
    for r in report.ranks:
        for c in r.collectives:
            groups.setdefault((c.pg_name, c.comm_type, c.count, c.total_bytes), []).append(r.rank)
        if r.p2p_sends or r.p2p_recvs:
            groups.setdefault(("p2p", f"SEND {r.p2p_sends} / RECV {r.p2p_recvs}", r.p2p_sends + r.p2p_recvs,
                               r.p2p_bytes_sent), []).append(r.rank)
    if groups:
        coll = Table(title="collectives (count and bytes per rank)", title_justify="left")
        for col in ("process group", "type", "count", "bytes", "ranks"):
            coll.add_column(col, justify="right" if col in ("count", "bytes") else "left", no_wrap=col != "ranks")
        for (pg, ctype, count, nbytes), on in groups.items():
            coll.add_row(pg or "(world)", ctype, str(count), _fmt_bytes(nbytes),
                         "all" if len(on) == len(ranks) else _rank_span(on).strip("()"))
        con.print(coll)
    problems = list(iter_problem_lines(report))
    errors = sum(p.count for p in report.all_problems() if p.severity == "error")
    total = report.problem_count()
    if not problems:
        con.print("no problems found", style="green")
        return
    by_code: dict[str, int] = {}
    for p in report.all_problems():
        by_code[p.code] = by_code.get(p.code, 0) + p.count
    con.print(f"{total} problem(s) ({errors} error(s), {total - errors} warning(s)): "
              + ", ".join(f"{code} {n}" for code, n in sorted(by_code.items(), key=lambda kv: -kv[1])))
    for line in problems[:max_problems]:
        con.print("  " + line, soft_wrap=True)
    if len(problems) > max_problems:
        con.print(f"  ... {len(problems) - max_problems} more entries (use --json or --max-problems)")


def _rank_span(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"({ranks[0]}-{ranks[-1]})"
    return "(" + ",".join(map(str, ranks[:16])) + (",..." if len(ranks) > 16 else "") + ")"


def main() -> None:
    """Console-script entry point: run the app, turning NboxError into a short message + exit code."""
    # `nbox record convert ...` is the hidden command `record-convert`: `record` itself takes a script
    # and arbitrary script arguments, so it cannot also be a group of subcommands.
    if sys.argv[1:3] == ["record", "convert"]:
        sys.argv[1:3] = ["record-convert"]
    try:
        app()
    except NboxError as exc:
        sys.stderr.write(f"nbox: error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("nbox: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
