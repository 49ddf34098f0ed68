"""One reading per file: ZIPs that torch (miniz), Python's ``zipfile`` and forward-scanning
readers would read differently are dangerous in ``scan``, and ``load`` refuses those that
torch and ``zipfile`` read differently.

Oracles: ``torch._C.PyTorchFileReader`` (torch's miniz reader), ``zipfile`` and
``torch.load``.  Each hostile generator has a benign twin written by torch, ptfile
or ``zipfile`` that must stay clean.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

import ptfile
from hostile import checkpoint, raw_zip
from ptfile.errors import ArchiveError
from ptfile.scanning import Verdict

EVIL = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00hi\x85R."
D, V = "archive/data.pkl", "archive/version"


def _same_length_benign() -> bytes:
    k = 0
    while len(pickle.dumps({"v": "x" * k}, protocol=2)) < len(EVIL):
        k += 1
    return pickle.dumps({"v": "x" * k}, protocol=2)


GOOD = _same_length_benign()


def two_directories() -> bytes:
    """Archive X (benign) with its directory, then archive Y (the payload) whose end record
    gives X's directory offset: miniz reads X; zipfile sees bytes between the directory
    and the end record, takes them for a prepended file and reads Y."""
    assert len(GOOD) == len(EVIL)
    x = raw_zip([(D, GOOD), (V, b"3\n")])
    return x[:x.rfind(b"PK\x05\x06")] + raw_zip([(D, EVIL), (V, b"3\n")])


def miniz_reads(data: bytes, name: str = "data.pkl") -> bytes:
    return bytes(torch._C.PyTorchFileReader(io.BytesIO(data)).get_record(name))


def test_zipfile_and_torch_read_two_different_archives() -> None:
    data = two_directories()
    assert zipfile.ZipFile(io.BytesIO(data)).read(D) == EVIL
    assert miniz_reads(data) == GOOD
    assert torch.load(io.BytesIO(data), weights_only=True) == pickle.loads(GOOD)


def test_scan_calls_the_shifted_reading_dangerous_and_scans_it() -> None:
    result = ptfile.scan(two_directories())
    assert result.is_dangerous
    shifted = [f for f in result.findings if f.name == "shifted-directory"]
    assert shifted and shifted[0].verdict is Verdict.DANGEROUS
    assert "posix.system" in result.unsafe_globals  # zipfile's reading, scanned


def test_load_refuses_the_shifted_reading() -> None:
    with pytest.raises(ArchiveError, match="zipfile shifts every offset"):
        ptfile.load(two_directories())


def test_a_concatenated_archive_is_read_as_zipfile_reads_it() -> None:
    # ``cat benign.pkl evil.zip``: torch unpickles the start, zipfile reads the archive
    # (offsets shifted by the prefix); the scan follows both.
    data = pickle.dumps({"v": 1}, protocol=2) + checkpoint(EVIL)
    assert zipfile.ZipFile(io.BytesIO(data)).read(D) == EVIL
    result = ptfile.scan(data)
    assert result.is_dangerous and "posix.system" in result.unsafe_globals
    assert {"polyglot", "shifted-directory"} <= {f.name for f in result.findings}


@pytest.mark.parametrize(("tail", "torch_reads"), [(b"x", True), (EVIL, True),
                                                   (b"\0" * 4096, False)])
def test_load_refuses_data_appended_after_the_archive(tail: bytes, torch_reads: bool) -> None:
    # zipfile reads the archive before the tail, and torch does for a short one, but a
    # longer tail moves torch's reading (4 KiB of zeros: ValueError, negative seek), and
    # what is appended is a place for a second payload (``cat model.pt evil.pkl``): load
    # refuses it, while the archive comment (part of the end record) stays allowed.
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3)}, buf)
    data = buf.getvalue() + tail
    if torch_reads:
        assert torch.equal(torch.load(io.BytesIO(data), weights_only=True)["w"], torch.arange(3))
    else:
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever torch's reader raises
            torch.load(io.BytesIO(data), weights_only=True)
    assert zipfile.ZipFile(io.BytesIO(data)).namelist()
    with pytest.raises(ArchiveError, match=f"{len(tail)} bytes after the end of the archive"):
        ptfile.load(data)
    result = ptfile.scan(data)
    assert not result.is_clean and "data-after-archive" in {f.name for f in result.findings}


def test_an_archive_comment_is_not_appended_data() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"v": 1}, protocol=2))
        archive.writestr("archive/version", b"3\n")
        archive.comment = b"made by a tool"
    assert ptfile.load(out.getvalue()) == {"v": 1}


def _patch_local(data: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


#: Local headers that disagree with the directory: (offset in the local header, format, values).
MISMATCHES = {"method": (8, "<H", 8), "compressed_size": (18, "<I", 3), "crc32": (14, "<I", 7)}


@pytest.mark.parametrize("field", sorted(MISMATCHES))
def test_a_local_header_that_disagrees_with_the_directory_is_dangerous(field: str) -> None:
    data = _patch_local(raw_zip([(D, pickle.dumps({"v": 1}, 2)), (V, b"3\n")]),
                        *MISMATCHES[field])
    # miniz and zipfile read the directory's values: the record reads the same to both.
    assert miniz_reads(data) == pickle.dumps({"v": 1}, 2)
    result = ptfile.scan(data)
    found = [f for f in result.findings if f.name == "local-header-mismatch"]
    assert found and found[0].verdict is Verdict.DANGEROUS, result.findings
    assert result.is_dangerous


def test_a_hidden_record_is_dangerous_even_when_both_readings_are_benign() -> None:
    a, b = pickle.dumps({"v": 1}, 2), pickle.dumps({"v": 2}, 2)
    data = raw_zip([(D, b), (D, a), (V, b"3\n")], central=[(D, 1), (V, 2)])
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert [f.name for f in result.findings if f.verdict is Verdict.DANGEROUS] == ["shadow-record"]


# --------------------------------------------------------------------------- benign twins


def _rezipped(data: bytes, compression: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w", compression) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    return out.getvalue()


def _torch_saved(**kwargs: object) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "n": 3}, buf, **kwargs)  # type: ignore[arg-type]
    return buf.getvalue()


BENIGN = {
    "torch": lambda: _torch_saved(),
    "torch_legacy": lambda: _torch_saved(_use_new_zipfile_serialization=False),
    "zipfile_stored": lambda: _rezipped(_torch_saved(), zipfile.ZIP_STORED),
    "zipfile_deflated": lambda: _rezipped(_torch_saved(), zipfile.ZIP_DEFLATED),
    "ptfile": lambda: _ptfile_saved(),
}


def _ptfile_saved() -> bytes:
    out = io.BytesIO()
    ptfile.save({"w": np.ones(3, "float32")}, out)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_archives_torch_zipfile_and_ptfile_write_read_one_way(name: str) -> None:
    data = BENIGN[name]()
    result = ptfile.scan(data)
    assert result.is_clean, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    ptfile.load(data)


def test_a_legacy_file_whose_tensor_bytes_hold_an_end_signature_is_no_polyglot() -> None:
    values = torch.frombuffer(bytearray(b"PK\x05\x06" + bytes(60)), dtype=torch.uint8).clone()
    buf = io.BytesIO()
    torch.save({"t": values}, buf, _use_new_zipfile_serialization=False)
    result = ptfile.scan(buf.getvalue())
    assert result.is_clean, result.findings
