"""The ZIP checkpoint format of ``torch.save`` (torch >= 1.6): read and write.

Layout (see ``pt-format.md`` §2 to §6; verified against torch 2.13):

* All records live under one folder, the *prefix*: the target file's stem, or
  ``archive`` for file objects and non-ASCII paths.  Readers MUST take the
  prefix from the first central-directory entry and MUST ignore extra records.
* ``data.pkl`` — a protocol-2 pickle of the object; every storage is a
  persistent id ``('storage', <storage class>, key, location, numel)`` where
  ``numel`` counts elements of a typed storage and bytes of ``UntypedStorage``.
* ``data/<key>`` — the raw bytes of each storage, exactly ``numel * itemsize``.
* ``version`` (or ``.data/version``) — decimal format version, 1..10 readable.
* ``byteorder`` — ``little`` or ``big``; when missing, the configured default
  (:func:`ptfile.set_default_load_endianness`; little unless set).
* ``.format_version``, ``.storage_alignment``, ``.data/serialization_id``.

A writer MUST emit, in order: ``data.pkl``, ``.format_version`` (``1``),
``.storage_alignment``, ``byteorder`` (unless disabled), ``data/0``…``data/N``
in key order, ``version`` (``3\\n``), ``byteorder`` if it was disabled above
(torch 2.13 moves the record rather than dropping it), then
``.data/serialization_id``; with every payload aligned by the "FB" padding
extra field.  Storage keys are assigned in first-encounter order while
pickling, so the output is byte-identical to ``torch.save`` of the same object.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import dtypes
from .._gc import paused_gc
from .._io import Source
from ..archive import ZipReader, ZipWriter
from ..config import Settings
from ..dtypes import DType
from ..errors import (
    FormatError,
    SaveError,
    UnsupportedFeatureError,
)
from ..limits import Limits
from ..location import MapLocation, has_packages
from ..picklevm import unpickle
from ..picklevm.pickler import Global, PersistentId, Pickler, Reduce, ViewReduce, global_
from ..policy import find_strict_class
from ..rebuild import Layout, QScheme, StorageType, TensorType
from ..tensor import Device, Parameter, QuantizedTensor, Size, SparseTensor, Storage, Tensor
from .storages import FastStorages, StorageLoader, find_class_fast

__all__ = ["ZipInfo", "read_zip", "write_zip"]

MAX_READ_VERSION: Final = 10
BLOCKED_MODULES: Final = frozenset({"sys", "os", "posix", "nt"})
PT2_MESSAGE: Final = (
    "this is a torch.export .pt2 archive (torch.export.save: an exported program with a "
    "graph, not a torch.save checkpoint); ptfile does not read .pt2 archives, load it with "
    "torch.export.load")


@dataclass(frozen=True, slots=True)
class ZipInfo:
    """What the archive's metadata records say."""

    prefix: str
    version: int
    byteorder: str
    byteorder_recorded: bool
    format_version: int | None
    storage_alignment: int
    serialization_id: str | None
    is_torchscript: bool


def _text(reader: ZipReader, name: str) -> str | None:
    record = reader.get(name)
    if record is None:
        return None
    if record.size > 64:
        raise FormatError(f"metadata record is {record.size} bytes, expected a short text",
                          member=name)
    try:
        return reader.read(record).decode("ascii")
    except UnicodeDecodeError:
        raise FormatError("metadata record is not ASCII text", member=name) from None


def _decimal(text: str | None, name: str, default: int | None) -> int | None:
    if text is None:
        return default
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 18:
        raise FormatError(f"expected a decimal number, got {text!r:.40}", member=name)
    return int(stripped)


