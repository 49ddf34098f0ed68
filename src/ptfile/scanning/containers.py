"""Tolerant walks over ZIP and tar containers for :func:`ptfile.scan`: members and anomalies.

:class:`~ptfile.archive.ZipReader` refuses an ambiguous archive; a scanner must
instead say *what* is ambiguous and look at every reading of it, because a
scanner that sees other bytes than the loader is how scanners are bypassed.
This module never raises on damage: it lists what it can and describes the rest
as :class:`Anomaly` records.

ZIP (APPNOTE 4.3): the end of central directory record is the *last*
``PK\\x05\\x06`` within the final 65,557 bytes (miniz and ptfile search
backwards; Python's ``zipfile`` too).  Anomalies reported:

* ``bytes-before-first-record``: the first local header is not at offset 0
  (a prepended file: a polyglot, e.g. a pickle or an image before the ZIP);
* ``data-after-archive``: bytes after the end record's comment;
* ``archive-in-comment`` / ``several-end-records``: another end record or local
  header inside the comment or before the chosen end record;
* ``duplicate-name`` and ``case-colliding-names``;
* ``name-mismatch``: local header name differs from the central one;
* ``bad-local-header``, ``data-outside-archive``, ``overlapping-records``;
* ``shadow-record``: a local header in the gaps between the records the
  directory names (a record only a forward-scanning reader sees);
* ``outside-prefix``: a record not under the first record's folder.

tar: :func:`walk_tar` is the tolerant mode of the loader's tar reader,
:mod:`ptfile.archive.tar` (whose docstring lists its anomaly codes).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from .._io import Source
from ..archive.anomalies import Anomaly
from ..archive.tar import TarMember, read_members
from ..errors import PtfileError
from ..limits import Limits

__all__ = ["Anomaly", "TarMember", "Window", "ZipEntry", "walk_tar", "walk_zip"]

_EOCD: Final = struct.Struct("<4s4H2LH")
_CD: Final = struct.Struct("<4s6H3L5H2L")
_LOCAL: Final = struct.Struct("<4s5H3L2H")
_LOC64: Final = struct.Struct("<4sLQL")
_EOCD64: Final = struct.Struct("<4sQ2H2L4Q")
_SEARCH: Final = _EOCD.size + 0xFFFF
#: Local header signatures looked for in gaps, at most (a hostile file may have millions).
MAX_SHADOWS: Final = 64
#: Gap bytes searched for shadow records, at most.
MAX_GAP_BYTES: Final = 1 << 26


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


def _find_end(source: Source, out: list[Anomaly],
              forced: int | None) -> tuple[int, tuple[int, ...]] | None:
    window = min(source.size, _SEARCH)
    tail = _pread(source, source.size - window, window) or b""
    base = source.size - window
    pos = tail.rfind(b"PK\x05\x06") if forced is None else forced - base
    while pos >= 0 and pos + _EOCD.size > len(tail):
        pos = tail.rfind(b"PK\x05\x06", 0, pos)
    if pos < 0:
        return None
    fields = _EOCD.unpack_from(tail, pos)
    comment_end = pos + _EOCD.size + fields[7]
    if comment_end < len(tail):
        out.append(Anomaly("data-after-archive", f"{len(tail) - comment_end} bytes after the "
                           "end of the archive", base + comment_end))
    comment = tail[pos + _EOCD.size:comment_end]
    if b"PK\x03\x04" in comment or b"PK\x01\x02" in comment:
        out.append(Anomaly("archive-in-comment", "the archive comment holds ZIP records (a "
                           "second archive)", base + pos,
                           region=(base + pos + _EOCD.size, len(comment))))
    earlier = tail.rfind(b"PK\x05\x06", 0, pos)
    if earlier >= 0 and earlier + _EOCD.size <= len(tail):
        out.append(Anomaly("several-end-records", "more than one end of central directory "
                           "record near the end of the file: readers that stop at another one "
                           "see another archive", base + earlier, eocd=base + earlier))
    return base + pos, fields


def _directory(source: Source, eocd_at: int, fields: tuple[int, ...]) -> tuple[int, int, int]:
    """(offset, size, entries) of the central directory, ZIP64 values preferred."""
    entries, size, offset = fields[4], fields[5], fields[6]
    raw = _pread(source, eocd_at - _LOC64.size, _LOC64.size) if eocd_at >= _LOC64.size else None
    if raw and raw.startswith(b"PK\x06\x07"):
        at = _LOC64.unpack(raw)[2]
        rec = _pread(source, at, _EOCD64.size)
        if rec and rec.startswith(b"PK\x06\x06"):
            values = _EOCD64.unpack(rec)
            entries, size, offset = values[7], values[8], values[9]
    return offset, size, entries


def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{min(length, len(extra) - pos - 4) // 8}Q",
                                             extra, pos + 4))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
            break
        pos += 4 + length
    return usize, csize, offset


def _local(source: Source, name: str, at: int, out: list[Anomaly]) -> int | None:
    """The data offset from the local header at ``at``; anomalies for a bad or renamed one."""
    raw = _pread(source, at, _LOCAL.size)
    if raw is None or not raw.startswith(b"PK\x03\x04"):
        out.append(Anomaly("bad-local-header", "no local header where the directory says",
                           at, name))
        return None
    nlen, elen = (int(v) for v in _LOCAL.unpack(raw)[9:11])
    local = _pread(source, at + _LOCAL.size, nlen) or b""
    if local != name.encode("utf-8", "surrogateescape"):
        out.append(Anomaly("name-mismatch", f"the local header names {local[:80]!r}; readers "
                           "that trust local headers see another record", at, name))
    return at + _LOCAL.size + nlen + elen


def _entries(source: Source, cd: bytes, count: int, out: list[Anomaly]) -> list[ZipEntry]:
    found: list[ZipEntry] = []
    pos = 0
    for _ in range(count):
        if pos + _CD.size > len(cd) or cd[pos:pos + 4] != b"PK\x01\x02":
            out.append(Anomaly("bad-central-directory", "central directory ends early or is "
                               f"damaged after {len(found)} entries"))
            break
        f = _CD.unpack_from(cd, pos)
        nlen, elen, clen = f[10], f[11], f[12]
        name = cd[pos + _CD.size:pos + _CD.size + nlen].decode("utf-8", "surrogateescape")
        extra = cd[pos + _CD.size + nlen:pos + _CD.size + nlen + elen]
        usize, csize, offset = _zip64(extra, f[9], f[8], f[16])
        pos += _CD.size + nlen + elen + clen
        data = _local(source, name, offset, out)
        if data is not None:
            found.append(ZipEntry(name, offset, data, usize, csize, f[4]))
    return found


def _check_names(entries: list[ZipEntry], out: list[Anomaly]) -> None:
    seen: dict[str, str] = {}
    folded: dict[str, str] = {}
    for e in entries:
        if e.name in seen:
            out.append(Anomaly("duplicate-name", "two central directory entries share this "
                               "name: readers disagree on which one it means", e.header_offset,
                               e.name))
        elif e.name.casefold() in folded:
            out.append(Anomaly("case-colliding-names", f"differs from "
                               f"{folded[e.name.casefold()]!r} only in case", e.header_offset,
                               e.name))
        seen[e.name] = e.name
        folded.setdefault(e.name.casefold(), e.name)
    prefix = entries[0].name.split("/", 1)[0] + "/" if entries else ""
    out.extend(Anomaly("outside-prefix", f"not under the archive folder {prefix!r}",
                       e.header_offset, e.name) for e in entries if not e.name.startswith(prefix))


def _check_layout(source: Source, entries: list[ZipEntry], cd_offset: int,
                  out: list[Anomaly]) -> list[tuple[int, int]]:
    """Bounds and overlaps; returns the occupied ranges, sorted."""
    ranges = sorted((e.header_offset, e.data_offset + e.compressed_size, e.name)
                    for e in entries)
    for start, end, name in ranges:
        if end > min(cd_offset, source.size):
            out.append(Anomaly("data-outside-archive", f"record data runs to {end:#x}, past the "
                               f"central directory at {cd_offset:#x}", start, name))
    for (_, end, name), (start, _, other) in itertools.pairwise(ranges):
        if end > start:
            out.append(Anomaly("overlapping-records", f"overlaps record {other!r}", start, name))
    if ranges and ranges[0][0] > 0:
        out.append(Anomaly("bytes-before-first-record", f"{ranges[0][0]} bytes precede the "
                           "first record (a prepended file or polyglot)", 0))
    return [(s, e) for s, e, _ in ranges]


def _shadows(source: Source, ranges: list[tuple[int, int]], cd_offset: int,
             out: list[Anomaly]) -> list[ZipEntry]:
    """Local headers in the gaps between named records (descriptors are 16/24 bytes)."""
    found: list[ZipEntry] = []
    cursor, budget = 0, MAX_GAP_BYTES
    for start, end in [*ranges, (cd_offset, cd_offset)]:
        gap = min(start - cursor, budget)
        if gap > 24:
            data = _pread(source, cursor, gap) or b""
            budget -= gap
            at = data.find(b"PK\x03\x04")
            while at >= 0 and len(found) < MAX_SHADOWS:
                found.extend(_shadow(source, cursor + at, out))
                at = data.find(b"PK\x03\x04", at + 4)
        cursor = max(cursor, end)
    return found


def _shadow(source: Source, at: int, out: list[Anomaly]) -> list[ZipEntry]:
    raw = _pread(source, at, _LOCAL.size)
    if raw is None:
        return []
    f = _LOCAL.unpack(raw)
    name = (_pread(source, at + _LOCAL.size, f[9]) or b"").decode("utf-8", "surrogateescape")
    out.append(Anomaly("shadow-record", "a local header the central directory never names "
                       "(readers that scan forward see it)", at, name))
    data = at + _LOCAL.size + f[9] + f[10]
    return [ZipEntry(name, at, data, f[8], f[7], f[3], shadow=True)]


def walk_zip(source: Source, eocd: int | None = None,
             ) -> tuple[list[ZipEntry], list[Anomaly]] | None:
    """Every member of the ZIP in ``source`` (shadow records included) and its anomalies.

    ``eocd`` forces the end record at that offset (by default the last one).
    Returns None when ``source`` has no end of central directory record.
    """
    out: list[Anomaly] = []
    end = _find_end(source, out, eocd)
    if end is None:
        return None
    cd_offset, cd_size, count = _directory(source, *end)
    cd = _pread(source, cd_offset, min(cd_size, max(0, source.size - cd_offset))) or b""
    entries = _entries(source, cd, min(count, len(cd) // _CD.size + 1), out)
    _check_names(entries, out)
    ranges = _check_layout(source, entries, cd_offset, out)
    return entries + _shadows(source, ranges, cd_offset, out), out


def read_member(source: Source, entry: ZipEntry, limit: int) -> bytes | None:
    """A member's bytes (stored or deflated, at most ``limit``), or None when unreadable."""
    if entry.method == 0:
        return _pread(source, entry.data_offset, min(entry.size, limit))
    if entry.method != 8:
        return None
    raw = _pread(source, entry.data_offset, min(entry.compressed_size, source.size))
    if raw is None:
        return None
    try:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw, limit)
    except zlib.error:
        return None


class Window:
    """``size`` bytes of a source from ``start``, as a source of their own."""

    def __init__(self, source: Source, start: int, size: int) -> None:
        self._source, self._start = source, start
        self.size = max(0, min(size, source.size - start))
        self.name = source.name

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

    def close(self) -> None:
        return


def walk_tar(source: Source, limits: Limits) -> tuple[list[TarMember], list[Anomaly]]:
    """The members of a tar archive, as the loader reads them, and its anomalies.

    The tolerant mode of :func:`ptfile.archive.tar.read_members` (the loader's
    reader): the same headers, member types and PAX/GNU extensions.
    """
    anomalies: list[Anomaly] = []
    return read_members(source, limits, anomalies), anomalies
