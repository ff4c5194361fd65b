"""One portable file for a bundle: a gzip-compressed POSIX ustar stream (``.nbox``).

Members: ``manifest.json`` first (its bytes as they are in the bundle), then every file the manifest
lists, in manifest order. Only regular-file members; directories are implied by the paths. Writing is
reproducible: mtime 0, uid/gid 0, no user or group names, mode 0644, gzip mtime 0 and no file name in
the gzip header, a fixed compression level; the stream is padded to whole 10240-byte tar records.

The ustar code here is our own, small and strict. Reading treats every byte as untrusted: members are
read one by one from a streaming gzip reader in chunks of at most 1 MiB, the decompressed bytes
actually read are counted against a cap (a gzip bomb is stopped by the count, not by what a header
claims), each member must be listed in the manifest with the size the header gives, and its sha256 is
streamed and compared. Files land in a temporary directory beside the target, created with
``O_CREAT | O_EXCL | O_NOFOLLOW``, which is renamed into place only when everything checked out; on
any error it is removed, so nothing is left behind. All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nbox_trace.bundle.manifest import (
    MANIFEST_NAME,
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    BundleError,
    BundleWriteError,
    FileEntry,
    Manifest,
    parse_manifest,
    staged_directory,
    verify_files,
)
from nbox_trace.errors import InputNotFoundError, InvalidInputError

ARCHIVE_SUFFIX = ".nbox"
BLOCK = 512
#: Tar record: the stream is padded to a multiple of this (what tar itself writes).
RECORD = 20 * BLOCK
#: Largest read from the gzip stream and largest write, in bytes.
CHUNK = 1 << 20
#: Zero bytes tolerated after the end-of-archive marker (record padding is at most RECORD - 2 * BLOCK).
MAX_TRAILING_BYTES = 1 << 20
#: Longest member name (ustar ``prefix`` 155 + ``/`` + ``name`` 100, minus the split), in UTF-8 bytes.
MAX_NAME_BYTES = 255
#: Largest size a ustar size field holds (11 octal digits).
MAX_USTAR_SIZE = 0o77777777777
COMPRESSLEVEL = 9
_MAGIC = b"ustar\x0000"
_TYPE_NAMES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
               b"5": "directory", b"6": "fifo", b"7": "contiguous file", b"x": "pax extended header",
               b"g": "pax global header", b"L": "GNU long name", b"K": "GNU long link name",
               b"S": "GNU sparse file", b"V": "volume label", b"M": "GNU multi-volume continuation"}


class ArchiveError(BundleError):
    """A hostile or malformed archive; the message names the archive, the member and the reason."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps applied while unpacking (bytes, except ``max_members``).

    ``max_stream_bytes`` caps every decompressed byte read (headers, padding, data); ``None`` derives
    it from ``max_total_bytes`` plus a header and padding per member and the end-of-archive slack.
    """

    max_members: int = MAX_FILES + 1
    max_member_bytes: int = 4 << 30
    max_total_bytes: int = 16 << 30
    max_stream_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_members", "max_member_bytes", "max_total_bytes", "max_stream_bytes"):
            value = getattr(self, name)
            if value is None and name == "max_stream_bytes":
                continue
            if type(value) is not int or value <= 0:
                raise InvalidInputError(f"ArchiveLimits.{name} is {value!r}, expected a positive integer")

    @property
    def stream_cap(self) -> int:
        """The decompressed-byte cap in force (bytes)."""
        if self.max_stream_bytes is not None:
            return self.max_stream_bytes
        return (MAX_MANIFEST_BYTES + self.max_total_bytes + self.max_members * 2 * BLOCK + 2 * BLOCK
                + MAX_TRAILING_BYTES)


def _member_name_parts(name: str, where: str, error: type[BundleError]) -> list[str]:
    """Split a member path into components, refusing anything but a plain relative POSIX path."""
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name
            or any(p in ("", ".", "..") for p in parts)):
        raise error(f"{where}: path {name!r} is not a plain relative path (empty, absolute, '.', '..', "
                    "'//', backslash or NUL)")
    return parts


# --------------------------------------------------------------------------------------------- writing

def _split_name(raw: bytes) -> tuple[bytes, bytes]:
    """(prefix, name) of a ustar header for a path; ValueError when it is over 255 bytes or no '/' splits it."""
    if len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"path over {MAX_NAME_BYTES} bytes")
    if len(raw) <= 100:
        return b"", raw
    for i in range(len(raw) - 1, -1, -1):
        if raw[i:i + 1] == b"/" and i <= 155 and 0 < len(raw) - i - 1 <= 100:
            return raw[:i], raw[i + 1:]
    raise ValueError("no '/' splits it into a prefix of <= 155 bytes and a name of <= 100 bytes")


def _header(name: str, size: int) -> bytes:
    prefix, base = _split_name(name.encode("utf-8"))
    h = bytearray(BLOCK)
    zero = b"0000000\0"  # uid, gid, devmajor, devminor; uname and gname stay empty
    for offset, value in ((0, base), (100, b"0000644\0"), (108, zero), (116, zero), (124, b"%011o\0" % size),
                          (136, b"00000000000\0"), (148, b" " * 8), (156, b"0"), (257, _MAGIC), (329, zero),
                          (337, zero), (345, prefix)):
        h[offset:offset + len(value)] = value
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _open_nofollow(path: Path, where: str) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BundleError(f"{where}: {path}: cannot open without following links: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise BundleError(f"{where}: {path}: not a regular file")
    return f


def _check_no_symlink(root: Path, rel: str, where: str) -> None:
    p = root
    for part in rel.split("/"):
        p = p / part
        if p.is_symlink():
            raise BundleError(f"{where}: {p.relative_to(root).as_posix()} is a symbolic link; archives hold none")


def pack_bundle(bundle: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write the bundle directory ``bundle`` as one archive file ``out``; return its path.

    The bundle is verified first (manifest valid, every listed file present with its size and sha256,
    nothing unlisted, no symbolic links); each file is hashed again while it is copied in. The archive
    is written to a temporary file beside ``out`` and renamed at the end, so nothing half-written is
    ever left under ``out``.

    Raises:
        InputNotFoundError: no bundle at ``bundle``.
        BundleError: the bundle does not verify (the problems are listed), holds a symbolic link, a
            path longer than 255 bytes, or a file changed while packing.
        BundleWriteError: ``out`` exists (without ``overwrite``), or writing failed.
    """
    root = Path(bundle)
    target = Path(out)
    if not root.is_dir():
        raise InputNotFoundError(f"{root}: not a bundle directory")
    _check_no_symlink(root, MANIFEST_NAME, str(root))
    if not (root / MANIFEST_NAME).is_file():
        raise InputNotFoundError(f"{root}: not a bundle (no {MANIFEST_NAME} as a regular file)")
    with _open_nofollow(root / MANIFEST_NAME, str(root)) as f:
        raw_manifest = f.read(MAX_MANIFEST_BYTES + 1)
    manifest = parse_manifest(raw_manifest, str(root / MANIFEST_NAME))
    for entry in manifest.files:
        _member_name_parts(entry.path, f"{root}: {MANIFEST_NAME}", BundleError)
        _check_no_symlink(root, entry.path, str(root))
        try:
            _split_name(entry.path.encode("utf-8"))
        except ValueError as exc:
            raise BundleError(f"{root}: {entry.path!r}: path cannot be stored in a ustar header: {exc}") from None
        if entry.bytes > MAX_USTAR_SIZE:
            raise BundleError(f"{root}: {entry.path!r}: {entry.bytes} bytes, over the ustar limit {MAX_USTAR_SIZE}")
    problems = verify_files(root, manifest)
    if problems:
        raise BundleError(f"{root}: bundle does not verify, not packed: " + "; ".join(problems[:20])
                          + (f"; and {len(problems) - 20} more" if len(problems) > 20 else ""))
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise BundleWriteError(f"{target}: already exists (use --overwrite to replace it)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise BundleWriteError(f"{target}: cannot create a file in {target.parent}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw_out:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw_out, compresslevel=COMPRESSLEVEL,
                               mtime=0) as gz:
                gz.write(_header(MANIFEST_NAME, len(raw_manifest)) + raw_manifest + bytes(-len(raw_manifest) % BLOCK))
                written = BLOCK + len(raw_manifest) + -len(raw_manifest) % BLOCK
                for entry in manifest.files:
                    written += _write_file_member(gz, root, entry)
                end = 2 * BLOCK
                gz.write(b"\0" * (end + (-(written + end)) % RECORD))
            raw_out.flush()
            os.fsync(raw_out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise BundleWriteError(f"{target}: write failed: {exc.strerror or exc}") from exc
        raise
    return target


def _write_file_member(gz: gzip.GzipFile, root: Path, entry: FileEntry) -> int:
    gz.write(_header(entry.path, entry.bytes))
    h = hashlib.sha256()
    left = entry.bytes
    with _open_nofollow(root / entry.path, str(root)) as f:
        while left:
            chunk = f.read(min(left, CHUNK))
            if not chunk:
                break
            h.update(chunk)
            gz.write(chunk)
            left -= len(chunk)
        extra = f.read(1)
    if left or extra or h.hexdigest() != entry.sha256:
        raise BundleError(f"{root}: {entry.path}: changed while packing (size or sha256 no longer the manifest's)")
    pad = -entry.bytes % BLOCK
    gz.write(b"\0" * pad)
    return BLOCK + entry.bytes + pad


# --------------------------------------------------------------------------------------------- reading

@dataclass
class _Member:
    index: int  # 1-based
    offset: int  # of the header, in the decompressed stream
    name: str
    size: int

    def label(self) -> str:
        return f"member {self.index} {self.name!r}"


class _Reader:
    """Member-by-member ustar reader over a gzip stream, counting every decompressed byte read."""

    def __init__(self, f: BinaryIO, archive: str, limits: ArchiveLimits) -> None:
        self.gz = gzip.GzipFile(filename="", mode="rb", fileobj=f)
        self.archive = archive
        self.limits = limits
        self.cap = limits.stream_cap
        self.count = 0
        self.members = 0

    def fail(self, what: str, reason: str) -> ArchiveError:
        return ArchiveError(f"{self.archive}: {what}: {reason}")

    def read(self, n: int, what: str) -> bytes:
        """Up to ``min(n, CHUNK)`` decompressed bytes (empty only at the end of the stream)."""
        n = min(n, CHUNK, self.cap - self.count + 1)
        try:
            data = self.gz.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise self.fail(what, f"corrupt or truncated gzip stream ({str(exc)[:120]})") from None
        self.count += len(data)
        if self.count > self.cap:
            raise self.fail(what, f"decompressed stream over the cap of {self.cap} bytes (gzip bomb?)")
        return data

    def read_exact(self, n: int, what: str, sink: Callable[[bytes], object] | None = None) -> bytes:
        """Exactly ``n`` bytes, in chunks; handed to ``sink`` when given (then b"" is returned)."""
        parts: list[bytes] = []
        left = n
        while left:
            chunk = self.read(left, what)
            if not chunk:
                raise self.fail(what, f"truncated: the stream ends {left} bytes early")
            left -= len(chunk)
            if sink is None:
                parts.append(chunk)
            else:
                sink(chunk)
        return b"".join(parts)

    def next_member(self) -> _Member | None:
        """The next member's header, checked; None at the end-of-archive marker."""
        offset = self.count
        what = f"member {self.members + 1} (header at byte {offset})"
        block = self.read(BLOCK, what)
        if not block:
            raise self.fail(what, "truncated: the stream ends without the end-of-archive marker")
        if len(block) < BLOCK:
            block += self.read_exact(BLOCK - len(block), what)
        if block == bytes(BLOCK):
            if self.read_exact(BLOCK, f"end-of-archive marker at byte {offset}") != bytes(BLOCK):
                raise self.fail(f"end-of-archive marker at byte {offset}", "a lone zero block followed by data")
            return None
        stored = _parse_octal(block[148:156])
        unsigned = sum(block[:148]) + 256 + sum(block[156:])
        signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)
        if stored is None or stored not in (unsigned, signed):
            raise self.fail(what, f"header checksum invalid (field {block[148:156]!r}, computed {unsigned})")
        self.members += 1
        if self.members > self.limits.max_members:
            raise self.fail(what, f"more than {self.limits.max_members} members, over the cap")
        short = block[0:100].split(b"\0", 1)[0]
        what = f"member {self.members} {short.decode('utf-8', 'replace')!r}"
        typeflag = block[156:157]
        if typeflag not in (b"0", b"\0"):
            kind = _TYPE_NAMES.get(typeflag, f"unknown type {typeflag!r}")
            raise self.fail(what, f"{kind} (typeflag {typeflag!r}): only regular files are allowed")
        if block[257:265] != _MAGIC:
            raise self.fail(what, f"not a POSIX ustar header (magic {block[257:265]!r})")
        raw = self._raw_name(block, what)
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"member {self.members}", f"name {raw!a} is not valid UTF-8") from None
        _member_name_parts(name, f"{self.archive}: member {self.members} {name!r}", ArchiveError)
        what = f"member {self.members} {name!r}"
        size = _parse_octal(block[124:136])
        if size is None:
            raise self.fail(what, f"size field {block[124:136]!r} is not valid octal")
        if size > self.limits.max_member_bytes:
            raise self.fail(what, f"{size} bytes, over the per-file cap of {self.limits.max_member_bytes}")
        return _Member(self.members, offset, name, size)

    def _raw_name(self, block: bytes, what: str) -> bytes:
        values = []
        for field in (block[345:500], block[0:100]):
            end = field.find(b"\0")
            if end >= 0 and field[end:].strip(b"\0"):
                shown = field.rstrip(b"\0")
                raise self.fail(what, f"name field {shown!a} holds bytes after its NUL")
            values.append(field if end < 0 else field[:end])
        return values[0] + b"/" + values[1] if values[0] else values[1]

    def skip_padding(self, member: _Member) -> None:
        pad = self.read_exact(-member.size % BLOCK, member.label())
        if pad.strip(b"\0"):
            raise self.fail(member.label(), "non-zero padding after the data")

    def finish(self) -> None:
        """After the end-of-archive marker: only zero padding, then a clean gzip end (CRC checked)."""
        trailing = 0
        while chunk := self.read(CHUNK, "after the end-of-archive marker"):
            trailing += len(chunk)
            if chunk.strip(b"\0"):
                raise self.fail("after the end-of-archive marker", "garbage (non-zero bytes)")
            if trailing > MAX_TRAILING_BYTES:
                raise self.fail("after the end-of-archive marker", f"more than {MAX_TRAILING_BYTES} bytes of padding")


