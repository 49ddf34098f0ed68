"""ptfile's tensor model: storages, tensors and the records of torch's other tensor kinds.

A :class:`Storage` is the flat byte buffer torch writes as one ``data/<key>``
record; a :class:`Tensor` is a strided view of a storage, exactly as torch
records it: ``storage_offset``, ``size`` and ``stride`` in elements, ``dtype``,
``requires_grad``, the (always empty) ``backward_hooks`` and the ``metadata``
dict that carries the conj/neg bits.  Nothing the file says is dropped, so a
load followed by a save reproduces the file.

``numpy()`` / ``np.asarray(t)`` return a zero-copy strided view of the storage
bytes (tensors sharing a storage share memory).  The conj/neg bits are applied
on the way out, necessarily as a copy.  Every view is checked against its
storage before it is made: a view reading outside its storage is a
:class:`~ptfile.errors.StorageError`, never a crash.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ..errors import LimitExceededError, StorageError, UnsupportedFeatureError
from ..limits import active as _active_limits
from .dtypes import UINT8, DType

__all__ = [
    "Device",
    "Parameter",
    "Size",
    "Storage",
    "Tensor",
    "state_attributes",
]

#: The most dimensions a numpy array has (numpy 2's ``NPY_MAXDIMS``; torch 2.13 loads
#: tensors of more): a fact of numpy, not a ceiling, so no ``Limits`` raises it and a
#: view numpy cannot make is refused.  The ceiling is :attr:`Limits.max_ndim`
#: (:func:`ptfile.limits.active`), whose default equals it.
NUMPY_MAX_DIMS: Final = 64


class Size(tuple):  # type: ignore[type-arg]
    """``torch.Size``: a tuple of ints (it saves back as ``torch.Size``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"torch.Size({list(self)})"

    def numel(self) -> int:
        """Product of the sizes."""
        n = 1
        for s in self:
            n *= s
        return n


class Device:
    """``torch.device``, torch-free: prints and compares like torch's."""

    __slots__ = ("index", "type")

    def __init__(self, type: str, index: int | None = None) -> None:
        if index is None and ":" in type:
            type, _, text = type.partition(":")
            index = int(text) if text.isdigit() else None
        self.type = type
        self.index = index

    def __repr__(self) -> str:
        extra = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{extra})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = Device(other)
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


