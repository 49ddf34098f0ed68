"""ptfile.archive.tar: one tar reader, strict (loader) and tolerant (scanner), against tarfile."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile
from ptfile._io.local import BytesSource
from ptfile.archive.anomalies import Anomaly
from ptfile.archive.tar import read_members
from ptfile.limits import DEFAULT_LIMITS, Limits

FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
KINDS = [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE]


def tar_of(members: list[tuple[str, bytes, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data) if kind in tarfile.REGULAR_TYPES else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return out.getvalue()


def _tarfile_members(data: bytes, links: bool = False) -> list[tuple[str, bytes]]:
    """What tarfile reads: regular members, and links whose target it finds (``links``)."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if m.isreg() or (links and (m.issym() or m.islnk())):
                try:
                    file = tar.extractfile(m)
                except KeyError:  # a link to no member
                    continue
                if file is not None:
                    out.append((m.name, file.read()))
    return out


def _ours(data: bytes, anomalies: list[Anomaly] | None = None) -> list[tuple[str, bytes]]:
    return [(m.name, data[m.offset:m.offset + m.size])
            for m in read_members(BytesSource(data), DEFAULT_LIMITS, anomalies)]


NAMES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/"),
                min_size=1, max_size=150)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(NAMES, st.sampled_from(KINDS), st.binary(max_size=1500)),
                max_size=6), st.sampled_from(FORMATS))
def test_tar_strict_and_tolerant_read_what_tarfile_reads(
        members: list[tuple[str, bytes, bytes]], fmt: int) -> None:
    try:
        data = tar_of(members, fmt)
    except ValueError:  # a name too long for ustar
        return
    anomalies: list[Anomaly] = []
    # Strict mode follows no link; tolerant mode lists links as tarfile reads them.
    assert _ours(data) == _tarfile_members(data)
    assert _ours(data, anomalies) == _tarfile_members(data, links=True)
    assert [a.code for a in anomalies] == ["tar-link"] * sum(k == tarfile.SYMTYPE
                                                              for _, k, _ in members)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
@pytest.mark.parametrize("target_first", [True, False])
def test_tar_links_read_their_target_as_tarfile_does(kind: bytes, target_first: bool) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        link = tarfile.TarInfo("d/pickle")
        link.type, link.linkname = kind, "x.npy" if kind == tarfile.SYMTYPE else "d/x.npy"
        target = tarfile.TarInfo("d/x.npy")
        target.size = 3
        for info in ([target, link] if target_first else [link, target]):
            tar.addfile(info, io.BytesIO(b"abc") if info is target else None)
    data = out.getvalue()
    assert _ours(data, []) == _tarfile_members(data, links=True)


def _header_fix(header: bytearray) -> bytearray:
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return header


