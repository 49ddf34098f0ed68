"""Round-trip properties: load(save(x)) == x, and save is byte-stable through ptfile."""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from hypothesis import given, settings

import ptfile
from strategies import arrays, containers, scalars, shared_views


def _dump(obj: Any) -> bytes:
    buf = io.BytesIO()
    ptfile.save(obj, buf)
    return buf.getvalue()


def _bytes(a: np.ndarray) -> bytes:
    """Element bytes in logical order (bit-exact: NaN payloads and -0.0 included)."""
    return np.ascontiguousarray(a).tobytes()


def _equal(loaded: Any, original: Any) -> bool:
    if isinstance(original, np.ndarray):
        got = loaded.numpy()
        return got.dtype == original.dtype and got.shape == original.shape and \
            _bytes(got) == _bytes(original)
    if isinstance(original, dict):
        return type(loaded) is type(original) and list(loaded) == list(original) and \
            all(_equal(loaded[k], v) for k, v in original.items())
    if isinstance(original, (list, tuple)):
        return type(loaded) is type(original) and len(loaded) == len(original) and \
            all(_equal(a, b) for a, b in zip(loaded, original))
    return type(loaded) is type(original) and loaded == original


@given(containers(arrays() | scalars))
def test_roundtrip_load_save_is_identity(obj: Any) -> None:
    data = _dump(obj)
    assert _equal(ptfile.load(data), obj)


@given(containers(arrays() | scalars))
def test_roundtrip_save_load_save_is_byte_stable(obj: Any) -> None:
    first = _dump(obj)
    assert _dump(ptfile.load(first)) == first


@given(shared_views())
def test_roundtrip_shared_views_share_storage(views: list[np.ndarray]) -> None:
    loaded = ptfile.load(_dump(views))
    assert all(t.storage is loaded[0].storage for t in loaded)
    for t, v in zip(loaded, views):
        assert _bytes(t.numpy()) == _bytes(v)


@settings(max_examples=25)
@given(containers(arrays()))
def test_roundtrip_torch_loads_ptfile_output(obj: Any) -> None:
    loaded = torch.load(io.BytesIO(_dump(obj)), weights_only=True)

    def check(t: Any, a: Any) -> None:
        if isinstance(a, np.ndarray):
            assert tuple(t.shape) == a.shape
            fresh = t.new_empty(t.shape).copy_(t).reshape(-1)
            raw = fresh.view(torch.uint8).numpy() if t.numel() else b""
            assert bytes(raw) == np.ascontiguousarray(a).tobytes()
        elif isinstance(a, dict):
            assert isinstance(t, dict) and list(t) == list(a)
            for k in a:
                check(t[k], a[k])
        elif isinstance(a, (list, tuple)):
            for x, y in zip(t, a):
                check(x, y)
    check(loaded, obj)


def test_roundtrip_ordered_dict_metadata() -> None:
    sd = OrderedDict(w=np.ones(2, np.float32))
    sd._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    loaded = ptfile.load(_dump(sd))
    assert loaded._metadata == {"": {"version": 1}}
    assert _dump(loaded) == _dump(sd)


def test_roundtrip_empty_bytes_refused_like_torch_weights_only() -> None:
    import pytest

    with pytest.raises(ptfile.SaveError, match="weights_only"):
        _dump({"b": b""})
