"""The scanner's walks over ZIP and tar containers: members and anomalies, never an error.

:class:`~ptfile.archive.ZipReader` refuses an ambiguous archive; a scanner must
instead say *what* is ambiguous and look at every reading of it, because a
scanner that sees other bytes than the loader is how scanners are bypassed.
So both walks are the loader's own parsers in their tolerant mode
(:mod:`ptfile.archive.anomalies`): the same records, fields and choices, with
what the loader would raise reported as :class:`Anomaly` records.

ZIP (:func:`walk_zip`): the end records (:func:`ptfile.archive.directory.locate_directory`),
the central directory (:func:`ptfile.archive._entries.parse_entries`) and each
local header (:func:`ptfile.archive.reader.read_local_header`), whose
docstrings list their anomaly codes: among them ``data-after-archive``,
``archive-in-comment``, ``several-end-records``, ``duplicate-name``,
``case-colliding-names``,
``name-mismatch``, ``bad-local-header``, ``data-outside-archive``,
``overlapping-records`` and ``bad-central-directory``.  On top of them, what
only a scanner asks:

* ``bytes-before-first-record``: the first local header is not at offset 0
  (a prepended file: a polyglot, e.g. a pickle or an image before the ZIP);
* ``overlapping-records``, also with each record's extent taken from its local
  header (name and extra field as the local header gives them);
* ``shadow-record``: a local header in the gaps between the records the
  directory names (a record only a forward-scanning reader sees);
* ``local-header-mismatch``: a local header whose method, CRC or sizes differ
  from its central directory entry's (what a forward-scanning reader reads);
* ``outside-prefix``: a record not under the first record's folder;
* ``scan-limit``: more shadow records, or more gap bytes to search for them, than
  ``Limits.max_shadow_records`` or ``Limits.max_shadow_search_bytes``: the rest is
  not searched.

tar (:func:`walk_tar`): :func:`ptfile.archive.tar.read_members`, the loader's
tar reader, whose docstring lists its anomaly codes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .._io.local import Source
from ..archive._entries import Entries, parse_entries
from ..archive.anomalies import Anomaly
from ..archive.directory import check_counts, locate_directory
from ..archive.inflate import inflate_bound, inflate_prefix
from ..archive.reader import local_header_at, read_local_header
from ..archive.records import (
    LOCAL_FILE_HEADER_SIGNATURE,
    LOCAL_FILE_HEADER_STRUCT,
    METHOD_DEFLATED,
    METHOD_STORED,
    CentralDirectoryHeader,
)
from ..archive.tar import TarMember, read_members
from ..errors import ArchiveError, PtfileError
from ..limits import DEFAULT_LIMITS, Limits

__all__ = ["Anomaly", "TarMember", "Window", "ZipEntry", "read_member", "walk_tar", "walk_zip"]

#: Local headers a remote source is asked to fetch at once (:meth:`Source.prefetch`).
PREFETCH_HEADERS: Final = 1024
#: Gaps shorter than this hold no shadow record: data descriptors are 16 or 24 bytes.
_DESCRIPTOR_GAP: Final = 24


@dataclass(frozen=True, slots=True)
class ZipEntry:
    """A member, from its central directory entry (or a shadow local header)."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    compressed_size: int
    method: int
    shadow: bool = False


def _pread(source: Source, offset: int, n: int) -> bytes | None:
    try:
        return source.pread(offset, n, "scan")
    except PtfileError:
        return None


def _check_names(entries: list[ZipEntry], out: list[Anomaly]) -> None:
    """Names outside the first one's folder (exact duplicates and names equal but for
    case are the central directory parser's ``duplicate-name`` and
    ``case-colliding-names``)."""
    prefix = entries[0].name.split("/", 1)[0] + "/" if entries else ""
    out.extend(Anomaly("outside-prefix", f"not under the archive folder {prefix!r}",
                       e.header_offset, e.name) for e in entries if not e.name.startswith(prefix))


def _check_layout(entries: list[ZipEntry], out: list[Anomaly]) -> list[tuple[int, int]]:
    """Overlaps (extents from the local headers) and a prefix; returns the occupied ranges,
    sorted."""
    ranges = sorted((e.header_offset, e.data_offset + e.compressed_size, e.name)
                    for e in entries)
    out.extend(Anomaly("overlapping-records", f"overlaps record {other!r} at {start:#x}",
                       first, name)
               for (first, end, name), (start, _, other) in itertools.pairwise(ranges)
               if end > start)
    if ranges and ranges[0][0] > 0:
        out.append(Anomaly("bytes-before-first-record", f"{ranges[0][0]} bytes precede the "
                           "first record (a prepended file or polyglot)", 0))
    return [(s, e) for s, e, _ in ranges]


def _shadows(source: Source, ranges: list[tuple[int, int]], cd_offset: int,
             out: list[Anomaly], limits: Limits) -> list[ZipEntry]:
    """Local headers in the gaps between named records (``Limits.max_shadow_records`` of
    them in ``Limits.max_shadow_search_bytes`` of gaps, at most: then a ``scan-limit``)."""
    found: list[ZipEntry] = []
    cursor, budget, cut = 0, limits.max_shadow_search_bytes, ""
    for start, end in [*ranges, (cd_offset, cd_offset)]:
        gap = min(start - cursor, budget)
        if start - cursor > max(gap, _DESCRIPTOR_GAP) and not cut:
            cut = (f"gaps between records hold more than {limits.max_shadow_search_bytes:,} "
                   "bytes (Limits.max_shadow_search_bytes): the rest is not searched for "
                   "shadow records")
        if gap > _DESCRIPTOR_GAP:
            data = _pread(source, cursor, gap) or b""
            budget -= gap
            at = data.find(LOCAL_FILE_HEADER_SIGNATURE)
            while at >= 0 and len(found) < limits.max_shadow_records:
                found.extend(_shadow(source, cursor + at, out))
                at = data.find(LOCAL_FILE_HEADER_SIGNATURE, at + 4)
            if at >= 0 and not cut:
                cut = (f"more than {limits.max_shadow_records} shadow records "
                       "(Limits.max_shadow_records): the rest are not read")
        cursor = max(cursor, end)
    if cut:
        out.append(Anomaly("scan-limit", cut, 0))
    return found