def _parse_octal(field: bytes) -> int | None:
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    if not digits or any(c not in b"01234567" for c in digits):
        return None
    return int(digits, 8)


def _read_manifest_member(reader: _Reader) -> tuple[Manifest, bytes]:
    member = reader.next_member()
    if member is None:
        raise reader.fail("member 1", f"the archive is empty; expected {MANIFEST_NAME} first")
    if member.name != MANIFEST_NAME:
        raise reader.fail(member.label(), f"the first member must be {MANIFEST_NAME}")
    if member.size > MAX_MANIFEST_BYTES:
        raise reader.fail(member.label(), f"{member.size} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    raw = reader.read_exact(member.size, member.label())
    reader.skip_padding(member)
    try:
        manifest = parse_manifest(raw, f"{reader.archive}: {member.label()}")
    except ArchiveError:
        raise
    except BundleError as exc:
        raise ArchiveError(str(exc)) from None
    limits = reader.limits
    if len(manifest.files) + 1 > limits.max_members:
        raise reader.fail(member.label(), f"lists {len(manifest.files)} files, over the cap of "
                                          f"{limits.max_members - 1}")
    total = 0
    for entry in manifest.files:
        if entry.bytes > limits.max_member_bytes:
            raise reader.fail(member.label(), f"lists {entry.path!r} at {entry.bytes} bytes, over the per-file "
                                              f"cap of {limits.max_member_bytes}")
        total += entry.bytes
    if total > limits.max_total_bytes:
        raise reader.fail(member.label(), f"lists {total} bytes in all, over the cap of {limits.max_total_bytes}")
    return manifest, raw


def _open_archive(archive: str | os.PathLike[str]) -> BinaryIO:
    path = Path(archive)
    try:  # O_NONBLOCK: a fifo given as the archive is refused below instead of blocking the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: no such archive") from None
    except OSError as exc:
        raise InputNotFoundError(f"{path}: cannot open: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputNotFoundError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def read_archive_manifest(archive: str | os.PathLike[str], *, limits: ArchiveLimits = ArchiveLimits()) -> Manifest:
    """Read and validate the manifest of an archive: only its first member is read.

    Raises:
        InputNotFoundError: no such file.
        ArchiveError: the first member is not a valid ``manifest.json``, or the stream is malformed.
    """
    with _open_archive(archive) as f:
        return _read_manifest_member(_Reader(f, str(archive), limits))[0]


def unpack_bundle(archive: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  limits: ArchiveLimits = ArchiveLimits(), overwrite: bool = False) -> Path:
    """Unpack an archive into the bundle directory ``out_dir``; return its path.

    Every member is checked (see the module docstring) before the bundle is renamed into place;
    memory stays bounded (one chunk of at most 1 MiB, plus the manifest) whatever the input.

    Raises:
        InputNotFoundError: no such archive.
        ArchiveError: the archive is malformed or hostile; nothing is left at ``out_dir`` or beside it.
        BundleWriteError: ``out_dir`` exists (without ``overwrite``), or writing failed.
    """
    target = Path(out_dir)
    with staged_directory(target, overwrite=overwrite) as tmp, _open_archive(archive) as f:
        reader = _Reader(f, str(archive), limits)
        manifest, raw_manifest = _read_manifest_member(reader)
        tmp_real = os.path.realpath(tmp)
        _write_new(tmp_real, [MANIFEST_NAME], raw_manifest, reader, MANIFEST_NAME)
        _unpack_members(reader, manifest, tmp_real)
        reader.finish()
        for dirpath, _dirs, _files in os.walk(tmp_real):
            os.chmod(dirpath, 0o755)
    return target


@contextlib.contextmanager
def bundle_directory(path: str | os.PathLike[str], *, limits: ArchiveLimits = ArchiveLimits()) -> Iterator[Path]:
    """A bundle directory as it is, or a ``.nbox`` archive unpacked (every member checked) into a temporary
    directory that is removed when the block ends. A path that does not exist is passed through, for the
    reader to name."""
    p = Path(path)
    if p.is_dir() or not p.exists():
        yield p
        return
    tmp = Path(tempfile.mkdtemp(prefix=".nbox-bundle-"))
    try:
        yield unpack_bundle(p, tmp / p.name.removesuffix(ARCHIVE_SUFFIX), limits=limits)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def traces_directory(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Path]:
    """What every command that reads traces opens (``nbox trace inspect``, ``replay``, ``sweep``): a file named
    ``*.nbox`` is a bundle archive, unpacked and checked by :func:`bundle_directory` into a temporary directory
    for the block; anything else (a bundle directory, a bare Chakra ET file, directory or ``<prefix>``) is
    passed through as it is, for :func:`nbox_trace.bundle.manifest.locate_traces` to read."""
    p = Path(path)
    if p.name.endswith(ARCHIVE_SUFFIX) and p.is_file():
        return bundle_directory(p)
    return contextlib.nullcontext(p)


def _unpack_members(reader: _Reader, manifest: Manifest, tmp_real: str) -> None:
    listed = {e.path: e for e in manifest.files}
    seen: set[str] = set()
    total = 0
    while (member := reader.next_member()) is not None:
        what = member.label()
        if member.name == MANIFEST_NAME or member.name in seen:
            raise reader.fail(what, "duplicate member name")
        entry = listed.get(member.name)
        if entry is None:
            raise reader.fail(what, f"not listed in {MANIFEST_NAME}")
        if member.size != entry.bytes:
            raise reader.fail(what, f"header says {member.size} bytes, {MANIFEST_NAME} says {entry.bytes}")
        total += member.size
        if total > reader.limits.max_total_bytes:
            raise reader.fail(what, f"members total over the cap of {reader.limits.max_total_bytes} bytes")
        seen.add(member.name)
        h = hashlib.sha256()
        _write_new(tmp_real, member.name.split("/"), None, reader, what, member.size, h)
        reader.skip_padding(member)
        if h.hexdigest() != entry.sha256:
            raise reader.fail(what, f"sha256 {h.hexdigest()} differs from the manifest's {entry.sha256}")
    missing = [p for p in listed if p not in seen]
    if missing:
        raise reader.fail(f"end of archive (after member {reader.members})",
                          f"{len(missing)} listed file(s) missing, first {missing[0]!r}")


def _write_new(tmp_real: str, parts: list[str], data: bytes | None, reader: _Reader, what: str,
               size: int = 0, h: hashlib._Hash | None = None) -> None:
    """Create ``tmp_real/parts`` exclusively (never through a link) and fill it from ``data`` or the reader."""
    dest = os.path.join(tmp_real, *parts)
    parent = os.path.dirname(dest)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise reader.fail(what, "its directory collides with a file member") from None
    real_parent = os.path.realpath(parent)
    if os.path.commonpath([tmp_real, real_parent]) != tmp_real:
        raise reader.fail(what, "resolves outside the output directory")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(dest, flags, 0o644)
    except (FileExistsError, IsADirectoryError, NotADirectoryError):
        raise reader.fail(what, "collides with another member's path") from None
    with os.fdopen(fd, "wb") as out:
        if data is not None:
            out.write(data)
        else:
            def sink(chunk: bytes) -> None:
                if h is not None:
                    h.update(chunk)
                out.write(chunk)

            reader.read_exact(size, what, sink)
