"""Library docstrings say what the code does and why, never what a run measured on a given day.

A measurement ages: "run P17 gave -3.6% on 2026-11-27" is true of one machine in one hour and wrong the next
week, while the docstring stays in the code. So docstrings (modules, classes, functions) of the library packages
carry no date, no bench run name and no measured figure; a rule that a measurement justifies cites its bench and the
journal instead, e.g. "(bench/fidelity.py; docs/results.md)", and the figures live in docs/results.md. The same
holds for the ``#:`` comments that document a module's constants (Sphinx's attribute docs).

The detector is deliberately narrow so that a specification is not taken for a measurement: "1 Gb/s", "a 100 us
threshold", "32 MiB", "within 5%" are the code's own parameters and targets and pass; what fails is a date
(2026-11-27), a run name (P17, E22, W8, "run K", "runs J to T"), a signed or ranged percentage (+34%, -2.4%,
8-10%), a measured ratio (x3.71, 3.71x: two decimals or more, as a factor such as 1.5x is a setting) and a
measuring verb with a figure ("took 4.8 ms", "gave 12.0 ms").
Literal spans (``...``) are skipped for ratios and percentages: they quote the format of a report line, such as
``1.022x``, not a result.

nbox/cli/ is read for its module docstrings only: its functions' docstrings are the commands' help texts, which
belong to the CLI layer, whose own tests check that no help text carries a date or a measured figure.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nbox", "nbox_trace", "emulator_core", "nbox_record", "nbox_replay")
MODULE_ONLY = ("nbox/cli/",)  # function docstrings there are help texts, which the CLI's own tests check

_NUM = r"\d+(?:\.\d+)?"
_UNIT = r"(?:ns|us|\u00b5s|ms|s|min|%|x|GB/s|Gb/s|MB|MiB|KiB|GiB)"
#: (what it is, pattern); a match in a docstring fails the test.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    ("a run name", re.compile(r"(?<![\w./-])[PEW]\d{1,3}(?:-[PEW]?\d{1,3})?(?![\w/-])")),
    ("a run name", re.compile(r"\bruns? [A-Z](?:(?:,| and| to| or|-)\s?[A-Z])*"
                              r"(?=[,.;:)'\u2019]|\s+(?:and|to|of|in|on|gave|was|were|below|above)\b)")),
    ("a signed percentage", re.compile(r"(?<![\w.+\-])[+\-\u2212]" + _NUM + r"\s?%")),
    ("a range of percentages", re.compile(r"(?<![\w.])" + _NUM + r"%?\s?(?:-|\u2013|to)\s?" + _NUM + r"\s?%")),
    ("a measured ratio", re.compile(r"(?<![\w.])x\d+\.\d{2,}\b|\b\d+\.\d{2,}x\b")),  # x3.71, 3.71x; not 1.5x
    ("a measuring verb with a figure", re.compile(
        r"\b(?:took|ran in|gave|measured(?: at)?|was measured at|cost us|saved)\s+(?:about\s+|up to\s+)?"
        + _NUM + r"(?:\s?(?:-|\u2013|to)\s?" + _NUM + r")?\s?" + _UNIT + r"(?![\w/])")),
    ("a measurement on a machine", re.compile(
        r"\b[Mm]easured (?:on|in)\b[^.;]*?\d+(?:\.\d+)?\s?(?:ns|us|ms|s|%)(?![\w/])|\bon this VM\b")),
)
_LITERAL = re.compile(r"``[^`]*``")
_LITERAL_EXEMPT = {"a signed percentage", "a range of percentages", "a measured ratio"}


@dataclass(frozen=True)
class Hit:
    where: str
    what: str
    text: str


def find_figures(doc: str) -> list[tuple[str, str]]:
    """Each (kind, matched text) in a docstring that looks like a date, a run name or a measured figure."""
    found = []
    unliteral = _LITERAL.sub(lambda m: " " * len(m.group(0)), doc)
    for what, pattern in PATTERNS:
        for m in pattern.finditer(unliteral if what in _LITERAL_EXEMPT else doc):
            found.append((what, m.group(0)))
    return found


def _modules() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.endswith("_pb2.py"):
                out.append(path)
    return out


def _attribute_docs(source: str) -> list[tuple[int, str]]:
    """The ``#:`` comment blocks (Sphinx's attribute docs: what a constant is and why), as (first line, text)."""
    blocks: list[tuple[int, str]] = []
    previous = -2
    for n, line in enumerate(source.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#:"):
            if n == previous + 1:
                blocks[-1] = (blocks[-1][0], blocks[-1][1] + " " + stripped[2:].strip())
            else:
                blocks.append((n, stripped[2:].strip()))
            previous = n
    return blocks


def docstring_hits(path: Path) -> list[Hit]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    rel = path.relative_to(ROOT).as_posix()
    module_only = rel.startswith(MODULE_ONLY)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and (
                isinstance(node, ast.Module) or not module_only):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                name = getattr(node, "name", "<module>")
                line = node.body[0].lineno if node.body else 0
                hits += [Hit(f"{rel}:{line} ({name})", what, text) for what, text in find_figures(doc)]
    for line, doc in _attribute_docs(source):
        hits += [Hit(f"{rel}:{line} (#: comment)", what, text) for what, text in find_figures(doc)]
    return hits


# ------------------------------------------------------------------------- the detector catches the patterns

@pytest.mark.parametrize("text", [
    "Chosen on 2026-11-27 after the testbed runs.",
    "Run P17 showed it; so did E22 and W8.",
    "the runs J to T below used the default",
    "as run K's recordings showed.",
    "On an H100 a one-iteration replay took 4.8 ms after one warm-up repetition.",
    "the pad made it +34% slower",
    "the virtual replay was -2.4% off",
    "replayed operators 8-10% longer per iteration",
    "a slowdown of x3.71 on the busy core",
    "it ran 3.71x slower",
    "the 1 MiB all-reduce gave 8.80 ms",
    "Measured on the namespace testbed's FSDP2 recording: 18.9 ms of a 56.3 ms compute.",
    "loads torch's meta kernels (about 0.7-1.3 s on this VM)",
])
def test_the_detector_catches_dates_runs_and_measured_figures(text: str) -> None:
    assert find_figures(text), text


@pytest.mark.parametrize("text", [
    "Shapes every egress to 1 Gb/s with tc tbf.",
    "A call is late when it ends more than a 100 us threshold after its deadline.",
    "The heap keeps a fixed mmap threshold of 32 MiB.",
    "The fidelity target is within 5% of the real run.",
    "Spins the last 200 us before a deadline.",
    "Returns the speed-up formatted as ``1.022x`` with ``digits`` decimals.",
    "A rank's compute is stretched by its straggler factor (x times its duration).",
    "The P2P pairs and the E2E path.",
    "[[stragglers]]: rank 3 computes 1.5x slower.",
    "`--iterations K` runs K pairs of launches.",
    "Benches: bench/fidelity.py; docs/results.md.",
    "The size measured on the dimension, in bytes (1 KiB to 64 MiB).",
])
def test_the_detector_leaves_specifications_alone(text: str) -> None:
    assert find_figures(text) == [], text


# ----------------------------------------------------------------------------------------- the library itself

def test_library_docstrings_carry_no_dates_runs_or_measured_figures() -> None:
    hits = [h for path in _modules() for h in docstring_hits(path)]
    assert hits == [], "\n".join(f"{h.where}: {h.what}: {h.text!r}" for h in hits)


def test_attribute_doc_comments_are_read_as_one_block() -> None:
    source = "#: a threshold chosen on 2026-11-27\n#: after run P17\nX = 1\n# plain comment +34%\n#: other\n"
    assert _attribute_docs(source) == [(1, "a threshold chosen on 2026-11-27 after run P17"), (5, "other")]


def test_the_walk_covers_the_library() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"nbox_replay/inputs/profiler.py", "emulator_core/pricing/answer.py", "nbox_trace/errors.py"} <= names
    assert "nbox/cli/app.py" in names  # its module docstring; its commands' help texts are the CLI's tests' own
