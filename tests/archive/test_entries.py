"""The vectorised central-directory parse and bulk local-header check equal their references.

``parse_vectorised`` may give up (None) whenever it likes, but when it answers it
must answer exactly what ``parse_sequential`` answers, and it must never answer
where the sequential pass raises.  ``bulk_data_offsets`` and
``gathered_data_offsets`` must give each record the offset
``ZipReader._read_local_header`` gives it, or ``-1`` where that raises.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import GOLDEN, ZIP_GOLDEN, write_archive, zip64_sample
from ptfile._io.local import BytesSource, FileSource, MmapSource
from ptfile.archive import ZipReader
from ptfile.archive._bulk import bulk_data_offsets, gathered_data_offsets, sparse
from ptfile.archive._entries import (
    COLUMNS,
    SMALL_ENTRIES,
    Entries,
    check_overlaps,
    parse_entries,
    parse_sequential,
    parse_vectorised,
)
from ptfile.archive.directory import check_counts, locate_directory
from ptfile.archive.extra import ExtraField
from ptfile.archive.records import (
    CentralDirectoryHeader,
    EndOfCentralDirectory,
    LocalFileHeader,
)
from ptfile.errors import ArchiveError, PtfileError
from ptfile.limits import DEFAULT_LIMITS, Limits

SENTINELS = ("size", "compressed_size", "header_offset", "disk")


def many_records(n: int = 100, prefix: str = "archive") -> bytes:
    """What torch.save writes for ``n`` tiny storages (ZipWriter is byte-identical to it)."""
    records = [("data.pkl", b"\x80\x02N.")] + [(f"data/{i}", bytes([i % 256]) * (i % 5))
                                               for i in range(n)]
    return write_archive([*records, ("version", b"3\n"), ("byteorder", b"little")], prefix)


def build_zip(members: Sequence[tuple[bytes, bytes]], *, zip64: Sequence[frozenset[str]] = (),
              method: int = 0, sizes: Sequence[int | None] = (), gap: bytes = b"") -> bytes:
    """A stored archive whose entry ``i`` puts the fields ``zip64[i]`` in a ZIP64 extra.

    ``sizes[i]``, when given, is the declared uncompressed size (with ``method``);
    ``gap`` goes between the last member and the central directory.
    """
    body, central = b"", b""
    for i, (name, data) in enumerate(members):
        offset, crc = len(body), zlib.crc32(data)
        body += LocalFileHeader(flags=0x0800, method=method, name=name).to_bytes() + data
        usize = sizes[i] if i < len(sizes) and sizes[i] is not None else len(data)
        fields = zip64[i] if i < len(zip64) else frozenset()
        real = {"size": usize, "compressed_size": len(data), "header_offset": offset, "disk": 0}
        values = [real[f] for f in SENTINELS if f in fields]  # ptfile reads the disk as a u64
        extra = ExtraField(1, struct.pack(f"<{len(values)}Q", *values)).to_bytes() if fields \
            else b""
        central += CentralDirectoryHeader(
            flags=0x0800, method=method, crc32=crc,
            compressed_size=0xFFFFFFFF if "compressed_size" in fields else len(data),
            uncompressed_size=0xFFFFFFFF if "size" in fields else usize,
            header_offset=0xFFFFFFFF if "header_offset" in fields else offset,
            disk_start=0xFFFF if "disk" in fields else 0, name=name, extra=extra,
        ).to_bytes()  # fmt: skip
    n, body = len(members), body + gap
    return body + central + EndOfCentralDirectory(0, 0, n, n, len(central), len(body)).to_bytes()


def directory_of(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[bytes, int, int]:
    """The directory bytes, entry count and offset, as ZipReader finds them (or raises)."""
    source = BytesSource(data)
    directory = locate_directory(source)
    assert directory is not None
    check_counts(directory, limits)
    return source.pread(directory.offset, directory.size, "cd"), directory.entries, directory.offset


def same(a: Entries, b: Entries) -> bool:
    """Equal columns, and equal answers from the accessors that use lists when there are."""
    folders = {"", "a", *(name[:cut] for name in a.names[:3] for cut in (1, name.find("/") + 1))}
    return (a.names == b.names and a.index == b.index
            and all(np.array_equal(x, y) and x.dtype == y.dtype
                    for x, y in [(a.values, b.values), (a.name_at, b.name_at),
                                 (a.name_length, b.name_length)])
            and [a.row(i) for i in range(len(a.names))] == [b.row(i) for i in range(len(b.names))]
            and all(a.column_list(c) == b.column_list(c) for c in COLUMNS)
            and all(a.first_outside(f) == b.first_outside(f) for f in folders))  # fmt: skip


def overlap_outcome(entries: Entries) -> object:
    try:
        check_overlaps(entries)
    except PtfileError as exc:
        return (type(exc), str(exc))
    return None


def outcome(*args: object) -> object:
    """What parse_entries returns (Entries) for ``args``, or the error it raised."""
    try:
        return parse_entries(*args)  # type: ignore[arg-type]
    except PtfileError as exc:
        return (type(exc), str(exc))


def same_outcome(a: object, b: object) -> bool:
    if isinstance(a, Entries) and isinstance(b, Entries):
        return same(a, b)
    return a == b


def assert_paths_agree(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Entries | None:
    """Both parses of ``data``'s directory agree; returns the vectorised result (or None)."""
    try:
        cd, entries, cd_offset = directory_of(data, limits)
    except PtfileError:
        return None
    args = (cd, entries, cd_offset, limits.max_name_length)
    fast = parse_vectorised(*args)  # never raises: it gives up instead
    try:
        reference: object = parse_sequential(*args)
    except PtfileError as exc:
        reference = (type(exc), str(exc))
    if fast is not None:  # (the reference keeps lists, the vectorised parse arrays)
        assert isinstance(reference, Entries), reference
        assert same(fast, reference)
        assert overlap_outcome(fast) == overlap_outcome(reference)
    # with the overlap check, both paths together: as the reference alone
    try:
        expected: object = parse_sequential(*args)
        check_overlaps(expected)  # type: ignore[arg-type]
    except PtfileError as exc:
        expected = (type(exc), str(exc))
    assert same_outcome(outcome(*args), expected)
    return fast


