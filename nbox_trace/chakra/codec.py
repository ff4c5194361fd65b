"""Streaming reader and atomic writer for Chakra ET files.

Wire format (``../shared/chakra-format.md``): a bare stream of messages, each preceded by its
length as a base-128 varint (protobuf's "delimited" framing); first one ``GlobalMetadata``, then
``Node`` messages until end of file. Chakra's Python reader also accepts gzip, and so does this one
(detected by the gzip magic bytes, never by the file name).

Every byte is untrusted: the reader caps the size of one message and the inflated size of a gzip
stream, checks varints and enum values, and raises :class:`~nbox_trace.errors.TraceDecodeError` naming
the file, the byte offset and the node index. A zero-length message is *not* end of file (that is
the Chakra reader's bug that silently drops every later node): it is skipped and recorded in
:attr:`EtReader.zero_length_messages` so validation can report it.

Memory is constant in the file size: the reader holds one read chunk plus the message being parsed.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.errors import TraceDecodeError, TraceLimitError, TraceWriteError

Node = pb.Node
GlobalMetadata = pb.GlobalMetadata

#: Default cap on one message (bytes). Real nodes are < 100 KiB; 64 MiB leaves room for huge
#: IOInfo strings while refusing a length prefix that would make us allocate gigabytes.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: Default cap on the inflated size of a gzip trace (bytes): refuses gzip bombs.
DEFAULT_MAX_INFLATED_BYTES = 16 << 30
#: Highest NodeType value any Chakra schema defines (drafts add 8-10 after COMM_COLL_NODE = 7).
MAX_KNOWN_NODE_TYPE = 10
#: NodeType values of the stable schema that nbox understands.
STABLE_NODE_TYPES = frozenset(pb.NodeType.values())

_CHUNK_BYTES = 1 << 20
_GZIP_PIECE = 64 << 10
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ZeroLengthMessage:
    """A zero-length message met while reading (an empty node; Chakra's reader stops there)."""

    offset: int
    node_index: int


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _StreamError(Exception):
    """Raised by :class:`_CappedReader`; EtReader turns it into a TraceDecodeError with the position."""

    def __init__(self, reason: str, *, limit: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit


class _CappedReader(io.RawIOBase):
    """Wraps a decompressing stream; raises once more than ``cap`` bytes came out of it.

    Inflates in pieces of ``_GZIP_PIECE`` bytes so that a corrupt or truncated stream costs at most
    one piece: what inflated cleanly before the damage is returned first (its nodes are read), and
    the error is raised on the next call.
    """

    def __init__(self, inner: _Readable, cap: int) -> None:
        self._inner = inner
        self._cap = cap
        self._pending: _StreamError | None = None
        self.total = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._pending is not None:
            raise self._pending
        pieces: list[bytes] = []
        got = 0
        while got < size:
            try:
                data = self._inner.read(min(_GZIP_PIECE, size - got))
            except (OSError, EOFError, zlib.error) as exc:
                err = _StreamError(f"corrupt or truncated gzip stream after {self.total} inflated bytes: {exc}")
                if not pieces:
                    raise err from exc
                self._pending = err
                break
            if not data:
                break
            self.total += len(data)
            if self.total > self._cap:
                raise _StreamError(f"gzip stream inflates past the cap of {self._cap} bytes (max_inflated_bytes)",
                                   limit=True)
            pieces.append(data)
            got += len(data)
        return b"".join(pieces)


class EtReader:
    """Iterate the nodes of one Chakra ET file, in file order, in constant memory.

    Use as a context manager (or call :meth:`close`)::

        with EtReader("trace.0.et") as reader:
            print(reader.metadata.version)
            for node in reader:
                ...

    Args:
        path: the ``.et`` file (raw or gzip-compressed).
        max_message_bytes: cap on one message's length prefix; larger raises TraceLimitError.
        max_inflated_bytes: cap on a gzip stream's inflated size; larger raises TraceLimitError.

    Raises:
        TraceDecodeError: the file cannot be opened or decoded (also while iterating).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    ) -> None:
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes}")
        if max_inflated_bytes <= 0:
            raise ValueError(f"max_inflated_bytes must be > 0, got {max_inflated_bytes}")
        self.path = str(path)
        self.max_message_bytes = max_message_bytes
        self.compressed = False
        #: Zero-length messages skipped so far (each one an empty node in the file).
        self.zero_length_messages: list[ZeroLengthMessage] = []
        #: Number of node messages read so far (zero-length ones included).
        self.messages_read = 0
        self._buf = b""
        self._pos = 0
        self._base = 0  # stream offset of self._buf[0]
        self._eof = False
        self._frame_index = -1  # node index of the frame being read, for errors raised while refilling
        self._iterating = False
        try:
            raw: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise TraceDecodeError(self.path, f"cannot open: {exc.strerror or exc}") from exc
        self._raw = raw
        self._stream: _Readable = raw
        try:
            head = raw.read(2)
            raw.seek(0)
            if head == _GZIP_MAGIC:
                self.compressed = True
                self._stream = _CappedReader(gzip.GzipFile(fileobj=raw, mode="rb"), max_inflated_bytes)
            self.metadata = self._read_metadata()
        except BaseException:
            self.close()
            raise

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> EtReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying file. Safe to call twice."""
        self._raw.close()

    # -- low-level framing -----------------------------------------------------------------
    def _fill(self, need: int) -> bool:
        """Make at least ``need`` unread bytes available; False if the stream ends first."""
        while len(self._buf) - self._pos < need:
            if self._eof:
                return False
            try:
                chunk = self._stream.read(max(_CHUNK_BYTES, need))
            except _StreamError as exc:
                cls = TraceLimitError if exc.limit else TraceDecodeError
                raise cls(self.path, exc.reason, offset=self._base + len(self._buf),
                          node_index=self._frame_index) from exc
            if not chunk:
                self._eof = True
                return False
            self._base += self._pos
            self._buf = self._buf[self._pos :] + chunk
            self._pos = 0
        return True

    def _next_frame(self, node_index: int) -> tuple[int, bytes] | None:
        """Read one length-delimited message: (offset, payload), or None at a clean end of file."""
        self._frame_index = node_index
        if not self._fill(1):
            return None
        offset = self._base + self._pos
        # Varint: at most 10 bytes; a 64-bit length is nonsense anyway and hits the cap.
        length = 0
        shift = 0
        for i in range(10):
            if not self._fill(i + 1):
                raise TraceDecodeError(self.path, "truncated length prefix (varint) at end of file",
                                       offset=offset, node_index=node_index)
            byte = self._buf[self._pos + i]
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                self._pos += i + 1
                break
        else:
            raise TraceDecodeError(self.path, "length prefix (varint) longer than 10 bytes",
                                   offset=offset, node_index=node_index)
        if length > self.max_message_bytes:
            raise TraceLimitError(
                self.path,
                f"message length {length} exceeds the cap of {self.max_message_bytes} bytes (max_message_bytes)",
                offset=offset, node_index=node_index,
            )
        if not self._fill(length):
            remaining = len(self._buf) - self._pos
            raise TraceDecodeError(
                self.path,
                f"message length {length} runs past end of file ({remaining} bytes remain): truncated file",
                offset=offset, node_index=node_index,
            )
        payload = self._buf[self._pos : self._pos + length]
        self._pos += length
        return offset, payload

    def _read_metadata(self) -> pb.GlobalMetadata:
        frame = self._next_frame(-1)
        if frame is None:
            raise TraceDecodeError(self.path, "empty file: no GlobalMetadata message", offset=0, node_index=-1)
        offset, payload = frame
        try:
            return pb.GlobalMetadata.FromString(payload)
        except Exception as exc:  # any parser failure on untrusted bytes is a decode error
            raise TraceDecodeError(self.path, f"GlobalMetadata does not decode: {exc}",
                                   offset=offset, node_index=-1) from exc

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[pb.Node]:
        if self._iterating:
            raise RuntimeError(f"{self.path}: an EtReader can be iterated only once")
        self._iterating = True
        return self._nodes()

    def _nodes(self) -> Iterator[pb.Node]:
        parse = pb.Node.FromString
        max_type = MAX_KNOWN_NODE_TYPE
        max_len = self.max_message_bytes
        index = 0
        # The buffer state lives in locals and is written back to self only around _next_frame,
        # the one place besides this loop that reads or changes it. `pos` is the start of the
        # current frame (its length prefix) until the frame is done, `stop` the end of it.
        buf = self._buf
        pos = self._pos
        end = len(buf)
        base = self._base
        while True:
            # Fast path, inlined: a 1- or 2-byte length prefix (messages < 16 KiB) within the cap and
            # the whole message already buffered. Everything else (refills, longer prefixes, over the
            # cap, truncation, end of file) goes through _next_frame, which raises all the errors.
            if pos < end:
                length = buf[pos]
                if length < 0x80:
                    start = pos + 1
                elif pos + 1 < end and buf[pos + 1] < 0x80:
                    length = (length & 0x7F) | (buf[pos + 1] << 7)
                    start = pos + 2
                else:
                    start = end + 1
                stop = start + length
            else:
                stop = end + 1
            if stop <= end and length <= max_len:
                payload = buf[start:stop]
            else:
                self._pos = pos
                frame = self._next_frame(index)
                if frame is None:
                    return
                offset, payload = frame
                length = len(payload)
                buf = self._buf
                end = len(buf)
                base = self._base
                stop = self._pos
                pos = offset - base  # may be < 0 when a refill dropped the prefix; only summed
            self.messages_read = index + 1
            if length == 0:
                self.zero_length_messages.append(ZeroLengthMessage(base + pos, index))
                index += 1
                pos = stop
                continue
            try:
                node = parse(payload)
            except Exception as exc:  # any parser failure on untrusted bytes is a decode error
                raise TraceDecodeError(self.path, f"node does not decode: {exc}",
                                       offset=base + pos, node_index=index) from exc
            if not 0 <= node.type <= max_type:
                raise TraceDecodeError(
                    self.path,
                    f"node id {node.id}: NodeType {node.type} is not defined by any Chakra schema "
                    f"(known: 0-{max_type})",
                    offset=base + pos, node_index=index,
                )
            index += 1
            pos = stop
            yield node


def read_et(
    path: str | os.PathLike[str], *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """Read a whole ET file into memory: ``(metadata, nodes)``. For big files iterate an EtReader."""
    with EtReader(path, max_message_bytes=max_message_bytes) as reader:
        return reader.metadata, list(reader)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_VARINTS = [_varint(i) for i in range(1 << 14)]


def encode_delimited(message: pb.Node | pb.GlobalMetadata) -> bytes:
    """One message with its varint length prefix, as it appears in an ET file."""
    body = message.SerializeToString()
    n = len(body)
    return (_VARINTS[n] if n < 16384 else _varint(n)) + body


class EtWriter:
    """Write one Chakra ET file atomically: to a temporary name, renamed on successful close.

    Enforces what consumers rely on: node ids unique and strictly increasing, and no node without a
    name and a type (an all-default node serializes to zero bytes, which Chakra's reader takes for
    end of file). Leaving the ``with`` block through an exception deletes the temporary file, so an
    interrupted write never leaves a half-written trace under the final name.

    Args:
        path: the final ``.et`` path.
        metadata: the GlobalMetadata message written first.
        compress: gzip the stream (Chakra's Python reader accepts it; ASTRA-sim's newest feeder
            does not, so the default is off).
    """

    def __init__(self, path: str | os.PathLike[str], metadata: pb.GlobalMetadata, *, compress: bool = False) -> None:
        self.path = Path(path)
        self._last_id: int | None = None
        self.nodes_written = 0
        self._closed = False
        self._aborted = False
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise TraceWriteError(f"{self.path}: cannot create a file in {directory}: {exc.strerror or exc}") from exc
        self._tmp = Path(tmp)
        os.chmod(fd, _FILE_MODE)  # mkstemp makes 0600; a trace is meant to be shared
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self._out: BinaryIO | gzip.GzipFile = (
            gzip.GzipFile(fileobj=self._file, mode="wb", mtime=0) if compress else self._file
        )
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._emit(encode_delimited(metadata))

    def _emit(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= _CHUNK_BYTES:
            self._flush_pending()

    def _flush_pending(self) -> None:
        try:
            self._out.write(b"".join(self._pending))
        except OSError as exc:
            self.abort()
            raise TraceWriteError(f"{self.path}: write failed: {exc.strerror or exc}") from exc
        self._pending.clear()
        self._pending_bytes = 0

    def write(self, node: pb.Node) -> None:
        """Append one node. Raises TraceWriteError for an out-of-order id or an empty node."""
        self.write_all((node,))

    def write_all(self, nodes: Iterable[pb.Node]) -> None:
        """Append nodes in order (faster than calling :meth:`write` per node)."""
        if self._closed:
            raise TraceWriteError(f"{self.path}: writer is closed")
        # The hot loop keeps its state in locals; the finally block writes it back, also when a
        # check below raises or the iterable itself fails, so the writer stays consistent.
        # Ids are uint64, so -1 stands for "no node written yet".
        last = -1 if self._last_id is None else self._last_id
        append = self._pending.append
        varints = _VARINTS
        invalid = pb.INVALID_NODE
        # Unbound: looking the method up on each upb message goes through its field lookup first.
        serialize = pb.Node.SerializeToString
        chunk = _CHUNK_BYTES
        size = self._pending_bytes
        written = self.nodes_written
        try:
            for node in nodes:
                nid = node.id
                if nid <= last:
                    raise TraceWriteError(
                        f"{self.path}: node id {nid} written after id {last}: ids must be unique and increasing"
                    )
                if not node.name or node.type == invalid:
                    raise TraceWriteError(
                        f"{self.path}: node id {nid} has no name or no type (INVALID_NODE): "
                        "refusing to write an empty node"
                    )
                body = serialize(node)
                n = len(body)
                append(varints[n] if n < 16384 else _varint(n))
                append(body)
                size += n + 2
                last = nid
                written += 1
                if size >= chunk:
                    self._pending_bytes = size
                    self._flush_pending()
                    size = 0
        finally:
            self._pending_bytes = size
            self._last_id = None if last < 0 else last
            self.nodes_written = written

    def close(self) -> Path:
        """Flush, fsync and rename into place; return the final path."""
        if self._aborted:
            raise TraceWriteError(f"{self.path}: writer was aborted; nothing was written")
        if self._closed:
            return self.path
        self._flush_pending()
        try:
            if self._out is not self._file:
                self._out.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self.abort()
            raise TraceWriteError(f"{self.path}: cannot finish writing: {exc.strerror or exc}") from exc
        self._closed = True
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; the final path is left untouched."""
        self._closed = True
        self._aborted = True
        try:
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> EtWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_et(
    path: str | os.PathLike[str], metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node], *, compress: bool = False
) -> Path:
    """Write a whole ET file atomically; return its path."""
    with EtWriter(path, metadata, compress=compress) as writer:
        writer.write_all(nodes)
    return writer.path
