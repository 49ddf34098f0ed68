"""One walk over a ZIP archive: strict (the loader's) or tolerant (the scanner's).

The steps, in this order, each done by one parser that takes the mode as its
``anomalies`` argument (:mod:`ptfile.archive.anomalies`):

1. The end records: :func:`~ptfile.archive.directory.locate_directory` (the
   last end record, or the one ``at``), then
   :func:`~ptfile.archive.directory.check_counts`.
2. The central directory, read whole, then
   :func:`~ptfile.archive._entries.parse_entries` (with its duplicate-name,
   case-collision and overlap checks).
3. Each member's local header: :func:`read_local_header`.

:func:`read_directory` is steps 1 and 2.  :class:`~ptfile.archive.reader.ZipReader`
is built on it in strict mode and does step 3 lazily, for the members asked for
(or in one vectorised pass, :mod:`ptfile.archive._bulk`, that equals this one).
:func:`walk_zip` is all three steps for every member, in either mode; its
tolerant mode is the scanner's walk (:func:`ptfile.scanning.containers.walk_zip`).

Strict mode raises the :class:`~ptfile.errors.PtfileError` the loader raises
(:class:`~ptfile.errors.ArchiveError` for damage) and passes the oddities the
loader accepts silently.  Tolerant mode records each as an
:class:`~ptfile.archive.anomalies.Anomaly`, the codes that each parser's
docstring lists (among them ``data-after-archive``, ``archive-in-comment``,
``several-end-records``, ``duplicate-name``, ``case-colliding-names``,
``name-mismatch``, ``bad-local-header``, ``data-outside-archive``,
``overlapping-records`` and ``bad-central-directory``), and adds what only a
scanner asks, oddities the loader accepts:

* ``local-header-mismatch``: a local header whose method, CRC or sizes differ
  from its central directory entry's (what a forward-scanning reader reads);
* ``outside-prefix``: a record not under the first record's folder;
* ``overlapping-records``, also with each record's extent taken from its local
  header (name and extra field as the local header gives them);
* ``bytes-before-first-record``: the first local header is not at offset 0
  (a prepended file: a polyglot, e.g. a pickle or an image before the ZIP);
* ``shadow-record``: a local header in the gaps between the records the
  directory names (a record only a forward-scanning reader sees), returned as
  a member with ``shadow=True``;
* ``scan-limit``: more shadow records, or more gap bytes to search for them, than
  ``Limits.max_shadow_records`` or ``Limits.max_shadow_search_bytes``: the rest is
  not searched.

Two checks that find the same thing (same code, offset and member) report it once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final, Literal, overload

from .._io.local import Source
from ..errors import ArchiveError, PtfileError
from ..limits import DEFAULT_LIMITS, Limits
from ._entries import Entries, parse_entries
from .anomalies import Anomaly, report
from .directory import Directory, check_counts, locate_directory
from .records import (
    CENTRAL_DIRECTORY_STRUCT,
    LOCAL_FILE_HEADER_SIGNATURE,
    LOCAL_FILE_HEADER_STRUCT,
    LocalFileHeader,
)

__all__ = ["PREFETCH_HEADERS", "CentralDirectory", "ZipEntry", "local_header_at",
           "read_directory", "read_local_header", "walk_zip"]

#: Local headers a remote source is asked to fetch at once (:meth:`Source.prefetch`).
PREFETCH_HEADERS: Final = 1024
#: Gaps shorter than this hold no shadow record: data descriptors are 16 or 24 bytes.
_DESCRIPTOR_GAP: Final = 24
#: The general purpose flag that moves CRC and sizes to a data descriptor (4.4.4 bit 3).
_DESCRIPTOR_FLAG: Final = 0x8
_U32_SENTINEL: Final = 0xFFFFFFFF
_LOCAL_FIXED: Final = LOCAL_FILE_HEADER_STRUCT.size
_CD_FIXED: Final = CENTRAL_DIRECTORY_STRUCT.size


@dataclass(frozen=True, slots=True)
class CentralDirectory:
    """Where the central directory is (``directory``) and what it holds (``entries``)."""

    directory: Directory
    entries: Entries


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


@overload
def read_directory(source: Source, limits: Limits, anomalies: None = None, *,
                   at: int | None = None) -> CentralDirectory: ...
@overload
def read_directory(source: Source, limits: Limits, anomalies: list[Anomaly], *,
                   at: int | None = None) -> CentralDirectory | None: ...
def read_directory(source: Source, limits: Limits, anomalies: list[Anomaly] | None = None, *,
                   at: int | None = None) -> CentralDirectory | None:
    """Steps 1 and 2: the end records (the one ``at``, by default the last), then the
    central directory, parsed.

    Returns
    -------
    CentralDirectory or None
        None only in tolerant mode, when there is no end record (no ZIP archive).

    Raises
    ------
    ArchiveError, FormatError
        Strict mode: damaged end records or central directory.
    LimitExceededError
        Strict mode: more entries or a longer name than ``limits`` allow.
    UnsupportedFeatureError
        Strict mode: a multi-disk archive or an encrypted member.
    """
    directory = locate_directory(source, anomalies, at=at)
    if directory is None:
        return None
    directory = check_counts(directory, limits, anomalies)
    try:
        data = source.pread(directory.offset, directory.size, "central directory")
    except PtfileError:
        if anomalies is None:
            raise
        data = b""  # past the end of the file: locate_directory has reported it
    count = min(directory.entries, len(data) // _CD_FIXED)  # (strict: check_counts made it so)
    entries = parse_entries(data, count, directory.offset, limits.max_name_length, anomalies)
    return CentralDirectory(directory, entries)


@overload
def walk_zip(source: Source, limits: Limits = DEFAULT_LIMITS, *, tolerant: Literal[False],
             at: int | None = None) -> tuple[list[ZipEntry], list[Anomaly]]: ...
@overload
def walk_zip(source: Source, limits: Limits = DEFAULT_LIMITS, *, tolerant: bool,
             at: int | None = None) -> tuple[list[ZipEntry], list[Anomaly]] | None: ...
def walk_zip(source: Source, limits: Limits = DEFAULT_LIMITS, *, tolerant: bool,
             at: int | None = None) -> tuple[list[ZipEntry], list[Anomaly]] | None:
    """Every member of the ZIP in ``source``, each with its data offset, and the anomalies.

    ``at`` forces the end record at that offset (by default the one the loader
    reads).  Strict mode returns no anomalies; tolerant mode returns shadow
    records too (after the named members), and None when ``source`` has no end
    of central directory record.

    Raises
    ------
    ArchiveError, FormatError, LimitExceededError, UnsupportedFeatureError
        Strict mode only: as :func:`read_directory`, or a damaged local header
        (:func:`read_local_header`).

    Examples
    --------
    >>> import io
    >>> from ptfile._io.local import BytesSource
    >>> from ptfile.archive import ZipWriter
    >>> out = io.BytesIO()
    >>> with ZipWriter(out.write, "archive") as writer:
    ...     writer.write_record("data.pkl", b"\\x80\\x02N.")
    >>> entries, anomalies = walk_zip(BytesSource(out.getvalue()), tolerant=False)
    >>> [(e.name, e.data_offset, e.size) for e in entries][0], anomalies
    (('archive/data.pkl', 64, 4), [])
    >>> walk_zip(BytesSource(b"PK\\x03\\x04 no end record"), tolerant=True) is None
    True
    """
    anomalies: list[Anomaly] | None = [] if tolerant else None
    central = read_directory(source, limits, anomalies, at=at)
    if central is None:
        return None
    members = _read_members(source, central, anomalies)
    if anomalies is None:
        return members, []
    _check_names(members, anomalies)
    ranges = _check_layout(members, anomalies)
    shadows = _shadows(source, ranges, central.directory.offset, anomalies, limits)
    return members + shadows, _deduplicated(anomalies)


def _read_members(source: Source, central: CentralDirectory,
                  anomalies: list[Anomaly] | None) -> list[ZipEntry]:
    """Step 3: each member's local header, in directory order (tolerant mode: a member
    without one is left out, and its local fields are compared with the central ones)."""
    entries, cd_offset = central.entries, central.directory.offset
    members = []
    for row, name in enumerate(entries.names):
        if row % PREFETCH_HEADERS == 0:  # a remote source fetches the next headers at once
            source.prefetch(_header_ranges(entries, row, source.size))
        offset, size, csize, method, crc, _ = entries.row(row)
        data = read_local_header(source, name, offset, csize, cd_offset, anomalies)
        if data is not None:
            members.append(ZipEntry(name, offset, data, size, csize, method))
            if anomalies is not None:
                _check_local_fields(source, name, offset, (method, crc, csize, size), anomalies)
    return members


def _header_ranges(entries: Entries, start: int, size: int) -> list[tuple[int, int]]:
    """The local headers (fixed part and name) of rows ``start`` to ``start +
    PREFETCH_HEADERS``, as ranges inside the file."""
    ranges = []
    for row in range(start, min(start + PREFETCH_HEADERS, len(entries.names))):
        offset = entries.row(row)[0]
        n = _LOCAL_FIXED + len(entries.names[row].encode("utf-8", "surrogateescape"))
        if offset >= 0 and offset + n <= size:
            ranges.append((offset, n))
    return ranges


def local_header_at(source: Source, at: int) -> LocalFileHeader:
    """The local file header at ``at``, name and extra field included (two reads).

    Raises
    ------
    ArchiveError, FormatError
        No local header there, or one that runs past the end of the file.
    """
    fixed = source.pread(at, _LOCAL_FIXED, "local file header")
    nlen, elen = LocalFileHeader.variable_lengths(fixed, base=at)
    rest = source.pread(at + _LOCAL_FIXED, nlen + elen, "local file name and extra field")
    return LocalFileHeader.from_bytes(fixed + rest, base=at)


def read_local_header(source: Source, name: str, header_offset: int, compressed_size: int,
                      cd_offset: int, anomalies: list[Anomaly] | None = None) -> int | None:
    """Step 3 for one member: its data offset, from its local header (4.3.7), checked.

    The header must have its signature and the central directory's name, and
    the data must end at or before the central directory at ``cd_offset``.

    Returns
    -------
    int or None
        ``header_offset + 30 + name length + extra length`` (tolerant mode:
        None when there is no local header there at all).

    Raises
    ------
    ArchiveError
        Strict mode: any of the checks fails.  Tolerant mode reports
        ``bad-local-header``, ``name-mismatch`` or ``data-outside-archive``.
    """
    raw_name = name.encode("utf-8", "surrogateescape")
    try:
        raw = source.view(header_offset, _LOCAL_FIXED + len(raw_name), "local file header")
    except PtfileError as exc:  # past the end of the file
        if anomalies is None:
            raise
        anomalies.append(Anomaly("bad-local-header", f"no local header where the directory "
                                 f"says: {exc}", header_offset, name))
        return None
    sig, *_, nlen, elen = LOCAL_FILE_HEADER_STRUCT.unpack_from(raw)
    offset: int = header_offset + _LOCAL_FIXED + nlen + elen
    if sig != LOCAL_FILE_HEADER_SIGNATURE:
        report(anomalies, "bad-local-header", ArchiveError(
            f"bad local file header signature {sig!r}", offset=header_offset, member=name))
        return None
    if raw[_LOCAL_FIXED:] != raw_name or nlen != len(raw_name):
        local = bytes(raw[_LOCAL_FIXED : _LOCAL_FIXED + nlen])
        report(anomalies, "name-mismatch", ArchiveError(
            f"local header names {local!r}: readers that trust local headers see another "
            "record", offset=header_offset, member=name))
    if offset + compressed_size > cd_offset:
        report(anomalies, "data-outside-archive", ArchiveError(
            f"data at {offset:#x}+{compressed_size:#x} runs into the central directory",
            offset=header_offset, member=name))
    return offset


# Tolerant mode only: what the loader accepts and a scanner reports.


def _pread(source: Source, offset: int, n: int) -> bytes | None:
    try:
        return source.pread(offset, n, "scan")
    except PtfileError:
        return None


def _check_local_fields(source: Source, name: str, offset: int,
                        central: tuple[int, int, int, int], out: list[Anomaly]) -> None:
    """``local-header-mismatch``: a local header whose method, CRC or sizes differ from the
    central directory's.  miniz and ``zipfile`` read the directory's; readers that scan
    forward through local headers read the local ones: other bytes.  CRC and sizes are
    compared only where the local header holds them (no data descriptor, no ZIP64)."""
    raw = _pread(source, offset, _LOCAL_FIXED)
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


def _deduplicated(anomalies: list[Anomaly]) -> list[Anomaly]:
    """The first of the anomalies two checks found alike (same code, offset and member)."""
    seen: set[tuple[str, int | None, str | None]] = set()
    kept = []
    for a in anomalies:
        if (a.code, a.offset, a.member) not in seen:
            seen.add((a.code, a.offset, a.member))
            kept.append(a)
    return kept
