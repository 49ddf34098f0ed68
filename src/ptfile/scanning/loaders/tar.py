"""What ``torch.load(f, weights_only=False)`` unpickles of a legacy (pre-0.4) tar checkpoint.

Specified against torch 2.13's ``torch/serialization.py`` (``_legacy_load`` and its
inner ``legacy_load``) and CPython 3.11's ``tarfile``; every claim is checked by
``tests/scanning/test_scan_tar_loaders.py``, which runs the real loaders on files
built as torch 0.3 wrote them.

When torch reads a tar
    ``_legacy_load`` tries ``legacy_load`` only when the file object has a
    ``fileno()`` and is at offset 0 (a path or an ``open()`` file; never an
    ``io.BytesIO``, which goes straight to the stream loader of :mod:`.stream`).
    ``legacy_load`` opens ``tarfile.open(fileobj=f, mode="r:",
    format=tarfile.PAX_FORMAT)`` (no compression); with ``weights_only=True``
    it then raises before reading any member.  Any ``tarfile.TarError`` (not a
    ``KeyError``, not an unpickling error) makes torch seek to 0 and read the
    file as a legacy stream instead.

What ``tarfile`` accepts
    A header is a 512-byte block accepted **by its checksum alone**
    (``frombuf``: the stored ``chksum`` must equal the unsigned or signed sum
    of the block with the checksum field read as spaces); the ``ustar`` magic
    is never checked, so v7, GNU, ustar and PAX headers all read.  Numbers are
    read by ``nti`` (``int(text.strip() or "0", 8)`` after the first NUL, or
    base-256 after a ``0x80``/``0xff`` byte), more leniently than POSIX octal.
    ``tarfile.open`` reads the first header: a bad or short first block raises
    ``ReadError`` (torch falls back to the stream); an all-zero first block
    is an empty archive (torch then fails with ``KeyError``, reading nothing).
    The first ``getmember`` lists every member: a later header that is zero,
    short or fails its checksum ends the archive quietly; a member whose data
    and padding run past the end, or an extended header (GNU ``L``/``K``, PAX
    ``x``/``g``) not followed by a readable header, raises ``ReadError``
    (fallback to the stream).  These are the tolerant walk's anomalies
    (:mod:`ptfile.archive.tar`).  Bytes after the archive are read by no one.

Which members, in which order (``getmember``: the **last** member whose name
equals the one asked for, exactly; ``./storages`` is not ``storages``)
    1. ``storages``, extracted and read through an unbuffered file: a pickle
       (the count, used as ``range(count)``); per storage a pickle unpacked as
       ``key, location, storage_type`` (any 3-item iterable, any hashable
       key), ``storage_type._dtype`` giving the element size, then an int64
       element count and that many elements read raw; then a pickle of views.
    2. ``tensors``, the same way: a count pickle; per tensor a pickle unpacked
       as ``key, storage_id, _`` (any key), an int32 ``ndim``, 4 bytes, ``ndim``
       int64 sizes and strides and an int64 offset, of any rank.
    3. ``pickle``, through ``extractfile``: one pickle (``UnpicklerWrapper``).

    ``sys_info`` and any other member are never read.  Where ptfile's own reader
    refuses a key, a rank or a location, torch reads on; the model follows the
    counts and sizes as torch does, and lists every member's pickles even after
    one torch might stop in (scanning more never hides a payload).

What the model cannot tell
    A count, entry or storage type that is not a literal (a call's result, a
    class ptfile does not know the element size of), a negative size, an
    unreadable pickle: :attr:`TarReading.unknown` says where, and the rest of
    that member is searched for pickles (:attr:`TarReading.search`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from ..._io.local import Source
from ...allowlist.structural import StandInType
from ...archive.anomalies import Anomaly
from ...archive.tar import BLOCK, TarMember, read_members, tarfile_accepts
from ...limits import Limits
from . import TORCH_LOAD_UNSAFE
from .stream import CANNOT_TELL, evaluate, next_starts

__all__ = ["TarReading", "TarRegion", "legacy_tar", "tarfile_header"]

#: Anomalies of the tolerant walk on which ``tarfile`` raises ``ReadError`` (torch then
#: reads the file as a stream).
FALLBACK_ANOMALIES: Final = frozenset({"truncated-tar-member", "tar-orphan-extended-header"})
#: Messages of a ``bad-tar-header`` that ``tarfile`` also refuses (then it ends quietly).
_TARFILE_REFUSES: Final = ("tar header checksum", "tar header field")

_INT64: Final = struct.Struct("<q")
_INT32: Final = struct.Struct("<i")
_LOADERS: Final = (TORCH_LOAD_UNSAFE,)


@dataclass(frozen=True, slots=True)
class TarRegion:
    """A pickle torch unpickles: at ``start`` of member ``member``'s bytes."""

    member: TarMember
    start: int
    label: str
    loaders: tuple[str, ...] = _LOADERS


