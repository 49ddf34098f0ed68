"""The central directory as columns: a vectorised parse, and the sequential one it must equal.

What is read and checked is specified in :mod:`ptfile.archive.records`
("Readers") and :mod:`ptfile.archive.reader` (policy).  :func:`parse_entries`
returns it as :class:`Entries`: names, a name index and columns (numpy arrays,
or Python lists for directories of at most :data:`SMALL_ENTRIES` entries), no
per-entry objects.  It has two implementations:

Sequential (the reference, ~1 µs an entry)
    One pass, entry by entry, raising the first error in directory order.
    Per entry, in this order: bad signature or name longer than
    ``max_name_length``; entry running past the directory; name not UTF-8;
    ZIP64 extra missing or too short for the sentinel fields; encrypted
    member; declared size over ``2**63 - 1`` (the columns are int64); stored
    member whose two sizes differ; member (local header, name, data) running
    into the central directory; duplicate name.

Vectorised (~0.15 µs an entry)
    1. Candidate entry starts: every ``PK\\x01\\x02`` whose 46 fixed bytes fit
       (at most ``2 * entries + 64`` of them, which bounds the memory they take).
    2. The first ``entries`` candidates must chain: the first at 0, each next
       one at ``start + 46 + name + extra + comment`` lengths (gathered with
       numpy), the last entry ending inside the directory.  By induction these
       are exactly the positions the sequential pass visits; a signature
       inside a name or a field breaks the chain.
    3. Every check of the sequential pass, as array comparisons; ZIP64 entries
       (sentinel fields) have their extra read one by one.
    4. Names: slices of one latin-1 decoding (ASCII names are the same in
       UTF-8), UTF-8 decoded one by one only when not all are ASCII.
       Duplicates: fewer dict keys than entries.

    On *any* failure in 2-4 the vectorised parse gives up and the sequential
    one runs instead: it raises the precise error, or (a signature inside a
    name, a ZIP64 value too large for the vectorised arithmetic) builds the
    same columns.  So the vectorised parse only has to be right when it
    succeeds: it succeeds only where every sequential check passes, and then
    it reads the same fields at the same positions.

After either: members must not overlap (:func:`check_overlaps`, shared), and
no two names may differ only in ASCII case (:func:`check_case_collisions`:
torch's miniz looks names up ignoring case and takes the first match, so
``archive/Data.pkl`` before ``archive/data.pkl`` is what torch unpickles,
while exact-name readers take the other one).
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final, cast

from ..errors import ArchiveError, LimitExceededError, PtfileError, UnsupportedFeatureError
from ._vectorised import vectorised_columns
from .anomalies import Anomaly, report
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

if TYPE_CHECKING:  # numpy is imported where arrays are made: a small directory needs none
    import numpy as np

__all__ = ["COLUMNS", "SMALL_ENTRIES", "Entries", "check_case_collisions", "check_overlaps", "parse_entries",
           "parse_sequential", "parse_vectorised"]

_CD_FIXED: Final = CENTRAL_DIRECTORY_STRUCT.size
_LOCAL_FIXED: Final = LOCAL_FILE_HEADER_STRUCT.size
#: Sizes and offsets live in int64 columns.
MAX_SIZE: Final = 2**63 - 1




#: Directories of at most this many entries are parsed by the sequential pass and
#: their columns kept as Python lists (numpy arrays are made only when asked for).
#: Warm, the two passes cost the same at ~300 entries; but a process's first calls
#: to the numpy functions the vectorised pass and its consumers use cost ~2 ms
#: (a fresh process's ``load(mmap=True)`` of a 300-tensor file: ~7 ms with them,
#: ~5 ms without).
SMALL_ENTRIES: Final = 1024


class Entries:
    """The central directory, one row per entry in directory order (ZIP64 values resolved).

    ``values`` is an ``(n, 6)`` int64 array of the :data:`COLUMNS`; ``name_at``
    the file offset of each central name, ``name_length`` its byte length.
    The arrays are read-only; ``index`` maps each name to its row.
    ``directory`` holds the directory's bytes, which start at file offset
    ``directory_offset``.

    The columns are held as the parse made them: numpy arrays (vectorised
    pass) or Python lists (sequential pass); the other form is made on first
    use.  :meth:`row`, :meth:`column_list`, :meth:`first_outside` and
    :func:`check_overlaps` use the lists when there are lists, so reading a
    small directory calls no numpy function.
    """

    __slots__ = ("_name_at", "_name_length", "_name_lengths", "_name_starts", "_rows", "_values",
                 "directory", "directory_offset", "index", "names")

    def __init__(self, names: tuple[str, ...], index: dict[str, int], directory: bytes,
                 directory_offset: int, *, values: np.ndarray | None = None,
                 name_at: np.ndarray | None = None, name_length: np.ndarray | None = None,
                 rows: list[tuple[int, ...]] | None = None, name_starts: list[int] | None = None,
                 name_lengths: list[int] | None = None) -> None:
        self.names, self.index = names, index
        self.directory, self.directory_offset = directory, directory_offset
        self._values, self._name_at, self._name_length = values, name_at, name_length
        self._rows, self._name_starts, self._name_lengths = rows, name_starts, name_lengths

    @property
    def values(self) -> np.ndarray:
        """The :data:`COLUMNS` as an ``(n, 6)`` read-only int64 array."""
        import numpy as np

        if self._values is None:
            rows = cast("list[tuple[int, ...]]", self._rows)
            self._values = _frozen(np.array(rows, np.int64).reshape(len(rows), len(COLUMNS)))
        return self._values

    @property
    def name_at(self) -> np.ndarray:
        """The file offset of each central name (read-only int64)."""
        import numpy as np

        if self._name_at is None:
            starts = cast("list[int]", self._name_starts)
            self._name_at = _frozen(np.array(starts, np.int64) + self.directory_offset)
        return self._name_at

    @property
    def name_length(self) -> np.ndarray:
        """The byte length of each name (read-only int64)."""
        import numpy as np

        if self._name_length is None:
            self._name_length = _frozen(np.array(self._name_lengths, np.int64))
        return self._name_length

    def row(self, index: int) -> tuple[int, ...]:
        """Row ``index`` of the :data:`COLUMNS`, as ints."""
        if self._rows is not None:
            return self._rows[index]
        return tuple(self.values[index].tolist())

    def column(self, name: str) -> np.ndarray:
        """One of the :data:`COLUMNS`, as a read-only int64 array."""
        column: np.ndarray = self.values[:, COLUMNS.index(name)]
        return column

    def column_list(self, name: str) -> list[int]:
        """One of the :data:`COLUMNS`, as a list of ints."""
        at = COLUMNS.index(name)
        if self._rows is not None:
            return [row[at] for row in self._rows]
        found: list[int] = self.values[:, at].tolist()
        return found

    def column_held(self, name: str) -> np.ndarray | list[int]:
        """One of the :data:`COLUMNS` in the form the parse made: a list for a small
        directory (no numpy call), else the read-only array."""
        return self.column_list(name) if self._rows is not None else self.column(name)

    def starting_with(self, prefix: str) -> np.ndarray:
        """Per row: does the name start with ``prefix``?  (Compared as UTF-8 bytes.)"""
        import numpy as np

        raw = prefix.encode("utf-8")
        width = len(raw)
        match: np.ndarray = self.name_length >= width
        if width == 0 or not match.any():
            return match
        at = np.where(match, self.name_at - self.directory_offset, 0)
        every = np.ndarray((len(self.directory) - width + 1,), f"V{width}", self.directory, 0,
                           (1,))  # fmt: skip
        heads = every[at].view(np.uint8).reshape(len(at), width)
        match &= (heads == np.frombuffer(raw, np.uint8)).all(axis=1)
        return match

    def first_outside(self, folder: str) -> int | None:
        """The first row whose name does not start with ``folder``, or None.

        (A str prefix of a decoded name is a UTF-8 byte prefix of its bytes, and
        back: UTF-8 is a prefix code.)
        """
        if self._rows is not None:
            return next((row for row, name in enumerate(self.names)
                         if not name.startswith(folder)), None)
        import numpy as np

        outside = np.flatnonzero(~self.starting_with(folder))
        return int(outside[0]) if outside.size else None

    def ends(self) -> np.ndarray:
        """Where each member's local header, name and data end at the least."""
        ends: np.ndarray = self.values[:, 0] + _LOCAL_FIXED + self.name_length + self.values[:, 2]
        return ends


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _entries(names: list[str], values: np.ndarray, name_start: np.ndarray,
             name_length: np.ndarray, index: dict[str, int], data: bytes,
             cd_offset: int) -> Entries:
    import numpy as np

    values = np.ascontiguousarray(values, np.int64).reshape(len(names), len(COLUMNS))
    name_at = name_start.astype(np.int64) + cd_offset
    return Entries(tuple(names), index, data, cd_offset, values=_frozen(values),
                   name_at=_frozen(name_at), name_length=_frozen(name_length.astype(np.int64)))


