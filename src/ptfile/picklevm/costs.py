"""What CPython's unpickler would spend on a pickle: bytes allocated, and the hash work of keys.

The cost model of the symbolic machine (:mod:`.symbolic`, whose docstring says what the
walk measures and why):

* **memory**: the sizes of the objects CPython's C unpickler builds (``sys.getsizeof``
  on 64-bit CPython 3.11, GC header included: ``SIZE_*``), what a literal costs
  (:func:`literal_size`), what a call costs (:func:`call_size`, with the copying
  constructors of the weights-only allowlist in :data:`COPIERS`), and what a counted
  literal cut short claims before it is read (:func:`claimed_length`);
* **hashing**: the tuple hashes a key costs (:func:`hash_cost`) and, for keys whose hash
  can be computed without running anything, the hash and a canonical identity
  (:func:`hash_and_canon`), so that distinct keys sharing a hash are counted.
"""

from __future__ import annotations

import struct
import sys
from typing import Final

from ._walk import Buffer
from .symbols import Container, GlobalRef, Result, Tup

__all__ = ["COPIERS", "HASH_COST", "HASH_DEPTH", "MAX_BYTES_PER_BYTE", "call_size",
           "claimed_length", "hash_and_canon", "hash_cost", "literal_size"]


#: Tuples nested deeper than this are not hashed by the walk (it would recurse).
HASH_DEPTH: Final = 64
#: Keys whose hash takes more tuple hashes than this are not hashed by the walk (a key of
#: shared tuples costs exponentially more than its size): their work is counted instead.
HASH_COST: Final = 4096
#: Counts saturate here (a hash cost doubles per level of shared tuples).
SATURATE: Final = 1 << 62
#: Bytes CPython's unpickler allocates per byte of pickle, at most, from opcodes alone
#: (``EMPTY_SET``: one byte, a 216-byte set, its 16-byte GC header and a stack slot; a
#: memo index costs 16 bytes of table per index, and each needs 2 bytes): the bound the
#: scanner's fast path relies on (``len(stream) * MAX_BYTES_PER_BYTE``).  A fact of
#: CPython's unpickler, not a ceiling (the ceiling is ``Limits.max_unpickled_bytes``).
MAX_BYTES_PER_BYTE: Final = 256


#: Object sizes on 64-bit CPython 3.11 (``sys.getsizeof``, GC header included): the
#: empty tuple is a singleton; a tuple of n items is ``SIZE_TUPLE + 8 * n``.
SIZE_TUPLE: Final = 40
SIZE_LIST: Final = 56
SIZE_DICT: Final = 64
SIZE_SET: Final = 232  # 216, and the list slot of the 8-entry table tracemalloc sees
SIZE_ORDERED_DICT: Final = 128
SIZE_BYTES: Final = 33
SIZE_BYTEARRAY: Final = 57
#: An object a call returns, whatever it is (a tensor's Python object, a stand-in).
SIZE_OBJECT: Final = 64
#: Bytes per entry of a dict (index, entry, growth) and of a set (its table), measured
#: on dicts and sets of 10**5 keys: 38 and 42.
SIZE_DICT_ENTRY: Final = 42
SIZE_SET_ENTRY: Final = 42
#: An ``OrderedDict`` entry: the dict's, and its node in the linked order.
SIZE_ORDERED_ENTRY: Final = 100
#: What one call costs besides its result (allocator rounding of a large result, the
#: temporaries of the call), measured on 200 ``_codecs.encode`` calls: ~40 bytes.
SIZE_CALL: Final = 64
#: The unpickler's own structures (its stack, mark stack and memo to start with).
SIZE_BASE: Final = 1024
#: CPython's unpickler starts with a memo table of this many slots.
MEMO_START: Final = 32


def literal_size(value: object) -> int:
    """Bytes CPython allocates for a literal the stream decodes (0 for cached ones)."""
    kind = type(value)
    if kind is int:
        return 0 if -5 <= value <= 256 else sys.getsizeof(value)  # type: ignore[operator]
    if kind is str or kind is bytes or kind is float:
        return sys.getsizeof(value)
    return 0