def read_info(reader: ZipReader, settings: Settings) -> ZipInfo:
    """Read and validate the metadata records of a torch ZIP checkpoint."""
    prefix = reader.prefix
    folder = prefix + "/"
    outside = reader.first_name_outside(folder)
    if outside is not None:
        raise FormatError(f"record {outside!r} is not under the archive folder "
                          f"{prefix!r}/ (torch: file in archive is not in a subdirectory)")
    version_name = f"{prefix}/.data/version" if reader.get(f"{prefix}/.data/version") \
        else f"{prefix}/version"
    version = _decimal(_text(reader, version_name), version_name, None)
    if version is None or not 1 <= version <= MAX_READ_VERSION:
        raise FormatError(f"archive version {version} is missing or outside 1..{MAX_READ_VERSION}",
                          member=version_name)
    order = _text(reader, f"{prefix}/byteorder")
    if order is not None and order not in ("little", "big"):
        raise FormatError(f"unknown byte order {order!r:.20}", member=f"{prefix}/byteorder")
    alignment = _decimal(_text(reader, f"{prefix}/.storage_alignment"), "storage_alignment", 64)
    return ZipInfo(
        prefix=prefix,
        version=version,
        byteorder=order or settings.missing_byteorder(),
        byteorder_recorded=order is not None,
        format_version=_decimal(_text(reader, f"{prefix}/.format_version"), "format_version", None),
        storage_alignment=alignment or 64,
        serialization_id=_text(reader, f"{prefix}/.data/serialization_id"),
        is_torchscript=reader.get(f"{prefix}/constants.pkl") is not None,
    )


#: ``find_class`` of the default (weights-only) policy: the allowlist (guarded
#: against ``BUILD``), then :func:`ptfile.add_safe_globals` entries; anything else
#: raises UnsafeGlobalError saying how to allow it.
find_safe_class: Final = find_strict_class


def read_zip(source: Source, *, map_location: MapLocation, limits: Limits, settings: Settings,
             find_class: Callable[[str, str], Any] = find_safe_class, skip_data: bool = False,
             encoding: str = "ASCII") -> Any:
    """Unpickle a torch ZIP checkpoint from ``source``; storages are views of the source."""
    with paused_gc():  # the directory, the records' table and the objects: no garbage
        return _read_zip(source, map_location=map_location, limits=limits, settings=settings,
                         find_class=find_class, skip_data=skip_data, encoding=encoding)


def _read_zip(source: Source, *, map_location: MapLocation, limits: Limits, settings: Settings,
              find_class: Callable[[str, str], Any], skip_data: bool, encoding: str) -> Any:
    reader = ZipReader(source, limits=limits)
    if reader.get(f"{reader.prefix}/archive_format") is not None:
        raise UnsupportedFeatureError(PT2_MESSAGE)
    info = read_info(reader, settings)
    if info.is_torchscript:
        from .torchscript import read_torchscript  # torchscript builds on this module

        return read_torchscript(source, reader=reader, info=info, map_location=map_location,
                                limits=limits, find_class=find_class, skip_data=skip_data,
                                encoding=encoding).state_dict()
    data_name = f"{info.prefix}/data.pkl"
    if reader.get(data_name) is None:
        raise FormatError("the archive has no data.pkl record", member=data_name)
    loader: Callable[[object], Storage]
    if map_location is None and not has_packages() and find_class is find_safe_class:
        loader = FastStorages(reader, source, info, skip_data=skip_data,
                              calculate_offsets=settings.calculate_storage_offsets)
        find_class = find_class_fast()
    else:
        loader = StorageLoader(reader, source, info, map_location=map_location,
                               skip_data=skip_data,
                               calculate_offsets=settings.calculate_storage_offsets)
    obj, _ = unpickle(reader.read(data_name), find_class=find_class, persistent_load=loader,
                      limits=limits, encoding=encoding)
    return obj


# --------------------------------------------------------------------------- writing

