"""Where a saved file's bytes go: a sink that writes big files around the page cache.

Specification
-------------
A :class:`DirectSink` receives the output of a writer as ``write(data)``
calls (any C-contiguous buffers, in order) for one regular file descriptor
positioned at offset 0, and leaves exactly those bytes in the file once
:meth:`DirectSink.close` returns.  It does not fsync; the caller does.

* The first ``plain_bytes`` bytes of the file (a multiple of
  :data:`BUFFER_BYTES`; :data:`PLAIN_BYTES` for :func:`ptfile.save`) go
  straight to ``os.write`` as they come, through the page cache, without a
  copy; a write that crosses that offset is split there.
* The bytes after it are gathered into a page-aligned buffer of :data:`BUFFER_BYTES` and
  written a full buffer at a time, with ``O_DIRECT`` where the platform and
  the file system allow it: such writes go from the buffer to the device and
  skip the page cache.  Every full write starts at a multiple of
  :data:`BUFFER_BYTES` in the file and covers :data:`BUFFER_BYTES` bytes, as
  ``O_DIRECT`` requires (4 KiB sectors and smaller).
* What is left when the sink closes (less than one buffer) is written after
  ``O_DIRECT`` is turned off again, so the file ends where the data ends.
* Without ``O_DIRECT`` (not Linux, or a file system that refuses it with
  ``EINVAL`` when it is set or at the first write), the same buffers are
  written through the page cache instead; the file is the same.
* Copies into the buffer run in numpy, which releases the GIL, so a CRC
  computed in another thread (:class:`~ptfile.archive.writer.ZipWriter`)
  overlaps them.

Why: writing a multi-GiB checkpoint through the page cache first allocates
as much cache (which, on hosts whose free memory is cold, costs more kernel
time than the copy itself: 2 GiB took 3-5 s of system time on the
benchmark VM, against ~0.1 s through this sink), then evicts other files'
pages, and leaves the whole write-back to the final fsync.  A saved file is
therefore not in the page cache afterwards: its first load reads it from
the device.  Below a few hundred MiB the page cache wins instead (measured on
the 2-core benchmark VM, without fsync: 200 MB saved in 0.13 s through it,
0.21 s with ``O_DIRECT``; 2 GiB in 5-8 s through it, 1.2-3.4 s with
``O_DIRECT``, CPU 5.4 s against 1.3 s), hence the plain head of
:data:`PLAIN_BYTES`.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Buffer

__all__ = ["BUFFER_BYTES", "PLAIN_BYTES", "DirectSink"]

#: Size of the aligned buffer, and of every O_DIRECT write.
BUFFER_BYTES: Final = 8 << 20
#: Bytes :func:`ptfile.save` writes through the page cache before ``O_DIRECT``.
PLAIN_BYTES: Final = 256 << 20
#: ``os.O_DIRECT`` where the platform has it, else 0 (never used).
_O_DIRECT: Final = getattr(os, "O_DIRECT", 0)


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; False where it cannot be set."""
    if not _O_DIRECT:
        return False
    import fcntl  # POSIX only: imported where O_DIRECT exists

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)
    except OSError:
        return False
    return True


class DirectSink:
    """Write to ``fd`` in aligned :data:`BUFFER_BYTES` blocks, around the page cache.

    Parameters
    ----------
    fd : int
        A regular file open for writing, at offset 0.  The sink does not close it.
    plain_bytes : int
        How many bytes to write through the page cache first, unbuffered (a
        multiple of :data:`BUFFER_BYTES`).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryFile() as fp:
    ...     sink = DirectSink(fp.fileno())
    ...     sink.write(b"abc"); sink.write(memoryview(b"def"))
    ...     sink.close()
    ...     _ = fp.seek(0); fp.read()
    b'abcdef'
    """

    def __init__(self, fd: int, plain_bytes: int = 0) -> None:
        if plain_bytes % BUFFER_BYTES:
            raise ValueError(f"plain_bytes must be a multiple of {BUFFER_BYTES}")
        self._fd = fd
        self._plain_left = plain_bytes
        import numpy  # here, not at import: nothing in ptfile._io imports numpy then

        self._np = numpy
        self._map = mmap.mmap(-1, BUFFER_BYTES)  # page-aligned, as O_DIRECT needs
        self._buffer: np.ndarray = numpy.frombuffer(self._map, numpy.uint8)
        self._fill = 0
        self._direct = False if plain_bytes else _set_direct(fd, True)

    def write(self, data: Buffer) -> None:
        """Append ``data`` (any C-contiguous buffer) to the file."""
        view = memoryview(data).cast("B") if type(data) is not bytes else memoryview(data)
        if self._plain_left:
            view = self._write_plain(view)
            if not len(view):
                return
        np = self._np
        source = np.frombuffer(view, np.uint8)
        done, size = 0, len(source)
        buffer = self._buffer
        while done < size:
            fill = self._fill
            step = min(BUFFER_BYTES - fill, size - done)
            np.copyto(buffer[fill : fill + step], source[done : done + step])
            done += step
            self._fill = fill + step
            if self._fill == BUFFER_BYTES:
                self._write_out(BUFFER_BYTES)

    def _write_plain(self, view: memoryview) -> memoryview:
        """Write the head of ``view`` that is still due through the page cache; return the
        rest (turning ``O_DIRECT`` on once the plain head of the file is written)."""
        head = view[: self._plain_left]
        written = 0
        while written < len(head):  # short writes: the rest, as it comes
            written += os.write(self._fd, head[written:])
        self._plain_left -= written
        if not self._plain_left:
            self._direct = _set_direct(self._fd, True)
        return view[written:]

    def _write_out(self, size: int) -> None:
        """Write the first ``size`` bytes of the buffer and empty it."""
        view = memoryview(self._map)[:size]
        try:
            written = os.write(self._fd, view)
        except OSError as exc:
            if not self._direct or exc.errno != errno.EINVAL:
                raise
            self._direct = not _set_direct(self._fd, False)  # refused: the page cache then
            written = os.write(self._fd, view)
        while written < size:  # a short write (signals, quotas): the rest, as it comes
            written += os.write(self._fd, view[written:])
        self._fill = 0

    def close(self) -> None:
        """Write what is buffered, then :meth:`release`."""
        if self._direct:
            self._direct = not _set_direct(self._fd, False)
        if self._fill:
            self._write_out(self._fill)
        self.release()

    def release(self) -> None:
        """Free the buffer without writing it (after a failure); idempotent."""
        self._fill = 0
        self._buffer = self._np.empty(0, self._np.uint8)
        if not self._map.closed:
            self._map.close()