def _length(value: object) -> int:
    """How many items (or characters, or bytes) a call would copy out of ``value``."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, Container):
        return max(len(value.items), value.entries)
    if isinstance(value, tuple):
        return len(value)
    return 0


#: Constructors of the weights-only allowlist that copy their argument, and what one
#: item of it costs in the result: ``(bytes per item, fixed bytes)``.  ``bytearray(n)``
#: of an int allocates (and zeroes) ``n`` bytes.
COPIERS: Final[dict[tuple[str, str], tuple[int, int]]] = {
    ("_codecs", "encode"): (3, SIZE_BYTES),  # UTF-8 takes up to 3 bytes per BMP character
    ("builtins", "bytearray"): (1, SIZE_BYTEARRAY),
    ("builtins", "set"): (SIZE_SET_ENTRY, SIZE_SET),
    ("builtins", "frozenset"): (SIZE_SET_ENTRY, SIZE_SET),
    ("collections", "Counter"): (SIZE_DICT_ENTRY, SIZE_DICT),
    ("collections", "OrderedDict"): (SIZE_ORDERED_ENTRY, SIZE_ORDERED_DICT),
    ("torch", "Size"): (8, SIZE_TUPLE),
}


def call_size(func: object, args: object) -> int:
    """Bytes a call allocates: an object, plus what a copying constructor copies."""
    if not isinstance(func, GlobalRef):
        return SIZE_OBJECT
    qual = (func.module, func.name)
    if func.module == "__builtin__":
        qual = ("builtins", func.name)
    per, fixed = COPIERS.get(qual, (0, SIZE_OBJECT))
    if not per or not isinstance(args, tuple) or not args:
        return fixed
    first = args[0]
    if qual == ("builtins", "bytearray") and type(first) is int:
        return fixed + max(first, 0)
    if qual == ("_codecs", "encode") and isinstance(first, str) and len(args) > 1 \
            and isinstance(args[1], str) and args[1].lower().replace("-", "_") in (
                "latin1", "latin_1", "iso_8859_1", "l1"):
        per = 1
    return fixed + per * _length(first)


def _canon(value: object, depth: int = 0) -> bytes | None:
    """Bytes that identify a hashable literal key (compared by SipHash, never by its hash)."""
    if isinstance(value, bool) or value is None:
        return repr(value).encode()
    if isinstance(value, int):
        return b"i" + value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    if isinstance(value, float):
        return b"f" + struct.pack("<d", value)
    if isinstance(value, complex):
        return b"c" + struct.pack("<dd", value.real, value.imag)
    if isinstance(value, (str, bytes)):
        return None  # randomised hashes: no flooding
    if isinstance(value, tuple) and depth < HASH_DEPTH:
        parts: list[bytes] = []
        for item in value:
            part = _canon(item, depth + 1)
            if part is None:
                return None
            parts.append(len(part).to_bytes(4, "little") + part)
        return b"t" + b"".join(parts)
    return None


def _literal_key(key: object) -> object:
    """The value a key would have: ``complex``/``torch.Size`` calls on literals are evaluated."""
    if isinstance(key, Result) and isinstance(key.func, GlobalRef) and isinstance(key.args, tuple):
        qual = (key.func.module, key.func.name)
        args = key.args
        if qual in (("builtins", "complex"), ("__builtin__", "complex")) and len(args) <= 2 \
                and all(type(a) in (int, float) for a in args):
            try:
                return complex(*args)
            except OverflowError:
                return key
        if qual == ("torch", "Size") and len(args) == 1 and isinstance(args[0], tuple):
            return tuple(args[0])
    return key


def hash_cost(key: object) -> int:
    """Tuples CPython hashes to hash ``key`` (a ``torch.Size`` or tuple key; else 0)."""
    if isinstance(key, Tup):
        return key.cost if key else 0
    if isinstance(key, Result) and isinstance(key.args, tuple):
        return sum(a.cost for a in key.args if isinstance(a, Tup))
    return 0


def hash_and_canon(key: object) -> tuple[int, bytes] | None:
    key = _literal_key(key)
    if isinstance(key, Tup) and key.depth > HASH_DEPTH:
        return None
    canon = _canon(key)
    if canon is None:
        return None
    try:
        return hash(key), canon
    except (TypeError, OverflowError):
        return None


#: Counted literals, by opcode byte: the size and format of their length field.
_COUNTED: Final = {ord("T"): "<i", ord("B"): "<I", ord("X"): "<I", 0x8D: "<Q", 0x8E: "<Q",
                   0x96: "<Q", 0x95: "<Q"}


def claimed_length(data: Buffer, offset: int | None) -> int:
    """The length a counted literal (or ``FRAME``) at ``offset`` claims, when the stream
    ends before it: CPython allocates it before reading (``bytes``, ``bytearray``; and
    any of them read from a file, as torch's legacy loader and ``pickle.load`` do)."""
    if offset is None or not 0 <= offset < len(data):
        return 0
    fmt = _COUNTED.get(data[offset])
    size = struct.calcsize(fmt) if fmt else 0
    if fmt is None or offset + 1 + size > len(data):
        return 0
    claimed: int = struct.unpack_from(fmt, data, offset + 1)[0]
    return max(claimed, 0)
