"""Minimal files of the shapes the real-world corpus showed, built here (no download).

Each test is the regression test of a bug a corpus file found; it runs without
the package index.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, assert_sharing
from ptfile.formats.legacy_pickle import LEGACY_MAGIC

_SYS_INFO = {"protocol_version": 1001, "little_endian": True,
             "type_sizes": {"short": 2, "int": 4, "long": 4}}


class _Storage:
    """A storage to be written as torch's legacy persistent id."""

    def __init__(self, key: str, values: np.ndarray) -> None:
        self.key, self.values = key, values


class _Reduce:
    """Pickles as ``func(*args)``: the REDUCE torch's writers emit."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


class _LegacyPickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO) -> None:
        super().__init__(buf, protocol=2)
        self.storages: dict[str, _Storage] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, _Storage):
            return None
        self.storages[obj.key] = obj
        return ("storage", torch.FloatStorage, obj.key, "cuda:0", obj.values.size, None)


def legacy_stream(obj: Any) -> bytes:
    """A pre-1.6 stream: magic, protocol, sys info, ``obj``, storage keys, storage data."""
    buf = io.BytesIO()
    for header in (LEGACY_MAGIC, 1001, _SYS_INFO):
        pickle.dump(header, buf, protocol=2)
    pickler = _LegacyPickler(buf)
    pickler.dump(obj)
    pickle.dump(list(pickler.storages), buf, protocol=2)
    for s in pickler.storages.values():
        buf.write(struct.pack("<q", s.values.size) + s.values.astype("<f4").tobytes())
    return buf.getvalue()


def _tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
            hooks: Any) -> _Reduce:
    return _Reduce(torch._utils._rebuild_tensor_v2, storage, offset, size, stride, False, hooks)


@pytest.mark.parametrize("parameter", [False, True], ids=["tensor", "parameter"])
def test_backward_hooks_recorded_as_none_load_and_resave_as_torch(parameter: bool,
                                                                  tmp_path: Path) -> None:
    """lpips 0.1.4's v0.1 weights (torch 0.4 era) record ``backward_hooks`` as ``None``
    instead of an empty OrderedDict.  torch loads them (and re-saves an empty
    OrderedDict); ptfile raised ``PickleStreamError: backward_hooks: unexpected NoneType``."""
    s = _Storage("140", np.arange(6, dtype=np.float32) - 2.5)
    w = _tensor(s, 0, (2, 3), (3, 1), None)
    if parameter:
        w = _Reduce(torch._utils._rebuild_parameter, w, True, None)
    data = legacy_stream(OrderedDict([("w", w), ("tail", _tensor(s, 4, (2,), (1,), None))]))
    path = tmp_path / "hooks-none.pth"
    path.write_bytes(data)
    theirs = torch.load(path, map_location="cpu", weights_only=True)
    for mmap in (False, True):
        ours = ptfile.load(path, map_location="cpu", mmap=mmap)
        assert_same(ours, theirs)
        assert_sharing(ours, theirs)
    assert ours["w"].backward_hooks == OrderedDict()
    want, got = io.BytesIO(), io.BytesIO()
    torch.save(theirs, want)
    ptfile.save(ours, got)
    assert got.getvalue() == want.getvalue()


def test_backward_hooks_of_another_type_still_refused() -> None:
    s = _Storage("0", np.zeros(2, np.float32))
    data = legacy_stream({"w": _tensor(s, 0, (2,), (1,), [])})
    with pytest.raises(ptfile.PickleStreamError, match="backward_hooks"):
        ptfile.load(io.BytesIO(data))
