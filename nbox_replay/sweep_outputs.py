"""The outputs of ``nbox sweep``: its rows as CSV, as a plot (with matplotlib) and as a table.

:func:`write_outputs` writes what :func:`nbox_replay.sweep.run_sweep` returned: ``sweep.csv`` always, ``sweep.png``
where matplotlib is importable (else a notice saying what to install); :func:`format_table` is the text the command
prints. Split from :mod:`nbox_replay.sweep`, which runs the grid.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbox_replay.report import format_speedup
from nbox_replay.sweep import PlotUnavailableError, SweepError, SweepRow, SweepWriteError, Value, _fmt_value
from nbox_trace.files import write_atomic

__all__ = ["format_table", "write_csv", "write_outputs", "write_plot"]

_FIGURE_COLUMNS = ("world_size", "iteration_us", "compute_us", "exposed_comm_us", "overlapped_comm_us",
                   "slowest_rank", "speedup")


def _columns(rows: Sequence[SweepRow]) -> list[str]:
    keys = [k for k, _ in rows[0].values] if rows else []
    return keys + [c for c in _FIGURE_COLUMNS if c not in keys]


def write_csv(rows: Sequence[SweepRow], path: Path) -> Path:
    """Write the rows as CSV (header: axis keys, then :data:`_FIGURE_COLUMNS`; times in us). Atomic.

    Raises:
        SweepWriteError: the file cannot be written.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    cols = _columns(rows)
    writer.writerow(cols)
    for row in rows:
        d = row.to_dict()
        writer.writerow([_csv_cell(d[c]) for c in cols])
    write_atomic(Path(path), buf.getvalue(), error=SweepWriteError)
    return Path(path)


def _csv_cell(v: Any) -> str:
    if v is None:  # an undefined ratio (summary.speedup)
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _numeric(values: Sequence[Value]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def write_plot(rows: Sequence[SweepRow], path_png: Path) -> list[Path]:
    """Plot iteration time (ms) against the first axis, one line per value of the second axis (if any);
    write the PNG and the CSV beside it (same stem, ``.csv``). Both written atomically.

    The x axis is logarithmic when the first axis is numeric, positive and spans more than 10x;
    non-numeric values are placed at evenly spaced categories. Further axes (a third, ...) are folded into
    the line labels. Returns ``[png, csv]``.

    Raises:
        SweepError: no rows.
        PlotUnavailableError: matplotlib is not installed (``pip install 'nbox[plots]'``); nothing is written.
        SweepWriteError: a file cannot be written.
    """
    if not rows:
        raise SweepError("nothing to plot: the sweep has no rows")
    path_png = Path(path_png)
    png = _plot_png(rows, path_png, lambda: write_csv(rows, path_png.with_suffix(".csv")))
    return [png, path_png.with_suffix(".csv")]


def write_outputs(rows: Sequence[SweepRow], out_dir: Path, notice: Callable[[str], None]) -> list[Path]:
    """What ``nbox sweep`` writes into ``out_dir``: ``sweep.csv`` always, then ``sweep.png`` when matplotlib is
    installed; without it ``notice`` says what the PNG needs. Returns the files written (CSV first).

    Raises:
        SweepError: no rows. SweepWriteError: a file cannot be written.
    """
    if not rows:
        raise SweepError("nothing to write: the sweep has no rows")
    written = [write_csv(rows, Path(out_dir) / "sweep.csv")]
    try:
        written.append(_plot_png(rows, Path(out_dir) / "sweep.png", lambda: written[0]))
    except PlotUnavailableError as exc:
        notice(f"{exc}; wrote the CSV and the table without it")
    return written


def _plot_png(rows: Sequence[SweepRow], path_png: Path, before: Callable[[], Path]) -> Path:
    """Draw the PNG (see :func:`write_plot`); ``before`` runs once matplotlib is known to be there."""
    try:
        from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise PlotUnavailableError("the PNG plot needs matplotlib: pip install 'nbox[plots]'") from None
    before()
    keys = [k for k, _ in rows[0].values]
    xs_all = list(dict.fromkeys(r.values[0][1] for r in rows))
    numeric = _numeric(xs_all)
    lines: dict[str, list[tuple[Value, float]]] = {}
    for r in rows:
        label = ", ".join(_fmt_value(v) if len(r.values) == 2 else f"{k}={_fmt_value(v)}" for k, v in r.values[1:])
        lines.setdefault(label, []).append((r.values[0][1], r.iteration_us / 1000.0))
    fig = Figure(figsize=(7.0, 4.5), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    for label, pts in lines.items():
        if numeric:
            xs: list[float] = [float(x) for x, _ in pts]
        else:
            xs = [float(xs_all.index(x)) for x, _ in pts]
        ax.plot(xs, [y for _, y in pts], marker="o", label=label or None)
    if numeric:
        lo, hi = min(float(x) for x in xs_all), max(float(x) for x in xs_all)  # type: ignore[arg-type, unused-ignore]
        if lo > 0 and hi / lo > 10:
            from matplotlib.ticker import NullLocator  # type: ignore[import-not-found, unused-ignore]

            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
        if len(xs_all) <= 12:  # label the points themselves (plain numbers, also on a log axis)
            ax.set_xticks([float(x) for x in xs_all], [_fmt_value(x) for x in xs_all])  # type: ignore[arg-type, unused-ignore]
    else:
        ax.set_xticks([float(i) for i in range(len(xs_all))], [_fmt_value(x) for x in xs_all])
    ax.set_xlabel(keys[0])
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("nbox sweep: predicted iteration time")
    ax.grid(True, which="both", alpha=0.3)
    if len(lines) > 1 or next(iter(lines)):
        ax.legend(title=", ".join(keys[1:]) or None, fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_atomic(path_png, buf.getvalue(), error=SweepWriteError)
    return path_png


def format_table(rows: Sequence[SweepRow]) -> str:
    """A fixed-width text table of the rows, one line per row: each time column in one unit that suits it
    (:func:`nbox_trace.units.time_unit`, named in its header), speedup as ``x``."""
    from nbox_trace.units import format_in, time_unit

    if not rows:
        return "(no rows)\n"
    keys = [k for k, _ in rows[0].values]
    figures = (("iteration", "iteration_us"), ("compute", "compute_us"), ("exposed comm", "exposed_comm_us"),
               ("overlapped comm", "overlapped_comm_us"))
    units = [time_unit(getattr(r, attr) for r in rows) for _, attr in figures]
    digits = [None if u[0] == "us" else 3 for u in units]
    head = [*keys, *(f"{name} {u[0]}" for (name, _), u in zip(figures, units, strict=True)), "speedup"]
    cols = list(zip(figures, units, digits, strict=True))
    body = [[*(_fmt_value(v) for _, v in r.values),
             *(format_in(getattr(r, attr), u, digits=d) for (_, attr), u, d in cols), format_speedup(r.speedup, 2)]
            for r in rows]
    widths = [max(len(head[c]), *(len(b[c]) for b in body)) for c in range(len(head))]
    nkeys = len(keys)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < nkeys else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(head), line(["-" * w for w in widths]), *(line(b) for b in body)]
    return "\n".join(out) + "\n"
