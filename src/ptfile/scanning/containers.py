"""The scanner's walks over ZIP and tar containers: members and anomalies, never an error.

:class:`~ptfile.archive.ZipReader` refuses an ambiguous archive; a scanner must
instead say *what* is ambiguous and look at every reading of it, because a
scanner that sees other bytes than the loader is how scanners are bypassed.
So both walks are the loader's own parsers in their tolerant mode
(:mod:`ptfile.archive.anomalies`): the same records, fields and choices, with
what the loader would raise reported as :class:`Anomaly` records.

ZIP (:func:`walk_zip`): :func:`ptfile.archive.walk.walk_zip` in its tolerant
mode, the loader's own walk (end records, central directory, each local
header) whose docstring lists the anomaly codes, with the checks only a
scanner asks for (``shadow-record``, ``local-header-mismatch``,
``outside-prefix``, ``bytes-before-first-record``, ``scan-limit``...).

tar: the scanner calls :func:`ptfile.archive.tar.read_members` itself, the loader's
tar reader in its tolerant mode, whose docstring lists its anomaly codes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._io.local import Source
from ..archive.anomalies import Anomaly
from ..archive.inflate import inflate_bound, inflate_prefix
from ..archive.records import METHOD_DEFLATED, METHOD_STORED
from ..archive.tar import TarMember
from ..archive.walk import ZipEntry
from ..archive.walk import walk_zip as _walk_zip
from ..errors import ArchiveError, PtfileError
from ..limits import DEFAULT_LIMITS, Limits

__all__ = ["Anomaly", "TarMember", "Window", "ZipEntry", "read_member", "walk_zip"]


def walk_zip(source: Source, limits: Limits = DEFAULT_LIMITS, eocd: int | None = None,
             ) -> tuple[list[ZipEntry], list[Anomaly]] | None:
    """Every member of the ZIP in ``source`` (shadow records included) and its anomalies.

    ``eocd`` forces the end record at that offset (by default the one the
    loader reads).  Returns None when ``source`` has no end of central directory record.
    """
    return _walk_zip(source, limits, tolerant=True, at=eocd)


def _pread(source: Source, offset: int, n: int) -> bytes | None:
    try:
        return source.pread(offset, n, "scan")
    except PtfileError:
        return None


def read_member(source: Source, entry: ZipEntry, limits: Limits) -> bytes | None:
    """A member's bytes (stored or deflated, at most ``Limits.max_pickle_bytes``), or None
    when unreadable.

    A deflated member is inflated by the loader's inflater, to the loader's bound
    (:mod:`ptfile.archive.inflate`): at most ``Limits.max_inflate_ratio`` times its
    compressed size plus :data:`~ptfile.archive.inflate.INFLATE_ALLOWANCE`.

    Raises
    ------
    LimitExceededError
        It declares, or inflates to, more than that: a deflate bomb.
    """
    limit = limits.max_pickle_bytes
    if entry.method == METHOD_STORED:
        return _pread(source, entry.data_offset, min(entry.size, limit))
    if entry.method != METHOD_DEFLATED:
        return None
    ratio = limits.max_inflate_ratio
    most = inflate_bound(entry.name, entry.size, entry.compressed_size, ratio)
    raw = _pread(source, entry.data_offset, min(entry.compressed_size, source.size))
    if raw is None:
        return None
    try:
        return inflate_prefix(raw, entry.name, limit, most, ratio)
    except ArchiveError:  # a damaged stream: no loader reads a pickle from it
        return None


class Window:
    """``size`` bytes of a source from ``start``, as a source of their own."""

    map_access: str | None = None  # a window's views are not the map's whole bytes

    def __init__(self, source: Source, start: int, size: int) -> None:
        self._source, self._start = source, start
        self.size = max(0, min(size, source.size - start))
        self.name = source.name
        self.reads_on_demand = source.reads_on_demand

    def _check(self, offset: int, n: int, what: str) -> None:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise PtfileError(f"{what}: {offset:#x}+{n:#x} outside a {self.size:#x}-byte window")

    def pread(self, offset: int, n: int, what: str) -> bytes:
        self._check(offset, n, what)
        return self._source.pread(self._start + offset, n, what)

    def view(self, offset: int, n: int, what: str) -> memoryview:
        self._check(offset, n, what)
        return self._source.view(self._start + offset, n, what)

    def read_fresh(self, offset: int, n: int, what: str) -> bytearray:
        return bytearray(self.pread(offset, n, what))

    def pread_many(self, ranges: Sequence[tuple[int, int]], what: str) -> list[bytes]:
        return [self.pread(offset, n, what) for offset, n in ranges]

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        self._source.prefetch([(self._start + o, n) for o, n in ranges
                               if o >= 0 and o + n <= self.size])

    def read_all(self) -> memoryview:
        return memoryview(self.pread(0, self.size, "window"))

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """None: a window reads through :meth:`pread`."""
        return None

    @property
    def bytes_fetched(self) -> int:
        """What the server sent for the whole source (0 for a local one)."""
        return self._source.bytes_fetched

    def detached(self) -> Window:
        return self

    def close(self) -> None:
        return
