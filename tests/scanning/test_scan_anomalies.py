"""Every ZIP anomaly kind the tolerant walk reports, each on a file crafted to have it.

Files are built from ptfile's record classes (``archive.records``) or with
``hostile.raw_zip``.  For each, the scan names the anomaly and is not clean;
where the strict reader (the loader's) refuses the file, it raises a
:class:`ptfile.PtfileError`, so the tolerant mode reports what strict mode raises.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import zlib
from collections.abc import Callable

import pytest
import torch

import ptfile
from hostile import checkpoint, raw_zip
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader
from ptfile.archive.records import (
    CentralDirectoryHeader,
    EndOfCentralDirectory,
    LocalFileHeader,
    Zip64Locator,
)
from ptfile.limits import Limits

A, B = pickle.dumps({"v": 1}, protocol=2), pickle.dumps({"v": 2}, protocol=2)
D, V = "archive/data.pkl", "archive/version"
VERSION = b"3\n"
SYSTEM = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00id\x85R."


def zip_of(members: list[tuple[bytes, bytes]],
           central: Callable[[int, CentralDirectoryHeader], CentralDirectoryHeader] = lambda i, h: h,
           end: Callable[[EndOfCentralDirectory], EndOfCentralDirectory] = lambda e: e,
           before_end: bytes = b"") -> bytes:
    """A stored archive from the record classes; ``central``/``end`` may change records."""
    body, headers = b"", []
    for i, (name, data) in enumerate(members):
        crc = zlib.crc32(data)
        headers.append(central(i, CentralDirectoryHeader(
            crc32=crc, compressed_size=len(data), uncompressed_size=len(data),
            header_offset=len(body), name=name)))
        body += LocalFileHeader(crc32=crc, compressed_size=len(data),
                                uncompressed_size=len(data), name=name).to_bytes() + data
    directory = b"".join(h.to_bytes() for h in headers)
    record = end(EndOfCentralDirectory(0, 0, len(headers), len(headers), len(directory),
                                       len(body)))
    return body + directory + before_end + record.to_bytes()


GOOD = [(D.encode(), A), (V.encode(), VERSION)]
SENTINEL = 0xFFFFFFFF

#: anomaly code → (file, whether the strict reader refuses it)
CRAFTED: dict[str, tuple[Callable[[], bytes], bool]] = {
    "bytes-before-first-record": (lambda: raw_zip([(D, A), (V, VERSION)], prefix=b"junk"),
                                  False),
    "data-after-archive": (lambda: checkpoint(A) + b"trailing", False),
    "archive-in-comment": (lambda: raw_zip([(D, A), (V, VERSION)],
                                           comment=raw_zip([(D, B), (V, VERSION)])), False),
    "several-end-records": (lambda: raw_zip([(D, B), (V, VERSION)]) + checkpoint(A), False),
    "duplicate-name": (lambda: raw_zip([(D, A), (D, B), (V, VERSION)]), True),
    "case-colliding-names": (lambda: raw_zip([(D, A), ("archive/DATA.pkl", B),
                                              (V, VERSION)]), True),
    "name-mismatch": (lambda: raw_zip([(D, A), (V, VERSION)],
                                      local_names={0: "archive/other.pkl"}), True),
    "bad-local-header": (lambda: b"XXXX" + raw_zip([(D, A), (V, VERSION)])[4:], True),
    "data-outside-archive": (lambda: raw_zip([(D, A), (V, VERSION)], sizes={1: 10_000}), True),
    "overlapping-records": (lambda: raw_zip([(D, A), (V, VERSION)],
                                            central=[(D, 0), (V, 1), ("archive/x", 0)]), True),
    "shadow-record": (lambda: raw_zip([(D, B), (D, A), (V, VERSION)],
                                      central=[(D, 1), (V, 2)]), False),
    "outside-prefix": (lambda: raw_zip([(D, A), (V, VERSION), ("other/x", b"")]), False),
    "bad-central-directory": (lambda: zip_of(GOOD, end=lambda e: dataclasses.replace(
        e, entries_on_disk=3, total_entries=3)), True),
    "bad-name": (lambda: zip_of([*GOOD, (b"archive/\xff", b"")]), True),
    "encrypted-record": (lambda: zip_of(GOOD, central=lambda i, h: dataclasses.replace(
        h, flags=1) if i == 1 else h), True),
    "bad-sizes": (lambda: zip_of(GOOD, central=lambda i, h: dataclasses.replace(
        h, compressed_size=1) if i == 1 else h), True),
    "bad-zip64-extra": (lambda: zip_of(GOOD, central=lambda i, h: dataclasses.replace(
        h, uncompressed_size=SENTINEL) if i == 1 else h), True),
    "bad-zip64-end": (lambda: zip_of(GOOD, before_end=Zip64Locator(0, 0, 1).to_bytes()), False),
    "spanned-archive": (lambda: zip_of(GOOD, end=lambda e: dataclasses.replace(
        e, disk_number=1)), True),
}


def _read_all(data: bytes) -> None:
    reader = ZipReader(BytesSource(data))
    for record in reader.records:
        reader.read(record)


def _codes(result: ptfile.ScanResult) -> set[str]:
    return {f.name for f in result.findings if f.kind == "archive"}


@pytest.mark.parametrize("code", sorted(CRAFTED))
def test_scan_reports_each_zip_anomaly(code: str) -> None:
    make, refused = CRAFTED[code]
    data = make()
    result = ptfile.scan(data)
    assert code in _codes(result), [f.name for f in result.findings]
    assert not result.is_clean
    if refused:
        with pytest.raises(ptfile.PtfileError):
            _read_all(data)


def test_scan_reports_a_name_over_the_limit_and_reads_its_record() -> None:
    result = ptfile.scan(checkpoint(SYSTEM), limits=Limits(max_name_length=8))
    assert "name-too-long" in _codes(result)
    assert {f.location for f in result.findings if f.qualname == "posix.system"} == {D}


def test_scan_reads_the_end_record_torch_reads_and_the_one_before() -> None:
    # The last end record's comment runs past the end of the file; miniz (torch)
    # takes it, and so do the loader and the scanner, which also scans the archive
    # of the end record before it.
    first = raw_zip([(D, SYSTEM), (V, VERSION)])
    both = raw_zip([(D, B), (V, VERSION)], prefix=first)
    end = EndOfCentralDirectory.from_bytes(both, len(both) - EndOfCentralDirectory.SIZE)
    data = both[:-EndOfCentralDirectory.SIZE] + dataclasses.replace(
        end, comment=b"\0" * 255).to_bytes()[:EndOfCentralDirectory.SIZE]  # comment cut off
    assert ZipReader(BytesSource(data)).read(D) == B
    result = ptfile.scan(data)
    assert {"several-end-records", "comment-past-end"} <= _codes(result)
    assert "posix.system" in result.unsafe_globals


def test_scan_of_tensor_bytes_holding_an_end_signature_is_clean() -> None:
    # Only an end record with a directory before it is another archive's; before,
    # any 'PK\x05\x06' in the last 64 KiB (here: tensor data) made the scan unclean.
    buf = io.BytesIO()
    torch.save({"t": torch.frombuffer(bytearray(b"PK\x05\x06" * 16), dtype=torch.uint8)}, buf)
    result = ptfile.scan(buf.getvalue())
    assert result.is_clean, [f for f in result.findings if f.kind == "archive"]
