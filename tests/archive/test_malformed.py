"""The error contract of the archive layer: damaged input raises PtfileError subclasses only."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import GOLDEN, zip64_sample
from ptfile._io.local import BytesSource, FileSource, Source
from ptfile.archive import ZipReader
from ptfile.errors import PtfileError


def _deflated_sample() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02N." * 50)
        archive.writestr("archive/empty", b"")
        archive.comment = b"a comment"
    return out.getvalue()


SAMPLES = {
    "tiny_tensor": (GOLDEN / "tiny_tensor.pt").read_bytes(),
    "tiny_views": (GOLDEN / "tiny_views.pt").read_bytes(),
    "tiny_bigendian": (GOLDEN / "tiny_bigendian.pt").read_bytes(),
    "deflated": _deflated_sample(),
    "zip64_extras": zip64_sample(),
}


def _contract(step: Callable[[], object]) -> None:
    """Run ``step``; a PtfileError is an allowed outcome, any other exception fails the test."""
    try:
        step()
    except PtfileError:
        pass


def exercise(source: Source) -> None:
    """Use every part of the reader API on ``source``."""
    try:
        reader = ZipReader(source)
    except PtfileError:
        return
    _contract(lambda: reader.prefix)
    for record in reader.records:
        assert reader.get(record.name) is record
        _contract(lambda r=record: reader.data_offset(r))  # type: ignore[misc]
        _contract(lambda r=record: reader.read(r))  # type: ignore[misc]
        _contract(lambda r=record: reader.view(r))  # type: ignore[misc]
        _contract(lambda r=record: reader.check_crc(r))  # type: ignore[misc]


def test_samples_are_valid() -> None:
    for data in SAMPLES.values():
        reader = ZipReader(BytesSource(data))
        assert all(reader.check_crc(record) for record in reader.records)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_malformed_every_truncation_raises_ptfile_errors(name: str) -> None:
    # Cutting only the archive comment leaves a readable archive (torch's miniz and
    # zipfile read the comment as far as the file goes); every other cut raises.
    data = SAMPLES[name]
    comment_start = data.rindex(b"PK\x05\x06") + 22
    for n in range(len(data)):
        if n >= comment_start:
            assert len(ZipReader(BytesSource(data[:n]))) == len(ZipReader(BytesSource(data)))
            continue
        with pytest.raises(PtfileError):
            ZipReader(BytesSource(data[:n]))


def test_malformed_truncations_through_a_file_object() -> None:
    data = SAMPLES["tiny_tensor"]
    for n in range(0, len(data), 7):
        with pytest.raises(PtfileError):
            ZipReader(FileSource(io.BytesIO(data[:n])))


@given(
    name=st.sampled_from(sorted(SAMPLES)),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1,
                   max_size=4),
)  # fmt: skip
def test_malformed_bit_flips(name: str, flips: list[tuple[float, int]]) -> None:
    data = bytearray(SAMPLES[name])
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    exercise(BytesSource(bytes(data)))


@given(
    name=st.sampled_from(sorted(SAMPLES)),
    where=st.floats(0, 1),
    junk=st.binary(min_size=1, max_size=64),
    tail=st.booleans(),
)
def test_malformed_overwrites_of_the_directory_and_end_records(
    name: str, where: float, junk: bytes, tail: bool
) -> None:
    data = SAMPLES[name]
    cd = data.rindex(b"PK\x01\x02") if tail else data.index(b"PK\x01\x02")
    at = cd + int(where * (len(data) - cd))
    exercise(BytesSource(data[:at] + junk + data[at + len(junk) :]))


@given(name=st.sampled_from(sorted(SAMPLES)), cut=st.floats(0, 1), insert=st.binary(max_size=40))
def test_malformed_splices(name: str, cut: float, insert: bytes) -> None:
    data = SAMPLES[name]
    at = int(cut * len(data))
    exercise(BytesSource(data[:at] + insert + data[at:]))
    exercise(FileSource(io.BytesIO(data[:at] + insert + data[at + len(insert) :])))
