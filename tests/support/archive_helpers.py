"""Helpers shared by the archive tests: torch oracles and a reader-to-writer rebuild."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from pathlib import Path

from ptfile._io.local import BytesSource
from ptfile.archive import SERIALIZATION_ID_NAME, ZipReader, ZipWriter

GOLDEN = Path(__file__).parent.parent / "golden"
#: The golden files torch.save wrote (the others are hand-built or not ZIP).
TORCH_WRITTEN = [
    "tiny_tensor.pt",
    "tiny_state_dict.pt",
    "tiny_views.pt",
    "tiny_dtypes.pt",
    "tiny_buffer_nocrc.pt",
]
ZIP_GOLDEN = [*TORCH_WRITTEN, "tiny_bigendian.pt"]
NOT_ZIP_GOLDEN = ["tiny_legacy.pt", "tiny_tar.pt"]

Records = Sequence[tuple[str, bytes]]
Payloads = Sequence[tuple[str, "bytes | memoryview"]]


def write_archive(
    records: Payloads, prefix: str = "archive", *, alignment: int = 64, crc32: bool = True
) -> bytes:
    """``records`` (names without prefix) written by ZipWriter, as bytes."""
    out = io.BytesIO()
    writer = ZipWriter(out.write, prefix, alignment=alignment, crc32=crc32)
    for name, data in records:
        writer.write_record(name, data)
    writer.close()
    return out.getvalue()


def rebuild(data: bytes) -> bytes:
    """Read a torch archive and write its records again with ZipWriter, same options."""
    reader = ZipReader(BytesSource(data))
    prefix = reader.prefix
    alignment_record = reader.get(f"{prefix}/.storage_alignment")
    alignment = int(reader.read(alignment_record)) if alignment_record else 64
    crc32 = any(record.crc32 for record in reader.records)
    records = [
        (record.name.split("/", 1)[1], reader.read(record))
        for record in reader.records
        if record.name != f"{prefix}/{SERIALIZATION_ID_NAME}"
    ]
    return write_archive(records, prefix, alignment=alignment, crc32=crc32)


def torch_file_writer(
    records: Records, *, alignment: int = 64, crc32: bool = True, skip: Sequence[str] = ()
) -> bytes:
    """The same records written by torch's C++ PyTorchStreamWriter (prefix ``archive``).

    Names in ``skip`` are written with ``write_record_metadata`` (skip_data).
    torch appends ``version`` and ``byteorder`` itself when they are missing.
    """
    import torch

    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out, crc32, alignment)
    for name, data in records:
        if name in skip:
            writer.write_record_metadata(name, len(data))  # type: ignore[attr-defined]
        else:
            writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return out.getvalue()


@contextlib.contextmanager
def torch_save_options(*, alignment: int = 64, crc32: bool = True) -> Iterator[None]:
    """Set torch.save's storage alignment and CRC option, restoring both afterwards."""
    import torch
    import torch.utils.serialization.config as serialization_config

    config = serialization_config.save
    old_alignment = config.storage_alignment
    old_crc = torch.serialization.get_crc32_options()
    config.storage_alignment = alignment
    torch.serialization.set_crc32_options(crc32)
    try:
        yield
    finally:
        config.storage_alignment = old_alignment
        torch.serialization.set_crc32_options(old_crc)


def zip64_sample() -> bytes:
    """A small hand-built archive whose central directory and end records all use ZIP64.

    Record ``archive/a`` has every 32-bit field at its sentinel, with a
    timestamp extra before its ZIP64 extra; ``archive/b`` only its offset;
    the EOCD holds sentinels everywhere so the ZIP64 EOCD must be used.
    """
    import struct
    import zlib

    from ptfile.archive.extra import ExtraField
    from ptfile.archive.records import (
        CentralDirectoryHeader,
        EndOfCentralDirectory,
            LocalFileHeader,
        Zip64EndOfCentralDirectory,
        Zip64Locator,
    )

    members = [(b"archive/a", b"hello"), (b"archive/b", b"world!")]
    body, central = b"", b""
    for index, (name, data) in enumerate(members):
        offset, crc = len(body), zlib.crc32(data)
        body += LocalFileHeader(
            flags=0x0800, crc32=crc, compressed_size=len(data), uncompressed_size=len(data),
            name=name,
        ).to_bytes() + data  # fmt: skip
        if index == 0:
            sizes = (0xFFFFFFFF, 0xFFFFFFFF)
            zip64 = ExtraField(1, struct.pack("<3Q", len(data), len(data), offset))
            extra = ExtraField(0x5455, b"\x01\x00\x00\x00\x00").to_bytes() + zip64.to_bytes()
        else:
            sizes = (len(data), len(data))
            extra = ExtraField(1, struct.pack("<Q", offset)).to_bytes()
        central += CentralDirectoryHeader(
            version_made_by=45, version_needed=45, flags=0x0800, crc32=crc,
            compressed_size=sizes[0], uncompressed_size=sizes[1], header_offset=0xFFFFFFFF,
            name=name, extra=extra,
        ).to_bytes()  # fmt: skip
    eocd64 = Zip64EndOfCentralDirectory(
        entries_on_disk=2, total_entries=2, cd_size=len(central), cd_offset=len(body)
    )
    locator = Zip64Locator(eocd64_offset=len(body) + len(central))
    eocd = EndOfCentralDirectory(0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    return body + central + eocd64.to_bytes() + locator.to_bytes() + eocd.to_bytes()
