"""ZIP records: the subset of PKWARE's APPNOTE.TXT (6.3.x) that ptfile reads and writes.

Section numbers refer to APPNOTE.TXT 6.3.10.  All integers are little-endian
(4.4.1.1).  "torch" below means ``torch.save`` 2.x (PyTorchStreamWriter on
miniz), checked byte for byte against torch 2.13.

Archive layout (4.3.6)
----------------------
``[local file header, file data, data descriptor]... central directory
[zip64 end of central directory record, zip64 end of central directory
locator] end of central directory record``.

Readers
~~~~~~~
* MUST find the end of central directory record (4.3.16, 22 bytes plus a
  comment of at most 65,535 bytes) by searching backwards from the end of the
  file, at most ``22 + 65535`` bytes; the last signature whose 22 fixed bytes
  fit inside the file wins, and a comment running past the end of the file is
  read as far as the file goes (miniz, torch's reader, and Python's
  ``zipfile`` choose so too; a reader that skips such a record reads another
  archive than torch).
* MUST use the ZIP64 end of central directory record (4.3.14) found through the
  locator (4.3.15) that immediately precedes the EOCD, when one is present.  A
  locator pointing at something that is not a ZIP64 record is tolerated only
  while no EOCD field holds its "see ZIP64" sentinel (0xFFFF / 0xFFFFFFFF,
  4.4.1.4); a spanned archive (disk numbers other than 0) is not supported.
* MUST check every count, length and offset against the bytes present before
  using it: the central directory lies inside the file, before the end
  records; it holds at least ``46 * entries`` bytes; every central directory
  header (4.3.12) fits in it; every member's local header and data lie before
  the central directory; members do not overlap; names are unique (ptfile
  policy, see :mod:`ptfile.archive.reader`).
* MUST read a ZIP64 extended information extra field (4.5.3, header id
  0x0001) for every central field that holds the 0xFFFFFFFF sentinel, in the
  fixed order uncompressed size, compressed size, local header offset, disk.
* MUST refuse encrypted members (general purpose bits 0, 6 and 13, 4.4.4) and
  SHOULD read stored (method 0) and deflated (method 8) members only (4.4.5);
  a stored member's two sizes MUST agree, and inflating MUST stop at the
  declared size (more or fewer bytes are an error).
* SHOULD decode names as UTF-8 (bit 11, Appendix D).  ptfile decodes every
  name as UTF-8 whatever bit 11 says: torch compares names as raw bytes
  against UTF-8 encoded strings, and ASCII names (all torch ever writes) are
  the same in CP437.
* MUST take the data offset of a member from its local header (4.3.7):
  ``header offset + 30 + name length + extra length``; the local name MUST
  equal the central one.  Local CRC and size fields are ignored (torch writes
  zeros there and sets bit 3, 4.4.4).

Writers
~~~~~~~
What torch writes, byte for byte, is specified in :mod:`ptfile.archive.layout`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from ..errors import ArchiveError

__all__ = [
    "CENTRAL_DIRECTORY_SIGNATURE",
    "COLUMNS",
    "DATA_DESCRIPTOR_SIGNATURE",
    "EOCD_SIGNATURE",
    "LOCAL_FILE_HEADER_SIGNATURE",
    "PADDING_EXTRA_ID",
    "ZIP64_EOCD_SIGNATURE",
    "ZIP64_EXTRA_ID",
    "ZIP64_LOCATOR_SIGNATURE",
    "CentralDirectoryHeader",
    "DataDescriptor",
    "EndOfCentralDirectory",
    "LocalFileHeader",
    "Zip64EndOfCentralDirectory",
    "Zip64Locator",
]

LOCAL_FILE_HEADER_SIGNATURE: Final = b"PK\x03\x04"
CENTRAL_DIRECTORY_SIGNATURE: Final = b"PK\x01\x02"
EOCD_SIGNATURE: Final = b"PK\x05\x06"
ZIP64_EOCD_SIGNATURE: Final = b"PK\x06\x06"
ZIP64_LOCATOR_SIGNATURE: Final = b"PK\x06\x07"
DATA_DESCRIPTOR_SIGNATURE: Final = b"PK\x07\x08"

#: ZIP64 extended information extra field (4.5.3).
ZIP64_EXTRA_ID: Final = 0x0001
#: torch's alignment padding extra field: the bytes ``"FB"`` read as a LE u16.
PADDING_EXTRA_ID: Final = 0x4246
#: torch fills the padding extra with ``'Z'``.
PADDING_FILL: Final = b"Z"

U16_MAX: Final = 0xFFFF
#: The "value is in the ZIP64 extra" sentinel of 32-bit fields (4.4.1.4); miniz
#: also switches to ZIP64 for values *equal* to it, hence ``>=`` everywhere.
U32_MAX: Final = 0xFFFFFFFF

FLAG_ENCRYPTED: Final = 0x0001
FLAG_DATA_DESCRIPTOR: Final = 0x0008
FLAG_STRONG_ENCRYPTION: Final = 0x0040
FLAG_UTF8: Final = 0x0800
FLAG_MASKED_HEADERS: Final = 0x2000
#: Any of these bits means the member cannot be read without a key.
ENCRYPTION_FLAGS: Final = FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_HEADERS

#: MS-DOS directory bit of the external attributes (4.4.15); miniz sets it for
#: names ending in ``/``, which it refuses to give data.
DOS_DIRECTORY_ATTRIBUTE: Final = 0x10

METHOD_STORED: Final = 0
METHOD_DEFLATED: Final = 8

#: Version made by / needed to extract of torch's ZIP64 EOCD: 3.0 on Unix (0x031E)
#: and 4.5 (ZIP64, 4.4.3.2).
ZIP64_VERSION_MADE_BY: Final = 0x031E
ZIP64_VERSION_NEEDED: Final = 0x002D
#: Size of the ZIP64 EOCD record after its first 12 bytes (4.3.14.1).
ZIP64_EOCD_RECORD_SIZE: Final = 44

LOCAL_FILE_HEADER_STRUCT: Final = struct.Struct("<4s5H3L2H")
CENTRAL_DIRECTORY_STRUCT: Final = struct.Struct("<4s6H3L5H2L")
EOCD_STRUCT: Final = struct.Struct("<4s4H2LH")
ZIP64_EOCD_STRUCT: Final = struct.Struct("<4sQ2H2L4Q")
ZIP64_LOCATOR_STRUCT: Final = struct.Struct("<4sLQL")
DESCRIPTOR_STRUCT: Final = struct.Struct("<4s3L")
DESCRIPTOR64_STRUCT: Final = struct.Struct("<4sL2Q")
EXTRA_HEADER_STRUCT: Final = struct.Struct("<2H")

Buffer = bytes | bytearray | memoryview

#: Column order of :attr:`ptfile.archive._entries.Entries.values`: the numeric fields of
#: a central directory record, in its order.
COLUMNS: Final = ("header_offset", "size", "compressed_size", "method", "crc32", "flags")


def _unpack(layout: struct.Struct, data: Buffer, pos: int, base: int, what: str) -> tuple[Any, ...]:
    """Unpack ``layout`` at ``pos`` of ``data``; ``base`` is the file offset of ``data``."""
    if pos < 0 or pos + layout.size > len(data):
        raise ArchiveError(
            f"truncated {what}: needs {layout.size} bytes, {max(0, len(data) - pos)} present",
            offset=base + pos,
        )
    return layout.unpack_from(data, pos)


def _check_signature(found: object, expected: bytes, what: str, offset: int) -> None:
    if found != expected:
        raise ArchiveError(f"bad {what} signature {found!r}, expected {expected!r}", offset=offset)


def _tail(data: Buffer, start: int, n: int, base: int, what: str) -> bytes:
    """The ``n`` variable-length bytes at ``start`` (name, extra or comment)."""
    if start + n > len(data):
        raise ArchiveError(
            f"truncated {what}: needs {n} bytes, {max(0, len(data) - start)} present",
            offset=base + start,
        )
    return bytes(data[start : start + n])


@dataclass(frozen=True, slots=True)
class LocalFileHeader:
    """Local file header (4.3.7): 30 fixed bytes, then name and extra field."""

    SIZE: ClassVar[int] = LOCAL_FILE_HEADER_STRUCT.size
    version_needed: int = 0
    flags: int = 0
    method: int = METHOD_STORED
    mod_time: int = 0
    mod_date: int = 0
    crc32: int = 0
    compressed_size: int = 0
    uncompressed_size: int = 0
    name: bytes = b""
    extra: bytes = b""

    @classmethod
    def from_bytes(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> LocalFileHeader:
        """Parse the header at ``pos`` of ``data`` (which must hold name and extra too).

        Raises
        ------
        ArchiveError
            Truncated header or wrong signature.
        """
        values = _unpack(LOCAL_FILE_HEADER_STRUCT, data, pos, base, "local file header")
        (sig, needed, flags, method, mtime, mdate, crc, csize, usize, nlen, elen) = values
        _check_signature(sig, LOCAL_FILE_HEADER_SIGNATURE, "local file header", base + pos)
        name = _tail(data, pos + cls.SIZE, nlen, base, "local file name")
        extra = _tail(data, pos + cls.SIZE + nlen, elen, base, "local extra field")
        return cls(needed, flags, method, mtime, mdate, crc, csize, usize, name, extra)

    @classmethod
    def variable_lengths(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> tuple[int, int]:
        """Name and extra field lengths of the header at ``pos``, from its 30 fixed bytes
        (to read a header whose lengths are not known yet in two reads).

        Raises
        ------
        ArchiveError
            Truncated fixed part or wrong signature.
        """
        sig, *_, nlen, elen = _unpack(LOCAL_FILE_HEADER_STRUCT, data, pos, base,
                                      "local file header")
        _check_signature(sig, LOCAL_FILE_HEADER_SIGNATURE, "local file header", base + pos)
        return nlen, elen

    def to_bytes(self) -> bytes:
        """Serialize header, name and extra field."""
        return (
            LOCAL_FILE_HEADER_STRUCT.pack(
                LOCAL_FILE_HEADER_SIGNATURE,
                self.version_needed,
                self.flags,
                self.method,
                self.mod_time,
                self.mod_date,
                self.crc32,
                self.compressed_size,
                self.uncompressed_size,
                len(self.name),
                len(self.extra),
            )
            + self.name
            + self.extra
        )


@dataclass(frozen=True, slots=True)
class CentralDirectoryHeader:
    """Central directory file header (4.3.12): 46 fixed bytes, name, extra, comment."""

    SIZE: ClassVar[int] = CENTRAL_DIRECTORY_STRUCT.size
    version_made_by: int = 0
    version_needed: int = 0
    flags: int = 0
    method: int = METHOD_STORED
    mod_time: int = 0
    mod_date: int = 0
    crc32: int = 0
    compressed_size: int = 0
    uncompressed_size: int = 0
    disk_start: int = 0
    internal_attributes: int = 0
    external_attributes: int = 0
    header_offset: int = 0
    name: bytes = b""
    extra: bytes = b""
    comment: bytes = b""

    @classmethod
    def from_bytes(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> CentralDirectoryHeader:
        """Parse the header at ``pos`` of ``data`` (which must hold its variable part too).

        Raises
        ------
        ArchiveError
            Truncated header or wrong signature.
        """
        values = _unpack(CENTRAL_DIRECTORY_STRUCT, data, pos, base, "central directory header")
        (sig, made_by, needed, flags, method, mtime, mdate, crc, csize, usize,
         nlen, elen, clen, disk, iattr, eattr, offset) = values  # fmt: skip
        _check_signature(sig, CENTRAL_DIRECTORY_SIGNATURE, "central directory header", base + pos)
        start = pos + cls.SIZE
        name = _tail(data, start, nlen, base, "central file name")
        extra = _tail(data, start + nlen, elen, base, "central extra field")
        comment = _tail(data, start + nlen + elen, clen, base, "file comment")
        return cls(made_by, needed, flags, method, mtime, mdate, crc, csize, usize,
                   disk, iattr, eattr, offset, name, extra, comment)  # fmt: skip

    @property
    def record_size(self) -> int:
        """Bytes this header occupies in the central directory."""
        return self.SIZE + len(self.name) + len(self.extra) + len(self.comment)

    def to_bytes(self) -> bytes:
        """Serialize header, name, extra field and comment."""
        fixed = CENTRAL_DIRECTORY_STRUCT.pack(
            CENTRAL_DIRECTORY_SIGNATURE,
            self.version_made_by,
            self.version_needed,
            self.flags,
            self.method,
            self.mod_time,
            self.mod_date,
            self.crc32,
            self.compressed_size,
            self.uncompressed_size,
            len(self.name),
            len(self.extra),
            len(self.comment),
            self.disk_start,
            self.internal_attributes,
            self.external_attributes,
            self.header_offset,
        )
        return fixed + self.name + self.extra + self.comment


@dataclass(frozen=True, slots=True)
class EndOfCentralDirectory:
    """End of central directory record (4.3.16): 22 bytes and a comment."""

    SIZE: ClassVar[int] = EOCD_STRUCT.size
    disk_number: int = 0
    cd_disk: int = 0
    entries_on_disk: int = 0
    total_entries: int = 0
    cd_size: int = 0
    cd_offset: int = 0
    comment: bytes = b""

    @classmethod
    def from_bytes(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> EndOfCentralDirectory:
        """Parse the record at ``pos`` of ``data``; the comment must be present in full.

        Raises
        ------
        ArchiveError
            Truncated record or comment, or wrong signature.
        """
        values = _unpack(EOCD_STRUCT, data, pos, base, "end of central directory")
        sig, disk, cd_disk, on_disk, total, cd_size, cd_offset, clen = values
        _check_signature(sig, EOCD_SIGNATURE, "end of central directory", base + pos)
        comment = _tail(data, pos + cls.SIZE, clen, base, "archive comment")
        return cls(disk, cd_disk, on_disk, total, cd_size, cd_offset, comment)

    @property
    def uses_zip64(self) -> bool:
        """True when a field holds the "see the ZIP64 record" sentinel (4.4.1.4)."""
        counts = (self.disk_number, self.cd_disk, self.entries_on_disk, self.total_entries)
        return U16_MAX in counts or U32_MAX in (self.cd_size, self.cd_offset)

    def to_bytes(self) -> bytes:
        """Serialize record and comment."""
        return (
            EOCD_STRUCT.pack(
                EOCD_SIGNATURE,
                self.disk_number,
                self.cd_disk,
                self.entries_on_disk,
                self.total_entries,
                self.cd_size,
                self.cd_offset,
                len(self.comment),
            )
            + self.comment
        )


@dataclass(frozen=True, slots=True)
class Zip64EndOfCentralDirectory:
    """ZIP64 end of central directory record (4.3.14), version 1, 56 bytes.

    ``record_size`` counts the bytes after itself: 44, or more when an
    extensible data sector follows (ptfile skips it).
    """

    SIZE: ClassVar[int] = ZIP64_EOCD_STRUCT.size
    record_size: int = ZIP64_EOCD_RECORD_SIZE
    version_made_by: int = ZIP64_VERSION_MADE_BY
    version_needed: int = ZIP64_VERSION_NEEDED
    disk_number: int = 0
    cd_disk: int = 0
    entries_on_disk: int = 0
    total_entries: int = 0
    cd_size: int = 0
    cd_offset: int = 0

    @classmethod
    def from_bytes(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> Zip64EndOfCentralDirectory:
        """Parse the record at ``pos`` of ``data``.

        Raises
        ------
        ArchiveError
            Truncated record, wrong signature or a record size below 44.
        """
        sig, *fields = _unpack(ZIP64_EOCD_STRUCT, data, pos, base, "ZIP64 end of central directory")
        _check_signature(sig, ZIP64_EOCD_SIGNATURE, "ZIP64 end of central directory", base + pos)
        record = cls(*fields)
        if record.record_size < ZIP64_EOCD_RECORD_SIZE:
            raise ArchiveError(
                f"ZIP64 end of central directory record size {record.record_size} < 44",
                offset=base + pos,
            )
        return record

    def to_bytes(self) -> bytes:
        """Serialize the 56-byte record."""
        return ZIP64_EOCD_STRUCT.pack(
            ZIP64_EOCD_SIGNATURE,
            self.record_size,
            self.version_made_by,
            self.version_needed,
            self.disk_number,
            self.cd_disk,
            self.entries_on_disk,
            self.total_entries,
            self.cd_size,
            self.cd_offset,
        )


@dataclass(frozen=True, slots=True)
class Zip64Locator:
    """ZIP64 end of central directory locator (4.3.15), 20 bytes."""

    SIZE: ClassVar[int] = ZIP64_LOCATOR_STRUCT.size
    eocd64_disk: int = 0
    eocd64_offset: int = 0
    total_disks: int = 1

    @classmethod
    def from_bytes(cls, data: Buffer, pos: int = 0, *, base: int = 0) -> Zip64Locator:
        """Parse the locator at ``pos`` of ``data``.

        Raises
        ------
        ArchiveError
            Truncated locator or wrong signature.
        """
        sig, *fields = _unpack(ZIP64_LOCATOR_STRUCT, data, pos, base, "ZIP64 locator")
        _check_signature(sig, ZIP64_LOCATOR_SIGNATURE, "ZIP64 locator", base + pos)
        return cls(*fields)

    def to_bytes(self) -> bytes:
        """Serialize the 20-byte locator."""
        return ZIP64_LOCATOR_STRUCT.pack(
            ZIP64_LOCATOR_SIGNATURE, self.eocd64_disk, self.eocd64_offset, self.total_disks
        )


@dataclass(frozen=True, slots=True)
class DataDescriptor:
    """Data descriptor with signature (4.3.9): 16 bytes, or 24 with ZIP64 sizes."""

    crc32: int = 0
    compressed_size: int = 0
    uncompressed_size: int = 0
    zip64: bool = False

    @classmethod
    def from_bytes(
        cls, data: Buffer, pos: int = 0, *, zip64: bool = False, base: int = 0
    ) -> DataDescriptor:
        """Parse a descriptor with signature at ``pos``; ``zip64`` selects u64 sizes.

        Raises
        ------
        ArchiveError
            Truncated descriptor or missing signature.
        """
        layout = DESCRIPTOR64_STRUCT if zip64 else DESCRIPTOR_STRUCT
        sig, crc, csize, usize = _unpack(layout, data, pos, base, "data descriptor")
        _check_signature(sig, DATA_DESCRIPTOR_SIGNATURE, "data descriptor", base + pos)
        return cls(crc, csize, usize, zip64)

    def to_bytes(self) -> bytes:
        """Serialize the descriptor (with its signature, as torch writes it)."""
        layout = DESCRIPTOR64_STRUCT if self.zip64 else DESCRIPTOR_STRUCT
        return layout.pack(
            DATA_DESCRIPTOR_SIGNATURE, self.crc32, self.compressed_size, self.uncompressed_size
        )
