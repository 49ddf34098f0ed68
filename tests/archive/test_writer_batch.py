"""ZipWriter.write_records: the same archive as write_record one by one, in few write calls."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import write_archive
from ptfile.archive import SERIALIZATION_ID_NAME, ZipWriter
from ptfile.archive.writer import BATCH_FLUSH_BYTES, BATCH_PAYLOAD_BYTES

names = st.sampled_from(["data/0", "data/1", "a", "ü/x", "d/", "", SERIALIZATION_ID_NAME,
                         "PK\x07\x08name", "n" * 300])
payloads = st.sampled_from([b"", b"x", b"PK\x07\x08" + bytes(12), bytes(BATCH_PAYLOAD_BYTES)])


def write_batched(records: list[tuple[str, bytes]], *, alignment: int = 64,
                  crc32: bool = True) -> tuple[bytes, int]:
    calls = 0
    out = io.BytesIO()

    def write(piece: bytes | memoryview) -> None:
        nonlocal calls
        calls += 1
        out.write(piece)

    writer = ZipWriter(write, "archive", alignment=alignment, crc32=crc32)
    writer.write_records(records)
    writer.close()
    return out.getvalue(), calls


@given(records=st.lists(st.tuples(names, payloads), max_size=8, unique_by=lambda r: r[0]),
       alignment=st.sampled_from([1, 7, 64]), crc32=st.booleans())
def test_write_records_equals_write_record(records: list[tuple[str, bytes]], alignment: int,
                                           crc32: bool) -> None:
    records = [(n, d) for n, d in records if not (n.endswith("/") or not n) or not d]
    data, _ = write_batched(records, alignment=alignment, crc32=crc32)
    assert data == write_archive(records, alignment=alignment, crc32=crc32)


def test_write_records_gathers_small_records() -> None:
    records = [(f"data/{i}", bytes([i % 256]) * 16) for i in range(10_000)]
    data, calls = write_batched(records)
    assert data == write_archive(records)
    assert calls < 10 + len(data) // BATCH_FLUSH_BYTES * 2


def test_write_records_passes_large_payloads_through() -> None:
    payload = bytearray(BATCH_PAYLOAD_BYTES * 2)
    pieces: list[bytes | memoryview] = []
    writer = ZipWriter(pieces.append, "archive")
    writer.write_records([("small", b"1"), ("data/0", payload), ("tail", b"2")])
    assert [p for p in pieces if isinstance(p, memoryview) and p.obj is payload]


def test_write_records_stops_at_a_bad_record_and_stays_usable() -> None:
    out = io.BytesIO()
    writer = ZipWriter(out.write, "archive")
    with pytest.raises(ValueError, match="duplicate"):
        writer.write_records([("a", b"1"), ("b", b"2"), ("a", b"3"), ("c", b"4")])
    assert list(writer.record_offsets) == ["a", "b"]
    writer.close()
    assert out.getvalue() == write_archive([("a", b"1"), ("b", b"2")])


def test_write_records_after_a_failed_write_is_refused() -> None:
    def write(piece: bytes | memoryview) -> None:
        raise OSError("disk full")

    writer = ZipWriter(write, "archive")
    with pytest.raises(OSError, match="disk full"):
        writer.write_records([("a", b"1")])
    with pytest.raises(ValueError, match="half-written"):
        writer.write_records([("b", b"2")])
    with pytest.raises(ValueError, match="half-written"):
        writer.close()


@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=300),
       alignment=st.sampled_from([1, 3, 64, 4096]), crc32=st.booleans(),
       quirk=st.integers(0, 299), prefix=st.sampled_from(["archive", "a", "PK\x07\x08x"]))
def test_write_records_runs_equal_write_record(sizes: list[int], alignment: int, crc32: bool,
                                               quirk: int, prefix: str) -> None:
    # Many small records go through one laid-out run (archive/_runs.py); one payload
    # may start like a data descriptor, which the serialization id folds in.
    records = [(f"data/{i}" + "x" * (i % 7), bytes([i % 251]) * size)
               for i, size in enumerate(sizes)]
    if quirk < len(records) and sizes[quirk] >= 8:
        records[quirk] = (records[quirk][0], b"PK\x07\x08" + bytes(i % 256 for i in range(sizes[quirk] - 4)))
    out = io.BytesIO()
    writer = ZipWriter(out.write, prefix, alignment=alignment, crc32=crc32)
    writer.write_records(records)
    writer.close()
    reference = io.BytesIO()
    with ZipWriter(reference.write, prefix, alignment=alignment, crc32=crc32) as one:
        for name, data in records:
            one.write_record(name, data)
    assert out.getvalue() == reference.getvalue()
    assert dict(writer.record_offsets) == dict(one.record_offsets)


def test_write_records_runs_around_large_payloads_and_a_failing_iterator() -> None:
    big = bytes(BATCH_PAYLOAD_BYTES)
    records = [("a", b"1"), ("b", big), ("c", b""), ("d", b"4" * 100), ("e", big)]
    data, _ = write_batched(records)
    assert data == write_archive(records)

    def failing() -> Iterator[tuple[str, bytes]]:
        yield "a", b"1"
        yield "b", b"2"
        raise RuntimeError("source failed")

    out = io.BytesIO()
    writer = ZipWriter(out.write, "archive")
    with pytest.raises(RuntimeError, match="source failed"):
        writer.write_records(failing())
    assert list(writer.record_offsets) == ["a", "b"]
    writer.close()
    assert out.getvalue() == write_archive([("a", b"1"), ("b", b"2")])


@pytest.mark.parametrize("size", [1, 8, 16, 300])
def test_write_records_runs_of_one_size_equal_write_record(size: int) -> None:
    # Payloads of one size and names of one length are placed as rows (archive/_runs.py).
    records = [(f"data/{i:04d}", bytes([i % 251]) * size) for i in range(3000)]
    records[7] = (records[7][0], (b"PK\x07\x08" + bytes(size))[:size])
    data, _ = write_batched(records)
    assert data == write_archive(records)
