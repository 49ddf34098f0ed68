"""The end records of a ZIP archive: where its central directory is (APPNOTE 4.3.14-4.3.16).

What is read and checked is specified in :mod:`ptfile.archive.records`
("Readers"): a bounded backwards search for the end of central directory
record (the last signature whose 22 fixed bytes fit in the file), ZIP64
values through the locator right before it, a single-disk archive, and a
central directory that lies before the end records and can hold its entries.

Strict mode raises what the loader raises.  Tolerant mode
(:mod:`ptfile.archive.anomalies`) goes on with what it can read, and reports:

* ``data-after-archive``: bytes after the end record's comment (strict mode
  refuses them: torch writes none, and a payload appended there is what
  readers that look past the end record, or for a second archive, act on);
* ``archive-in-comment``: ZIP records inside the comment (``region``: the comment);
* ``several-end-records``: another end record before the one chosen, in the
  search window, whose directory lies before it and starts with a central
  directory header (``eocd``: the nearest; a signature inside member data is none);
* ``comment-past-end``: the chosen record's comment runs past the end of the
  file (it is read as far as the file goes, as miniz and ``zipfile`` read it);
* ``bad-zip64-end``: a ZIP64 locator or record that cannot be read (the
  classic values are used);
* ``spanned-archive``: disk numbers of a multi-disk archive;
* ``shifted-directory``: bytes between the central directory and the end
  records (strict mode refuses it): Python's ``zipfile`` reads every offset that
  many bytes later (``region``: the archive as it reads it), miniz as written;
* ``bad-central-directory``: a directory running past the end records, or
  too small for its entry count (it is clipped), or more entries than
  ``Limits.max_records``.

Without an end record there is no ZIP archive: strict mode raises, tolerant
mode returns None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from .._io.local import Source
from ..errors import ArchiveError, LimitExceededError, PtfileError, UnsupportedFeatureError
from ..limits import Limits
from .anomalies import Anomaly, report
from .records import (
    CENTRAL_DIRECTORY_SIGNATURE,
    CENTRAL_DIRECTORY_STRUCT,
    EOCD_SIGNATURE,
    LOCAL_FILE_HEADER_SIGNATURE,
    U16_MAX,
    ZIP64_LOCATOR_SIGNATURE,
    EndOfCentralDirectory,
    Zip64EndOfCentralDirectory,
    Zip64Locator,
)

__all__ = ["EOCD_SEARCH_BYTES", "Directory", "EndRecord", "check_counts", "find_end",
           "locate_directory"]

#: The EOCD comment length is a u16, so the record starts within this many
#: bytes of the end of the file (4.3.16).
EOCD_SEARCH_BYTES: Final = EndOfCentralDirectory.SIZE + U16_MAX
_CD_FIXED: Final = CENTRAL_DIRECTORY_STRUCT.size


@dataclass(frozen=True, slots=True)
class EndRecord:
    """The end of central directory record the archive is read through, and its offset."""

    record: EndOfCentralDirectory
    offset: int


@dataclass(frozen=True, slots=True)
class Directory:
    """Where the central directory is, per the end records."""

    offset: int
    size: int
    entries: int
    end: int  # the central directory must end at or before this offset


def _tolerant_checks(source: Source, eocd: EndOfCentralDirectory, tail: bytes, pos: int,
                     base: int, anomalies: list[Anomaly]) -> None:
    comment_end = pos + EndOfCentralDirectory.SIZE + len(eocd.comment)
    if comment_end < len(tail):
        anomalies.append(Anomaly("data-after-archive", f"{len(tail) - comment_end} bytes after "
                                 "the end of the archive", base + comment_end))
    if LOCAL_FILE_HEADER_SIGNATURE in eocd.comment or CENTRAL_DIRECTORY_SIGNATURE in eocd.comment:
        anomalies.append(Anomaly(
            "archive-in-comment", "the archive comment holds ZIP records (a second archive)",
            base + pos, region=(base + pos + EndOfCentralDirectory.SIZE, len(eocd.comment))))
    earlier = tail.rfind(EOCD_SIGNATURE, 0, pos)
    while earlier >= 0 and not _is_plausible_end(source, tail, earlier, base):
        earlier = tail.rfind(EOCD_SIGNATURE, 0, earlier)
    if earlier >= 0:
        anomalies.append(Anomaly(
            "several-end-records", "more than one end of central directory record near the end "
            "of the file: readers that stop at another one see another archive", base + earlier,
            eocd=base + earlier))


def _refuse_trailing(eocd: EndOfCentralDirectory, tail: bytes, pos: int, base: int) -> None:
    """Strict mode: nothing may follow the end record and its comment."""
    comment_end = pos + EndOfCentralDirectory.SIZE + len(eocd.comment)
    if comment_end < len(tail):
        raise ArchiveError(f"{len(tail) - comment_end} bytes after the end of the archive (its "
                           "end record and comment): torch writes none, and appended data is "
                           "where a second payload hides; ptfile.scan reports it",
                           offset=base + comment_end)


def _is_plausible_end(source: Source, tail: bytes, pos: int, base: int) -> bool:
    """Whether the signature at ``pos`` opens an end record of another archive, not bytes
    of a member that happen to hold it: its directory lies before it and starts with a
    central directory header (an archive without entries holds nothing to read)."""
    eocd = _parse_end(tail, pos, base, None)
    if eocd is None or eocd.total_entries == 0 or eocd.cd_offset + eocd.cd_size > base + pos \
            or eocd.cd_size < eocd.total_entries * _CD_FIXED:
        return False
    try:
        head = source.pread(eocd.cd_offset, len(CENTRAL_DIRECTORY_SIGNATURE), "central directory")
    except PtfileError:
        return False
    return head == CENTRAL_DIRECTORY_SIGNATURE


def _parse_end(tail: bytes, pos: int, base: int,
               anomalies: list[Anomaly] | None) -> EndOfCentralDirectory | None:
    """The end record at ``pos`` (None if there is none), its comment cut at the end of the file.

    miniz (torch's reader) and Python's ``zipfile`` read a comment that runs
    past the end of the file as far as the file goes; so does ptfile.
    """
    try:
        return EndOfCentralDirectory.from_bytes(tail, pos, base=base)
    except ArchiveError:
        pass
    try:  # the comment runs past the end (or there is no record here at all)
        padded = EndOfCentralDirectory.from_bytes(tail[pos:] + bytes(U16_MAX), base=base + pos)
    except ArchiveError:
        return None
    present = len(tail) - pos - EndOfCentralDirectory.SIZE
    if anomalies is not None:
        anomalies.append(Anomaly("comment-past-end", f"the archive comment of "
                                 f"{len(padded.comment)} bytes runs past the end of the file "
                                 f"({present} present)", base + pos))
    return dataclasses.replace(padded, comment=padded.comment[:present])


def find_end(source: Source, anomalies: list[Anomaly] | None = None, *,
             at: int | None = None) -> EndRecord | None:
    """The last end record whose fixed 22 bytes fit in the file (or the one ``at``).

    Raises
    ------
    ArchiveError
        Strict mode only: no end record.
    """
    window = min(source.size, EOCD_SEARCH_BYTES)
    base = source.size - window
    if at is not None and not base <= at:
        base, window = at, source.size - at  # an end record before the usual window
    tail = source.pread(base, window, "end of central directory search window")
    pos = tail.rfind(EOCD_SIGNATURE) if at is None else at - base
    while at is None and pos >= 0 and pos + EndOfCentralDirectory.SIZE > window:
        pos = tail.rfind(EOCD_SIGNATURE, 0, pos)
    eocd = _parse_end(tail, pos, base, anomalies) if pos >= 0 else None
    if eocd is not None:
        if anomalies is not None:
            _tolerant_checks(source, eocd, tail, pos, base, anomalies)
        else:
            _refuse_trailing(eocd, tail, pos, base)
        return EndRecord(eocd, base + pos)
    if anomalies is None:
        raise ArchiveError("no end of central directory record: not a ZIP archive, or truncated",
                           offset=source.size)
    return None


def _read_zip64(source: Source, eocd_offset: int) -> Zip64EndOfCentralDirectory | None:
    """The ZIP64 EOCD record, or None when no locator precedes the EOCD."""
    locator_offset = eocd_offset - Zip64Locator.SIZE
    if locator_offset < 0:
        return None
    raw = source.pread(locator_offset, Zip64Locator.SIZE, "ZIP64 locator")
    if not raw.startswith(ZIP64_LOCATOR_SIGNATURE):
        return None
    locator = Zip64Locator.from_bytes(raw, base=locator_offset)
    offset = locator.eocd64_offset
    if offset > locator_offset - Zip64EndOfCentralDirectory.SIZE:
        raise ArchiveError(
            f"ZIP64 locator points at {offset:#x}, past the room before it", offset=locator_offset
        )
    data = source.pread(offset, Zip64EndOfCentralDirectory.SIZE, "ZIP64 end of central directory")
    return Zip64EndOfCentralDirectory.from_bytes(data, base=offset)


def _zip64_or_none(source: Source, end: EndRecord,
                   anomalies: list[Anomaly] | None) -> Zip64EndOfCentralDirectory | None:
    try:
        return _read_zip64(source, end.offset)
    except PtfileError as exc:
        if end.record.uses_zip64:
            report(anomalies, "bad-zip64-end", exc)
        elif anomalies is not None:
            anomalies.append(Anomaly("bad-zip64-end", str(exc), getattr(exc, "offset", None)))
        return None  # a broken ZIP64 record the classic one does not need


def locate_directory(source: Source, anomalies: list[Anomaly] | None = None, *,
                     at: int | None = None) -> Directory | None:
    """Read the end records (the one ``at``, by default the last); ZIP64 values win.

    Raises
    ------
    ArchiveError
        Strict mode: no end record, a damaged ZIP64 record the classic one
        needs, or a central directory that runs past the end records or ends
        before them (``zipfile`` would shift every offset).
    UnsupportedFeatureError
        Strict mode: a multi-disk archive.
    """
    end = find_end(source, anomalies, at=at)
    if end is None:
        return None
    eocd, eocd64 = end.record, _zip64_or_none(source, end, anomalies)
    if eocd64 is None:
        disks = (eocd.disk_number, eocd.cd_disk, eocd.entries_on_disk)
        found = Directory(eocd.cd_offset, eocd.cd_size, eocd.total_entries, end.offset)
    else:
        disks = (eocd64.disk_number, eocd64.cd_disk, eocd64.entries_on_disk)
        stop = end.offset - Zip64Locator.SIZE - Zip64EndOfCentralDirectory.SIZE
        found = Directory(eocd64.cd_offset, eocd64.cd_size, eocd64.total_entries, stop)
    if disks != (0, 0, found.entries):
        report(anomalies, "spanned-archive", UnsupportedFeatureError(
            f"archive spans several disks (disk numbers and counts {disks}, {found.entries} "
            "entries in all); only single-file archives are supported"))
    if found.offset + found.size > found.end:
        report(anomalies, "bad-central-directory", ArchiveError(
            f"central directory {found.offset:#x}+{found.size:#x} runs past the end records at "
            f"{found.end:#x}", offset=found.offset))
        size = max(0, min(found.size, source.size - found.offset))
        found = Directory(found.offset, size, found.entries, found.end)
    elif found.entries and found.offset + found.size < (start := _records_start(source, end,
                                                                                found)):
        _shifted(source, found, start, anomalies)
    return found


def _records_start(source: Source, end: EndRecord, found: Directory) -> int:
    """Where the end records start: the ZIP64 record's place when a ZIP64 locator precedes
    the end record (even one whose record cannot be read), else the end record."""
    at = end.offset - Zip64Locator.SIZE
    if found.end == end.offset and at >= 0 and \
            source.pread(at, 4, "ZIP64 locator") == ZIP64_LOCATOR_SIGNATURE:
        return max(0, at - Zip64EndOfCentralDirectory.SIZE)
    return found.end


def _shifted(source: Source, found: Directory, start: int,
             anomalies: list[Anomaly] | None) -> None:
    """Bytes between the central directory and the end records: Python's ``zipfile``
    takes them for a file prepended to the archive and adds their count to every offset
    (reading the directory and records that many bytes later), while miniz (torch) and
    this reader take the offsets as written: two readings."""
    shift = start - found.offset - found.size
    error = ArchiveError(
        f"{shift} bytes lie between the central directory ({found.offset:#x}+{found.size:#x}) "
        f"and the end records at {start:#x}: Python's zipfile shifts every offset by "
        f"{shift} and reads other records than torch", offset=found.offset + found.size)
    if anomalies is None:
        raise error
    anomalies.append(Anomaly("shifted-directory", str(error), error.offset,
                             region=(shift, source.size - shift)))


def check_counts(directory: Directory, limits: Limits,
                 anomalies: list[Anomaly] | None = None) -> Directory:
    """Entry count against the limit and against the bytes the directory has.

    Returns the directory, its count clipped to what fits in tolerant mode.

    Raises
    ------
    LimitExceededError, ArchiveError
        Strict mode: too many entries, or fewer bytes than they need.
    """
    entries = directory.entries
    if entries > limits.max_records:
        report(anomalies, "bad-central-directory", LimitExceededError(
            "max_records", limits.max_records, entries, "archive entries"))
        entries = limits.max_records
    if entries * _CD_FIXED > directory.size:
        report(anomalies, "bad-central-directory", ArchiveError(
            f"central directory of {directory.size} bytes cannot hold {entries} entries of at "
            f"least {_CD_FIXED} bytes", offset=directory.offset))
        entries = directory.size // _CD_FIXED
    if entries == directory.entries:
        return directory
    return Directory(directory.offset, directory.size, entries, directory.end)
