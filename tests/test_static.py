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


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that go up a layer or across one (record <-> replay)."""
    wrong = []
    for module, targets in graph.items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and LAYER[other] >= LAYER[top]:
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
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
                stack.append((nxt, sorted(graph.get(nxt, ()))))
    return cycles


def test_imports_run_one_way_face_engines_core_base() -> None:
    """nbox (face) -> nbox_record / nbox_replay -> emulator_core -> nbox_trace (base), lazy imports included."""
    wrong = _layer_violations(_graph())
    assert not wrong, "\n".join(wrong)


def test_there_is_no_import_cycle_lazy_or_not() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(cycles)


def test_the_layer_and_cycle_checks_can_fail() -> None:
    """Fed a base module importing the core, record importing replay and a two-module circle, both checks object."""
    graph = {"nbox_trace.x": {"emulator_core.y"}, "nbox_record.a": {"nbox_replay.b"}, "emulator_core.y": set(),
             "nbox_replay.b": {"nbox_trace.x"}}
    assert _layer_violations(graph) == ["nbox_record.a imports nbox_replay.b", "nbox_trace.x imports emulator_core.y"]
    assert _cycles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == ["p.a -> p.b -> p.c -> p.a"]
    assert _cycles({"p.a": {"p.b"}, "p.b": set()}) == []


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


# ----------------------------------------------------------------------------------- rooms: sub-packages (issue 52)

#: Each layer's rooms (its sub-packages), bottom to top: a room imports the rooms listed before it in its own layer,
#: never one after it; a module at a package's top (``emulator_core._autoload``, ``nbox_replay.replay``) is its own
#: node of the graph. docs/architecture.md draws the same order.
ROOMS = {
    "nbox_trace": ("chakra", "check", "bundle", "launch", "testbed"),
    "emulator_core": ("network", "scenario", "astra", "pricing", "calibration", "device", "backend"),
    "nbox_record": ("examples", "handoff", "sources", "convert", "capture", "_inject", "launch"),
    "nbox_replay": ("inputs", "virtual", "report", "live"),
    "nbox": ("cli",),
}
#: The most modules (``*.py`` files, ``__init__`` included) one folder of the library may hold.
MAX_MODULES = 15


def _room(module: str, rooms: dict[str, tuple[str, ...]]) -> str:
    """The room a module lives in (``emulator_core.scenario.world`` -> ``emulator_core.scenario``); a module at its
    package's top is its own room."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in rooms.get(parts[0], ()) else module


