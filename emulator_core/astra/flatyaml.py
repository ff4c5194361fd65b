"""The flat YAML of ASTRA-sim's analytical network configs, both ways, without a YAML library.

ASTRA-sim's network files (``examples/network/analytical/*.yml``, ``inputs/network/*.yml``) use one small
subset of YAML: ``key: [ a, b, c ]`` or ``key: scalar`` at the start of a line, ``#`` comments, blank lines. This
reader accepts exactly that and refuses everything else (indentation, block lists, maps, anchors, tags,
multi-line values, documents) with an error naming the file and line, so every byte is treated as untrusted:
the file is capped at :data:`MAX_YAML_BYTES`, a token at :data:`MAX_TOKEN_CHARS` characters.

Scalars are typed as YAML 1.2's core schema does for these files: a decimal integer is an ``int``, a decimal or
exponent number a ``float``; a plain word (``Ring``, ``tbd``) or a quoted string without escapes is a ``str``.
``.inf``, ``.nan``, hex and octal are refused; ``true``/``null`` stay words (the caller refuses them as numbers).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from emulator_core.scenario import ScenarioError
from nbox_trace.jsonio import read_capped_bytes

__all__ = ["MAX_TOKEN_CHARS", "MAX_YAML_BYTES", "format_flat_yaml_list", "read_flat_yaml"]

#: Largest network config read (ASTRA-sim's own are under 1 KiB).
MAX_YAML_BYTES = 1 << 20
#: Longest scalar accepted.
MAX_TOKEN_CHARS = 64

_KEY_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)[ \t]*:(?:[ \t]+(.*))?")
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.+-]*")
_UNSUPPORTED_START = "{-&*!|>%@`?,"


def _err(path: Path, line: int, reason: str) -> ScenarioError:
    return ScenarioError("", reason, file=f"{path}:{line}")


def _strip_comment(text: str) -> str:
    """``text`` without its ``#`` comment: a ``#`` at the start or after a blank, outside quotes."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i]
    return text


def _scalar(token: str, path: Path, line: int) -> Any:
    if not token:
        raise _err(path, line, "an empty entry (write every value, separated by commas)")
    if len(token) > MAX_TOKEN_CHARS:
        raise _err(path, line, f"a value of {len(token)} characters (at most {MAX_TOKEN_CHARS})")
    if token[0] in "\"'":
        if len(token) < 2 or token[-1] != token[0] or token[0] in token[1:-1] or "\\" in token:
            raise _err(path, line, f"{token}: a quoted string must close on its line, without escapes")
        return token[1:-1]
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token)
    if _WORD.fullmatch(token):
        return token
    raise _err(path, line, f"{token!r} is neither a number nor a plain word (this reader takes ASTRA-sim's "
                           f"flat subset of YAML only)")


def _value(text: str, path: Path, line: int) -> Any:
    if text[0] in _UNSUPPORTED_START or text.startswith(("---", "...")):
        raise _err(path, line, f"{text[:20]!r}: not supported (this reader takes ASTRA-sim's flat subset of YAML: "
                               f"key: [ a, b ] or key: value)")
    if text[0] != "[":
        return _scalar(text, path, line)
    if text[-1] != "]":
        raise _err(path, line, "a [ list ] must close on its own line")
    inner = text[1:-1].strip()
    if not inner:
        return []
    if "[" in inner or "]" in inner:
        raise _err(path, line, "nested lists are not supported")
    return [_scalar(tok.strip(), path, line) for tok in inner.split(",")]


def read_flat_yaml(path: Path) -> dict[str, tuple[Any, int]]:
    """The keys of a flat YAML file, each with its value (a scalar or a list of scalars) and 1-based line.

    Raises:
        InputNotFoundError: no such file.
        InvalidInputError: unreadable or over :data:`MAX_YAML_BYTES`.
        ScenarioError: anything outside the subset; the message names the file and line.
    """
    data = read_capped_bytes(path, max_bytes=MAX_YAML_BYTES, what="ASTRA-sim network config")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ScenarioError("", f"not UTF-8 text (byte {e.start})", file=str(path)) from None
    out: dict[str, tuple[Any, int]] = {}
    for n, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        bad = next((ch for ch in raw if (ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F), None)
        if bad is not None:
            raise _err(path, n, f"control character U+{ord(bad):04X}: not a text config")
        body = _strip_comment(raw).rstrip()
        if not body.strip():
            continue
        if body[0] in " \t":
            raise _err(path, n, "an indented line: nested YAML is not supported (ASTRA-sim's network config is "
                                "flat: key: [ values ])")
        m = _KEY_LINE.fullmatch(body)
        if m is None:
            raise _err(path, n, f"{body[:40]!r}: not a 'key: value' line")
        key, value = m.group(1), (m.group(2) or "").strip()
        if not value:
            raise _err(path, n, f"{key}: no value (nested YAML is not supported)")
        if key in out:
            raise _err(path, n, f"{key}: given twice (first on line {out[key][1]})")
        out[key] = (_value(value, path, n), n)
    return out


def format_flat_yaml_list(key: str, values: list[Any], comment: str = "") -> str:
    """One ``key: [ a, b ]  # comment`` line as ASTRA-sim writes them (floats with ``repr``, words bare)."""
    items = ", ".join(repr(v) if isinstance(v, float) else str(v) for v in values)
    return f"{key}: [ {items} ]" + (f"  # {comment}" if comment else "")
