"""``.data/serialization_id``: libstdc++ hash and unordered_set order, checked against g++ and torch."""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archive_helpers import GOLDEN, torch_file_writer, write_archive
from ptfile._io.local import BytesSource
from ptfile.archive import ZipReader
from ptfile.archive import serialization_id as sid

TINY_TENSOR_NAMES = ["data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0",
                     "version"]  # fmt: skip

USET_PROGRAM = r"""
#include <iostream>
#include <string>
#include <unordered_set>
int main() {
  std::unordered_set<std::string> names;
  std::string line;
  while (std::getline(std::cin, line)) names.insert(line);
  for (const auto& name : names) std::cout << std::hash<std::string>{}(name) << ' ' << name << '\n';
}
"""


def reference_order(codes: list[int]) -> list[int]:
    """A plain linked-list model of libstdc++'s hashtable, written from the spec (§2.9)."""
    buckets, next_resize = 1, 0
    nodes: list[int] = []  # front to back
    for count in range(len(codes)):
        if count + 1 > next_resize:
            wanted = max(count + 1, 0 if next_resize else 11)
            if wanted >= buckets:
                n = max(wanted + 1, 2 * buckets)
                buckets = sid._FAST_BUCKETS[n] if n < 14 else min(p for p in sid._PRIME_LIST if p >= n)
                next_resize = buckets
                old, nodes = nodes, []
                for node in old:
                    _insert(nodes, node, codes, buckets)
            else:
                next_resize = buckets
        _insert(nodes, count, codes, buckets)
    return nodes


def _insert(nodes: list[int], node: int, codes: list[int], buckets: int) -> None:
    bucket = codes[node] % buckets
    for i, other in enumerate(nodes):
        if codes[other] % buckets == bucket:
            nodes.insert(i, node)  # before the first node of its bucket's run
            return
    nodes.insert(0, node)


def random_names(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789/._-"
    names = [
        f"data/{i}" if rng.random() < 0.5
        else "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        for i in range(n)
    ]  # fmt: skip
    return list(dict.fromkeys(names))


def test_serialization_id_hash_values() -> None:
    assert sid.hash_bytes(b"") == 6142509188972423790
    assert sid.name_hash(TINY_TENSOR_NAMES) == 15728199511854643026  # spec §2.9
    order = sid.unordered_set_order([sid.hash_bytes(n.encode()) for n in TINY_TENSOR_NAMES])
    assert [TINY_TENSOR_NAMES[i] for i in order] == [
        "version", "data/0", "byteorder", ".storage_alignment", ".format_version", "data.pkl"
    ]  # fmt: skip


def test_serialization_id_of_the_worked_example() -> None:
    reader = ZipReader(BytesSource((GOLDEN / "tiny_tensor.pt").read_bytes()))
    fold = 0
    for record in reader.records[:-1]:
        fold = sid.fold_write(fold, b"PK\x07\x08" + record.crc32.to_bytes(4, "little"))
    expected = "1572819951185464302606254392891879407814"
    assert sid.serialization_id(TINY_TENSOR_NAMES, fold) == expected
    assert reader.read(reader.records[-1]) == expected.encode()


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_serialization_id_vectorised_hash_equals_the_scalar_one(names: list[bytes]) -> None:
    assert sid.hash_names(names).tolist() == [sid.hash_bytes(n) for n in names]


@given(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 200), max_size=60, unique=True))
def test_serialization_id_order_equals_the_linked_list_model(codes: list[int]) -> None:
    assert sid.unordered_set_order(codes).tolist() == reference_order(codes)


def test_serialization_id_rehash_points() -> None:
    assert sid.rehash_points(0) == []
    assert sid.rehash_points(13) == [(0, 13)]
    assert sid.rehash_points(14) == [(0, 13), (13, 29)]
    buckets = [b for _, b in sid.rehash_points(10**6)]
    assert buckets == sorted(buckets)
    assert all(b in sid._PRIME_LIST for b in buckets)


def test_serialization_id_prime_table() -> None:
    primes = sid._PRIME_LIST
    assert len(primes) == 304
    assert list(primes) == sorted(set(primes))
    assert primes[-1] == 2**64 - 59  # the largest 64-bit prime
    small = [p for p in primes if p < 1000]
    assert all(all(p % q for q in range(2, int(p**0.5) + 1)) for p in small)


@pytest.fixture(scope="module")
def uset_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    folder = tmp_path_factory.mktemp("uset")
    (folder / "uset.cc").write_text(USET_PROGRAM)
    program = folder / "uset"
    subprocess.run([compiler, "-O1", "-o", str(program), str(folder / "uset.cc")], check=True)
    return program


@pytest.mark.parametrize("size", [0, 1, 2, 11, 12, 13, 14, 29, 30, 59, 60, 1000, 4000, 100_000])
def test_serialization_id_order_equals_libstdcxx(uset_program: Path, size: int) -> None:
    rng = random.Random(size)
    for _ in range(3 if size < 10_000 else 1):
        names = random_names(rng, size)
        lines = subprocess.run(
            [str(uset_program)], input="".join(f"{n}\n" for n in names),
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
        expected = [(int(code), name) for code, name in (line.split(" ", 1) for line in lines)]
        codes = sid.hash_names([n.encode() for n in names])
        order = sid.unordered_set_order(codes).tolist()
        assert [(int(codes[i]), names[i]) for i in order] == expected


@pytest.mark.parametrize("size", [0, 1, 5, 12, 13, 14, 100, 3000])
def test_serialization_id_equals_torch(size: int) -> None:
    pytest.importorskip("torch")
    rng = random.Random(size)
    for _ in range(5):
        names = [n for n in random_names(rng, size)
                 if n not in {"version", "byteorder"} and not n.endswith("/")]  # fmt: skip
        records = [(name, rng.choice([b"", b"1", b"PK\x07\x08abcd"])) for name in names]
        records += [("version", b"3\n"), ("byteorder", b"little")]
        expected = torch_file_writer(records)
        ours = write_archive(records)
        assert ours[-200:] == expected[-200:]
        assert ours == expected


def test_serialization_id_payload_quirk() -> None:
    """A payload that starts like a data descriptor adds its bytes 4..8 to the CRC half."""
    quirky = b"PK\x07\x08\x01\x00\x00\x00rest"
    plain = b"PK\x07\x09\x01\x00\x00\x00rest"
    for payload, extra in ((quirky, [1]), (plain, [])):
        data = write_archive([("a", payload)])
        reader = ZipReader(BytesSource(data))
        fold = 0
        for value in [*extra, zlib.crc32(payload)]:
            fold = sid.hash_combine(fold, value)
        assert reader.read(reader.records[-1]) == sid.serialization_id(["a"], fold).encode()


def test_serialization_id_ignores_the_prefix() -> None:
    def ident(prefix: str) -> bytes:
        out = io.BytesIO()
        data = write_archive([("a", b"1"), ("b", b"")], prefix)
        reader = ZipReader(BytesSource(data))
        out.write(reader.read(reader.records[-1]))
        return out.getvalue()

    assert ident("x") == ident("archive") == ident("a.b")
