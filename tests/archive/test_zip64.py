"""ZIP64 at full scale (slow): members past 4 GiB, more than 65,535 records, 10^5-record timing."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from archive_helpers import rebuild, write_archive
from ptfile._io.local import BytesSource, FileSource
from ptfile.archive import SERIALIZATION_ID_NAME, ZipReader, ZipWriter, computed_data_offset

pytestmark = pytest.mark.slow

BIG = 2**32 + 5  # a member larger than 0xFFFFFFFF pushes the next header past 4 GiB


class SparseSink:
    """A write callable that turns all-zero pieces into holes (seeks) in a real file."""

    def __init__(self, fp: BinaryIO) -> None:
        self.fp = fp
        self.zeros: list[tuple[int, int]] = []  # merged ranges skipped as holes

    def __call__(self, piece: bytes | memoryview) -> None:
        start = self.fp.tell()
        if len(piece) and not np.frombuffer(piece, np.uint8).any():
            self.fp.seek(len(piece), io.SEEK_CUR)
            if self.zeros and self.zeros[-1][1] == start:
                start = self.zeros.pop()[0]
            self.zeros.append((start, self.fp.tell()))
        else:
            self.fp.write(piece)

    def finish(self) -> None:
        self.fp.truncate(self.fp.tell())  # a trailing hole still counts


def same_files_around(a: Path, b: Path, zeros: tuple[int, int]) -> bool:
    """Equal sizes, equal bytes outside ``zeros`` and at 64 probes inside it.

    Reading 4 GiB of holes takes half a minute on some file systems, so the
    zero region is probed, not read; the writer's side of it is checked by
    :class:`SparseSink`, which saw nothing but zeros there.
    """
    start, end = zeros
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        if fa.read(start) != fb.read(start):
            return False
        for probe in np.linspace(start, end - 4096, 64).astype(int).tolist():
            fa.seek(probe)
            fb.seek(probe)
            if fa.read(4096) != fb.read(4096):
                return False
        fa.seek(end)
        fb.seek(end)
        return fa.read() == fb.read()


def test_zip64_header_offset_beyond_4gib_matches_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    expected = tmp_path / "big.pt"
    with torch.serialization.skip_data():  # zero-filled payloads, CRC 0, sparse holes
        torch.save({"big": torch.empty(BIG, dtype=torch.uint8), "small": torch.ones(3)}, expected)
    source = FileSource(expected.open("rb"), owned=True)  # read on demand, not whole
    reader = ZipReader(source)
    ours = tmp_path / "ours.pt"
    with ours.open("wb") as fp:
        sink = SparseSink(fp)
        writer = ZipWriter(sink, reader.prefix)
        for record in reader.records:
            name = record.name.split("/", 1)[1]
            if name.startswith("data/"):
                writer.write_record_skip_data(name, record.size)
            elif name != SERIALIZATION_ID_NAME:
                writer.write_record(name, reader.read(record))
        writer.close()
        sink.finish()
    big = reader.get("big/data/0")
    assert big is not None
    payload = reader.data_offset(big), reader.data_offset(big) + big.size
    source.close()
    assert any(a <= payload[0] and payload[1] <= b for a, b in sink.zeros)
    assert same_files_around(ours, expected, payload)

    source = FileSource(ours.open("rb"), owned=True)
    reader = ZipReader(source)
    big, small = reader.get("big/data/0"), reader.get("big/data/1")
    assert big is not None
    assert small is not None
    assert big.size == BIG
    assert small.header_offset > 2**32
    assert reader.data_offset(small) == computed_data_offset(
        small.header_offset, small.name, 12, 64
    )
    assert reader.read(small) == bytes(12)
    assert reader.records[-1].header_offset > 2**32
    source.close()
    with zipfile.ZipFile(ours) as archive:
        got = [(i.filename, i.file_size, i.header_offset) for i in archive.infolist()]
    assert got == [(r.name, r.size, r.header_offset) for r in reader.records]


def test_zip64_more_than_65535_records_read_by_zipfile() -> None:
    count = 70_000
    data = write_archive([(f"data/{i}", str(i).encode()) for i in range(count)])
    assert data[-22:][8:12] == b"\xff\xff\xff\xff"  # EOCD counts capped at 0xFFFF
    reader = ZipReader(BytesSource(data))
    assert len(reader) == count + 1
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        assert [(i.filename, i.file_size) for i in infos] == [(r.name, r.size) for r in reader]
        assert archive.read("archive/data/69999") == b"69999"
    assert reader.read("archive/data/65536") == b"65536"


def test_zip64_torch_save_of_70000_tensors_is_rebuilt_byte_identical() -> None:
    torch = pytest.importorskip("torch")
    out = io.BytesIO()
    torch.save({f"t{i}": torch.tensor([float(i)]) for i in range(70_000)}, out)
    data = out.getvalue()
    assert rebuild(data) == data
