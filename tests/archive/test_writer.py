"""ZipWriter: byte-identical to torch.save and to torch's C++ writer, streaming, misuse."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import (
    GOLDEN,
    TORCH_WRITTEN,
    rebuild,
    torch_file_writer,
    torch_save_options,
    write_archive,
)
from ptfile._io.local import BytesSource
from ptfile.archive import SERIALIZATION_ID_NAME, ZipReader, ZipWriter

torch = pytest.importorskip("torch")


def torch_save_bytes(obj: object, **kwargs: Any) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out, **kwargs)
    return out.getvalue()


def tensors(count: int) -> dict[str, Any]:
    """``count`` tensors; every fifth one is empty (a 0-byte record, no descriptor)."""
    return {f"t{i}": torch.full((i % 5,), float(i)) for i in range(count)}


# --- torch.save outputs --------------------------------------------------------------------


@pytest.mark.parametrize("name", TORCH_WRITTEN)
def test_writer_rebuilds_golden_files_byte_identical(name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    assert rebuild(data) == data


@pytest.mark.parametrize("count", [0, 1, 300, 1200])
def test_writer_matches_torch_save_storage_counts(count: int) -> None:
    data = torch_save_bytes(tensors(count))
    assert rebuild(data) == data


def test_writer_matches_torch_save_empty_storages() -> None:
    data = torch_save_bytes([torch.empty(0), torch.ones(3), torch.empty(0, 4), torch.zeros(0)])
    assert rebuild(data) == data


@pytest.mark.parametrize("alignment", [1, 2, 8, 64, 100, 4096])
def test_writer_matches_torch_save_alignment(alignment: int) -> None:
    with torch_save_options(alignment=alignment):
        data = torch_save_bytes(tensors(12))
    assert rebuild(data) == data


def test_writer_matches_torch_save_without_crc() -> None:
    with torch_save_options(crc32=False):
        data = torch_save_bytes(tensors(7))
    assert rebuild(data) == data


def test_writer_matches_torch_save_without_byteorder_first() -> None:
    data = torch_save_bytes(tensors(3), _disable_byteorder_record=True)
    assert rebuild(data) == data


@pytest.mark.parametrize("filename", ["model.pt", "a.b.c", "noext", "x.tar.gz", "PK\x07\x08.pt"])
def test_writer_matches_torch_save_to_path(tmp_path: Path, filename: str) -> None:
    # A stem starting with "PK\x07\x08" makes miniz's name write look like a data
    # descriptor to torch's serialization id (spec §2.9 quirk).
    path = tmp_path / filename
    torch.save(tensors(5), path)
    data = path.read_bytes()
    assert rebuild(data) == data


def test_writer_skip_data_matches_torch_skip_data() -> None:
    with torch.serialization.skip_data():
        data = torch_save_bytes({"a": torch.ones(10), "b": torch.zeros(0), "c": torch.ones(2)})
    reader = ZipReader(BytesSource(data))
    out = io.BytesIO()
    writer = ZipWriter(out.write, reader.prefix)
    for record in reader.records:
        name = record.name.split("/", 1)[1]
        if name.startswith("data/"):
            writer.write_record_skip_data(name, record.size)
        elif name != SERIALIZATION_ID_NAME:
            writer.write_record(name, reader.read(record))
    writer.close()
    assert out.getvalue() == data


# --- torch's C++ writer with arbitrary records -----------------------------------------------

record_names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1, max_size=12
).filter(lambda n: not n.endswith("/") and n not in {"version", "byteorder", SERIALIZATION_ID_NAME})
payloads = st.binary(max_size=80) | st.binary(max_size=12).map(lambda b: b"PK\x07\x08" + b)


@given(
    records=st.lists(st.tuples(record_names, payloads), max_size=25, unique_by=lambda r: r[0]),
    alignment=st.sampled_from([1, 2, 3, 8, 64, 100, 4096]),
    crc32=st.booleans(),
)
def test_writer_matches_torch_file_writer(
    records: list[tuple[str, bytes]], alignment: int, crc32: bool
) -> None:
    records = [*records, ("version", b"3\n"), ("byteorder", b"little")]
    expected = torch_file_writer(records, alignment=alignment, crc32=crc32)
    assert write_archive(records, alignment=alignment, crc32=crc32) == expected


def test_writer_directory_names_match_torch() -> None:
    records = [("d/", b""), ("", b""), ("version", b"3\n"), ("byteorder", b"little")]
    assert write_archive(records) == torch_file_writer(records)


def test_writer_ignores_a_caller_written_serialization_id_like_torch() -> None:
    records = [("a", b"1"), (SERIALIZATION_ID_NAME, b"x" * 40), ("version", b"3\n"),
               ("byteorder", b"little")]  # fmt: skip
    assert write_archive(records) == torch_file_writer(records)


def test_writer_skip_data_matches_torch_file_writer() -> None:
    records = [("data/0", bytes(100)), ("data/1", b""), ("version", b"3\n"), ("byteorder", b"big")]
    expected = torch_file_writer(records, skip=["data/0", "data/1"])
    out = io.BytesIO()
    writer = ZipWriter(out.write, "archive")
    writer.write_record_skip_data("data/0", 100)
    writer.write_record_skip_data("data/1", 0)
    writer.write_record("version", b"3\n")
    writer.write_record("byteorder", b"big")
    writer.close()
    assert out.getvalue() == expected
