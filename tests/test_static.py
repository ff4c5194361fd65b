"""Project rules that a reviewer would otherwise have to remember: layering, no unpickling, lint, types."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["nbox", "emulator_core", "nbox_record", "nbox_replay"]


def _imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        if path.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_layering_rules_of_the_design() -> None:
    assert "nbox_replay" not in _imports("nbox_record")
    assert "nbox_record" not in _imports("nbox_replay")
    assert not {"nbox_record", "nbox_replay"} & _imports("emulator_core")


def test_trace_model_imports_neither_torch_nor_typer() -> None:
    used = _imports("nbox/chakra")
    assert not {"torch", "typer", "rich"} & used, used


def test_library_never_imports_typer_or_rich_outside_the_cli() -> None:
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("nbox/cli.py", "nbox/cli_bundle.py", "nbox/__main__.py") or rel.endswith("_pb2.py"):
                continue
            tree = ast.parse(path.read_text(), str(path))
            names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not {"typer", "rich"} & names, path


UNSAFE = re.compile(r"pickle\.loads?\(|torch\.load\(|extractall\(|(?<![\w.])eval\(|(?<![\w.])exec\(|yaml\.load\(|"
                    r"marshal\.loads?\(|shelve\.open\(")


def test_no_loader_in_the_library_can_unpickle_or_evaluate() -> None:
    offenders = []
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if UNSAFE.search(line) and "weights_only=True" not in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _tool(name: str) -> list[str]:
    if importlib.util.find_spec(name) is None and shutil.which(name) is None:
        pytest.skip(f"{name} is not installed (dev extra)")
    return [sys.executable, "-m", name]


def test_ruff_is_clean() -> None:
    proc = subprocess.run([*_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean_on_the_library() -> None:
    proc = subprocess.run([*_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
