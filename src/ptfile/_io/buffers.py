"""A whole file read into one fresh, writable buffer, as fast as the platform allows.

:func:`read_file` is how a path that is not mapped is read (``ptfile.load(path,
mmap=False)``: :func:`ptfile._io.local.open_source`); its docstring says how and why
(an anonymous map, populated up front or filled by a few threads in chunks).
"""

from __future__ import annotations

import mmap as _mmap
import os
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Final

__all__ = ["ANONYMOUS_MAP_BYTES", "PARALLEL_READ_MIN_BYTES", "read_file"]


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