_V2: Final = global_("torch._utils", "_rebuild_tensor_v2")
_V3: Final = global_("torch._utils", "_rebuild_tensor_v3")
_PARAM: Final = global_("torch._utils", "_rebuild_parameter")
_PARAM_STATE: Final = global_("torch._utils", "_rebuild_parameter_with_state")
_META: Final = global_("torch._utils", "_rebuild_meta_tensor_no_storage")
_QTENSOR: Final = global_("torch._utils", "_rebuild_qtensor")
_SPARSE: Final = global_("torch._utils", "_rebuild_sparse_tensor")
_FROM_TYPE: Final = global_("torch._tensor", "_rebuild_from_type_v2")
_ORDERED_DICT: Final = global_("collections", "OrderedDict")
_SIZE: Final = global_("torch", "Size")
_DEVICE: Final = global_("torch", "device")
_LAYOUT: Final = global_("torch.serialization", "_get_layout")
_UNTYPED: Final = global_("torch.storage", "UntypedStorage")
#: torch's location tags for CPU-like devices are string constants (memoised once);
#: indexed tags such as ``cuda:0`` are built afresh for every persistent id.
_STORAGE_LITERAL: Final = "storage"
_CPU: Final = "cpu"


def _location(tag: str) -> str:
    if ":" not in tag:
        return sys.intern(tag)
    return "".join(list(tag))  # a new str object each time, as torch's _cuda_tag builds it


