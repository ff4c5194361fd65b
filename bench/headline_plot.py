"""Draw the README's headline figure from its table: ``docs/figures/headline.csv`` -> ``docs/figures/headline.png``.

The CSV is the headline fidelity table (each prediction's error against real runs, per example, method and run;
the figures and their source are in ``docs/results.md``). This script only draws it: one group of bars per
example, one bar per (method, run), a band at +-5% (the fidelity target), so the picture and the table cannot
disagree. Re-run it whenever the CSV changes and commit both:

    python bench/headline_plot.py [--csv docs/figures/headline.csv] [--out docs/figures/headline.png]

Needs matplotlib (``pip install 'nbox[plots]'`` or the dev extras). Lines of the CSV that start with ``#`` are
its provenance and are skipped.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV_DEFAULT = ROOT / "docs" / "figures" / "headline.csv"
PNG_DEFAULT = ROOT / "docs" / "figures" / "headline.png"
TARGET_PCT = 5.0  # the fidelity target the band shows
COLUMNS = ("example", "run", "method", "observed_median_ms", "observed_p10_ms", "observed_p90_ms", "error_pct")


@dataclass(frozen=True)
class Row:
    example: str
    run: str
    method: str
    observed_median_ms: float
    error_pct: float


def read_rows(path: Path) -> list[Row]:
    """The CSV's rows; a missing column or a non-number is an error naming the file and the line."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise SystemExit(f"{path}: missing column(s) {', '.join(missing)}")
    rows = []
    for n, rec in enumerate(reader, 2):
        try:
            rows.append(Row(rec["example"], rec["run"], rec["method"], float(rec["observed_median_ms"]),
                            float(rec["error_pct"])))
        except ValueError as exc:
            raise SystemExit(f"{path}: data line {n}: {exc}") from None
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return rows


def draw(rows: list[Row], out: Path) -> None:
    """One group of bars per example, one bar per (method, run), the +-5% band behind them; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    examples = list(dict.fromkeys(r.example for r in rows))
    series = list(dict.fromkeys((r.method, r.run) for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows))
    colours = dict(zip(methods, ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"), strict=False))
    by_key = {(r.example, r.method, r.run): r.error_pct for r in rows}
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=120)
    ax.axhspan(-TARGET_PCT, TARGET_PCT, color="#e8f4e8", zorder=0, label=f"target: within +-{TARGET_PCT:g}%")
    ax.axhline(0, color="black", linewidth=0.8, zorder=1)
    seen: set[str] = set()
    for i, (method, run) in enumerate(series):
        xs, ys = [], []
        for j, ex in enumerate(examples):
            if (ex, method, run) in by_key:
                xs.append(j - 0.4 + (i + 0.5) * width)
                ys.append(by_key[(ex, method, run)])
        label = method if method not in seen else None
        seen.add(method)
        bars = ax.bar(xs, ys, width * 0.9, color=colours[method], label=label, zorder=2)
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(run, (bar.get_x() + bar.get_width() / 2, y), ha="center", fontsize=6,
                        va="bottom" if y >= 0 else "top", xytext=(0, 2 if y >= 0 else -2), textcoords="offset points")
    ax.set_xticks(range(len(examples)), examples)
    ax.set_ylabel("prediction error vs real runs (%)")
    lim = max(TARGET_PCT + 2, max(abs(r.error_pct) for r in rows) + 2)
    ax.set_ylim(-lim, lim)
    ax.set_title("nbox vs real runs, tiny built-in examples, two-node testbed (1 Gb/s link)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", ncols=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png", metadata={"Software": None})  # no version stamp: re-runs give the same file
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV_DEFAULT, help="the headline table (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=PNG_DEFAULT, help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    rows = read_rows(args.csv)
    draw(rows, args.out)
    print(f"wrote {args.out}: {len(rows)} bars from {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
