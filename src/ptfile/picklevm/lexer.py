r"""Non-executing walks over a pickle stream: an exact checker and a decoder.

:func:`check_stream` decides, without running anything, whether a stream is
safe to hand to CPython's C unpickler, in the sense that unpickling it cannot
allocate more than a constant times the stream's length.  It walks opcode by
opcode and enforces these rules (the pickle specification is in
:mod:`ptfile.picklevm.opcodes`); any stream it accepts obeys all of them:

1. Every opcode is one of the 68 opcodes of protocols 0-5; ``PROTO`` is at
   most 5.
2. Every argument lies inside the stream: fixed arguments, length prefixes and
   the payloads they declare (CPython allocates a declared length *before* it
   reads: ``BINBYTES8`` of 2**62 bytes would be a 4 EiB allocation),
   ``FRAME`` lengths, and newline-terminated text lines.  The two lines of
   ``GLOBAL``/``INST`` are names of at most ``limits.max_name_length`` bytes.
3. A memo index stored by ``PUT``/``BINPUT``/``LONG_BINPUT`` is at most
   ``limits.max_memo_index`` and at most ``max(255, length)``, where *length*
   is the stream's length in bytes, ``STOP`` included.  CPython grows its
   memo table to twice the largest index stored (``80 02 4E 72 00 E1 F5 05
   2E``, nine bytes, stores index 10**8 and costs a 1.5 GB table); with this
   rule the table is at most 16 bytes per stream byte.  Picklers number memo
   entries 0, 1, 2, ..., one per memoised object, so a real index is always
   below the number of opcodes, hence below the length.  The walk applies the
   rule with the bytes available (the data's end) as the length, and walks
   again with the stream's own length when ``STOP`` comes much earlier.
4. ``MARK`` nesting stays within ``limits.max_depth``, and no opcode pops a
   mark that was never pushed.
5. The stream ends at a ``STOP`` within ``limits.max_pickle_bytes`` (and
   ``limits.max_opcodes`` opcodes).

``EXT1``/``EXT2``/``EXT4`` are accepted here but reported in
:attr:`StreamInfo.ext_offset` (the unpickler refuses them).

Speed
-----
A Python loop over opcodes costs a quarter to half a microsecond per opcode,
and a 100,000-tensor state dict (``data.pkl`` of 10.9 MB) has 3.0 million:
the exact gear alone (:func:`_walk_exact`) takes 0.85 s there.  Three gears,
chosen by the stream's size, enforce the same rules:

* the exact gear (streams under 4 KiB, or when opcodes must be counted or
  ``max_memo_index`` is below 255):
  :func:`_step` per opcode, with the opcodes that have nothing to check but
  their bounds skipped inline;
* the run gear (:func:`_walk_runs`, streams under 512 KiB): the exact gear,
  with runs of plain fixed-size opcodes and of ``LONG_BINPUT`` whose index is
  provably within rule 3's bound skipped by a small compiled pattern (0.2 ms
  to compile; on a 300-tensor state dict, 32 KB, it walks in 0.9 ms where the
  exact gear takes 1.5 ms and the fast gear's compilation alone 2.5-20 ms);
* the fast gear (:func:`_walk_fast`): a compiled regular expression (the
  *fast pattern*) consumes, in C, the longest run of opcodes that are
  certainly valid: opcodes with fixed-size arguments, counted strings and
  integers shorter than 256 bytes (one alternative per length), ``LONG_BINPUT``
  whose index is provably within rule 3's bound (the index bytes are
  restricted to values below ``2**k``, the largest power of two within the
  bound), and balanced ``MARK ... TUPLE``-style groups nested at most three
  deep within the remaining depth budget (a capture group per level gives
  the exact deepest level reached).  The Python gear (:func:`_step`) handles
  exactly one opcode wherever the pattern stops, with every rule checked in
  full.  It compiles in ~20 ms (once per process).

All gears enforce the same rules, so the outcome (result, or error and its
offset) is that of the exact gear alone; the test suite checks this on
generated, mutated and torch-written streams.  On the 10.9 MB pickle the fast
gear takes 0.09 s (5,000 pattern matches; 0.18 s on Python 3.10, which lacks
the possessive ``*+``).  Each match is limited to a 4 KiB window: on Python
3.10 ``re`` keeps about 120 bytes of backtracking state per repetition (1.2 GB
for a run of 10 million opcodes), and a MARK group that does not close is
scanned in vain only up to the window's end.

:func:`ptfile.picklevm.decoder.genops` is the slow, decoding walk (one
:class:`~ptfile.picklevm.decoder.Op` per opcode), for disassembly and static scanning.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NoReturn, TypeAlias, cast

from ..errors import LimitExceededError, PickleStreamError
from ..limits import DEFAULT_LIMITS, Limits
from .opcodes import BY_CODE, BY_NAME, HIGHEST_PROTOCOL, OPCODES, Opcode

__all__ = ["Buffer", "StreamInfo", "check_stream"]

#: What the walks accept: bytes-like data holding the pickle at ``start``.
Buffer: TypeAlias = "bytes | bytearray | memoryview"

#: Memo indices any stream may store: a 256-entry memo table is harmless.
FREE_MEMO_INDEX: Final = 255
#: Bytes per fast-pattern match: bounds ``re``'s backtracking state on Python 3.10
#: (~120 bytes per repetition) and the scan of a MARK group that never closes.
_WINDOW: Final = 4096
#: Opcodes the exact gear takes in a row where the fast pattern matched nothing.
_SLOW_STEPS: Final = 32
_STOP: Final = BY_NAME["STOP"].code
_NEWLINE: Final = re.compile(b"\n")
_U32: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What :func:`check_stream` learnt about a valid stream.

    Attributes
    ----------
    start : int
        Offset of the first opcode.
    end : int
        Offset just after ``STOP``.
    protocol : int
        Argument of the first ``PROTO`` opcode; 0 when there is none
        (protocols 0 and 1 have no ``PROTO``).
    max_depth : int
        Deepest ``MARK`` nesting reached.
    ext_offset : int or None
        Offset of the first ``EXT1``/``EXT2``/``EXT4`` opcode, if any.
    """

    start: int
    end: int
    protocol: int
    max_depth: int
    ext_offset: int | None

    @property
    def size(self) -> int:
        """Length of the stream in bytes, ``STOP`` included."""
        return self.end - self.start