def parse_entries(data: bytes, entries: int, cd_offset: int, max_name: int,
                  anomalies: list[Anomaly] | None = None) -> Entries:
    """Every central directory entry of ``data`` (the directory's bytes, at ``cd_offset``).

    ``anomalies`` None is strict mode; a list is tolerant mode (the sequential
    pass only, see :func:`parse_sequential`, then :func:`check_overlaps`).

    Raises
    ------
    ArchiveError, LimitExceededError, UnsupportedFeatureError
        Strict mode: as the sequential pass (module docstring), then for
        overlapping members.
    """
    parsed = None if entries <= SMALL_ENTRIES or anomalies is not None else \
        parse_vectorised(data, entries, cd_offset, max_name)
    if parsed is None:
        parsed = parse_sequential(data, entries, cd_offset, max_name, anomalies)
    check_overlaps(parsed, anomalies)
    check_case_collisions(parsed, anomalies)
    return parsed


def _lower_under_one_folder(joined: str, names: Sequence[str]) -> bool:
    """Every name is under the first name's folder, exactly, and the rest of every name
    has no uppercase letter: torch's archives (the folder is the file's stem, ``B/``),
    decided with a few passes over the joined names (~3 ms for 100,000)."""
    folder = names[0][:names[0].find("/") + 1] if names and "/" in names[0] else ""
    if not folder or not joined.startswith(folder) \
            or joined.count("\0" + folder) != len(names) - 1 or joined.count("\0") != len(names) - 1:
        return False
    rest = joined[len(folder):].replace("\0" + folder, "\0")
    return rest.lower() == rest