@dataclass(slots=True)
class TarReading:
    """What ``legacy_load`` reads of a file.

    Attributes
    ----------
    is_tar : bool
        ``tarfile`` lists the members without error: torch (given a path) reads
        them and not the stream.
    why_not : str
        Why ``tarfile`` refuses the file (when it does).
    members, anomalies : list
        The tolerant walk's members (as ``tarfile`` lists them) and anomalies.
    regions : list of TarRegion
        Every pickle torch unpickles, in order.
    unknown : list of (TarMember, offset, why)
        Where the model cannot tell what torch reads next.
    search : list of (TarMember, offset)
        Rest of a member to search for pickles, after an ``unknown``.
    data : dict
        The bytes of each member read, by its offset (read once, for the scanner too).
    """

    is_tar: bool
    why_not: str = ""
    members: list[TarMember] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    regions: list[TarRegion] = field(default_factory=list)
    unknown: list[tuple[TarMember, int, str]] = field(default_factory=list)
    search: list[tuple[TarMember, int]] = field(default_factory=list)
    data: dict[int, bytes] = field(default_factory=dict)


def tarfile_header(head: bytes) -> bool:
    """Whether ``tarfile`` accepts ``head`` (the file's first 512 bytes) as a header: its
    checksum alone, ``ustar`` magic or not (:func:`ptfile.archive.tar.tarfile_accepts`)."""
    return tarfile_accepts(head)


def _storage_size(kind: object) -> int | None:
    """The element size ``storage_type._dtype`` gives, when the model knows it."""
    if isinstance(kind, StandInType) and kind.module.split(".")[0] == "torch":
        from ...model.dtypes import STORAGE_DTYPES  # (numpy): legacy tar files only

        dtype = STORAGE_DTYPES.get(kind.name)
        if dtype is not None:
            return dtype.itemsize
    return None


def _three(value: object) -> list[object] | None:
    """The items ``a, b, c = value`` unpacks (None: it raises, or the model cannot tell)."""
    if isinstance(value, (tuple, list)) or type(value) is dict:
        items = list(value)
        return items if len(items) == 3 else None
    return None


class _Member:
    """A cursor over one member as torch reads it (an unbuffered file: a pickle ends at
    the end of its last frame)."""

    def __init__(self, reading: TarReading, member: TarMember, data: bytes,
                 limits: Limits) -> None:
        self.reading, self.member, self.data, self.limits = reading, member, data, limits
        self.pos = 0

    def pickle(self, label: str) -> object:
        """Record the pickle at the cursor; its value (or CANNOT_TELL) and the cursor after
        it.  Raises _Stop when it cannot be walked."""
        start = self.pos
        self.reading.regions.append(TarRegion(self.member, start, label))
        value, end = evaluate(self.data, start, self.limits)
        if end < 0:
            raise _Stop(f"{label} is not a pickle ptfile can walk")
        self.pos = max(next_starts(self.data, start, end, self.limits))
        return value

    def ints(self, layout: struct.Struct) -> tuple[int, ...] | None:
        if self.pos + layout.size > len(self.data):
            return None  # torch's struct.unpack fails: it stops here
        self.pos += layout.size
        return layout.unpack_from(self.data, self.pos - layout.size)

    def cannot_tell(self, why: str) -> None:
        self.reading.unknown.append((self.member, self.pos, why))
        self.reading.search.append((self.member, self.pos))


