"""Byte sources: one interface over paths, in-memory bytes and binary file objects.

Every reader in ptfile reads through a :class:`Source`, whose ``pread`` is an
exact positioned read that names what it reads: a short read is a
:class:`~ptfile.errors.FormatError` saying what was being read and where, never
an ``EOFError`` or a silently short result.

* :class:`BytesSource` wraps bytes-like data (also used for non-seekable
  streams, which are read whole first: a ZIP can only be parsed from its end).
* :class:`FileSource` wraps a seekable binary file object; offsets are relative
  to the position the file had when it was opened (torch reads from the
  current position too).
* :class:`MmapSource` maps a file read-only (``ACCESS_READ``), copy-on-write
  (``ACCESS_COPY``, torch's ``MAP_PRIVATE``) or shared (``ACCESS_WRITE``,
  ``MAP_SHARED``).  Its :meth:`view` slices are zero-copy.  It keeps the
  file's descriptor until closed, for :meth:`MmapSource.gather`: a few bytes
  at each of many places far apart cost ~0.65 µs a ``pread``, against
  ~3.6 µs for the first touch of a page of a fresh map (a page fault, which
  also maps the 64 KiB around it).

A path is told from a URL in :mod:`ptfile._io.paths`; a path that is not mapped is
read whole by :func:`ptfile._io.buffers.read_file`; every local write goes through
:mod:`ptfile._io.atomic`.
"""

from __future__ import annotations

import contextlib
import io
import mmap as _mmap
import os
import weakref
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import IO, BinaryIO, Final, Protocol, Union, runtime_checkable

from ..errors import FormatError, PtfileError
from .buffers import read_file
from .paths import is_path

__all__ = [
    "BytesSource",
    "FileLike",
    "FileSource",
    "MmapSource",
    "Source",
    "open_source",
]

FileLike = Union[str, "os.PathLike[str]", IO[bytes], BinaryIO]

#: Access modes of :class:`MmapSource`, by torch's names for them.
MMAP_ACCESS: Final = {
    "r": _mmap.ACCESS_READ,
    "private": _mmap.ACCESS_COPY,
    "shared": _mmap.ACCESS_WRITE,
}


@runtime_checkable
class Source(Protocol):
    """Random access to the bytes of one input.

    Capabilities are attributes and methods, so the layers above never test a
    source's class: ``map_access`` is the access of a memory-mapped source
    (``"r"``, ``"private"``, ``"shared"``; None when it is not mapped);
    ``reads_on_demand`` is true where every read goes to the file (no whole
    input in memory: read in small windows), false where the bytes are at hand
    (:meth:`view` is then zero-copy); ``bytes_fetched`` counts what a server sent
    (0 for a local source); :meth:`gather` reads many small ranges at once where
    the source has a cheaper way than :meth:`view` (None where it has not).
    """

    size: int
    name: str | None
    map_access: str | None
    reads_on_demand: bool

    @property
    def bytes_fetched(self) -> int:
        """Bytes a server sent for this source so far (0 for a local one)."""
        ...

    def pread(self, offset: int, n: int, what: str) -> bytes:
        """Return exactly ``n`` bytes at ``offset`` or raise FormatError naming ``what``."""
        ...

    def view(self, offset: int, n: int, what: str) -> memoryview:
        """Return ``n`` bytes at ``offset`` without copying where possible."""
        ...

    def read_fresh(self, offset: int, n: int, what: str) -> bytearray:
        """Return a new writable copy of ``n`` bytes at ``offset`` (one copy, no more)."""
        ...

    def pread_many(self, ranges: Sequence[tuple[int, int]], what: str) -> list[bytes]:
        """:meth:`pread` of each ``(offset, n)``; a remote source fetches them together."""
        ...

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """A hint: these ``(offset, n)`` ranges are read next (a remote source fetches
        them together and keeps them; the others need nothing)."""
        ...

    def read_all(self) -> memoryview:
        """The whole input in one buffer, read once, in order; a source whose bytes are at
        hand (in memory or mapped) returns its own view, with no copy."""
        ...

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """The ``lengths[i]`` bytes at each ``offsets[i]``, concatenated, where this source
        reads them more cheaply than through :meth:`view`; None where it does not (or
        cannot now), and the caller reads otherwise."""
        ...

    def detached(self) -> Source:
        """A source over the same bytes that stays readable after :meth:`close`."""
        ...

    def close(self) -> None: ...


