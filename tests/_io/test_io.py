"""Reading a whole file into memory: one readinto, or chunks read by a few threads."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile
from oracle import assert_same, assert_sharing
from ptfile._io import buffers as _io


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threaded path on small files: 1 KiB and up, in 100-byte chunks."""
    monkeypatch.setattr(_io, "PARALLEL_READ_MIN_BYTES", 1024)
    monkeypatch.setattr(_io, "_READ_CHUNK_BYTES", 100)


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=0, max_size=5000), st.sampled_from([1, 2000, 1 << 30]))
def test_read_file_in_chunks_equals_the_file(data: bytes, map_from: int) -> None:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ptfile-read-{os.getpid()}.bin"
    path.write_bytes(data)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_io, "PARALLEL_READ_MIN_BYTES", 1024)
            mp.setattr(_io, "_READ_CHUNK_BYTES", 100)
            mp.setattr(_io, "ANONYMOUS_MAP_BYTES", map_from)  # numpy memory, or a map
            got = _io.read_file(str(path))
        assert bytes(got) == data
        assert not got.readonly
    finally:
        path.unlink()


def test_read_file_reads_again_when_a_chunk_comes_back_short(
        tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 20
    path.write_bytes(data)
    real = os.preadv
    calls: list[int] = []

    def flaky(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(offset)
        return 0 if offset == 2000 else real(fd, buffers, offset)  # "the file shrank"

    monkeypatch.setattr(_io, "_PREADV", flaky)
    assert bytes(_io.read_file(str(path))) == data
    assert 2000 in calls


def test_load_of_a_file_read_in_chunks_equals_torch(tmp_path: Path, small_chunks: None) -> None:
    path = tmp_path / "t.pt"
    obj = {"w": torch.randn(40, 30), "v": torch.arange(100, dtype=torch.int16)[::3],
           "b": torch.randn(7).to(torch.bfloat16)}
    obj["t"] = obj["w"].t()
    torch.save(obj, path)
    assert path.stat().st_size > 1024
    ref = torch.load(path)
    loaded = ptfile.load(path)
    assert_same(loaded, ref)
    assert_sharing(loaded, ref)
    loaded["w"].numpy()[0, 0] = 42.0  # writable, shared by the views of its storage
    assert loaded["t"].numpy()[0, 0] == np.float32(42.0)


def test_read_file_reads_in_one_pass_where_threads_cannot_start(
        tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(3000)
    path.write_bytes(data)

    class NoThreads:
        def __init__(self, workers: int) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_io, "ThreadPoolExecutor", NoThreads)
    assert bytes(_io.read_file(str(path))) == data


def test_read_file_reads_big_files_into_an_anonymous_map(tmp_path: Path) -> None:
    """Not numpy memory, whose huge pages can stall on first touch (issue 15)."""
    path = tmp_path / "big.bin"
    data = np.random.default_rng(0).integers(0, 256, _io.ANONYMOUS_MAP_BYTES + 5, np.uint8)
    path.write_bytes(data.tobytes())
    got = _io.read_file(str(path))
    assert type(got.obj).__name__ == "mmap"
    assert bytes(got) == data.tobytes() and not got.readonly


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="MAP_POPULATE is Linux's")
def test_read_file_makes_the_pages_of_its_map_up_front(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One populated map below the threads' size (issue 15: half the cost of faulting each
    page in on first touch; for big files the threads' parallel faults win)."""
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * (_io.ANONYMOUS_MAP_BYTES // 256 + 1))
    made: list[int] = []
    real = mmap.mmap

    def spy(fileno: int, size: int, **kwargs: Any) -> mmap.mmap:
        made.append(kwargs.get("flags", 0))
        return real(fileno, size, **kwargs)

    monkeypatch.setattr(_io._mmap, "mmap", spy)
    assert bytes(_io.read_file(str(path))) == path.read_bytes()
    assert len(made) == 1 and made[0] & mmap.MAP_POPULATE and made[0] & mmap.MAP_PRIVATE
    made.clear()
    monkeypatch.setattr(_io, "PARALLEL_READ_MIN_BYTES", _io.ANONYMOUS_MAP_BYTES)
    assert bytes(_io.read_file(str(path))) == path.read_bytes()  # read by the threads
    assert len(made) == 1 and not made[0] & mmap.MAP_POPULATE
