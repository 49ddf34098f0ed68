"""``.data/serialization_id``: the 40-digit id torch's C++ writer appends to every archive.

Specification (torch 2.x ``PyTorchStreamWriter::writeSerializationId``, spec §2.9)
----------------------------------------------------------------------------------
The id is ``"%020d%020d" % (name_hash, crc_fold)`` of two unsigned 64-bit values.
It does not depend on the archive prefix.  With
``combine(s, v) = s ^ (v + 0x9E3779B9 + (s << 6) + (s >> 2))`` modulo 2**64
(``c10::hash_combine``):

* ``crc_fold`` starts at 0.  The writer's output callback inspects *every* write
  call: one of at least 8 bytes that begins with the data descriptor signature
  ``PK\x07\x08`` is taken to be a data descriptor, and its bytes 4..8 (a LE u32,
  "the CRC") are combined in.  miniz issues one write call per local header,
  name, ZIP64 extra, padding extra, payload and data descriptor, so per record
  this folds: the full name if it starts with the signature, the payload if it
  does (a quirk; a zero-filled ``skip_data`` payload is never inspected), then
  the real descriptor's CRC when the record is non-empty (0 with CRC disabled).
  Local headers and extra fields start with other bytes and never match.
* ``name_hash`` starts at 0 and combines ``std::hash<std::string>`` (libstdc++
  ``_Hash_bytes``, seed 0xC70F6907) of every record name *without* prefix
  written before the id, in the iteration order of a libstdc++
  ``std::unordered_set<std::string>`` into which the names were inserted in
  write order.  That order is emulated exactly: prime bucket counts from
  libstdc++'s ``__prime_list``, max load factor 1, growth factor 2, a new node
  goes to the front of its bucket's run (or of the whole list when its bucket
  was empty), and a rehash walks the old list front to back, moving a node to
  the front of the list when its new bucket is still empty and to the front
  of its bucket's run otherwise.

The hash and the order are those of libstdc++ (GCC, Linux); torch built against
libc++ (macOS) or MSVC (Windows) writes other ids for the same content.  Readers
never interpret the id.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "SERIALIZATION_ID_NAME",
    "fold_write",
    "hash_bytes",
    "hash_combine",
    "hash_names",
    "name_hash",
    "rehash_points",
    "serialization_id",
    "unordered_set_order",
]

#: Record name (without prefix) of the id.
SERIALIZATION_ID_NAME: Final = ".data/serialization_id"

_MASK64: Final = (1 << 64) - 1
_MUL: Final = 0xC6A4A7935BD1E995
#: ``std::hash<std::string>`` seed of libstdc++ (functional_hash.h).
HASH_SEED: Final = 0xC70F6907
_GOLDEN: Final = 0x9E3779B9
_DESCRIPTOR_SIGNATURE: Final = b"PK\x07\x08"
_U32 = struct.Struct("<L")

#: libstdc++ ``_Prime_rehash_policy::_M_next_bkt`` answers for n < 14.
_FAST_BUCKETS: Final = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
#: libstdc++ ``std::__detail::__prime_list`` for 64-bit ``unsigned long``: 304
#: primes (the library repeats the last one as a sentinel).  Not every prime:
#: each is roughly 8% above the previous one.
# fmt: off
_PRIME_LIST: Final = (
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83,
    89, 97, 103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257,
    277, 293, 313, 337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823,
    887, 953, 1031, 1109, 1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549,
    2753, 2971, 3209, 3469, 3739, 4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517,
    8123, 8783, 9497, 10273, 11113, 12011, 12983, 14033, 15173, 16411, 17749, 19183, 20753,
    22447, 24281, 26267, 28411, 30727, 33223, 35933, 38873, 42043, 45481, 49201, 53201,
    57557, 62233, 67307, 72817, 78779, 85229, 92203, 99733, 107897, 116731, 126271, 136607,
    147793, 159871, 172933, 187091, 202409, 218971, 236897, 256279, 277261, 299951, 324503,
    351061, 379787, 410857, 444487, 480881, 520241, 562841, 608903, 658753, 712697, 771049,
    834181, 902483, 976369, 1056323, 1142821, 1236397, 1337629, 1447153, 1565659, 1693859,
    1832561, 1982627, 2144977, 2320627, 2510653, 2716249, 2938679, 3179303, 3439651,
    3721303, 4026031, 4355707, 4712381, 5098259, 5515729, 5967347, 6456007, 6984629,
    7556579, 8175383, 8844859, 9569143, 10352717, 11200489, 12117689, 13109983, 14183539,
    15345007, 16601593, 17961079, 19431899, 21023161, 22744717, 24607243, 26622317,
    28802401, 31160981, 33712729, 36473443, 39460231, 42691603, 46187573, 49969847,
    54061849, 58488943, 63278561, 68460391, 74066549, 80131819, 86693767, 93793069,
    101473717, 109783337, 118773397, 128499677, 139022417, 150406843, 162723577, 176048909,
    190465427, 206062531, 222936881, 241193053, 260944219, 282312799, 305431229, 330442829,
    357502601, 386778277, 418451333, 452718089, 489790921, 529899637, 573292817, 620239453,
    671030513, 725980837, 785430967, 849749479, 919334987, 994618837, 1076067617,
    1164186217, 1259520799, 1362662261, 1474249943, 1594975441, 1725587117, 1866894511,
    2019773507, 2185171673, 2364114217, 2557710269, 2767159799, 2993761039, 3238918481,
    3504151727, 3791104843, 4101556399, 4294967291, 6442450933, 8589934583, 12884901857,
    17179869143, 25769803693, 34359738337, 51539607367, 68719476731, 103079215087,
    137438953447, 206158430123, 274877906899, 412316860387, 549755813881, 824633720731,
    1099511627689, 1649267441579, 2199023255531, 3298534883309, 4398046511093,
    6597069766607, 8796093022151, 13194139533241, 17592186044399, 26388279066581,
    35184372088777, 52776558133177, 70368744177643, 105553116266399, 140737488355213,
    211106232532861, 281474976710597, 562949953421231, 1125899906842597, 2251799813685119,
    4503599627370449, 9007199254740881, 18014398509481951, 36028797018963913,
    72057594037927931, 144115188075855859, 288230376151711717, 576460752303423433,
    1152921504606846883, 2305843009213693951, 4611686018427387847, 9223372036854775783,
    18446744073709551557,
)
# fmt: on
#: Initial bucket count asked for by the first insertion (``_M_need_rehash``).
_FIRST_BUCKETS: Final = 11


def hash_bytes(data: bytes, seed: int = HASH_SEED) -> int:
    """libstdc++ ``std::_Hash_bytes`` (64-bit MurmurHash2 variant), i.e. ``std::hash``.

    Examples
    --------
    >>> hash_bytes(b"")
    6142509188972423790
    """
    n = len(data)
    h = seed ^ ((n * _MUL) & _MASK64)
    aligned = n & ~7
    for i in range(0, aligned, 8):
        w = (int.from_bytes(data[i : i + 8], "little") * _MUL) & _MASK64
        h = ((h ^ (((w ^ (w >> 47)) * _MUL) & _MASK64)) * _MUL) & _MASK64
    if n & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK64
    h = ((h ^ (h >> 47)) * _MUL) & _MASK64
    return h ^ (h >> 47)


def hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit ``size_t``.

    Examples
    --------
    >>> hash_combine(0, 1)
    2654435770
    """
    return (seed ^ ((value + _GOLDEN + (seed << 6) + (seed >> 2)) & _MASK64)) & _MASK64


