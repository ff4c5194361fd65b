"""The README's worked example, regenerated: run the README's main command and put its real output in the README.

    python bench/readme_example.py [--runs 5] [--write]

Runs the two ``nbox`` steps of the README's first command block (``nbox record ...`` then ``nbox replay ...``) in a
fresh temporary directory, as a user would after the install, ``--runs`` times one after another. Per run it prints
the command's wall time, the recorded (observed) iteration, the baseline replay's, and the report's ``baseline vs
recorded`` line; then the spread over the runs. ``--write`` puts the last run's outputs into README.md: the record's
stdout into the block after "The main command above", and the replay report between the
``<!-- example-output:start -->`` and ``<!-- example-output:end -->`` markers (``tests/test_docs.py`` and
``tests/test_readme.py`` check that the block is the command's output, line for line but for the numbers). Nothing
else in the README is touched. Launches ranks: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- example-output:start -->", "<!-- example-output:end -->"


def main_steps(text: str) -> list[list[str]]:
    """The ``nbox`` steps of the README's first bash block, as argument lists (without ``nbox``)."""
    block = re.findall(r"```bash\n(.*?)```", text, re.S)[0]
    return [shlex.split(part)[1:] for part in block.split("&&") if part.strip().startswith("nbox ")]


def run_once(steps: list[list[str]]) -> tuple[list[str], float]:
    """Each step's stdout, in a fresh directory; the whole command's wall seconds."""
    outs = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nbox-readme-") as tmp:
        for args in steps:
            proc = subprocess.run([sys.executable, "-m", "nbox", *args], cwd=tmp, capture_output=True, text=True,
                                  timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"readme_example: nbox {' '.join(args)} exited {proc.returncode}: "
                                 f"{proc.stderr[-1500:]}")
            outs.append(proc.stdout)
    return outs, time.monotonic() - t0


def figures(report: str) -> tuple[float | None, float | None, float | None]:
    """The recorded and baseline iteration (ms) and ``baseline vs recorded`` (%) of a replay report."""
    def ms(label: str) -> float | None:
        line = next((ln for ln in report.splitlines() if ln.startswith(label)), None)
        if line is None:
            return None
        m = re.search(r"\)\s+([\d.]+)", line)
        return float(m.group(1)) if m else None

    err = re.search(r"baseline vs recorded: ([+-][\d.]+)%", report)
    return ms("recorded (observed"), ms("baseline ("), float(err.group(1)) if err else None


def write(record_out: str, report: str) -> None:
    text = README.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    text = f"{head}{START}\n```text\n{report.rstrip()}\n```\n{END}{tail}"
    lines = record_out.strip().splitlines()
    block = re.compile(r"(The main command above.*?```text\n)(.*?)(```)", re.S)
    text, n = block.subn(lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(3), text, count=1)
    if n != 1:
        raise SystemExit("readme_example: README.md has no record output block after 'The main command above'")
    README.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="put the last run's outputs into README.md")
    args = ap.parse_args(argv)
    steps = main_steps(README.read_text(encoding="utf-8"))
    if [s[0] for s in steps] != ["record", "replay"]:
        raise SystemExit(f"readme_example: the README's main command runs {[s[0] for s in steps]}, not record, replay")
    errors, walls = [], []
    outs: list[str] = []
    print(f"{'run':>3} {'wall s':>7} {'recorded ms':>12} {'baseline ms':>12} {'baseline vs recorded':>21}")
    for k in range(args.runs):
        outs, wall = run_once(steps)
        rec, base, err = figures(outs[1])
        walls.append(wall)
        if err is not None:
            errors.append(err)
        print(f"{k + 1:>3} {wall:7.1f} {rec or float('nan'):12.2f} {base or float('nan'):12.2f} "
              f"{'-' if err is None else f'{err:+.1f}%':>21}", flush=True)
    if errors:
        print(f"baseline vs recorded over {len(errors)} run(s): median {statistics.median(errors):+.1f}%, "
              f"range {min(errors):+.1f}%..{max(errors):+.1f}%, largest |error| {max(map(abs, errors)):.1f}%; "
              f"wall {min(walls):.0f}-{max(walls):.0f} s")
    if args.write:
        write(outs[0], outs[1])
        print(f"readme_example: wrote the last run's outputs into {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
