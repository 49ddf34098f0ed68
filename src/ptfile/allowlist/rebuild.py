"""The allowlist: every global torch's ``weights_only=True`` unpickler accepts, mapped to ptfile.

This is policy, kept as one table (:data:`SAFE_GLOBALS`) from ``(module, name)``
to the ptfile object that stands for it.  Nothing is ever imported by name:
``find_class`` looks the pair up here (after mapping Python 2 module names) and
anything else is an :class:`~ptfile.errors.UnsafeGlobalError`.

The rebuild functions take exactly the arguments torch's ``torch._utils``
functions take (see ``pt-format.md`` §3.5) and validate every one of them:
types, ranks, and that each view fits its storage.
"""

from __future__ import annotations

import codecs
import functools
import types
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..errors import PickleStreamError, StorageError, UnsupportedFeatureError, brief
from ..model import dtypes
from ..model.dtypes import DType
from ..model.layouts import QuantizedTensor, SparseTensor
from ..model.tensor import (
    NUMPY_MAX_DIMS,
    Device,
    Parameter,
    Size,
    Storage,
    Tensor,
    check_rank,
)

__all__ = ["SAFE_GLOBALS", "Layout", "QScheme", "StorageType", "TensorType", "lookup"]


@dataclass(frozen=True, slots=True)
class StorageType:
    """A storage class named in a persistent id (``torch.FloatStorage``, ``UntypedStorage``)."""

    module: str
    name: str
    dtype: DType | None  # None for UntypedStorage / TypedStorage (dtype comes from elsewhere)

    def __repr__(self) -> str:
        return f"<class '{self.module}.{self.name}'>"