def assert_bulk_agrees(data: bytes) -> None:
    """bulk_data_offsets equals the per-record local header check, record by record."""
    try:
        reader = ZipReader(BytesSource(data))
    except PtfileError:
        return
    entries = reader.entries
    columns = (entries.column("header_offset"), entries.name_at, entries.name_length,
               entries.column("compressed_size"), reader._cd_offset)
    bulk = bulk_data_offsets(memoryview(data), *columns)
    gathered = gathered_data_offsets(
        lambda offsets, lengths: b"".join(data[o:o + n] for o, n in zip(offsets, lengths)),
        len(data), entries.directory, entries.directory_offset, *columns)
    assert gathered is not None and gathered.tolist() == bulk.tolist()
    for record, found in zip(reader.records, bulk.tolist(), strict=True):
        try:
            expected = reader._read_local_header(record)
        except ArchiveError:
            expected = -1
        assert found == expected, record


# --- valid archives take the fast path and agree ---------------------------------------------


@pytest.mark.parametrize("name", ZIP_GOLDEN)
def test_entries_golden_files_take_the_vectorised_path(name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    assert assert_paths_agree(data) is not None
    assert_bulk_agrees(data)


def test_entries_many_records_take_the_vectorised_path() -> None:
    data = many_records(300)
    fast = assert_paths_agree(data)
    assert fast is not None and len(fast.names) == 304
    assert_bulk_agrees(data)


def test_entries_torch_save_takes_the_vectorised_path() -> None:
    torch = pytest.importorskip("torch")
    out = io.BytesIO()
    torch.save({f"layer{i}.weight": torch.full((i % 3,), float(i)) for i in range(200)}, out)
    data = out.getvalue()
    assert assert_paths_agree(data) is not None
    assert_bulk_agrees(data)
    reader = ZipReader(BytesSource(data))
    names = list(reader.names)
    assert reader.data_offsets(names).tolist() == [reader.data_offset(n) for n in names]


def test_entries_empty_and_one_entry_archives() -> None:
    empty = build_zip([])
    assert assert_paths_agree(empty) is None  # nothing to vectorise
    assert len(ZipReader(BytesSource(empty))) == 0
    assert assert_paths_agree(build_zip([(b"archive/a", b"x")])) is not None


# --- odd but valid archives: both paths, same answer ------------------------------------------


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_entries_signature_inside_a_name(where: str) -> None:
    names = [b"archive/a", b"archive/b", b"archive/c"]
    at = {"first": 0, "middle": 1, "last": 2}[where]
    names[at] = b"archive/PK\x01\x02" + b"x" * 50
    data = build_zip([(name, b"data") for name in names])
    fast = assert_paths_agree(data)
    assert (fast is None) == (where != "last")  # after the last start a false match is harmless
    reader = ZipReader(BytesSource(data))
    assert reader.names[at] == names[at].decode()
    assert reader.read(names[at].decode()) == b"data"


@pytest.mark.parametrize(("copies", "fast"), [(60, True), (80, False)])
def test_entries_many_signatures_after_the_last_entry_start(copies: int, fast: bool) -> None:
    names = [b"archive/a", b"archive/" + b"PK\x01\x02" * copies]  # 2 * 2 + 64 tolerated
    data = build_zip([(name, b"data") for name in names])
    assert (assert_paths_agree(data) is not None) == fast
    assert ZipReader(BytesSource(data)).names[1] == names[1].decode()


def test_entries_signature_inside_extra_and_comment_fields() -> None:
    data = build_zip([(b"archive/a", b"1"), (b"archive/b", b"2")])
    reader = ZipReader(BytesSource(data))
    # a central header whose extra field holds a signature, rebuilt by hand
    body = data[: reader._cd_offset]
    central = b"".join(
        CentralDirectoryHeader(flags=0x0800, crc32=zlib.crc32(payload), compressed_size=1,
                               uncompressed_size=1, header_offset=offset, name=name,
                               extra=ExtraField(0x7777, b"PK\x01\x02PK\x01\x02").to_bytes(),
                               comment=b"PK\x01\x02").to_bytes()
        for name, payload, offset in [(b"archive/a", b"1", 0), (b"archive/b", b"2", 40)]
    )  # fmt: skip
    odd = body + central + EndOfCentralDirectory(0, 0, 2, 2, len(central), len(body)).to_bytes()
    assert assert_paths_agree(odd) is None
    assert [ZipReader(BytesSource(odd)).read(n) for n in ("archive/a", "archive/b")] == [b"1", b"2"]


def test_entries_zip64_sample_agrees() -> None:
    data = zip64_sample()
    assert assert_paths_agree(data) is not None  # ZIP64 rows are resolved one by one
    assert [r.header_offset for r in ZipReader(BytesSource(data))] == [0, 44]


@given(st.lists(st.sets(st.sampled_from(SENTINELS)).map(frozenset), min_size=1, max_size=6))
def test_entries_zip64_fields_in_any_combination(zip64: list[frozenset[str]]) -> None:
    members = [(f"archive/{i}".encode(), bytes(i) + b"z") for i in range(len(zip64))]
    data = build_zip(members, zip64=zip64)
    assert assert_paths_agree(data) is not None
    reader = ZipReader(BytesSource(data))
    assert [reader.read(r) for r in reader.records] == [payload for _, payload in members]


@pytest.mark.parametrize("size", [2**61 + 1, 2**62, 2**63 - 1])
def test_entries_huge_declared_sizes_fall_back(size: int) -> None:
    data = build_zip([(b"archive/a", b"\x03\x00")], zip64=[frozenset({"size"})], method=8,
                     sizes=[size])
    assert assert_paths_agree(data) is None
    assert ZipReader(BytesSource(data)).records[0].size == size


@pytest.mark.parametrize("size", [2**63, 2**64 - 1])
def test_entries_sizes_over_int64_are_refused(size: int) -> None:
    data = build_zip([(b"archive/a", b"\x03\x00")], zip64=[frozenset({"size"})], method=8,
                     sizes=[size])
    assert_paths_agree(data)
    with pytest.raises(ArchiveError, match=r"over 2\*\*63 - 1"):
        ZipReader(BytesSource(data))


def test_entries_non_ascii_names() -> None:
    data = build_zip([("archive/é".encode(), b"1"), ("archive/日本".encode(), b"22")])
    fast = assert_paths_agree(data)
    assert fast is not None and fast.names == ("archive/é", "archive/日本")
    assert fast.name_length.tolist() == [10, 14]
    bad = build_zip([(b"archive/\xff", b"1"), (b"archive/b", b"2")])
    assert assert_paths_agree(bad) is None
    with pytest.raises(ArchiveError, match="not UTF-8"):
        ZipReader(BytesSource(bad))


def test_entries_out_of_order_members() -> None:
    data = build_zip([(b"archive/a", b"1"), (b"archive/b", b"22"), (b"archive/c", b"333")])
    reader = ZipReader(BytesSource(data))
    cd = data[reader._cd_offset : -EndOfCentralDirectory.SIZE]
    first = CentralDirectoryHeader.from_bytes(cd)
    rest = cd[first.record_size :]
    swapped = data[: reader._cd_offset] + rest + cd[: first.record_size] + data[-22:]
    assert assert_paths_agree(swapped) is not None
    assert ZipReader(BytesSource(swapped)).names == ("archive/b", "archive/c", "archive/a")
    overlapping = bytearray(swapped)  # the second entry's local header now starts inside 'a'
    at = reader._cd_offset + len(rest) + 42
    struct.pack_into("<L", overlapping, at, 5)
    assert_paths_agree(bytes(overlapping))
    with pytest.raises(ArchiveError, match="overlaps"):
        ZipReader(BytesSource(bytes(overlapping)))


def _patch_eocd(data: bytes, cd_size_delta: int, cd_offset_delta: int) -> bytes:
    eocd = EndOfCentralDirectory.from_bytes(data, len(data) - EndOfCentralDirectory.SIZE)
    fixed = EndOfCentralDirectory(0, 0, eocd.entries_on_disk, eocd.total_entries,
                                  eocd.cd_size + cd_size_delta, eocd.cd_offset + cd_offset_delta)
    return data[: -EndOfCentralDirectory.SIZE] + fixed.to_bytes()


@pytest.mark.parametrize("back", [1, 4, 30])
def test_entries_directory_starting_before_the_first_entry(back: int) -> None:
    data = build_zip([(b"archive/a", b"a"), (b"archive/b", b"b")], gap=b"PK\x01\x02" * 10)
    shifted = _patch_eocd(data, back, -back)  # junk (not member data) before entry 0
    assert assert_paths_agree(shifted) is None
    with pytest.raises(ArchiveError):
        ZipReader(BytesSource(shifted))


@pytest.mark.parametrize("field", [28, 30, 32])  # name, extra, comment length
@pytest.mark.parametrize("entry", [0, 1])
def test_entries_entry_running_past_the_directory(field: int, entry: int) -> None:
    data = bytearray(build_zip([(b"archive/a", b"1"), (b"archive/b", b"2")]))
    at = data.index(b"PK\x01\x02") if entry == 0 else data.rindex(b"PK\x01\x02")
    struct.pack_into("<H", data, at + field, struct.unpack_from("<H", data, at + field)[0] + 30)
    assert assert_paths_agree(bytes(data)) is None
    with pytest.raises(ArchiveError):
        ZipReader(BytesSource(bytes(data)))


@pytest.mark.parametrize("sentinel", SENTINELS)
@pytest.mark.parametrize("method", [0, 8])
def test_entries_sentinels_without_zip64_values(sentinel: str, method: int) -> None:
    offset = {"size": 24, "compressed_size": 20, "header_offset": 42, "disk": 34}[sentinel]
    for fields in (frozenset(), frozenset({s for s in SENTINELS if s != sentinel})):
        data = bytearray(build_zip([(b"archive/a", b"\x03\x00"), (b"archive/b", b"\x03\x00")],
                                   zip64=[frozenset(), fields], method=method))
        at = data.rindex(b"PK\x01\x02") + offset
        data[at : at + (2 if sentinel == "disk" else 4)] = b"\xff" * (2 if sentinel == "disk" else 4)
        assert assert_paths_agree(bytes(data)) is None
        with pytest.raises(ArchiveError, match="ZIP64"):
            ZipReader(BytesSource(bytes(data)))


@pytest.mark.parametrize("delta", [-1, 1])
def test_entries_bulk_local_name_length_must_match(delta: int) -> None:
    data = bytearray(many_records(70))
    reader = ZipReader(BytesSource(bytes(data)))
    record = reader.get("archive/data/7")
    assert record is not None
    # the local name is "archive/data/7", the next byte is the "F" of the "FB" extra
    struct.pack_into("<H", data, record.header_offset + 26, len(record.name) + delta)
    assert_bulk_agrees(bytes(data))
    with pytest.raises(ArchiveError, match="local header names"):
        ZipReader(BytesSource(bytes(data))).data_offset("archive/data/7")


# --- mutated archives: never an answer where the reference raises ----------------------------

SAMPLES = {
    "tiny_tensor": (GOLDEN / "tiny_tensor.pt").read_bytes(),
    "tiny_views": (GOLDEN / "tiny_views.pt").read_bytes(),
    "many": many_records(70),
    "zip64": zip64_sample(),
    "zip64_mixed": build_zip([(f"archive/{i}".encode(), b"ab" * i) for i in range(5)],
                             zip64=[frozenset(), frozenset({"header_offset"}), frozenset(),
                                    frozenset({"size", "compressed_size"}), frozenset()]),
}


@given(
    name=st.sampled_from(sorted(SAMPLES)),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1,
                   max_size=4),
)  # fmt: skip
def test_entries_bit_flips_in_the_directory(name: str, flips: list[tuple[float, int]]) -> None:
    data = bytearray(SAMPLES[name])
    cd = data.index(b"PK\x01\x02")
    for where, bit in flips:
        data[cd + int(where * (len(data) - cd))] ^= 1 << bit
    assert_paths_agree(bytes(data))
    assert_paths_agree(bytes(data), Limits(max_name_length=12))


