"""Writing an output file so that it is never seen half-written: the one atomic writer of nbox.

The data goes to a temporary file in the target's folder (so the rename cannot cross file systems), is
optionally fsynced, and is renamed over the target; on any failure the temporary file is removed and the
target is left as it was. The result has mode 0644 like any shared output (``mkstemp`` creates 0600).

Used by every writer of a single file: the in-rank capture's JSON files, calibrated scenarios, timelines,
sweep tables and plots. A bundle is a directory: :func:`nbox_trace.bundle.staged_directory` stages it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from nbox_trace.errors import OutputWriteError

__all__ = ["write_atomic", "write_json_atomic"]


def write_atomic(path: Path, data: bytes | str, *, durable: bool = False,
                 error: type[OutputWriteError] = OutputWriteError) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` via a temporary file and a rename; create missing folders.

    Args:
        durable: fsync the file before the rename (for files a crash must not lose, such as a rank's error).
        error: the :class:`OutputWriteError` subclass to raise, so a command's own error names its output.

    Raises:
        OutputWriteError (or ``error``): the folder or the file cannot be written; the message names the path.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise error(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(f"{path}: cannot write: {exc.strerror or exc}") from None
        raise
    return path


def write_json_atomic(path: Path, obj: object, *, durable: bool = False, indent: int | None = 1) -> Path:
    """Write ``obj`` as strict JSON (no NaN or infinity: ``ValueError``) with :func:`write_atomic`."""
    separators = (",", ":") if indent is None else None
    return write_atomic(path, json.dumps(obj, indent=indent, allow_nan=False, separators=separators), durable=durable)
