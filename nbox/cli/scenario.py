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
    from emulator_core.scenario_files import shipped_catalog

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
    from emulator_core.scenario_files import load_scenario
    from emulator_core.scenario_toml import dump_toml

    scenario = load_scenario(file, tuple(set_ or ()))
    sys.stdout.write(json.dumps(scenario.to_dict(), indent=1) + "\n" if json_out else dump_toml(scenario))


@scenario_app.command("validate", cls=PanelCommand)
def scenario_validate(
    file: Annotated[Path, typer.Argument(help=SCENARIO_HELP)],
    set_: _SetOpt = None,
) -> None:
    """Check a scenario; exit 0 when valid, 3 with the bad key named when not."""
    from emulator_core.scenario_files import load_scenario

    scenario = load_scenario(file, tuple(set_ or ()))
    dims = " x ".join(f"{d.size} {d.name}" for d in scenario.topology.dims)
    sys.stdout.write(f"{file}: valid: world size {scenario.world_size} ({dims})\n")


@scenario_app.command("cost", cls=PanelCommand)
def scenario_cost(
    collective: Annotated[str, typer.Argument(help="all_reduce, all_gather, reduce_scatter, all_to_all, ...")],
    size: Annotated[str, typer.Option("--bytes", help="Per-rank input size: 4096, 1KiB, 64MiB, 1GiB (all-gather: "
                                                      "the shard).")],
    world_size: Annotated[Optional[int], typer.Option(help="Price at this world size.", min=1)] = None,  # noqa: UP045
    algorithm: Annotated[str, typer.Option(help="An algorithm, 'auto', or 'all'.")] = "all",
    what_if: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Scenario: a TOML file or a shipped name (default: loopback-cpu).")] = None,
    set_: _SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Modeled time and bus bandwidth (nccl-tests style) of one collective, per algorithm.

    Example: nbox scenario cost all_reduce --bytes 1GiB --what-if dgx-h100
    """
    from emulator_core.calibration import parse_size
    from emulator_core.pricing import extrapolation_note, group_shape, price
    from emulator_core.scenario_files import load_scenario
    from emulator_core.world import resize

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
    from emulator_core.astra_config import import_astra
    from emulator_core.scenario_toml import dump_toml
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
    from emulator_core.astra_config import NETWORK_FILE, SYSTEM_FILE, export_astra
    from emulator_core.scenario_files import load_scenario
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
    collectives: Annotated[str, typer.Option(help="Comma list (default: every collective nbox measures).",
                                             show_default=False)]
    = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,barrier,send_recv",
    budget: Annotated[float, typer.Option(help="Timed seconds per (collective, size), about.")] = 0.3,
    timeout: Annotated[float, typer.Option(help="Deadline for the whole run (s); then every rank is stopped.",
                                           rich_help_panel=ADVANCED)] = 600.0,
    rest: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Rest the link this long (ms) before the calls that measure a traffic shaper's burst; 0: skip "
             "(default: 10 across nodes, 0 on one).", rich_help_panel=ADVANCED)] = None,
    dimension: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Name of the topology dimension written (default: loopback on one node, network across nodes).",
        rich_help_panel=ADVANCED)] = None,
    nnodes: NnodesOpt = "1",
    node_rank: NodeRankOpt = 0,
    rdzv_endpoint: RdzvEndpointOpt = None,
    local_addr: LocalAddrOpt = None,
    rdzv_host: RdzvHostOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Measure the real collectives on N local ranks, fit the cost models, write the fabric as a scenario.

    Across nodes, run it on each node with the same --nnodes and --rdzv-endpoint (as `nbox record`): the
    collectives then cross the network between them, and every node writes the same scenario.

    Prints the fit error per size (stdout, or --json); the TOML holds one dimension with the all_reduce
    latency/bandwidth and a [[calibration]] entry per collective (factors and efficiency curve).

    Examples:

      nbox calibrate -n 2 -o loopback.toml

      nbox calibrate --sizes 1KiB,64KiB --collectives all_reduce,all_gather -o small.toml --json

      nbox calibrate -n 1 --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 -o net.toml  (and rank 1)
    """
    from emulator_core.calibrate import calibrate
    from emulator_core.calibration import CalibrateConfig, parse_sizes
    from nbox_trace.files import Output, check_outputs

    cfg = CalibrateConfig(nproc=nproc, backend=backend, sizes=parse_sizes(sizes), budget_s=budget,
                          collectives=tuple(c.strip() for c in collectives.split(",") if c.strip()),
                          timeout_s=timeout, rest_ms=rest,
                          dimension=dimension or ("loopback" if nnodes == "1" else "network"),
                          nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, local_addr=local_addr,
                          rdzv_host=rdzv_host)  # bad input is refused before torch loads
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
               "link_rest": None if result.burst is None else {
                   **vars(result.burst), "burst_bytes": result.scenario.topology.dims[0].burst_bytes,
                   "collectives": [{**vars(b), **next(
                       ({"rest_factor": c.rest_factor, "apart_rest_factor": c.apart_rest_factor}
                        for c in result.scenario.calibration if c.collective == b.collective),
                       {"rest_factor": 1.0, "apart_rest_factor": None})}
                       for b in result.rests]}}  # each BurstFit carries its busy_slowdown and apart figures
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    from emulator_core.calibrate import format_fits

    sys.stdout.write(format_fits(result.fits) + "\n")
    if result.rests:
        from emulator_core.calibrate import describe_rests

        sys.stdout.write("".join(line + "\n" for line in describe_rests(
            result.rests, result.scenario.topology.dims[0].burst_bytes)))
    sys.stderr.write(f"nbox calibrate: wrote {result.path} ({result.wall_s:.1f} s)\n")