def check_case_collisions(parsed: Entries, anomalies: list[Anomaly] | None = None) -> None:
    """Refuse (strict) or report (``case-colliding-names``) names equal but for ASCII case.

    miniz folds ASCII letters only, as ``bytes.lower`` does.  Names without an
    uppercase letter cannot collide: one join and one ``lower`` decide (2 ms
    for 100,000 names), or the same on the names less their common folder (torch's
    folder is the file's stem, often capitalised: ~3 ms); otherwise the folded names
    are compared (13 ms).
    Exact duplicates are ``duplicate-name``, not this.
    """
    names = parsed.names
    joined = "\0".join(names)
    if joined.lower() == joined or _lower_under_one_folder(joined, names):
        return
    folded = joined.encode("utf-8", "surrogatepass").lower().split(b"\0")
    if len(folded) != len(names):  # a name holds a NUL
        folded = [n.encode("utf-8", "surrogatepass").lower() for n in names]
    if len(set(folded)) == len(folded):
        return
    first: dict[bytes, int] = {}
    for row, key in enumerate(folded):
        other = first.setdefault(key, row)
        if other != row and names[other] != names[row]:
            report(anomalies, "case-colliding-names", ArchiveError(
                f"name {names[row]!r} differs from {names[other]!r} only in case: torch "
                "looks names up ignoring case and reads the first, exact readers either",
                offset=parsed.row(row)[0], member=names[row]))


# ---------------------------------------------------------------------------
# Sequential: the reference
# ---------------------------------------------------------------------------


def parse_sequential(data: bytes, entries: int, cd_offset: int, max_name: int,
                     anomalies: list[Anomaly] | None = None) -> Entries:
    """The reference pass (module docstring); no overlap check.

    ``anomalies`` None is strict mode: the first problem raises.  A list is
    tolerant mode: each problem is reported (``bad-central-directory``, where
    the walk stops; ``name-too-long``, ``bad-name``, ``bad-zip64-extra``,
    ``encrypted-record``, ``bad-sizes``, ``data-outside-archive``,
    ``duplicate-name``, after which it goes on) and every entry read is kept,
    duplicates too (``index`` maps a name to its first row).
    """
    parse = _Sequential(data, cd_offset, max_name, anomalies)
    try:
        parse.run(entries)
    except struct.error as exc:  # unpack_from past the end: the previous entry overran
        error = ArchiveError(f"central directory ends inside entry {len(parse.names)}",
                             offset=cd_offset)
        if anomalies is None:
            raise error from exc
        report(anomalies, "bad-central-directory", error)
    except _Stop:
        pass
    return parse.entries()


