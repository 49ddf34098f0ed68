"""Record layouts: dataclass round trips, spec values, and the writer's output parsed field by field."""

from __future__ import annotations

import dataclasses
import io
import zipfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import GOLDEN, TORCH_WRITTEN, zip64_sample
from ptfile._io.local import BytesSource
from ptfile.archive import (
    ZipReader,
    computed_data_offset,
    computed_next_header_offset,
    extra,
    layout,
)
from ptfile.archive import records as r
from ptfile.errors import ArchiveError

RECORD_TYPES = [
    r.LocalFileHeader,
    r.CentralDirectoryHeader,
    r.EndOfCentralDirectory,
    r.Zip64EndOfCentralDirectory,
    r.Zip64Locator,
    r.DataDescriptor,
]
SIGNATURES = [
    r.LOCAL_FILE_HEADER_SIGNATURE,
    r.CENTRAL_DIRECTORY_SIGNATURE,
    r.EOCD_SIGNATURE,
    r.ZIP64_EOCD_SIGNATURE,
    r.ZIP64_LOCATOR_SIGNATURE,
    r.DATA_DESCRIPTOR_SIGNATURE,
]


def test_records_table_invariants() -> None:
    assert len(set(SIGNATURES)) == len(SIGNATURES)
    assert all(sig[:2] == b"PK" and len(sig) == 4 for sig in SIGNATURES)
    sizes = [r.LocalFileHeader.SIZE, r.CentralDirectoryHeader.SIZE, r.EndOfCentralDirectory.SIZE,
             r.Zip64EndOfCentralDirectory.SIZE, r.Zip64Locator.SIZE]  # fmt: skip
    assert sizes == [30, 46, 22, 56, 20]  # APPNOTE 4.3.7, 4.3.12, 4.3.16, 4.3.14, 4.3.15
    assert (r.DESCRIPTOR_STRUCT.size, r.DESCRIPTOR64_STRUCT.size) == (16, 24)
    for cls in RECORD_TYPES:
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert hasattr(cls, "__slots__")


#: Bit width of every integer field, in field order (``None``: a bytes field).
WIDTHS: dict[type, tuple[int | None, ...]] = {
    r.LocalFileHeader: (16, 16, 16, 16, 16, 32, 32, 32, None, None),
    r.CentralDirectoryHeader: (16, 16, 16, 16, 16, 16, 32, 32, 32, 16, 16, 32, 32, None, None, None),
    r.EndOfCentralDirectory: (16, 16, 16, 16, 32, 32, None),
    r.Zip64EndOfCentralDirectory: (64, 16, 16, 32, 32, 64, 64, 64, 64),
    r.Zip64Locator: (32, 64, 32),
    r.DataDescriptor: (32, 32, 32),  # + zip64, which widens the sizes to 64
}


@st.composite
def record_instances(draw: st.DrawFn) -> Any:
    cls = draw(st.sampled_from(RECORD_TYPES))
    values: list[Any] = [
        draw(st.binary(max_size=40) if bits is None else st.integers(0, 2**bits - 1))
        for bits in WIDTHS[cls]
    ]
    if cls is r.DataDescriptor and draw(st.booleans()):
        values[1:] = [draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1)), True]
    if cls is r.Zip64EndOfCentralDirectory:
        values[0] = max(values[0], 44)
    return cls(*values)


@given(record=record_instances(), junk=st.binary(max_size=8))
def test_records_round_trip(record: Any, junk: bytes) -> None:
    raw = record.to_bytes()
    kwargs = {"zip64": record.zip64} if isinstance(record, r.DataDescriptor) else {}
    assert type(record).from_bytes(junk + raw + junk, len(junk), **kwargs) == record
    with pytest.raises(ArchiveError):
        type(record).from_bytes(raw[:-1], **kwargs)
    with pytest.raises(ArchiveError, match="signature"):
        type(record).from_bytes(b"XX" + raw[2:], **kwargs)


def test_records_extra_fields() -> None:
    block = extra.ExtraField(0x4246, b"ZZ").to_bytes() + extra.ExtraField(1, bytes(16)).to_bytes()
    assert extra.parse_extra_fields(block) == (extra.ExtraField(0x4246, b"ZZ"), extra.ExtraField(1, bytes(16)))
    assert extra.zip64_values(block, 2) == (0, 0)
    with pytest.raises(ArchiveError, match="needs 24"):
        extra.zip64_values(block, 3)
    with pytest.raises(ArchiveError, match="no ZIP64"):
        extra.zip64_values(block[:6], 1)
    for cut in range(1, len(block)):
        if cut not in (6, len(block)):
            with pytest.raises(ArchiveError, match="truncated"):
                extra.parse_extra_fields(block[:cut])
    assert layout.padding_extra(0) == b"FB\x00\x00"
    assert layout.padding_extra(2) == b"FB\x02\x00ZZ"


