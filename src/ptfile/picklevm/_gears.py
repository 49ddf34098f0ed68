r"""The three gears of :func:`~ptfile.picklevm.lexer.check_stream`: one rule set, three speeds.

A Python loop over opcodes costs a quarter to half a microsecond per opcode,
and a 100,000-tensor state dict (``data.pkl`` of 10.9 MB) has 3.0 million:
the exact gear alone (:func:`walk_exact`) takes 0.85 s there.  Three gears,
chosen by the stream's size, enforce the same rules:

* the exact gear (streams under 4 KiB, or when opcodes must be counted or
  ``max_memo_index`` is below 255):
  :func:`~ptfile.picklevm._walk.step` per opcode, with the opcodes that have nothing to check but
  their bounds skipped inline;
* the run gear (:func:`walk_runs`, streams under 512 KiB): the exact gear,
  with runs of plain fixed-size opcodes and of ``LONG_BINPUT`` whose index is
  provably within rule 3's bound skipped by a small compiled pattern (0.2 ms
  to compile; on a 300-tensor state dict, 32 KB, it walks in 0.9 ms where the
  exact gear takes 1.5 ms and the fast gear's compilation alone 2.5-20 ms);
* the fast gear (:func:`walk_fast`): a compiled regular expression (the
  *fast pattern*) consumes, in C, the longest run of opcodes that are
  certainly valid: opcodes with fixed-size arguments, counted strings and
  integers shorter than 256 bytes (one alternative per length), ``LONG_BINPUT``
  whose index is provably within rule 3's bound (the index bytes are
  restricted to values below ``2**k``, the largest power of two within the
  bound), and balanced ``MARK ... TUPLE``-style groups nested at most three
  deep within the remaining depth budget (a capture group per level gives
  the exact deepest level reached).  The Python gear (:func:`~ptfile.picklevm._walk.step`) handles
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

Each gear takes a :class:`~ptfile.picklevm._walk.Walk` and walks it to its
``STOP``, raising as :func:`~ptfile.picklevm._walk.step` would.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable
from typing import Final, TypeAlias, cast

from ._walk import CHECKS_BY_NAME, FREE_MEMO_INDEX, Walk, step
from .opcodes import BY_NAME, OPCODES

__all__ = ["FAST_GEAR_MIN_BYTES", "RUN_GEAR_MIN_BYTES", "memo_bits", "walk_exact", "walk_fast",
           "walk_runs"]

#: Bytes per fast-pattern match: bounds ``re``'s backtracking state on Python 3.10
#: (~120 bytes per repetition) and the scan of a MARK group that never closes.
_WINDOW: Final = 4096
#: Opcodes the exact gear takes in a row where the fast pattern matched nothing.
_SLOW_STEPS: Final = 32
_U32: Final = struct.Struct("<I")

# --------------------------------------------------------------------------- the exact gear


def _plain_kinds(binput: bool) -> tuple[bytes, bytes]:
    """Per opcode byte: how :func:`walk_exact` may skip it without :func:`step`.

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
        if op.pushes_mark or op.pops_mark or (op.name in CHECKS_BY_NAME
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


def walk_exact(walk: Walk, skip: _Skip | None = None) -> None:
    """Rules 1-5 one opcode at a time: :func:`step`, with the opcodes that need no
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
    # The walk's counters live in locals, written back around each step.
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
        end = limit + 1  # kind 0, or the checks below fail: step decides
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
        pos = step(walk, pos)
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
_CHECKED: Final = frozenset(CHECKS_BY_NAME) - {"BINPUT"}


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


def memo_bits(walk: Walk) -> int:
    """Largest ``k`` <= 28 with ``2**k - 1 <= memo_cap`` and ``2**k - 1 <= max_memo_index``.

    One ``k`` per walk (each distinct ``k`` is one more pattern to compile, ~20
    ms once per process); indices between ``2**k`` and the cap are accepted
    by the exact step.
    """
    ceiling = (walk.limits.max_memo_index + 1).bit_length() - 1
    return max(8, min(28, ceiling, (walk.memo_cap + 1).bit_length() - 1))


def _fast_run(walk: Walk, pos: int) -> int:
    """End of the longest run of certainly-valid opcodes at ``pos`` (updates max_depth)."""
    nesting = max(0, min(_NESTING, walk.limits.max_depth - walk.depth))
    pattern = _fast_pattern(memo_bits(walk), nesting, _SHORT)
    match = pattern.match(walk.data, pos, min(pos + _WINDOW, walk.limit))
    assert match is not None  # a starred pattern always matches
    if match.end() > pos and nesting:
        for level, closer in enumerate(match.groups()):
            if closer is not None:
                walk.max_depth = max(walk.max_depth, walk.depth + nesting - level)
                break
    return match.end()


def walk_fast(walk: Walk) -> None:
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
            pos = step(walk, pos)
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


def walk_runs(walk: Walk) -> None:
    """Rules 1-5 by the exact gear, with runs of plain opcodes skipped by :func:`_run_pattern`
    (as the fast gear, it does not count opcodes, and it accepts ``LONG_BINPUT``
    indices below ``2**memo_bits(walk)`` without recording them)."""
    walk_exact(walk, _run_pattern(memo_bits(walk)))


def _compile_run_patterns() -> None:
    """Compile, at import, the run pattern of every stream size the run gear walks under
    the default limits (``memo_bits`` 12-18: 7 patterns, ~1.5 ms in all), so that a
    process's first load of a small checkpoint (a few hundred tensors, a pickle of a few
    KiB) does not pay ~0.2-0.5 ms for it: a quarter of a mapped load of 100 tensors."""
    for bits in range(RUN_GEAR_MIN_BYTES.bit_length() - 1, FAST_GEAR_MIN_BYTES.bit_length() - 1):
        _run_pattern(bits)


_compile_run_patterns()