class _Stop(Exception):
    """Tolerant mode: the entries cannot be read further."""


class _Sequential:
    """One pass, entry by entry; the state the tolerant mode returns when it stops."""

    def __init__(self, data: bytes, cd_offset: int, max_name: int,
                 anomalies: list[Anomaly] | None) -> None:
        self.data, self.cd_offset, self.max_name, self.anomalies = (data, cd_offset, max_name,
                                                                    anomalies)
        self.names: list[str] = []
        self.rows: list[tuple[int, ...]] = []
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.index: dict[str, int] = {}

    def entries(self) -> Entries:
        return Entries(tuple(self.names), self.index, self.data, self.cd_offset, rows=self.rows,
                       name_starts=self.starts, name_lengths=self.lengths)

    def run(self, entries: int) -> None:
        data, cd_offset, max_name = self.data, self.cd_offset, self.max_name
        text = data.decode("latin-1")  # one char per byte: ASCII names are sliced, not decoded
        unpack = CENTRAL_DIRECTORY_STRUCT.unpack_from
        rows, starts, lengths, index, names = (self.rows, self.starts, self.lengths, self.index,
                                               self.names)
        pos = 0
        for row in range(entries):
            (sig, _, _, flags, method, _, _, crc, csize, usize,
             nlen, elen, clen, disk, _, _, offset) = unpack(data, pos)  # fmt: skip
            if sig != CENTRAL_DIRECTORY_SIGNATURE or nlen > max_name:
                self._bad_entry(row, sig, nlen, cd_offset + pos)
            start = pos + _CD_FIXED
            pos = start + nlen + elen + clen
            name = text[start : start + nlen]
            if pos > len(data) or not name.isascii():
                name = self._decode_name(start, nlen, pos, row)
            if usize == U32_MAX or csize == U32_MAX or offset == U32_MAX or disk == U16_MAX:
                extra = data[start + nlen : start + nlen + elen]
                usize, csize, offset = self._zip64_fields(
                    extra, usize, csize, offset, disk, cd_offset + start
                )
            if (
                flags & ENCRYPTION_FLAGS
                or usize > MAX_SIZE
                or (method == METHOD_STORED and csize != usize)
                or offset + _LOCAL_FIXED + nlen + csize > cd_offset
            ):
                for code, error in _entry_problems(name, offset, usize, csize, method, flags,
                                                   offset + _LOCAL_FIXED + nlen + csize,
                                                   cd_offset):
                    report(self.anomalies, code, error)
            if index.setdefault(name, row) != row:
                report(self.anomalies, "duplicate-name", ArchiveError(
                    f"duplicate name (entries {index[name]} and {row}): readers disagree on "
                    "which one it means", offset=offset, member=name))
            names.append(name)
            rows.append((offset, usize, csize, method, crc, flags))
            starts.append(start)
            lengths.append(nlen)

    def _zip64_fields(self, extra: bytes, usize: int, csize: int, offset: int, disk: int,
                      at: int) -> tuple[int, int, int]:
        try:
            return zip64_fields(extra, usize, csize, offset, disk, at)
        except ArchiveError as exc:
            report(self.anomalies, "bad-zip64-extra", exc)
            return usize, csize, offset

    def _decode_name(self, start: int, nlen: int, end: int, row: int) -> str:
        """The name of an entry that is not plain ASCII, or an error if the entry overruns."""
        data, at = self.data, self.cd_offset + start
        if end > len(data):
            report(self.anomalies, "bad-central-directory", ArchiveError(
                f"central directory entry {row} runs past its end", offset=at))
            raise _Stop
        try:
            return data[start : start + nlen].decode("utf-8")
        except UnicodeDecodeError as exc:
            report(self.anomalies, "bad-name", ArchiveError(
                f"central directory entry {row}: name is not UTF-8 ({exc.reason})", offset=at))
            return data[start : start + nlen].decode("utf-8", "surrogateescape")

    def _bad_entry(self, row: int, sig: bytes, nlen: int, at: int) -> None:
        if sig != CENTRAL_DIRECTORY_SIGNATURE:
            report(self.anomalies, "bad-central-directory", ArchiveError(
                f"central directory entry {row}: bad signature {sig!r} (the directory ends "
                f"early or is damaged after {row} entries)", offset=at))
            raise _Stop
        report(self.anomalies, "name-too-long", LimitExceededError(
            "max_name_length", self.max_name, nlen, f"name of entry {row}"))


