"""Runs of small ZIP records laid out at once: headers, names, payloads and central entries.

Specification
-------------
:func:`pack_run` MUST return, for records ``(name, payload)`` written from
archive position ``start``, exactly what
:meth:`~ptfile.archive.writer.ZipWriter.write_record` writes for each in turn
(spec in :mod:`ptfile.archive.records`, "Writers"):

* local header (version, method, times, CRC and sizes 0; flags data
  descriptor + UTF-8, or UTF-8 only for an empty payload), the full name
  ``prefix/name``, the padding extra ``"FB" <u16 pad> "Z" * pad`` that puts
  the payload at the next multiple of ``alignment``, the payload, and for a
  non-empty payload the data descriptor ``PK\\x07\\x08 crc size size``;
* the central directory entry of each (flags and CRC as above, both sizes,
  the local header's offset, the full name);
* every record's data offset and the CRC part of the serialization id folded
  over the run (:func:`~ptfile.archive.serialization_id.fold_write` of a
  payload that starts like a data descriptor, then the descriptor's CRC).

It returns None, having written nothing, when a record needs the
one-by-one path: an empty or non-ASCII name (these are rare enough to leave
to it), a name met before or twice in the run, the serialization id's name,
a full name longer than a u16 or ending in ``/``, a prefix that starts with
the descriptor signature, or a run that reaches the ZIP64 limit.

How: the data offsets need no loop.  Every payload starts at a multiple of
``alignment``, so the next one starts ``round_up(size + descriptor + 34 +
name length of the next, alignment)`` later: a cumulative sum.  The output
is filled with ``Z`` (the padding) and every other field is placed by
numpy, fixed-size fields as rows, names and payloads as one gather each (as
rows too when all are of one length, as the payloads of like tensors and
names of as many digits are: 57 -> 48 ms for B's 100,000 records), so the
cost per record is a few C-level steps (a CRC, a join) instead of a dozen
Python ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import compress
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from .records import (
    CENTRAL_DIRECTORY_SIGNATURE,
    DATA_DESCRIPTOR_SIGNATURE,
    FLAG_DATA_DESCRIPTOR,
    FLAG_UTF8,
    LOCAL_FILE_HEADER_SIGNATURE,
    PADDING_EXTRA_ID,
    PADDING_FILL,
    U16_MAX,
    U32_MAX,
)
from .serialization_id import SERIALIZATION_ID_NAME, fold_write, hash_combine

__all__ = ["Run", "fold_crcs", "pack_run"]

_U4: Final = "<u4"
_U2: Final = "<u2"
#: The local header with its non-zero fields; the padding extra's header follows the name.
_LOCAL: Final = np.dtype({"names": ["signature", "flags", "name_length", "extra_length"],
                          "formats": [_U4, _U2, _U2, _U2], "offsets": [0, 6, 26, 28],
                          "itemsize": 30})
_EXTRA: Final = np.dtype({"names": ["id", "size"], "formats": [_U2, _U2]})
_DESCRIPTOR: Final = np.dtype({"names": ["signature", "crc", "compressed", "size"],
                               "formats": [_U4, _U4, _U4, _U4]})
_CENTRAL: Final = np.dtype({
    "names": ["signature", "flags", "crc", "compressed", "size", "name_length", "offset"],
    "formats": [_U4, _U2, _U4, _U4, _U4, _U2, _U4],
    "offsets": [0, 8, 16, 20, 24, 28, 42], "itemsize": 46,
})  # fmt: skip
_HEAD: Final = _LOCAL.itemsize + _EXTRA.itemsize  # local header + padding extra header
_FLAGS: Final = FLAG_DATA_DESCRIPTOR | FLAG_UTF8
_SLASH: Final = ord("/")
_GOLDEN: Final = 0x9E3779B9
_MASK64: Final = (1 << 64) - 1


def _u32(signature: bytes) -> int:
    return int.from_bytes(signature, "little")


class Run(NamedTuple):
    """What :func:`pack_run` lays out for a run of records."""

    #: Local headers, names, padding, payloads and descriptors, in file order.
    local: npt.NDArray[np.uint8]
    #: The central directory entries of the run.
    central: bytes
    #: Data offset of each record.
    offsets: list[int]
    #: CRC of each record (0 without CRCs).
    crcs: list[int]
    #: Size of each record's payload.
    sizes: list[int]
    #: Index and first 8 bytes of each payload that starts like a data descriptor.
    quirks: dict[int, bytes]


def pack_run(prefix: bytes, names: Sequence[str], payloads: Sequence[memoryview], start: int,
             alignment: int, crc32: bool, taken: AbstractSet[str]) -> Run | None:
    """Lay out ``names`` and ``payloads`` (flat byte views) from ``start``; None: one by one.

    ``prefix`` is the archive folder with its ``/``; ``taken`` the names written before.
    """
    text = "".join(names)
    if (not text.isascii() or prefix[:4] == DATA_DESCRIPTOR_SIGNATURE
            or SERIALIZATION_ID_NAME in names or len(set(names)) < len(names)
            or not taken.isdisjoint(names)):  # fmt: skip
        return None
    name_lengths = np.fromiter(map(len, names), np.int64, len(names))
    full_lengths = name_lengths + len(prefix)
    if not name_lengths.all() or full_lengths.max() > U16_MAX:
        return None
    name_bytes = np.frombuffer(text.encode("ascii"), np.uint8)
    if (name_bytes[np.cumsum(name_lengths) - 1] == _SLASH).any():
        return None
    sizes = np.fromiter(map(len, payloads), np.int64, len(payloads))
    data, heads, end = _positions(start, full_lengths, sizes, alignment)
    if end >= U32_MAX:
        return None
    crcs = list(map(zlib.crc32, payloads)) if crc32 else [0] * len(payloads)
    body = np.frombuffer(b"".join(payloads), np.uint8)
    local = np.full(end - start, PADDING_FILL[0], np.uint8)
    _place_headers(local, heads - start, data - heads - _HEAD - full_lengths, full_lengths, sizes)
    _place_rows(local, heads - start + _LOCAL.itemsize, np.frombuffer(prefix, np.uint8))
    _place(local, heads - start + _LOCAL.itemsize + len(prefix), name_lengths, name_bytes)
    _place(local, data - start, sizes, body)
    _place_descriptors(local, data - start + sizes, sizes, crcs)
    central = _central(prefix, heads, full_lengths, name_lengths, name_bytes, sizes, crcs)
    return Run(local, central, data.tolist(), crcs, sizes.tolist(), _quirks(body, sizes))


def _positions(start: int, full_lengths: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64],
               alignment: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Data offsets, local header offsets and the end of the run."""
    tails = sizes + np.where(sizes > 0, _DESCRIPTOR.itemsize, 0)
    first = start + _HEAD + int(full_lengths[0])
    steps = tails[:-1] + _HEAD + full_lengths[1:]
    steps += -steps % alignment  # each payload starts at a multiple of alignment
    data = np.empty(len(sizes), np.int64)
    data[0] = first + -first % alignment
    np.cumsum(steps, out=data[1:])
    data[1:] += data[0]
    ends = data + tails
    heads = np.empty_like(data)
    heads[0] = start
    heads[1:] = ends[:-1]
    return data, heads, int(ends[-1])


