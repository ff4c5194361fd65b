"""Read one untrusted JSON file (plain or gzip) with a size cap.

The converter's inputs (host ET, Kineto trace, ``collectives.json``) come from other processes and
other tools, so every read is capped: a plain file by its size on disk, a gzip file by the number of
bytes it inflates to (read in pieces, so a gzip bomb costs at most the cap plus one piece). Gzip is
recognized by its magic bytes, never by the file name. Nothing is evaluated or unpickled: the bytes
go to :func:`json.loads` and nothing else. Every failure is an :class:`~nbox_trace.errors.InvalidInputError`
(or :class:`~nbox_trace.errors.InputNotFoundError`) whose message starts with the file name.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from nbox_trace.errors import InputNotFoundError, InvalidInputError

#: Default cap on the (inflated) size of one JSON input: 1 GiB. A host ET of a large model is a few
#: hundred MB; Python objects take ~10x the text, so more than this would not fit in memory anyway.
DEFAULT_MAX_JSON_BYTES = 1 << 30

_GZIP_MAGIC = b"\x1f\x8b"
_PIECE = 1 << 20


def read_capped_bytes(path: Path, *, max_bytes: int, what: str) -> bytes:
    """The (inflated) bytes of ``path``, refusing more than ``max_bytes``.

    Raises:
        InputNotFoundError: no such file.
        InvalidInputError: unreadable, corrupt gzip, or over the cap.
    """
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            if head != _GZIP_MAGIC:
                size = Path(path).stat().st_size
                if size > max_bytes:
                    raise InvalidInputError(f"{path}: {what} is {size} bytes, over the cap of {max_bytes} bytes")
                return raw.read()
            pieces: list[bytes] = []
            total = 0
            with gzip.GzipFile(fileobj=raw, mode="rb") as inflated:
                while True:
                    piece = inflated.read(min(_PIECE, max_bytes + 1 - total))
                    if not piece:
                        break
                    total += len(piece)
                    if total > max_bytes:
                        raise InvalidInputError(
                            f"{path}: {what} inflates to more than the cap of {max_bytes} bytes (gzip)")
                    pieces.append(piece)
            return b"".join(pieces)
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: {what} not found") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidInputError(f"{path}: cannot read the {what}: {exc}") from None


def load_json(path: Path, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES, what: str = "JSON file") -> Any:
    """Parse one JSON file (plain or gzip) under a size cap; see the module docstring.

    Raises:
        InputNotFoundError, InvalidInputError: the message names the file.
    """
    data = read_capped_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digits
        raise InvalidInputError(f"{path}: {what} is not valid JSON: {type(exc).__name__}: {str(exc)[:160]}") from None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A small JSON object that one of nbox's own worker processes wrote (a result or an error file), or None when
    it is missing, unreadable or not an object: the caller then reports the run as failed."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
