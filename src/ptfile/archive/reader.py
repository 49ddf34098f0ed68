"""ZipReader: the central directory of a ZIP archive, validated before use.

What is read and checked is specified in :mod:`ptfile.archive.records`.  In
short: a bounded backwards search for the end of central directory record,
ZIP64 through the locator, then one pass over the central directory that
checks every count, length and offset against the bytes present and the
:class:`~ptfile.limits.Limits` before anything is allocated for it.  That pass
(:mod:`ptfile.archive._entries`) is vectorised, with a sequential reference
it falls back to; it yields columns, and a :class:`Record` is made only when
asked for (:meth:`ZipReader.get`, :attr:`ZipReader.records`).  These steps are
the strict mode of the one ZIP walk (:mod:`ptfile.archive.walk`), whose tolerant
mode is the scanner's: the reader is built on its
:func:`~ptfile.archive.walk.read_directory` and checks local headers with its
:func:`~ptfile.archive.walk.read_local_header`.

Policy choices beyond APPNOTE, all refusals of things torch never writes:

* Duplicate names are refused (:class:`~ptfile.errors.ArchiveError`).  torch's
  miniz reader resolves a name to whichever duplicate its sorted lookup hits
  first, while Python's ``zipfile`` takes the last one: a file that means two
  different things to two readers is an attack, not a checkpoint.
* Members must lie before the central directory and must not overlap
  (overlapping members are how "zip bombs" multiply their data).
* Names are decoded as UTF-8 whatever general purpose bit 11 says.
* Declared (uncompressed) sizes must be below ``2**63``: members are kept in
  int64 columns.  Only a ZIP64 value can be larger, and no file holds that much.

Local headers are checked lazily, and the results cached.  The first
:meth:`ZipReader.data_offsets` call (or the 65th :meth:`ZipReader.data_offset`
of different members: reading a few metadata records costs no pass over
10^5 headers) checks all of them in one vectorised pass
(:mod:`ptfile.archive._bulk`) when the archive is in memory or mapped; a
mapped archive whose headers lie far apart has them read rather than
touched.  Otherwise one header is read per member asked for.
:func:`computed_data_offset` is torch's alternative that derives the offset
from the previous member instead (spec §6).
"""

from __future__ import annotations

import copy
import zlib  # CRC-32
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final, cast

from .._gc import paused_gc
from .._io.local import Source
from ..errors import ArchiveError, UnsupportedFeatureError
from ..limits import DEFAULT_LIMITS, Limits
from ._entries import Entries
from .inflate import inflate, inflate_bound
from .layout import computed_data_offset, computed_data_offsets, computed_next_header_offset
from .records import METHOD_DEFLATED, METHOD_STORED
from .walk import read_directory, read_local_header

if TYPE_CHECKING:  # numpy is imported by the methods that make arrays: a scan needs none
    import numpy as np

__all__ = ["Entries", "Record", "ZipReader", "computed_data_offset", "computed_data_offsets",
           "computed_next_header_offset"]

#: CRC checks read stored members in slices of this size.
CRC_CHUNK_BYTES: Final = 1 << 24

#: Below this many records (or this many single look-ups), checking local headers one
#: at a time is as fast.
BULK_MIN_RECORDS: Final = 64


@dataclass(frozen=True, slots=True)
class Record:
    """One member of the archive, as its central directory header describes it.

    ``name`` is the full name (prefix included); ``size`` the uncompressed and
    ``compressed_size`` the stored size in bytes; ``index`` the position in the
    central directory.  ZIP64 values are already resolved.
    """

    name: str
    header_offset: int
    size: int
    compressed_size: int
    method: int
    crc32: int
    flags: int
    index: int