@dataclass(slots=True)
class _Walk:
    """Mutable state of one walk over ``data[start:limit]``."""

    data: bytes | memoryview
    start: int
    limit: int  # the stream may not reach this offset: the data's end or the size ceiling
    limits: Limits
    depth: int = 0
    max_depth: int = 0
    protocol: int | None = None
    ext_offset: int | None = None
    opcodes: int = 0
    end: int = -1  # offset after STOP, once seen
    numbers: int = 0  # wide number literals: the only keys that can flood a hash (hazards.py)
    memo_cap: int = 0  # rule 3's bound on memo indices for this walk
    memo_seen: int = -1  # largest memo index the exact gear accepted


def _new_walk(data: Buffer, start: int, limits: Limits, length: int | None = None) -> _Walk:
    """Normalise ``data`` to bytes or a flat byte memoryview and bound the walk.

    ``length`` is the stream's length when known (rule 3's bound); else the
    bytes available stand for it.
    """
    if isinstance(data, bytes):
        view: bytes | memoryview = data
    else:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    if start < 0:
        raise ValueError(f"start must be non-negative, got {start}")
    limit = max(min(len(view), start + limits.max_pickle_bytes), start)
    cap = max(FREE_MEMO_INDEX, limit - start if length is None else length)
    return _Walk(view, start, limit, limits, memo_cap=cap)


# --------------------------------------------------------------------------- the exact gear


def _beyond(walk: _Walk, pos: int, end: int, what: str) -> NoReturn:
    """Raise for ``what`` at ``pos`` needing the stream to reach ``end``."""
    if walk.limit < end <= len(walk.data):
        raise LimitExceededError("max_pickle_bytes", walk.limits.max_pickle_bytes,
                                 end - walk.start, f"pickle stream at {walk.start:#x}")
    remain = len(walk.data) - pos
    raise PickleStreamError(f"{what} needs {end - pos} bytes but only {remain} remain "
                            "(truncated or damaged pickle)", offset=pos)


