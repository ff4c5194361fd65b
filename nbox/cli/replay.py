"""``nbox replay`` and ``nbox sweep``: thin commands over :mod:`nbox_replay`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nbox.cli.app import app


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
    compute: Annotated[str, typer.Option(help="live | recorded | auto. live with --clock virtual: operators "
                                              "measured on this device, then simulated.")] = "auto",
    clock: Annotated[str, typer.Option(help="real (live, on this machine) | virtual (simulated time).")] = "real",
    ranks: Annotated[str, typer.Option(help="Ranks to replay: all, or a comma list (0,1).")] = "all",
    iterations: Annotated[int, typer.Option(help="Timed repetitions per run (--clock real: interleaved "
                                                 "baseline/what-if pairs).")] = 3,
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
    from emulator_core.scenario_files import SCENARIOS_DIR
    from emulator_core.world import sets_world_size

    if not any(a.split("=", 1)[0].strip() == "world_size" for a in axes) and not sets_world_size(set_ or ()):
        axes.insert(0, f"world_size={source.recorded_world}")

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