class Storage:
    """The bytes of one ``data/<key>`` record, with the type torch recorded for it.

    ``dtype`` is the element type of a typed storage (``FloatStorage`` → float32);
    ``untyped`` storages (torch's ``UntypedStorage``, used for the "v3" dtypes)
    have dtype uint8 and count bytes.  ``data`` is a memoryview of the bytes:
    a slice of the file's map when loaded with ``mmap=True``, made on first
    use (:meth:`_located_later`).  ``_pickled_location`` is the very str object the
    loaded checkpoint's pickle gave as this storage's location (None for a storage
    made otherwise): while ``location`` is that object, a re-save memoises it where
    the file did (:func:`ptfile.model.location.pid_location`).  ``byteorder`` is the order of
    those bytes: the file's, except that a big-endian bfloat16 storage is replaced by
    one little-endian copy on the first use of its values (:meth:`Tensor.numpy`).
    """

    __slots__ = ("__weakref__", "_locate", "_nbytes", "_pickled_location", "byteorder", "data",
                 "dtype", "key", "location", "untyped")
    _locate: Callable[[Storage], memoryview]  # set by _located_later only

    def __init__(
        self,
        data: memoryview | None,
        dtype: DType,
        *,
        location: str = "cpu",
        key: str | None = None,
        untyped: bool = False,
        byteorder: str = "little",
        nbytes: int | None = None,
    ) -> None:
        self.data = data if data is None or data.format == "B" else data.cast("B")
        self.dtype = UINT8 if untyped else dtype
        self.untyped = untyped
        self.location = location
        self._pickled_location: str | None = None
        self.key = key
        self.byteorder = byteorder
        self._nbytes = self.data.nbytes if self.data is not None else (nbytes or 0)

    @classmethod
    def _from_record(cls, data: memoryview | None, dtype: DType, location: str, key: str,
                     untyped: bool, byteorder: str, nbytes: int) -> Storage:
        """Loaders' constructor: ``data`` is already a flat byte view of ``nbytes`` bytes."""
        self = cls.__new__(cls)
        self.data, self.dtype, self.untyped = data, (UINT8 if untyped else dtype), untyped
        self.location, self.key, self.byteorder, self._nbytes = location, key, byteorder, nbytes
        self._pickled_location = None
        return self

    @classmethod
    def _located_later(cls, locate: Callable[[Storage], memoryview], dtype: DType,
                       location: str, key: str, untyped: bool, byteorder: str,
                       nbytes: int) -> Storage:
        """A storage whose ``data`` is ``locate(storage)``, called on first use of ``data``.

        Loaders of a mapped archive use it: the record's local header is read
        and checked (and its bytes mapped) only when they are used.  A damaged
        header raises from that first use.
        """
        self = cls.__new__(cls)
        self._locate, self.dtype, self.untyped = locate, (UINT8 if untyped else dtype), untyped
        self.location, self.key, self.byteorder, self._nbytes = location, key, byteorder, nbytes
        self._pickled_location = None
        return self

    if not TYPE_CHECKING:  # (a __getattr__ would make mypy accept any attribute name)
        def __getattr__(self, name: str) -> Any:
            # Python calls this only when the slot is unset: for ``data``, a storage made
            # by _located_later whose bytes have not been used yet.
            if name == "data":
                try:
                    locate = object.__getattribute__(self, "_locate")
                except AttributeError:
                    pass
                else:
                    self.data = data = locate(self)
                    return data
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def nbytes(self) -> int:
        """Size of the storage in bytes (known even when the data was skipped)."""
        return self._nbytes

    def numel(self) -> int:
        """Elements as torch counts them for the persistent id (bytes when untyped)."""
        return self.nbytes // self.dtype.itemsize

    def __repr__(self) -> str:
        kind = "UntypedStorage" if self.untyped else f"{self.dtype.storage or self.dtype.name}"
        return f"<ptfile.Storage {kind} key={self.key!r} nbytes={self.nbytes} location={self.location!r}>"


