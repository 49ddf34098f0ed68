"""``Limits.max_ndim`` on every path that builds tensors: ZIP (in memory, mapped,
metadata-only, structural), ``open``, ``inspect``, legacy, tar and TorchScript.

Each file holds a 3-d tensor that torch 2.13 loads; the defaults load it as torch
does, and ``Limits(max_ndim=2)`` refuses it (before the fix every path loaded it).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_legacy_tar import Ref, build_tar, torch_load

import ptfile
from oracle import assert_same

TWO = ptfile.Limits(max_ndim=2)
CUBE = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)


@pytest.fixture
def zip_path(tmp_path: Path) -> Path:
    path = tmp_path / "cube.pt"
    torch.save({"cube": CUBE, "flat": CUBE.flatten()}, path)
    return path


def _ts_path(tmp_path: Path) -> Path:
    module = torch.nn.Module()
    module.register_buffer("cube", CUBE.clone())
    path = tmp_path / "cube_ts.pt"
    torch.jit.save(torch.jit.script(module), path)
    return path


def _opened(path: Path, limits: ptfile.Limits | None, mmap: bool) -> Any:
    with ptfile.open(path, mmap=mmap, limits=limits) as reader:
        return reader.tensors()


ZIP_LOADS: dict[str, Callable[[Path, ptfile.Limits | None], Any]] = {
    "in-memory": lambda p, lim: ptfile.load(io.BytesIO(p.read_bytes()), limits=lim),
    "path": lambda p, lim: ptfile.load(p, limits=lim),
    "mapped": lambda p, lim: ptfile.load(p, mmap=True, limits=lim),
    "skip_data": lambda p, lim: ptfile.load(p, skip_data=True, limits=lim),
    "structural": lambda p, lim: ptfile.load(p, structural=True, limits=lim),
    "map_location": lambda p, lim: ptfile.load(p, map_location="cpu", limits=lim),
    "open": lambda p, lim: _opened(p, lim, mmap=True),
    "open-unmapped": lambda p, lim: _opened(p, lim, mmap=False),
    "inspect": lambda p, lim: ptfile.inspect(p, limits=lim),
}


@pytest.mark.parametrize("how", sorted(ZIP_LOADS))
def test_max_ndim_is_honoured_on_every_zip_path(zip_path: Path, how: str) -> None:
    ZIP_LOADS[how](zip_path, None)  # torch's own limit (64) admits it
    with pytest.raises(ptfile.LimitExceededError, match="max_ndim") as info:
        ZIP_LOADS[how](zip_path, TWO)
    assert (info.value.limit, info.value.maximum, info.value.actual) == ("max_ndim", 2, 3)


def test_max_ndim_default_loads_as_torch(zip_path: Path) -> None:
    assert_same(ptfile.load(zip_path), torch.load(zip_path))
    assert ptfile.load(zip_path, limits=ptfile.Limits(max_ndim=3))["cube"].ndim == 3


def test_max_ndim_legacy() -> None:
    buf = io.BytesIO()
    torch.save({"cube": CUBE}, buf, _use_new_zipfile_serialization=False)
    assert_same(ptfile.load(io.BytesIO(buf.getvalue())), torch.load(io.BytesIO(buf.getvalue())))
    with pytest.raises(ptfile.LimitExceededError, match="max_ndim"):
        ptfile.load(io.BytesIO(buf.getvalue()), limits=TWO)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
def test_max_ndim_tar(tmp_path: Path) -> None:
    data = build_tar([(1, torch.FloatStorage, np.arange(24, dtype=np.float32))], [],
                     [(2, 1, (2, 3, 4), (12, 4, 1), 0)], {"cube": Ref(2)})
    assert_same(ptfile.load(io.BytesIO(data)), torch_load(data, tmp_path))
    with pytest.raises(ptfile.LimitExceededError, match="max_ndim"):
        ptfile.load(io.BytesIO(data), limits=TWO)


def test_max_ndim_torchscript(tmp_path: Path) -> None:
    path = _ts_path(tmp_path)
    assert_same(ptfile.load(path)["cube"], torch.jit.load(path).state_dict()["cube"])
    for load in (ptfile.load, ptfile.load_torchscript):
        with pytest.raises(ptfile.LimitExceededError, match="max_ndim"):
            load(path, limits=TWO)


def test_max_ndim_applies_only_inside_the_load(zip_path: Path) -> None:
    with pytest.raises(ptfile.LimitExceededError):
        ptfile.load(zip_path, limits=TWO)
    # after a refused load, tensors made by hand (and later loads) get the defaults again
    storage = ptfile.Storage(memoryview(bytearray(8 * 4)), ptfile.DTYPES["float32"])
    assert ptfile.Tensor(storage, 0, (2, 2, 2), (4, 2, 1)).ndim == 3
    assert ptfile.load(zip_path)["cube"].ndim == 3


class _StorageRef:
    """Pickles as the persistent id of storage ``0`` (one float32)."""


class _RankedTensor:
    def __init__(self, ndim: int) -> None:
        self.ndim = ndim

    def __reduce__(self) -> Any:
        ones = (1,) * self.ndim
        return (torch._utils._rebuild_tensor_v2,
                (_StorageRef(), 0, ones, ones, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            return ("storage", torch.FloatStorage, "0", "cpu", 1)
        return None


def _ranked_file(tmp_path: Path, ndim: int) -> Path:
    """torch.save of one float32, its data.pkl replaced by a tensor of rank ``ndim``."""
    plain = tmp_path / "plain.pt"
    torch.save({"t": torch.ones(1)}, plain)
    pkl = io.BytesIO()
    _Pickler(pkl, protocol=2).dump({"t": _RankedTensor(ndim)})
    out = tmp_path / f"rank{ndim}.pt"
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = pkl.getvalue() if info.filename.endswith("/data.pkl") else zin.read(info)
            zout.writestr(info.filename, data)
    return out


def test_ranks_over_numpys_64_stay_refused_whatever_the_limit(tmp_path: Path) -> None:
    assert ptfile.load(_ranked_file(tmp_path, 64))["t"].numpy().shape == (1,) * 64
    path = _ranked_file(tmp_path, 65)
    assert torch.load(path)["t"].dim() == 65  # torch loads it; numpy arrays cannot have 65
    with pytest.raises(ptfile.LimitExceededError, match="max_ndim"):
        ptfile.load(path)
    for how in ("path", "mapped", "open", "skip_data"):  # a raised limit: still no such view
        with pytest.raises(ptfile.StorageError, match="64 dimensions"):
            ZIP_LOADS[how](path, ptfile.Limits(max_ndim=100))
