"""The one inflater (:mod:`ptfile.archive.inflate`): ZipReader and the scanner's walk read
a deflated member alike, against zlib and ``zipfile`` as the oracles."""

from __future__ import annotations

import io
import zipfile
import zlib

import pytest

from ptfile import ArchiveError, LimitExceededError
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader
from ptfile.archive.inflate import INFLATE_ALLOWANCE, inflate, inflate_bound, inflate_prefix
from ptfile.limits import DEFAULT_LIMITS
from ptfile.scanning.containers import read_member, walk_zip

DATA = bytes(range(256)) * 4000 + b"\x80\x02}q\x00."


def _raw(data: bytes) -> bytes:
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return deflater.compress(data) + deflater.flush()


def test_strict_inflate_wants_the_declared_size() -> None:
    raw = _raw(DATA)
    assert inflate(raw, "m", len(DATA)) == DATA
    for size in (len(DATA) - 1, len(DATA) + 1):
        with pytest.raises(ArchiveError, match="deflate stream holds"):
            inflate(raw, "m", size)
    with pytest.raises(ArchiveError, match="bad deflate stream"):
        inflate(b"\xff" * 16, "m", 10)


def test_tolerant_inflate_keeps_a_prefix_and_stops_at_the_bound() -> None:
    raw = _raw(DATA)
    assert inflate_prefix(raw, "m", 100, len(DATA), 1) == DATA[:100]
    assert inflate_prefix(raw[: len(raw) // 2], "m", len(DATA), len(DATA), 1) == \
        zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw[: len(raw) // 2])
    with pytest.raises(LimitExceededError, match="max_inflate_ratio"):
        inflate_prefix(raw, "m", len(DATA), 1000, 1)  # the bound comes before the end


def test_the_bound_refuses_a_declared_bomb() -> None:
    assert inflate_bound("m", 10, 10, 2) == 20 + INFLATE_ALLOWANCE
    with pytest.raises(LimitExceededError) as caught:
        inflate_bound("m", 20 + INFLATE_ALLOWANCE + 1, 10, 2)
    assert caught.value.limit == "max_inflate_ratio"


def test_loader_and_scanner_read_a_deflated_member_as_zipfile_does() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data.pkl", DATA)
    source = BytesSource(buf.getvalue())
    want = zipfile.ZipFile(io.BytesIO(buf.getvalue())).read("archive/data.pkl")
    assert ZipReader(source).read("archive/data.pkl") == want == DATA
    walked = walk_zip(source, DEFAULT_LIMITS)
    assert walked is not None
    (entry,), _ = walked
    assert read_member(source, entry, DEFAULT_LIMITS) == want