def _make_record_factory() -> Callable[[str, int, int, int, int, int, int, int], Record]:
    """A positional ``Record`` constructor that sets the slots directly.

    The generated ``__init__`` of a frozen dataclass routes every field through
    ``object.__setattr__``, which doubles the cost of parsing a large central
    directory (10^5-10^6 records in big checkpoints).  Setting the slot
    descriptors directly yields an identical, equally immutable object.
    """
    (set_name, set_header_offset, set_size, set_compressed_size, set_method, set_crc32,
     set_flags, set_index) = (getattr(Record, f.name).__set__ for f in fields(Record))  # fmt: skip
    new = object.__new__

    def make(
        name: str, header_offset: int, size: int, compressed_size: int,
        method: int, crc32: int, flags: int, index: int,
    ) -> Record:  # fmt: skip
        record = new(Record)
        set_name(record, name)
        set_header_offset(record, header_offset)
        set_size(record, size)
        set_compressed_size(record, compressed_size)
        set_method(record, method)
        set_crc32(record, crc32)
        set_flags(record, flags)
        set_index(record, index)
        return record

    return make


_new_record: Final = _make_record_factory()


class ZipReader:
    """Random access to the members of a ZIP archive.

    Parameters
    ----------
    source : Source
        The archive bytes.
    limits : Limits
        Ceilings for the entry count and name lengths.

    Raises
    ------
    ArchiveError
        The end records or the central directory are damaged.
    LimitExceededError
        More entries or a longer name than ``limits`` allow.
    UnsupportedFeatureError
        A multi-disk archive or an encrypted member.

    Notes
    -----
    One member at a time: :meth:`get`, :meth:`data_offset`, :meth:`read`,
    :meth:`view`.  Many at once, without a :class:`Record` each:
    :attr:`names`, :attr:`entries` (int64 columns), :meth:`indices`,
    :meth:`indices_with_prefix`, :meth:`data_offsets` and :meth:`data_offsets_at`.

    Examples
    --------
    >>> import io
    >>> from ptfile._io.local import BytesSource
    >>> from ptfile.archive import ZipWriter
    >>> out = io.BytesIO()
    >>> with ZipWriter(out.write, "archive") as writer:
    ...     writer.write_record("data.pkl", b"\\x80\\x02N.")
    >>> reader = ZipReader(BytesSource(out.getvalue()))
    >>> reader.prefix, reader.read("archive/data.pkl")
    ('archive', b'\\x80\\x02N.')
    >>> rows = reader.indices_with_prefix("archive/data")
    >>> reader.data_offsets_at(rows).tolist(), reader.entries.column("size")[rows].tolist()
    ([64], [4])
    """

    def __init__(self, source: Source, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self._source, self._limits = source, limits
        central = read_directory(source, limits)  # the walk's steps 1-2, strict
        self._entries = central.entries
        self._index = self._entries.index
        self._cd_offset = central.directory.offset
        self._made: list[Record | None] = [None] * len(self._entries.names)
        self._all: tuple[Record, ...] | None = None
        # Checked data offsets: those read one at a time, then all (the bulk check).
        self._single: dict[int, int] = {}
        self._offsets: np.ndarray | None = None
        self._bulk_checked = False

    @property
    def records(self) -> tuple[Record, ...]:
        """Every member, in central directory order."""
        if self._all is None:
            entries, made = self._entries, self._made
            columns = entries.values.T.tolist()
            fresh = map(_new_record, entries.names, *columns, range(len(made)))
            with paused_gc():  # 10^5 new objects, none of them garbage
                self._made = [new if old is None else old
                              for old, new in zip(made, fresh, strict=True)]  # fmt: skip
            self._all = tuple(cast("list[Record]", self._made))
        return self._all

    @property
    def entries(self) -> Entries:
        """The central directory as read-only columns (names, index, int64 arrays)."""
        return self._entries

    @property
    def names(self) -> tuple[str, ...]:
        """Every member's full name, in central directory order."""
        return self._entries.names

    def __len__(self) -> int:
        return len(self._made)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def _record(self, index: int) -> Record:
        record = self._made[index]
        if record is None:
            offset, size, csize, method, crc, flags = self._entries.row(index)
            name = self._entries.names[index]
            record = _new_record(name, offset, size, csize, method, crc, flags, index)
            self._made[index] = record
        return record

    def get(self, name: str) -> Record | None:
        """The member called ``name`` (full name, prefix included), or None."""
        index = self._index.get(name)
        return None if index is None else self._record(index)

    def indices(self, names: Iterable[str]) -> np.ndarray:
        """The central directory index of each of ``names``, as an int64 array.

        Raises
        ------
        KeyError
            A name no member has.
        """
        import numpy as np

        return np.fromiter(map(self._index.__getitem__, names), np.int64)

    def indices_with_prefix(self, prefix: str) -> np.ndarray:
        """The central directory indices of the names that start with ``prefix`` (int64, in
        directory order)."""
        import numpy as np

        found: np.ndarray = np.flatnonzero(self._entries.starting_with(prefix))
        return found

    def first_name_outside(self, folder: str) -> str | None:
        """The first name (directory order) that does not start with ``folder``, or None."""
        row = self._entries.first_outside(folder)
        return None if row is None else self._entries.names[row]

    @property
    def prefix(self) -> str:
        """The archive folder: the first central directory name up to its first ``/``.

        Raises
        ------
        ArchiveError
            The archive is empty or its first name has no ``/`` (torch refuses both).
        """
        if not self._made:
            raise ArchiveError("empty archive has no prefix (archive folder)")
        first = self._entries.names[0]
        if "/" not in first:
            raise ArchiveError("first record is not in a subdirectory (no '/')", member=first)
        return first.split("/", 1)[0]

    def _resolve(self, name_or_record: str | Record) -> Record:
        if isinstance(name_or_record, str):
            index = self._index.get(name_or_record)
            if index is None:
                raise KeyError(name_or_record)
            return self._record(index)
        index = name_or_record.index
        if not 0 <= index < len(self._made) or self._made[index] is not name_or_record:
            raise ValueError(f"{name_or_record!r} is not a record of this archive")
        return name_or_record

    def data_offset(self, record: str | Record) -> int:
        """Offset of the first data byte of ``record``, from its local header (cached).

        Raises
        ------
        ArchiveError
            No local header signature there, or its name differs from the central one.
        KeyError
            No member has that name.
        """
        return self._data_offset(self._resolve(record).index)

    def rebound(self, source: Source) -> ZipReader:
        """This reader, reading through ``source`` from now on: another way in to the same
        bytes (:meth:`ptfile._io.local.MmapSource.detached`).  The directory is not read again."""
        other = copy.copy(self)
        other._source = source
        other._made, other._single = list(self._made), dict(self._single)
        return other

    def data_offsets(self, names: Iterable[str]) -> np.ndarray:
        """:meth:`data_offset` of each of ``names``, as an int64 array (one vectorised pass).

        Raises
        ------
        ArchiveError, KeyError
            As :meth:`data_offset`, for the first name in ``names`` that calls for it.
        """
        return self.data_offsets_at(self.indices(names))

    def data_offsets_at(self, indices: np.ndarray) -> np.ndarray:
        """:meth:`data_offsets` of the members at central directory ``indices`` (int array).

        Raises
        ------
        ArchiveError
            As :meth:`data_offset`, for the first index that calls for it.
        IndexError
            An index outside ``0 .. len(self) - 1``.
        """
        import numpy as np

        indices = np.asarray(indices, np.int64)
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= len(self._made)):
            raise IndexError(f"record indices outside 0..{len(self._made) - 1}")
        if not self._bulk_checked:
            self._check_all_local_headers()
        found: np.ndarray = np.full(len(indices), -1, np.int64) if self._offsets is None \
            else self._offsets[indices]
        for at in np.flatnonzero(found < 0).tolist():
            found[at] = self._data_offset(int(indices[at]))
        return found

    def checked_data_offsets(self) -> np.ndarray | None:
        """Every record's data offset as the bulk check of the local headers found it (-1
        where that check left a record to :meth:`data_offset`), or None while that check
        has not run, or could not (read-only; it runs at the 65th :meth:`data_offset`)."""
        return self._offsets

    def _data_offset(self, index: int) -> int:
        found = self._single.get(index, -1)
        if found < 0 and not self._bulk_checked and len(self._single) >= BULK_MIN_RECORDS:
            self._check_all_local_headers()
        if found < 0 and self._offsets is not None:
            found = int(self._offsets[index])
        if found < 0:
            found = self._single[index] = self._read_local_header(self._record(index))
        return found

    def _check_all_local_headers(self) -> None:
        """Check every local header in one vectorised pass when the archive is in memory."""
        self._bulk_checked = True
        source, entries = self._source, self._entries
        if len(self._made) < BULK_MIN_RECORDS or source.reads_on_demand:
            return
        from ._bulk import bulk_data_offsets, gathered_data_offsets, sparse  # numpy

        columns = (entries.column("header_offset"), entries.name_at, entries.name_length,
                   entries.column("compressed_size"), self._cd_offset)
        found = None
        if source.map_access is not None and sparse(columns[0], source.size):
            found = gathered_data_offsets(source.gather, source.size, entries.directory,
                                          entries.directory_offset, *columns)
        if found is None:
            found = bulk_data_offsets(source.view(0, source.size, "archive"), *columns)
        for index, offset in self._single.items():  # (the bulk check agrees, or says -1)
            found[index] = offset
        self._offsets = found

    def _read_local_header(self, record: Record) -> int:
        found = read_local_header(self._source, record.name, record.header_offset,
                                  record.compressed_size, self._cd_offset)
        return cast("int", found)

    def read(self, record: str | Record) -> bytes:
        """The uncompressed bytes of ``record`` (stored or deflated).

        Raises
        ------
        ArchiveError
            Damaged local header or deflate stream, or a size other than declared.
        LimitExceededError
            A deflated record declares more than ``Limits.max_inflate_ratio`` times
            its compressed size (plus 1 MiB).
        UnsupportedFeatureError
            A compression method other than stored (0) and deflated (8).
        KeyError
            No member has that name.
        """
        record = self._resolve(record)
        offset = self.data_offset(record)
        if record.method == METHOD_STORED:
            return self._source.pread(offset, record.size, f"record {record.name}")
        if record.method == METHOD_DEFLATED:
            inflate_bound(record.name, record.size, record.compressed_size,
                          self._limits.max_inflate_ratio)
            raw = self._source.pread(offset, record.compressed_size, f"record {record.name}")
            return inflate(raw, record.name, record.size)
        raise UnsupportedFeatureError(
            f"record {record.name!r} uses compression method {record.method}; "
            "only stored (0) and deflated (8) are supported"
        )

    def view(self, record: str | Record) -> memoryview:
        """The bytes of ``record`` without copying when it is stored and the source maps.

        Raises
        ------
        ArchiveError, UnsupportedFeatureError, KeyError
            As :meth:`read`.
        """
        record = self._resolve(record)
        if record.method == METHOD_STORED:
            return self._source.view(self.data_offset(record), record.size, f"record {record.name}")
        return memoryview(self.read(record))

    def check_crc(self, record: str | Record) -> bool:
        """True when the CRC-32 of the member's bytes equals the central directory's.

        torch never checks CRCs and writes 0 when CRC computation is disabled,
        so a False here is worth a warning, not an error.
        """
        record = self._resolve(record)
        if record.method != METHOD_STORED:
            return zlib.crc32(self.read(record)) == record.crc32
        offset = self.data_offset(record)
        crc = 0
        for start in range(0, record.size, CRC_CHUNK_BYTES):
            n = min(CRC_CHUNK_BYTES, record.size - start)
            crc = zlib.crc32(self._source.view(offset + start, n, f"record {record.name}"), crc)
        return crc == record.crc32

    def __repr__(self) -> str:
        return f"<ZipReader {self._source.name or 'in-memory'}: {len(self.records)} records>"

