"""The ``nbox`` command line's root: the typer app, its global options, and the entry point that turns a library
error into a one- or two-line message and the exit code of its class (see ``nbox_trace/errors.py`` and the README).

Each command group lives in its own module (``trace``, ``record``, ``scenario``, ``replay``, ``bundle``): thin
commands that parse arguments into one frozen config and call one library function. Engines are imported lazily
inside each command, so ``nbox --help`` never loads torch.

Output conventions: results (reports, tables, summaries) on stdout, progress and notices on stderr, ``--json``
prints exactly one JSON document on stdout instead of the human text. Usage errors (a parser error or a
:class:`~nbox_trace.errors.UsageError`) exit 2.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from nbox_trace import __version__
from nbox_trace.errors import NboxError

#: The panel of the options a person rarely needs (``rich_help_panel=ADVANCED``): listed after the everyday ones.
ADVANCED = "Advanced options"


class PanelCommand(TyperCommand):
    """A command whose ``--help`` lists its options by panel: the everyday ones first (``Options``), then each
    ``rich_help_panel`` in the order its first option was declared (``Advanced options``). Plain text, as click
    writes it (no rich markup: help texts name TOML tables like ``[mesh]`` that markup would eat)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            record = (record[0].replace(" <int range>", " <int>").replace(" <float range>", " <float>"), record[1])
            if param.param_type_name == "argument":
                args.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for title, rows in (("Arguments", args), *panels.items()):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


app = typer.Typer(
    name="nbox",
    help="Record-and-replay emulator for distributed deep-learning training (Chakra execution traces).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Help as wide as the terminal, up to 120 columns (click's own cap is 80).
    context_settings={"max_content_width": 120},
)

#: Exit code of a command that ran and found problems (``--strict``), or whose check failed.
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