def _place(out: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
           source: npt.NDArray[np.uint8]) -> None:
    """Copy the consecutive pieces of ``source`` (``lengths`` bytes each) to ``out`` at ``at``.

    Pieces of one length (payloads of a run of like tensors, names of as many
    digits) are rows: one item copy each instead of a gather of every byte.
    """
    if not len(source):
        return
    width = int(lengths[0])
    if (lengths == width).all():
        _place_rows(out, at, source.reshape(len(lengths), width))
        return
    starts = np.cumsum(lengths) - lengths
    out[np.repeat(at - starts, lengths) + np.arange(len(source))] = source


def _rows(records: npt.NDArray[np.void]) -> npt.NDArray[np.uint8]:
    """The bytes of structured ``records``, one row each."""
    return records.view(np.uint8).reshape(len(records), records.dtype.itemsize)


def _place_rows(out: npt.NDArray[np.uint8], at: npt.NDArray[np.int64],
                rows: npt.NDArray[np.uint8]) -> None:
    """Copy the rows of ``rows`` (or one row to every place) to ``out`` at ``at``.

    Through a view of ``out`` as overlapping ``width``-byte items, one per
    byte offset: each row is then one item copy, not ``width`` byte copies.
    """
    width = rows.shape[-1]
    if len(at) and width:
        every = np.ndarray((len(out) - width + 1,), f"V{width}", out, 0, (1,))
        every[at] = np.ascontiguousarray(rows).view(f"V{width}").reshape(-1)


