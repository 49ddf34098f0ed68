"""Numpy values as data: inert rebuilders for the numpy globals training checkpoints name.

Training checkpoints hold numpy values: Hugging Face Trainer's ``rng_state.pth`` is
``torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu":
torch.get_rng_state(), ...})``, Lightning's ``hyper_parameters`` may hold numpy scalars
and arrays, and a DCP checkpoint may hold ``np.random.get_state()`` as an item.  numpy
(1.x and 2.x alike, protocol 2 as ``torch.save`` writes) pickles them so:

==========================  ==================================================================
value                       pickle
==========================  ==================================================================
``np.dtype``                ``numpy.dtype(descr, False, True)`` (``descr``: ``'f8'``,
                            ``'b1'``, ``'U3'``, ``'M8'``…), then ``BUILD (3, byteorder,
                            subarray, names, fields, elsize, alignment, flags)``; version 4
                            adds the datetime metadata ``(None, (unit, count, 1, 1))``
                            (numpy 1.x to 2.2 write ``{}``, an empty metadata dict, for
                            that ``None``)
``np.ndarray``              ``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,),
                            b'b')`` (numpy 1.x: ``numpy.core.multiarray``), then ``BUILD
                            (1, shape, dtype, is_fortran, rawdata)``; ``rawdata`` is the
                            elements' bytes in C or (``is_fortran``) Fortran order
``np.float64(1.5)`` …       ``numpy._core.multiarray.scalar(dtype, bytes)``
``np.random.get_state()``   a plain tuple ``('MT19937', uint32 array (624,), pos,
                            has_gauss, cached_gaussian)``: no global of its own
``b""`` (empty data)        ``__builtin__.bytes()`` (protocol 2 pickles other bytes
                            through ``_codecs.encode``, which torch allows)
==========================  ==================================================================

``torch.load(weights_only=True)`` refuses these until the user allowlists numpy's
``_reconstruct``, ``ndarray`` and ``dtype`` (``scalar`` for scalars), and, because its
``BUILD`` only sets the state of allowlisted types, the class of each dtype in the file
(``numpy.dtypes.UInt32DType`` for an RNG state, ``Float64DType``…), and ``bytes``
for an empty array.  It then runs
numpy's own ``ndarray.__setstate__`` on the file's bytes.

:data:`NUMPY_GLOBALS` (``ptfile.NUMPY_GLOBALS``, for :func:`ptfile.safe_globals`) maps
those names to this module's rebuilders instead, which never call numpy's pickle code
(``_reconstruct``, ``scalar``, ``ndarray.__setstate__``, ``dtype.__setstate__``): they
check every argument and build the value themselves from (shape, dtype, bytes).

* A dtype MUST be one of ``b1``, ``i``/``u`` of 1, 2, 4, 8 bytes, ``f2``/``f4``/``f8``,
  ``c8``/``c16`` (and ``f``/``c`` of numpy's ``longdouble`` size), ``S<n>``, ``U<n>``,
  ``M8``/``m8`` with one of numpy's units; its byte order ``<``, ``>``, ``|`` or ``=``;
  with no subarray, names or fields.  Object dtypes (``O``: arbitrary Python objects)
  raise :class:`~ptfile.errors.UnsafeGlobalError`; structured and void dtypes raise
  :class:`~ptfile.errors.UnsupportedFeatureError`.
* An array's shape is a tuple of non-negative ints, at most ``Limits.max_ndim`` of them;
  the product of the shape and the item size MUST equal the length of ``rawdata``
  (``bytes``), which the pickle holds (so ``Limits.max_pickle_bytes`` bounds it): a huge
  shape over few bytes is a :class:`~ptfile.errors.StorageError` before anything is
  allocated.  The array is a copy of those bytes (writable, aligned), Fortran-ordered
  when ``is_fortran`` says so, in native byte order (a big-endian array's values are
  swapped, as numpy's own ``__setstate__`` does; a dtype on its own keeps its order).
* A scalar's bytes MUST be exactly its dtype's item size.

What comes back is what ``torch.load`` returns once numpy is allowlisted (and with
``weights_only=False``): ``np.ndarray``, numpy scalars (``np.float64``…), ``np.dtype``,
and the RNG state as the plain tuple holding a ``uint32`` array.  Arrays and dtypes are
finished after the pickle is read (:mod:`ptfile.picklevm.deferred`): ``BUILD`` works in
place, so the stream first holds a placeholder whose ``__setstate__`` checks the state
and makes the value.  A pickled ``np.random.RandomState`` *object*
(``numpy.random._pickle.__randomstate_ctor``) and protocol-5 out-of-band arrays
(``numpy._core.numeric._frombuffer``; ``torch.load(weights_only=True)`` cannot read
protocol 5) are not covered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import numpy as np

from ..errors import (
    FormatError,
    PickleStreamError,
    StorageError,
    UnsafeGlobalError,
    UnsupportedFeatureError,
    brief,
)
from ..model.tensor import Storage, Tensor, check_rank
from ..picklevm.deferred import defer, enter_only

__all__ = ["NDARRAY", "NUMPY_REBUILDERS", "empty_bytes", "make_dtype", "reconstruct", "scalar"]

# A big state dict holds 10^5 of these: the walk that puts arrays in place enters only
# where a tensor can hold a pickled value, and never a storage.
enter_only(Tensor, "backward_hooks", "metadata", "python_state")
enter_only(Storage)

_DESCR: Final = re.compile(r"([a-zA-Z])(\d+)")
_LONG: Final = np.dtype(np.longdouble).itemsize
#: Item sizes numpy's descriptor strings may give, per kind (``S``/``U``: any count).
_SIZES: Final[Mapping[str, frozenset[int]]] = {
    "b": frozenset({1}),
    "i": frozenset({1, 2, 4, 8}),
    "u": frozenset({1, 2, 4, 8}),
    "f": frozenset({2, 4, 8, _LONG}),
    "c": frozenset({8, 16, 2 * _LONG}),
    "M": frozenset({8}),
    "m": frozenset({8}),
}
#: The units of datetime64/timedelta64 (numpy's ``datetime_strings``).
_UNITS: Final = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps",
                           "fs", "as", "generic"})
_BYTEORDERS: Final = frozenset({"<", ">", "|", "="})
#: numpy's ``NPY_MAX_INT``: no item size (``S<n>``, ``U<n>``) reaches it.  A fact of
#: numpy, not a ceiling (what an array may cost is bounded by its pickle's size).
_MAX_ITEMSIZE: Final = 2**31 - 1


def _fail(what: str, value: object) -> PickleStreamError:
    return PickleStreamError(f"numpy {what}: unexpected {type(value).__name__} {brief(value, 80)}")


class _NDArrayType:
    """What ``numpy.ndarray`` resolves to: a marker ``_reconstruct`` accepts, nothing more
    (not callable; no ``__dict__``, so ``BUILD`` on it fails)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<class 'numpy.ndarray'>"