class _ArrayStorages:
    """numpy arrays → shared Storages: views of one base buffer share one storage, as in torch."""

    def __init__(self) -> None:
        self._by_owner: dict[int, tuple[object, Storage]] = {}

    @staticmethod
    def _owner(array: np.ndarray) -> tuple[object, memoryview]:
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if root.base is None:
            whole = root.reshape(-1, order="A") if root.flags.forc else None
            if whole is None:
                raise ValueError("non-contiguous owner")
            return root, whole.view(np.uint8).data.cast("B")
        buffer = memoryview(root.base).cast("B")  # type: ignore[unreachable]
        return root.base, buffer

    def tensor(self, array: np.ndarray) -> Tensor:
        """A Tensor viewing the storage of ``array``'s base buffer (or of a native copy)."""
        dtype = dtypes.from_numpy(array.dtype)
        # (copies with order="C", never np.ascontiguousarray: it makes 0-d arrays 1-d)
        if array.dtype.byteorder == ">" or any(s < 0 for s in array.strides):
            array = array.astype(array.dtype.newbyteorder("="), order="C")
        try:
            owner, buffer = self._owner(array)
        except (ValueError, TypeError):
            array = array if array.flags.c_contiguous else array.copy(order="C")
            owner, buffer = self._owner(array)
        item = dtype.itemsize
        start = np.frombuffer(buffer, np.uint8).ctypes.data if buffer.nbytes else 0
        delta = array.ctypes.data - start if array.size else 0
        fits = (delta % item == 0 and buffer.nbytes % item == 0
                and all(s % item == 0 for s in array.strides))
        if not fits:
            array = array.copy(order="C")
            owner, buffer, delta = array, array.reshape(-1).view(np.uint8).data, 0
        storage = self._storage(owner, buffer, dtype)
        strides = tuple(s // item for s in array.strides)
        return Tensor(storage, delta // item, array.shape, strides, dtype=dtype)

    def _storage(self, owner: object, buffer: memoryview, dtype: DType) -> Storage:
        found = self._by_owner.get(id(owner))
        if found is not None:
            storage = found[1]
            if storage.dtype != (dtypes.UINT8 if dtype.is_v3 else dtype):
                raise SaveError("Cannot save multiple tensors or storages that view the same data "
                                "as different types")
            return storage
        storage = Storage(buffer, dtype, untyped=dtype.is_v3)
        self._by_owner[id(owner)] = (owner, storage)
        return storage


class _Reducer:
    """Turns ptfile/numpy objects into the reduce tuples torch's pickler would produce."""

    def __init__(self) -> None:
        self.storages: list[Storage] = []
        self._keys: dict[int, str] = {}
        self._arrays = _ArrayStorages()
        # By key: the dtype of the first tensor met on each storage (None: none yet), and
        # that of tensors met before their storage got its key.
        self._dtypes: list[DType | None] = []
        self._early_dtypes: dict[int, DType] = {}
        # reduce() inlines tensor() and storage_pid() unless a subclass makes its own pids.
        self._inline = type(self).storage_pid is _Reducer.storage_pid

    def persistent_id(self, obj: object) -> object:
        # torch's persistent_id, asked about the PERSISTENT_TYPES only (the others all give
        # None); the save-time refusal of empty bytes lives here too.
        if type(obj) is not Storage:
            if type(obj) is bytes and not obj:
                raise SaveError("empty bytes pickle as builtins.bytes(), which torch.load("
                                "weights_only=True) refuses; save bytearray() or None instead")
            return None
        return self.storage_pid(obj)

    def storage_pid(self, obj: Storage) -> tuple[object, ...]:
        """A fresh pid tuple, as torch builds one per reference (its key str is reused)."""
        fresh = str(len(self.storages))
        key = self._keys.setdefault(id(obj), fresh)
        if key is fresh:  # keys are distinct numbers: identity means it was just added
            self.storages.append(obj)
            self._dtypes.append(self._early_dtypes.pop(id(obj), None) if self._early_dtypes
                                else None)
        location = _CPU if obj.location == _CPU else _location(obj.location)
        dtype = obj.dtype
        if obj.untyped or dtype.storage is None:  # v3 dtypes (e.g. from TorchScript) save untyped
            return (_STORAGE_LITERAL, _UNTYPED, key, location, obj.nbytes)
        storage_type = _STORAGE_TYPES.get(dtype.storage) or global_("torch", dtype.storage)
        return (_STORAGE_LITERAL, storage_type, key, location, obj.nbytes // dtype.itemsize)

    def reduce(self, obj: object) -> Reduce | ViewReduce | PersistentId | Global | None:
        if type(obj) is Tensor and self._inline and not self._early_dtypes:  # common, inlined
            storage = obj.storage
            if (type(storage) is Storage and storage.location == _CPU and not storage.untyped
                    and not obj.metadata and obj.type_name is None and obj.dtype.storage):  # fmt: skip
                stored = storage.dtype
                kind = _STORAGE_TYPES.get(stored.storage or "")
                storages = self.storages
                fresh = str(len(storages))
                if kind is not None and self._keys.setdefault(id(storage), fresh) is fresh:
                    storages.append(storage)  # a new storage: what tensor() does for it
                    self._dtypes.append(obj.dtype)
                    pid = (_STORAGE_LITERAL, kind, fresh, _CPU, storage._nbytes // stored.itemsize)
                    return tuple.__new__(ViewReduce, (_V2, pid, obj._offset, obj._shape,
                                                      obj._stride, obj.requires_grad,
                                                      obj.backward_hooks))
        handler = _REDUCERS.get(type(obj))
        if handler is None:
            return None
        result: Reduce | ViewReduce | PersistentId | Global = handler(self, obj)
        return result

    def swap_dtype(self, storage: Storage) -> DType:
        """The dtype whose unit byte-swaps ``storage``: an untyped one takes its tensors'."""
        return self.swap_dtype_at(int(self._keys[id(storage)]))

    def swap_dtype_at(self, key: int) -> DType:
        """:meth:`swap_dtype` of the storage with ``key``."""
        return self._dtypes[key] or self.storages[key].dtype

    def _note_dtype(self, storage: Storage, dtype: DType) -> None:
        """Remember the dtype of the first tensor that views ``storage``."""
        key = self._keys.get(id(storage))
        if key is None:
            self._early_dtypes.setdefault(id(storage), dtype)
        elif self._dtypes[int(key)] is None:
            self._dtypes[int(key)] = dtype

    def tensor_args(self, t: Tensor) -> tuple[Global, tuple[Any, ...]]:
        # Size and stride are fresh tuples, as torch builds them per reduction
        # (loaded tensors may share theirs; the memo must not see them twice).
        if t.storage is None:
            return _META, (t.dtype, (*t._shape,), (*t._stride,), t.requires_grad)
        self._note_dtype(t.storage, t.dtype)
        base: tuple[Any, ...] = (t.storage, t._offset, (*t._shape,), (*t._stride,),
                                 t.requires_grad, t.backward_hooks)
        if t.dtype.is_v3:
            base = (*base, t.dtype)
        if t.metadata:
            base = (*base, t.metadata)
        return (_V3 if t.dtype.is_v3 else _V2), base

    def tensor(self, t: Tensor) -> Reduce | ViewReduce:
        storage = t.storage
        if type(storage) is Storage and t.dtype.storage and not t.metadata and t.type_name is None:
            # The common tensor: _rebuild_tensor_v2(storage, offset, size, stride,
            # requires_grad, hooks), whose pid the reducer makes now, just before the
            # pickler would have asked for it (so keys keep first-encounter order).
            pid = self.storage_pid(storage)
            if self.storages[-1] is storage:  # its key is the last one: no lookup
                if self._dtypes[-1] is None:
                    self._dtypes[-1] = t.dtype
            else:
                self._note_dtype(storage, t.dtype)
            # tuple.__new__: the NamedTuple's own __new__ is a Python call more per tensor
            return tuple.__new__(ViewReduce, (_V2, pid, t._offset, t._shape, t._stride,
                                              t.requires_grad, t.backward_hooks))
        func, args = self.tensor_args(t)
        if t.type_name is not None and t.type_name.count(".") and t.python_state is not None:
            module, _, name = t.type_name.rpartition(".")
            return Reduce(_FROM_TYPE, (func, global_(module, name), args, t.python_state))
        return Reduce(func, args)

    def parameter(self, p: Parameter) -> Reduce:
        data = self.tensor(p.data)
        if p.state is not None:
            return Reduce(_PARAM_STATE, (data, p.requires_grad, p.backward_hooks, p.state))
        return Reduce(_PARAM, (data, p.requires_grad, p.backward_hooks))

    def array(self, a: np.ndarray) -> Reduce | ViewReduce:
        return self.tensor(self._arrays.tensor(a))

    def quantized(self, q: QuantizedTensor) -> Reduce:
        r = q.int_repr
        scheme = global_("torch", q.qscheme if q.scales is None else "per_channel_affine")
        params: tuple[Any, ...] = (scheme, q.scale, q.zero_point) if q.scales is None else \
            (scheme, q.scales, q.zero_points, q.axis)
        hooks = q.backward_hooks if q.backward_hooks is not None else OrderedDict()
        return Reduce(_QTENSOR, (r.storage, r._offset, (*r._shape,), (*r._stride,), params,
                                 q.requires_grad, hooks))

    def sparse(self, s: SparseTensor) -> Reduce:
        layout = Reduce(_LAYOUT, (f"torch.{s.layout}",))
        if s.layout == "sparse_coo":
            parts: tuple[Any, ...] = (s.indices, s.values, s.size)
            if s.is_coalesced is not None:
                parts = (*parts, s.is_coalesced)
        else:
            parts = (s.compressed_indices, s.plain_indices, s.values, s.size)
        return Reduce(_SPARSE, (layout, parts))


#: The typed storage classes, by name (``global_`` of each, without its call per tensor).
_STORAGE_TYPES: Final = {
    name: global_("torch", name) for name in dtypes.STORAGE_DTYPES
}
#: The only objects _Reducer.persistent_id may answer for (see Pickler's persistent_types).
PERSISTENT_TYPES: Final = (Storage, bytes)


def _device(_: _Reducer, d: Device) -> Reduce:
    return Reduce(_DEVICE, (d.type,) if d.index is None else (d.type, d.index))


_REDUCERS: Final[dict[type, Callable[[_Reducer, Any], Any]]] = {
    Tensor: _Reducer.tensor,
    Parameter: _Reducer.parameter,
    np.ndarray: _Reducer.array,
    QuantizedTensor: _Reducer.quantized,
    SparseTensor: _Reducer.sparse,
    Size: lambda _, s: Reduce(_SIZE, (tuple(s),)),
    Device: _device,
    DType: lambda _, d: global_("torch", d.name),
    QScheme: lambda _, q: global_("torch", q.name),
    Layout: lambda _, lay: Reduce(_LAYOUT, (f"torch.{lay.name}",)),
    StorageType: lambda _, st: global_(st.module, st.name),
    TensorType: lambda _, tt: global_(tt.module, tt.name),
}


def _ordered_bytes(storage: Storage, dtype_of: DType, byteorder: str) -> memoryview:
    """The storage's bytes in ``byteorder``: as they are, or swapped per ``dtype_of.swap``."""
    data = storage.data
    if data is None:
        raise SaveError(f"{storage!r} has no data (loaded with skip_data)")
    if storage.byteorder == byteorder or dtype_of.swap == 1:
        return data
    if data.nbytes % dtype_of.swap:
        raise SaveError(f"{storage!r}: {data.nbytes} bytes is not a whole number of "
                        f"{dtype_of.swap}-byte units to byte-swap")
    swapped = np.frombuffer(data, f"u{dtype_of.swap}").byteswap()
    return memoryview(swapped.view(np.uint8))


def write_zip(obj: object, write: Callable[[Any], Any], prefix: str, settings: Settings, *,
              pickle_protocol: int = 2, byteorder: str = sys.byteorder,
              skip_data: bool = False) -> None:
    """Write ``obj`` as torch.save would, through ``write`` (storages streamed, not joined).

    ``byteorder`` (``"little"``/``"big"``) is the order of the storage bytes and
    of the ``byteorder`` record; the host's by default, as torch writes.
    ``skip_data`` writes every storage record as zeros with CRC 0, as torch's
    ``serialization.skip_data()`` does: the layout is final, the bytes are
    filled in later (e.g. through a shared map of the file).
    """
    if byteorder not in ("little", "big"):
        raise ValueError(f"byteorder must be 'little' or 'big', got {byteorder!r}")
    reducer = _Reducer()
    pickler = Pickler(pickle_protocol, reducer=reducer.reduce, persistent_id=reducer.persistent_id,
                      persistent_types=PERSISTENT_TYPES)
    with paused_gc():  # ~10 objects per tensor and record, none of them garbage
        _write_archive(pickler.dump(obj), reducer, write, prefix, settings, byteorder, skip_data)


def _write_archive(data: bytes, reducer: _Reducer, write: Callable[[Any], Any], prefix: str,
                   settings: Settings, byteorder: str, skip_data: bool) -> None:
    """The records of :func:`write_zip`, in torch's order, ``data`` being ``data.pkl``."""
    writer = ZipWriter(write, prefix, alignment=settings.storage_alignment, crc32=settings.crc32)
    head = [("data.pkl", data), (".format_version", b"1"),
            (".storage_alignment", str(settings.storage_alignment).encode())]
    order = [("byteorder", byteorder.encode())]
    writer.write_records(head + order if settings.byteorder_record else head)
    if skip_data:
        for key, storage in enumerate(reducer.storages):
            writer.write_record_skip_data(f"data/{key}", storage.nbytes)
    else:
        writer.write_records(_storage_records(reducer, byteorder))
    writer.write_records([("version", b"3\n")] + ([] if settings.byteorder_record else order))
    writer.close()


def _storage_records(reducer: _Reducer, byteorder: str) -> Iterator[tuple[str, memoryview]]:
    """``("data/<key>", bytes in byteorder)`` of every storage, in key order."""
    for key, storage in enumerate(reducer.storages):
        data = storage.data
        if data is None or storage.byteorder != byteorder:
            data = _ordered_bytes(storage, reducer.swap_dtype_at(key), byteorder)
        yield f"data/{key}", data
