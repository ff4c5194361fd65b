"""``nbox scenario show|validate|cost|import|export`` and ``nbox calibrate``: thin commands over
:mod:`emulator_core`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nbox.cli.app import ADVANCED, PanelCommand, app
from nbox.cli.options import LocalAddrOpt, NnodesOpt, NodeRankOpt, RdzvEndpointOpt, RdzvHostOpt

scenario_app = typer.Typer(help="What-if scenarios: list the shipped ones, show, validate, price a collective, "
                                "ASTRA-sim configs.",
                           no_args_is_help=True)
app.add_typer(scenario_app, name="scenario")
_SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a key: a.b=c (repeatable).")]  # noqa: UP045


#: Help of an argument or option that takes a scenario: a file, or a shipped one by name.
SCENARIO_HELP = "Scenario: a TOML file, or a shipped one by name (dgx-h100, ethernet-100g...; nbox scenario list)."


@scenario_app.command("list", cls=PanelCommand)
def scenario_list(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """List the shipped scenarios: the name to pass to --what-if, what cluster it is, its world size, its file.

    Example: nbox replay traces/ddp_mlp --what-if dgx-h100 --world-size 1024 --clock virtual
    """
    from emulator_core.scenario import shipped_catalog

    catalog = shipped_catalog()
    if json_out:
        sys.stdout.write(json.dumps({"scenarios": [e.to_dict() for e in catalog]}, indent=1) + "\n")
        return
    width = max(len(e.name) for e in catalog) + 2
    lines = [f"{'name':<{width}}{'world':>6}  description", *(
        f"{e.name:<{width}}{e.world_size:>6}  {e.description}\n{'':<{width + 8}}{e.path}" for e in catalog)]
    sys.stdout.write("\n".join(lines) + "\n")


@scenario_app.command("show", cls=PanelCommand)
def scenario_show(
    file: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        help="Scenario: a TOML file or a shipped name (default: loopback-cpu).")] = None,
    set_: _SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Print a scenario after overrides, as TOML (or --json) on stdout.

    Example: nbox scenario show dgx-h100 --set world_size=2048
    """
    from emulator_core.scenario import dump_toml, load_scenario

    scenario = load_scenario(file, tuple(set_ or ()))
    sys.stdout.write(json.dumps(scenario.to_dict(), indent=1) + "\n" if json_out else dump_toml(scenario))


@scenario_app.command("validate", cls=PanelCommand)
def scenario_validate(
    file: Annotated[Path, typer.Argument(help=SCENARIO_HELP)],
    set_: _SetOpt = None,
) -> None:
    """Check a scenario; exit 0 when valid, 3 with the bad key named when not."""
    from emulator_core.scenario import load_scenario

    scenario = load_scenario(file, tuple(set_ or ()))
    dims = " x ".join(f"{d.size} {d.name}" for d in scenario.topology.dims)
    sys.stdout.write(f"{file}: valid: world size {scenario.world_size} ({dims})\n")