def _line_end(walk: _Walk, pos: int, begin: int, what: str, longest: int | None) -> int:
    """Offset after the newline ending the line at ``begin`` (of at most ``longest`` bytes)."""
    stop = walk.limit if longest is None else min(walk.limit, begin + longest + 1)
    found = _NEWLINE.search(walk.data, begin, stop)
    if found is not None:
        return found.end()
    if longest is not None and stop < walk.limit:
        rest = _NEWLINE.search(walk.data, stop, walk.limit)
        actual = (walk.limit if rest is None else rest.start()) - begin
        raise LimitExceededError("max_name_length", longest, actual, f"{what} at offset {pos:#x}")
    if walk.limit < len(walk.data):
        _beyond(walk, pos, walk.limit + 1, what)
    raise PickleStreamError(f"{what} has no terminating newline (truncated pickle)", offset=pos)


def _extent(walk: _Walk, pos: int, op: Opcode) -> int:
    """Offset just after the opcode at ``pos`` and its argument; checks bounds."""
    arg = op.arg
    if arg is None:
        return pos + 1
    if arg.lines:
        longest = walk.limits.max_name_length if arg.lines == 2 else None
        end = pos + 1
        for _ in range(arg.lines):
            end = _line_end(walk, pos, end, f"{op.name} line", longest)
        return end
    end = pos + 1 + arg.size
    if end > walk.limit:
        _beyond(walk, pos, end, op.name)
    if not arg.counted:
        return end
    length = int.from_bytes(walk.data[pos + 1:end], "little", signed=arg.signed)
    if length < 0:
        raise PickleStreamError(f"{op.name} declares a negative length {length}", offset=pos)
    if end + length > walk.limit:
        _beyond(walk, pos, end + length, f"{op.name} of {length} bytes")
    return end + length