@given(
    name=st.sampled_from(sorted(SAMPLES)),
    where=st.floats(0, 1),
    junk=st.sampled_from([b"PK\x01\x02", b"\xff\xff\xff\xff", b"\xff\xff", b"\x00\x00",
                          b"\x01\x00", b"\xc3", b"/"]) | st.binary(min_size=1, max_size=8),
)  # fmt: skip
def test_entries_overwrites_in_the_directory(name: str, where: float, junk: bytes) -> None:
    data = SAMPLES[name]
    cd = data.index(b"PK\x01\x02")
    at = cd + int(where * (len(data) - cd - len(junk)))
    assert_paths_agree(data[:at] + junk + data[at + len(junk) :])


@given(
    name=st.sampled_from(sorted(SAMPLES)),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1,
                   max_size=6),
)  # fmt: skip
def test_entries_bulk_local_headers_under_bit_flips(name: str,
                                                    flips: list[tuple[float, int]]) -> None:
    data = bytearray(SAMPLES[name])
    cd = data.index(b"PK\x01\x02")
    for where, bit in flips:
        data[int(where * cd)] ^= 1 << bit
    assert_bulk_agrees(bytes(data))


def test_entries_bulk_long_names_near_the_end_of_the_buffer() -> None:
    names = [f"archive/{'n' * (60 + i)}" for i in range(70)]
    data = write_archive([(n.split("/", 1)[1], b"x") for n in names])
    assert_bulk_agrees(data)
    reader = ZipReader(BytesSource(data))
    entries = reader.entries
    # cut the buffer right after the last central name: its 128-byte bucket does not fit
    last = int(entries.name_at[-1] + entries.name_length[-1])
    bulk = bulk_data_offsets(
        memoryview(data)[:last], entries.column("header_offset"), entries.name_at,
        entries.name_length, entries.column("compressed_size"), reader._cd_offset,
    )  # fmt: skip
    assert bulk.tolist() == [reader.data_offset(r) for r in reader.records]
    damaged = bytearray(data)
    damaged[reader.records[-1].header_offset + 30 + 20] ^= 1  # the last local name
    bulk = bulk_data_offsets(
        memoryview(bytes(damaged))[:last], entries.column("header_offset"), entries.name_at,
        entries.name_length, entries.column("compressed_size"), reader._cd_offset,
    )  # fmt: skip
    assert bulk[-1] == -1 and bulk[:-1].tolist() == [reader.data_offset(r) for r in reader][:-1]


