"""Big-endian bfloat16 storages shared by several tensors stay shared, as in torch.

numpy has no big-endian bfloat16, so its values need a swapped copy: one per
storage, made on first use of the data (not during the load), which every
tensor on the storage views.  Before the fix each ``numpy()`` call made its own
copy, so a write through one view was not seen through another.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from test_byteorder import big_endian_copy, saved

import ptfile
from oracle import assert_tensor_equal

BASE = torch.tensor([1.0, 2.5, -3.0, 258.0, 0.0, 65504.0], dtype=torch.bfloat16)
VIEWS = {"x": BASE, "view": BASE[1:5].view(2, 2).t(), "tail": BASE[3:]}


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "bf16_big.pt"
    path.write_bytes(big_endian_copy(saved(VIEWS), [2]))
    return path


LOADS = {
    "in-memory": lambda p: ptfile.load(io.BytesIO(p.read_bytes())),
    "path": lambda p: ptfile.load(p),
    "mapped": lambda p: ptfile.load(p, mmap=True),
    "mapped-shared": lambda p: ptfile.load(p, mmap="r+"),
}


@pytest.mark.parametrize("how", sorted(LOADS))
def test_big_endian_bfloat16_views_share_one_swapped_buffer(big_file: Path, how: str) -> None:
    theirs = torch.load(big_file)
    ours = LOADS[how](big_file)
    storage = ours["x"].storage
    assert all(t.storage is storage for t in ours.values())
    assert storage.byteorder == "big"  # nothing swapped during the load
    for name, tensor in theirs.items():
        assert_tensor_equal(ours[name], tensor)
    assert storage.byteorder == "little"  # swapped once, on first use
    x, view, tail = (ours[n].numpy() for n in ("x", "view", "tail"))
    assert np.shares_memory(x, view) and np.shares_memory(x, tail)
    assert np.shares_memory(x, ours["x"].numpy())  # no second copy
    x[3] = 7.0  # torch: the same write through theirs["x"] is seen through the views
    theirs["x"][3] = 7.0
    assert view[0, 1] == 7.0 and tail[0] == 7.0
    for name, tensor in theirs.items():
        assert_tensor_equal(ours[name], tensor)


def test_big_endian_bfloat16_writes_are_saved(big_file: Path) -> None:
    ours = ptfile.load(big_file)
    ours["view"].numpy()[0, 0] = 9.0  # element 1 of the storage
    expected = BASE.clone()
    expected[1] = 9.0
    for order in ("little", "big"):
        buf = io.BytesIO()
        ptfile.save(ours, buf, byteorder=order)
        back = torch.load(io.BytesIO(buf.getvalue()))
        assert torch.equal(back["x"], expected)
        assert back["view"].untyped_storage().data_ptr() == back["x"].untyped_storage().data_ptr()


def test_big_endian_bfloat16_resave_is_byte_identical(big_file: Path) -> None:
    ours = ptfile.load(big_file)
    ours["x"].numpy()  # swapped to little-endian in memory ...
    buf = io.BytesIO()
    ptfile.save(ours, buf, byteorder="big")  # ... and back for a big-endian save
    original = ptfile.load(big_file)
    again = ptfile.load(io.BytesIO(buf.getvalue()))
    assert bytes(again["x"].storage.data) == bytes(original["x"].storage.data)


def test_big_endian_bfloat16_read_only_map_stays_read_only(big_file: Path) -> None:
    ours = ptfile.load(big_file, mmap="r")
    x, view = ours["x"].numpy(), ours["view"].numpy()
    assert not x.flags.writeable and not view.flags.writeable
    assert np.shares_memory(x, view)


def test_big_endian_bfloat16_metadata_loads_swap_nothing(big_file: Path) -> None:
    ours = ptfile.load(big_file, skip_data=True)
    assert ours["x"].storage.byteorder == "big"
    with pytest.raises(ptfile.UnsupportedFeatureError):
        ours["x"].numpy()
