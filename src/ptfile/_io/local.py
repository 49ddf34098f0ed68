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

Writing is here too, in one place: :func:`atomic_path` (and :func:`atomic_file`
over it) is every local write of ptfile — a temporary beside the output, renamed
over it on success, with the modes torch's plain ``open(path, "wb")`` gives
(``0o666`` less the umask; a replaced file's own mode).
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap as _mmap
import os
import re
import secrets
import shutil
import stat as _stat
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import IO, BinaryIO, Final, Protocol, Union, runtime_checkable

from ..errors import FormatError, PtfileError

__all__ = [
    "BytesSource",
    "FileLike",
    "FileSource",
    "MmapSource",
    "Source",
    "atomic_file",
    "atomic_path",
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

    Capabilities are attributes, so the layers above never test a source's class:
    ``map_access`` is the access of a memory-mapped source (``"r"``,
    ``"private"``, ``"shared"``; None when it is not mapped) and
    ``reads_on_demand`` is true where every read goes to the file (no whole
    input in memory: read in small windows).
    """

    size: int
    name: str | None
    map_access: str | None
    reads_on_demand: bool

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

    def __init__(self, path: str | os.PathLike[str], access: str = "private") -> None:
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
            self._fd = os.dup(fp.fileno())
        self._close_fd = weakref.finalize(self, os.close, self._fd)

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """The file's ``lengths[i]`` bytes at each ``offsets[i]``, concatenated.

        Read with positioned reads, not through the map (see the module
        docstring).  The caller checks the ranges against :attr:`size`.  None
        when positioned reads are not available, the source is closed, or a
        read comes back short (the file shrank since it was mapped).
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


#: A URL: a scheme (RFC 3986 letters) and ``://``.
_URL: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(f: object) -> str | None:
    """The scheme of a URL string (``"s3"`` for ``"s3://b/k"``), else None.

    Examples
    --------
    >>> url_scheme("hf://user/repo/model.bin"), url_scheme("/tmp/model.pt")
    ('hf', None)
    """
    if not isinstance(f, str):
        return None
    match = _URL.match(f)
    return match.group(1).lower() if match else None


def is_url(f: object) -> bool:
    """True for a URL that fsspec must read (:mod:`ptfile._io.remote`): any scheme but
    ``file``, whose URLs name local paths."""
    scheme = url_scheme(f)
    return scheme is not None and scheme != "file"


def is_path(f: object) -> bool:
    """True for local paths: ``os.PathLike`` and ``str`` arguments that are not URLs."""
    return isinstance(f, os.PathLike) or (isinstance(f, str) and not is_url(f))


#: Files at least this big are read by several threads at once, in chunks: the page
#: faults of the fresh buffer and the copies then run on every core (a 2 GiB file on
#: the 2-core benchmark VM: 1.2-2.4 s, against 2.3-3.4 s for one populated read).
#: Smaller files are read by one thread into a populated map, which is faster there
#: and takes half the CPU (200 MB: 0.09-0.11 s and 0.1 s of CPU, against 0.11-0.14 s
#: and 0.2 s for the threads, whose faults contend for the same address space).
PARALLEL_READ_MIN_BYTES: Final = 256 << 20
_READ_CHUNK_BYTES: Final = 32 << 20
#: Files at least this big are read into an anonymous map (:func:`read_file`).
ANONYMOUS_MAP_BYTES: Final = 4 << 20
#: mmap flags of that map, for a file read by one thread, where the platform has them:
#: private, anonymous and populated (``MAP_POPULATE``, Linux: every page is made in the
#: one ``mmap`` call, ~1.6 µs a page on the benchmark VM, instead of a fault on its first
#: touch, ~3.5 µs a page).
_POPULATED_FLAGS: Final = (_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS
                           | getattr(_mmap, "MAP_POPULATE", 0)) \
    if hasattr(_mmap, "MAP_ANONYMOUS") else None
_READ_THREADS: Final = min(4, max(2, os.cpu_count() or 1))
#: Positioned reads into a buffer (not on Windows).
_PREADV: Final = getattr(os, "preadv", None)


def read_file(path: str) -> memoryview:
    """The whole file in one fresh, writable buffer: no second copy.

    The buffer is fresh memory: unlike ``bytearray(n)`` it is not zero-filled
    first, which would touch every page twice (+70 % on a 2 GiB file).  From
    :data:`ANONYMOUS_MAP_BYTES` on it is an anonymous map of its own, not
    ``numpy.empty`` memory: numpy asks for transparent huge pages on big
    arrays, and where the kernel then compacts memory to find them, the first
    touch of each page stalls (2 GiB read into ``numpy.empty`` memory on the
    benchmark VM: 13 s, 5.3 s of CPU; into an anonymous map: 2.4 s, 1.0 s).
    Big files are read in chunks by a few threads (:data:`PARALLEL_READ_MIN_BYTES`),
    whose page faults then run on every core.  Below that, where the platform
    can, the map's pages are all made when it is created (``MAP_POPULATE``)
    rather than one fault at a time as the read first touches them: on the
    benchmark VM a 29 MB file then reads in 19 ms instead of 32 ms, a 200 MB
    file in 0.09-0.11 s instead of the threads' 0.11-0.14 s.  (Populating a
    2 GiB map so, in the one thread that calls ``mmap``, took 2.3-3.4 s there,
    against 1.2-2.4 s for the threads' faults.)
    """
    import numpy as np  # here, not at import: the CLI starts without numpy

    with open(path, "rb", buffering=0) as fp:
        size = os.fstat(fp.fileno()).st_size
        threads = size >= PARALLEL_READ_MIN_BYTES
        view = _anonymous_map(size, populate=not threads) if size and size >= ANONYMOUS_MAP_BYTES \
            else np.empty(size, np.uint8).data.cast("B")
        if threads and _read_in_chunks(fp.fileno(), view):
            done = fp.seek(size)
        else:
            done = _read_into(fp, view)
        extra = fp.read()
        if extra or done < size:  # the file changed size while we read it
            return memoryview(bytes(view[:done]) + extra)
        return view


def _anonymous_map(size: int, populate: bool) -> memoryview:
    """``size`` bytes of fresh memory of their own (:func:`read_file`), their pages made
    up front when ``populate`` and the platform can."""
    if not populate or _POPULATED_FLAGS is None:
        return memoryview(_mmap.mmap(-1, size))  # (Windows has no flags)
    return memoryview(_mmap.mmap(-1, size, flags=_POPULATED_FLAGS))


def _read_into(fp: IO[bytes], view: memoryview) -> int:
    """Fill ``view`` from ``fp``'s position on; the bytes read (fewer at end of file)."""
    done = 0
    while done < len(view):
        got = fp.readinto(view[done:])  # type: ignore[attr-defined]
        if not got:
            break
        done += got
    return done


def _read_in_chunks(fd: int, view: memoryview) -> bool:
    """Fill ``view`` with the file's first ``len(view)`` bytes, chunks read by a few
    threads; False (the caller reads it again) if the file ended early, or
    positioned reads or threads are not available."""
    if _PREADV is None:
        return False
    preadv = _PREADV

    def chunk(start: int) -> bool:
        end = min(len(view), start + _READ_CHUNK_BYTES)
        while start < end:
            got = preadv(fd, [view[start:end]], start)
            if not got:
                return False
            start += got
        return True

    try:
        with ThreadPoolExecutor(_READ_THREADS) as pool:
            return all(pool.map(chunk, range(0, len(view), _READ_CHUNK_BYTES)))
    except RuntimeError:  # "can't start new thread" (a sandbox, or interpreter shutdown)
        return False


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


#: Tries at a fresh temporary name beside an output before giving up (tempfile's count).
_TEMP_ATTEMPTS: Final = 100
_CREATE_FLAGS: Final = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                        | getattr(os, "O_BINARY", 0))


def _fresh_sibling(path: str, directory: bool = False) -> str:
    """Create an empty file (a folder when ``directory``) under a fresh hidden name beside
    ``path``, with the mode ``open(path, "wb")`` (``os.mkdir(path)``) would give it there:
    asked of ``0o666`` (``0o777``), less the umask (or as a default ACL of the folder
    says), applied by the kernel as for torch's ``open``."""
    folder, stem = os.path.split(os.path.abspath(path))  # abspath: "out/" -> "out"
    for _ in range(_TEMP_ATTEMPTS):
        tmp = os.path.join(folder, f".{stem}.{secrets.token_hex(4)}.tmp")
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, _CREATE_FLAGS, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, "no fresh temporary name left", folder)