def _door_names(init: Path) -> set[str]:
    """The names a room's door (its ``__init__``) lists in ``__all__``, read without importing it."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _room_violations(graph: dict[str, set[str]], rooms: dict[str, tuple[str, ...]],
                     doors: dict[str, set[str]]) -> list[str]:
    """Imports between rooms that pass by a room's door (a module the door does not export), or that go up the
    order of ``rooms`` within a layer."""
    wrong = []
    for module, targets in graph.items():
        here = _room(module, rooms)
        for target in targets:
            there = _room(target, rooms)
            parts = target.split(".")
            is_room = len(parts) == 2 and parts[1] in rooms.get(parts[0], ())
            if there == here or (there == target and not is_room):
                continue  # inside one room, or a module at a package's top (a room of one module, its own door)
            if target != there and target.rsplit(".", 1)[1] not in doors.get(there, set()):
                wrong.append(f"{module} imports {target}, which {there}'s door does not export")
            package, inner = there.split(".", 1)
            if here != module and here.split(".")[0] == package:
                order = rooms[package]
                if order.index(inner) > order.index(here.split(".", 1)[1]):
                    wrong.append(f"{module} imports {target}, a room above its own ({here})")
    return sorted(wrong)


def _room_graph(graph: dict[str, set[str]], rooms: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = _room(module, rooms)
        out.setdefault(here, set()).update(_room(t, rooms) for t in targets if _room(t, rooms) != here)
    return out


def _doors() -> dict[str, set[str]]:
    return {f"{package}.{room}": _door_names(ROOT / package / room / "__init__.py")
            for package, names in ROOMS.items() for room in names}


def _crowded(folders: list[Path]) -> dict[str, int]:
    """The folders holding more than MAX_MODULES modules, with their counts."""
    counts = {folder.as_posix(): len(list(folder.glob("*.py"))) for folder in folders}
    return {name: n for name, n in counts.items() if n > MAX_MODULES}


def test_every_sub_package_is_a_room_in_the_order() -> None:
    """A new sub-package is placed in ROOMS (and in docs/architecture.md's picture) before it is used."""
    found = {(package, d.name) for package in LIBRARY for d in (ROOT / package).iterdir()
             if (d / "__init__.py").is_file()}
    assert found == {(package, room) for package, names in ROOMS.items() for room in names}


def test_rooms_import_each_other_only_through_their_doors_and_downwards() -> None:
    """A room imports its own modules, the doors of the rooms below it in its layer and the doors of the layers
    below; never a sibling's private module, never a room above it."""
    wrong = _room_violations(_graph(), ROOMS, _doors())
    assert not wrong, "\n".join(wrong)


def test_there_is_no_cycle_between_rooms() -> None:
    cycles = _cycles(_room_graph(_graph(), ROOMS))
    assert not cycles, "\n".join(cycles)


def test_the_room_checks_can_fail() -> None:
    """Fed a room reaching into a sibling's private module, a room importing one above it, and two rooms in a
    circle through their doors, the checks object; an import through a door, or of a module the door exports,
    passes."""
    rooms = {"p": ("low", "high")}
    doors = {"p.low": {"api", "public_mod"}, "p.high": {"run"}}
    graph = {"p.high.run": {"p.low.private", "p.low", "p.low.public_mod"}, "p.low.private": {"p.high"},
             "p.low.public_mod": set(), "p.low": set(), "p.high": set()}
    assert _room_violations(graph, rooms, doors) == [
        "p.high.run imports p.low.private, which p.low's door does not export",
        "p.low.private imports p.high, a room above its own (p.low)",
    ]
    assert _cycles(_room_graph(graph, rooms)) == ["p.high -> p.low -> p.high"]
    assert _room_violations({"p.high.run": {"p.low", "p.low.public_mod"}}, rooms, doors) == []


def test_no_folder_holds_more_than_15_modules() -> None:
    folders = sorted({path.parent for path in _modules().values()})
    assert not _crowded(folders), _crowded(folders)


def test_the_folder_size_check_can_fail(tmp_path: Path) -> None:
    for i in range(MAX_MODULES + 1):
        (tmp_path / f"m{i}.py").write_text("")
    assert _crowded([tmp_path]) == {tmp_path.as_posix(): MAX_MODULES + 1}
    (tmp_path / "m0.py").unlink()
    assert _crowded([tmp_path]) == {}


def test_each_door_says_what_its_room_is_for_and_opens() -> None:
    """Each room's ``__init__`` has a docstring saying what it may import, and every name its ``__all__`` lists
    resolves; a lazy door's table of homes, its ``__all__`` and its type-checking imports name the same things."""
    import importlib

    for room, names in _doors().items():
        init = ROOT / room.replace(".", "/") / "__init__.py"
        tree = ast.parse(init.read_text())
        doc = ast.get_docstring(tree) or ""
        assert "May import" in doc or "import nothing" in doc or "nothing imports it" in doc, room
        module = importlib.import_module(room)
        for name in sorted(names):
            assert getattr(module, name) is not None, f"{room}.{name}"
        homes = getattr(module, "_HOMES", None)
        if homes is not None:  # a lazy door (nbox_trace.doors)
            typed = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and (node.module or "").startswith(room) for alias in node.names}
            modules = {n for n in names if (init.parent / f"{n}.py").is_file()}
            assert names == {n for ns in homes.values() for n in ns} | modules == typed, room
            for home, exported in homes.items():
                defined = importlib.import_module(f"{room}.{home}")
                assert all(getattr(module, n) is getattr(defined, n) for n in exported), (room, home)
        with pytest.raises(AttributeError):
            module.no_such_name_in_any_door  # noqa: B018 - the door refuses a name it does not export


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


#: The most lines a library module may have (issue 12: one concern per room).
MAX_LINES = 600


def _too_long(paths: list[Path], allowed: dict[str, str]) -> dict[str, int]:
    """The modules among ``paths`` over MAX_LINES lines that ``allowed`` does not name, with their line counts."""
    long = {path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix(): n for path in paths
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    return {name: n for name, n in long.items() if name not in allowed}


def test_no_library_module_is_over_600_lines() -> None:
    """Issue 12: one concern per room. A module over ~600 lines must say why here, or be split."""
    allowed: dict[str, str] = {}
    long = _too_long(list(_modules().values()), allowed)
    assert not long, long


def test_the_line_limit_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "ok.py").write_text("x = 1\n" * MAX_LINES)
    paths = sorted(tmp_path.glob("*.py"))
    assert list(_too_long(paths, {}).values()) == [MAX_LINES + 1]
    assert _too_long(paths, {(tmp_path / "big.py").as_posix(): "why"}) == {}


# ------------------------------------------------------------- docstrings are contracts, not lab notes (issue 61)

