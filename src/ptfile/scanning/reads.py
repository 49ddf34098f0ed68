"""What the scanner reads of a source before judging it: windows, heads and ends.

* :func:`stream_head`: the bytes a stream scan reads (a URL's: a window that
  holds the first pickles, grown while a pickle runs past it);
* :func:`next_head`: where a pickle (``PROTO``, or a protocol 0/1 ``GLOBAL``
  line) or a ZIP local header starts in bytes after a record's ``STOP``;
* :func:`holds_zip`: whether a file holds a ZIP archive with records.
"""

from __future__ import annotations

import re
from typing import Final

from .._io.local import Source
from ..errors import PtfileError
from ..limits import Limits
from ..picklevm import check_stream
from .containers import Window, walk_zip

__all__ = ["FIRST_STREAM_WINDOW", "holds_pickles", "holds_zip", "next_head", "stream_head"]

#: Where a pickle or a ZIP may start in the bytes after STOP.
_TRAILING_HEADS: Final = (b"PK\x03\x04", *(bytes([0x80, p]) for p in range(1, 6)))
#: A protocol 0/1 GLOBAL (``c<module>\n<name>\n``): where a PROTO-less pickle starts.
_GLOBAL_LINE: Final = re.compile(rb"c[A-Za-z_][\w.]{0,200}\n[A-Za-z_][\w.]{0,200}\n")


def next_head(data: bytes, start: int) -> int:
    """The first offset from ``start`` where a pickle or a ZIP may start, or -1."""
    found = [at for head in _TRAILING_HEADS if (at := data.find(head, start)) >= 0]
    line = _GLOBAL_LINE.search(data, start)
    if line is not None:
        found.append(line.start())
    return min(found, default=-1)


#: The first window of a stream read from a source that reads on demand (a URL).
FIRST_STREAM_WINDOW: Final = 1 << 20


def stream_head(source: Source, limits: Limits, pickles: int) -> bytes:
    """The bytes the stream scan reads: up to ``Limits.max_pickle_bytes`` of the file; from
    a source that reads on demand, only a window that holds the first ``pickles``
    consecutive pickles (a legacy file's five, not its storages after them), grown 4x
    while a pickle runs past it."""
    most = min(source.size, limits.max_pickle_bytes)
    window = most if not source.reads_on_demand or not pickles else \
        min(most, FIRST_STREAM_WINDOW)
    while True:
        data = source.pread(0, window, "pickle stream")
        if window >= most or holds_pickles(data, pickles, limits):
            return data
        window = min(most, window * 4)


def holds_pickles(data: bytes, count: int, limits: Limits) -> bool:
    """True when ``data`` holds ``count`` well-formed consecutive pickles from its start."""
    pos = 0
    for _ in range(count):
        try:
            pos = check_stream(data, limits, start=pos).end
        except PtfileError:
            return False
        if pos >= len(data):
            return False
    return True


def holds_zip(source: Source, limits: Limits, shifted: bool = True) -> bool:
    """Whether a ZIP reading of ``source`` (miniz's, or with ``shifted`` the archive another
    end record or ``zipfile``'s shifted offsets point at) has records: an end record of
    no entries (tensor bytes that hold its signature) is nothing to read.

    A file that does not start with a ZIP is read as one by no torch loader but through
    miniz (``torch.jit.load``, ``torch.export.load``), which takes the offsets the end
    record states: ``shifted=False`` asks only for that reading (the bytes of a ZIP
    saved inside a storage are no archive any loader reads)."""
    walked = walk_zip(source, limits)
    if walked is None or walked[0] or not shifted:
        return walked is not None and bool(walked[0])
    for anomaly in walked[1]:
        if anomaly.region is not None and 0 < anomaly.region[1] < source.size:
            inner = walk_zip(Window(source, *anomaly.region), limits)
            if inner is not None and inner[0]:
                return True
    return False