def _settle_mode(tmp: str, path: str, fresh: int) -> None:
    """Give ``tmp`` the permission bits ``open(path, "wb")`` would leave: those of the
    file (folder) ``path`` it replaces, else ``fresh`` for a new file (a writer may have
    renamed a file of its own over the temporary: safetensors does).  A new folder
    keeps those its writer's ``mkdir`` gave it."""
    try:
        old: int | None = os.stat(path).st_mode
    except OSError:
        old = None
    if old is not None and ((_stat.S_ISREG(old) and os.path.isfile(tmp))
                            or (_stat.S_ISDIR(old) and os.path.isdir(tmp))):
        want = _stat.S_IMODE(old) & 0o777
    elif os.path.isfile(tmp):
        want = fresh
    else:
        return
    if _stat.S_IMODE(os.stat(tmp).st_mode) != want:
        os.chmod(tmp, want)


def _replace(tmp: str, path: str) -> None:
    """Rename ``tmp`` over ``path``; a folder over a folder moves the old one aside first
    (``os.replace`` cannot), removed once the new one is in place."""
    if not (os.path.isdir(tmp) and os.path.isdir(path) and not os.path.islink(path)):
        os.replace(tmp, path)
        return
    old = _fresh_sibling(path, directory=True)
    os.rename(path, os.path.join(old, "old"))
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_given(exc: OSError, path: str, temps: tuple[str, ...]) -> OSError:
    """``exc`` naming ``path`` wherever it names one of ``temps`` (or a file inside one):
    an error speaks of the output the caller gave, never of a temporary it never named."""
    def given(name: object) -> object:
        if isinstance(name, str) and any(name == t or name.startswith(t + os.sep)
                                         for t in temps):
            return path
        return name

    filename, filename2 = given(exc.filename), given(exc.filename2)
    if (filename, filename2) == (exc.filename, exc.filename2):
        return exc
    if filename2 == filename:  # a rename of the temporary over the output: one name
        filename2 = None
    renamed = type(exc)(exc.errno, exc.strerror, filename, None, filename2)
    return renamed.with_traceback(exc.__traceback__)


