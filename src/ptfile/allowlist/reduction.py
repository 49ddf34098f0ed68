"""The save-side inverse of :mod:`ptfile.allowlist.rebuild`: objects to the reduce tuples torch pickles.

:mod:`ptfile.allowlist.rebuild` maps each global ``torch.load(weights_only=True)`` allows
to the function that rebuilds it; this module maps each ptfile (and numpy)
type to the ``(callable, args)`` pair ``torch.save`` pickles for the torch
object it stands for, so that ptfile's output is byte-identical to torch's:

=========================  ===============================================================
object                     pickled as
=========================  ===============================================================
:class:`~ptfile.Tensor`    ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
                           requires_grad, backward_hooks[, metadata])``; ``_v3`` (with the
                           dtype) for dtypes without a typed storage class; a tensor
                           subclass goes through ``torch._tensor._rebuild_from_type_v2``
:class:`~ptfile.Parameter` ``torch._utils._rebuild_parameter[_with_state]``
``numpy.ndarray``          as a Tensor of its base buffer (views share one storage)
numpy scalar, ``np.dtype``  as numpy pickles them (:func:`numpy_value`), byte for byte what
                           ``torch.save`` writes: ``numpy._core.multiarray.scalar(dtype,
                           bytes)`` and ``numpy.dtype(descr, False, True)`` + ``BUILD``
:class:`~ptfile.Storage`   the persistent id ``('storage', <storage class>, key, location,
                           numel)``, keys ``'0'``, ``'1'``… in first-encounter order
quantized, sparse          ``_rebuild_qtensor``, ``_rebuild_sparse_tensor``
Size, device, dtype, …     ``torch.Size``, ``torch.device``, ``torch.<dtype>`` globals
=========================  ===============================================================

The ZIP writer (:mod:`ptfile.formats.zipped`) and the legacy writer
(:mod:`ptfile.formats.legacy_pickle`, whose persistent ids have a sixth
field) both pickle through :class:`Reducer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from ..errors import SaveError
from ..model import dtypes
from ..model.dtypes import DType
from ..model.layouts import QuantizedTensor, SparseTensor
from ..model.location import pid_location
from ..model.tensor import Device, Parameter, Size, Storage, Tensor
from ..picklevm.pickler import Global, PersistentId, Reduce, ViewReduce, global_
from .rebuild import Layout, QScheme, StorageType, TensorType

__all__ = ["NUMPY_KINDS", "PERSISTENT_TYPES", "Reducer", "numpy_value", "ordered_bytes"]

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
_STORAGE_LITERAL: Final = "storage"
#: torch.dtype's ``__module__``: a ``'torch'`` str of its own, which every dtype shares
#: (protocols 4 and 5 memoise the module strs of globals by identity).
_DTYPE_MODULE: Final = "torch.dtype"
#: torch's CPU location tag: one constant object, memoised once (location.pid_location).
_CPU: Final = "cpu"


class _ArrayStorages:
    """numpy arrays → shared Storages: views of one base buffer share one storage, as in torch."""

    def __init__(self) -> None:
        self._by_owner: dict[int, tuple[object, Storage]] = {}

    @staticmethod
    def _owner(array: np.ndarray) -> tuple[object, memoryview]:
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        base: object = root.base
        if base is not None:
            try:
                return base, memoryview(base).cast("B")  # type: ignore[arg-type]
            except TypeError:
                pass  # a base without a flat buffer (torch's t.numpy()): the array owns its view
        whole = root.reshape(-1, order="A") if root.flags.forc else None
        if whole is None:
            raise ValueError("non-contiguous owner")
        return root, whole.view(np.uint8).data.cast("B")

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


class Reducer:
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
        self._inline = type(self).storage_pid is Reducer.storage_pid

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
        location = _CPU if obj.location == _CPU else pid_location(obj)
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
            # numpy's scalar and dtype classes are many (one per dtype): asked by kind.
            return numpy_value(obj) if isinstance(obj, (np.generic, np.dtype)) else None
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
#: The only objects Reducer.persistent_id may answer for (see Pickler's persistent_types).
PERSISTENT_TYPES: Final = (Storage, bytes)


#: The numpy dtype kinds :data:`ptfile.NUMPY_GLOBALS` reads back (bool, ints, floats,
#: complex, bytes and str, datetime and timedelta): those ptfile writes.
NUMPY_KINDS: Final = frozenset("biufcSUMm")


def numpy_value(obj: np.generic | np.dtype[Any]) -> Reduce:
    """A numpy scalar or dtype as numpy's own ``__reduce__`` gives it, so as ``torch.save``
    pickles it: ``scalar(dtype, bytes)`` (the module numpy names: ``numpy._core.multiarray``
    in numpy 2, ``numpy.core.multiarray`` in 1.x) and ``numpy.dtype(descr, False, True)``
    with its state.  The parts are numpy's objects, so the memo sees what the C pickler
    sees (one dtype object per dtype, its interned strs).

    Raises
    ------
    SaveError
        A dtype ptfile cannot read back: object, void or structured, with a subarray
        or metadata.
    """
    dtype = obj if isinstance(obj, np.dtype) else obj.dtype
    if dtype.kind not in NUMPY_KINDS or dtype.fields is not None \
            or dtype.subdtype is not None or dtype.metadata is not None:
        raise SaveError(f"cannot save the numpy {'dtype' if obj is dtype else 'scalar of'} "
                        f"{dtype!r}: ptfile.NUMPY_GLOBALS reads plain numpy dtypes only")
    reduced: tuple[Any, ...] = obj.__reduce__()  # type: ignore[assignment]
    func, args = reduced[0], reduced[1]
    state = reduced[2] if len(reduced) > 2 else None
    return Reduce(global_(func.__module__, func.__name__), args, state)


def _device(_: Reducer, d: Device) -> Reduce:
    return Reduce(_DEVICE, (d.type,) if d.index is None else (d.type, d.index))


_REDUCERS: Final[dict[type, Callable[[Reducer, Any], Any]]] = {
    Tensor: Reducer.tensor,
    Parameter: Reducer.parameter,
    np.ndarray: Reducer.array,
    QuantizedTensor: Reducer.quantized,
    SparseTensor: Reducer.sparse,
    Size: lambda _, s: Reduce(_SIZE, (tuple(s),)),
    Device: _device,
    DType: lambda _, d: global_("torch", d.name, _DTYPE_MODULE),
    QScheme: lambda _, q: global_("torch", q.name),
    Layout: lambda _, lay: Reduce(_LAYOUT, (f"torch.{lay.name}",)),
    StorageType: lambda _, st: global_(st.module, st.name),
    TensorType: lambda _, tt: global_(tt.module, tt.name),
}


def ordered_bytes(storage: Storage, dtype_of: DType, byteorder: str) -> memoryview:
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