def _place_headers(out: npt.NDArray[np.uint8], at: npt.NDArray[np.int64],
                   pads: npt.NDArray[np.int64], full_lengths: npt.NDArray[np.int64],
                   sizes: npt.NDArray[np.int64]) -> None:
    """Local headers at ``at``, the padding extra's header after each name."""
    local = np.zeros(len(at), _LOCAL)
    local["signature"] = _u32(LOCAL_FILE_HEADER_SIGNATURE)
    local["flags"] = np.where(sizes > 0, _FLAGS, FLAG_UTF8)
    local["name_length"] = full_lengths
    local["extra_length"] = pads + _EXTRA.itemsize
    _place_rows(out, at, _rows(local))
    extra = np.empty(len(at), _EXTRA)
    extra["id"] = PADDING_EXTRA_ID
    extra["size"] = pads
    _place_rows(out, at + _LOCAL.itemsize + full_lengths, _rows(extra))


def _place_descriptors(out: npt.NDArray[np.uint8], at: npt.NDArray[np.int64],
                       sizes: npt.NDArray[np.int64], crcs: list[int]) -> None:
    """Data descriptors of the non-empty payloads, at ``at``."""
    full = sizes > 0
    descriptors = np.empty(int(full.sum()), _DESCRIPTOR)
    descriptors["signature"] = _u32(DATA_DESCRIPTOR_SIGNATURE)
    descriptors["crc"] = np.asarray(crcs, np.uint32)[full]
    descriptors["compressed"] = descriptors["size"] = sizes[full]
    _place_rows(out, at[full], _rows(descriptors))


def _central(prefix: bytes, heads: npt.NDArray[np.int64], full_lengths: npt.NDArray[np.int64],
             name_lengths: npt.NDArray[np.int64], name_bytes: npt.NDArray[np.uint8],
             sizes: npt.NDArray[np.int64], crcs: list[int]) -> bytes:
    """The central directory entries of the run."""
    rows = np.zeros(len(heads), _CENTRAL)
    rows["signature"] = _u32(CENTRAL_DIRECTORY_SIGNATURE)
    rows["flags"] = np.where(sizes > 0, _FLAGS, FLAG_UTF8)
    rows["crc"] = crcs
    rows["compressed"] = rows["size"] = sizes
    rows["name_length"] = full_lengths
    rows["offset"] = heads
    at = np.cumsum(full_lengths + _CENTRAL.itemsize) - full_lengths - _CENTRAL.itemsize
    out = np.empty(int(at[-1] + _CENTRAL.itemsize + full_lengths[-1]), np.uint8)
    _place_rows(out, at, _rows(rows))
    _place_rows(out, at + _CENTRAL.itemsize, np.frombuffer(prefix, np.uint8))
    _place(out, at + _CENTRAL.itemsize + len(prefix), name_lengths, name_bytes)
    return out.tobytes()


def _quirks(body: npt.NDArray[np.uint8], sizes: npt.NDArray[np.int64]) -> dict[int, bytes]:
    """The payloads of 8 bytes or more that start with the data descriptor signature."""
    starts = np.cumsum(sizes) - sizes
    rows = np.flatnonzero(sizes >= 8)
    if not len(rows):
        return {}
    heads = body[starts[rows, None] + np.arange(4)]
    found = rows[(heads == np.frombuffer(DATA_DESCRIPTOR_SIGNATURE, np.uint8)).all(axis=1)]
    return {int(i): body[starts[i] : starts[i] + 8].tobytes() for i in found.tolist()}


def fold_crcs(fold: int, run: Run) -> int:
    """The CRC part of the serialization id after the records of ``run``."""
    if run.quirks:
        return _fold_quirks(fold, run)
    golden, mask = _GOLDEN, _MASK64
    for crc in compress(run.crcs, run.sizes):  # the records with a descriptor
        fold ^= (crc + golden + (fold << 6) + (fold >> 2)) & mask  # hash_combine, inlined
    return fold


def _fold_quirks(fold: int, run: Run) -> int:
    for index, (crc, size) in enumerate(zip(run.crcs, run.sizes, strict=True)):
        head = run.quirks.get(index)
        if head is not None:
            fold = fold_write(fold, head)
        if size:
            fold = hash_combine(fold, crc)
    return fold