#: Exceptions that can only mean damaged input once they escape a reader.
DAMAGE_EXCEPTIONS: Final = (
    ArithmeticError, AttributeError, EOFError, IndexError, KeyError, LookupError, MemoryError,
    RecursionError, TypeError, UnicodeError, ValueError, BufferError, OSError,
)


@contextlib.contextmanager
def damage_as_format_error() -> Iterator[None]:
    """The error contract at the API boundary: ptfile errors pass, any other error a reader
    lets escape becomes a :class:`FormatError` chained to it."""
    try:
        yield
    except PtfileError:
        raise
    except DAMAGE_EXCEPTIONS as exc:
        raise FormatError(f"damaged checkpoint: {type(exc).__name__}: {exc}") from exc


def check_range(size: int, offset: int, n: int, what: str) -> None:
    if offset < 0 or n < 0 or offset + n > size:
        raise FormatError(
            f"truncated input reading {what}: needs bytes {offset:#x}..{offset + n:#x}, "
            f"input has {size:#x}",
            offset=offset,
        )


class _ViewSource:
    """Reads served from one memoryview of the whole input (in memory or mapped)."""

    _view: memoryview
    size: int
    map_access: str | None = None
    reads_on_demand: bool = False
    bytes_fetched: int = 0

    def pread(self, offset: int, n: int, what: str) -> bytes:
        check_range(self.size, offset, n, what)
        return bytes(self._view[offset : offset + n])

    def view(self, offset: int, n: int, what: str) -> memoryview:
        check_range(self.size, offset, n, what)
        return self._view[offset : offset + n]

    def read_fresh(self, offset: int, n: int, what: str) -> bytearray:
        return bytearray(self.view(offset, n, what))

    def pread_many(self, ranges: Sequence[tuple[int, int]], what: str) -> list[bytes]:
        return [self.pread(offset, n, what) for offset, n in ranges]

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Nothing to do: the bytes are at hand."""

    def read_all(self) -> memoryview:
        """The input's own view (no copy)."""
        return self._view

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """None: slices of the view are the cheapest read of bytes in memory."""
        return None


class BytesSource(_ViewSource):
    """In-memory bytes (``bytes``, ``bytearray``, ``memoryview``, ``mmap``)."""

    def __init__(self, data: bytes | bytearray | memoryview, name: str | None = None) -> None:
        self._view = memoryview(data).cast("B")
        self.size = len(self._view)
        self.name = name

    def detached(self) -> BytesSource:
        """This source: it holds no resource that :meth:`close` releases."""
        return self

    def close(self) -> None:
        """Drop the reference to the data (views already handed out stay valid)."""


class FileSource:
    """A seekable binary file object; offsets count from its position at open time."""

    map_access: str | None = None
    reads_on_demand: bool = True
    bytes_fetched: int = 0

    def __init__(self, fp: IO[bytes], name: str | None = None, *, owned: bool = False) -> None:
        self._fp = fp
        self._owned = owned
        self._base = fp.tell()
        end = fp.seek(0, io.SEEK_END)
        self.size = max(0, end - self._base)
        self.name = name

    def pread(self, offset: int, n: int, what: str) -> bytes:
        check_range(self.size, offset, n, what)
        self._fp.seek(self._base + offset)
        parts = []
        remaining = n
        while remaining:
            chunk = self._fp.read(remaining)
            if not chunk:
                raise FormatError(f"file ended early reading {what}", offset=offset)
            parts.append(chunk)
            remaining -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def view(self, offset: int, n: int, what: str) -> memoryview:
        return memoryview(self.pread(offset, n, what))

    def read_fresh(self, offset: int, n: int, what: str) -> bytearray:
        check_range(self.size, offset, n, what)
        out = bytearray(n)
        self._fp.seek(self._base + offset)
        view = memoryview(out)
        done = 0
        readinto = getattr(self._fp, "readinto", None)
        while done < n:
            if readinto is not None:
                got = readinto(view[done:])
            else:
                chunk = self._fp.read(n - done)
                got = len(chunk)
                view[done : done + got] = chunk
            if not got:
                raise FormatError(f"file ended early reading {what}", offset=offset + done)
            done += got
        return out

    def pread_many(self, ranges: Sequence[tuple[int, int]], what: str) -> list[bytes]:
        return [self.pread(offset, n, what) for offset, n in ranges]

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Nothing to do: positioned reads of a local file are cheap."""

    def read_all(self) -> memoryview:
        """The file from the start offset to its end, in one fresh buffer."""
        return memoryview(self.read_fresh(0, self.size, "the file"))

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """None: the caller's positioned reads cost the same."""
        return None

    def detached(self) -> FileSource:
        """This source (reads after :meth:`close` of a file ptfile opened fail as OSError)."""
        return self

    def close(self) -> None:
        """Close the file if ptfile opened it; a caller's file object stays open."""
        if self._owned:
            self._fp.close()