def view_extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements a view spans past its offset (0 when empty)."""
    if 0 in shape:
        return 0
    extent: int = 1 + sum(map(operator.mul, map((-1).__add__, shape), stride))
    return extent


def contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    """torch's contiguous strides for ``shape``, in elements: the one home every format
    asks (a size-0 dimension counts as 1, as ``torch.empty(3, 0).stride() == (1, 1)``).

    >>> contiguous_stride((2, 3, 4)), contiguous_stride((3, 0)), contiguous_stride(())
    ((12, 4, 1), (1, 1), ())
    """
    stride, step = [], 1
    for dim in reversed(shape):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


def check_rank(ndim: int, what: str = "tensor rank") -> None:
    """Raise unless ``ndim`` is within the active ``Limits.max_ndim`` and numpy's 64.

    Raises
    ------
    LimitExceededError
        Over ``max_ndim`` (:func:`ptfile.limits.active`).
    StorageError
        Within a raised ``max_ndim`` but over :data:`NUMPY_MAX_DIMS`.
    """
    max_ndim = _active_limits().max_ndim
    if ndim > max_ndim:
        raise LimitExceededError("max_ndim", max_ndim, ndim, what)
    if ndim > NUMPY_MAX_DIMS:
        raise StorageError(f"{what} {ndim} exceeds the {NUMPY_MAX_DIMS} dimensions numpy arrays "
                           "can have")


def check_view(storage: Storage, dtype: DType, offset: int, shape: Sequence[int],
               stride: Sequence[int]) -> None:
    """Raise StorageError unless the view fits inside ``storage`` (all in ``dtype`` elements)."""
    if len(shape) != len(stride):
        raise StorageError(f"size {tuple(shape)} and stride {tuple(stride)} differ in length")
    if len(shape) > NUMPY_MAX_DIMS or len(shape) > _active_limits().max_ndim:
        check_rank(len(shape))
    if offset < 0 or min(shape, default=0) < 0 or min(stride, default=0) < 0:
        raise StorageError(
            f"negative storage_offset/size/stride: offset {offset}, size {tuple(shape)}, "
            f"stride {tuple(stride)}"
        )
    extent = view_extent(shape, stride)
    available = storage.nbytes // dtype.itemsize
    if extent and offset + extent > available:
        raise StorageError(
            f"view of {dtype!r} at offset {offset} with size {tuple(shape)} and stride "
            f"{tuple(stride)} needs {offset + extent} elements; storage {storage.key!r} "
            f"holds {available}",
            member=storage.key,
        )


_SWAP_LOCK: Final = threading.Lock()


def _to_little_endian(storage: Storage, dtype: DType) -> None:
    """Swap a big-endian storage of a dtype numpy has no big-endian view of (bfloat16)
    into one little-endian copy, once: every tensor on the storage then views that copy.

    Runs on the first use of the data (never during a load).  The copy is as
    writable as the bytes it came from (read-only for ``mmap="r"``); writes reach
    it, not the file, and a save writes it (swapped back if saved big-endian).
    Storages viewed with another dtype's unit (untyped ones) are left alone: their
    views keep swapping per view, in :func:`_swapped`.
    """
    if storage.dtype is not dtype or dtype.swap == 1 \
            or dtype.numpy_dtype().kind in _VIEWABLE_KINDS:
        return
    with _SWAP_LOCK:  # another thread may be swapping it now: swap once
        data = storage.data
        if storage.byteorder != "big" or data is None or data.nbytes % dtype.swap:
            return
        swapped = np.frombuffer(data, f"u{dtype.swap}").byteswap()
        swapped.flags.writeable = not data.readonly
        storage.data = memoryview(swapped).cast("B")
        storage.byteorder = "little"


#: numpy kinds whose dtypes have a big-endian form (a zero-copy view swaps them).
_VIEWABLE_KINDS: Final = "biufc"


def _swapped(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Values of a big-endian view: zero-copy for numpy's own kinds, else a swapped copy."""
    if dtype.swap == 1:
        return array
    if array.dtype.kind in _VIEWABLE_KINDS:
        return array.view(array.dtype.newbyteorder(">"))
    raw = array.view(f"<u{dtype.swap}")
    swapped: np.ndarray = raw.byteswap().view(array.dtype)
    return swapped


def state_attributes(state: object) -> dict[str, Any]:
    """The attributes a pickled Python state sets (``torch._utils._set_obj_state``): the
    ``__dict__``, then the slot values of a ``(__dict__, slots)`` pair; ``{}`` for None.

    Examples
    --------
    >>> state_attributes(({"a": 1}, {"b": 2})), state_attributes(None)
    ({'a': 1, 'b': 2}, {})
    """
    parts = state if type(state) is tuple else (state,)
    return {key: value for part in parts if isinstance(part, dict)
            for key, value in part.items()}


