"""The user docs hold together: README.md and docs/*.md link only to files (and headings) that exist, the README stays
a README (at most 400 lines, the two set-up commands, the worked example's output block), and its headline picture
is a committed PNG drawn from the same table the README prints.

Links are checked on the tree as it is: a page named in a link must be in the repository, so a link to a page that
another branch adds fails until that branch is merged (the lead merges before CI runs).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
HEADLINE_CSV = DOCS / "figures" / "headline.csv"
HEADLINE_PNG = DOCS / "figures" / "headline.png"
MAX_README_LINES = 400

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code blanked (a link there is an example, not a link)."""
    out, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
            continue
        out.append("" if in_fence else _INLINE_CODE.sub("", line))
    return out


def links(text: str) -> list[str]:
    """Every link and image target in a markdown text, outside code."""
    return [m.group(1) for line in _prose_lines(text) for m in _LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the link text of links kept, lower case, punctuation but - and _ dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a markdown file's headings give (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
            continue
        m = None if in_fence else _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, root: Path) -> list[str]:
    """The relative links of ``page`` that do not resolve to a file under ``root`` (or to one of its headings)."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
            continue
        path_part, _, anchor = target.partition("#")
        dest = page if not path_part else (page.parent / path_part).resolve()
        where = f"{page.relative_to(root)}: {target}"
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where} (outside the repository)")
        elif not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{where} (no heading with that anchor in {dest.relative_to(root.resolve())})")
    return problems


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# ------------------------------------------------------------------ the checker itself catches what it should

def test_the_link_checker_catches_broken_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n\n## The `nbox replay` report: reading it\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok anchor](docs/a.md#the-nbox-replay-report-reading-it) [self](#top-heading)\n"
        "[gone](docs/missing.md) [bad anchor](docs/a.md#no-such) ![img](docs/none.png) [out](../x.md)\n"
        "`[in code](docs/missing2.md)` [web](https://example.com/x)\n```\n[fenced](docs/missing3.md)\n```\n"
        "# Top heading\n")
    problems = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "docs/missing.md", "docs/a.md#no-such", "docs/none.png", "../x.md"]


def test_slugs_follow_githubs_rule() -> None:
    assert slug("`nbox sweep`: a grid of what-ifs") == "nbox-sweep-a-grid-of-what-ifs"
    assert slug("Calls beside compute (`--busy`)") == "calls-beside-compute---busy"
    assert slug("A collective beside compute (`busy_slowdown`)") == "a-collective-beside-compute-busy_slowdown"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


# ------------------------------------------------------------------------------------------- the real pages

@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, ROOT) == []


def test_docs_have_a_page_per_command_and_concept() -> None:
    for name in ("index", "install", "record", "replay", "emulate", "calibrate", "scenarios", "bundles", "chakra",
                 "multinode", "output", "architecture", "results"):
        assert (DOCS / f"{name}.md").is_file(), name
    listed = set(links((DOCS / "index.md").read_text()))
    unlisted = [p.name for p in DOCS.glob("*.md") if p.name != "index.md" and p.name not in listed]
    assert unlisted == [], f"docs/index.md does not link {unlisted}"


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}); move detail to docs/"


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_has_the_two_setup_commands() -> None:
    blocks = _bash_blocks(README.read_text(encoding="utf-8"))
    main, tests = blocks[0], blocks[1]
    assert "pip install torch==2.13.0 -e ." in main and " nbox record " in main and " nbox replay " in main
    ci_lines = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines()]
    assert tests in ci_lines and tests.endswith("python -m pytest")


def test_readme_has_the_worked_examples_output_block() -> None:
    text = README.read_text(encoding="utf-8")
    start, end = "<!-- example-output:start -->", "<!-- example-output:end -->"
    assert text.count(start) == 1 and text.count(end) == 1 and text.index(start) < text.index(end)
    block = text[text.index(start) + len(start):text.index(end)].strip()
    assert block.startswith("```text\n") and block.endswith("```")
    main = _bash_blocks(text)[0]
    bundle = main.split("nbox replay ", 1)[1].split()[0]
    lines = block.splitlines()
    assert lines[1].startswith("what-if (")  # the answer first
    assert lines[2].startswith(f"replay of {bundle}:")  # the output is the main command's


def test_headline_png_is_committed_and_shown() -> None:
    assert HEADLINE_PNG.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rel = HEADLINE_PNG.relative_to(ROOT).as_posix()
    assert re.search(r"!\[[^\]]+\]\(" + re.escape(rel) + r"\)", README.read_text(encoding="utf-8"))


def _csv_rows() -> list[dict[str, str]]:
    lines = [ln for ln in HEADLINE_CSV.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def test_readme_headline_table_is_the_csvs() -> None:
    """The table the README prints and the CSV the picture is drawn from carry the same errors."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## How close it gets"):text.index("## Commands")]
    columns = {"virtual replay": 2, "live replay": 3, "emulate": 4}
    rows = _csv_rows()
    assert rows
    for example in dict.fromkeys(r["example"] for r in rows):
        line = next(ln for ln in section.splitlines() if ln.startswith(f"| {example} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        for method, col in columns.items():
            printed = [float(x.rstrip("%")) for x in cells[col].split(" / ")]
            assert printed == [float(r["error_pct"]) for r in rows
                               if r["example"] == example and r["method"] == method], (example, method)


def test_bench_readme_lists_every_bench_and_probe() -> None:
    """bench/README.md gives every script in bench/ and bench/probes/ its line: a bench added without one, or a
    probe left in bench/ beside the product's benches, fails here."""
    bench = ROOT / "bench"
    text = (bench / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in sorted(bench.glob("*.py")) if f"`{p.name}`" not in text]
    unlisted += [f"probes/{p.name}" for p in sorted((bench / "probes").glob("*.py")) if f"probes/{p.name}`" not in text]
    assert unlisted == [], f"bench/README.md does not list {unlisted}"
