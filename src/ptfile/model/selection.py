"""Basic numpy indexing on a strided view, and the bytes a selection needs.

:func:`select` applies ints, slices, ``...`` and ``None`` to ``(offset, shape,
stride)`` (in elements), as numpy's basic indexing does; :func:`span` is the
first and one-past-last element a view touches; :func:`runs` splits a
selection into its contiguous runs, so a reader that fetches bytes on demand
(a remote file) asks for exactly the selected bytes.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["expand", "runs", "select", "span"]


def span(offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, int]:
    """First and one-past-last element a view touches (strides may be negative)."""
    low = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s < 0)
    high = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s > 0) + 1
    return low, high


def expand(key: object, ndim: int) -> list[object]:
    """A basic numpy index as one entry per dimension (``...`` and missing trailing
    dimensions become full slices; ``None`` entries are kept).

    Examples
    --------
    >>> expand((1, ..., None), 3)
    [1, slice(None, None, None), slice(None, None, None), None]
    """
    keys = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in keys) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    fill = ndim - sum(k is not None and k is not Ellipsis for k in keys)
    if fill < 0:
        raise IndexError(f"too many indices for a tensor of {ndim} dimensions")
    expanded: list[object] = []
    for k in keys:
        expanded.extend([slice(None)] * fill if k is Ellipsis else [k])
    if Ellipsis not in keys:
        expanded.extend([slice(None)] * fill)
    return expanded


def select(key: object, shape: tuple[int, ...], stride: tuple[int, ...],
            offset: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Apply a basic numpy index (ints, slices, ``...``, ``None``) to a strided view."""
    new_shape: list[int] = []
    new_stride: list[int] = []
    dim = 0
    for k in expand(key, len(shape)):
        if k is None:
            new_shape.append(1)
            new_stride.append(0)
            continue
        n, s = shape[dim], stride[dim]
        dim += 1
        if isinstance(k, slice):
            start, _, step = k.indices(n)
            new_shape.append(len(range(*k.indices(n))))
            new_stride.append(s * step)
            offset += start * s if new_shape[-1] else 0
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k) + n if int(k) < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for size {n}")
            offset += i * s
        else:
            raise TypeError(f"only ints, slices, ... and None index a TensorSlice, got {k!r}")
    return offset, tuple(new_shape), tuple(new_stride)


def runs(offset: int, shape: tuple[int, ...], stride: tuple[int, ...],
         max_runs: int) -> tuple[np.ndarray, int] | None:
    """The contiguous runs of a view in C order: each run's first element, and the
    elements per run; None when there are more than ``max_runs`` runs.

    Examples
    --------
    >>> starts, n = runs(5, (3, 2), (10, 1), 8)   # rows of 2 at 5, 15, 25
    >>> starts.tolist(), n
    ([5, 15, 25], 2)
    """
    dims = [(n, s) for n, s in zip(shape, stride, strict=True) if n != 1]
    length, k = 1, len(dims)
    while k and dims[k - 1][1] == length:  # the C-contiguous suffix
        k -= 1
        length *= dims[k][0]
    count = math.prod(n for n, _ in dims[:k])
    if count > max_runs:
        return None
    starts = np.full(1, offset, np.int64)
    for n, s in dims[:k]:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).reshape(-1)
    return starts, length
