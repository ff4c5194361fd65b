"""How nbox writes sizes and times for people: one formatter per quantity, used by every command's text output.

- Bytes in IEC units (B, KiB, MiB, GiB, TiB: powers of 1024), never "MB" or "bytes": ``format_bytes``.
- Times picked by magnitude (us, ms, s) for a single value (``format_us``), or one unit for a whole column so
  values line up and compare at a glance (``time_unit`` + ``format_in``).
- Labels that do not fit a column end in an ellipsis at a word boundary, never cut mid-word: ``fit_label``.
- Sizes read back the way they are written (``64MiB``, ``1.5GiB``, ``4096``): ``parse_bytes``, the one reader every
  option and ``--set`` key that takes a byte count uses.

``--json`` documents never use these: they carry raw numbers in the unit their key names (``*_us``, ``bytes``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

__all__ = ["fit_label", "format_bytes", "format_in", "format_us", "has_size_unit", "parse_bytes", "time_unit"]

_KIB, _MIB, _GIB, _TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_SIZE_UNITS = {"": 1, "b": 1, "k": _KIB, "kb": _KIB, "kib": _KIB, "m": _MIB, "mb": _MIB, "mib": _MIB, "g": _GIB,
               "gb": _GIB, "gib": _GIB, "t": _TIB, "tb": _TIB, "tib": _TIB}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes from ``1024``, ``1KiB``, ``64MiB``, ``1.5GiB`` (K, KB and KiB are all binary: 1 KiB = 1024 B).

    Raises:
        ValueError: not a size, or not a whole number of bytes (the message says which).
    """
    m = _SIZE_RE.match(text) if isinstance(text, str) else None
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError("not a size (e.g. 4096, 1KiB, 64MiB, 1GiB)")
    n = float(m.group(1)) * _SIZE_UNITS[unit]
    if n != int(n):
        raise ValueError("not a whole number of bytes")
    return int(n)


def has_size_unit(text: str) -> bool:
    """Whether ``text`` reads as a size with a unit (``1MiB``; a bare number does not)."""
    m = _SIZE_RE.match(text) if isinstance(text, str) else None
    return m is not None and m.group(2).lower() in _SIZE_UNITS and m.group(2) != ""

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
