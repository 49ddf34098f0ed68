"""The tolerant ZIP walk (the scanner's) reads valid archives exactly as the strict reader does.

On archives written by ptfile's ZipWriter, by torch's PyTorchStreamWriter and
by ``torch.save``: the same members, at the same header and data offsets,
with the same sizes and methods, and no anomaly.
"""

from __future__ import annotations

import io

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_helpers import GOLDEN, ZIP_GOLDEN, torch_file_writer, write_archive, zip64_sample
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader
from ptfile.archive._entries import parse_entries
from ptfile.archive.anomalies import Anomaly
from ptfile.archive.directory import check_counts, locate_directory
from ptfile.limits import DEFAULT_LIMITS
from ptfile.scanning.containers import walk_zip

Member = tuple[str, int, int, int, int, int]

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                max_size=24).filter(lambda n: not n.endswith("/"))
RECORDS = st.lists(st.tuples(NAMES, st.binary(max_size=300)), max_size=8,
                   unique_by=lambda r: r[0])


def strict_members(data: bytes) -> list[Member]:
    reader = ZipReader(BytesSource(data))
    return [(r.name, r.header_offset, reader.data_offset(r), r.size, r.compressed_size, r.method)
            for r in reader.records]


def tolerant_members(data: bytes) -> tuple[list[Member], list[Anomaly]]:
    walked = walk_zip(BytesSource(data))
    assert walked is not None
    entries, anomalies = walked
    return [(e.name, e.header_offset, e.data_offset, e.size, e.compressed_size, e.method)
            for e in entries], anomalies


def assert_same_reading(data: bytes) -> None:
    members, anomalies = tolerant_members(data)
    assert anomalies == []
    assert members == strict_members(data)


@settings(max_examples=40, deadline=None)
@given(RECORDS, st.sampled_from([1, 64, 4096]), st.booleans())
def test_tolerant_walk_equals_reader_on_zipwriter_archives(
        records: list[tuple[str, bytes]], alignment: int, crc32: bool) -> None:
    assert_same_reading(write_archive(records, alignment=alignment, crc32=crc32))


@settings(max_examples=15, deadline=None)
@given(RECORDS, st.sampled_from([64, 4096]))
def test_tolerant_walk_equals_reader_on_torch_writer_archives(
        records: list[tuple[str, bytes]], alignment: int) -> None:
    assert_same_reading(torch_file_writer(records, alignment=alignment))


@settings(max_examples=10, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8),
                       st.lists(st.floats(allow_nan=False, width=32), max_size=5), max_size=5))
def test_tolerant_walk_equals_reader_on_torch_save(values: dict[str, list[float]]) -> None:
    buf = io.BytesIO()
    torch.save({k: torch.tensor(v) for k, v in values.items()}, buf)
    assert_same_reading(buf.getvalue())


def test_tolerant_walk_equals_reader_on_golden_zip64_and_large_directories() -> None:
    for name in ZIP_GOLDEN:
        assert_same_reading((GOLDEN / name).read_bytes())
    assert_same_reading(zip64_sample())
    # More entries than the strict reader parses sequentially: it takes the vectorised pass.
    assert_same_reading(write_archive([(f"r{i}", bytes([i % 251]) * (i % 7))
                                       for i in range(1500)]))


def test_tolerant_parser_steps_equal_strict_ones() -> None:
    data = write_archive([("a", b"1"), ("b/c", b"22")])
    source, found = BytesSource(data), list[Anomaly]()
    strict = check_counts(locate_directory(source), DEFAULT_LIMITS)  # type: ignore[arg-type]
    tolerant = locate_directory(source, found)
    assert tolerant is not None
    assert check_counts(tolerant, DEFAULT_LIMITS, found) == strict
    cd = source.pread(strict.offset, strict.size, "cd")
    a = parse_entries(cd, strict.entries, strict.offset, 100)
    b = parse_entries(cd, strict.entries, strict.offset, 100, found)
    assert a.names == b.names
    assert [a.row(i) for i in range(len(a.names))] == [b.row(i) for i in range(len(b.names))]
    assert found == []