def _check_protocol(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    protocol = walk.data[pos + 1]
    if protocol > HIGHEST_PROTOCOL:
        raise PickleStreamError(f"unsupported pickle protocol {protocol}", offset=pos)
    if walk.protocol is None:
        walk.protocol = protocol


def _check_frame(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    length = int.from_bytes(walk.data[pos + 1:end], "little")
    if end + length > walk.limit:
        _beyond(walk, pos, end + length, f"FRAME of {length} bytes")


def _check_memo_index(walk: _Walk, op: Opcode, pos: int, index: int) -> None:
    """Rule 3: ``index <= max_memo_index`` and ``index <= max(255, length)``."""
    if index > walk.limits.max_memo_index:
        raise LimitExceededError("max_memo_index", walk.limits.max_memo_index, index,
                                 f"{op.name} at offset {pos:#x}")
    if index > walk.memo_cap:
        raise PickleStreamError(
            f"{op.name} stores memo index {index} at stream offset {pos - walk.start}; an "
            f"index above 255 cannot exceed the stream's length ({walk.memo_cap} bytes at "
            "most) in a real pickle", offset=pos)
    walk.memo_seen = max(walk.memo_seen, index)


def _check_binary_put(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    _check_memo_index(walk, op, pos, int.from_bytes(walk.data[pos + 1:end], "little"))


def _check_text_put(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    digits = bytes(walk.data[pos + 1:end - 1])
    if not digits.isdigit():
        raise PickleStreamError(f"PUT index {digits[:20]!r} is not a decimal number",
                                offset=pos)
    # 20 digits already exceed any ceiling; int() of millions of digits is slow.
    index = int(digits) if len(digits) <= 20 else 10**20
    _check_memo_index(walk, op, pos, index)


def _note_ext(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    if walk.ext_offset is None:
        walk.ext_offset = pos


def _note_stop(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    walk.end = end


def _note_number(walk: _Walk, op: Opcode, pos: int, end: int) -> None:
    # LONG1 below 8 bytes is below 2**63 and, past BININT's range, needs 5+ bytes: ints
    # under 2**61 - 1 hash to themselves, so only 8+ byte ones can be chosen to collide.
    if op.name != "LONG1" or walk.data[pos + 1] >= 8:
        walk.numbers += 1


_Check: TypeAlias = Callable[[_Walk, Opcode, int, int], None]

#: Opcodes whose argument has a meaning the checker enforces or records, by name.
_CHECKS_BY_NAME: Final[Mapping[str, _Check]] = {
    "PROTO": _check_protocol,
    "FRAME": _check_frame,
    "PUT": _check_text_put,
    "BINPUT": _check_binary_put,
    "LONG_BINPUT": _check_binary_put,
    "EXT1": _note_ext,
    "EXT2": _note_ext,
    "EXT4": _note_ext,
    "STOP": _note_stop,
    **dict.fromkeys(("LONG1", "LONG4", "BINFLOAT", "INT", "LONG", "FLOAT"), _note_number),
}
_CHECKS: Final[Mapping[int, _Check]] = {BY_NAME[n].code: f for n, f in _CHECKS_BY_NAME.items()}


def _read_opcode(walk: _Walk, pos: int) -> tuple[Opcode, int]:
    """The opcode at ``pos`` and the offset after its argument (rules 1, 2, 5)."""
    if pos >= walk.limit:
        if pos < len(walk.data):
            _beyond(walk, pos, pos + 1, "opcode")
        raise PickleStreamError("pickle stream ends without STOP (truncated pickle)",
                                offset=pos)
    op = BY_CODE.get(walk.data[pos])
    if op is None:
        raise PickleStreamError(f"unknown opcode {walk.data[pos]:#04x}", offset=pos)
    walk.opcodes += 1
    if walk.opcodes > walk.limits.max_opcodes:
        raise LimitExceededError("max_opcodes", walk.limits.max_opcodes, walk.opcodes,
                                 f"pickle stream at {walk.start:#x}")
    return op, _extent(walk, pos, op)


def _step(walk: _Walk, pos: int) -> int:
    """Check the one opcode at ``pos`` against every rule; return the next offset."""
    op, end = _read_opcode(walk, pos)
    if op.pushes_mark:
        walk.depth += 1
        if walk.depth > walk.limits.max_depth:
            raise LimitExceededError("max_depth", walk.limits.max_depth, walk.depth,
                                     f"MARK at offset {pos:#x}")
        walk.max_depth = max(walk.max_depth, walk.depth)
    elif op.pops_mark:
        if walk.depth == 0:
            raise PickleStreamError(f"{op.name} pops a MARK that was never pushed", offset=pos)
        walk.depth -= 1
    check = _CHECKS.get(op.code)
    if check is not None:
        check(walk, op, pos, end)
    return end


def _walk_steps(walk: _Walk) -> None:
    """Rules 1-5 by :func:`_step` alone: the reference both gears must agree with."""
    pos = walk.start
    while walk.end < 0:
        pos = _step(walk, pos)


def _plain_kinds(binput: bool) -> tuple[bytes, bytes]:
    """Per opcode byte: how :func:`_walk_exact` may skip it without :func:`_step`.

    Kind 1: a fixed-size opcode with nothing to check, count or record but its
    bounds (its size is in the second table); kind 2/3: a counted argument
    with a 1/4-byte unsigned length; 4: ``LONG_BINPUT``; 5: ``MARK``; 6: a
    one-byte opcode that pops a mark; 0: anything else.  ``BINPUT`` (index at
    most 255, always within rule 3) is plain unless ``max_memo_index`` is
    below 255.
    """
    kinds, sizes = bytearray(256), bytearray(256)
    kinds[BY_NAME["LONG_BINPUT"].code] = 4
    kinds[BY_NAME["MARK"].code] = 5
    for op in OPCODES:
        if op.pops_mark and op.fixed_size == 1:
            kinds[op.code] = 6
        if op.pushes_mark or op.pops_mark or (op.name in _CHECKS_BY_NAME
                                              and not (binput and op.name == "BINPUT")):
            continue
        if op.fixed_size is not None:
            kinds[op.code], sizes[op.code] = 1, op.fixed_size
        elif op.arg is not None and op.arg.counted and not op.arg.signed and op.arg.size in (1, 4):
            kinds[op.code] = 2 if op.arg.size == 1 else 3
    return bytes(kinds), bytes(sizes)


_PLAIN: Final = {binput: _plain_kinds(binput) for binput in (False, True)}
_LONGEST_PLAIN: Final = max(_PLAIN[True][1])


def _plain_by_argument_size() -> dict[int, list[int]]:
    """The plain fixed-size opcodes (kind 1, BINPUT included) by argument size: what
    both compiled patterns match as single opcodes."""
    kinds, sizes = _PLAIN[True]
    by_size: dict[int, list[int]] = {}
    for code in range(256):
        if kinds[code] == 1:
            by_size.setdefault(sizes[code] - 1, []).append(code)
    return by_size


_PLAIN_BY_ARGUMENT_SIZE: Final = _plain_by_argument_size()
#: ``pattern.match`` of :func:`_run_pattern` (a starred pattern: it always matches).
_Skip: TypeAlias = Callable[["bytes | memoryview", int, int], "re.Match[bytes]"]


def _walk_exact(walk: _Walk, skip: _Skip | None = None) -> None:
    """Rules 1-5 one opcode at a time: :func:`_step`, with the opcodes that need no
    check but their bounds skipped inline (three times faster on torch's pickles).

    ``skip(data, pos, end)``, when given, is the match of :func:`_run_pattern`:
    it skips runs of plain opcodes in C, without counting them (the caller
    makes sure the ceiling on opcodes cannot be reached), up to ``end`` (on
    Python 3.10, up to a window's end).
    """
    data, limit, limits = walk.data, walk.limit, walk.limits
    kinds, sizes = _PLAIN[limits.max_memo_index >= FREE_MEMO_INDEX]
    memo_cap = min(walk.memo_cap, limits.max_memo_index)
    max_opcodes, max_depth = limits.max_opcodes, limits.max_depth
    u32 = _U32.unpack_from
    # Below safe_end a plain opcode's argument lies inside the walk; and where
    # opcodes cannot outnumber bytes, none can pass the ceiling on opcodes.
    safe_end = limit - _LONGEST_PLAIN if max_opcodes >= limit - walk.start else 0
    pos = walk.start
    # The walk's counters live in locals, written back around each _step.
    depth, deepest, opcodes, memo_seen = walk.depth, walk.max_depth, walk.opcodes, walk.memo_seen
    while True:
        if skip is not None:
            if pos < safe_end:
                pos = skip(data, pos, safe_end).end()
        else:
            while pos < safe_end:  # runs of plain fixed-size opcodes: the hot loop
                size = sizes[data[pos]]
                if not size:
                    break
                pos += size
                opcodes += 1
        kind = kinds[data[pos]] if pos < limit and opcodes < max_opcodes else 0
        end = limit + 1  # kind 0, or the checks below fail: _step decides
        if kind == 3 and pos + 5 <= limit:
            end = pos + 5 + u32(data, pos + 1)[0]
        elif kind == 5 and depth < max_depth:
            depth += 1
            deepest = max(deepest, depth)
            end = pos + 1
        elif kind == 6 and depth:
            depth -= 1
            end = pos + 1
        elif kind == 4 and pos + 5 <= limit:
            index = u32(data, pos + 1)[0]
            if index <= memo_cap:
                memo_seen = max(memo_seen, index)
                end = pos + 5
        elif kind == 1:
            end = pos + sizes[data[pos]]
        elif kind == 2 and pos + 2 <= limit:
            end = pos + 2 + data[pos + 1]
        if end <= limit:
            opcodes += 1
            pos = end
            continue
        walk.depth, walk.max_depth, walk.opcodes, walk.memo_seen = depth, deepest, opcodes, \
            memo_seen
        pos = _step(walk, pos)
        if walk.end >= 0:
            return
        depth, deepest, opcodes, memo_seen = walk.depth, walk.max_depth, walk.opcodes, \
            walk.memo_seen


# --------------------------------------------------------------------------- the fast gear


def _byte_class(codes: list[int]) -> bytes:
    return b"[" + b"".join(re.escape(bytes([c])) for c in sorted(codes)) + b"]"


def _counted(codes: list[int], prefix: int, short: int) -> bytes:
    """Counted arguments shorter than ``short`` with a ``prefix``-byte length."""
    lengths = b"|".join(re.escape(n.to_bytes(prefix, "little")) + b".{%d}" % n
                        for n in range(short))
    return _byte_class(codes) + b"(?:" + lengths + b")"


#: Below this stream size the exact gear is cheaper than compiling the run pattern
#: (the exact gear walks ~0.08 µs a byte).
RUN_GEAR_MIN_BYTES: Final = 1 << 12
#: Below this stream size the run gear (~0.04 µs a byte) is cheaper than compiling
#: the fast pattern (~20 ms, once per process; it then walks ~0.008 µs a byte).
FAST_GEAR_MIN_BYTES: Final = 1 << 19
#: The fast pattern's counted arguments are shorter than this (torch's keys are).
_SHORT: Final = 256
#: The fast pattern's MARK groups nest this deep (torch's are three deep).
_NESTING: Final = 3


def _memo_below(bits: int) -> bytes:
    """``LONG_BINPUT`` with an index below ``2**bits`` (8 <= bits < 32)."""
    whole, part = divmod(bits, 8)
    index = b"." * whole + _byte_class(list(range(2**part))) + b"\\x00" * (3 - whole)
    return re.escape(bytes([BY_NAME["LONG_BINPUT"].code])) + index


#: Opcodes the fast pattern never matches alone: they carry a checked or recorded
#: argument (LONG_BINPUT has its own restricted alternative), or end the stream.
_CHECKED: Final = frozenset(_CHECKS_BY_NAME) - {"BINPUT"}


def _single_alternatives(bits: int, short: int) -> list[bytes]:
    """Alternatives matching one certainly-valid opcode outside MARK bookkeeping."""
    fixed = _PLAIN_BY_ARGUMENT_SIZE
    counted: dict[int, list[int]] = {}
    for op in OPCODES:
        if op.name in _CHECKED or op.pushes_mark or op.pops_mark:
            continue
        if op.fixed_size is None and op.arg is not None and op.arg.counted and op.arg.size < 8:
            counted.setdefault(op.arg.size, []).append(op.code)
    # Most frequent first, as re tries alternatives in order: LONG_BINPUT (a big
    # state dict memoises every object; first rather than fourth saves 10%),
    # BINPUT/BINGET/BININT1, bare opcodes, BINUNICODE.
    alternatives = [_memo_below(bits), _byte_class(fixed[1]) + b".", _byte_class(fixed[0]),
                    _counted(counted[4], 4, short)]
    alternatives += [_byte_class(fixed[n]) + b".{%d}" % n for n in (4, 2, 8) if n in fixed]
    return [*alternatives, _counted(counted[1], 1, short)]


def _possessive_star() -> bytes:
    """``*+`` where ``re`` has possessive repeats (3.11+), else ``*``.

    The grammar is prefix-free (an opcode byte decides the alternative, and no
    closing opcode starts an alternative), so giving back repetitions never
    helps a match: both mean the same.  ``*+`` keeps no backtracking state and
    is 40% faster.
    """
    try:
        re.compile(b"a*+")
    except re.error:
        return b"*"
    return b"*+"


_STAR: Final = _possessive_star()


@functools.cache
def _fast_pattern(bits: int, nesting: int, short: int) -> re.Pattern[bytes]:
    """Runs of certainly-valid opcodes, with MARK groups nested up to ``nesting`` deep.

    ``LONG_BINPUT`` indices are below ``2**bits``, counted arguments shorter
    than ``short``.  Group ``i`` (1-based)
    captures the closing opcode of a MARK group at nesting level
    ``nesting - i + 1``; the lowest group that matched gives the deepest level.
    """
    single = b"|".join(_single_alternatives(bits, short))
    closers = _byte_class([op.code for op in OPCODES if op.pops_mark and op.fixed_size])
    mark = re.escape(bytes([BY_NAME["MARK"].code]))
    item = single
    for _ in range(nesting):
        item = single + b"|" + mark + b"(?:" + item + b")" + _STAR + b"(" + closers + b")"
    return re.compile(b"(?:" + item + b")" + _STAR, re.DOTALL)


def _memo_bits(walk: _Walk) -> int:
    """Largest ``k`` <= 28 with ``2**k - 1 <= memo_cap`` and ``2**k - 1 <= max_memo_index``.

    One ``k`` per walk (each distinct ``k`` is one more pattern to compile, ~20
    ms once per process); indices between ``2**k`` and the cap are accepted
    by the exact step.
    """
    ceiling = (walk.limits.max_memo_index + 1).bit_length() - 1
    return max(8, min(28, ceiling, (walk.memo_cap + 1).bit_length() - 1))


def _fast_run(walk: _Walk, pos: int) -> int:
    """End of the longest run of certainly-valid opcodes at ``pos`` (updates max_depth)."""
    nesting = max(0, min(_NESTING, walk.limits.max_depth - walk.depth))
    pattern = _fast_pattern(_memo_bits(walk), nesting, _SHORT)
    match = pattern.match(walk.data, pos, min(pos + _WINDOW, walk.limit))
    assert match is not None  # a starred pattern always matches
    if match.end() > pos and nesting:
        for level, closer in enumerate(match.groups()):
            if closer is not None:
                walk.max_depth = max(walk.max_depth, walk.depth + nesting - level)
                break
    return match.end()


def _walk_fast(walk: _Walk) -> None:
    """Rules 1-5, long runs at a time (see the module docstring)."""
    pos = walk.start
    while walk.end < 0:
        end = _fast_run(walk, pos)
        # Where the pattern matches nothing (EXT codes, protocol 0 text, MARKs
        # nested deeper than it follows), the next opcodes are likely the same:
        # step through a few exactly rather than pay for a match each time.
        steps = 1 if end > pos else _SLOW_STEPS
        pos = end
        for _ in range(steps):
            pos = _step(walk, pos)
            if walk.end >= 0:
                break


# --------------------------------------------------------------------------- the run gear


@functools.cache
def _run_pattern(bits: int) -> _Skip:
    """Runs of plain fixed-size opcodes and of ``LONG_BINPUT`` below ``2**bits``.

    It compiles in ~0.2 ms (the fast pattern takes 2-20 ms), so the run gear
    suits streams too small to repay the fast pattern's compilation.
    """
    by_size = _PLAIN_BY_ARGUMENT_SIZE
    # Most common first: re tries alternatives in order.
    plain = [_byte_class(by_size[n]) + (b".{%d}" % n if n else b"")
             for n in sorted(by_size, key=lambda n: -len(by_size[n]))]
    pattern = re.compile(b"(?:" + b"|".join([_memo_below(bits), *plain]) + b")" + _STAR,
                         re.DOTALL)
    match = cast(_Skip, pattern.match)
    if _STAR == b"*+":
        return match  # possessive: no backtracking state, so no window (20% faster)

    def windowed(data: bytes | memoryview, pos: int, end: int) -> re.Match[bytes]:
        # Python 3.10: a window bounds re's backtracking state (~120 bytes a repetition)
        return match(data, pos, min(pos + _WINDOW, end))

    return windowed


def _walk_runs(walk: _Walk) -> None:
    """Rules 1-5 by the exact gear, with runs of plain opcodes skipped by :func:`_run_pattern`
    (as the fast gear, it does not count opcodes, and it accepts ``LONG_BINPUT``
    indices below ``2**_memo_bits(walk)`` without recording them)."""
    _walk_exact(walk, _run_pattern(_memo_bits(walk)))


def check_stream(data: Buffer, limits: Limits = DEFAULT_LIMITS, *, start: int = 0) -> StreamInfo:
    """Check that the pickle at ``data[start:]`` obeys rules 1-5 of this module.

    Nothing is executed or imported.  Bytes after ``STOP`` are ignored.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        Holds the pickle at ``start``.
    limits : Limits
        Ceilings: ``max_pickle_bytes``, ``max_opcodes``, ``max_memo_index``,
        ``max_depth``, ``max_name_length``.
    start : int
        Offset of the first opcode.

    Returns
    -------
    StreamInfo
        Where the stream ends (just after ``STOP``), its protocol, its deepest
        MARK nesting, and where its first ``EXT`` opcode is.

    Raises
    ------
    PickleStreamError
        Unknown opcode, truncated argument, missing ``STOP``, mark underflow,
        memo index beyond the stream's length; ``offset`` is where, in ``data``.
    LimitExceededError
        A ceiling of ``limits`` was hit.

    Examples
    --------
    >>> check_stream(b"\\x80\\x02K\\x01.")
    StreamInfo(start=0, end=5, protocol=2, max_depth=0, ext_offset=None)
    """
    walk = _new_walk(data, start, limits)
    # The run and fast gears cannot count opcodes; counting only matters when the
    # ceiling on opcodes is below the ceiling on bytes (each opcode is at least a byte).
    size = walk.limit - start
    exact = limits.max_opcodes < size or limits.max_memo_index < FREE_MEMO_INDEX \
        or size < RUN_GEAR_MIN_BYTES
    gear = _walk_exact if exact else _walk_runs if size < FAST_GEAR_MIN_BYTES else _walk_fast
    gear(walk)
    length = walk.end - start
    accepted = walk.memo_seen if exact else max(walk.memo_seen, 2 ** _memo_bits(walk) - 1)
    if accepted > max(FREE_MEMO_INDEX, length):
        # STOP came before the data's end: walk again with the stream's own length.
        walk = _new_walk(data, start, limits, length)
        gear(walk)
    if walk.numbers > limits.max_hash_collisions:  # rare: walk the keys (picklevm.hazards)
        from .hazards import check_number_keys  # hazards builds on this module

        check_number_keys(data, start, limits)
    return StreamInfo(start, walk.end, walk.protocol or 0, walk.max_depth, walk.ext_offset)
