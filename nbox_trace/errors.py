"""The one exception family of nbox.

The library raises only :class:`NboxError` subclasses for anything a user can cause (bad files,
bad arguments, limits). Only the CLI (``nbox/cli/``) turns them into a one- or two-line message and an
exit code; each class carries the exit code the CLI uses, documented in docs/output.md:

====  =========================================================================
code  meaning
====  =========================================================================
0     success
1     the command ran and found problems (``--strict``), or a check failed
2     usage error: a bad flag or argument, raised by the CLI parser or as :class:`UsageError`
3     invalid input: a trace, bundle or config that cannot be decoded or breaks a limit
4     input not found: a path that does not exist or holds no trace
5     output could not be written
====  =========================================================================
"""

from __future__ import annotations


class NboxError(Exception):
    """Base class of every error nbox raises on purpose."""

    exit_code: int = 1


class UsageError(NboxError):
    """An invalid option, value of an option, or combination of options: the message names the flag as typed
    (``--clock``, ``--overwrite``), so the user can fix the command line. Exit code 2, like the parser's own errors.
    """

    exit_code = 2


class InputNotFoundError(NboxError):
    """A path given by the user does not exist, or holds no trace files."""

    exit_code = 4


class InvalidInputError(NboxError):
    """Input that exists but cannot be used: undecodable, malformed, or over a limit."""

    exit_code = 3


class TraceDecodeError(InvalidInputError):
    """A Chakra ET file could not be decoded.

    Attributes:
        path: the file.
        offset: byte offset of the failing message's length prefix (in the decompressed
            stream for a gzip file), or ``None`` when not tied to a position.
        node_index: 0-based index of the node message (the GlobalMetadata message is index -1),
            or ``None``.
    """

    def __init__(self, path: str, reason: str, *, offset: int | None = None, node_index: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.offset = offset
        self.node_index = node_index
        where = []
        if offset is not None:
            where.append(f"byte offset {offset}")
        if node_index is not None:
            where.append("GlobalMetadata message" if node_index < 0 else f"node index {node_index}")
        loc = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{path}{loc}: {reason}")


class TraceLimitError(TraceDecodeError):
    """A trace breaks a safety cap (message size, inflated size): refused, not read further."""


class TraceValueError(InvalidInputError):
    """A decoded node carries a value nbox cannot use (e.g. an enum value out of range)."""


class TraceWriteError(NboxError):
    """A trace could not be written, or the caller asked to write an invalid node."""

    exit_code = 5


class OutputWriteError(NboxError):
    """An output file or folder could not be written (see :func:`nbox_trace.files.write_atomic`)."""

    exit_code = 5
