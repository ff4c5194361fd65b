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
LIBRARY = ["nbox", "nbox_record", "nbox_replay", "emulator_core", "nbox_trace"]
#: The layers of ../shared/design.md, top to bottom: a package may import only its own modules and the layers
#: below it; record and replay share a layer and never import each other.
LAYER = {"nbox": 3, "nbox_record": 2, "nbox_replay": 2, "emulator_core": 1, "nbox_trace": 0}
#: The CLI face: the only modules that may import typer or rich.
FACE_ONLY = ("nbox/cli/", "nbox/__main__.py")


def _modules() -> dict[str, Path]:
    """Every library module by dotted name (packages by their own name)."""
    out: dict[str, Path] = {}
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(path: Path, module: str, is_package: bool, known: frozenset[str] = frozenset()) -> set[str]:
    """Every name an import statement in ``path`` reaches, anywhere in the file: top level, inside functions
    (lazy) and under ``if TYPE_CHECKING`` alike. ``from a.b import c`` reaches ``a.b.c`` when that is one of the
    ``known`` modules, else ``a.b``."""
    found: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                target = node.module or ""
            for alias in node.names:  # a submodule named in the list is the dependency, else the module itself
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (edges to names that are not modules are dropped)."""
    mods = _modules()
    known = frozenset(mods)
    return {name: {m for m in _imported(path, name, path.name == "__init__.py", known) if m in mods and m != name}
            for name, path in mods.items()}


def _third_party(package: str) -> set[str]:
    found: set[str] = set()
    for name, path in _modules().items():
        if name.split(".")[0] == package:
            found.update(m.split(".")[0] for m in _imported(path, name, path.name == "__init__.py"))
    return found


def test_imports_run_one_way_face_engines_core_base() -> None:
    """nbox (face) -> nbox_record / nbox_replay -> emulator_core -> nbox_trace (base), lazy imports included."""
    wrong = []
    for module, targets in _graph().items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and LAYER[other] >= LAYER[top]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_there_is_no_import_cycle_lazy_or_not() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []
    for root in sorted(graph):
        if root in state:
            continue
        stack: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        path = [root]
        state[root] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph[nxt])))
    assert not cycles, "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The two tests above must be able to fail: a planted lazy cycle and a planted upward import are seen."""
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n")
    (tmp_path / "b.py").write_text("from a import f\n")
    assert "b" in _imported(tmp_path / "a.py", "a", False) and "a" in _imported(tmp_path / "b.py", "b", False)
    rel = tmp_path / "pkg"
    rel.mkdir()
    (rel / "__init__.py").write_text("from .mod import x\nfrom . import sub\n")
    found = _imported(rel / "__init__.py", "pkg", True, frozenset({"pkg", "pkg.mod", "pkg.sub"}))
    assert found == {"pkg.mod", "pkg.sub"}


def test_the_base_imports_neither_torch_nor_typer_nor_rich() -> None:
    used = _third_party("nbox_trace")
    assert not {"torch", "typer", "rich", "numpy"} & used, used


def test_the_emulator_core_imports_torch_only_in_the_backend() -> None:
    """design.md: the backend (and the modules it alone uses) is the only part of emulator_core that needs torch."""
    allowed = {"emulator_core.backend.process_group", "emulator_core.backend.mirror", "emulator_core.backend.delay",
               "emulator_core._autoload", "emulator_core.calibration._worker",
               "emulator_core.backend.eager", "emulator_core.backend.objectp2p",  # used by the backend alone (issue 16)
               "emulator_core.backend.calls",  # the backend's calls in flight, split from it (issue 15)
               "emulator_core.backend.devicecall", "emulator_core.device._cuda"}  # held on the device (issue 49)
    offenders = sorted(name for name, path in _modules().items()
                       if name.startswith("emulator_core") and name not in allowed
                       and "torch" in {m.split(".")[0] for m in _imported(path, name, path.name == "__init__.py")})
    assert not offenders, offenders


def test_library_never_imports_typer_or_rich_outside_the_cli() -> None:
    for name, path in _modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(FACE_ONLY):
            continue
        used = {m.split(".")[0] for m in _imported(path, name, path.name == "__init__.py")}
        assert not {"typer", "rich"} & used, path


def test_no_library_module_is_over_600_lines() -> None:
    """Issue 12: one concern per room. A module over ~600 lines must say why here, or be split."""
    allowed: dict[str, str] = {}
    long = {path.relative_to(ROOT).as_posix(): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > 600}
    assert set(long) <= set(allowed), long


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


# ------------------------------------------------------------------------- tests and benches stay inside the repo

#: What reaching outside the repository looks like in a test or bench: the repo root's parent (``ROOT.parent``,
#: ``parents[1].parent``, ``Path("..")``), a ``../shared`` path, or the project's shared reference folder by name.
#: A user's clone has none of these; what a test needs is copied into tests/data/.
_OUTSIDE = re.compile(r"""(?:ROOT\.parent\b|parents\[1\]\.parent|["']\.\./shared|Path\(["']\.\.["']\)"""
                      r"""|["']shared["']\s*[/,)]|/ ["']shared["'])""")


def _reaches_outside(source: str) -> list[str]:
    """The lines of ``source`` (code, not comments) that name a path outside the repository."""
    found = []
    for n, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if _OUTSIDE.search(code):
            found.append(f"{n}: {line.strip()}")
    return found


def test_no_test_or_bench_reads_outside_the_repository() -> None:
    """A fresh clone has no ``../shared`` beside it: the suite and the benches read only what the repository has
    (test vectors live in tests/data/ with their provenance)."""
    offenders = {}
    for folder in ("tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # this file's own examples of the forms
            hits = _reaches_outside(path.read_text(encoding="utf-8"))
            if hits:
                offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, offenders


@pytest.mark.parametrize("line", [
    'SAMPLES = ROOT.parent / "shared" / "samples"',
    'SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "samples"',
    'GRID = Path("..") / "astra"',
    'open("../shared/astra/x.csv")',
    'p = root / "shared" / "samples"',
])
def test_the_outside_reader_check_finds_each_form(line: str) -> None:
    assert _reaches_outside(line) == [f"1: {line}"]
    assert _reaches_outside(f"x = 1  # {line}") == []
