"""DirectSink leaves exactly the bytes written, with or without O_DIRECT; large CRCs in threads."""

from __future__ import annotations

import errno
import io
import itertools
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from ptfile._io import sink as sink_module
from ptfile._io.sink import BUFFER_BYTES, DirectSink
from ptfile.archive.writer import PARALLEL_CRC_BYTES, ZipWriter

SIZES = [0, 1, 4095, 4096, BUFFER_BYTES - 1, BUFFER_BYTES, BUFFER_BYTES + 1, 2 * BUFFER_BYTES + 7]


def _pieces(total: int) -> list[bytes | memoryview | np.ndarray]:
    rng = np.random.default_rng(total)
    data = rng.integers(0, 256, total, dtype=np.uint8)
    cuts = sorted({0, total, *rng.integers(0, total + 1, 5).tolist()})
    out: list[bytes | memoryview | np.ndarray] = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        part = data[a:b]
        out.append([part.tobytes(), memoryview(part), part.view(np.uint8)][i % 3])
    return out


def _write(path: Path, pieces: list[bytes | memoryview | np.ndarray],
           plain_bytes: int = 0) -> bytes:
    with open(path, "wb") as fp:
        sink = DirectSink(fp.fileno(), plain_bytes)
        for piece in pieces:
            sink.write(piece)
        sink.close()
    return path.read_bytes()


@pytest.mark.parametrize("total", SIZES)
def test_sink_writes_exactly_its_input(tmp_path: Path, total: int) -> None:
    pieces = _pieces(total)
    expected = b"".join(bytes(memoryview(p)) for p in pieces)
    assert _write(tmp_path / "out", pieces) == expected


@pytest.mark.parametrize("total", [1, BUFFER_BYTES, 2 * BUFFER_BYTES + 7, 3 * BUFFER_BYTES])
def test_sink_writes_its_plain_head_through_the_page_cache_then_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int
) -> None:
    """The first plain_bytes go to os.write as they come (no copy, O_DIRECT off); O_DIRECT
    is turned on at that offset, where every later full write starts aligned."""
    switched: list[tuple[bool, int]] = []
    positions: list[int] = []
    real_write = os.write

    def recording_write(fd: int, data: memoryview) -> int:
        positions.append(os.lseek(fd, 0, os.SEEK_CUR))
        return real_write(fd, data)

    monkeypatch.setattr(sink_module, "_set_direct",
                        lambda fd, on: switched.append((on, os.lseek(fd, 0, os.SEEK_CUR)))
                        or False)
    monkeypatch.setattr(sink_module.os, "write", recording_write)
    pieces = _pieces(total)
    got = _write(tmp_path / "out", pieces, plain_bytes=BUFFER_BYTES)
    assert got == b"".join(bytes(memoryview(p)) for p in pieces)
    on = [at for flag, at in switched if flag]
    assert on == ([BUFFER_BYTES] if total >= BUFFER_BYTES else [])
    assert all(at % BUFFER_BYTES == 0 for at in positions if at >= BUFFER_BYTES)


def test_sink_plain_head_must_be_whole_buffers() -> None:
    with pytest.raises(ValueError, match="multiple"):
        DirectSink(0, BUFFER_BYTES + 1)


def test_sink_without_o_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "_set_direct", lambda fd, on: False)
    pieces = _pieces(2 * BUFFER_BYTES + 3)
    assert _write(tmp_path / "out", pieces) == b"".join(bytes(memoryview(p)) for p in pieces)


def test_sink_falls_back_when_the_first_direct_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_write = os.write

    def refusing_write(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "refused")
        return real_write(fd, data)

    monkeypatch.setattr(sink_module, "_set_direct", lambda fd, on: True)
    monkeypatch.setattr(sink_module.os, "write", refusing_write)
    pieces = _pieces(BUFFER_BYTES + 10)
    assert _write(tmp_path / "out", pieces) == b"".join(bytes(memoryview(p)) for p in pieces)
    assert calls[:2] == [BUFFER_BYTES, BUFFER_BYTES]


def test_sink_passes_other_errors_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_write(fd: int, data: memoryview) -> int:
        raise OSError(errno.ENOSPC, "full")

    monkeypatch.setattr(sink_module.os, "write", failing_write)
    with open(tmp_path / "out", "wb") as fp:
        sink = DirectSink(fp.fileno())
        with pytest.raises(OSError, match="full"):
            sink.write(bytes(BUFFER_BYTES))
        sink.release()
        sink.release()


@pytest.mark.parametrize("crc32", [True, False])
def test_writer_large_payloads_crc_in_a_thread_same_bytes(crc32: bool) -> None:
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8)
                for n in (PARALLEL_CRC_BYTES - 1, PARALLEL_CRC_BYTES, 3 * PARALLEL_CRC_BYTES + 5)]
    batched, single = io.BytesIO(), io.BytesIO()
    with ZipWriter(batched.write, "a", crc32=crc32) as writer:
        writer.write_records((f"data/{i}", p) for i, p in enumerate(payloads))
    with ZipWriter(single.write, "a", crc32=crc32) as writer:
        for i, p in enumerate(payloads):
            writer.write_record(f"data/{i}", p)
    assert batched.getvalue() == single.getvalue()
    with zipfile.ZipFile(io.BytesIO(batched.getvalue())) as archive:
        for i, p in enumerate(payloads):
            info = archive.getinfo(f"a/data/{i}")
            expected = zlib.crc32(p) if crc32 else 0
            assert expected == info.CRC
