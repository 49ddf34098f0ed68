"""ZipWriter without torch: streaming, round trips through ZipReader and zipfile, misuse."""

from __future__ import annotations

import io
import itertools
import zipfile
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import write_archive
from ptfile._io.local import BytesSource
from ptfile.archive import MAX_ALIGNMENT, SERIALIZATION_ID_NAME, ZipReader, ZipWriter

member_names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00/"), min_size=1, max_size=10
) | st.lists(st.sampled_from(["data", "a", "ü", "x.y"]), min_size=1, max_size=3).map("/".join)
members = st.lists(
    st.tuples(member_names, st.binary(max_size=300)), max_size=20, unique_by=lambda m: m[0]
).filter(lambda ms: all(name != SERIALIZATION_ID_NAME for name, _ in ms))


class Recorder:
    """A write callable that keeps every piece it is given."""

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []

    def __call__(self, piece: bytes | memoryview) -> None:
        self.pieces.append(piece)

    def joined(self) -> bytes:
        return b"".join(self.pieces)


@given(records=members, alignment=st.sampled_from([1, 2, 7, 64, 100, 4096]), crc32=st.booleans())
def test_writer_round_trip_through_reader_and_zipfile(
    records: list[tuple[str, bytes]], alignment: int, crc32: bool
) -> None:
    data = write_archive(records, "pre", alignment=alignment, crc32=crc32)
    reader = ZipReader(BytesSource(data))
    names = [f"pre/{name}" for name, _ in records] + [f"pre/{SERIALIZATION_ID_NAME}"]
    assert [record.name for record in reader.records] == names
    for record, (_, payload) in zip(reader.records[:-1], records, strict=True):
        assert reader.read(record) == payload
        assert reader.data_offset(record) % alignment == 0
        assert reader.check_crc(record) is (crc32 or not payload)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == names
        for name, payload in records:
            info = archive.getinfo(f"pre/{name}")
            assert info.file_size == len(payload)
            if crc32:  # zipfile checks CRCs; torch's CRC-less archives fail there
                assert archive.read(info) == payload


def test_writer_record_offsets_are_the_data_offsets() -> None:
    out = io.BytesIO()
    writer = ZipWriter(out.write, "model", alignment=100)
    for i in range(10):
        writer.write_record(f"data/{i}", bytes(i * 3))
    writer.close()
    reader = ZipReader(BytesSource(out.getvalue()))
    for name, offset in writer.record_offsets.items():
        assert reader.data_offset(f"model/{name}") == offset
        assert offset % 100 == 0
    assert writer.position == len(out.getvalue())


def test_writer_passes_payloads_through_without_joining() -> None:
    payload = bytearray(b"x" * 10_000)
    sink = Recorder()
    writer = ZipWriter(sink, "archive")
    writer.write_record("data/0", payload)
    views = [p for p in sink.pieces if isinstance(p, memoryview) and p.obj is payload]
    assert len(views) == 1  # the caller's memory, no copy
    assert views[0].nbytes == len(payload)
    assert all(len(p) < 200 for p in sink.pieces if p is not views[0])


def test_writer_streams_chunks_one_by_one() -> None:
    chunks = [bytes([i]) * (1000 + i) for i in range(20)]
    sink = Recorder()
    writer = ZipWriter(sink, "archive")
    seen = []

    def produce() -> Iterator[bytes]:
        for chunk in chunks:
            seen.append(len(sink.pieces))  # the previous chunk is written before the next is made
            yield chunk

    writer.write_record_chunks("data/0", sum(map(len, chunks)), produce())
    writer.close()
    assert [bytes(p) for p in sink.pieces[1:21]] == chunks
    assert seen == list(range(1, 21))
    assert sink.joined() == write_archive([("data/0", b"".join(chunks))])


@given(payload=st.binary(max_size=200), cuts=st.lists(st.integers(0, 200), max_size=6))
def test_writer_chunks_equal_a_single_write(payload: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(payload), *(c for c in cuts if c <= len(payload))})
    chunks = [payload[a:b] for a, b in itertools.pairwise(bounds)]
    out = io.BytesIO()
    with ZipWriter(out.write, "archive") as writer:
        writer.write_record_chunks("data/0", len(payload), chunks)
    assert out.getvalue() == write_archive([("data/0", payload)])


def test_writer_accepts_any_contiguous_buffer() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected = write_archive([("data/0", array.tobytes())])
    assert write_archive([("data/0", array.data)]) == expected
    out = io.BytesIO()
    with ZipWriter(out.write, "archive") as writer:
        writer.write_record_chunks("data/0", array.nbytes, [array[:1].data, array[1:].data])
    assert out.getvalue() == expected


