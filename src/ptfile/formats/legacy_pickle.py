"""The legacy pickle stream of ``torch.save(..., _use_new_zipfile_serialization=False)``.

Every checkpoint written before torch 1.6 (and after, with the keyword) is a
concatenation of five pickles followed by raw storages (``pt-format.md`` §8):

1. the magic number ``0x1950A86A20F9469CFC6C`` (an int);
2. the protocol version ``1001``;
3. ``sys_info``: ``{'protocol_version': 1001, 'little_endian': bool,
   'type_sizes': {'short': 2, 'int': 4, 'long': 4}}``;
4. the object.  Storages are persistent ids
   ``('storage', StorageType, root_key, location, numel, view_metadata)`` where
   ``numel`` counts elements of the *root* storage and ``view_metadata`` is
   ``None`` or ``(view_key, offset, size)`` in elements (old torch pickled
   storage views that way; modern torch always writes ``None``).  Keys are
   arbitrary strings (torch uses memory addresses).  ``('module', cls, file,
   source)`` ids name ``nn.Module`` classes;
5. the list of root storage keys, **sorted as strings**;

then, for each key of that list in order, an ``int64`` little-endian element
count followed by the storage's bytes.

A reader MUST check the magic number and protocol version, MUST check each
count against the element count the object pickle declared for that key (torch:
``storage has wrong byte size``), MUST refuse keys the object never referenced
and view metadata reaching outside its root storage.  The data is little-endian
whatever ``sys_info`` says: torch's writer converts to little-endian on
big-endian hosts and records the *host* in ``little_endian``, and its reader
ignores ``sys_info`` (§5).  ptfile therefore checks ``sys_info``'s shape and the
type sizes that change element sizes (``short`` 2, ``int`` 4) and reads the
data as little-endian.  ``long`` is recorded as 4 by every torch (it never
described ``LongStorage``, whose elements are 8 bytes) and is not checked.

A writer MUST emit the five pickles with the same protocol and the storages in
sorted key order.  ptfile uses the keys ``"0"``, ``"1"``… in first-encounter
order (torch's are addresses), so its output is deterministic.  "v3" dtypes
(uint16/32/64, float8…) are written as torch writes them, through
``UntypedStorage`` with a byte count; torch 2.13 itself cannot read those back,
ptfile can.

Storages are views of the source (zero-copy for in-memory and mmapped input):
the layout puts each storage's bytes in one contiguous run.
"""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .._io.local import Source
from ..allowlist.rebuild import StorageType
from ..allowlist.reduction import Reducer, ordered_bytes
from ..archive.tar import tarfile_accepts
from ..errors import FormatError, PickleStreamError, StorageError, UnsupportedFeatureError, brief
from ..limits import Limits
from ..model import dtypes
from ..model.location import MapLocation, restore_location
from ..model.tensor import Storage
from ..picklevm import check_stream, unpickle
from ..picklevm.pickler import Pickler
from .detection import Detected
from .options import ReadOptions
from .policies import make, plain

__all__ = ["LEGACY_MAGIC", "LEGACY_PROTOCOL_VERSION", "LegacyInfo", "read_legacy",
           "write_legacy"]

LEGACY_MAGIC: Final = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION: Final = 1001
#: Element sizes a ``sys_info`` may not contradict (they size Short/IntStorage).
EXPECTED_TYPE_SIZES: Final = {"short": 2, "int": 4}
#: torch writes ``long`` as 4 on every platform (see the module docstring).
WRITTEN_TYPE_SIZES: Final = {"short": 2, "int": 4, "long": 4}
_COUNT: Final = struct.Struct("<q")
#: First window read to find where a pickle ends in a file read on demand.
FIRST_WINDOW_BYTES: Final = 1 << 12


@dataclass(frozen=True, slots=True)
class LegacyInfo:
    """What the header pickles of a legacy stream say."""

    protocol_version: int
    little_endian: bool
    type_sizes: dict[str, int]
    object_offset: int


