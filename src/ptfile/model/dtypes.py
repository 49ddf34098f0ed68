"""torch's dtypes as data: one table, and nothing that needs torch.

Each row names a torch dtype and everything the formats need to know about it:

* ``itemsize`` — bytes per element as torch counts them (sub-byte packed types
  such as ``quint4x2`` or ``float4_e2m1fn_x2`` count one byte per element);
* ``numpy`` — the numpy dtype that holds the bytes exactly (``ml_dtypes`` for
  bfloat16 and the float8 family), or ``None`` where numpy has no equivalent
  (complex32, bits*, sub-byte types);
* ``storage`` — the legacy typed-storage class torch.save names in the
  persistent id (``FloatStorage``…), or ``None`` for dtypes torch.save writes
  through ``UntypedStorage`` and ``_rebuild_tensor_v3`` ("v3" dtypes);
* ``scalar_type`` — c10's ScalarType name; TorchScript names every storage
  ``<scalar_type>Storage``;
* ``swap`` — the unit that byte order applies to (complex types swap each
  half; packed and byte-sized types don't swap).

``DType`` objects print like torch's (``torch.float32``) and compare by name.

``ml_dtypes`` (bfloat16, float8) is imported the first time such a dtype's
``numpy`` is asked for, not with this module: importing it takes about half a
second, which a command that never meets a bfloat16 tensor (``ptfile --help``,
most scans) should not pay.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from ..errors import UnsupportedFeatureError

__all__ = [
    "DTYPES",
    "SAFETENSORS_CODES",
    "DType",
    "by_name",
    "by_storage",
    "from_numpy",
]


@dataclass(frozen=True, slots=True)
class DType:
    """A torch dtype, torch-free.  ``repr`` and ``str`` are torch's (``torch.float32``)."""

    name: str
    itemsize: int
    #: The numpy dtype, or the name of an ``ml_dtypes`` type (resolved by :attr:`numpy`).
    numpy_spec: np.dtype | str | None = field(compare=False, repr=False)
    storage: str | None = field(compare=False)
    scalar_type: str = field(compare=False)
    swap: int = field(compare=False)
    is_quantized: bool = field(default=False, compare=False)

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__

    @property
    def numpy(self) -> np.dtype | None:
        """The numpy dtype that holds the bytes exactly, or None (``ml_dtypes`` is imported
        on the first bfloat16 or float8 dtype asked for)."""
        spec = self.numpy_spec
        return spec if not isinstance(spec, str) else _ml_dtype(spec)

    @property
    def is_v3(self) -> bool:
        """True for dtypes torch.save writes via UntypedStorage and _rebuild_tensor_v3."""
        return self.storage is None

    @property
    def is_floating_point(self) -> bool:
        """True for the float dtypes (torch's ``dtype.is_floating_point``)."""
        return self.name.startswith(("float", "bfloat"))

    @property
    def is_complex(self) -> bool:
        """True for the complex dtypes."""
        return self.name.startswith("complex")

    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of this dtype's elements, or UnsupportedFeatureError."""
        if self.numpy is None:
            raise UnsupportedFeatureError(
                f"{self!r} has no numpy equivalent; its raw bytes are available as "
                "Tensor.raw_bytes() / Storage.bytes()"
            )
        return self.numpy


def _np(x: object) -> np.dtype:
    return np.dtype(x)  # type: ignore[call-overload, no-any-return]


@functools.cache
def _ml_dtype(name: str) -> np.dtype:
    """``ml_dtypes.<name>`` as a numpy dtype, importing ml_dtypes on first use."""
    return _np(getattr(importlib.import_module("ml_dtypes"), name))


