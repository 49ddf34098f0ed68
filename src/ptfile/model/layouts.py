"""Tensors in torch's other layouts, as their parts: a quantized tensor (its integers and
its quantizer) and a sparse tensor (indices and values), as torch's rebuild functions give
them (:mod:`ptfile.allowlist.rebuild`); strided tensors are :mod:`.tensor`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedFeatureError
from .dtypes import DType
from .tensor import Size, Tensor

__all__ = ["QuantizedTensor", "SparseTensor"]


class QuantizedTensor:
    """A quantized tensor as its parts: the integer representation and the quantizer.

    ``int_repr`` is a :class:`Tensor` of the stored integers (dtype qint8/quint8/
    qint32/quint4x2/quint2x4, viewable as int8/uint8/int32); ``qscheme`` is the
    torch name (``per_tensor_affine``…); ``scale``/``zero_point`` for per-tensor
    schemes, ``scales``/``zero_points``/``axis`` (tensors) for per-channel ones.
    """

    __slots__ = ("axis", "backward_hooks", "int_repr", "qscheme", "requires_grad", "scale",
                 "scales", "zero_point", "zero_points")

    def __init__(self, int_repr: Tensor, qscheme: str, *, scale: float | None = None,
                 zero_point: int | None = None, scales: Tensor | None = None,
                 zero_points: Tensor | None = None, axis: int | None = None,
                 requires_grad: bool = False,
                 backward_hooks: OrderedDict[Any, Any] | None = None) -> None:
        self.int_repr = int_repr
        self.qscheme = qscheme
        self.scale, self.zero_point = scale, zero_point
        self.scales, self.zero_points, self.axis = scales, zero_points, axis
        self.requires_grad = requires_grad
        self.backward_hooks = backward_hooks

    @property
    def shape(self) -> Size:
        """The sizes of the quantized tensor."""
        return self.int_repr.shape

    @property
    def dtype(self) -> DType:
        """The quantized dtype (torch.qint8…)."""
        return self.int_repr.dtype

    def dequantize(self) -> np.ndarray:
        """float32 values: ``(q - zero_point) * scale`` (per channel along ``axis``)."""
        q = self.int_repr.numpy().astype(np.float32)
        if self.scales is None:
            values: np.ndarray = (q - np.float32(self.zero_point or 0)) * np.float32(
                self.scale or 1.0)
            return values
        shape = [1] * q.ndim
        shape[self.axis or 0] = -1
        scales = np.asarray(self.scales.numpy(), np.float32).reshape(shape)
        zeros = np.asarray(self.zero_points.numpy(), np.float32).reshape(shape)  # type: ignore[union-attr]
        return (q - zeros) * scales

    def __repr__(self) -> str:
        return f"ptfile.QuantizedTensor(shape={list(self.shape)}, dtype={self.dtype!r}, qscheme={self.qscheme})"


class SparseTensor:
    """A sparse tensor as its parts, indices validated against ``size``.

    ``layout`` is torch's name (``sparse_coo``, ``sparse_csr``, ``sparse_csc``,
    ``sparse_bsr``, ``sparse_bsc``).  COO: ``indices`` (ndim x nnz) and ``values``;
    compressed layouts: ``compressed_indices``, ``plain_indices`` and ``values``.
    """

    __slots__ = ("compressed_indices", "indices", "is_coalesced", "layout", "plain_indices",
                 "size", "values")

    def __init__(self, layout: str, size: Sequence[int], values: Tensor, *,
                 indices: Tensor | None = None, compressed_indices: Tensor | None = None,
                 plain_indices: Tensor | None = None, is_coalesced: bool | None = None) -> None:
        self.layout = layout
        self.size = Size(size)
        self.values = values
        self.indices = indices
        self.compressed_indices = compressed_indices
        self.plain_indices = plain_indices
        self.is_coalesced = is_coalesced

    @property
    def shape(self) -> Size:
        """The dense shape."""
        return self.size

    def to_dense(self) -> np.ndarray:
        """The dense values (COO and CSR only)."""
        values = self.values.numpy()
        out = np.zeros(tuple(self.size), values.dtype)
        if self.layout == "sparse_coo" and self.indices is not None:
            np.add.at(out, tuple(self.indices.numpy()), values)
            return out
        if self.layout == "sparse_csr" and self.compressed_indices is not None:
            crow = self.compressed_indices.numpy()
            col = self.plain_indices.numpy()  # type: ignore[union-attr]
            rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
            np.add.at(out, (rows, col), values)
            return out
        raise UnsupportedFeatureError(f"to_dense for layout {self.layout}")

    def __repr__(self) -> str:
        return f"ptfile.SparseTensor(layout={self.layout}, size={list(self.size)}, nnz={self.values.shape[0] if self.values.ndim else 0})"