def _entry_problems(name: str, offset: int, size: int, csize: int, method: int, flags: int,
                    end: int, cd_offset: int) -> Iterator[tuple[str, PtfileError]]:
    """The anomaly code and error of each problem of a member's flags, sizes or bounds."""
    if flags & ENCRYPTION_FLAGS:
        yield "encrypted-record", UnsupportedFeatureError(f"record {name!r} is encrypted")
    if size > MAX_SIZE:
        yield "bad-sizes", ArchiveError(f"declared size {size} is over 2**63 - 1", offset=offset,
                                        member=name)
    if method == METHOD_STORED and csize != size:
        yield "bad-sizes", ArchiveError(
            f"stored record has compressed size {csize} != size {size}", offset=offset,
            member=name)
    if end > cd_offset:
        yield "data-outside-archive", ArchiveError(
            f"local header at {offset:#x} with {csize} data bytes runs into the central "
            f"directory at {cd_offset:#x}", offset=offset, member=name)


def check_overlaps(entries: Entries, anomalies: list[Anomaly] | None = None) -> None:
    """Members must not overlap (each at least local header, name and data).

    Strict mode raises the first overlapping pair in (header offset, index)
    order; tolerant mode reports every pair of neighbours that overlap
    (``overlapping-records``).
    """
    if anomalies is not None:
        _report_overlaps(entries, anomalies)
        return
    if entries._rows is not None:  # the lists of a small directory: no numpy if in order
        rows, lengths = entries._rows, cast("list[int]", entries._name_lengths)
        begins = [row[0] for row in rows]
        stops = [row[0] + _LOCAL_FIXED + n + row[2] for row, n in zip(rows, lengths, strict=True)]
        if all(map(operator.ge, begins[1:], stops[:-1])):
            return
    import numpy as np

    starts, ends = entries.values[:, 0], entries.ends()
    if len(starts) < 2 or bool((starts[1:] >= ends[:-1]).all()):
        return  # stored in order, one after the other
    order = np.argsort(starts, kind="stable")
    bad = np.flatnonzero(ends[order[:-1]] > starts[order[1:]])
    if bad.size:
        first, second = int(order[bad[0]]), int(order[bad[0] + 1])
        name = entries.names[second]
        raise ArchiveError(
            f"overlaps record {name!r} at {int(starts[second]):#x}",
            offset=int(starts[first]),
            member=entries.names[first],
        )


def _report_overlaps(entries: Entries, anomalies: list[Anomaly]) -> None:
    """Tolerant :func:`check_overlaps`, on Python ints (tolerated sizes may not fit int64)."""
    rows = [entries.row(i) for i in range(len(entries.names))]
    lengths = entries._name_lengths or entries.name_length.tolist()
    spans = sorted((row[0], row[0] + _LOCAL_FIXED + n + row[2], i)
                   for i, (row, n) in enumerate(zip(rows, lengths, strict=True)))
    names = entries.names
    anomalies.extend(
        Anomaly("overlapping-records", f"overlaps record {names[other]!r} at {start:#x}",
                first_start, names[first])
        for (first_start, end, first), (start, _, other) in itertools.pairwise(spans)
        if end > start)


def parse_vectorised(data: bytes, entries: int, cd_offset: int, max_name: int) -> Entries | None:
    """The fast pass (module docstring; :mod:`._vectorised`), or None when the sequential
    pass must decide."""
    found = vectorised_columns(data, entries, cd_offset, max_name)
    if found is None:
        return None
    return _entries(found.names, found.values, found.name_start, found.name_length,
                    found.name_index, data, cd_offset)