#: The stand-in for ``numpy.ndarray``: the only ``subtype`` :func:`reconstruct` takes.
NDARRAY: Final = _NDArrayType()


def _parse_descr(descr: object) -> tuple[str, int]:
    """``'f8'`` → ``('f', 8)``; ``'U3'`` → ``('U', 3)``; checked against the table."""
    if isinstance(descr, bytes):
        descr = descr.decode("latin1")
    if not isinstance(descr, str) or not (match := _DESCR.fullmatch(descr)):
        raise _fail("dtype descriptor", descr)
    kind, count = match.group(1), int(match.group(2))
    if kind == "O":
        raise UnsafeGlobalError("a numpy object dtype (arrays of arbitrary Python objects) "
                                "is not data: ptfile.NUMPY_GLOBALS refuses it",
                                module="numpy", name="dtype")
    if kind == "V":
        raise UnsupportedFeatureError(f"numpy void or structured dtype {descr!r}: "
                                      "ptfile.NUMPY_GLOBALS reads plain dtypes only")
    itemsize = count * 4 if kind == "U" else count
    allowed = _SIZES.get(kind)
    if (allowed is None and kind not in "SU") or (allowed is not None and count not in allowed) \
            or not 0 < itemsize <= _MAX_ITEMSIZE:
        raise UnsupportedFeatureError(f"numpy dtype {descr!r} is not one ptfile reads")
    return kind, count