class _Stop(Exception):
    """The model stops reading this member (its message: why, for ``unknown`` ones)."""


def _count(m: _Member, what: str) -> int | None:
    value = m.pickle(f"{what} count")
    if value is CANNOT_TELL:
        m.cannot_tell(f"the {what} count is not a literal")
        return None
    return value if type(value) in (int, bool) else None  # type: ignore[return-value]


def _storages(m: _Member) -> None:
    count = _count(m, "storage")
    for i in range(max(count or 0, 0)):
        items = _three(entry := m.pickle(f"storage entry {i}"))
        if entry is CANNOT_TELL:
            return m.cannot_tell(f"storage entry {i} is not a literal")
        if items is None:
            return None  # not three items: torch raises
        size = _storage_size(items[2])
        if size is None:
            if isinstance(items[2], StandInType):
                return m.cannot_tell(f"storage entry {i}: the element size of "
                                     f"{items[2].module}.{items[2].name} is unknown")
            return None  # a literal has no _dtype: torch raises
        numel = m.ints(_INT64)
        if numel is None:
            return None
        if numel[0] < 0:
            return m.cannot_tell(f"storage entry {i} has {numel[0]} elements")
        if m.pos + numel[0] * size > len(m.data):
            return None  # torch reads past the end: it raises
        m.pos += numel[0] * size
    if count is not None:
        m.pickle("storage views")
    return None


def _tensors(m: _Member) -> None:
    count = _count(m, "tensor")
    for i in range(max(count or 0, 0)):
        entry = m.pickle(f"tensor entry {i}")
        if entry is CANNOT_TELL:
            return m.cannot_tell(f"tensor entry {i} is not a literal")
        if _three(entry) is None:
            return None
        ndim = m.ints(_INT32)
        if ndim is None or ndim[0] < 0 or m.ints(_INT32) is None:
            return None
        rest = 16 * ndim[0] + 8
        if m.pos + rest > len(m.data):
            return None
        m.pos += rest
    return None


def legacy_tar(source: Source, limits: Limits) -> TarReading:
    """What ``torch.load(path, weights_only=False)`` unpickles of the tar in ``source``
    (module docstring): whether ``tarfile`` reads it, and every pickle of its
    ``storages``, ``tensors`` and ``pickle`` members, with torch's leniency."""
    head = source.pread(0, min(source.size, BLOCK), "tar header")
    if head == bytes(BLOCK):
        return TarReading(True)  # an empty archive: torch fails on getmember
    anomalies: list[Anomaly] = []
    members = read_members(source, limits, anomalies)
    reading = TarReading(True, members=members, anomalies=anomalies)
    if not tarfile_header(head):
        reading.is_tar = False
        reading.why_not = "tarfile refuses the first header (or the file is shorter than one)"
    for anomaly in anomalies:
        if anomaly.code in FALLBACK_ANOMALIES:
            reading.is_tar, reading.why_not = False, anomaly.message
        elif anomaly.code == "bad-tar-header" and anomaly.offset and \
                not anomaly.message.startswith(_TARFILE_REFUSES):
            why = f"tarfile may read on past a header ptfile refuses ({anomaly.message})"
            reading.unknown.append((TarMember("", anomaly.offset, 0), 0, why))
        elif anomaly.code in ("negative-tar-size", "too-many-members"):
            reading.unknown.append((TarMember("", anomaly.offset or 0, 0), 0,
                                    anomaly.message))
    by_name = {member.name: member for member in members}  # the last of a name wins
    for name, read in (("storages", _storages), ("tensors", _tensors), ("pickle", None)):
        member = by_name.get(name)
        if member is None:
            continue
        data = reading.data.get(member.offset)
        if data is None:
            data = reading.data[member.offset] = source.pread(member.offset, member.size,
                                                              f"tar member {name}")
        cursor = _Member(reading, member, data, limits)
        try:
            if read is None:
                cursor.pickle("pickle")
            else:
                read(cursor)
        except _Stop as stop:
            cursor.cannot_tell(str(stop))
    return reading