def fold_write(fold: int, head: bytes | bytearray | memoryview) -> int:
    """Fold one write call of the C++ writer into the CRC part of the id.

    ``head`` is the start (at least its first 8 bytes) of what one miniz write
    call passes; a call that looks like a data descriptor contributes its
    bytes 4..8.

    Examples
    --------
    >>> fold_write(0, b"PK\\x07\\x08\\x01\\x00\\x00\\x00")
    2654435770
    >>> fold_write(0, b"data")
    0
    """
    if len(head) >= 8 and head[:4] == _DESCRIPTOR_SIGNATURE:
        return hash_combine(fold, _U32.unpack_from(head, 4)[0])
    return fold


def _next_bucket_count(n: int) -> tuple[int, int]:
    """``_M_next_bkt(n)`` for n >= 1: the bucket count and the next resize threshold."""
    if n < len(_FAST_BUCKETS):
        count = _FAST_BUCKETS[n]
        return count, count
    last = len(_PRIME_LIST) - 1
    index = bisect.bisect_left(_PRIME_LIST, n, 6, last)
    if index == last:
        return _PRIME_LIST[last], _MASK64  # the largest table: never grows again
    return _PRIME_LIST[index], _PRIME_LIST[index]


def rehash_points(n: int) -> list[tuple[int, int]]:
    """When a libstdc++ ``unordered_set`` rehashes while ``n`` keys are inserted.

    Returns ``(count, buckets)`` pairs: before inserting key number ``count``
    (0-based) the table is rehashed to ``buckets`` buckets.  This is
    ``_M_need_rehash(buckets, count, 1)`` with max load factor 1 and growth
    factor 2, evaluated only where it can fire (``count >= next_resize``).

    Examples
    --------
    >>> rehash_points(100)
    [(0, 13), (13, 29), (29, 59), (59, 127)]
    """
    points: list[tuple[int, int]] = []
    buckets, next_resize, count = 1, 0, 0
    while count < n:
        wanted = max(count + 1, 0 if next_resize else _FIRST_BUCKETS)
        if wanted >= buckets:
            buckets, next_resize = _next_bucket_count(max(wanted + 1, 2 * buckets))
            points.append((count, buckets))
        else:
            next_resize = buckets
        count = next_resize
    return points


