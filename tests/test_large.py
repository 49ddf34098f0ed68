"""ZIP64 and many-record archives end to end (slow: multi-GiB files, 70,000 records)."""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


class _Hashing(io.RawIOBase):
    """A write-only stream that keeps only the SHA-1 and the length of what is written."""

    def __init__(self) -> None:
        self.digest, self.size = hashlib.sha1(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.digest.update(data)
        size = memoryview(data).nbytes
        self.size += size
        return size

    def tell(self) -> int:
        return self.size


def _sha1(path: Path) -> str:
    """The file's SHA-1, read around the page cache where the platform allows (ptfile's sink
    wrote it that way: reading 4 GiB back through the cache cost ~9 s of kernel time here)."""
    digest, buf = hashlib.sha1(), mmap.mmap(-1, 1 << 24)  # page-aligned, as O_DIRECT needs
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    try:
        while (got := os.readv(fd, [buf])) > 0:
            digest.update(memoryview(buf)[:got])
    finally:
        os.close(fd)
    return digest.hexdigest()


def test_large_zip64_storage_matches_torch(tmp_path: Path) -> None:
    # torch's bytes without a 4 GiB file (torch.save through the page cache took ~13 s of
    # kernel time here): its stream form, whose archive folder is "archive"; ptfile writes
    # a real file (beyond 256 MiB around the page cache, _io.sink) with that folder name.
    t = torch.from_numpy(np.zeros(BIG, np.uint8))  # torch.zeros would write every page: 4 GiB
    t[-1] = 7
    theirs = _Hashing()
    torch.save({"big": t, "small": torch.arange(3)}, theirs)
    del t
    big = np.zeros(BIG, np.uint8)  # calloc'd: untouched pages cost no memory
    big[-1] = 7
    ours = tmp_path / "big.pt"
    ptfile.save({"big": big, "small": np.arange(3, dtype=np.int64)}, ours,
                archive_name="archive")
    del big
    assert ours.stat().st_size == theirs.size > 2**32
    assert _sha1(ours) == theirs.digest.hexdigest()
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
