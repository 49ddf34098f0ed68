"""The tar checkpoint format of torch < 0.4 (read only).

Layout (``pt-format.md`` §9; torch 2.13 still reads it with ``weights_only=False``).
A POSIX tar archive whose members torch reads are:

* ``storages`` — pickle ``N``; ``N`` times: pickle ``(key, location,
  StorageClass)``, an ``int64`` little-endian element count and the storage's
  little-endian bytes; then a pickle list of views ``(view_key, root_key,
  offset, numel)`` in elements of the root's dtype.
* ``tensors`` — pickle ``M``; ``M`` times: pickle ``(key, storage_key, ignored)``,
  ``int32`` ``ndim``, 4 ignored bytes, ``ndim`` ``int64`` sizes, ``ndim`` ``int64``
  strides and an ``int64`` storage offset (elements; the dtype is the storage's).
* ``pickle`` — the object; its persistent ids are keys (``int`` or decimal
  ``str``) of the storages/tensors above, or ``(cls, source_file, source)``
  tuples naming ``nn.Module`` classes.
* ``sys_info`` — ignored, as torch ignores it.

Keys live in one namespace (torch keeps one ``deserialized_objects`` dict).
A reader MUST check every tar header (checksum, octal fields, sizes within the
file), every count against the bytes that remain in its member, every view
against its root storage and every tensor against its storage.  The tar
headers (checksums, member types, GNU and PAX extensions) are specified and
read in :mod:`ptfile.archive.tar`, the one tar reader of the loader and the
scanner.  Storage bytes are views of the source.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from .._io.local import Source
from ..allowlist.rebuild import StorageType
from ..archive.tar import TarMember, read_members
from ..errors import FormatError, LimitExceededError, PtfileError, StorageError, brief
from ..limits import Limits, applied
from ..model import dtypes
from ..model.location import MapLocation, restore_location
from ..model.tensor import Storage, Tensor
from .detection import Detected
from .legacy_pickle import LEGACY_MAGIC, unpickle_at
from .options import ReadOptions
from .policies import make, plain

__all__ = ["TarMember", "list_members", "read_tar"]

_INT32: Final = struct.Struct("<i")
_INT64: Final = struct.Struct("<q")
_PAD: Final = struct.Struct("<4x")


def list_members(source: Source, limits: Limits) -> dict[str, TarMember]:
    """The regular files of the tar archive in ``source`` (the last of equal names wins,
    as with ``tarfile``'s ``getmember``); headers are read by :mod:`ptfile.archive.tar`.

    Raises
    ------
    FormatError
        A header is damaged or a member reaches beyond the end of the input.
    LimitExceededError
        More members than ``limits.max_records``.
    """
    return {member.name: member for member in read_members(source, limits)}


# --------------------------------------------------------------------------- members

def _key(value: object, what: str) -> int | str:
    if type(value) not in (int, str):
        raise FormatError(f"{what} must be an int or str key, got {brief(value, 60)}")
    return value  # type: ignore[return-value]


class _Member:
    """A cursor over one member's bytes: pickles and fixed-size integers in turn.

    Reads go to the source as they come, so skipped storage bytes are never read.
    """

    def __init__(self, source: Source, member: TarMember, limits: Limits,
                 find_class: Callable[[str, str], Any], encoding: str) -> None:
        self.source, self.member, self.limits = source, member, limits
        self.find_class, self.encoding = find_class, encoding
        self.pos = 0

    def _take(self, n: int, what: str) -> int:
        """The absolute offset of the next ``n`` bytes, which must lie in the member."""
        if n < 0 or self.pos + n > self.member.size:
            raise StorageError(f"{what}: {n} bytes reach beyond the end of the member",
                               member=self.member.name, offset=self.pos)
        self.pos += n
        return self.member.offset + self.pos - n

    def pickle(self, persistent_load: Callable[[Any], Any] | None = None) -> Any:
        start = self.member.offset + self.pos
        obj, end = unpickle_at(self.source, start, self.member.offset + self.member.size,
                               self.limits, find_class=self.find_class,
                               persistent_load=persistent_load, encoding=self.encoding)
        self.pos = end - self.member.offset
        return obj

    def ints(self, layout: struct.Struct, what: str) -> tuple[int, ...]:
        at = self._take(layout.size, what)
        return layout.unpack(self.source.pread(at, layout.size, what))

    def count(self, what: str, smallest: int) -> int:
        """A pickled item count, at most the items of ``smallest`` bytes that still fit."""
        n = self.pickle()
        if type(n) is not int or n < 0 or n * smallest > self.member.size - self.pos:
            raise FormatError(f"{what} count {brief(n, 40)} does not fit the member",
                              member=self.member.name, offset=self.pos)
        return n

    def view(self, nbytes: int, what: str, *, read: bool) -> memoryview | None:
        at = self._take(nbytes, what)
        return self.source.view(at, nbytes, what) if read else None


class _TarObjects:
    """Storages, storage views and tensors of a tar checkpoint, by their keys."""

    def __init__(self, map_location: MapLocation, skip_data: bool) -> None:
        self.objects: dict[int | str, Storage | Tensor] = {}
        self.map_location, self.skip_data = map_location, skip_data

    def read_storages(self, member: _Member) -> None:
        for _ in range(member.count("storage", 8)):
            entry = member.pickle()
            if not isinstance(entry, tuple) or len(entry) != 3 \
                    or not isinstance(entry[2], StorageType) or not isinstance(entry[1], str):
                raise FormatError(f"storage entry must be (key, location, StorageClass), "
                                  f"got {brief(entry, 100)}", member="storages")
            key, location, storage_type = _key(entry[0], "storage key"), entry[1], entry[2]
            dtype = storage_type.dtype or dtypes.UINT8
            (count,) = member.ints(_INT64, f"element count of storage {key!r}")
            nbytes = count * dtype.itemsize
            data = member.view(nbytes, f"storage {key!r}", read=not self.skip_data)
            storage = Storage(data, dtype, location=location, key=str(key),
                              untyped=storage_type.dtype is None, nbytes=nbytes)
            self.objects[key] = restore_location(storage, location, self.map_location)
        views = member.pickle()
        if not isinstance(views, list):
            raise FormatError(f"storage views must be a list, got {brief(views, 100)}",
                              member="storages")
        for view in views:
            self._add_view(view)

    def _add_view(self, view: object) -> None:
        if not isinstance(view, tuple) or len(view) != 4:
            raise FormatError(f"storage view must be (key, root_key, offset, numel), "
                              f"got {brief(view, 100)}", member="storages")
        key, root = _key(view[0], "view key"), self.storage(view[1])
        offset, numel, item = view[2], view[3], root.dtype.itemsize
        if type(offset) is not int or type(numel) is not int or offset < 0 or numel < 0 \
                or (offset + numel) * item > root.nbytes:
            raise StorageError(f"storage view {key!r} ({offset!r}, {numel!r}) does not fit "
                               f"storage {root.key!r} of {root.nbytes // item} elements")
        data = None if root.data is None else root.data[offset * item:(offset + numel) * item]
        self.objects[key] = Storage(data, root.dtype, location=root.location, key=str(key),
                                    untyped=root.untyped, nbytes=numel * item)

    def storage(self, key: object) -> Storage:
        found = self.objects.get(_key(key, "storage key"))
        if not isinstance(found, Storage):
            raise StorageError(f"no storage with key {brief(key, 40)}")
        return found

    def read_tensors(self, member: _Member) -> None:
        for _ in range(member.count("tensor", 16)):
            entry = member.pickle()
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise FormatError(f"tensor entry must be (key, storage_key, type), "
                                  f"got {brief(entry, 100)}", member="tensors")
            key, storage = _key(entry[0], "tensor key"), self.storage(entry[1])
            (ndim,) = member.ints(_INT32, "tensor ndim")
            if ndim < 0:
                raise FormatError(f"tensor {key!r} has {ndim} dimensions", member="tensors")
            if ndim > member.limits.max_ndim:
                raise LimitExceededError("max_ndim", member.limits.max_ndim, ndim,
                                         f"rank of tensor {key!r}")
            member.ints(_PAD, "tensor ndim padding")  # torch's old writer stored ndim as 8 bytes
            layout = struct.Struct(f"<{ndim}q{ndim}qq")
            values = member.ints(layout, f"sizes/strides/offset of tensor {key!r}")
            self.objects[key] = Tensor(storage, values[-1], values[:ndim], values[ndim:-1])

    def persistent_load(self, saved_id: object) -> Any:
        if isinstance(saved_id, tuple) and saved_id:
            return saved_id[0]  # an nn.Module class, resolved (or refused) by find_class
        if isinstance(saved_id, str) and saved_id.isdecimal() and len(saved_id) < 20:
            saved_id = int(saved_id)
        if type(saved_id) is not int or saved_id not in self.objects:
            raise StorageError(f"persistent id {brief(saved_id, 40)} names no storage or tensor")
        return self.objects[saved_id]


def _member(members: dict[str, TarMember], name: str) -> TarMember:
    found = members.get(name)
    if found is None:
        raise FormatError(f"the legacy tar checkpoint has no {name!r} member "
                          f"(members: {brief(sorted(members), 200)})")
    return found


#: Bytes of a tar's start read for a legacy stream's magic pickle (one is ~40 bytes).
_STREAM_HEAD: Final = 4096


def _refuse_stream_at_start(source: Source, limits: Limits) -> None:
    """A tar whose byte 0 is also a legacy stream (its first pickle the magic number) means
    two things: torch.load reads a path as the tar, a file object as the stream."""
    try:
        magic, _ = unpickle_at(source, 0, min(source.size, _STREAM_HEAD), limits,
                               find_class=plain, persistent_load=None)
    except PtfileError:
        return
    if type(magic) is int and magic == LEGACY_MAGIC:
        raise FormatError("the tar archive is also a legacy stream (its first pickle is the "
                          "magic number): torch.load reads a path as the tar, a file object "
                          "as the stream (one file, two readings: refused)", offset=0)


def read_tar(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """Unpickle a pre-0.4 tar checkpoint; storages are views of ``source``.

    Raises
    ------
    FormatError
        The tar archive or one of its members is malformed or missing.
    StorageError
        A count, view or tensor does not fit its bytes or storage.
    UnsafeGlobalError
        ``find_class`` refused a global.
    """
    limits, find_class, encoding = options.limits, make(options.policy), options.encoding
    _refuse_stream_at_start(source, limits)
    members = list_members(source, limits)
    objects = _TarObjects(options.map_location, options.skip_data)
    with applied(limits):  # the tensors member's tensors are built outside any pickle
        for name, read in (("storages", objects.read_storages),
                           ("tensors", objects.read_tensors)):
            read(_Member(source, _member(members, name), limits, find_class, encoding))
    data = _Member(source, _member(members, "pickle"), limits, find_class, encoding)
    return data.pickle(objects.persistent_load)
