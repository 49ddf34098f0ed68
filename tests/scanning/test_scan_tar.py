"""The scanner reads a tar checkpoint as the loader and stdlib ``tarfile`` (torch's reader) do.

Each file below hides a ``posix.system`` call where torch would unpickle it;
the oracle for "where torch reads" is stdlib ``tarfile`` (which
``torch.serialization`` uses for this format) or torch itself, and for "where
ptfile reads" ptfile's own loader.  Each test failed before the scanner used
the loader's tar header parser (:mod:`ptfile.archive.tar`).
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import pytest
import torch

import ptfile
from ptfile._io.local import BytesSource
from ptfile.archive.tar import read_members
from ptfile.limits import DEFAULT_LIMITS

#: A pickle that calls posix.system('id') (never unpickled here).
SYSTEM = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00id\x85R."
GOOD = pickle.dumps({"w": 1}, protocol=2)
CALLS: list[tuple[object, ...]] = []


def record_call(*args: object) -> None:
    """A global the torch oracle test lets torch call."""
    CALLS.append(args)


def tar_of(members: list[tuple[str, bytes, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar archive of ``(name, type, data)`` members, as stdlib ``tarfile`` writes it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def checkpoint_with_pickle(kind: bytes, payload: bytes = SYSTEM) -> bytes:
    empty = pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2)
    return tar_of([("sys_info", tarfile.REGTYPE, pickle.dumps({}, protocol=2)),
                   ("pickle", kind, payload), ("tensors", tarfile.REGTYPE, pickle.dumps(0, 2)),
                   ("storages", tarfile.REGTYPE, empty)])


@pytest.mark.parametrize("kind", [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE],
                         ids=["0", "nul", "7"])
def test_issue_11_tar_regular_types_are_scanned(kind: bytes) -> None:
    data = checkpoint_with_pickle(kind)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # torch's reader sees a regular file
        member = tar.getmember("pickle")
        assert member.isreg()
        assert tar.extractfile(member).read() == SYSTEM  # type: ignore[union-attr]
    members = read_members(BytesSource(data), DEFAULT_LIMITS)
    assert "pickle" in {m.name for m in members}  # so does ptfile's loader
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert "posix.system" in result.unsafe_globals
    assert {f.location for f in result.findings if f.qualname == "posix.system"} == {"tar:pickle"}


def test_issue_11_tar_pax_size_is_the_size_the_scanner_uses() -> None:
    # The ustar size field says 0; the PAX record before it gives the real size.
    # tarfile (and the loader) read the payload as the member; a scanner that
    # trusts the ustar field reads the payload as the next header.
    body = SYSTEM + b"\0" * (512 - len(SYSTEM))
    data = bytearray(tar_of([("pickle", tarfile.REGTYPE, body)]))
    record = f" size={len(body)}\n"
    pax_size = f"{len(record) + 2}{record}".encode()  # the length counts its own two digits
    pax = tar_of([("././@PaxHeader", tarfile.XHDTYPE, pax_size)], tarfile.USTAR_FORMAT)[:1024]
    ustar = bytearray(data[data.index(b"pickle\0"):][:512])
    ustar[124:136] = b"00000000000\0"
    ustar[148:156] = b" " * 8
    ustar[148:156] = f"{sum(ustar):06o}\0 ".encode()
    crafted = pax + bytes(ustar) + body + bytes(1024)
    with tarfile.open(fileobj=io.BytesIO(crafted)) as tar:
        assert tar.extractfile("pickle").read() == body  # type: ignore[union-attr]
    assert [m.size for m in read_members(BytesSource(crafted), DEFAULT_LIMITS)] == [512]
    assert ptfile.scan(crafted).is_dangerous


def _bad_tar_with_pickle_at_zero(payload: bytes) -> bytes:
    """One ustar-looking header whose name field holds a pickle and whose checksum is wrong."""
    header = bytearray(512)
    header[:len(payload)] = payload
    header[124:136] = b"00000000000\0"
    header[148:156] = b"0000000\0"
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    return bytes(header) + bytes(1024)


def test_issue_11_unreadable_tar_is_scanned_as_torch_falls_back(tmp_path: Path) -> None:
    # torch.load gives up on a tar tarfile cannot open and unpickles the file from byte 0.
    CALLS.clear()
    oracle = tmp_path / "oracle.pt"
    global_op = f"c{__name__}\nrecord_call\n".encode()
    oracle.write_bytes(_bad_tar_with_pickle_at_zero(b"\x80\x02" + global_op + b")R."))
    with pytest.raises(Exception):  # noqa: B017, PT011 - then its magic number check fails
        torch.load(oracle, weights_only=False)
    assert CALLS == [()]
    data = _bad_tar_with_pickle_at_zero(SYSTEM)
    with pytest.raises(ptfile.FormatError):
        ptfile.load(io.BytesIO(data))
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert "posix.system" in result.unsafe_globals


def test_tar_golden_file_scan_stays_clean() -> None:
    result = ptfile.scan(Path(__file__).parents[1] / "golden" / "tiny_tar.pt")
    assert result.is_clean, result.findings
    assert result.format == "tar"


def test_tar_pickle_at_byte_0_longer_than_a_header_is_read_whole() -> None:
    # The ustar magic sits inside a 4000-byte string the pickle opens with.
    text = bytearray(b"x" * 4000)
    text[257 - 7:257 - 7 + 8] = b"ustar\x0000"
    data = b"\x80\x02X" + len(text).to_bytes(4, "little") + bytes(text) + b"0" + SYSTEM[2:]
    result = ptfile.scan(data + bytes(1024))
    assert result.format == "tar"
    assert "posix.system" in result.unsafe_globals


def test_issue_11_tar_pickles_after_storage_bytes_are_scanned_where_the_loader_reads() -> None:
    # The views list follows the storage bytes; the loader finds it by the counts,
    # a scanner searching for PROTO opcodes misses a protocol 0 pickle there.
    views = b"cposix\nsystem\n(S'id'\ntR."
    storages = (pickle.dumps(1, protocol=2)
                + pickle.dumps((1, "cpu", torch.FloatStorage), protocol=2)
                + (2).to_bytes(8, "little") + bytes(8) + views)
    data = tar_of([("sys_info", tarfile.REGTYPE, pickle.dumps({}, protocol=2)),
                   ("pickle", tarfile.REGTYPE, GOOD),
                   ("tensors", tarfile.REGTYPE, pickle.dumps(0, 2)),
                   ("storages", tarfile.REGTYPE, storages)])
    with pytest.raises(ptfile.UnsafeGlobalError, match="posix"):  # the loader unpickles it
        ptfile.load(io.BytesIO(data))
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert {f.location for f in result.findings if f.qualname == "posix.system"} == \
        {"tar:storages"}


def _linked_checkpoint(payload: bytes, kind: bytes, link: str = "pickle",
                       target: str = "x.npy") -> bytes:
    """A legacy tar whose ``link`` member is a link to ``target``, a member torch never
    reads by name that holds ``payload``."""
    empty = pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2)
    regular = {"sys_info": pickle.dumps({}, 2), "pickle": GOOD, "tensors": pickle.dumps(0, 2),
               "storages": empty, target: payload}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in regular.items():
            if name == link:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(link)
        info.type, info.linkname = kind, target
        tar.addfile(info)
    return out.getvalue()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE], ids=["symlink", "hardlink"])
def test_a_tar_link_named_pickle_is_read_as_torch_reads_it(kind: bytes, tmp_path: Path) -> None:
    # tarfile.extractfile("pickle") follows the link: torch unpickles x.npy's bytes (torch
    # tries tarfile only on real files).
    CALLS.clear()
    oracle = tmp_path / "oracle.pt"
    oracle.write_bytes(_linked_checkpoint(b"\x80\x02c" + __name__.encode()
                                          + b"\nrecord_call\n)R.", kind))
    torch.load(oracle, weights_only=False)
    assert CALLS == [()]
    data = _linked_checkpoint(SYSTEM, kind)
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert "tar:pickle" in {f.location for f in result.findings if f.qualname == "posix.system"}
    assert "tar-link" in {f.name for f in result.findings if f.kind == "archive"}
    with pytest.raises(ptfile.PtfileError):  # the loader follows no link: 'pickle' is missing
        ptfile.load(io.BytesIO(data))


def test_strict_tar_reading_still_skips_links() -> None:
    data = _linked_checkpoint(SYSTEM, tarfile.SYMTYPE)
    assert "pickle" not in {m.name for m in read_members(BytesSource(data), DEFAULT_LIMITS)}