def _text(value: object, what: str) -> str:
    """A key/tag as str: Python 2 pickles loaded with ``encoding='bytes'`` give bytes."""
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise FormatError(f"{what} {brief(value, 60)} is not ASCII") from None
    if not isinstance(value, str):
        raise FormatError(f"{what} must be a string, got {type(value).__name__} {brief(value, 60)}")
    return value


def pickle_end(source: Source, start: int, stop: int, limits: Limits) -> int:
    """Where the pickle at ``start`` ends (``stop`` bounds it), reading as little as possible.

    Sources that read on demand (``source.reads_on_demand``) are read in growing
    windows, so storage bytes after the pickles are never read; in-memory and
    mapped sources are checked in one go.

    Raises
    ------
    PickleStreamError, LimitExceededError
        The stream is malformed or hits a ceiling (offsets are in the input).
    """
    window = FIRST_WINDOW_BYTES if source.reads_on_demand else stop - start
    while start + window < stop:
        try:  # a window that cuts the pickle fails the check; one that holds it passes
            return start + check_stream(source.view(start, window, "pickle"), limits).end
        except PickleStreamError:
            window *= 4
    base = _base(source, start)
    return base + check_stream(source.view(base, stop - base, "pickle"), limits,
                               start=start - base).end


def _base(source: Source, start: int) -> int:
    """Where to view ``source`` from: 0 keeps error offsets absolute where views are free."""
    return start if source.reads_on_demand else 0


def unpickle_at(source: Source, start: int, stop: int, limits: Limits,
                **kwargs: Any) -> tuple[Any, int]:
    """:func:`~ptfile.picklevm.unpickle` of the pickle at ``start`` of ``source``.

    Raises
    ------
    PickleStreamError, LimitExceededError, UnsafeGlobalError
        As :func:`~ptfile.picklevm.unpickle`.
    """
    end = pickle_end(source, start, stop, limits)
    base = _base(source, start)
    obj, stream_end = unpickle(source.view(base, end - base, "pickle"), start=start - base,
                               limits=limits, **kwargs)
    return obj, base + stream_end


def _check_sys_info(sys_info: object, offset: int) -> LegacyInfo:
    if not isinstance(sys_info, dict) or not isinstance(sys_info.get("type_sizes"), dict):
        raise FormatError(f"sys_info must be a dict with type_sizes, got {brief(sys_info, 100)}",
                          offset=offset)
    sizes = sys_info["type_sizes"]
    for name, size in EXPECTED_TYPE_SIZES.items():
        if sizes.get(name, size) != size:
            raise UnsupportedFeatureError(f"sys_info says a C {name} has {sizes[name]!r} bytes; "
                                          f"ptfile reads {size}-byte {name}s only")
    little = sys_info.get("little_endian", True)
    version = sys_info.get("protocol_version", LEGACY_PROTOCOL_VERSION)
    if type(little) is not bool or type(version) is not int:
        raise FormatError(f"malformed sys_info {brief(sys_info, 100)}", offset=offset)
    return LegacyInfo(version, little, dict(sizes), 0)


def read_header(source: Source, limits: Limits) -> LegacyInfo:
    """Check the magic number, protocol version and ``sys_info``; locate the object pickle.

    Raises
    ------
    FormatError
        The magic number or protocol version is wrong, or ``sys_info`` is malformed.
    """
    def plain(start: int) -> tuple[Any, int]:
        return unpickle_at(source, start, source.size, limits, find_class=plain,
                           persistent_load=None)

    magic, pos = plain(0)
    if magic != LEGACY_MAGIC:
        raise FormatError(f"invalid magic number {brief(magic, 40)}; expected {LEGACY_MAGIC:#x} "
                          "(torch: Invalid magic number; corrupt file?)", offset=0)
    version, next_pos = plain(pos)
    if version != LEGACY_PROTOCOL_VERSION:
        raise FormatError(f"invalid protocol version {brief(version, 40)}; expected "
                          f"{LEGACY_PROTOCOL_VERSION}", offset=pos)
    sys_info, end = plain(next_pos)
    info = _check_sys_info(sys_info, next_pos)
    return LegacyInfo(info.protocol_version, info.little_endian, info.type_sizes, end)