def _walk(
    nodes: npt.NDArray[np.intp], codes: npt.NDArray[np.uint64], buckets: int
) -> npt.NDArray[np.intp]:
    """List order after inserting ``nodes`` in turn into ``buckets`` empty buckets.

    Each node goes to the front of its bucket's run, or to the front of the
    list when its bucket is empty; a rehash walks the old list by this very
    rule.  So the list holds buckets by descending first appearance and, inside
    each, nodes by descending appearance: the reverse of a stable sort by the
    position where the node's bucket first appears.
    """
    bucket = (codes[nodes] % np.uint64(buckets)).astype(np.intp)
    first = np.empty(buckets, dtype=np.intp)
    first[bucket[::-1]] = np.arange(len(nodes) - 1, -1, -1)  # a repeated index keeps the last
    by_first = np.argsort(first[bucket], kind="stable")
    return nodes[by_first[::-1]]


def unordered_set_order(codes: npt.ArrayLike) -> npt.NDArray[np.intp]:
    """Iteration order of a libstdc++ ``unordered_set`` filled with distinct keys.

    Parameters
    ----------
    codes : array_like of uint64
        The keys' hash codes in insertion order.

    Returns
    -------
    numpy.ndarray of intp
        Indices into ``codes``, in the order the set iterates its keys.

    Examples
    --------
    >>> unordered_set_order([5, 18, 3]).tolist()  # 13 buckets; 5 and 18 share one
    [2, 1, 0]
    """
    values = np.asarray(codes, dtype=np.uint64).reshape(-1)
    order = np.empty(0, dtype=np.intp)
    points = rehash_points(len(values))
    ends = [count for count, _ in points[1:]] + [len(values)] if points else []
    for (start, buckets), end in zip(points, ends, strict=True):
        # Keys inserted between two rehashes follow the same rule as the walk.
        nodes = np.concatenate([order, np.arange(start, end, dtype=np.intp)])
        order = _walk(nodes, values, buckets)
    return order


def hash_names(names: Sequence[bytes]) -> npt.NDArray[np.uint64]:
    """:func:`hash_bytes` of every name, vectorised over names of equal length."""
    lengths = np.fromiter(map(len, names), dtype=np.intp, count=len(names))
    out = np.empty(len(names), dtype=np.uint64)
    # the distinct lengths (np.unique would import numpy.ma: ~10 ms on a process's first call)
    for length in np.flatnonzero(np.bincount(lengths)).tolist():
        rows = np.flatnonzero(lengths == length)
        out[rows] = _hash_rows(b"".join([names[i] for i in rows.tolist()]), len(rows), length)
    return out


def _hash_rows(joined: bytes, count: int, length: int) -> npt.NDArray[np.uint64]:
    """``_Hash_bytes`` of each ``length``-byte row of ``joined`` (uint64 wraps mod 2**64)."""
    mul, shift = np.uint64(_MUL), np.uint64(47)
    rows = np.frombuffer(joined, dtype=np.uint8).reshape(count, length)
    padded = np.zeros((len(rows), -(-length // 8) * 8), dtype=np.uint8)
    padded[:, :length] = rows
    words: npt.NDArray[np.uint64] = padded.view("<u8")
    h: npt.NDArray[np.uint64] = np.full(
        len(rows), HASH_SEED ^ ((length * _MUL) & _MASK64), dtype=np.uint64
    )
    for j in range(length // 8):
        w = words[:, j] * mul
        h ^= (w ^ (w >> shift)) * mul
        h *= mul
    if length % 8:
        h ^= words[:, -1]  # the 1-7 tail bytes as a little-endian integer
        h *= mul
    h ^= h >> shift
    h *= mul
    h ^= h >> shift
    return h


def name_hash(names: Sequence[str]) -> int:
    """The name part of the id: ``std::hash`` of ``names`` combined in set order.

    Parameters
    ----------
    names : sequence of str
        Distinct record names without prefix, in write order.

    Examples
    --------
    >>> name_hash(["data.pkl"]) == hash_combine(0, hash_bytes(b"data.pkl"))
    True
    """
    codes = hash_names(list(map(str.encode, names)))  # UTF-8
    value = 0
    for code in codes[unordered_set_order(codes)].tolist():
        value ^= (code + _GOLDEN + (value << 6) + (value >> 2)) & _MASK64  # hash_combine, inlined
    return value


def serialization_id(names: Sequence[str], crc_fold: int) -> str:
    """The 40 ASCII digits torch writes to ``.data/serialization_id``.

    Parameters
    ----------
    names : sequence of str
        Distinct record names without prefix, in write order, the id excluded.
    crc_fold : int
        The value :func:`fold_write` accumulated over the writes of those records.

    Examples
    --------
    >>> serialization_id([], 0)
    '0000000000000000000000000000000000000000'
    """
    return f"{name_hash(names):020d}{crc_fold:020d}"
