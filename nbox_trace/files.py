"""Writing an output file so that it is never seen half-written: the one atomic writer of nbox.

The data goes to a temporary file in the target's folder (so the rename cannot cross file systems), is
optionally fsynced, and is renamed over the target; on any failure the temporary file is removed and the
target is left as it was. The result has mode 0644 like any shared output (``mkstemp`` creates 0600).

Used by every writer of a single file: the in-rank capture's JSON files, calibrated scenarios, timelines,
sweep tables and plots. A bundle is a directory: :func:`nbox_trace.bundle.manifest.staged_directory` stages it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nbox_trace.errors import OutputWriteError, UsageError

__all__ = ["Output", "as_paths", "check_outputs", "write_atomic", "write_json_atomic"]


def as_paths(config: object, *names: str) -> None:
    """Turn the ``str`` values of a frozen config's path fields ``names`` into ``Path`` (a library caller's str,
    where the CLI passes a Path), so a missing file is the usual error naming it, never an AttributeError."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, str):
            object.__setattr__(config, name, Path(value))


@dataclass(frozen=True)
class Output:
    """One output a command will write, as the user named it.

    Attributes:
        flag: the option as typed (``--out``, ``-o``, ``--save-key``), for the message.
        path: where it goes (None: not asked for; skipped).
        kind: ``"dir"`` (a folder written into or created), or ``"file"`` (one file).
        overwrite: None: an existing output of the right kind is replaced or written into (timelines, a sweep's
            CSV, a calibrated TOML); False: it must not exist (a bundle, an archive, a key without
            ``--overwrite``); True: it may exist and is replaced.
    """

    flag: str
    path: Path | None
    kind: str = "file"
    overwrite: bool | None = None


def check_outputs(outputs: Sequence[Output], *, inputs: Sequence[Path | None] = ()) -> None:
    """The one check, before anything is written or run, that every output can be written where the user asked:
    an existing file where a folder is needed (or a folder where a file is), a parent that is a file, an
    existing output without ``--overwrite``, two outputs at the same path, an output that is one of the
    ``inputs`` (or, when the output is replaced as a whole, holds one). Commands call it first, so a clash
    never leaves half the outputs written.

    Raises:
        UsageError: a clash; the message names the flag as typed and the path.
        OutputWriteError: an output that exists, without ``--overwrite`` (the message names ``--overwrite``).
    """
    seen: dict[Path, str] = {}
    ins = [(Path(i).resolve(), Path(i)) for i in inputs if i is not None]
    for out in outputs:
        if out.path is None:
            continue
        path = Path(out.path)
        where = f"{out.flag} {path}"
        if out.kind == "dir" and path.exists() and not path.is_dir():
            raise UsageError(f"{where}: is an existing file, but a folder is needed here")
        if out.kind == "file" and path.is_dir():
            raise UsageError(f"{where}: is an existing folder, but a file is needed here")
        parent = next((a for a in path.absolute().parents if a.exists()), None)
        if parent is not None and not parent.is_dir():
            raise UsageError(f"{where}: {parent} is a file, so nothing can be written under it")
        real = path.resolve()
        if real in seen:
            raise UsageError(f"{where}: {seen[real]} names the same path; give each output its own")
        seen[real] = out.flag
        for resolved, given in ins:
            if real == resolved or (out.overwrite is not None and resolved.is_relative_to(real)):
                what = "is" if real == resolved else "holds"
                raise UsageError(f"{where}: {what} the input {given}; writing there would replace or alter it "
                                 f"(name another path)")
    for out in outputs:  # last, worded as the bundle writers word it (exit 5): every clash above is named first
        if out.path is not None and out.overwrite is False and (Path(out.path).exists() or Path(out.path).is_symlink()):
            raise OutputWriteError(f"{out.path}: already exists (use --overwrite to replace it)")


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