@dataclass(slots=True)
class _View:
    storage: Storage
    root: Storage
    offset_bytes: int


class LegacyStorages:
    """``persistent_load`` for the legacy stream: storages now, their bytes once located."""

    def __init__(self, map_location: MapLocation) -> None:
        self._map_location = map_location
        self.roots: dict[str, Storage] = {}
        self.views: dict[str, _View] = {}

    def __call__(self, pid: object) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise FormatError(f"persistent id must be a tuple, got {brief(pid, 100)}")
        kind = _text(pid[0], "persistent id kind")
        if kind == "module" and len(pid) == 4:
            return pid[1]  # the class, already resolved (or refused) by find_class
        if kind != "storage" or len(pid) != 6:
            raise FormatError(f"persistent id must be ('storage', type, key, location, numel, "
                              f"view_metadata), got {brief(pid, 100)}")
        _, storage_type, key, location, numel, view_metadata = pid
        if not isinstance(storage_type, StorageType) or type(numel) is not int or numel < 0:
            raise FormatError(f"malformed storage persistent id {brief(pid, 100)}")
        root = self._root(storage_type, _text(key, "storage key"),
                          _text(location, "location"), numel)
        return root if view_metadata is None else self._view(root, view_metadata)

    def _root(self, storage_type: StorageType, key: str, location: str, numel: int) -> Storage:
        dtype = storage_type.dtype or dtypes.UINT8
        nbytes = numel * dtype.itemsize
        found = self.roots.get(key)
        if found is not None:
            if found.dtype != dtype or found.nbytes != nbytes:
                raise StorageError(f"storage {key!r} is declared as {numel} x {dtype!r} here "
                                   f"but as {found.nbytes} bytes of {found.dtype!r} before")
            return found
        storage = Storage(None, dtype, location=location, key=key,
                          untyped=storage_type.dtype is None, nbytes=nbytes)
        storage = restore_location(storage, location, self._map_location)
        self.roots[key] = storage
        return storage

    def _view(self, root: Storage, view_metadata: object) -> Storage:
        if not isinstance(view_metadata, tuple) or len(view_metadata) != 3:
            raise FormatError(f"view_metadata must be (view_key, offset, size), "
                              f"got {brief(view_metadata, 100)}")
        view_key, offset, size = view_metadata
        key = _text(view_key, "view key")
        item = root.dtype.itemsize
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0 \
                or (offset + size) * item > root.nbytes:
            raise StorageError(f"storage view {key!r} at offset {offset!r} of {size!r} elements "
                               f"does not fit its root {root.key!r} of {root.nbytes // item}")
        found = self.views.get(key)
        if found is not None:
            if found.root is not root or found.offset_bytes != offset * item \
                    or found.storage.nbytes != size * item:
                raise StorageError(f"storage view {key!r} is declared twice, differently")
            return found.storage
        view = Storage(None, root.dtype, location=root.location, key=key,
                       untyped=root.untyped, nbytes=size * item)
        self.views[key] = _View(view, root, offset * item)
        return view

    def fill(self, source: Source, keys: object, start: int, skip_data: bool) -> None:
        """Attach each storage's bytes, read in the order of the key list from ``start``.

        Raises
        ------
        FormatError
            ``keys`` is not a list of strings.
        StorageError
            The list does not name exactly the storages the object uses, or a
            count disagrees with the pickle, or the bytes run past the input.
        """
        if not isinstance(keys, list):
            raise FormatError(f"the storage key list must be a list, got {brief(keys, 100)}",
                              offset=start)
        names = [_text(k, "storage key") for k in keys]
        if len(set(names)) != len(names) or set(names) != set(self.roots):
            raise StorageError(f"the key list {brief(sorted(names), 200)} does not name exactly "
                               f"the storages the object uses {brief(sorted(self.roots), 200)}")
        pos = start
        for key in names:
            pos = self._fill_one(source, self.roots[key], pos, skip_data)
        for view in self.views.values():
            if view.root.data is not None:
                end = view.offset_bytes + view.storage.nbytes
                view.storage.data = view.root.data[view.offset_bytes:end]

    @staticmethod
    def _fill_one(source: Source, storage: Storage, pos: int, skip_data: bool) -> int:
        (count,) = _COUNT.unpack(source.pread(pos, 8, f"element count of storage {storage.key!r}"))
        if count * storage.dtype.itemsize != storage.nbytes:
            raise StorageError(f"storage {storage.key!r} has {count} elements on disk; the "
                               f"pickle says {storage.nbytes // storage.dtype.itemsize} "
                               "(torch: storage has wrong byte size)", offset=pos)
        end = pos + 8 + storage.nbytes
        if end > source.size:
            raise StorageError(f"storage {storage.key!r} of {storage.nbytes} bytes reaches "
                               f"beyond the end of the input ({source.size:#x})", offset=pos)
        if not skip_data:
            storage.data = source.view(pos + 8, storage.nbytes, f"storage {storage.key!r}")
        return end


