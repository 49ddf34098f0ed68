"""Hypothesis strategies: numpy arrays, strided views of shared bases, nested containers."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

NUMPY_DTYPES = [np.dtype(d) for d in ("float64", "float32", "float16", "int64", "int32", "int16",
                                      "int8", "uint8", "bool", "complex64", "complex128",
                                      "uint16", "uint32", "uint64")]
NUMPY_DTYPES += [np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
                 np.dtype(ml_dtypes.float8_e5m2)]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """An array of any supported dtype, possibly a view (slice, transpose, stride) of a base."""
    dtype = draw(st.sampled_from(NUMPY_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    raw = draw(hnp.arrays(np.uint8, (int(np.prod(shape)) * dtype.itemsize,)))
    if dtype == np.bool_:
        raw = raw & 1  # numpy bools are 0/1 bytes; others are not valid booleans (torch normalises)
    base = raw.view(dtype).reshape(shape)
    kind = draw(st.sampled_from(["plain", "transpose", "slice", "step"]))
    if kind == "transpose" and base.ndim >= 2:
        return base.T
    if kind == "slice" and base.ndim >= 1 and base.shape[0] > 1:
        return base[1:]
    if kind == "step" and base.ndim >= 1:
        return base[::2]
    return base


keys = st.text(min_size=0, max_size=8)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=10) | st.binary(min_size=1, max_size=10)


def containers(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nested dicts/OrderedDicts/lists/tuples over ``leaves``."""
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(keys, children, max_size=4)
        | st.dictionaries(keys, children, max_size=4).map(OrderedDict),
        max_leaves=10,
    )


@st.composite
def shared_views(draw: st.DrawFn) -> list[np.ndarray]:
    """Several views of one base buffer."""
    base = draw(arrays())
    flat = base.reshape(-1) if base.flags.c_contiguous else np.ascontiguousarray(base).reshape(-1)
    picks = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(1, 3)),
                          min_size=1, max_size=4))
    return [flat, *(flat[a:b:s] for a, b, s in picks)]