def _staging(path: str, same_name: bool) -> tuple[str | None, str]:
    """The fresh temporary folder (``same_name``) and the path to write, beside ``path``,
    its folder made first when missing (``os.makedirs``: ``0o777`` less the umask, as
    ``mkdir -p`` and torch's ``dcp.save`` make folders)."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)  # its own error names the folder as given
    try:
        if not same_name:
            return None, _fresh_sibling(path)
        staging = _fresh_sibling(path, directory=True)
    except OSError as exc:  # a folder that takes no new file: say so of the output
        raise _as_given(exc, path, (os.path.dirname(os.path.abspath(path)),)) from None
    return staging, os.path.join(staging, os.path.basename(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_path(path: str, fsync: bool = False, *, same_name: bool = False) -> Iterator[str]:
    """A temporary path beside ``path`` to write instead, renamed over ``path`` only on
    success and removed on failure: a crash leaves the old file or the new one, never a
    partial one.  Every local write of ptfile goes through here (or :func:`atomic_file`).

    * A folder of ``path`` that does not exist yet is made first, with its parents
      (``os.makedirs``: ``0o777`` less the umask, the mode ``mkdir -p`` and torch's
      ``dcp.save`` give); it stays when the write fails.
    * Modes are torch's (a plain ``open(path, "wb")``): a new file gets ``0o666`` less
      the umask, a file (folder) that replaces another keeps the permission bits of the
      one it replaces.  The temporary is created with ``0o666`` (``0o777``), not
      ``mkstemp``'s ``0o600``, and the kernel applies the umask: it is never read
      (``os.umask`` reads it only by setting it, for the whole process, a race with
      other threads; ``/proc/self/status`` is Linux's alone).  The mode the kernel gave
      the temporary is set again before the rename, in case the writer replaced it.
    * The yielded path is an empty file of a fresh hidden name (``.NAME.XXXXXXXX.tmp``);
      with ``same_name`` it is ``path``'s own name inside a fresh hidden folder, not yet
      there, for writers that name what they write after the file (an archive's
      folder) or that write a folder (made with ``os.mkdir``'s modes, by the writer).
      A folder replaces a folder: the old one is removed once the new one is in place.
    * An ``OSError`` that names the temporary (making it, writing it, renaming it) is
      raised naming ``path`` instead: errors speak of the paths the caller gave.
    * ``fsync``: the file (folder) is flushed to disk before the rename, and the folder
      holding it after.
    """
    staging, tmp = _staging(path, same_name)
    # A new file's mode, as the kernel just applied it (a folder's 0o777 less the umask
    # holds the file's 0o666 less the umask).
    fresh = _stat.S_IMODE(os.stat(staging or tmp).st_mode) & 0o666
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        _settle_mode(tmp, path, fresh)
        _replace(tmp, path)
    except OSError as exc:
        if staging is None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        renamed = _as_given(exc, path, (staging or tmp,))
        if renamed is exc:
            raise
        raise renamed from None  # the same error, of the output: no second one of the temporary
    except BaseException:
        if staging is None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if fsync:
        with contextlib.suppress(OSError):
            _fsync(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_file(path: str, fsync: bool) -> Iterator[IO[bytes]]:
    """:func:`atomic_path` opened for writing: the file is renamed over ``path`` once the
    block succeeds, with torch's modes (``save``, ``convert_dcp`` and the exports write so)."""
    with atomic_path(path, fsync) as tmp, open(tmp, "wb") as fp:
        yield fp
