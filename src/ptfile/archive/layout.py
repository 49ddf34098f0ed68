"""torch's ZIP layout: where ``torch.save`` (PyTorchStreamWriter on miniz) puts every byte.

The record formats are specified in :mod:`ptfile.archive.records`; this module
holds the rules torch applies on top of them, for the writer
(:mod:`ptfile.archive.writer`) and for readers that compute a member's data
offset without reading its local header (``getRecordOffsetNoRead``).

Writers (byte-identical to torch)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
* Local file header: version needed 0, flags 0x0808 (bit 3 data descriptor,
  bit 11 UTF-8) or 0x0800 for an empty member, method 0, time and date 0,
  CRC and sizes 0.  Then the name, then a ZIP64 extra when needed, then the
  "FB" padding extra (id 0x4246, ``pad`` bytes of ``'Z'``, present even when
  ``pad`` is 0) that puts the data at a multiple of the storage alignment.
* ZIP64 extra (4.5.3) when the size or the local header offset is at least
  0xFFFFFFFF: ``[uncompressed u64, compressed u64]`` if the size is, then
  ``[local header offset u64]`` if the offset is, in local and central headers
  alike (in the local header the offset goes beyond APPNOTE, which only allows
  sizes; miniz writes it).  In the local header the compressed size is 0:
  miniz writes the header before it has "compressed" anything.
* Data descriptor (4.3.9) with its optional signature ``PK\\x07\\x08``, only
  after non-empty members: 16 bytes, or 24 (u64 sizes) when the member has a
  ZIP64 extra.
* Central directory header: version made by and needed 0, same flags as the
  local header, real CRC (0 when CRC computation is disabled), sizes and
  offset capped at 0xFFFFFFFF with the real values in the ZIP64 extra, no
  padding extra, no comment, internal attributes 0, external attributes 0
  except 0x10 (MS-DOS directory, 4.4.15) for a name ending in ``/``, which
  MUST then be empty.
* Always ZIP64 end records: ZIP64 EOCD (record size 44, made by 0x031E,
  needed 0x002D), locator (1 disk), then the EOCD with counts capped at
  0xFFFF and size/offset capped at 0xFFFFFFFF, no comment.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from .records import (
    DESCRIPTOR64_STRUCT,
    DESCRIPTOR_STRUCT,
    EXTRA_HEADER_STRUCT,
    PADDING_EXTRA_ID,
    PADDING_FILL,
    U32_MAX,
    ZIP64_EXTRA_ID,
    LocalFileHeader,
)

if TYPE_CHECKING:  # numpy only for the vectorised rule, imported there
    import numpy as np

__all__ = [
    "computed_data_offset",
    "computed_data_offsets",
    "computed_next_header_offset",
    "descriptor_size",
    "needs_zip64",
    "padding_extra",
    "storage_data_offset",
    "zip64_extra",
]

_U64: Final = struct.Struct("<Q")




def needs_zip64(header_offset: int, size: int) -> bool:
    """True when a member gets a ZIP64 extra and a 24-byte descriptor."""
    return size >= U32_MAX or header_offset >= U32_MAX


def zip64_extra(header_offset: int, size: int, *, local: bool = False) -> bytes:
    """The ZIP64 extra torch writes for a member; empty when it needs none.

    ``local`` selects the local header's version, whose compressed size is 0.

    Examples
    --------
    >>> zip64_extra(0, 10)
    b''
    >>> zip64_extra(2**32, 10).hex()
    '010008000000000001000000'
    >>> zip64_extra(0, 2**32, local=True).hex()
    '0100100000000000010000000000000000000000'
    """
    values = []
    if size >= U32_MAX:
        values += [size, 0 if local else size]
    if header_offset >= U32_MAX:
        values.append(header_offset)
    if not values:
        return b""
    return EXTRA_HEADER_STRUCT.pack(ZIP64_EXTRA_ID, 8 * len(values)) + b"".join(
        _U64.pack(v) for v in values
    )


def padding_extra(pad: int) -> bytes:
    """torch's alignment extra: ``"FB"``, u16 ``pad``, then ``pad`` bytes of ``'Z'``.

    Examples
    --------
    >>> padding_extra(3)
    b'FB\\x03\\x00ZZZ'
    """
    return EXTRA_HEADER_STRUCT.pack(PADDING_EXTRA_ID, pad) + PADDING_FILL * pad


def storage_data_offset(header_offset: int, name_length: int, size: int, alignment: int) -> int:
    """Where torch puts the data of a member whose local header starts at ``header_offset``.

    ``name_length`` is the byte length of the full name (prefix included).  The
    result is the first multiple of ``alignment`` at or after the end of the
    local header, its name, its ZIP64 extra and an empty padding extra.

    Examples
    --------
    >>> storage_data_offset(0, 20, 150, 64)
    64
    """
    start = header_offset + LocalFileHeader.SIZE + name_length + EXTRA_HEADER_STRUCT.size
    start += len(zip64_extra(header_offset, size, local=True))
    return start + (-start) % alignment


def descriptor_size(header_offset: int, size: int) -> int:
    """Bytes of data descriptor torch writes after a member: 0, 16 or 24."""
    if size == 0:
        return 0
    return DESCRIPTOR64_STRUCT.size if needs_zip64(header_offset, size) else DESCRIPTOR_STRUCT.size


def computed_data_offset(header_offset: int, name: str, size: int, alignment: int) -> int:
    """Data offset of a torch-written member, computed without reading its local header.

    This is ``PyTorchStreamReader::getRecordOffsetNoRead``: the writer's layout
    rule (local header, name, ZIP64 extra when needed, "FB" padding to
    ``alignment``) applied to a header assumed to start at ``header_offset``.

    Parameters
    ----------
    header_offset : int
        Offset of the member's local header.
    name : str
        Full member name, prefix included.
    size : int
        Uncompressed size of the member.
    alignment : int
        The archive's ``.storage_alignment``.

    Returns
    -------
    int
        Offset of the first data byte.

    Examples
    --------
    >>> computed_data_offset(0, "tiny_tensor/data.pkl", 150, 64)
    64
    """
    return storage_data_offset(header_offset, len(name.encode("utf-8")), size, alignment)


def computed_data_offsets(header_offsets: np.ndarray, name_lengths: np.ndarray,
                          sizes: np.ndarray, alignment: int) -> np.ndarray:
    """:func:`computed_data_offset` of many records at once (int64 columns).

    torch's layout rule, vectorised: local header (30 bytes), name, the local
    ZIP64 extra (4 + 8 bytes per value: size and a zero compressed size when
    the size needs ZIP64, the header offset when it does), the padding extra's
    4-byte header, then padding up to ``alignment``.
    """
    import numpy as np

    values = 2 * (sizes >= U32_MAX) + (header_offsets >= U32_MAX)
    start = header_offsets + (LocalFileHeader.SIZE + 4) + name_lengths \
        + np.where(values > 0, 4 + 8 * values, 0)
    offsets: np.ndarray = start + (-start) % alignment
    return offsets


def computed_next_header_offset(header_offset: int, data_offset: int, size: int) -> int:
    """Offset of the local header that follows a torch-written member (spec §6).

    Data, then a 0-, 16- or 24-byte data descriptor.

    Examples
    --------
    >>> computed_next_header_offset(0, 64, 150)
    230
    """
    return data_offset + size + descriptor_size(header_offset, size)