def sparse_archive(n: int = 70, size: int = 70_000) -> bytes:
    """``n`` records of ``size`` bytes: every local header in a 64 KiB window of its own."""
    return write_archive([(f"data/{i}", bytes([i]) * size) for i in range(n)])


def test_entries_sparse_archives_are_told_from_dense_ones() -> None:
    spaced = np.arange(70, dtype=np.int64) * 70_000
    assert sparse(spaced, 70 * 70_000)
    assert not sparse(spaced // 1000, 70 * 70)  # all in one window
    assert not sparse(spaced[:0], 0)


@given(st.lists(st.integers(0, 1 << 40), max_size=300), st.integers(0, 1 << 41))
def test_entries_sparse_decides_the_same_on_lists(offsets: list[int], size: int) -> None:
    """A small directory's column (a list: no numpy call) gets the array's answer."""
    assert sparse(offsets, size) == sparse(np.array(offsets, np.int64), size)


def test_entries_column_held_keeps_the_parse_form() -> None:
    small = ZipReader(BytesSource(sparse_archive(8, 10))).entries
    assert isinstance(small.column_held("size"), list)
    assert small.column_held("size") == small.column("size").tolist()
    many = write_archive([(f"data/{i}", b"x") for i in range(SMALL_ENTRIES + 1)])
    big = ZipReader(BytesSource(many)).entries
    assert isinstance(big.column_held("size"), np.ndarray)


def test_entries_mapped_sparse_archive_reads_its_headers(tmp_path: Path) -> None:
    data = sparse_archive()
    assert_bulk_agrees(data)
    path = tmp_path / "sparse.zip"
    path.write_bytes(data)
    source = MmapSource(path)
    reader, expected = ZipReader(source), ZipReader(BytesSource(data))
    names = list(reader.names)
    assert reader.data_offsets(names).tolist() == [expected.data_offset(n) for n in names]
    assert source.gather([0, 4], [2, 2]) == data[0:2] + data[4:6]
    source.close()
    assert source.gather([0], [2]) is None  # closed: the caller maps instead


def test_entries_mapped_sparse_archive_reports_a_damaged_header_alike(tmp_path: Path) -> None:
    data = bytearray(sparse_archive())
    reader = ZipReader(BytesSource(bytes(data)))
    data[reader.records[40].header_offset + 30] ^= 1  # the local name of data/40
    path = tmp_path / "damaged.zip"
    path.write_bytes(data)
    mapped, in_memory = ZipReader(MmapSource(path)), ZipReader(BytesSource(bytes(data)))
    for one in (mapped, in_memory):
        rows = one.indices_with_prefix("archive/data/")
        with pytest.raises(ArchiveError, match="local header names") as caught:
            one.data_offsets_at(rows)
        assert caught.value.member == "archive/data/40"
        assert one.data_offsets_at(rows[:40]).tolist() == reader.data_offsets_at(rows[:40]).tolist()


def test_entries_a_few_single_lookups_check_no_other_header() -> None:
    data = many_records(200)
    reader = ZipReader(BytesSource(data))
    names = list(reader.names)
    offsets = [reader.data_offset(name) for name in names[:64]]
    assert not reader._bulk_checked  # 64 headers read, none of the other 140
    assert [reader.data_offset(name) for name in names] == \
        offsets + [reader.data_offset(name) for name in names[64:]]
    assert reader._bulk_checked  # the 65th look-up checked the rest at once
    assert reader.data_offsets(names).tolist() == \
        [ZipReader(BytesSource(data)).data_offset(name) for name in names]


# --- the reader's column API -----------------------------------------------------------------


def test_entries_reader_column_api() -> None:
    data = many_records(100)
    reader = ZipReader(BytesSource(data))
    assert len(reader) == 104 and reader.names[0] == "archive/data.pkl"
    assert reader.indices(["archive/data/5", "archive/data.pkl"]).tolist() == [6, 0]
    with pytest.raises(KeyError):
        reader.indices(["archive/nope"])
    with pytest.raises(KeyError):
        reader.data_offsets(["archive/data/1", "archive/nope"])
    names = ["archive/data/99", "archive/data/3", "archive/data/99"]
    offsets = reader.data_offsets(names)
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [reader.data_offset(n) for n in names]
    assert reader.data_offsets([]).tolist() == []
    assert reader.entries.column("size")[7] == reader.records[7].size
    with pytest.raises(ValueError, match="read-only"):
        reader.entries.values[0, 0] = 1
    assert reader.first_name_outside("archive/") is None
    assert reader.first_name_outside("archive/data") == "archive/version"
    record = reader.get("archive/data/4")
    assert record is reader.records[5] and record in list(reader)


def test_entries_reader_records_keep_identity() -> None:
    reader = ZipReader(BytesSource(many_records(10)))
    early = reader.get("archive/data/3")
    assert reader.records[4] is early and reader.get("archive/data/3") is early
    assert reader.data_offset(early) == reader.data_offsets(["archive/data/3"])[0]


def test_entries_data_offsets_raise_the_per_record_error() -> None:
    data = bytearray(many_records(100))
    reader = ZipReader(BytesSource(bytes(data)))
    record = reader.get("archive/data/50")
    assert record is not None
    data[record.header_offset] ^= 0xFF  # break one local signature
    for source in (BytesSource(bytes(data)), FileSource(io.BytesIO(bytes(data)))):
        broken = ZipReader(source)
        good = broken.data_offsets(["archive/data/49", "archive/data/51"])
        assert good.tolist() == [reader.data_offset(f"archive/data/{i}") for i in (49, 51)]
        with pytest.raises(ArchiveError, match="local file header signature"):
            broken.data_offsets(["archive/data/49", "archive/data/50"])


@given(
    names=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12, unique=True),
    prefix=st.text(max_size=6),
    pick=st.integers(0, 11),
)
def test_entries_prefix_matches_str_startswith(names: list[str], prefix: str, pick: int) -> None:
    raw = [f"archive/{n}".encode() for n in names]
    reader = ZipReader(BytesSource(build_zip([(n, b"x") for n in raw])))
    for candidate in (prefix, f"archive/{prefix}", reader.names[pick % len(names)][:pick]):
        expected = [i for i, n in enumerate(reader.names) if n.startswith(candidate)]
        assert reader.indices_with_prefix(candidate).tolist() == expected
        outside = [n for n in reader.names if not n.startswith(candidate)]
        assert reader.first_name_outside(candidate) == (outside[0] if outside else None)


def test_entries_data_offsets_at() -> None:
    reader = ZipReader(BytesSource(many_records(100)))
    rows = reader.indices_with_prefix("archive/data/")
    assert len(rows) == 100 and rows[0] == 1
    offsets = reader.data_offsets_at(rows)
    assert offsets.tolist() == [reader.data_offset(reader.names[i]) for i in rows.tolist()]
    assert reader.data_offsets_at(np.array([], np.int64)).tolist() == []
    for bad in ([-1], [104]):
        with pytest.raises(IndexError):
            reader.data_offsets_at(np.array(bad))