@pytest.mark.parametrize(
    ("offset", "size", "expected"),
    [(0, 10, b""), (0, 2**32 - 1, b"\x01\x00\x10\x00" + (2**32 - 1).to_bytes(8, "little") * 2),
     (2**32 - 1, 3, b"\x01\x00\x08\x00" + (2**32 - 1).to_bytes(8, "little")),
     (2**33, 2**33, b"\x01\x00\x18\x00" + (2**33).to_bytes(8, "little") * 3)],
)  # fmt: skip
def test_records_zip64_extra_layout(offset: int, size: int, expected: bytes) -> None:
    assert layout.zip64_extra(offset, size) == expected
    local = layout.zip64_extra(offset, size, local=True)  # compressed size 0 in the local header
    assert local == (expected[:12] + bytes(8) + expected[20:] if size >= 2**32 - 1 else expected)
    assert layout.needs_zip64(offset, size) is bool(expected)
    assert layout.descriptor_size(offset, size) == (24 if expected else 16)
    assert layout.descriptor_size(offset, 0) == 0


def test_records_storage_offsets_of_the_worked_example() -> None:
    # spec §2.11: (header offset, full name length, size) -> data offset
    cases = [(0x0, 20, 150, 0x40), (0xE6, 27, 1, 0x140), (0x151, 30, 2, 0x1C0),
             (0x1D2, 21, 6, 0x240), (0x256, 18, 8, 0x2C0), (0x2D8, 19, 2, 0x340),
             (0x352, 34, 40, 0x3C0)]  # fmt: skip
    for header, name_length, size, data in cases:
        assert layout.storage_data_offset(header, name_length, size, 64) == data
    assert computed_data_offset(0x256, "tiny_tensor/data/0", 8, 64) == 0x2C0
    assert computed_next_header_offset(0x256, 0x2C0, 8) == 0x2D8
    assert computed_next_header_offset(0x256, 0x2C0, 0) == 0x2C0
    assert computed_next_header_offset(2**32, 2**32 + 128, 8) == 2**32 + 128 + 8 + 24


@pytest.mark.parametrize("name", TORCH_WRITTEN)
def test_records_torch_files_parse_field_by_field(name: str) -> None:
    """Every header torch wrote parses into the dataclasses and serializes back unchanged."""
    data = (GOLDEN / name).read_bytes()
    reader = ZipReader(BytesSource(data))
    pos = 0
    for record in reader.records:
        local = r.LocalFileHeader.from_bytes(data, record.header_offset)
        assert local.to_bytes() == data[record.header_offset : reader.data_offset(record)]
        assert (local.crc32, local.compressed_size, local.uncompressed_size) == (0, 0, 0)
        assert local.flags == (0x0808 if record.size else 0x0800)
        fields = extra.parse_extra_fields(local.extra)
        assert [f.header_id for f in fields] == [r.PADDING_EXTRA_ID]
        assert set(fields[0].data) <= {ord("Z")}
        end = reader.data_offset(record) + record.size
        if record.size:
            descriptor = r.DataDescriptor.from_bytes(data, end)
            assert descriptor == r.DataDescriptor(record.crc32, record.size, record.size)
            end += 16
        assert end == (reader.records[record.index + 1].header_offset
                       if record.index + 1 < len(reader) else data.index(b"PK\x01\x02", end))  # fmt: skip
    pos = data.index(b"PK\x01\x02")
    for record in reader.records:
        central = r.CentralDirectoryHeader.from_bytes(data, pos)
        assert central.to_bytes() == data[pos : pos + central.record_size]
        assert (central.name.decode(), central.header_offset, central.extra) == (
            record.name, record.header_offset, b"")
        pos += central.record_size
    eocd64 = r.Zip64EndOfCentralDirectory.from_bytes(data, pos)
    locator = r.Zip64Locator.from_bytes(data, pos + 56)
    eocd = r.EndOfCentralDirectory.from_bytes(data, pos + 76)
    assert eocd64 == r.Zip64EndOfCentralDirectory(
        44, 0x031E, 0x2D, 0, 0, len(reader), len(reader), eocd.cd_size, eocd.cd_offset
    )
    assert locator == r.Zip64Locator(0, pos, 1)
    assert eocd.to_bytes() == data[pos + 76 :]
    assert (eocd.total_entries, eocd.comment) == (len(reader), b"")


def test_records_zip64_sample_reads_like_zipfile() -> None:
    data = zip64_sample()
    reader = ZipReader(BytesSource(data))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        expected = [(i.filename, i.header_offset, i.file_size, archive.read(i))
                    for i in archive.infolist()]  # fmt: skip
    got = [(x.name, x.header_offset, x.size, reader.read(x)) for x in reader.records]
    assert got == expected == [("archive/a", 0, 5, b"hello"), ("archive/b", 44, 6, b"world!")]


def test_records_eocd_sentinels() -> None:
    assert not r.EndOfCentralDirectory(total_entries=3).uses_zip64
    assert r.EndOfCentralDirectory(cd_offset=0xFFFFFFFF).uses_zip64
    assert r.EndOfCentralDirectory(entries_on_disk=0xFFFF).uses_zip64
    with pytest.raises(ArchiveError, match="record size"):
        r.Zip64EndOfCentralDirectory.from_bytes(r.Zip64EndOfCentralDirectory(record_size=40).to_bytes())
