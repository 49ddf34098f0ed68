"""Extensible data fields (APPNOTE 4.5): the extra field block of a header, and ZIP64's.

The block is a sequence of ``id u16, length u16, data`` fields (4.5.1).  The
ZIP64 extended information field (id 0x0001, 4.5.3) holds, as u64 values in
this fixed order, those of uncompressed size, compressed size, local header
offset and disk number whose header field holds its sentinel (0xFFFFFFFF, or
0xFFFF for the disk).  torch's alignment padding field ("FB", id 0x4246) is
specified in :mod:`ptfile.archive.layout`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ArchiveError
from .records import EXTRA_HEADER_STRUCT, U16_MAX, U32_MAX, ZIP64_EXTRA_ID, Buffer, _tail, _unpack

__all__ = ["ExtraField", "parse_extra_fields", "zip64_fields", "zip64_values"]


@dataclass(frozen=True, slots=True)
class ExtraField:
    """One extensible data field (4.5.1): a header id and its data."""

    header_id: int
    data: bytes

    def to_bytes(self) -> bytes:
        """Serialize as ``id u16, length u16, data``."""
        return EXTRA_HEADER_STRUCT.pack(self.header_id, len(self.data)) + self.data


def parse_extra_fields(extra: Buffer, *, base: int = 0) -> tuple[ExtraField, ...]:
    """Split an extra field block into its fields (4.5.1).

    Parameters
    ----------
    extra : bytes-like
        The extra field block of a header.
    base : int
        File offset of ``extra`` (for error messages).

    Raises
    ------
    ArchiveError
        A field header or its data runs past the end of the block.

    Examples
    --------
    >>> parse_extra_fields(b"FB\\x01\\x00Z")
    (ExtraField(header_id=16966, data=b'Z'),)
    """
    fields = []
    pos = 0
    while pos < len(extra):
        header_id, length = _unpack(EXTRA_HEADER_STRUCT, extra, pos, base, "extra field header")
        data = _tail(extra, pos + 4, length, base, f"extra field {header_id:#06x}")
        fields.append(ExtraField(header_id, data))
        pos += 4 + length
    return tuple(fields)


def zip64_values(extra: Buffer, wanted: int, *, base: int = 0) -> tuple[int, ...]:
    """Read ``wanted`` u64 values from the ZIP64 extra field in ``extra`` (4.5.3).

    Raises
    ------
    ArchiveError
        No ZIP64 field, or one too short for the sentinel fields of its header.
    """
    for field in parse_extra_fields(extra, base=base):
        if field.header_id == ZIP64_EXTRA_ID:
            if len(field.data) < 8 * wanted:
                raise ArchiveError(
                    f"ZIP64 extra field has {len(field.data)} bytes, needs {8 * wanted}",
                    offset=base,
                )
            return struct.unpack_from(f"<{wanted}Q", field.data)
    raise ArchiveError("header holds a ZIP64 sentinel but has no ZIP64 extra field", offset=base)


def zip64_fields(extra: Buffer, usize: int, csize: int, offset: int, disk: int, at: int
                 ) -> tuple[int, int, int]:
    """A central header's size, compressed size and local header offset, each sentinel
    replaced by its value from the ZIP64 extra ``extra`` (4.5.3, fixed order; ``at``: the
    extra's file offset, for errors).

    Raises
    ------
    ArchiveError
        As :func:`zip64_values`.
    """
    wanted = [usize == U32_MAX, csize == U32_MAX, offset == U32_MAX, disk == U16_MAX]
    values = list(zip64_values(extra, sum(wanted), base=at))
    usize = values.pop(0) if wanted[0] else usize
    csize = values.pop(0) if wanted[1] else csize
    offset = values.pop(0) if wanted[2] else offset
    return usize, csize, offset
