"""Storages and tensors of a ZIP checkpoint's pickle: the reference path and the fast path.

A ``data.pkl`` names each storage by a persistent id ``('storage', <storage
class>, key, location, numel)`` and builds each tensor by calling
``_rebuild_tensor_v2``/``_v3`` on it (``pt-format.md`` §4).  Two
implementations give the same objects and the same errors:

:class:`StorageLoader` (the reference)
    One :class:`~ptfile.Storage` per key, looked up and checked against its
    ``data/<key>`` record as its id comes, then handed to ``map_location``
    and the :func:`ptfile.register_package` handlers.
:class:`FastStorages` with :func:`fast_tensor_builders` (no ``map_location``, no packages)
    A state dict of 10^5 tiny tensors spends most of its load in these two
    callbacks, so this path does the per-record work in bulk before the
    pickle runs: each record's size and data offset come from the central
    directory's columns and one vectorised local-header check, as lists
    indexed by directory row.  A persistent id then costs one lookup of
    ``<prefix>/data/<key>`` in the directory's own name index (no table keyed
    by storage key is built: that took 30 ms for 10^5 records, the look-ups
    ~15 ms more than these) and a view, and a tensor one check of its
    geometry (cached per distinct size and stride: a state dict repeats a
    handful) on C-level builtins.  Anything unusual (a damaged local header,
    a size that does not match, an odd argument) is handed to the reference
    path, which reports it; so both raise the same errors.

With a mapped source both paths skip the local headers: every storage is made
with :class:`MappedLocator`, which reads and checks its header (and slices the
map) on first use of its bytes.  Compressed records, which torch never writes,
are inflated (:func:`record_bytes`) on both paths.

The fast constructors are closures made per load: nothing a stream does to
them (``BUILD`` on a global) outlives the load (see
:mod:`ptfile.picklevm.unpickler`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from .._io.local import Source
from ..allowlist.rebuild import StorageType, rebuild_tensor_v2, rebuild_tensor_v3
from ..archive import Record, ZipReader, computed_data_offset, computed_data_offsets
from ..archive._bulk import sparse
from ..archive.reader import BULK_MIN_RECORDS
from ..archive.records import METHOD_STORED
from ..errors import ArchiveError, FormatError, StorageError, UnsupportedFeatureError, brief
from ..limits import active as active_limits
from ..model import dtypes
from ..model.dtypes import UINT8, DType
from ..model.location import MapLocation, has_packages, restore_location
from ..model.tensor import NUMPY_MAX_DIMS, Storage, Tensor, view_extent
from .zipinfo import ZipInfo

__all__ = ["FastStorages", "MappedLocator", "StorageLoader", "fast_tensor_builders",
           "record_bytes"]


class StorageLoader:
    """``persistent_load`` for the pickles of every torch ZIP kind: one Storage per key,
    checked against its ``<folder>/<key>`` record (``data/`` for ``data.pkl``;
    TorchScript's ``constants.pkl`` keeps its storages under ``constants/``)."""

    def __init__(self, reader: ZipReader, source: Source, info: ZipInfo, *,
                 map_location: MapLocation, skip_data: bool = False,
                 calculate_offsets: bool = False, folder: str = "data",
                 pickled_locations: bool = True) -> None:
        self._reader, self._source, self._info = reader, source, info
        # Keep the pickle's location str objects on the storages (location.pid_location):
        # the memo pattern of torch.save's pickler, not of TorchScript's (memoised by value).
        self._pickled_locations = pickled_locations
        self._map_location = map_location
        self._skip_data = skip_data
        # torch's calculate_storage_offsets: only for archives that promise torch's layout.
        self._calculate = calculate_offsets and (info.format_version or 0) >= 1
        self.storages: dict[str, Storage] = {}
        self._data_prefix = f"{info.prefix}/{folder}/"
        self._pickle = f"{folder}.pkl"
        self._locator = MappedLocator(reader, source, self._data_prefix) \
            if source.map_access is not None and not skip_data and not self._calculate else None

    def __call__(self, pid: object) -> Storage:
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            raise FormatError(f"persistent id must be ('storage', type, key, location, numel), "
                              f"got {brief(pid, 100)}", member=self._pickle)
        _, storage_type, key, location, numel = pid
        if type(key) is not str or type(storage_type) is not StorageType \
                or type(location) is not str or type(numel) is not int or numel < 0:
            raise FormatError(f"malformed storage persistent id {brief(pid, 100)}",
                              member=self._pickle)
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = self._load(storage_type, key, location, numel)
        elif location is not storage.location:  # a fresh tag: the file did not memoise it
            storage._pickled_location = None
        return storage

    def _load(self, storage_type: StorageType, key: str, location: str, numel: int) -> Storage:
        dtype = storage_type.dtype or dtypes.UINT8
        name = self._data_prefix + key
        record = self._reader.get(name)
        if record is None:
            raise StorageError(f"storage {key!r} has no record {name!r}", member=name)
        nbytes = numel * dtype.itemsize
        if record.size != nbytes:
            raise StorageError(f"record holds {record.size} bytes; the pickle says {numel} "
                               f"elements of {dtype!r} = {nbytes} bytes", member=name)
        untyped, order = storage_type.dtype is None, self._info.byteorder
        if self._skip_data:
            storage = Storage._from_record(None, dtype, location, key, untyped, order, nbytes)
        elif self._locator is not None:
            storage = Storage._located_later(self._locator, dtype, location, key, untyped, order,
                                             nbytes)
        else:
            data = record_bytes(self._reader, self._source, record, self.data_offset,
                                self._source.map_access)
            storage = Storage._from_record(data, dtype, location, key, untyped, order, nbytes)
        if self._pickled_locations:
            storage._pickled_location = location
        if self._map_location is None and not has_packages():
            return storage  # the recorded tag stands; nothing to remap
        return restore_location(storage, location, self._map_location)

    @property
    def alignment(self) -> int:
        """The archive's storage alignment."""
        return self._info.storage_alignment

    def data_offset(self, record: Record) -> int:
        """Where the record's bytes start: computed from the central directory alone when
        ``calculate_storage_offsets`` is on (no local-header read; torch's layout assumed),
        else read from the validated local header."""
        if self._calculate:
            return computed_data_offset(record.header_offset, record.name, record.size,
                                        self._info.storage_alignment)
        return self._reader.data_offset(record)


#: A record the fast path has no usable offset for: the reference path decides.
_UNKNOWN: Final = -1


def record_bytes(reader: ZipReader, source: Source, record: Record,
                 data_offset: Callable[[Record], int], access: str | None) -> memoryview:
    """A storage record's bytes: a view of ``source`` at ``data_offset(record)`` when
    stored; when compressed, inflated into fresh memory (at most its declared size,
    which the pickle's element count has been checked against), read-only for a
    read-only map (``access`` ``"r"``) and writable otherwise.

    torch only writes stored records; a checkpoint re-packed by a ZIP tool may have
    deflated ones.  torch inflates those when it reads the file into memory, and with
    ``mmap=True`` silently hands out the compressed bytes; ptfile inflates them in both
    cases, except for a shared map, whose writes are meant to reach the file.
    """
    if record.method == METHOD_STORED:
        return source.view(data_offset(record), record.size, "storage record")
    if access == "shared":
        raise UnsupportedFeatureError(
            f"record {record.name!r} is compressed (method {record.method}): it cannot be "
            "mapped shared (mmap='r+'); load it with another mmap mode")
    data = reader.read(record)
    return memoryview(data if access == "r" else bytearray(data))


class MappedLocator:
    """Finds a storage's bytes in a mapped archive when they are first used.

    ``load(mmap=True)`` reads no local header: each storage is made with
    :meth:`ptfile.Storage._located_later` and this locator, which reads and
    checks the record's local header (:meth:`ZipReader.data_offset`; after
    64 records, all of them at once) and slices the map.  A 2 GiB checkpoint of
    300 tensors has its headers on 300 pages far apart: reading them cost
    0.5 ms of a 4 ms load on a quiet machine, and ~10 ms where pages not
    touched for a while are slow to touch again.  The locator reads through
    :meth:`ptfile._io.local.Source.detached`, so it works after the load closed
    its source, and holds the map open meanwhile (not the source's descriptor
    for positioned reads).
    """

    def __init__(self, reader: ZipReader, source: Source, prefix: str) -> None:
        self._source = source.detached()
        self._reader = reader.rebound(self._source)
        self._access = source.map_access
        self._prefix = prefix
        self._lock = threading.Lock()  # the reader caches offsets: one thread at a time
        # Once the reader has checked every local header in bulk: each stored record's
        # checked data offset by directory row (-1: the reference path decides), and sizes.
        self._checked: list[int] | None = None
        self._rows = reader.entries.index
        self._sizes = reader.entries.column_list("size")

    def __call__(self, storage: Storage) -> memoryview:
        checked = self._checked
        if checked is not None:  # the bulk-checked offset: the same bytes, without a Record
            row = self._rows.get(self._prefix + storage.key)  # type: ignore[operator]
            if row is not None and checked[row] >= 0 and self._sizes[row] == storage.nbytes:
                return self._source.view(checked[row], storage.nbytes, "storage record")
        name = f"{self._prefix}{storage.key}"
        with self._lock:
            record = self._reader.get(name)
            if record is None or record.size != storage.nbytes:  # loaders made it from this
                raise StorageError(f"storage {storage.key!r} is not the record {name!r}",
                                   member=name)
            data = record_bytes(self._reader, self._source, record, self._reader.data_offset,
                                self._access)
            if checked is None:
                self._checked = self._checked_offsets()
            return data

    def _checked_offsets(self) -> list[int] | None:
        """The reader's bulk-checked offsets of its stored records (-1 for the others)."""
        found = self._reader.checked_data_offsets()
        if found is None:
            return None
        entries = self._reader.entries
        stored = entries.column("method") == METHOD_STORED
        offsets: list[int] = np.where(stored & (found >= 0), found, _UNKNOWN).tolist()
        return offsets


class FastStorages:
    """``persistent_load`` for loads without ``map_location`` or packages: the records'
    sizes and offsets are read in bulk first; anything unusual goes to
    :class:`StorageLoader`.

    ``skip_data=True`` makes data-less storages (metadata loads).
    """

    def __init__(self, reader: ZipReader, source: Source, info: ZipInfo, *,
                 skip_data: bool = False, calculate_offsets: bool = False) -> None:
        self._slow = StorageLoader(reader, source, info, map_location=None, skip_data=skip_data,
                                   calculate_offsets=calculate_offsets)
        # The whole input as one view (in memory or mapped), to slice storages from.
        self._whole = None if skip_data or source.reads_on_demand else source.read_all()
        self._view = None if skip_data else source.view
        self._byteorder = info.byteorder
        self._prefix = f"{info.prefix}/data/"
        self._rows = reader.entries.index  # full name -> directory row
        self._sizes = reader.entries.column_list("size")
        # Mapped: each header is read on first use, unless they lie close together.
        self._locator = None if self._slow._locator is None or _dense(reader, source.size) \
            else self._slow._locator
        self._offsets = None if skip_data or self._locator is not None else \
            _data_offsets(reader, self._prefix, self._slow, source.size)
        self._made: list[Storage | None] = [None] * len(self._sizes)  # by directory row

    def by_row(self) -> list[Storage | None]:
        """The storage loaded from each central directory row so far (None for the others)."""
        return self._made

    @property
    def storages(self) -> dict[str, Storage]:
        """The storages loaded so far by key, in directory order."""
        return {s.key: s for s in self._made if s is not None}  # type: ignore[misc]

    def __call__(self, pid: object) -> Storage:
        if type(pid) is not tuple or len(pid) != 5:
            return self._slow(pid)
        tag, storage_type, key, location, numel = pid
        if (tag != "storage" or type(storage_type) is not StorageType or type(key) is not str
                or type(location) is not str or type(numel) is not int or numel < 0):
            return self._slow(pid)  # a malformed id, even for a key already loaded: it raises
        row = self._rows.get(self._prefix + key)
        if row is None:
            return self._slow(pid)  # no such record: it raises
        storage = self._made[row]
        if storage is not None:
            if location is not storage.location:  # a fresh tag: the file did not memoise it
                storage._pickled_location = None
            return storage
        size = self._sizes[row]
        dtype = storage_type.dtype or UINT8
        offsets = self._offsets
        offset = _UNKNOWN if offsets is None else offsets[row]
        if size != numel * dtype.itemsize or (offset == _UNKNOWN and offsets is not None):
            storage = self._made[row] = self._slow(pid)
            return storage
        storage = object.__new__(Storage)  # Storage(...) without the keyword parsing
        whole = self._whole
        if self._locator is not None:
            storage._locate = self._locator  # Storage._located_later, inline
        else:
            storage.data = whole[offset:offset + size] if whole is not None else \
                None if self._view is None else self._view(offset, size, "storage record")
        storage.dtype, storage.untyped = dtype, storage_type.dtype is None
        storage.location = storage._pickled_location = location
        storage.key, storage.byteorder = key, self._byteorder
        storage._nbytes = size
        self._made[row] = storage
        return storage


def _dense(reader: ZipReader, size: int) -> bool:
    """Are the local headers of a mapped archive so many, and so close together, that
    checking them all at load (in one vectorised pass over the map) costs less than
    locating each storage on its first use?  (100,000 tiny tensors: 0.05 s against
    0.25 s.)  A few hundred large tensors are located lazily: their headers lie on
    pages far apart, which the load then never touches."""
    return len(reader) >= BULK_MIN_RECORDS and not sparse(
        reader.entries.column_held("header_offset"), size)


def _data_offsets(reader: ZipReader, prefix: str, slow: StorageLoader,
                  source_size: int) -> list[int]:
    """The data offset of every ``data/<key>`` record, by directory row, in one pass.

    :data:`_UNKNOWN` for the other records, for records whose bytes do not lie
    inside the source, and for every record when one local header fails the
    bulk check (the reference path then reads each referenced header and
    reports the damaged one, if referenced).
    """
    entries = reader.entries
    rows = reader.indices_with_prefix(prefix)
    offsets = np.full(len(reader), _UNKNOWN, np.int64)
    if rows.size:
        sizes = entries.column("size")[rows]
        try:
            if slow._calculate:  # torch's layout assumed: no local header is read
                found = computed_data_offsets(
                    entries.column("header_offset")[rows], entries.name_length[rows], sizes,
                    slow.alignment)
            else:
                found = reader.data_offsets_at(rows)
        except ArchiveError:
            found = np.full(len(rows), _UNKNOWN, np.int64)
        stored = entries.column("method")[rows] == METHOD_STORED  # the others are inflated
        offsets[rows] = np.where((found >= 0) & (found + sizes <= source_size) & stored, found,
                                 _UNKNOWN)
    found_all: list[int] = offsets.tolist()
    return found_all


# --------------------------------------------------------------------------- tensors

_INTS: Final = frozenset({int})


def _geometry_extent(size: tuple[int, ...], stride: tuple[int, ...]) -> int | None:
    """Elements a (size, stride) pair of ints spans, or None when it is not valid."""
    ndim = len(size)
    if ndim != len(stride) or ndim > NUMPY_MAX_DIMS or ndim > active_limits().max_ndim or (
            ndim and (min(size) < 0 or min(stride) < 0)):
        return None
    return view_extent(size, stride)


_Shape = tuple[Any, ...]


class _Geometry(dict[tuple[_Shape, _Shape], tuple["int | None", _Shape, _Shape]]):
    """Cache of :func:`_geometry_extent`, keyed by tuples already checked to hold ints
    (so equal keys are equal geometries: no ``1.0`` or ``True`` in them).  It also
    holds the first size and stride tuples met, which later tensors share: 2 fewer
    objects per tensor for the garbage collector to scan after a big load."""

    def __missing__(self, key: tuple[_Shape, _Shape]) -> tuple[int | None, _Shape, _Shape]:
        found = (_geometry_extent(*key), *key)
        self[key] = found
        return found


def _fast_tensor(geometry: _Geometry, storage: object, offset: object, size: object,
                 stride: object, requires_grad: object, hooks: object, dtype: object,
                 metadata: object) -> Tensor | None:
    """A Tensor, validated with C-level builtins; None sends odd input the long way."""
    if (type(storage) is not Storage or type(offset) is not int or type(size) is not tuple
            or type(stride) is not tuple or type(hooks) is not OrderedDict
            or (metadata is not None and type(metadata) is not dict)):
        return None
    both = size + stride
    if both and not _INTS.issuperset(map(type, both)):
        return None
    extent, size, stride = geometry[size, stride]
    dtype = dtype if isinstance(dtype, DType) else storage.dtype
    if extent is None or offset < 0 or (extent and
                                        offset + extent > storage._nbytes // dtype.itemsize):
        return None
    t = object.__new__(Tensor)
    t.storage, t.dtype = storage, dtype
    t._offset, t._shape, t._stride = offset, size, stride
    t.requires_grad, t.backward_hooks, t.metadata = bool(requires_grad), hooks, metadata
    t.python_state, t.type_name = None, None
    return t


def fast_tensor_builders() -> dict[tuple[str, str], Callable[..., Tensor]]:
    """Per-load fast ``_rebuild_tensor_v2``/``_v3`` (the :func:`ptfile.formats.policies.fast`
    policy puts them over the allowlist); odd arguments go to the reference functions."""
    geometry = _Geometry()

    # The parameters are named as the reference functions' are: a stream that calls one
    # with the wrong arguments gets the same TypeError on both paths.
    def v2(storage: object, storage_offset: object, size: object, stride: object,
           requires_grad: object, backward_hooks: object, metadata: object = None) -> Tensor:
        t = _fast_tensor(geometry, storage, storage_offset, size, stride, requires_grad,
                         backward_hooks, None, metadata)
        return t if t is not None else rebuild_tensor_v2(
            storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata)

    def v3(storage: object, storage_offset: object, size: object, stride: object,
           requires_grad: object, backward_hooks: object, dtype: object,
           metadata: object = None) -> Tensor:
        t = None if not isinstance(dtype, DType) else _fast_tensor(
            geometry, storage, storage_offset, size, stride, requires_grad, backward_hooks,
            dtype, metadata)
        return t if t is not None else rebuild_tensor_v3(
            storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
            metadata)

    # Named as the allowlist's own, so errors and reprs read the same on both paths; each
    # names its reference as __wrapped__, as functools.wraps does (_rebuild_from_type_v2
    # accepts either).
    for fast_fn, reference in ((v2, rebuild_tensor_v2), (v3, rebuild_tensor_v3)):
        fast_fn.__name__ = fast_fn.__qualname__ = reference.__name__
        fast_fn.__wrapped__ = reference  # type: ignore[union-attr]
    return {("torch._utils", "_rebuild_tensor_v2"): v2, ("torch._utils", "_rebuild_tensor_v3"): v3}
