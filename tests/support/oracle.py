"""Compare what ptfile loads with what real torch loads: the test suite's oracle."""

from __future__ import annotations

import io
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

import ptfile


def torch_bits(t: torch.Tensor) -> np.ndarray:
    """The element bytes of a torch tensor, in logical order, as uint8."""
    t = t.detach().resolve_conj().resolve_neg()
    flat = t.new_empty(t.shape).copy_(t).reshape(-1)
    if flat.numel() == 0:
        return np.zeros(0, np.uint8)
    return flat.view(torch.uint8).numpy().copy()


def ptfile_bits(t: ptfile.Tensor) -> np.ndarray:
    """The element bytes of a ptfile tensor (conj/neg applied), in logical order, as uint8."""
    if t.dtype.numpy is None:
        raise AssertionError("no numpy dtype")
    arr = np.ascontiguousarray(t.numpy())
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.reshape(-1).view(np.uint8)


def assert_tensor_equal(p: Any, t: torch.Tensor) -> None:
    """Values, dtype, shape, stride, offset, requires_grad and Parameter-ness agree."""
    assert isinstance(p, ptfile.Tensor), type(p)
    assert repr(p.dtype) == str(t.dtype)
    assert tuple(p.shape) == tuple(t.shape)
    assert p.stride() == t.stride()
    assert p.storage_offset() == t.storage_offset()
    assert p.requires_grad == t.requires_grad
    assert p.is_parameter == isinstance(t, torch.nn.Parameter)
    if p.dtype.numpy is not None:
        assert np.array_equal(ptfile_bits(p), torch_bits(t))
    else:  # dtypes numpy cannot hold: the raw storage bytes agree
        raw = bytes(t.untyped_storage())
        assert bytes(p.raw_bytes()) == raw


def assert_same(p: Any, t: Any, path: str = "") -> None:
    """Recursively compare a ptfile-loaded tree with a torch-loaded one."""
    if isinstance(t, torch.Tensor):
        assert_tensor_equal(p, t)
    elif isinstance(t, (dict, OrderedDict)):
        assert type(p) is type(t), path
        assert list(p.keys()) == list(t.keys()), path
        for k in t:
            assert_same(p[k], t[k], f"{path}/{k}")
        assert getattr(p, "__dict__", {}).keys() == getattr(t, "__dict__", {}).keys()
    elif isinstance(t, torch.Size):
        assert isinstance(p, ptfile.Size) and tuple(p) == tuple(t)
    elif isinstance(t, (list, tuple)):
        assert type(p) is type(t), path
        assert len(p) == len(t), path
        for i, (a, b) in enumerate(zip(p, t)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(t, torch.dtype):
        assert repr(p) == str(t)
    elif isinstance(t, torch.device):
        assert p == ptfile.Device(str(t))
    elif isinstance(t, float) and math.isnan(t):
        assert math.isnan(p)
    else:
        assert type(p) is type(t) and p == t, (path, p, t)


def tensors_of(obj: Any) -> list[Any]:
    """Every tensor in a tree, depth first (dict values, list items)."""
    out: list[Any] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, (torch.Tensor, ptfile.Tensor)):
            out.append(x)
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return out


def assert_sharing(p: Any, t: Any) -> None:
    """Tensors share a ptfile Storage exactly when they share a torch storage.

    Every pair of tensors is compared, in one pass: two tensors share a storage exactly
    when the first tensor of each one's group is the same, so the groups torch makes and
    the groups ptfile makes are the same partition exactly when each tensor's first
    sharer is the same index under both (a 5000-tensor file is 12.5 million pairs)."""
    pts, tts = tensors_of(p), tensors_of(t)
    assert len(pts) == len(tts)
    first_t: dict[int, int] = {}  # torch storage data_ptr -> first tensor index on it
    first_p: dict[int, int] = {}  # id of the ptfile Storage -> first tensor index on it
    for i, (pt, tt) in enumerate(zip(pts, tts)):
        storage = tt.untyped_storage()
        if not storage.nbytes():
            continue  # empty storages all have data_ptr 0 (and torch.load splits them)
        by_t = first_t.setdefault(storage.data_ptr(), i)
        by_p = first_p.setdefault(id(pt.storage), i)
        assert by_t == by_p, (min(by_t, by_p), i)  # a pair torch and ptfile disagree on


def torch_bytes(obj: Any, **options: Any) -> bytes:
    """What ``torch.save(obj, buffer, **options)`` writes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, **options)
    return buffer.getvalue()


def ptfile_bytes(obj: Any, **options: Any) -> bytes:
    """What ``ptfile.save(obj, buffer, **options)`` writes."""
    buffer = io.BytesIO()
    ptfile.save(obj, buffer, **options)
    return buffer.getvalue()
