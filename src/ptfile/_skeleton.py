"""The metadata load behind :func:`ptfile.open`: data-less tensors, built fast and checked.

``find_class_fast`` is the weights-only allowlist with per-load constructors
for ``_rebuild_tensor_v2``/``_v3`` that validate size, stride and offset with
C-level builtins (a state dict repeats a handful of shapes, so the geometry
check is cached); anything unusual takes the canonical path in
:mod:`ptfile.rebuild`, which reports it.  ``StorageStubs`` is the matching
``persistent_load``: one data-less :class:`~ptfile.Storage` per key, checked
against its record.
"""

from __future__ import annotations

import contextlib
import gc
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Final

from ._io import Source
from .archive import ZipReader
from .dtypes import UINT8, DType
from .formats.zipped import StorageLoader, ZipInfo, find_safe_class
from .rebuild import StorageType, rebuild_tensor_v2, rebuild_tensor_v3
from .tensor import MAX_NDIM, Storage, Tensor

__all__ = ["StorageStubs", "find_class_fast", "gc_paused"]

_INTS: Final = frozenset({int})
_new_storage: Final = object.__new__


def _geometry_extent(size: tuple[Any, ...], stride: tuple[Any, ...]) -> int | None:
    """Elements a valid (size, stride) pair spans, or None when it is not plain and valid."""
    ndim = len(size)
    if (ndim != len(stride) or ndim > MAX_NDIM or not set(map(type, size + stride)) <= _INTS
            or (ndim and (min(size) < 0 or min(stride) < 0))):
        return None
    if ndim and not min(size):
        return 0
    return int(1 + sum(map(operator.mul, size, stride)) - sum(stride))


class _Geometry(dict[tuple[Any, Any], "int | None"]):
    """Cache of :func:`_geometry_extent`: a state dict repeats a handful of shapes."""

    def __missing__(self, key: tuple[Any, Any]) -> int | None:
        extent: int | None = _geometry_extent(*key)
        self[key] = extent
        return extent


def _fast_tensor(geometry: _Geometry, storage: object, offset: object, size: object,
                 stride: object, requires_grad: object, hooks: object, dtype: object,
                 metadata: object) -> Tensor | None:
    """A data-less Tensor, validated with C-level builtins; None sends odd input the long way."""
    if (type(storage) is not Storage or type(offset) is not int or type(size) is not tuple
            or type(stride) is not tuple or type(hooks) is not OrderedDict
            or (metadata is not None and type(metadata) is not dict)):
        return None
    extent = geometry[size, stride]
    dtype = dtype if isinstance(dtype, DType) else storage.dtype
    if extent is None or offset < 0 or (extent and
                                        offset + extent > storage.nbytes // dtype.itemsize):
        return None
    t = object.__new__(Tensor)
    t.storage, t.dtype = storage, dtype
    t._offset, t._shape, t._stride = offset, size, stride
    t.requires_grad, t.backward_hooks, t.metadata = bool(requires_grad), hooks, metadata
    t.python_state, t.type_name = None, None
    return t


def find_class_fast() -> Callable[[str, str], Any]:
    """The weights-only allowlist with per-load fast tensor constructors.

    The constructors are closures made per load, so nothing a stream does to
    them (``BUILD`` on a global) outlives the load (see :mod:`ptfile.picklevm.unpickler`).
    """
    geometry = _Geometry()

    def v2(storage: object, offset: object, size: object, stride: object, requires_grad: object,
           hooks: object, metadata: object = None) -> Tensor:
        t = _fast_tensor(geometry, storage, offset, size, stride, requires_grad, hooks, None,
                         metadata)
        return t if t is not None else rebuild_tensor_v2(
            storage, offset, size, stride, requires_grad, hooks, metadata)

    def v3(storage: object, offset: object, size: object, stride: object, requires_grad: object,
           hooks: object, dtype: object, metadata: object = None) -> Tensor:
        t = None if not isinstance(dtype, DType) else _fast_tensor(
            geometry, storage, offset, size, stride, requires_grad, hooks, dtype, metadata)
        return t if t is not None else rebuild_tensor_v3(
            storage, offset, size, stride, requires_grad, hooks, dtype, metadata)

    fast: dict[tuple[str, str], Any] = {("torch._utils", "_rebuild_tensor_v2"): v2,
                                        ("torch._utils", "_rebuild_tensor_v3"): v3}

    def find_class(module: str, name: str) -> Any:
        found = fast.get((module, name))
        return found if found is not None else find_safe_class(module, name)

    return find_class


class StorageStubs:
    """``persistent_load`` for metadata loads: data-less Storages, checked against their records.

    The same checks as :class:`~ptfile.formats.zipped.StorageLoader`, which
    reports anything unusual; locations stay as recorded (no ``map_location``).
    """

    def __init__(self, reader: ZipReader, source: Source, info: ZipInfo) -> None:
        self._slow = StorageLoader(reader, source, info, map_location=None, skip_data=True)
        self._records = reader
        self._prefix = f"{info.prefix}/data/"
        self._byteorder = info.byteorder
        self.storages: dict[str, Storage] = {}

    def __call__(self, pid: object) -> Storage:
        if type(pid) is not tuple or len(pid) != 5:
            return self._slow(pid)
        tag, storage_type, key, location, numel = pid
        found = self.storages.get(key) if type(key) is str else None
        if found is not None:
            return found
        record = self._records.get(self._prefix + key) if type(key) is str else None
        if (tag != "storage" or type(storage_type) is not StorageType or record is None
                or type(location) is not str or type(numel) is not int or numel < 0):
            return self._slow(pid)
        dtype = storage_type.dtype or UINT8
        if record.size != numel * dtype.itemsize:
            return self._slow(pid)
        storage = _new_storage(Storage)  # Storage(None, dtype, ...) without the kwargs parsing
        storage.data, storage.dtype, storage.untyped = None, dtype, storage_type.dtype is None
        storage.location, storage.key, storage.byteorder = location, key, self._byteorder
        storage._nbytes = record.size
        self.storages[key] = storage
        return storage


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building ~10^5 acyclic objects (it would rescan them ~100x)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