def _check_no_metadata(metadata: object) -> None:
    """A dtype's own ``metadata`` dict MUST be absent: ``None`` (numpy 2.4) or ``{}`` (numpy
    1.x to 2.2 pickle a datetime dtype without metadata so)."""
    if metadata is None or (type(metadata) is dict and not metadata):
        return
    if type(metadata) is dict:
        raise UnsupportedFeatureError(f"numpy dtype metadata {brief(metadata, 80)}: "
                                      "ptfile.NUMPY_GLOBALS reads plain dtypes only")
    raise _fail("dtype metadata", metadata)


def _unit(kind: str, metadata: object) -> str:
    """A datetime dtype's ``[unit]`` suffix from its version-4 metadata."""
    if kind not in "Mm":
        _check_no_metadata(metadata)
        return ""
    if not (isinstance(metadata, tuple) and len(metadata) == 2
            and isinstance(metadata[1], tuple) and len(metadata[1]) == 4):
        raise _fail("datetime metadata", metadata)
    _check_no_metadata(metadata[0])
    unit, count, denominator, events = metadata[1]
    unit = unit.decode("utf-8", "replace") if isinstance(unit, bytes) else unit
    if unit not in _UNITS or type(count) is not int or not 0 < count < 2**31 \
            or (denominator, events) != (1, 1):
        raise _fail("datetime unit", metadata[1])
    return f"[{unit}]" if count == 1 else f"[{count}{unit}]"


class _DTypeState:
    """``numpy.dtype(descr, align, copy)``: the descriptor, until ``BUILD`` gives the byte
    order (a placeholder: :meth:`finish` is the ``np.dtype``)."""

    __slots__ = ("_dtype", "_kind", "_size")

    def __init__(self, kind: str, size: int) -> None:
        self._kind, self._size = kind, size
        self._dtype: np.dtype[Any] | None = None

    def __setstate__(self, state: object) -> None:
        if self._dtype is not None:
            raise PickleStreamError("a numpy dtype is BUILT twice")
        if not isinstance(state, tuple) or len(state) not in (8, 9) \
                or state[0] != len(state) - 5:
            raise _fail("dtype state", state)
        _, order, subarray, names, fields, elsize, alignment, flags = state[:8]
        if order not in _BYTEORDERS or type(elsize) is not int or type(alignment) is not int \
                or type(flags) is not int:
            raise _fail("dtype state", state)
        if (subarray, names, fields) != (None, None, None):
            raise UnsupportedFeatureError("a numpy structured or subarray dtype: "
                                          "ptfile.NUMPY_GLOBALS reads plain dtypes only")
        unit = _unit(self._kind, state[8] if len(state) == 9 else None)
        dtype = np.dtype(f"{'' if order in '|=' else order}{self._kind}{self._size}{unit}")
        if elsize not in (-1, dtype.itemsize):
            raise _fail("dtype item size", elsize)
        self._dtype = dtype

    def finish(self) -> np.dtype[Any]:
        """The dtype (native byte order when the pickle gave no state)."""
        if self._dtype is None:
            self._dtype = np.dtype(f"{self._kind}{self._size}")
        return self._dtype

    def __repr__(self) -> str:
        return f"<numpy dtype {self._kind}{self._size} being read>"


def make_dtype(descr: object, align: object = False, copy: object = True) -> _DTypeState:
    """``numpy.dtype(descr, align, copy)`` as numpy's pickles call it.

    Raises
    ------
    PickleStreamError
        ``descr`` is not a descriptor string, or ``align``/``copy`` not bools.
    UnsafeGlobalError
        An object dtype.
    UnsupportedFeatureError
        A void, structured or unknown dtype.
    """
    if type(align) is not bool or type(copy) is not bool:
        raise _fail("dtype arguments", (align, copy))
    made = _DTypeState(*_parse_descr(descr))
    defer(made)
    return made


def _checked_dtype(dtype: object) -> np.dtype[Any]:
    if isinstance(dtype, _DTypeState):
        return dtype.finish()
    raise _fail("dtype", dtype)