class Tensor:
    """A strided view of a :class:`Storage`, as ``torch._utils._rebuild_tensor_v2`` records it."""

    __slots__ = (
        "_offset",
        "_shape",
        "_stride",
        "backward_hooks",
        "dtype",
        "metadata",
        "python_state",
        "requires_grad",
        "storage",
        "type_name",
    )

    def __init__(
        self,
        storage: Storage | None,
        storage_offset: int,
        size: Sequence[int],
        stride: Sequence[int],
        *,
        dtype: DType | None = None,
        requires_grad: bool = False,
        backward_hooks: OrderedDict[Any, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if dtype is None:
            if storage is None:
                raise StorageError("a tensor without storage needs a dtype")
            dtype = storage.dtype
        self.storage = storage
        self.dtype = dtype
        self._offset = storage_offset
        self._shape = tuple(size)
        self._stride = tuple(stride)
        if storage is not None:
            check_view(storage, dtype, storage_offset, self._shape, self._stride)
        self.requires_grad = requires_grad
        self.backward_hooks = OrderedDict() if backward_hooks is None else backward_hooks
        self.metadata = metadata
        self.python_state: Any = None
        self.type_name: str | None = None

    @classmethod
    def _from_checked(cls, storage: Storage, offset: int, shape: tuple[int, ...],
                      stride: tuple[int, ...], requires_grad: bool,
                      hooks: OrderedDict[Any, Any]) -> Tensor:
        """The hot path of loading: arguments already type-checked by the caller.

        Only the view check runs here (the same check as ``__init__``); it skips
        keyword parsing and defaults, which dominate the cost of 10^5 tiny tensors.
        """
        dtype = storage.dtype
        check_view(storage, dtype, offset, shape, stride)
        self = cls.__new__(cls)
        self.storage, self.dtype, self._offset = storage, dtype, offset
        self._shape, self._stride = shape, stride
        self.requires_grad, self.backward_hooks = requires_grad, hooks
        self.metadata = self.python_state = self.type_name = None
        return self

    # -- torch's accessors -------------------------------------------------------------
    @property
    def shape(self) -> Size:
        """The sizes, as ``torch.Size``."""
        return Size(self._shape)

    def size(self, dim: int | None = None) -> Any:
        """``torch.Tensor.size``: all sizes, or one."""
        return self.shape if dim is None else self._shape[dim]

    def stride(self, dim: int | None = None) -> Any:
        """``torch.Tensor.stride`` in elements: all strides, or one."""
        return self._stride if dim is None else self._stride[dim]

    def storage_offset(self) -> int:
        """Offset of the first element in the storage, in elements."""
        return self._offset

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def dim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def numel(self) -> int:
        """Number of elements."""
        return Size(self._shape).numel()

    @property
    def device(self) -> Device:
        """The device recorded for the storage (``cpu`` when none)."""
        return Device(self.storage.location if self.storage is not None else "meta")

    @property
    def is_conj(self) -> bool:
        """torch's conj bit: the stored bytes are the un-conjugated values."""
        return bool(self.metadata and self.metadata.get("conj"))

    @property
    def is_neg(self) -> bool:
        """torch's neg bit: the stored bytes are the un-negated values."""
        return bool(self.metadata and self.metadata.get("neg"))

    @property
    def is_parameter(self) -> bool:
        """True for ``torch.nn.Parameter`` tensors."""
        return False

    # -- Python attributes ---------------------------------------------------------------
    @property
    def attributes(self) -> Mapping[str, Any]:
        """The Python attributes the tensor was saved with, read-only (empty when none).

        ``t.extra = 5; torch.save(t, f)`` pickles the tensor through
        ``torch._tensor._rebuild_from_type_v2`` with its ``__dict__`` (DeepSpeed's ZeRO-3
        files: ``ds_id``, ``ds_shape``…); a ``Parameter``'s go through
        ``_rebuild_parameter_with_state``.  ptfile records them, never sets them on
        anything: ``python_state`` (``Parameter.state``) keeps the pickled form, a dict
        or a ``(__dict__, slot values)`` pair, and this mapping joins both.  Assigning a
        mapping replaces them (an empty one removes them); :func:`ptfile.save` writes
        them as torch does.

        Examples
        --------
        >>> import numpy as np, ptfile
        >>> t = ptfile.Tensor(ptfile.Storage(np.zeros(4, np.uint8).data, ptfile.DTYPES["uint8"]),
        ...                   0, (4,), (1,))
        >>> t.attributes = {"ds_id": 3}
        >>> dict(t.attributes)
        {'ds_id': 3}
        """
        return MappingProxyType(state_attributes(self.python_state))

    @attributes.setter
    def attributes(self, values: Mapping[str, Any]) -> None:
        self.python_state = dict(values) or None
        if self.python_state is not None and self.type_name is None:
            self.type_name = "torch.Tensor"  # what torch pickles a plain tensor's attributes with
        elif self.python_state is None and self.type_name == "torch.Tensor":
            self.type_name = None

    # -- data ------------------------------------------------------------------------
    def _raw_view(self, np_dtype: np.dtype) -> np.ndarray:
        storage = self.storage
        if storage is None or storage.data is None:
            raise UnsupportedFeatureError(f"{self!r} has no data (meta tensor or skip_data)")
        item = self.dtype.itemsize
        if self.numel() == 0:
            return np.empty(self._shape, np_dtype)
        view: np.ndarray = np.ndarray(
            self._shape,
            np_dtype,
            buffer=storage.data,
            offset=self._offset * item,
            strides=tuple(s * item for s in self._stride),
        )
        return view

    def numpy(self) -> np.ndarray:
        """The values as a numpy array: a zero-copy view of the storage where possible.

        Copies only where the values differ from the stored bytes: conj/neg
        bits, and big-endian dtypes numpy cannot express (bfloat16), whose
        storage is swapped once into a little-endian copy that all its tensors
        share (so a write through one is seen through the others, as in torch).
        """
        storage = self.storage
        if storage is not None and storage.byteorder == "big":
            _to_little_endian(storage, self.dtype)
        return self.values_of(self._raw_view(self.dtype.numpy_dtype()))

    def values_of(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The values torch would show for ``array``, a raw view of (part of) this tensor.

        Applies the storage's byte order and the conj/neg bits; shared by
        :meth:`numpy` and the lazy reader's slices.
        """
        if self.storage is not None and self.storage.byteorder == "big":
            array = _swapped(array, self.dtype)
        if self.is_conj:
            array = np.conj(array)
        if self.is_neg:
            array = np.negative(array)
        return array

    def raw_bytes(self) -> memoryview:
        """The storage bytes this tensor's dtype views, for dtypes numpy cannot hold."""
        if self.storage is None or self.storage.data is None:
            raise UnsupportedFeatureError(f"{self!r} has no data")
        return self.storage.data

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        return np.array(array, copy=True) if copy else array

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __repr__(self) -> str:
        kind = type(self).__name__
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"ptfile.{kind}(shape={list(self._shape)}, dtype={self.dtype!r}{extra})"


class Parameter(Tensor):
    """``torch.nn.Parameter``: a tensor whose ``requires_grad`` is the parameter's flag.

    ``data_requires_grad`` and ``data_hooks`` keep what torch recorded for the
    wrapped ``.data`` tensor; ``state`` the Python attributes of
    ``_rebuild_parameter_with_state``.
    """

    __slots__ = ("data_hooks", "data_requires_grad", "state")

    def __init__(self, data: Tensor, requires_grad: bool = True,
                 backward_hooks: OrderedDict[Any, Any] | None = None,
                 state: Any = None) -> None:
        super().__init__(data.storage, data._offset, data._shape, data._stride, dtype=data.dtype,
                         requires_grad=requires_grad, backward_hooks=backward_hooks,
                         metadata=data.metadata)
        self.data_requires_grad = data.requires_grad
        self.data_hooks = data.backward_hooks
        self.state: Any = state

    @property
    def is_parameter(self) -> bool:
        return True

    @property
    def attributes(self) -> Mapping[str, Any]:
        """The parameter's Python attributes (``state``), as :attr:`Tensor.attributes`."""
        return MappingProxyType({**state_attributes(self.python_state),
                                 **state_attributes(self.state)})

    @attributes.setter
    def attributes(self, values: Mapping[str, Any]) -> None:
        self.state = dict(values) or None

    @property
    def data(self) -> Tensor:
        """The wrapped tensor, as torch's ``Parameter.data``."""
        t = Tensor(self.storage, self._offset, self._shape, self._stride, dtype=self.dtype,
                   requires_grad=self.data_requires_grad, backward_hooks=self.data_hooks,
                   metadata=self.metadata)
        return t