#: The most lines a library module's docstring may have: its role, contract and units fit in about 15; the why and
#: the evidence (rationale, measurements, history) go to a design page under docs/design/, which the docstring links.
MAX_MODULE_DOC_LINES = 40
#: A run's name: "Run L", "run B", "runs J", "run K2", or a bench run's tag such as P17 or E23. Not "P2P", "E2E",
#: "p10-p90", "I/O", nor "Run" opening a sentence of lower-case words.
_RUN_NAME = re.compile(r"\b[Rr]uns? [A-Z]\d*(?![\w/])|\b[PE]\d{1,2}\b")
#: A lab notebook's phrases: where and when something was tried, not what the code does.
_LAB_PHRASE = re.compile(r"\ba lent (?:[A-Z]\d{2,3}|GPU)\b|\bone GPU here\b|\bthis stop\b|\bwe (?:measured|found)\b"
                         r"|\bmeasured here\b|\bon this VM\b", re.IGNORECASE)


def lab_notes(doc: str) -> list[str]:
    """The run names and lab phrases in one docstring, in order of kind (run names first)."""
    return [m.group(0) for m in _RUN_NAME.finditer(doc)] + [m.group(0) for m in _LAB_PHRASE.finditer(doc)]


def docstring_problems(source: str, where: str) -> list[str]:
    """What in a module's source breaks the rule: a module docstring over MAX_MODULE_DOC_LINES lines, and a run name
    or lab phrase in the module's docstring or in any of its classes' or functions' docstrings."""
    tree = ast.parse(source, where)
    problems = []
    module_doc = ast.get_docstring(tree, clean=False) or ""
    if (n := len(module_doc.splitlines())) > MAX_MODULE_DOC_LINES:
        problems.append(f"{where}: module docstring of {n} lines (at most {MAX_MODULE_DOC_LINES}; the why and "
                        "the evidence go to docs/design/)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                name = getattr(node, "name", "<module>")
                problems += [f"{where} ({name}): {found!r}" for found in lab_notes(doc)]
    return problems


def test_library_docstrings_are_contracts_not_lab_notes() -> None:
    """Issue 61: a docstring states a role, a contract and units; runs, machines and findings live in docs/design/
    (the why) and docs/results.md (the figures)."""
    problems = [p for path in sorted(_modules().values())
                for p in docstring_problems(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text", [
    'The testbed lands a little above it (docs/results.md, "Run L").',
    "why is run B slower than run A?",
    "the runs J to T below used the default",
    "as run K2 showed",
    "Fixed in P17; E23 confirmed it.",
    "On a lent H100 the captured iteration was slower.",
    "on a lent H200 it held",
    "Not measured (one GPU here, no real collective).",
    "This stop changed the default.",
    "We measured 4.8 ms per call.",
])
def test_the_lab_note_check_flags_run_names_and_lab_phrases(text: str) -> None:
    assert lab_notes(text), text


@pytest.mark.parametrize("text", [
    "The P2P pairs and the E2E path.",
    "Run the tests with pytest. Run as many ranks as the machine has cores.",
    "Reported with its p10-p90 spread.",
    "Each run of the bench writes one row; runs of nbox replay are paired.",
    "Every rank does its own I/O; a warm-up run is discarded.",
    "H100: 450 GB/s NVLink line rate per GPU.",
    "stops the ranks; a rank that stops early is named",
])
def test_the_lab_note_check_leaves_ordinary_text_alone(text: str) -> None:
    assert lab_notes(text) == [], text


def test_the_docstring_check_can_fail() -> None:
    """A module docstring one line too long, and a function's docstring naming a run, are flagged; a module at the
    limit whose functions document their contract is not."""
    long_doc = '"""' + "\n".join(["Role."] + ["line"] * MAX_MODULE_DOC_LINES) + '"""\n'
    at_limit = '"""' + "\n".join(["Role."] + ["line"] * (MAX_MODULE_DOC_LINES - 1)) + '"""\n'
    narrating = 'def f() -> None:\n    """Chosen after run P17 on a lent H100."""\n'
    contract = 'class C:\n    """Times in microseconds; P2P calls are priced per pair."""\n'
    assert [p.split(": ", 1)[1] for p in docstring_problems(long_doc, "m.py")] == [
        f"module docstring of {MAX_MODULE_DOC_LINES + 1} lines (at most {MAX_MODULE_DOC_LINES}; the why and the "
        "evidence go to docs/design/)"]
    assert docstring_problems(at_limit + narrating, "m.py") == ["m.py (f): 'run P17'", "m.py (f): 'a lent H100'"]
    assert docstring_problems(at_limit + contract, "m.py") == []


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