@scenario_app.command("cost", cls=PanelCommand)
def scenario_cost(
    collective: Annotated[str, typer.Argument(help="all_reduce, all_gather, reduce_scatter, all_to_all, ...")],
    size: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--bytes", help="Per-rank input size: 4096, 1KiB, 64MiB, 1GiB (all-gather: the shard); not with --compare.")
    ] = None,
    compare: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="An nccl-tests output file: the scenario's time beside it, size by size (default scenario: dgx-h100).")
    ] = None,
    shape: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="With --compare: NODESxGPUS_PER_NODE when the file has no rank lines, e.g. 4x8.")] = None,
    world_size: Annotated[Optional[int], typer.Option(help="Price at this world size.", min=1)] = None,  # noqa: UP045
    algorithm: Annotated[str, typer.Option(help="An algorithm, 'auto', or 'all'.")] = "all",
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Scenario: a TOML file or a shipped name (default: loopback-cpu).")] = None,
    set_: _SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Modeled time and bus bandwidth (nccl-tests style) of one collective, per algorithm.

    Example: nbox scenario cost all_reduce --bytes 1GiB --what-if dgx-h100

    With --compare FILE (nccl-tests output): the scenario priced at every size of the file, on the file's shape,
    beside the measured time (size, real us, nbox us, error).
    """
    from emulator_core.calibration import parse_size
    from nbox_trace.errors import UsageError

    if compare is not None:
        if size is not None or world_size is not None or algorithm != "all":
            raise UsageError("--compare: the sizes and the shape come from the file; drop --bytes, --world-size "
                             "and --algorithm")
        _compare(collective, compare, shape, what_if, set_ or [], json_out)
        return
    if shape is not None:
        raise UsageError("--shape: only with --compare")
    if size is None:
        raise UsageError("--bytes: required (or --compare FILE)")
    from emulator_core.pricing import extrapolation_note, group_shape, price
    from emulator_core.scenario import load_scenario, resize

    nbytes = parse_size(size, "--bytes")  # the way nbox prints sizes, as calibrate --sizes takes them
    scenario = load_scenario(what_if, tuple(set_ or ()))
    if world_size is not None:
        scenario = resize(scenario, world_size)
    prices, chosen = price(scenario, collective, nbytes, algorithm)  # a bad name: UsageError naming the argument
    note = extrapolation_note(scenario, collective, group_shape(scenario))
    if json_out:
        doc = {"collective": collective, "bytes": nbytes, "world_size": scenario.world_size, "auto": chosen,
               "algorithms": [vars(p) for p in prices], "notes": [note] if note else []}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    from nbox_trace.units import fit_label, format_bytes, format_in, time_unit

    how = "auto picks" if scenario.algorithm(collective) == "auto" else "the scenario sets"
    unit = time_unit(p.time_us for p in prices)  # one unit for the whole column
    lines = [f"{collective} of {format_bytes(nbytes)} per rank over {scenario.world_size} ranks "
             f"({' x '.join(f'{d.size} {d.name}' for d in scenario.topology.dims)}); {how} {chosen}",
             f"  {'algorithm':<28}{'time ' + unit[0]:>12}{'algbw GB/s':>12}{'busbw GB/s':>12}"]
    for p in prices:
        mark = " *" if p.algorithm == chosen else ""
        lines.append(f"  {fit_label(p.algorithm, 28 - len(mark) - 1) + mark:<28}"
                     f"{format_in(p.time_us, unit, digits=None if unit[0] != 'us' else 1):>12}"
                     f"{p.algbw_gbps:>12.2f}{p.busbw_gbps:>12.2f}")
    sys.stdout.write("\n".join(lines) + "\n")
    if note:
        sys.stderr.write(f"nbox: note: {note}\n")


def _compare(collective: str, path: Path, shape: str | None, what_if: Path | None, overrides: list[str],
             json_out: bool) -> None:
    from emulator_core.calibration import base_scenario, compare, format_rows, row_dict, summary
    from emulator_core.network import parse_shape, read_curve

    scenario = base_scenario(what_if, overrides)
    curve = read_curve(path, collective=collective, shape=parse_shape(shape) if shape is not None else None)
    rows = compare(scenario, curve)
    if json_out:
        doc = {"summary": summary(rows, compared=True), "rows": [row_dict(r) for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    sys.stdout.write(format_rows(rows, compared=True) + "\n")


_BACKENDS = {"aware": "analytical_congestion_aware", "unaware": "analytical_congestion_unaware"}


def _notes(command: str, notes: list[str]) -> None:
    for note in notes:
        sys.stderr.write(f"nbox scenario {command}: note: {note}\n")


@scenario_app.command("import", cls=PanelCommand)
def scenario_import(
    network: Annotated[Path, typer.Argument(help="ASTRA-sim analytical network config (YAML).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Scenario TOML to write.")],
    system: Annotated[Optional[Path], typer.Argument(help="ASTRA-sim system config (JSON).")] = None,  # noqa: UP045
    backend: Annotated[str, typer.Option(help="The ASTRA-sim analytical backend: aware | unaware.")] = "aware",
) -> None:
    """Read ASTRA-sim's network (and system) config into a scenario TOML; what is not mapped goes to stderr.

    Example: nbox scenario import network.yml system.json -o astra.toml --backend aware
    """
    from emulator_core.astra import import_astra
    from emulator_core.scenario import dump_toml
    from nbox_trace.errors import UsageError
    from nbox_trace.files import Output, check_outputs, write_atomic

    if backend not in _BACKENDS:
        raise UsageError(f"--backend {backend!r}: must be aware or unaware")
    check_outputs([Output("-o/--out", out, "file")], inputs=[network, system])
    imported = import_astra(network, system, backend=_BACKENDS[backend])
    write_atomic(out, dump_toml(imported.scenario))
    _notes("import", imported.notes)
    dims = " x ".join(f"{d.size} {d.kind}" for d in imported.scenario.topology.dims)
    sys.stdout.write(f"wrote {out}: world size {imported.scenario.world_size} ({dims}), {backend} backend\n")


@scenario_app.command("export", cls=PanelCommand)
def scenario_export(
    file: Annotated[Path, typer.Argument(help=SCENARIO_HELP)],
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder for network.yml and system.json.")],
    set_: _SetOpt = None,
) -> None:
    """Write a scenario as ASTRA-sim's network.yml and system.json; what is left out goes to stderr.

    Refuses what ASTRA-sim cannot express (in-network reduction, calibration, a per-message overhead, an
    algorithm it does not implement). Example: nbox scenario export astra.toml -o astra_configs/
    """
    from emulator_core.astra import NETWORK_FILE, SYSTEM_FILE, export_astra
    from emulator_core.scenario import load_scenario
    from nbox_trace.files import Output, check_outputs

    scenario = load_scenario(file, tuple(set_ or ()))
    check_outputs([Output("-o/--out", out, "dir"), Output("-o/--out", out / NETWORK_FILE, "file"),
                   Output("-o/--out", out / SYSTEM_FILE, "file")], inputs=[file])
    exported = export_astra(scenario, out, source=str(file))
    _notes("export", exported.notes)
    sys.stdout.write("".join(f"wrote {p}\n" for p in exported.paths) + f"run with ASTRA-sim's {exported.backend} "
                     f"backend\n")


@app.command("calibrate", cls=PanelCommand)
def calibrate_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Scenario fragment (TOML) to write.")],
    nproc: Annotated[int, typer.Option("-n", "--nproc", help="Ranks to launch on this machine (node).")] = 2,
    backend: Annotated[str, typer.Option(
        help="auto | gloo | nccl (auto: nccl where the ranks see CUDA, else gloo; decided in the ranks).")]
    = "auto",
    sizes: Annotated[str, typer.Option(help="Bytes per rank: a comma list (1KiB,64MiB) or ranges A..B (x4 steps).")]
    = "1KiB..64MiB",
    sizes_from: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--sizes-from", help="Also measure the sizes this bundle's collectives move (at most 12): its calls are "
                             "then priced from their own points.", show_default=False, rich_help_panel=ADVANCED)]
    = None,
    collectives: Annotated[str, typer.Option(help="Comma list (default: every collective nbox measures).",
                                             show_default=False)]
    = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,barrier,send_recv",
    budget: Annotated[float, typer.Option(help="Timed seconds per (collective, size), about.")] = 0.3,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.",
                                           rich_help_panel=ADVANCED)] = 600.0,
    busy: Annotated[Optional[bool], typer.Option(  # noqa: UP045
        "--busy/--no-busy",
        help="Also time each collective beside a computing thread, for its busy_slowdown (CPU ranks; default: "
             "yes across nodes, no on one).", show_default=False, rich_help_panel=ADVANCED)] = None,
    dimension: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name of the topology dimension written (default: loopback on one node, network across nodes).",
        rich_help_panel=ADVANCED)] = None,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    nccl_tests: Annotated[bool, typer.Option(
        "--nccl-tests", help="Launch nothing: fit the fabric from the nccl-tests output FILES instead.")] = False,
    files: Annotated[Optional[list[Path]], typer.Argument(  # noqa: UP045
        help="nccl-tests output files (with --nccl-tests): one run each, any collectives and node counts of one "
             "cluster.", show_default=False)] = None,
    collective: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="With --nccl-tests: the collective of files that do not say it (all_reduce, all_gather, ...).")]
    = None,
    shape: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="With --nccl-tests: NODESxGPUS_PER_NODE of files without rank lines, e.g. 4x8.")] = None,
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="With --nccl-tests: the scenario whose datasheet figures the fit scales by (default: the shipped "
             "dgx_h100_400g).")] = None,
    set_: _SetOpt = None,
    model: Annotated[str, typer.Option(
        help="With --nccl-tests: curve (each curve a table) or physics (the datasheet model's bandwidths and "
             "network latency fitted).", rich_help_panel=ADVANCED)] = "curve",
) -> None:
    """Measure the real collectives on N local ranks, fit the cost models, write the fabric as a scenario.

    With --nccl-tests FILE...: no rank is launched; the fabric is fitted from nccl-tests output (docs/nccl-tests.md)
    and the fit error per collective and size is printed.

    Across nodes, run it on each node with the same --nnodes and --rdzv-endpoint (as `nbox record`): the
    collectives then cross the network between them, and every node writes the same scenario.

    Prints the fit error per size (stdout, or --json); the TOML holds one dimension with the all_reduce
    latency/bandwidth and a [[calibration]] entry per collective (factors and efficiency curve).

    Examples:

      nbox calibrate -n 2 -o loopback.toml

      nbox calibrate --sizes 1KiB,64KiB --collectives all_reduce,all_gather -o small.toml --json

      nbox calibrate --sizes-from job.bundle -o job_sizes.toml  (the grid and the job's own sizes)

      nbox calibrate -n 1 --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 -o net.toml  (and rank 1)

      nbox calibrate --nccl-tests all_reduce_4x8.txt all_gather_4x8.txt -o fabric.toml

      nbox calibrate --nccl-tests pasted_rows.txt --collective all_reduce --shape 2x8 -o fabric.toml

      nbox calibrate --nccl-tests all_reduce_4x8.txt --model physics --set topology.dims.1.fabric=efa -o fabric.toml
    """
    from nbox_trace.errors import UsageError

    nccl_only = {"FILES": files, "--collective": collective, "--shape": shape, "--what-if": what_if, "--set": set_,
                 "--model": model != "curve"}
    if nccl_tests:
        launch = {"-n/--nproc": nproc != 2, "--backend": backend != "auto", "--sizes": sizes != "1KiB..64MiB",
                  "--sizes-from": sizes_from is not None,
                  "--collectives": collectives != "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,"
                                                 "barrier,send_recv",
                  "--budget": budget != 0.3, "--timeout": timeout != 600.0, "--busy": busy is not None,
                  "--dimension": dimension is not None, "--nnodes": nnodes != "1", "--node-rank": node_rank != 0,
                  "--rdzv-endpoint": rdzv_endpoint is not None, "--local-addr": local_addr is not None,
                  "--rdzv-host": rdzv_host is not None}
        given = [k for k, v in launch.items() if v]
        if given:
            raise UsageError(f"{given[0]}: measures on launched ranks; --nccl-tests launches none")
        _calibrate_nccl_tests(files or [], collective, shape, what_if, set_ or [], out, json_out, model)
        return
    given = [k for k, v in nccl_only.items() if v]
    if given:
        raise UsageError(f"{given[0]}: only with --nccl-tests (fit from nccl-tests output files)")
    from emulator_core.calibration import CalibrateConfig, calibrate, parse_sizes
    from nbox_trace.files import Output, check_outputs

    cfg = CalibrateConfig(nproc=nproc, backend=backend, sizes=parse_sizes(sizes), budget_s=budget,
                          collectives=tuple(c.strip() for c in collectives.split(",") if c.strip()),
                          timeout_s=timeout, busy=busy,
                          dimension=dimension or ("loopback" if nnodes == "1" else "network"),
                          nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, local_addr=local_addr,
                          rdzv_host=rdzv_host)  # bad input is refused before torch loads
    if sizes_from is not None:
        import dataclasses

        from emulator_core.calibration import job_sizes

        found = job_sizes(sizes_from, cfg.collectives)
        cfg = dataclasses.replace(cfg, sizes=tuple(sorted(set(cfg.sizes) | set(found.sizes))))
        for note in found.notes:
            sys.stderr.write(f"nbox calibrate: --sizes-from {sizes_from}: {note}\n")
    check_outputs([Output("-o/--out", out, "file")])  # and a bad output before any rank starts
    if not json_out:
        sys.stderr.write(f"nbox calibrate: measuring {len(cfg.collectives)} collective(s) x {len(cfg.sizes)} "
                         f"size(s) on {cfg.nproc} rank(s), backend {cfg.backend}"
                         + (f" of this node (node rank {cfg.node_rank} of {cfg.nnodes})" if cfg.nnodes != "1" else "")
                         + "\n")
    cmd = "nbox calibrate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else None
    from nbox.cli.progress import ProgressLines

    with ProgressLines("calibrate") as say:
        result = calibrate(cfg, out, command=cmd, progress=None if json_out else say)
    if json_out:
        doc = {"profile": str(result.path), "backend": cfg.backend, "nproc": cfg.nproc, "nnodes": cfg.nnodes,
               "world_size": result.info.get("world_size"),
               "wall_s": round(result.wall_s, 3), "torch": result.info.get("torch"),
               "scenario": result.scenario.to_dict(),
               "fits": [{"collective": f.collective, "algorithm": f.algorithm, "ranks": f.ranks,
                         "latency_us": f.latency_us, "bandwidth_gbps": f.bandwidth_gbps,
                         "median_abs_error_pct": f.median_abs_error_pct(),
                         "points": [vars(p) for p in f.points]} for f in result.fits],
               "beside_compute": [vars(b) for b in result.busy]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    from emulator_core.calibration import format_fits

    sys.stdout.write(format_fits(result.fits) + "\n")
    sys.stdout.write("".join(b.describe() + "\n" for b in result.busy))
    sys.stderr.write(f"nbox calibrate: wrote {result.path} ({result.wall_s:.1f} s)\n")



def _calibrate_nccl_tests(files: list[Path], collective: str | None, shape: str | None, what_if: Path | None,
                          overrides: list[str], out: Path, json_out: bool, model: str = "curve") -> None:
    from emulator_core.calibration import (
        NcclTestsConfig,
        calibrate_nccl_tests,
        format_rows,
        row_dict,
        summary,
    )
    from emulator_core.network import parse_shape
    from nbox_trace.errors import UsageError
    from nbox_trace.files import Output, check_outputs

    if not files:
        raise UsageError("--nccl-tests: give the nccl-tests output FILES to fit")
    cfg = NcclTestsConfig(tuple(files), collective, parse_shape(shape) if shape is not None else None, what_if,
                          tuple(overrides), model)
    check_outputs([Output("-o/--out", out, "file")], inputs=[*files, what_if])
    scenario, rows, said = calibrate_nccl_tests(cfg, out)
    if json_out:
        doc = {"profile": str(out), "scenario": scenario.to_dict(), "summary": summary(rows), "notes": said,
               "rows": [row_dict(r) for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    sys.stdout.write(format_rows(rows) + "\n")
    for line in said:
        sys.stderr.write(f"nbox calibrate: note: {line}\n")
    dims = " x ".join(f"{d.size} {d.name}" for d in scenario.topology.dims)
    fitted = f"{len(scenario.nccl_fit)} curve(s)" if model == "curve" else "the physics fit's figures"
    sys.stderr.write(f"nbox calibrate: wrote {out}: world size {scenario.world_size} ({dims}), "
                     f"{fitted}; price another world size with `nbox scenario cost "
                     f"--world-size N` (or --set world_size=N --set topology.dims.1.size=0)\n")
