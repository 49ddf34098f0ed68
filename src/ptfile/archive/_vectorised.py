"""The vectorised parse of a central directory: the fast path of :mod:`._entries`.

Specified in :mod:`ptfile.archive._entries` ("Vectorised"): candidate entry starts,
their chain, every check of the sequential pass as array comparisons, ZIP64 entries
one by one, and the names from one latin-1 decoding.  :func:`vectorised_columns`
returns the columns it read, or None on any failure, after which the sequential pass
(the reference) decides; :func:`ptfile.archive._entries.parse_vectorised` makes them an
:class:`~ptfile.archive._entries.Entries`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Final, NamedTuple

from ..errors import ArchiveError
from .extra import zip64_fields
from .records import (
    CENTRAL_DIRECTORY_SIGNATURE,
    CENTRAL_DIRECTORY_STRUCT,
    COLUMNS,
    ENCRYPTION_FLAGS,
    LOCAL_FILE_HEADER_STRUCT,
    METHOD_STORED,
    U16_MAX,
    U32_MAX,
)

if TYPE_CHECKING:  # numpy is imported where arrays are made
    import numpy as np

__all__ = ["Columns", "vectorised_columns"]

_CD_FIXED: Final = CENTRAL_DIRECTORY_STRUCT.size
_LOCAL_FIXED: Final = LOCAL_FILE_HEADER_STRUCT.size


class Columns(NamedTuple):
    """What the vectorised pass read: the names, an ``(n, 6)`` int64 array of
    :data:`~ptfile.archive.records.COLUMNS`, each name's start in the directory and its
    byte length, and the index of each name."""

    names: list[str]
    values: np.ndarray
    name_start: np.ndarray
    name_length: np.ndarray
    name_index: dict[str, int]


#: ZIP64 values the vectorised sums (offset + 30 + name + size) cannot overflow with.
_VECTOR_MAX: Final = 2**61


_SIGNATURE_U32: Final = int.from_bytes(CENTRAL_DIRECTORY_SIGNATURE, "little")


#: Signatures in names, extras and comments the vectorised pass tolerates beyond
#: one per entry (most break the chain anyway; this bounds the memory for their offsets).
_SPARE_SIGNATURES: Final = 64


_FIELD_SPEC: Final = (  # name, numpy format, offset in the fixed header (4.3.12)
    ("flags", "<u2", 8), ("method", "<u2", 10), ("crc32", "<u4", 16),
    ("compressed_size", "<u4", 20), ("size", "<u4", 24), ("name_length", "<u2", 28),
    ("extra_length", "<u2", 30), ("comment_length", "<u2", 32), ("disk", "<u2", 34),
    ("header_offset", "<u4", 42),
)  # fmt: skip


@cache
def _header_dtype() -> np.dtype:
    """The fixed part of a central directory header as a numpy record (made on first use)."""
    import numpy as np

    return np.dtype({
        "names": [name for name, _, _ in _FIELD_SPEC],
        "formats": [fmt for _, fmt, _ in _FIELD_SPEC],
        "offsets": [at for _, _, at in _FIELD_SPEC],
        "itemsize": _CD_FIXED,
    })  # fmt: skip


def vectorised_columns(data: bytes, entries: int, cd_offset: int, max_name: int
                       ) -> Columns | None:
    """The fast pass (module docstring), or None when the sequential pass must decide."""
    import numpy as np

    if entries == 0 or len(data) < _CD_FIXED:
        return None
    starts = _chain(data, entries)
    if starts is None:
        return None
    fields = np.ndarray((len(data) - _CD_FIXED + 1,), f"V{_CD_FIXED}", data, 0, (1,))[starts]
    head = fields.view(_header_dtype())
    nlen = head["name_length"].astype(np.int64)
    if int(nlen.max()) > max_name:
        return None
    values = np.stack([head[name].astype(np.int64) for name in COLUMNS], axis=1)
    if not _resolve_zip64(data, head, values, starts + _CD_FIXED + nlen, cd_offset):
        return None
    offset, usize, csize, method, _, flags = values.T
    if (
        bool(((flags & ENCRYPTION_FLAGS) != 0).any())
        or bool(((method == METHOD_STORED) & (csize != usize)).any())
        or int((offset + _LOCAL_FIXED + nlen + csize).max()) > cd_offset
    ):
        return None
    name_start = starts + _CD_FIXED
    names = _names(data, name_start, nlen)
    if names is None:
        return None
    index = dict(zip(names, range(entries), strict=True))
    if len(index) != entries:
        return None
    return Columns(names, values, name_start, nlen, index)


def _chain(data: bytes, entries: int) -> np.ndarray | None:
    """The start of every entry when the first ``entries`` signatures chain, else None."""
    import numpy as np

    room = len(data) - _CD_FIXED + 1  # starts whose fixed part fits
    found = np.ndarray((room,), "<u4", data, 0, (1,)) == _SIGNATURE_U32
    if not entries <= np.count_nonzero(found) <= 2 * entries + _SPARE_SIGNATURES:
        return None  # too few, or so many false ones that their offsets would cost memory
    starts = np.flatnonzero(found)[:entries]
    if starts[0] != 0:
        return None
    lengths = np.ndarray((room,), "V6", data, 28, (1,))[starts].view("<u2").reshape(-1, 3)
    nexts = starts + _CD_FIXED + lengths.astype(np.int64).sum(axis=1)
    if int(nexts[-1]) > len(data) or not np.array_equal(nexts[:-1], starts[1:]):
        return None
    chained: np.ndarray = starts
    return chained


def _resolve_zip64(data: bytes, head: np.ndarray, values: np.ndarray, extra_at: np.ndarray,
                   cd_offset: int) -> bool:
    """Put the ZIP64 extra's values into the rows with sentinel fields; False if any is bad."""
    import numpy as np

    sentinel = (
        (head["size"] == U32_MAX) | (head["compressed_size"] == U32_MAX)
        | (head["header_offset"] == U32_MAX) | (head["disk"] == U16_MAX)
    )  # fmt: skip
    for row in np.flatnonzero(sentinel).tolist():
        offset, usize, csize = (int(values[row, k]) for k in (0, 1, 2))
        at, elen = int(extra_at[row]), int(head["extra_length"][row])
        try:
            found = zip64_fields(data[at : at + elen], usize, csize, offset,
                                  int(head["disk"][row]), cd_offset + at)
        except ArchiveError:
            return False
        if max(found) > _VECTOR_MAX:
            return False
        values[row, 1], values[row, 2], values[row, 0] = found
    return True


def _names(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> list[str] | None:
    """Every name, decoded as UTF-8; None when one is not UTF-8."""
    text = data.decode("latin-1")
    names = [text[s:e] for s, e in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)]
    if "".join(names).isascii():
        return names
    for row, name in enumerate(names):
        if not name.isascii():
            try:
                names[row] = name.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                return None
    return names