class _ArrayState:
    """``_reconstruct(ndarray, (0,), b'b')``: a placeholder whose ``BUILD`` makes the array
    from the checked ``(1, shape, dtype, is_fortran, rawdata)``; :meth:`finish` is it."""

    __slots__ = ("_array",)

    def __init__(self) -> None:
        self._array: np.ndarray[Any, Any] | None = None

    def __setstate__(self, state: object) -> None:
        if self._array is not None:
            raise PickleStreamError("a numpy array is BUILT twice")
        if not isinstance(state, tuple) or len(state) != 5 or state[0] != 1:
            raise _fail("array state", state)
        _, shape, dtype, is_fortran, rawdata = state
        if type(shape) is not tuple or any(type(n) is not int or not 0 <= n < 2**63
                                           for n in shape):
            raise _fail("array shape", shape)
        check_rank(len(shape), "rank of a numpy array")
        dt = _checked_dtype(dtype)
        if type(is_fortran) is not bool:
            raise _fail("array order", is_fortran)
        if not isinstance(rawdata, (bytes, bytearray)):
            raise _fail("array data", rawdata)
        count = math.prod(shape)
        if count * dt.itemsize != len(rawdata):
            raise StorageError(f"a numpy array of shape {shape} and dtype {dt} needs "
                               f"{count * dt.itemsize} bytes, its data has {len(rawdata)}")
        data = bytearray(rawdata)  # the array's own, writable copy
        if not dt.isnative:  # numpy's __setstate__ swaps to native order too
            np.frombuffer(data, dt, count).byteswap(inplace=True)
            dt = dt.newbyteorder("=")
        try:
            self._array = np.ndarray(shape, dt, data, order="F" if is_fortran else "C")
        except ValueError as exc:  # a zero-size shape whose other dimensions overflow
            raise StorageError(f"a numpy array of shape {shape}: {exc}") from exc

    def finish(self) -> np.ndarray[Any, Any]:
        """The array.

        Raises
        ------
        FormatError
            The pickle never gave the array its state.
        """
        if self._array is None:
            raise FormatError("a numpy array (_reconstruct) was never given its state (BUILD)")
        return self._array

    def __repr__(self) -> str:
        return "<numpy array being read>"


def reconstruct(subtype: object, shape: object, typecode: object) -> _ArrayState:
    """``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')``: what numpy's
    ``ndarray.__reduce__`` always writes; the array comes from the ``BUILD`` that follows.

    Raises
    ------
    PickleStreamError
        Any other subtype, shape or type code.
    """
    if subtype is not NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise _fail("_reconstruct arguments", (subtype, shape, typecode))
    made = _ArrayState()
    defer(made)
    return made


def scalar(dtype: object, data: object = None) -> np.generic:
    """``numpy._core.multiarray.scalar(dtype, bytes)``: a numpy scalar of the checked dtype.

    Raises
    ------
    PickleStreamError
        Not a dtype of :func:`make_dtype`, or ``data`` not ``bytes``.
    StorageError
        ``data`` is not exactly one item.
    """
    dt = _checked_dtype(dtype)
    if not isinstance(data, (bytes, bytearray)):
        raise _fail("scalar data", data)
    if len(data) != dt.itemsize:
        raise StorageError(f"a numpy {dt} scalar is {dt.itemsize} bytes, its data has "
                           f"{len(data)}")
    value: np.generic = np.frombuffer(data, dt, 1)[0]
    return value


def empty_bytes(*args: object) -> bytes:
    """``builtins.bytes()``: how protocol 2 pickles ``b""`` (an empty array's data).

    Raises
    ------
    PickleStreamError
        Any argument: ``bytes(2**40)`` would allocate a terabyte.
    """
    if args:
        raise _fail("bytes arguments", args)
    return b""


#: ``"module.qualname"`` → rebuilder, for every name numpy 1.x and 2.x pickles these
#: values with (:data:`ptfile.NUMPY_GLOBALS` wraps the functions against ``BUILD``).
NUMPY_REBUILDERS: Final[Mapping[str, Callable[..., Any] | _NDArrayType]] = MappingProxyType({
    "numpy.core.multiarray._reconstruct": reconstruct,
    "numpy._core.multiarray._reconstruct": reconstruct,
    "numpy.core.multiarray.scalar": scalar,
    "numpy._core.multiarray.scalar": scalar,
    "numpy.ndarray": NDARRAY,
    "numpy.dtype": make_dtype,
    "__builtin__.bytes": empty_bytes,
    "builtins.bytes": empty_bytes,
})