# name, itemsize, numpy (or an ml_dtypes name), legacy storage class, ScalarType,
# byte-swap unit, quantized
_ROWS: Final[tuple[tuple[str, int, np.dtype | str | None, str | None, str, int, bool], ...]] = (
    ("float64", 8, _np("<f8"), "DoubleStorage", "Double", 8, False),
    ("float32", 4, _np("<f4"), "FloatStorage", "Float", 4, False),
    ("float16", 2, _np("<f2"), "HalfStorage", "Half", 2, False),
    ("bfloat16", 2, "bfloat16", "BFloat16Storage", "BFloat16", 2, False),
    ("int64", 8, _np("<i8"), "LongStorage", "Long", 8, False),
    ("int32", 4, _np("<i4"), "IntStorage", "Int", 4, False),
    ("int16", 2, _np("<i2"), "ShortStorage", "Short", 2, False),
    ("int8", 1, _np("i1"), "CharStorage", "Char", 1, False),
    ("uint8", 1, _np("u1"), "ByteStorage", "Byte", 1, False),
    ("bool", 1, _np("?"), "BoolStorage", "Bool", 1, False),
    ("complex128", 16, _np("<c16"), "ComplexDoubleStorage", "ComplexDouble", 8, False),
    ("complex64", 8, _np("<c8"), "ComplexFloatStorage", "ComplexFloat", 4, False),
    ("qint8", 1, _np("i1"), "QInt8Storage", "QInt8", 1, True),
    ("qint32", 4, _np("<i4"), "QInt32Storage", "QInt32", 4, True),
    ("quint8", 1, _np("u1"), "QUInt8Storage", "QUInt8", 1, True),
    ("quint4x2", 1, _np("u1"), "QUInt4x2Storage", "QUInt4x2", 1, True),
    ("quint2x4", 1, _np("u1"), "QUInt2x4Storage", "QUInt2x4", 1, True),
    ("uint16", 2, _np("<u2"), None, "UInt16", 2, False),
    ("uint32", 4, _np("<u4"), None, "UInt32", 4, False),
    ("uint64", 8, _np("<u8"), None, "UInt64", 8, False),
    ("complex32", 4, None, None, "ComplexHalf", 2, False),
    ("float8_e4m3fn", 1, "float8_e4m3fn", None, "Float8_e4m3fn", 1, False),
    ("float8_e4m3fnuz", 1, "float8_e4m3fnuz", None, "Float8_e4m3fnuz", 1, False),
    ("float8_e5m2", 1, "float8_e5m2", None, "Float8_e5m2", 1, False),
    ("float8_e5m2fnuz", 1, "float8_e5m2fnuz", None, "Float8_e5m2fnuz", 1, False),
    ("float8_e8m0fnu", 1, "float8_e8m0fnu", None, "Float8_e8m0fnu", 1, False),
    ("float4_e2m1fn_x2", 1, None, None, "Float4_e2m1fn_x2", 1, False),
    ("bits8", 1, None, None, "Bits8", 1, False),
    ("bits16", 2, None, None, "Bits16", 2, False),
    ("bits1x8", 1, None, None, "Bits1x8", 1, False),
    ("bits2x4", 1, None, None, "Bits2x4", 1, False),
    ("bits4x2", 1, None, None, "Bits4x2", 1, False),
    *((f"int{n}", 1, None, None, f"Int{n}", 1, False) for n in range(1, 8)),
    *((f"uint{n}", 1, None, None, f"UInt{n}", 1, False) for n in range(1, 8)),
)

#: Every torch dtype by canonical name (``torch.float32`` → ``DTYPES["float32"]``).
DTYPES: Final[dict[str, DType]] = {
    row[0]: DType(*row) for row in _ROWS
}

#: Legacy typed-storage class name → element dtype (``FloatStorage`` → float32).
STORAGE_DTYPES: Final[dict[str, DType]] = {
    d.storage: d for d in DTYPES.values() if d.storage is not None
}

#: TorchScript storage names (``<ScalarType>Storage``) → dtype.
SCALAR_TYPE_DTYPES: Final[dict[str, DType]] = {
    f"{d.scalar_type}Storage": d for d in DTYPES.values()
}

#: torch's aliases (``torch.float`` is ``torch.float32``).
ALIASES: Final[dict[str, str]] = {
    "float": "float32", "double": "float64", "half": "float16", "cfloat": "complex64",
    "cdouble": "complex128", "chalf": "complex32", "long": "int64", "int": "int32",
    "short": "int16", "bit": "bits8",
}

@functools.cache
def _numpy_to_dtype() -> dict[np.dtype, DType]:
    """numpy dtype -> torch dtype (built on first use: it resolves the ml_dtypes types)."""
    return {d.numpy: d for d in DTYPES.values() if d.numpy is not None and not d.is_quantized}

UINT8: Final = DTYPES["uint8"]


#: safetensors' dtype code → torch dtype name, for codes of one element per itemsize (the
#: format: :mod:`ptfile.formats.safetensors`).
SAFETENSORS_CODES: Final[dict[str, str]] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "C64": "complex64",
}


def by_name(name: str) -> DType:
    """The dtype called ``name`` (canonical or alias), or UnsupportedFeatureError."""
    try:
        return DTYPES[ALIASES.get(name, name)]
    except KeyError:
        raise UnsupportedFeatureError(f"unknown torch dtype torch.{name}") from None


def by_storage(storage_name: str) -> DType:
    """The element dtype of a legacy storage class (``FloatStorage``) or TorchScript name."""
    dtype = STORAGE_DTYPES.get(storage_name) or SCALAR_TYPE_DTYPES.get(storage_name)
    if dtype is None:
        raise UnsupportedFeatureError(f"unknown storage type torch.{storage_name}")
    return dtype


def from_numpy(dtype: np.dtype) -> DType:
    """The torch dtype for a numpy dtype (native byte order is implied)."""
    key = dtype.newbyteorder("<") if dtype.byteorder in "<>=" and dtype.itemsize > 1 else dtype
    try:
        return _numpy_to_dtype()[key]
    except KeyError:
        raise UnsupportedFeatureError(f"numpy dtype {dtype} has no torch equivalent") from None
