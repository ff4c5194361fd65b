"""How nbox writes sizes and times for people: one formatter per quantity, used by every command's text output.

- Bytes in IEC units (B, KiB, MiB, GiB, TiB: powers of 1024), never "MB" or "bytes": ``format_bytes``.
- Times picked by magnitude (us, ms, s) for a single value (``format_us``), or one unit for a whole column so
  values line up and compare at a glance (``time_unit`` + ``format_in``).
- Labels that do not fit a column end in an ellipsis at a word boundary, never cut mid-word: ``fit_label``.

``--json`` documents never use these: they carry raw numbers in the unit their key names (``*_us``, ``bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["fit_label", "format_bytes", "format_in", "format_us", "time_unit"]

_IEC = ("B", "KiB", "MiB", "GiB", "TiB")
_TIME_UNITS = (("us", 1.0), ("ms", 1e3), ("s", 1e6))


def format_bytes(n: float) -> str:
    """``1708288`` -> ``"1.6 MiB"``; whole bytes below 1 KiB (``"512 B"``); IEC units (1 KiB = 1024 B)."""
    if not math.isfinite(n):
        return f"{n} B"
    size = float(n)
    for unit in _IEC:
        if abs(size) < 1024 or unit == _IEC[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def time_unit(values_us: Iterable[float]) -> tuple[str, float]:
    """The unit (name, microseconds per unit) that suits the largest of ``values_us``: below 10 ms in us, below
    10 s in ms, else s. A column formatted in one unit reads at a glance."""
    top = max((abs(v) for v in values_us if math.isfinite(v)), default=0.0)
    if top < 10_000:
        return _TIME_UNITS[0]
    return _TIME_UNITS[1] if top < 10_000_000 else _TIME_UNITS[2]


def format_in(value_us: float, unit: tuple[str, float], *, digits: int | None = None) -> str:
    """``value_us`` in ``unit`` (from :func:`time_unit`), without the unit's name: us as whole numbers, ms and s
    with 2 decimals unless ``digits`` says otherwise."""
    name, scale = unit
    places = digits if digits is not None else (0 if name == "us" else 2)
    return f"{value_us / scale:.{places}f}"


def format_us(value_us: float) -> str:
    """One time with its unit, picked by magnitude: ``"812 us"``, ``"16.28 ms"``, ``"3.20 s"``."""
    unit = time_unit([value_us])
    return f"{format_in(value_us, unit)} {unit[0]}"


def fit_label(text: str, width: int) -> str:
    """``text`` if it fits ``width`` characters, else cut at the last word boundary that leaves room for an
    ellipsis (``"(loopback_cpu topology)"`` -> ``"(loopback_cpu…"``, never ``"(loopback_cpu topolog"``)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if len(text) <= width:
        return text
    room = text[: width - 1]
    cut = max(room.rfind(" "), room.rfind("_"), room.rfind("/"), room.rfind(","))
    head = room[:cut].rstrip(" ,/_") if cut > 0 else room
    return head + "…"