def _shadow(source: Source, at: int, out: list[Anomaly]) -> list[ZipEntry]:
    try:
        header = local_header_at(source, at)
    except PtfileError:
        return []
    name = header.name.decode("utf-8", "surrogateescape")
    out.append(Anomaly("shadow-record", "a local header the central directory never names "
                       "(readers that scan forward see it)", at, name))
    data = at + header.SIZE + len(header.name) + len(header.extra)
    return [ZipEntry(name, at, data, header.uncompressed_size, header.compressed_size,
                     header.method, shadow=True)]


#: The general purpose flag that moves CRC and sizes to a data descriptor (4.4.4 bit 3).
_DESCRIPTOR_FLAG: Final = 0x8
_U32_SENTINEL: Final = 0xFFFFFFFF


def _check_local_fields(source: Source, name: str, offset: int,
                        central: tuple[int, int, int, int], out: list[Anomaly]) -> None:
    """``local-header-mismatch``: a local header whose method, CRC or sizes differ from the
    central directory's.  miniz and ``zipfile`` read the directory's; readers that scan
    forward through local headers read the local ones: other bytes.  CRC and sizes are
    compared only where the local header holds them (no data descriptor, no ZIP64)."""
    raw = _pread(source, offset, LOCAL_FILE_HEADER_STRUCT.size)
    if raw is None:
        return
    _, _, flags, method, _, _, crc, csize, size, _, _ = LOCAL_FILE_HEADER_STRUCT.unpack(raw)
    local = (method, crc, csize, size)
    compared = 1 if flags & _DESCRIPTOR_FLAG or _U32_SENTINEL in (csize, size) else 4
    if local[:compared] != central[:compared]:
        fields = ("method", "crc32", "compressed size", "size")
        differ = [f"{f} {a} (central {b})" for f, a, b in
                  zip(fields[:compared], local, central, strict=False) if a != b]
        out.append(Anomaly("local-header-mismatch", "the local header disagrees with the "
                           f"central directory: {', '.join(differ)}", offset, name))


def _deduplicated(anomalies: list[Anomaly]) -> list[Anomaly]:
    """The first of the anomalies two checks found alike (same code, offset and member)."""
    seen: set[tuple[str, int | None, str | None]] = set()
    kept = []
    for a in anomalies:
        if (a.code, a.offset, a.member) not in seen:
            seen.add((a.code, a.offset, a.member))
            kept.append(a)
    return kept


def walk_zip(source: Source, limits: Limits = DEFAULT_LIMITS, eocd: int | None = None,
             ) -> tuple[list[ZipEntry], list[Anomaly]] | None:
    """Every member of the ZIP in ``source`` (shadow records included) and its anomalies.

    ``eocd`` forces the end record at that offset (by default the one the
    loader reads).  Returns None when ``source`` has no end of central directory record.
    """
    out: list[Anomaly] = []
    directory = locate_directory(source, out, at=eocd)
    if directory is None:
        return None
    directory = check_counts(directory, limits, out)
    cd = _pread(source, directory.offset, directory.size) or b""
    parsed = parse_entries(cd, min(directory.entries, len(cd) // CentralDirectoryHeader.SIZE), directory.offset,
                           limits.max_name_length, out)
    entries = []
    for row, name in enumerate(parsed.names):
        if row % PREFETCH_HEADERS == 0:  # a remote source fetches the next headers at once
            source.prefetch(_header_ranges(parsed, row, source.size))
        offset, size, csize, method, crc, _ = parsed.row(row)
        data = read_local_header(source, name, offset, csize, directory.offset, out)
        if data is not None:
            entries.append(ZipEntry(name, offset, data, size, csize, method))
            _check_local_fields(source, name, offset, (method, crc, csize, size), out)
    _check_names(entries, out)
    ranges = _check_layout(entries, out)
    return (entries + _shadows(source, ranges, directory.offset, out, limits),
            _deduplicated(out))


def _header_ranges(parsed: Entries, start: int, size: int) -> list[tuple[int, int]]:
    """The local headers (fixed part and name) of rows ``start`` to ``start +
    PREFETCH_HEADERS``, as ranges inside the file."""
    ranges = []
    for row in range(start, min(start + PREFETCH_HEADERS, len(parsed.names))):
        offset = parsed.row(row)[0]
        n = LOCAL_FILE_HEADER_STRUCT.size + len(parsed.names[row].encode("utf-8", "surrogateescape"))
        if offset >= 0 and offset + n <= size:
            ranges.append((offset, n))
    return ranges


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

    def detached(self) -> Window:
        return self

    def close(self) -> None:
        return


def walk_tar(source: Source, limits: Limits) -> tuple[list[TarMember], list[Anomaly]]:
    """The members of a tar archive, as the loader reads them, and its anomalies.

    The tolerant mode of :func:`ptfile.archive.tar.read_members` (the loader's
    reader): the same headers, member types and PAX/GNU extensions.
    """
    anomalies: list[Anomaly] = []
    return read_members(source, limits, anomalies), anomalies