#: Positioned reads (not on Windows).
_PREAD: Final = getattr(os, "pread", None)


class MmapSource(_ViewSource):
    """A memory-mapped file; :meth:`view` returns zero-copy slices of the map."""

    def __init__(self, path: str | os.PathLike[str], access: str = "private", *,
                 descriptor: bool = True) -> None:
        """Map the file at ``path`` with ``access``; ``descriptor``: keep the file's
        descriptor for :meth:`gather` (a folder of many files maps each without one)."""
        self.name: str | None = os.fspath(path)
        self.access = self.map_access = access
        mode = "r+b" if access == "shared" else "rb"
        with open(path, mode) as fp:
            self.size = os.fstat(fp.fileno()).st_size
            if self.size == 0:
                self._map: _mmap.mmap | None = None
                self._view = memoryview(b"")
            else:
                self._map = _mmap.mmap(fp.fileno(), 0, access=MMAP_ACCESS[access])
                self._view = memoryview(self._map)
            # The mapped file itself, not whatever the path names later; closed with us.
            self._fd = os.dup(fp.fileno()) if descriptor else -1
        self._close_fd = weakref.finalize(self, os.close, self._fd)
        if not descriptor:
            self._close_fd.detach()

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """The file's ``lengths[i]`` bytes at each ``offsets[i]``, concatenated.

        Read with positioned reads, not through the map (see the module
        docstring).  The caller checks the ranges against :attr:`size`.  None
        when positioned reads are not available, the source is closed, or a
        read comes back short (the file shrank since it was mapped), or it was opened
        without its descriptor.
        """
        if _PREAD is None or not self._close_fd.alive:
            return None
        joined = b"".join(map(_PREAD, repeat(self._fd), lengths, offsets))
        return joined if len(joined) == sum(lengths) else None

    def detached(self) -> BytesSource:
        """A source over the same map that outlives :meth:`close`: it keeps the map open
        (while it or any view from it lives), not this source's descriptor (for
        :meth:`gather`)."""
        return BytesSource(self._view[:], self.name)

    def close(self) -> None:
        """Release our own view and descriptor; the map closes once no array uses it."""
        self._view.release()
        self._close_fd()


def open_source(f: FileLike, *, mmap: bool = False, access: str = "private",
                lazy: bool = False) -> Source:
    """Open ``f`` (a path, bytes-like object or binary file object) for random access.

    ``mmap`` maps a path; otherwise a path is read whole into one writable
    buffer, unless ``lazy`` (read on demand, for metadata-only work).  File
    objects are read from their current position; non-seekable streams are read
    whole into memory first.
    """
    if isinstance(f, (bytes, bytearray, memoryview)):
        return BytesSource(bytearray(f))
    if is_path(f):
        path = os.fspath(f)  # type: ignore[arg-type]
        if mmap:
            return MmapSource(path, access)
        if lazy:
            return FileSource(open(path, "rb"), name=path, owned=True)
        return BytesSource(read_file(path), name=path)
    fp = f  # a file object
    if mmap and hasattr(fp, "fileno"):
        try:
            fp.fileno()
        except (OSError, io.UnsupportedOperation):
            pass
        else:
            name = getattr(fp, "name", None)
            if isinstance(name, str) and os.path.exists(name) and fp.tell() == 0:  # type: ignore[union-attr]
                return MmapSource(name, access)
    seekable = getattr(fp, "seekable", None)
    if lazy and callable(seekable) and seekable():
        return FileSource(fp, name=getattr(fp, "name", None))  # type: ignore[arg-type]
    if isinstance(fp, io.BytesIO):
        return BytesSource(bytearray(fp.getbuffer()[fp.tell():]))
    return BytesSource(bytearray(fp.read()))  # type: ignore[union-attr]


