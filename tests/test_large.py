"""ZIP64 and many-record archives end to end (slow: multi-GiB files, 70,000 records)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile

pytestmark = pytest.mark.slow

BIG = 2**32 + 5  # one storage past 4 GiB: ZIP64 sizes, then a record whose header offset is > 4 GiB


@pytest.fixture(autouse=True)
def _no_gib_left(tmp_path: Path) -> Iterator[None]:
    """These files are GiBs: removed even when a test fails (its traceback says enough)."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fp:
        while chunk := fp.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def test_large_zip64_storage_matches_torch(tmp_path: Path) -> None:
    big = np.zeros(BIG, np.uint8)  # calloc'd: untouched pages cost no memory
    big[-1] = 7
    ours = tmp_path / "ours" / "big.pt"
    ours.parent.mkdir()
    ptfile.save({"big": big, "small": np.arange(3, dtype=np.int64)}, ours)
    del big
    theirs = tmp_path / "big.pt"
    t = torch.from_numpy(np.zeros(BIG, np.uint8))  # torch.zeros would write every page: 4 GiB
    t[-1] = 7
    torch.save({"big": t, "small": torch.arange(3)}, theirs)
    del t
    assert _sha(ours) == _sha(theirs)
    loaded = torch.load(ours, mmap=True, weights_only=True)
    assert loaded["big"].shape == (BIG,) and loaded["big"][-1].item() == 7
    assert loaded["small"].tolist() == [0, 1, 2]
    mine = ptfile.load(ours, mmap=True)
    assert mine["big"].numpy()[-1] == 7 and mine["small"].numpy().tolist() == [0, 1, 2]


def test_large_more_than_65535_records_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "many.pt"
    torch.save({f"t{i}": torch.tensor([i]) for i in range(70_000)}, path)
    sd = ptfile.load(path, mmap=True)
    assert len(sd) == 70_000 and sd["t69999"].numpy().tolist() == [69999]
    again = tmp_path / "again"
    again.mkdir()
    ptfile.save(sd, again / "many.pt")
    assert (again / "many.pt").read_bytes() == path.read_bytes()