@dataclass(frozen=True, slots=True)
class Layout:
    """``torch.layout`` (``torch.strided``, ``torch.sparse_coo``…)."""

    name: str

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True, slots=True)
class QScheme:
    """``torch.qscheme`` (``torch.per_tensor_affine``…)."""

    name: str

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor class named in a pickle (``torch.Tensor``, ``torch.FloatTensor``…)."""

    module: str
    name: str

    def __repr__(self) -> str:
        return f"<class '{self.module}.{self.name}'>"


def _fail(what: str, value: object) -> PickleStreamError:
    return PickleStreamError(f"{what}: unexpected {type(value).__name__} {brief(value, 80)}")


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise _fail(what, value)
    return value


_INT_ONLY: Final = {int}


def _ints(value: object, what: str) -> tuple[int, ...]:
    if type(value) is not tuple and not isinstance(value, (tuple, list)):
        raise _fail(what, value)
    if value and set(map(type, value)) != _INT_ONLY:
        raise _fail(what, value)
    if len(value) > NUMPY_MAX_DIMS:  # lower ranks are checked against max_ndim by check_view
        check_rank(len(value), f"rank of {what}")
    return tuple(value)


def _storage(value: object) -> Storage:
    if not isinstance(value, Storage):
        raise _fail("tensor storage", value)
    return value


def _hooks(value: object) -> OrderedDict[Any, Any]:
    # Some torch 0.4-era files (lpips' v0.1 weights) record ``None``: torch keeps it and
    # writes an empty OrderedDict on re-save, which is what an empty one here saves as.
    if value is None:
        return OrderedDict()
    if not isinstance(value, OrderedDict):
        raise _fail("backward_hooks", value)
    return value


def _metadata(value: object) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise _fail("tensor metadata", value)
    return value


def rebuild_tensor(storage: object, storage_offset: object, size: object, stride: object) -> Tensor:
    """``torch._utils._rebuild_tensor``."""
    return Tensor(_storage(storage), _int(storage_offset, "storage_offset"),
                  _ints(size, "size"), _ints(stride, "stride"))


def rebuild_tensor_v2(storage: object, storage_offset: object, size: object, stride: object,
                      requires_grad: object, backward_hooks: object,
                      metadata: object = None) -> Tensor:
    """``torch._utils._rebuild_tensor_v2``."""
    if (metadata is None and type(storage) is Storage and type(storage_offset) is int
            and type(size) is tuple and type(stride) is tuple
            and type(backward_hooks) is OrderedDict and len(size) <= NUMPY_MAX_DIMS
            and (not size or set(map(type, size + stride)) == _INT_ONLY)):
        # The shape of every tensor torch.save writes: checked here in one go.
        return Tensor._from_checked(storage, storage_offset, size, stride,
                                    bool(requires_grad), backward_hooks)
    return Tensor(_storage(storage), _int(storage_offset, "storage_offset"),
                  _ints(size, "size"), _ints(stride, "stride"),
                  requires_grad=bool(requires_grad), backward_hooks=_hooks(backward_hooks),
                  metadata=_metadata(metadata))


def rebuild_tensor_v3(storage: object, storage_offset: object, size: object, stride: object,
                      requires_grad: object, backward_hooks: object, dtype: object,
                      metadata: object = None) -> Tensor:
    """``torch._utils._rebuild_tensor_v3``: an untyped storage viewed as ``dtype``."""
    if not isinstance(dtype, DType):
        raise _fail("tensor dtype", dtype)
    return Tensor(_storage(storage), _int(storage_offset, "storage_offset"),
                  _ints(size, "size"), _ints(stride, "stride"), dtype=dtype,
                  requires_grad=bool(requires_grad), backward_hooks=_hooks(backward_hooks),
                  metadata=_metadata(metadata))


def rebuild_parameter(data: object, requires_grad: object, backward_hooks: object) -> Parameter:
    """``torch._utils._rebuild_parameter``."""
    if not isinstance(data, Tensor):
        raise _fail("parameter data", data)
    return Parameter(data, bool(requires_grad), _hooks(backward_hooks))


def rebuild_parameter_with_state(data: object, requires_grad: object, backward_hooks: object,
                                 state: object) -> Parameter:
    """``torch._utils._rebuild_parameter_with_state``: a parameter with Python attributes."""
    param = rebuild_parameter(data, requires_grad, backward_hooks)
    param.state = check_state(state)
    return param


#: The per-channel schemes, with the dtypes torch gives their scales and zero points when
#: the pickle holds them as lists (``_rebuild_qtensor``: double and long, or float and float).
_PER_CHANNEL: Final = {"per_channel_affine": (dtypes.DTYPES["float64"], dtypes.DTYPES["int64"]),
                       "per_channel_affine_float_qparams": (dtypes.DTYPES["float32"],
                                                            dtypes.DTYPES["float32"])}


def _list_tensor(values: list[Any], dtype: DType, what: str) -> Tensor:
    """A 1-d tensor of ``dtype`` from a pickled list of numbers (``torch.tensor(values)``)."""
    if any(type(v) not in (int, float, bool) for v in values):
        raise _fail(f"per-channel {what}", values)
    array = np.asarray(values, dtype.numpy_dtype())
    return Tensor(Storage(array.view(np.uint8).data, dtype), 0, array.shape, (1,))


def rebuild_qtensor(storage: object, storage_offset: object, size: object, stride: object,
                    quantizer_params: object, requires_grad: object,
                    backward_hooks: object) -> QuantizedTensor:
    """``torch._utils._rebuild_qtensor``: the integer representation plus the quantizer.

    The quantizer parameters are torch 1.3's (``(qscheme, scale, zero_point)`` or
    ``(qscheme, scales, zero_points, axis)``; per-channel scales and zero points as
    tensors, or as lists, which torch 2.13 still reads); torch 1.1/1.2's eight arguments
    (``scale`` and ``zero_point`` in place of the parameters) are refused, as torch 2.13
    refuses them (a ``TypeError``: too many arguments).
    """
    int_repr = rebuild_tensor(storage, storage_offset, size, stride)
    if not isinstance(quantizer_params, tuple) or not quantizer_params:
        raise _fail("quantizer parameters", quantizer_params)
    scheme = quantizer_params[0]
    if not isinstance(scheme, QScheme):
        raise _fail("qscheme", scheme)
    hooks = _hooks(backward_hooks)
    if scheme.name == "per_tensor_affine" and len(quantizer_params) == 3:
        _, scale, zero_point = quantizer_params
        return QuantizedTensor(int_repr, scheme.name, scale=float(scale),
                               zero_point=_int(zero_point, "zero_point"),
                               requires_grad=bool(requires_grad), backward_hooks=hooks)
    if scheme.name in _PER_CHANNEL and len(quantizer_params) == 4:
        _, scales, zero_points, axis = quantizer_params
        axis = _int(axis, "axis")
        if type(scales) is list and type(zero_points) is list:  # torch 1.3-1.4 wrote lists
            scales, zero_points = (_list_tensor(values, dtype, what) for values, dtype, what in
                                   zip((scales, zero_points), _PER_CHANNEL[scheme.name],
                                       ("scales", "zero_points"), strict=True))
        if not isinstance(scales, Tensor) or not isinstance(zero_points, Tensor):
            raise _fail("per-channel scales", scales)
        if not 0 <= axis < int_repr.ndim or scales.numel() != int_repr.size(axis) \
                or zero_points.numel() != int_repr.size(axis):
            raise StorageError(f"per-channel quantizer: axis {axis}, {scales.numel()} scales "
                               f"and {zero_points.numel()} zero points do not fit shape "
                               f"{tuple(int_repr.shape)}")
        return QuantizedTensor(int_repr, scheme.name, scales=scales, zero_points=zero_points,
                               axis=axis, requires_grad=bool(requires_grad), backward_hooks=hooks)
    raise UnsupportedFeatureError(f"quantizer {brief(quantizer_params, 100)}")


def _check_coo(indices: Tensor, values: Tensor, size: tuple[int, ...]) -> None:
    if indices.ndim != 2 or indices.dtype.name != "int64":
        raise StorageError(f"sparse COO indices must be a 2-D int64 tensor, got {indices!r}")
    sparse_dim, nnz = indices.shape
    if sparse_dim > len(size) or values.ndim < 1 or values.size(0) != nnz:
        raise StorageError(f"sparse COO: indices {tuple(indices.shape)} do not match "
                           f"values {tuple(values.shape)} and size {size}")
    if nnz:
        idx = indices.numpy()
        low, high = idx.min(axis=1), idx.max(axis=1)
        for d in range(sparse_dim):
            if low[d] < 0 or high[d] >= size[d]:
                raise StorageError(f"sparse COO index out of range in dim {d}: "
                                   f"[{low[d]}, {high[d]}] for size {size[d]}")


def _check_compressed(layout: str, compressed: Tensor, plain: Tensor, values: Tensor,
                      size: tuple[int, ...]) -> None:
    if compressed.ndim != 1 or plain.ndim != 1 or len(size) < 2:
        raise UnsupportedFeatureError(f"batched {layout} tensors")
    rows, cols = (size[-2], size[-1]) if layout in ("sparse_csr", "sparse_bsr") else \
        (size[-1], size[-2])
    if layout in ("sparse_bsr", "sparse_bsc"):
        if values.ndim < 3:
            raise StorageError(f"{layout} values must be blocks, got {tuple(values.shape)}")
        block = values.shape[1:3] if layout == "sparse_bsr" else values.shape[2:0:-1]
        rows, cols = rows // max(1, block[0]), cols // max(1, block[1])
    ci, pi = compressed.numpy(), plain.numpy()
    nnz = pi.shape[0]
    if ci.shape[0] != rows + 1 or (ci.size and (ci[0] != 0 or ci[-1] != nnz)) \
            or (ci.size > 1 and (ci[1:] < ci[:-1]).any()):
        raise StorageError(f"{layout}: compressed indices are not a valid index pointer")
    if nnz and (pi.min() < 0 or pi.max() >= cols):
        raise StorageError(f"{layout}: plain index out of range for {cols} columns")
    if values.size(0) != nnz:
        raise StorageError(f"{layout}: {values.size(0)} values for {nnz} indices")


def rebuild_sparse_tensor(layout: object, data: object) -> SparseTensor:
    """``torch._utils._rebuild_sparse_tensor``: COO and compressed layouts, indices checked."""
    if not isinstance(layout, Layout) or not isinstance(data, tuple):
        raise _fail("sparse tensor", (layout, data))
    if layout.name == "sparse_coo" and len(data) in (3, 4):
        indices, values, size = data[:3]
        coalesced = data[3] if len(data) == 4 else None
        if not isinstance(indices, Tensor) or not isinstance(values, Tensor):
            raise _fail("sparse COO parts", data)
        shape = _ints(size, "sparse size")
        _check_coo(indices, values, shape)
        return SparseTensor(layout.name, shape, values, indices=indices,
                            is_coalesced=None if coalesced is None else bool(coalesced))
    if layout.name in ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc") and len(data) == 4:
        compressed, plain, values, size = data
        if not all(isinstance(t, Tensor) for t in (compressed, plain, values)):
            raise _fail("compressed sparse parts", data)
        shape = _ints(size, "sparse size")
        _check_compressed(layout.name, compressed, plain, values, shape)
        return SparseTensor(layout.name, shape, values, compressed_indices=compressed,
                            plain_indices=plain)
    raise UnsupportedFeatureError(f"sparse layout {layout!r}")


def rebuild_meta_tensor_no_storage(dtype: object, size: object, stride: object,
                                   requires_grad: object) -> Tensor:
    """``torch._utils._rebuild_meta_tensor_no_storage``: shape and dtype, no data."""
    if not isinstance(dtype, DType):
        raise _fail("meta tensor dtype", dtype)
    shape, strides = _ints(size, "size"), _ints(stride, "stride")
    if len(shape) != len(strides):
        raise StorageError(f"size {shape} and stride {strides} differ in length")
    return Tensor(None, 0, shape, strides, dtype=dtype, requires_grad=bool(requires_grad))


def rebuild_device_tensor_from_cpu_tensor(data: object, dtype: object, device: object,
                                          requires_grad: object) -> Tensor:
    """``_rebuild_device_tensor_from_cpu_tensor``: the CPU copy, tagged with its device."""
    if not isinstance(data, Tensor) or not isinstance(device, str):
        raise _fail("device tensor", data)
    data.requires_grad = bool(requires_grad)
    data.type_name = f"device:{device}"
    return data


def rebuild_wrapper_subclass(cls: object, dtype: object, size: object, stride: object,
                             storage_offset: object, layout: object, device: object,
                             requires_grad: object) -> Tensor:
    """``_rebuild_wrapper_subclass``: a data-less tensor (e.g. a FakeTensor) as shape and dtype."""
    tensor = rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)
    tensor._offset = _int(storage_offset, "storage_offset")
    tensor.type_name = f"wrapper:{device}"
    return tensor


def rebuild_unsupported(*args: object) -> Any:
    """Allowlisted by torch, but needs pieces ptfile cannot represent (nested, numpy-backed)."""
    raise UnsupportedFeatureError(
        "nested tensors and numpy-backed device tensors are not supported by ptfile yet"
    )


def _rebuild_function(func: object) -> Callable[..., Any] | None:
    """The allowlisted tensor rebuilder ``func`` is, or None: the allowlist's functions come
    wrapped against ``BUILD`` (a :class:`functools.partial`), a load's fast constructors
    name their reference function as ``__wrapped__`` (:func:`functools.wraps`' attribute)."""
    inner = func.func if isinstance(func, functools.partial) else func
    if isinstance(inner, types.FunctionType):
        inner = getattr(inner, "__wrapped__", inner)
    return next((fn for fn in _REBUILD_FUNCTIONS if fn is inner), None)


def check_state(state: object) -> dict[str, Any] | tuple[Any, Any] | None:
    """A tensor's Python state as ``torch._utils._set_obj_state`` takes it: ``None``, the
    ``__dict__`` (str keys), or ``(__dict__ or None, slot values or None)``.

    Raises
    ------
    PickleStreamError
        Anything else (torch: ``Invalid serialized state``, or a failing ``setattr``).
    """
    parts = state if type(state) is tuple else (state,)
    if len(parts) not in (1, 2) or (type(state) is tuple and len(parts) != 2) or any(
            part is not None and (not isinstance(part, dict)
                                  or any(type(key) is not str for key in part))
            for part in parts):
        raise _fail("tensor Python state", state)
    return state  # type: ignore[return-value]


def rebuild_from_type_v2(func: object, new_type: object, args: object, state: object) -> Any:
    """``torch._tensor._rebuild_from_type_v2``: a tensor with Python attributes or a subclass.

    The attributes are kept as :attr:`Tensor.python_state`, as the pickle holds them
    (:attr:`Tensor.attributes` reads them); they are recorded, never set on anything.
    """
    function = _rebuild_function(func)
    if function is None or not isinstance(args, tuple):
        raise _fail("_rebuild_from_type_v2 function", func)
    if not isinstance(new_type, (TensorType, type)):
        raise _fail("_rebuild_from_type_v2 type", new_type)
    state = check_state(state)
    result = func(*args)  # type: ignore[operator]
    if isinstance(result, Tensor):
        result.type_name = f"{new_type.module}.{new_type.name}" \
            if isinstance(new_type, TensorType) else "torch.nn.parameter.Parameter"
        result.python_state = state
    return result


def torch_size(sizes: object = ()) -> Size:
    """``torch.Size``."""
    return Size(_ints(sizes, "torch.Size"))


def torch_device(type: object, index: object = None) -> Device:
    """``torch.device``."""
    if not isinstance(type, str) or (index is not None and type_of_int(index)):
        raise _fail("torch.device", (type, index))
    return Device(type, index)  # type: ignore[arg-type]


def type_of_int(value: object) -> bool:
    """True when ``value`` is not a plain int (helper for argument checks)."""
    return type(value) is not int


def get_layout(name: object) -> Layout:
    """``torch.serialization._get_layout``."""
    if not isinstance(name, str) or not name.startswith("torch."):
        raise _fail("layout name", name)
    return Layout(name[len("torch."):])


def codecs_encode(obj: object, encoding: object = "utf-8", errors: object = "strict") -> bytes:
    """``_codecs.encode`` restricted to the text codecs pickle uses for bytes."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii") \
            or not isinstance(errors, str):
        raise _fail("_codecs.encode", (obj, encoding))
    return codecs.encode(obj, str(encoding), errors)


def safe_bytearray(source: object = b"", *args: object) -> bytearray:
    """``builtins.bytearray`` of bytes/str only: ``bytearray(2**33)`` would allocate 8 GiB."""
    if not isinstance(source, (bytes, bytearray, str, list)):
        raise _fail("bytearray", source)
    if isinstance(source, list) and any(type(v) is not int for v in source):
        raise _fail("bytearray", source)
    return bytearray(source, *args)  # type: ignore[arg-type]


def safe_set(items: object = ()) -> set[Any]:
    """``builtins.set`` of a list/tuple."""
    if not isinstance(items, (list, tuple)):
        raise _fail("set", items)
    return set(items)


def safe_complex(real: object = 0.0, imag: object = 0.0) -> complex:
    """``builtins.complex`` of two numbers."""
    if not isinstance(real, (int, float)) or not isinstance(imag, (int, float)):
        raise _fail("complex", (real, imag))
    return complex(real, imag)


def safe_ordered_dict(items: object = ()) -> OrderedDict[Any, Any]:
    """``collections.OrderedDict`` (empty, or from a list of pairs)."""
    if items == ():
        return OrderedDict()  # every tensor's backward_hooks: the hot path
    if not isinstance(items, (list, tuple, dict)):
        raise _fail("OrderedDict", items)
    return OrderedDict(items)


def safe_counter(items: object = None) -> Counter[Any]:
    """``collections.Counter`` from a dict."""
    if items is not None and not isinstance(items, dict):
        raise _fail("Counter", items)
    return Counter(items or {})


_REBUILD_FUNCTIONS: Final[dict[Callable[..., Any], str]] = {
    rebuild_tensor: "_rebuild_tensor",
    rebuild_tensor_v2: "_rebuild_tensor_v2",
    rebuild_tensor_v3: "_rebuild_tensor_v3",
    rebuild_parameter: "_rebuild_parameter",
    rebuild_parameter_with_state: "_rebuild_parameter_with_state",
    rebuild_qtensor: "_rebuild_qtensor",
    rebuild_sparse_tensor: "_rebuild_sparse_tensor",
    rebuild_meta_tensor_no_storage: "_rebuild_meta_tensor_no_storage",
    rebuild_device_tensor_from_cpu_tensor: "_rebuild_device_tensor_from_cpu_tensor",
    rebuild_wrapper_subclass: "_rebuild_wrapper_subclass",
}

_STORAGE_NAMES: Final = [d.storage for d in dtypes.DTYPES.values() if d.storage]
_CUDA_STORAGE_NAMES: Final = [n for n in _STORAGE_NAMES if not n.startswith("Q")]
_TENSOR_NAMES: Final = ["BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int",
                        "Long", "Short"]
_QSCHEMES: Final = ["per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                    "per_channel_symmetric", "per_channel_affine_float_qparams"]


def _table() -> dict[tuple[str, str], Any]:
    table: dict[tuple[str, str], Any] = {
        ("torch._utils", name): fn for fn, name in _REBUILD_FUNCTIONS.items()
    }
    table.update({
        ("torch._utils", "_rebuild_nested_tensor"): rebuild_unsupported,
        ("torch._utils", "_rebuild_device_tensor_from_numpy"): rebuild_unsupported,
        ("torch._tensor", "_rebuild_from_type_v2"): rebuild_from_type_v2,
        ("torch", "Size"): torch_size,
        ("torch", "device"): torch_device,
        ("torch", "Tensor"): TensorType("torch", "Tensor"),
        ("torch.nn.parameter", "Parameter"): TensorType("torch.nn.parameter", "Parameter"),
        ("torch.serialization", "_get_layout"): get_layout,
        ("_codecs", "encode"): codecs_encode,
        ("builtins", "bytearray"): safe_bytearray,
        ("builtins", "set"): safe_set,
        ("builtins", "complex"): safe_complex,
        ("collections", "OrderedDict"): safe_ordered_dict,
        ("collections", "Counter"): safe_counter,
        ("torch.storage", "UntypedStorage"): StorageType("torch.storage", "UntypedStorage", None),
        ("torch.storage", "TypedStorage"): StorageType("torch.storage", "TypedStorage", None),
    })
    table.update({("torch", d.name): d for d in dtypes.DTYPES.values()})
    table.update({("torch", q): QScheme(q) for q in _QSCHEMES})
    for name in _STORAGE_NAMES:
        table["torch", name] = StorageType("torch", name, dtypes.by_storage(name))
    for name in _CUDA_STORAGE_NAMES:
        table["torch.cuda", name] = StorageType("torch.cuda", name, dtypes.by_storage(name))
    for module in ("torch", "torch.cuda"):
        for name in _TENSOR_NAMES:
            table[module, f"{name}Tensor"] = TensorType(module, f"{name}Tensor")
    for module in ("torch.sparse", "torch.cuda.sparse"):
        for name in _TENSOR_NAMES:
            if name != "Bool":
                table[module, f"{name}Tensor"] = TensorType(module, f"{name}Tensor")
    return table


#: ``(module, name)`` → the ptfile stand-in, for exactly torch 2.13's default allowlist.
SAFE_GLOBALS: Final[dict[tuple[str, str], Any]] = _table()

#: Python 2 module names, mapped before the lookup (as pickle's fix_imports does).
PY2_MODULES: Final = {"__builtin__": "builtins", "copy_reg": "copyreg"}


def lookup(module: str, name: str) -> Any:
    """The stand-in for ``module.name``, or None when it is not allowlisted."""
    module = PY2_MODULES.get(module, module)
    return SAFE_GLOBALS.get((module, name))
