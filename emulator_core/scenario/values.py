"""Scenario validation: the one error type (:class:`ScenarioError`, naming the key path and the bad value) and
the small checkers every scenario table uses (integers, finite floats, choices, unknown keys, removed keys).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nbox_trace.errors import InvalidInputError

#: Largest world size accepted (2^24 ranks); a guard against typos, far above any real cluster.
MAX_WORLD_SIZE = 1 << 24

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

_T = TypeVar("_T")


class ScenarioError(InvalidInputError):
    """A scenario file, override or value is invalid.

    Attributes:
        key: the key path (``topology.dims[1].bandwidth_gbps``), or ``""`` when not tied to a key.
        reason: what is wrong, without the key or file.
        file: the scenario file, or ``None``.
        value: the offending value as written in the message (``None`` when there is none).
    """

    def __init__(self, key: str, reason: str, *, value: Any = None, has_value: bool = False,
                 file: str | None = None) -> None:
        self.key = key
        self.reason = reason
        self.value = value
        self.has_value = has_value
        self.file = file
        where = key + (f" = {fmt(value)}" if has_value else "")
        msg = f"{where}: {reason}" if where else reason
        super().__init__(f"{file}: {msg}" if file else msg)

    def prefixed(self, prefix: str) -> ScenarioError:
        """The same error with ``prefix`` put before the key path (``topology.dims[1].`` + ``size``)."""
        return ScenarioError(prefix + self.key if self.key else prefix.rstrip("."), self.reason, value=self.value,
                             has_value=self.has_value, file=self.file)

    def in_file(self, file: str) -> ScenarioError:
        """The same error, naming ``file``."""
        return ScenarioError(self.key, self.reason, value=self.value, has_value=self.has_value, file=file)


def fmt(value: Any) -> str:
    if isinstance(value, str):
        return quote_toml_string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def parse_tables(key: str, tables: list[Any], parse: Callable[[Any], _T]) -> list[_T]:
    """Parse an array of tables element by element; an error gets the element's path (``key[i].``)."""
    out = []
    for i, table in enumerate(tables):
        try:
            out.append(parse(table))
        except ScenarioError as e:
            raise e.prefixed(f"{key}[{i}].") from None
    return out


def bad(key: str, value: Any, reason: str) -> ScenarioError:
    return ScenarioError(key, reason, value=value, has_value=True)


def check_int(key: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(key, value, "must be an integer")
    if value < lo:
        raise bad(key, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        raise bad(key, value, f"must be <= {hi}")
    return value


def check_float(key: str, value: Any, *, gt: float | None = None, ge: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(key, value, "must be a number")
    v = float(value)
    if not math.isfinite(v):
        raise bad(key, value, "must be finite")
    if gt is not None and not v > gt:
        raise bad(key, value, f"must be > {gt:g}")
    if ge is not None and not v >= ge:
        raise bad(key, value, f"must be >= {ge:g}")
    return v


def choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise bad(key, value, f"must be one of {', '.join(repr(a) for a in allowed)}")
    return value


#: Keys nbox once read and no longer models, with why: a file that still has one is refused with that reason
#: rather than read as if the key acted. The token-bucket burst credit (a ``tc tbf`` shaper's refilled bucket,
#: with its per-collective rest shares) and the calibrated jitter (a collective's measured spread, ``jitter_us``,
#: played at a drawn quantile when ``jitter = "calibrated"``) moved no real model's predicted iteration enough to
#: keep; nor did ``compute_noise`` (emulated ranks replaying their mirror's earlier iterations in ``nbox emulate``)
#: with its seed, ``noise_seed``, and ``jitter_seed``, its seed before.
REMOVED_KEYS = {**{k: "the token-bucket burst credit is no longer modeled; delete this key"
                   for k in ("burst_bytes", "rest_factor", "apart_rest_factor")},
                **{k: "the calibrated jitter is no longer modeled; delete this key" for k in ("jitter", "jitter_us")},
                **{k: "emulated ranks' compute noise is no longer modeled; delete this key"
                   for k in ("compute_noise", "noise_seed", "jitter_seed")}}


def check_table(key: str, d: Any, allowed: Sequence[str], required: Sequence[str] = ()) -> None:
    """``d`` is a table holding only ``allowed`` keys and every ``required`` one (errors name the first wrong key;
    a key of :data:`REMOVED_KEYS` is refused with its reason)."""
    if not isinstance(d, dict):
        raise bad(key, d, "must be a table") if key else ScenarioError("", f"must be a table, not {fmt(d)}")
    for k in d:
        if k not in allowed:
            path = f"{key}.{k}" if key else str(k)
            if k in REMOVED_KEYS:
                raise ScenarioError(path, f"removed key: {REMOVED_KEYS[k]}")
            raise ScenarioError(path, f"unknown key (allowed: {', '.join(allowed)})")
    missing = [k for k in required if k not in d]
    if missing:
        raise ScenarioError(missing[0], f"missing (required keys: {', '.join(required)})")


def quote_toml_string(s: str) -> str:
    """``s`` as a TOML basic string (double quotes; quotes, backslashes and control characters escaped)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
