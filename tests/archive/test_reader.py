"""ZipReader: golden files, Python's zipfile as a second opinion, validation and policy."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from pathlib import Path
from typing import cast

import pytest

from archive_helpers import GOLDEN, NOT_ZIP_GOLDEN, TORCH_WRITTEN, ZIP_GOLDEN, write_archive
from ptfile._io.local import BytesSource, FileSource, MmapSource, Source
from ptfile.archive import Record, ZipReader
from ptfile.errors import ArchiveError, LimitExceededError, UnsupportedFeatureError
from ptfile.limits import Limits

_LOCAL = struct.Struct("<4s22xHH")


def zipfile_bytes(
    members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED, comment: bytes = b""
) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in members:
            archive.writestr(name, data)
        archive.comment = comment
    return out.getvalue()


def local_data(data: bytes, header_offset: int, size: int) -> bytes:
    """A member's bytes located by hand from its local header (independent of ZipReader)."""
    sig, nlen, elen = _LOCAL.unpack_from(data, header_offset)
    assert sig == b"PK\x03\x04"
    start = header_offset + 30 + nlen + elen
    return data[start : start + size]


def central_entry_offset(data: bytes, index: int) -> int:
    """File offset of central directory entry ``index`` (via zipfile's EOCD parse)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        pos = archive.start_dir
    for _ in range(index):
        nlen, elen, clen = struct.unpack_from("<3H", data, pos + 28)
        pos += 46 + nlen + elen + clen
    return pos


def patch(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


@pytest.mark.parametrize("name", ZIP_GOLDEN)
def test_reader_agrees_with_zipfile_on_golden_files(name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    reader = ZipReader(BytesSource(data))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
    assert len(reader) == len(infos)
    for index, (record, info) in enumerate(zip(reader.records, infos, strict=True)):
        assert record == Record(
            info.filename, info.header_offset, info.file_size, info.compress_size,
            info.compress_type, info.CRC, info.flag_bits, index,
        )  # fmt: skip
        assert reader.read(record) == local_data(data, info.header_offset, info.file_size)
        assert bytes(reader.view(record.name)) == reader.read(record.name)
    assert list(reader) == list(reader.records)


@pytest.mark.parametrize(
    ("name", "prefix"),
    [("tiny_tensor.pt", "tiny_tensor"), ("tiny_buffer_nocrc.pt", "archive"),
     ("tiny_bigendian.pt", "archive"), ("tiny_views.pt", "tiny_views")],
)  # fmt: skip
def test_reader_prefix_is_the_first_names_folder(name: str, prefix: str) -> None:
    assert ZipReader(BytesSource((GOLDEN / name).read_bytes())).prefix == prefix


@pytest.mark.parametrize("name", NOT_ZIP_GOLDEN)
def test_reader_refuses_files_that_are_not_zip(name: str) -> None:
    with pytest.raises(ArchiveError, match="end of central directory"):
        ZipReader(BytesSource((GOLDEN / name).read_bytes()))


def test_reader_worked_example_offsets() -> None:
    # spec §2.11: data of tiny_tensor.pt's seven records
    reader = ZipReader(BytesSource((GOLDEN / "tiny_tensor.pt").read_bytes()))
    offsets = [reader.data_offset(record) for record in reader.records]
    assert offsets == [0x40, 0x140, 0x1C0, 0x240, 0x2C0, 0x340, 0x3C0]
    assert reader.read("tiny_tensor/.data/serialization_id") == (
        b"1572819951185464302606254392891879407814"
    )


@pytest.mark.parametrize("name", TORCH_WRITTEN)
def test_reader_crc_check(name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    reader = ZipReader(BytesSource(data))
    expected = name != "tiny_buffer_nocrc.pt"  # torch wrote CRC 0 everywhere
    assert all(reader.check_crc(record) is expected for record in reader.records)
    record = reader.records[0]
    flipped = bytearray(data)
    flipped[reader.data_offset(record)] ^= 1
    assert not ZipReader(BytesSource(bytes(flipped))).check_crc(record.name)


def test_reader_view_is_zero_copy(tmp_path: Path) -> None:
    data = write_archive([("data/0", b"abcdefgh" * 100)])
    reader = ZipReader(BytesSource(data))
    view = reader.view("archive/data/0")
    assert view.obj is data
    path = tmp_path / "a.pt"
    path.write_bytes(data)
    source = MmapSource(path, "r")
    mapped = ZipReader(cast(Source, source)).view("archive/data/0")
    assert bytes(mapped) == b"abcdefgh" * 100
    assert not isinstance(mapped.obj, bytes)  # a slice of the map, not a copy
    del view, mapped
    source.close()


def test_reader_reads_through_a_file_object() -> None:
    data = (GOLDEN / "tiny_state_dict.pt").read_bytes()
    memory = ZipReader(BytesSource(data))
    with io.BytesIO(b"junk" + data) as fp:
        fp.seek(4)
        reader = ZipReader(FileSource(fp))
        assert [reader.read(r) for r in reader.records] == [memory.read(r) for r in memory]


def test_reader_lookup_api() -> None:
    reader = ZipReader(BytesSource(write_archive([("a", b"1"), ("b", b"")])))
    assert "archive/a" in reader
    assert "a" not in reader
    record = reader.get("archive/b")
    assert record is not None
    assert (record.size, record.flags, record.index) == (0, 0x0800, 1)
    assert reader.get("archive/zzz") is None
    with pytest.raises(KeyError):
        reader.read("archive/zzz")
    foreign = Record("archive/a", 0, 5, 5, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="not a record"):
        reader.read(foreign)
    assert reader.data_offset("archive/a") == reader.data_offset(reader.records[0])


def test_reader_deflated_records() -> None:
    payload = b"torch " * 1000
    data = zipfile_bytes([("archive/a", payload), ("archive/b", b"")], zipfile.ZIP_DEFLATED)
    reader = ZipReader(BytesSource(data))
    record = reader.records[0]
    assert record.method == 8
    assert record.compressed_size < record.size
    assert reader.read(record) == payload
    assert bytes(reader.view(record)) == payload
    assert reader.check_crc(record)
    assert reader.read("archive/b") == b""


@pytest.mark.parametrize("delta", [-1, 1])
def test_reader_deflated_size_must_match(delta: int) -> None:
    data = zipfile_bytes([("archive/a", b"x" * 500)], zipfile.ZIP_DEFLATED)
    bad = patch(data, central_entry_offset(data, 0) + 24, "<L", 500 + delta)
    with pytest.raises(ArchiveError, match="declared"):
        ZipReader(BytesSource(bad)).read("archive/a")


def test_reader_bad_deflate_stream() -> None:
    data = zipfile_bytes([("archive/a", bytes(range(256)) * 4)], zipfile.ZIP_DEFLATED)
    reader = ZipReader(BytesSource(data))
    start = reader.data_offset("archive/a")
    garbage = data[:start] + b"\xff" * 8 + data[start + 8 :]
    with pytest.raises(ArchiveError, match="deflate"):
        ZipReader(BytesSource(garbage)).read("archive/a")


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_reader_other_methods_are_unsupported(method: int) -> None:
    reader = ZipReader(BytesSource(zipfile_bytes([("archive/a", b"x" * 100)], method)))
    with pytest.raises(UnsupportedFeatureError, match="compression method"):
        reader.read("archive/a")


@pytest.mark.parametrize("flag", [0x0001, 0x0040, 0x2000])
def test_reader_encrypted_records_are_unsupported(flag: int) -> None:
    data = write_archive([("a", b"1")])
    at = central_entry_offset(data, 0) + 8
    bad = patch(data, at, "<H", 0x0808 | flag)
    with pytest.raises(UnsupportedFeatureError, match="encrypted"):
        ZipReader(BytesSource(bad))


def test_reader_refuses_duplicate_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns "Duplicate name"
        data = zipfile_bytes([("archive/a", b"1"), ("archive/a", b"2")])
    with pytest.raises(ArchiveError, match="duplicate"):
        ZipReader(BytesSource(data))


def test_reader_limits() -> None:
    data = (GOLDEN / "tiny_tensor.pt").read_bytes()
    with pytest.raises(LimitExceededError, match="max_records"):
        ZipReader(BytesSource(data), limits=Limits(max_records=6))
    with pytest.raises(LimitExceededError, match="max_name_length"):
        ZipReader(BytesSource(data), limits=Limits(max_name_length=20))
    assert len(ZipReader(BytesSource(data), limits=Limits(max_records=7, max_name_length=34))) == 7


def test_reader_archive_comment_and_fake_signature_in_it() -> None:
    comment = b"hello PK\x05\x06"  # a signature too close to the end to be a record
    data = zipfile_bytes([("archive/a", b"1")], comment=comment)
    assert ZipReader(BytesSource(data)).read("archive/a") == b"1"
    long_comment = zipfile_bytes([("archive/a", b"1")], comment=b"c" * 65535)
    assert ZipReader(BytesSource(long_comment)).read("archive/a") == b"1"


def test_reader_tolerates_a_broken_zip64_record_it_does_not_need() -> None:
    data = (GOLDEN / "tiny_tensor.pt").read_bytes()
    eocd64 = data.rindex(b"PK\x06\x06")
    broken = data[:eocd64] + b"XX" + data[eocd64 + 2 :]
    assert len(ZipReader(BytesSource(broken))) == 7
    needed = patch(broken, len(data) - 22 + 8, "<HH", 0xFFFF, 0xFFFF)  # counts now say "ZIP64"
    with pytest.raises(ArchiveError, match="signature"):
        ZipReader(BytesSource(needed))


def test_reader_reads_archives_without_zip64_records() -> None:
    data = zipfile_bytes([("archive/a", b"1"), ("archive/b", b"22")])
    assert b"PK\x06\x06" not in data
    assert [ZipReader(BytesSource(data)).read(n) for n in ("archive/a", "archive/b")] == [b"1", b"22"]


def test_reader_refuses_spanned_archives() -> None:
    data = zipfile_bytes([("archive/a", b"1")])
    with pytest.raises(UnsupportedFeatureError, match="disks"):
        ZipReader(BytesSource(patch(data, len(data) - 22 + 4, "<H", 1)))


def test_reader_refuses_overlapping_records() -> None:
    data = write_archive([("a", b"1" * 100), ("b", b"2" * 100)])
    second = central_entry_offset(data, 1)
    with pytest.raises(ArchiveError, match="overlaps"):
        ZipReader(BytesSource(patch(data, second + 42, "<L", 0)))  # b's header is a's


def test_reader_refuses_records_running_into_the_directory() -> None:
    data = write_archive([("a", b"1" * 100)])
    first = central_entry_offset(data, 0)
    bad = patch(data, first + 20, "<LL", 10**6, 10**6)
    with pytest.raises(ArchiveError, match="central directory"):
        ZipReader(BytesSource(bad))
    with pytest.raises(ArchiveError, match="compressed size"):
        ZipReader(BytesSource(patch(data, first + 20, "<L", 99)))


def test_reader_checks_local_headers() -> None:
    data = write_archive([("a", b"1"), ("b", b"2")])
    reader = ZipReader(BytesSource(data))
    second = reader.records[1].header_offset
    renamed = data[: second + 38] + b"c" + data[second + 39 :]  # "archive/b" -> "archive/c"
    with pytest.raises(ArchiveError, match="local header names"):
        ZipReader(BytesSource(renamed)).data_offset("archive/b")
    unsigned = data[:second] + b"PK\x09\x09" + data[second + 4 :]
    with pytest.raises(ArchiveError, match="local file header signature"):
        ZipReader(BytesSource(unsigned)).read("archive/b")
    assert ZipReader(BytesSource(unsigned)).read("archive/a") == b"1"


def test_reader_refuses_names_that_are_not_utf8() -> None:
    data = write_archive([("ab", b"1")])
    bad = bytearray(data)
    bad[central_entry_offset(data, 0) + 46 + len("archive/")] = 0xFF
    with pytest.raises(ArchiveError, match="UTF-8"):
        ZipReader(BytesSource(bytes(bad)))


def test_reader_non_ascii_names() -> None:
    reader = ZipReader(BytesSource(write_archive([("données/ü", b"1")])))
    assert reader.read("archive/données/ü") == b"1"


def test_reader_prefix_errors() -> None:
    empty = zipfile_bytes([])
    assert len(ZipReader(BytesSource(empty))) == 0
    with pytest.raises(ArchiveError, match="empty"):
        _ = ZipReader(BytesSource(empty)).prefix
    flat = zipfile_bytes([("data.pkl", b"1"), ("archive/x", b"")])
    with pytest.raises(ArchiveError, match="subdirectory"):
        _ = ZipReader(BytesSource(flat)).prefix


def test_computed_data_offsets_match_the_scalar_rule() -> None:
    import numpy as np

    from ptfile.archive import computed_data_offset, computed_data_offsets

    rng = np.random.default_rng(0)
    headers = rng.integers(0, 2**33, 500)
    sizes = rng.integers(0, 2**33, 500)
    headers[:50] = rng.integers(2**32 - 100, 2**32 + 100, 50)  # around the ZIP64 edges
    sizes[50:100] = rng.integers(2**32 - 100, 2**32 + 100, 50)
    lengths = rng.integers(1, 60, 500)
    for alignment in (1, 64, 4096):
        got = computed_data_offsets(headers, lengths, sizes, alignment).tolist()
        want = [computed_data_offset(int(h), "x" * int(n), int(s), alignment)
                for h, n, s in zip(headers, lengths, sizes, strict=True)]
        assert got == want
