"""The one ZIP walk (:mod:`ptfile.archive.walk`): its strict and tolerant modes agree.

On every well-formed file of a small corpus (``torch.save`` outputs, TorchScript,
``.pt2``, ZIP64, deflated, a directory large enough for the vectorised passes)
both modes read the same members at the same offsets, the tolerant one reports
nothing, and the loader's :class:`~ptfile.archive.ZipReader` reads the same.

For each kind of damage the strict mode raises what the loader raises (the same
error, as the loader's reader is built on the same steps) and the tolerant mode
reports the matching anomaly; for each oddity the loader accepts, the strict
mode reads the file as the loader does and the tolerant mode reports it.  Every
anomaly code the walk's parsers can report has a case.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from archive_helpers import GOLDEN, ZIP_GOLDEN, torch_save_options, write_archive, zip64_sample
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader
from ptfile.archive.records import (
    CentralDirectoryHeader,
    EndOfCentralDirectory,
    LocalFileHeader,
    Zip64Locator,
)
from ptfile.archive.walk import ZipEntry, walk_zip
from ptfile.errors import (
    ArchiveError,
    LimitExceededError,
    PtfileError,
    UnsupportedFeatureError,
)
from ptfile.limits import DEFAULT_LIMITS, Limits

ARCHIVE = Path(__file__).resolve().parents[2] / "src" / "ptfile" / "archive"
Member = tuple[str, int, int, int, int, int]


# --------------------------------------------------------------------------- corpus


def _torch_save(obj: object, **options: int | bool) -> Callable[[], bytes]:
    def make() -> bytes:
        out = io.BytesIO()
        with torch_save_options(**options):  # type: ignore[arg-type]
            torch.save(obj, out)
        return out.getvalue()

    return make


class _Scripted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x).relu()
        return out


def _torchscript() -> bytes:
    out = io.BytesIO()
    torch.jit.save(torch.jit.script(_Scripted()), out)
    return out.getvalue()


def _deflated() -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(list(range(100)), protocol=2))
        archive.writestr("archive/version", b"3\n")
        archive.comment = b"a comment"
    return out.getvalue()


def _golden(name: str) -> Callable[[], bytes]:
    return (GOLDEN / name).read_bytes


CORPUS: dict[str, Callable[[], bytes]] = {
    **{name: _golden(name) for name in [*ZIP_GOLDEN, "tiny_export.pt2"]},
    "torch.save state_dict": _torch_save({"w": torch.arange(6.0).view(2, 3), "step": 3}),
    "torch.save views, 4096-aligned, no CRC": _torch_save(
        [torch.arange(10)[2:], torch.ones(2, dtype=torch.float16)], alignment=4096, crc32=False),
    "torchscript": _torchscript,
    "zip64": zip64_sample,
    "deflated": _deflated,
    "1500 records": lambda: write_archive([(f"r{i}", bytes([i % 251]) * (i % 7))
                                           for i in range(1500)]),
}


def _members(entries: list[ZipEntry]) -> list[Member]:
    return [(e.name, e.header_offset, e.data_offset, e.size, e.compressed_size, e.method)
            for e in entries]


def _loader_members(data: bytes) -> list[Member]:
    """What the loader's reader reads: each record's fields and checked data offset."""
    reader = ZipReader(BytesSource(data))
    members = []
    for r in reader.records:
        members.append((r.name, r.header_offset, reader.data_offset(r), r.size,
                        r.compressed_size, r.method))
        reader.read(r)
    return members


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_walk_strict_and_tolerant_modes_agree_on_well_formed_files(name: str) -> None:
    data = CORPUS[name]()
    strict, none = walk_zip(BytesSource(data), tolerant=False)
    tolerant = walk_zip(BytesSource(data), tolerant=True)
    assert none == []
    assert tolerant == (strict, [])
    assert _members(strict) == _loader_members(data)


def test_walk_of_a_file_without_end_record() -> None:
    data = b"PK\x03\x04 and no end record"
    assert walk_zip(BytesSource(data), tolerant=True) is None
    with pytest.raises(ArchiveError, match="no end of central directory record"):
        walk_zip(BytesSource(data), tolerant=False)


# --------------------------------------------------------------------------- damage

D, V = b"archive/data.pkl", b"archive/version"
PKL, VERSION = pickle.dumps({"v": 1}, protocol=2), b"3\n"
GOOD = ((D, PKL), (V, VERSION))
SENTINEL = 0xFFFFFFFF

LocalEdit = Callable[[int, LocalFileHeader], LocalFileHeader]
CentralEdit = Callable[[int, CentralDirectoryHeader], CentralDirectoryHeader]


def zip_bytes(members: tuple[tuple[bytes, bytes], ...] = GOOD, *, prefix: bytes = b"",
              local: LocalEdit = lambda i, h: h, central: CentralEdit = lambda i, h: h,
              end: Callable[[EndOfCentralDirectory], EndOfCentralDirectory] = lambda e: e,
              gaps: dict[int, bytes] | None = None, before_end: bytes = b"",
              after: bytes = b"") -> bytes:
    """A stored archive built from the record classes, each record open to an edit."""
    body, headers = bytearray(prefix), []
    for i, (name, data) in enumerate(members):
        crc, n = zlib.crc32(data), len(data)
        headers.append(central(i, CentralDirectoryHeader(
            crc32=crc, compressed_size=n, uncompressed_size=n, header_offset=len(body),
            name=name)))
        header = LocalFileHeader(crc32=crc, compressed_size=n, uncompressed_size=n, name=name)
        body += local(i, header).to_bytes() + data + (gaps or {}).get(i, b"")
    directory = b"".join(h.to_bytes() for h in headers)
    record = end(EndOfCentralDirectory(0, 0, len(headers), len(headers), len(directory),
                                       len(body)))
    return bytes(body) + directory + before_end + record.to_bytes() + after


def _patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _second_local_header() -> int:
    return LocalFileHeader.SIZE + len(D) + len(PKL)


def _comment_cut_off() -> bytes:
    data = zip_bytes()
    end = EndOfCentralDirectory.from_bytes(data, len(data) - EndOfCentralDirectory.SIZE)
    return data[:-EndOfCentralDirectory.SIZE] + dataclasses.replace(
        end, comment=b"\0" * 255).to_bytes()[:EndOfCentralDirectory.SIZE]


class Case(NamedTuple):
    make: Callable[[], bytes]
    #: What the strict mode (and the loader) raises; None: the loader accepts the file.
    raises: type[PtfileError] | None
    limits: Limits = DEFAULT_LIMITS


#: anomaly code (and a variant) → the file, what strict mode does, the limits
CASES: dict[str, Case] = {
    # The end records (archive.directory).
    "data-after-archive": Case(lambda: zip_bytes(after=b"trailing"), ArchiveError),
    "shifted-directory": Case(lambda: zip_bytes(before_end=b"\0" * 8), ArchiveError),
    "spanned-archive": Case(lambda: zip_bytes(end=lambda e: dataclasses.replace(
        e, disk_number=1)), UnsupportedFeatureError),
    "bad-central-directory": Case(lambda: zip_bytes(end=lambda e: dataclasses.replace(
        e, entries_on_disk=3, total_entries=3)), ArchiveError),
    "bad-central-directory (max_records)": Case(zip_bytes, LimitExceededError,
                                                Limits(max_records=1)),
    "bad-zip64-end": Case(lambda: zip_bytes(
        end=lambda e: dataclasses.replace(e, entries_on_disk=0xFFFF, total_entries=0xFFFF),
        before_end=Zip64Locator(0, 0, 1).to_bytes()), ArchiveError),
    "bad-zip64-end (unused)": Case(lambda: zip_bytes(
        before_end=Zip64Locator(0, 0, 1).to_bytes()), None),
    "archive-in-comment": Case(lambda: zip_bytes(end=lambda e: dataclasses.replace(
        e, comment=zip_bytes()[:-EndOfCentralDirectory.SIZE])), None),
    "several-end-records": Case(lambda: zip_bytes(prefix=zip_bytes()), None),
    "comment-past-end": Case(_comment_cut_off, None),
    # The central directory (archive._entries).
    "name-too-long": Case(zip_bytes, LimitExceededError, Limits(max_name_length=8)),
    "bad-name": Case(lambda: zip_bytes((*GOOD, (b"archive/\xff", b""))), ArchiveError),
    "encrypted-record": Case(lambda: zip_bytes(central=lambda i, h: dataclasses.replace(
        h, flags=1) if i == 1 else h), UnsupportedFeatureError),
    "bad-sizes": Case(lambda: zip_bytes(central=lambda i, h: dataclasses.replace(
        h, compressed_size=1) if i == 1 else h), ArchiveError),
    "bad-zip64-extra": Case(lambda: zip_bytes(central=lambda i, h: dataclasses.replace(
        h, uncompressed_size=SENTINEL) if i == 1 else h), ArchiveError),
    "data-outside-archive": Case(lambda: zip_bytes(central=lambda i, h: dataclasses.replace(
        h, compressed_size=10_000, uncompressed_size=10_000) if i == 1 else h), ArchiveError),
    "duplicate-name": Case(lambda: zip_bytes(((D, PKL), (D, PKL), (V, VERSION))),
                           ArchiveError),
    "case-colliding-names": Case(lambda: zip_bytes(((D, PKL), (b"archive/DATA.pkl", PKL),
                                                    (V, VERSION))), ArchiveError),
    "overlapping-records": Case(lambda: zip_bytes(central=lambda i, h: dataclasses.replace(
        h, header_offset=0) if i == 1 else h), ArchiveError),
    # The local headers (archive.walk.read_local_header).
    "bad-local-header": Case(lambda: b"XXXX" + zip_bytes()[4:], ArchiveError),
    "bad-local-header (past the end)": Case(lambda: zip_bytes(
        central=lambda i, h: dataclasses.replace(h, header_offset=1 << 20) if i == 1 else h),
        ArchiveError),
    "name-mismatch": Case(lambda: zip_bytes(local=lambda i, h: dataclasses.replace(
        h, name=b"archive/dat_.pkl") if i == 0 else h), ArchiveError),
    "data-outside-archive (local extra)": Case(lambda: _patched(
        zip_bytes(), _second_local_header() + 28, "<H", 100), ArchiveError),
    # What only a scanner asks (archive.walk, tolerant mode): the loader reads these.
    "local-header-mismatch": Case(lambda: zip_bytes(local=lambda i, h: dataclasses.replace(
        h, crc32=0) if i == 0 else h), None),
    "outside-prefix": Case(lambda: zip_bytes((*GOOD, (b"other/x", b""))), None),
    "bytes-before-first-record": Case(lambda: zip_bytes(prefix=b"junk"), None),
    "shadow-record": Case(lambda: zip_bytes(gaps={0: LocalFileHeader(
        compressed_size=len(PKL), uncompressed_size=len(PKL), name=D).to_bytes() + PKL}), None),
    "scan-limit": Case(lambda: zip_bytes(prefix=b"\0" * 100), None,
                       Limits(max_shadow_search_bytes=1)),
}


def _code(case: str) -> str:
    return case.split(" (", 1)[0]


def _loader_reads(data: bytes, limits: Limits) -> list[Member]:
    """Every record the loader's reader finds, read whole (raises what the loader raises)."""
    reader = ZipReader(BytesSource(data), limits=limits)
    found = []
    for r in reader.records:
        found.append((r.name, r.header_offset, reader.data_offset(r), r.size,
                      r.compressed_size, r.method))
        reader.read(r)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_walk_strict_mode_raises_where_the_tolerant_mode_reports(case: str) -> None:
    make, raises, limits = CASES[case]
    data = make()
    walked = walk_zip(BytesSource(data), limits, tolerant=True)
    assert walked is not None
    entries, anomalies = walked
    assert _code(case) in {a.code for a in anomalies}, anomalies
    if raises is None:  # an oddity the loader accepts: strict mode reads what the loader does
        strict, _ = walk_zip(BytesSource(data), limits, tolerant=False)
        assert _members(strict) == _loader_reads(data, limits)
        assert _members(strict) == _members([e for e in entries if not e.shadow])
        return
    with pytest.raises(raises) as walk_error:
        walk_zip(BytesSource(data), limits, tolerant=False)
    with pytest.raises(raises) as loader_error:
        _loader_reads(data, limits)
    assert type(walk_error.value) is type(loader_error.value)
    assert str(walk_error.value) == str(loader_error.value)


def _reported_codes() -> set[str]:
    """The anomaly codes the walk's parsers can report, read from their source."""
    pattern = re.compile(r'(?:Anomaly\(|report\([^,()]+,|yield)\s*"([a-z0-9]+(?:-[a-z0-9]+)+)"')
    return {code for module in ("directory.py", "_entries.py", "walk.py")
            for code in pattern.findall((ARCHIVE / module).read_text(encoding="utf-8"))}


def test_walk_cases_cover_every_anomaly_code() -> None:
    codes = _reported_codes()
    assert {"archive-in-comment", "several-end-records", "shadow-record"} <= codes
    assert codes == {_code(case) for case in CASES}