def read_legacy(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """Unpickle a legacy-stream checkpoint; storages are views of ``source``.

    Raises
    ------
    FormatError
        Bad magic number, protocol version or ``sys_info``; a malformed pickle.
    StorageError
        A storage's count or bytes disagree with the object pickle, or a view
        reaches outside its root storage.
    UnsafeGlobalError
        ``find_class`` refused a global.
    """
    limits, encoding = options.limits, options.encoding
    if tarfile_accepts(detected.head):
        raise FormatError("the file is a legacy stream and also starts with a header Python's "
                          "tarfile accepts: torch.load reads a path as a tar archive, a file "
                          "object as the stream (one file, two readings: refused)", offset=0)
    info = read_header(source, limits)
    storages = LegacyStorages(options.map_location)
    obj, pos = unpickle_at(source, info.object_offset, source.size, limits,
                           find_class=make(options.policy), persistent_load=storages,
                           encoding=encoding)
    keys, pos = unpickle_at(source, pos, source.size, limits, find_class=plain,
                            persistent_load=None, encoding=encoding)
    storages.fill(source, keys, pos, options.skip_data)
    return obj


# --------------------------------------------------------------------------- writing

class _LegacyReducer(Reducer):
    """The ZIP writer's reducer, with torch's 6-tuple legacy persistent ids."""

    def storage_pid(self, obj: Storage) -> tuple[object, ...]:
        """torch's legacy persistent id: the ZIP one plus ``view_metadata`` (always None)."""
        return (*super().storage_pid(obj), None)


def write_legacy(obj: object, write: Callable[[Any], Any], *, pickle_protocol: int = 2) -> None:
    """Write ``obj`` in the legacy stream format through ``write``.

    Raises
    ------
    SaveError
        ``obj`` holds something that cannot be written.
    """
    reducer = _LegacyReducer()
    body = Pickler(pickle_protocol, reducer=reducer.reduce,
                   persistent_id=reducer.persistent_id).dump(obj)
    sys_info = {"protocol_version": LEGACY_PROTOCOL_VERSION, "little_endian": sys.byteorder == "little",
                "type_sizes": dict(WRITTEN_TYPE_SIZES)}  # torch records the host
    for header in (LEGACY_MAGIC, LEGACY_PROTOCOL_VERSION, sys_info):
        write(pickle.dumps(header, protocol=pickle_protocol))
    write(body)
    keys = sorted(str(i) for i in range(len(reducer.storages)))
    write(pickle.dumps(keys, protocol=pickle_protocol))
    for key in keys:
        storage = reducer.storages[int(key)]
        untyped = storage.untyped or storage.dtype.is_v3  # saved as UntypedStorage: bytes
        write(_COUNT.pack(storage.nbytes if untyped else storage.numel()))
        write(ordered_bytes(storage, reducer.swap_dtype(storage), "little"))
