"""Help a person can read: every command's ``--help`` lists its everyday options first and the rest under
"Advanced options", each option's help fits in two lines at 120 columns, and no help text carries a date or a
measured figure (those belong in docs/results.md, not in what a command says it does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import typer

from nbox.cli import app

#: A date, a percentage, "took/ran N", a figure in milliseconds or microseconds, a run name (P17, E22, W9).
FIGURES = (r"20\d\d-\d\d-\d\d", r"\d+(\.\d+)?\s?%", r"\b(took|ran|measured)\s+\d", r"\b\d+(\.\d+)?\s?(ms|us)\b",
           r"\b[PEW]\d{1,3}\b")


def _commands() -> Iterator[tuple[list[str], typer.core.TyperCommand]]:
    root = typer.main.get_command(app)

    def walk(cmd: object, path: list[str]) -> Iterator[tuple[list[str], typer.core.TyperCommand]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield path, cmd  # type: ignore[misc]
            return
        for name, sub in subs.items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, [*path, name])

    yield from walk(root, [])


COMMANDS = [path for path, _ in _commands()]


def _help(path: list[str], columns: int = 120) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    proc = subprocess.run([sys.executable, "-m", "nbox", *path, "--help"], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    return proc.stdout


def _option_entries(text: str) -> dict[str, int]:
    """Each option's entry in a help text -> the lines it takes (its name line and the help's continuations)."""
    entries: dict[str, int] = {}
    section = ""
    current = ""
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section, current = line, ""
            continue
        if "ptions" not in section or not line.strip():
            current = ""
            continue
        if re.match(r"^  -", line):
            current = line.split()[0]
            entries[current] = 1
        elif current:
            entries[current] += 1
    return entries


def test_the_walk_finds_every_command() -> None:
    assert {"replay", "record", "emulate", "sweep", "calibrate"} <= {p[0] for p in COMMANDS}
    assert ["scenario", "list"] in COMMANDS and len(COMMANDS) > 15


def test_replay_help_fits_a_screen_with_the_everyday_options_first() -> None:
    text = _help(["replay"])
    assert len(text.splitlines()) <= 60, len(text.splitlines())
    everyday, advanced = text.split("Advanced options:")
    for flag in ("--what-if", "--world-size", "--set", "--clock", "--json"):
        assert flag in everyday
    for flag in ("--nnodes", "--warmup-s", "--placement"):
        assert flag in advanced and flag not in everyday
    assert "--profiler-correction" not in text and "--host-work" not in text  # --set replay.* (docs/cli.md)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_no_option_help_over_two_lines(path: list[str]) -> None:
    entries = _option_entries(_help(path))
    assert entries, "no option found: the check would pass on anything"
    long = {name: n for name, n in entries.items() if n > 2}
    assert not long, long


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_everyday_options_are_at_most_twelve(path: list[str]) -> None:
    everyday = _help(path).split("Advanced options:")[0]
    assert len(_option_entries(everyday)) <= 13  # twelve, and --help


def test_no_date_or_measured_figure_in_any_help_text() -> None:
    texts = [typer.main.get_command(app).help or ""]
    for path, cmd in _commands():
        texts += [cmd.help or "", cmd.epilog or ""]
        texts += [getattr(p, "help", None) or "" for p in cmd.params]
        assert cmd.help, path
    found = [(pattern, m.group(0), text[:60]) for text in texts for pattern in FIGURES
             for m in [re.search(pattern, text)] if m]
    assert not found, found


def test_the_figure_check_catches_what_it_should() -> None:
    bad = ["run P17 gave 3.2%", "on 2026-11-27", "a replay took 4.8 ms", "the E22 bench"]
    assert all(any(re.search(p, t) for p in FIGURES) for t in bad)