def _tolerant(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[list[str], list[str]]:
    anomalies: list[Anomaly] = []
    members = read_members(BytesSource(data), limits, anomalies)
    return [m.name for m in members], [a.code for a in anomalies]


def test_tar_bad_header_strict_raises_tolerant_reports_and_stops() -> None:
    data = bytearray(tar_of([("a", tarfile.REGTYPE, b"1"), ("b", tarfile.REGTYPE, b"2")]))
    data[512 * 2] ^= 1  # the second header's checksum no longer matches
    with pytest.raises(ptfile.FormatError, match="checksum"):
        read_members(BytesSource(bytes(data)), DEFAULT_LIMITS)
    assert _tolerant(bytes(data)) == (["a"], ["bad-tar-header"])


def test_tar_truncated_member_strict_raises_tolerant_lists_what_is_there() -> None:
    data = tar_of([("a", tarfile.REGTYPE, b"x" * 2000)])[:1024]
    with pytest.raises(ptfile.FormatError, match="beyond the end"):
        read_members(BytesSource(data), DEFAULT_LIMITS)
    anomalies: list[Anomaly] = []
    assert read_members(BytesSource(data), DEFAULT_LIMITS, anomalies)[0].size == 512
    assert [a.code for a in anomalies] == ["truncated-tar-member"]


def test_tar_too_many_members() -> None:
    data = tar_of([(str(i), tarfile.REGTYPE, b"") for i in range(4)])
    with pytest.raises(ptfile.LimitExceededError):
        read_members(BytesSource(data), Limits(max_records=2))
    assert _tolerant(data, Limits(max_records=2)) == (["0", "1", "2"], ["too-many-members"])


def test_tar_sparse_member_tolerant_only_and_its_extension_blocks_skipped() -> None:
    # An old-GNU sparse header with one extension block, then a regular member:
    # tarfile reads both; the loader skips the sparse one, the scanner is told of it.
    data = bytearray(tar_of([("s", tarfile.REGTYPE, b"abc"), ("b", tarfile.REGTYPE, b"2")],
                            tarfile.GNU_FORMAT))
    header = bytearray(data[:512])
    header[156:157], header[482] = b"S", 1
    header[483:495] = b"00000000003\0"  # realsize
    header[386:398], header[398:410] = b"00000000000\0", b"00000000003\0"  # one sparse entry
    extension = bytearray(512)  # no entries, no further block
    crafted = bytes(_header_fix(header)) + bytes(extension) + bytes(data[512:])
    with tarfile.open(fileobj=io.BytesIO(crafted)) as tar:
        assert [m.name for m in tar.getmembers()] == ["s", "b"]
    assert [m.name for m in read_members(BytesSource(crafted), DEFAULT_LIMITS)] == ["b"]
    assert _tolerant(crafted) == (["s", "b"], ["sparse-tar-member"])


def _reheader(block: bytes, **fields: bytes) -> bytes:
    """A header block with some fields replaced (offsets of the ustar layout), re-checksummed."""
    at = {"name": (0, 100), "kind": (156, 157), "magic": (257, 265), "prefix": (345, 500)}
    header = bytearray(block)
    for key, value in fields.items():
        start, end = at[key]
        header[start:end] = value.ljust(end - start, b"\0")
    return bytes(_header_fix(header))


def test_issue_11_tar_names_are_tarfiles_prefix_without_magic_and_v7_directories() -> None:
    # A header without the ustar magic still has its prefix prepended by tarfile,
    # and a NUL-type member whose name ends in '/' is a directory: the loader took
    # the second member below for "pickle" and the third for a regular file.
    data = bytearray(tar_of([("pickle", tarfile.REGTYPE, b"first"),
                             ("other", tarfile.REGTYPE, b"second"),
                             ("third", tarfile.REGTYPE, b"")], tarfile.USTAR_FORMAT))
    data[1024:1536] = _reheader(data[1024:1536], name=b"pickle", magic=b"", prefix=b"x")
    data[2048:2560] = _reheader(data[2048:2560], name=b"dir/", kind=b"\0")
    crafted = bytes(data)
    assert _ours(crafted) == _tarfile_members(crafted) == [("pickle", b"first"),
                                                           ("x/pickle", b"second")]


def test_issue_11_tar_pax_global_fields_apply_through_later_pax_headers() -> None:
    # A global header's size reaches the member through a later PAX header, as in
    # tarfile: the loader and scanner read the payload as the member, not as a header.
    payload = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00id\x85R.".ljust(512, b"\0")

    def record(key: str, value: str) -> bytes:
        body = f" {key}={value}\n"
        return f"{len(body) + len(str(len(body) + 2))}{body}".encode()

    def pax(kind: bytes, records: bytes) -> bytes:
        regular = tar_of([("././@PaxHeader", tarfile.REGTYPE, records)], tarfile.USTAR_FORMAT)
        return _reheader(regular[:512], kind=kind) + regular[512:1024]

    member = bytearray(tar_of([("zzz", tarfile.REGTYPE, b"")], tarfile.USTAR_FORMAT)[:512])
    crafted = (pax(tarfile.XGLTYPE, record("size", "512"))
               + pax(tarfile.XHDTYPE, record("path", "pickle")) + bytes(_header_fix(member))
               + payload + bytes(1024))
    with tarfile.open(fileobj=io.BytesIO(crafted)) as tar:
        assert tar.extractfile("pickle").read() == payload  # type: ignore[union-attr]
    assert _ours(crafted) == [("pickle", payload)]
    assert ptfile.scan(crafted).is_dangerous