def test_writer_skip_data_writes_zeros_with_crc_zero() -> None:
    out = io.BytesIO()
    with ZipWriter(out.write, "archive") as writer:
        writer.write_record_skip_data("data/0", 3_000_000)
    reader = ZipReader(BytesSource(out.getvalue()))
    record = reader.records[0]
    assert (record.crc32, record.size) == (0, 3_000_000)
    assert reader.read(record) == bytes(3_000_000)


@pytest.mark.parametrize(
    ("prefix", "alignment", "match"),
    [("", 64, "prefix"), ("a/b", 64, "prefix"), ("archive", 0, "alignment"),
     ("archive", MAX_ALIGNMENT + 1, "alignment")],
)  # fmt: skip
def test_writer_rejects_bad_options(prefix: str, alignment: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ZipWriter(io.BytesIO().write, prefix, alignment=alignment)


def test_writer_rejects_duplicates_directories_with_data_and_long_names() -> None:
    writer = ZipWriter(io.BytesIO().write, "archive")
    writer.write_record("a", b"1")
    with pytest.raises(ValueError, match="duplicate"):
        writer.write_record("a", b"2")
    with pytest.raises(ValueError, match="directory"):
        writer.write_record("d/", b"2")
    with pytest.raises(ValueError, match="bytes long"):
        writer.write_record("n" * 70_000, b"")
    with pytest.raises(ValueError, match="< 0"):
        writer.write_record_skip_data("negative", -1)
    writer.close()  # the failed calls wrote nothing: the archive is still whole
    assert writer.record_offsets.keys() == {"a", SERIALIZATION_ID_NAME}


@pytest.mark.parametrize("sizes", [[3, 4], [3, 2]])
def test_writer_refuses_to_finish_after_a_wrong_chunk_total(sizes: list[int]) -> None:
    declared, given_bytes = sizes
    writer = ZipWriter(io.BytesIO().write, "archive")
    with pytest.raises(ValueError, match="bytes"):
        writer.write_record_chunks("data/0", declared, [b"x" * given_bytes])
    with pytest.raises(ValueError, match="broken"):
        writer.write_record("next", b"")
    with pytest.raises(ValueError, match="broken"):
        writer.close()


def test_writer_close_is_idempotent_and_final() -> None:
    out = io.BytesIO()
    writer = ZipWriter(out.write, "archive")
    writer.close()
    size = len(out.getvalue())
    writer.close()
    assert len(out.getvalue()) == size
    with pytest.raises(ValueError, match="closed"):
        writer.write_record("late", b"")
    assert [r.name for r in ZipReader(BytesSource(out.getvalue())).records] == [
        f"archive/{SERIALIZATION_ID_NAME}"
    ]


def test_writer_context_manager_leaves_a_failed_archive_unfinished() -> None:
    out = io.BytesIO()
    writer = ZipWriter(out.write, "archive")
    writer.__exit__(RuntimeError, RuntimeError(), None)
    assert b"PK\x05\x06" not in out.getvalue()
    with ZipWriter(out.write, "archive") as writer:
        pass
    assert b"PK\x05\x06" in out.getvalue()


def test_writer_works_on_a_non_seekable_stream() -> None:
    class Pipe(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:  # type: ignore[no-untyped-def]
            self.data += b
            return len(b)

    pipe = Pipe()
    assert not pipe.seekable()
    with ZipWriter(pipe.write, "archive") as writer:
        writer.write_record("data/0", b"abc")
    assert bytes(pipe.data) == write_archive([("data/0", b"abc")])


def test_writer_is_unusable_after_a_failed_write() -> None:
    out = io.BytesIO()

    def write(piece: bytes | memoryview) -> None:
        if len(piece) == 1000:
            raise OSError("disk full")
        out.write(piece)

    writer = ZipWriter(write, "archive")
    writer.write_record("a", b"1")
    with pytest.raises(OSError, match="disk full"):
        writer.write_record("b", b"x" * 1000)
    with pytest.raises(ValueError, match="half-written"):
        writer.write_record("c", b"")
    with pytest.raises(ValueError, match="half-written"):
        writer.close()

    def failing_chunks() -> Iterator[bytes]:
        yield b"x"
        raise RuntimeError("producer failed")

    writer = ZipWriter(io.BytesIO().write, "archive")
    with pytest.raises(RuntimeError, match="producer"):
        writer.write_record_chunks("d", 2, failing_chunks())
    with pytest.raises(ValueError, match="half-written"):
        writer.close()
