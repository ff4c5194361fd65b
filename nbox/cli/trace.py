"""``nbox trace inspect``: summarize any Chakra ET and list what is wrong with it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nbox.cli.app import EXIT_PROBLEMS, PanelCommand, app

if TYPE_CHECKING:
    from nbox_trace.check import TraceReport

trace_app = typer.Typer(help="Read any Chakra ET (nbox's, ASTRA-sim's, Chakra's converter's).", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@dataclass(frozen=True)
class InspectConfig:
    """Arguments of ``nbox trace inspect``."""

    path: str
    json: bool
    strict: bool
    comm_group: Path | None
    max_message_mib: int
    max_problems: int


@trace_app.command("inspect", cls=PanelCommand)
def trace_inspect(
    path: Annotated[str, typer.Argument(help="One .et file, a directory of <prefix>.<rank>.et files, <prefix>, or a "
                                        "bundle (directory or .nbox archive).")],
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

      nbox trace inspect traces/ddp_mlp/trace

      nbox trace inspect traces/ddp_mlp  (a bundle: its traces, every recorded rank present)

      nbox trace inspect tests/data/samples/chakra_et/multi_pg_T3D/trace --json

      nbox trace inspect run/trace.0.et --strict
    """
    cfg = InspectConfig(path, json_out, strict, comm_group, max_message_mib, max_problems)
    from nbox_trace.bundle import locate_traces, traces_directory
    from nbox_trace.check import inspect_trace

    with traces_directory(cfg.path) as root:
        trace_set, _ = locate_traces(root)
        report = inspect_trace(trace_set, comm_group=cfg.comm_group, max_message_bytes=cfg.max_message_mib << 20)
    if root != Path(cfg.path):  # the unpacked copy is gone: name the traces by the archive they came from
        report.directory = str(Path(cfg.path) / trace_set.directory.name)
    if cfg.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        _print_inspect(report, cfg.max_problems)
    if cfg.strict and report.problem_count():
        raise typer.Exit(EXIT_PROBLEMS)


def _print_inspect(report: TraceReport, max_problems: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from nbox_trace.check import iter_problem_lines
    from nbox_trace.units import format_bytes, format_in, time_unit

    # The report is the command's result: stdout. Not a terminal (a log, a pipe): wide enough that the tables
    # do not wrap. markup=False: paths, versions and group names come from users and files, never rich markup.
    con = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 150)
    ranks = [r.rank for r in report.ranks]
    con.print(f"{Path(report.directory) / report.prefix}: {len(ranks)} rank(s) {_rank_span(ranks)}",
              soft_wrap=True, style="bold")
    con.print(f"process groups from {report.process_groups_source}", soft_wrap=True)
    first = report.ranks[0]
    con.print(f"metadata version {first.version!r}, schema {first.schema!r}")
    kinds = [("COMP_NODE", "comp"), ("COMM_COLL_NODE", "coll"), ("COMM_SEND_NODE", "send"),
             ("COMM_RECV_NODE", "recv"), ("METADATA_NODE", "meta")]
    table = Table(title="per rank", title_justify="left")
    comp_unit = time_unit(r.comp_duration_us for r in report.ranks)  # one unit per column
    path_unit = time_unit(r.critical_path_us for r in report.ranks)
    for col in ("rank", "nodes", *(k for _, k in kinds), "other", f"comp time {comp_unit[0]}", "roots", "depth",
                f"crit. path {path_unit[0]}", "problems"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in report.ranks:
        known = [r.nodes_by_type.get(t, 0) for t, _ in kinds]
        table.add_row(str(r.rank), str(r.node_count), *map(str, known), str(r.node_count - sum(known)),
                      format_in(r.comp_duration_us, comp_unit), str(r.roots), str(r.depth),
                      format_in(r.critical_path_us, path_unit), str(sum(p.count for p in r.problems)))
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
            coll.add_row(pg or "(world)", ctype, str(count), format_bytes(nbytes),
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

