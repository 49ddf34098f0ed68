"""One opcode checked against every rule of :mod:`~ptfile.picklevm.lexer`: the exact step.

:func:`step` checks the opcode at an offset against rules 1-5 of
:func:`~ptfile.picklevm.lexer.check_stream` and records what the walk learns
(MARK depth, protocol, ``EXT`` offset, memo indices, wide number literals) in
its :class:`Walk`; :func:`read_opcode` is its part that both walks share: the
opcode and the bounds of its argument (rules 1, 2 and 5).  The checker's gears
(:mod:`~ptfile.picklevm._gears`) skip what this step would accept, and the
decoder (:mod:`~ptfile.picklevm.decoder`) reads each opcode through
:func:`read_opcode`.  This module is the bottom of the pickle VM: it imports
only the opcode table, errors and limits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NoReturn, TypeAlias

from ..errors import LimitExceededError, PickleStreamError
from ..limits import Limits
from .opcodes import BY_CODE, BY_NAME, HIGHEST_PROTOCOL, Opcode

__all__ = ["CHECKS_BY_NAME", "FREE_MEMO_INDEX", "Buffer", "Walk", "check_frames",
           "frame_violation", "new_walk", "read_opcode", "step", "walk_steps"]

#: What the walks accept: bytes-like data holding the pickle at ``start``.
Buffer: TypeAlias = "bytes | bytearray | memoryview"

#: Memo indices any stream may store: a 256-entry memo table is harmless.
FREE_MEMO_INDEX: Final = 255
_NEWLINE: Final = re.compile(b"\n")


@dataclass(slots=True)
class Walk:
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
    frames: int = 0  # FRAME opcodes seen: rule 6 is then checked by check_frames


def new_walk(data: Buffer, start: int, limits: Limits, length: int | None = None) -> Walk:
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
    return Walk(view, start, limit, limits, memo_cap=cap)


# --------------------------------------------------------------------------- the step


def _beyond(walk: Walk, pos: int, end: int, what: str) -> NoReturn:
    """Raise for ``what`` at ``pos`` needing the stream to reach ``end``."""
    if walk.limit < end <= len(walk.data):
        raise LimitExceededError("max_pickle_bytes", walk.limits.max_pickle_bytes,
                                 end - walk.start, f"pickle stream at {walk.start:#x}")
    remain = len(walk.data) - pos
    raise PickleStreamError(f"{what} needs {end - pos} bytes but only {remain} remain "
                            "(truncated or damaged pickle)", offset=pos)


def _line_end(walk: Walk, pos: int, begin: int, what: str, longest: int | None) -> int:
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


def _extent(walk: Walk, pos: int, op: Opcode) -> int:
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


def _check_protocol(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    protocol = walk.data[pos + 1]
    if protocol > HIGHEST_PROTOCOL:
        raise PickleStreamError(f"unsupported pickle protocol {protocol}", offset=pos)
    if walk.protocol is None:
        walk.protocol = protocol


def _check_frame(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    length = int.from_bytes(walk.data[pos + 1:end], "little")
    if end + length > walk.limit:
        _beyond(walk, pos, end + length, f"FRAME of {length} bytes")
    walk.frames += 1


def _check_memo_index(walk: Walk, op: Opcode, pos: int, index: int) -> None:
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


def _check_binary_put(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    _check_memo_index(walk, op, pos, int.from_bytes(walk.data[pos + 1:end], "little"))


def _check_text_put(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    digits = bytes(walk.data[pos + 1:end - 1])
    if not digits.isdigit():
        raise PickleStreamError(f"PUT index {digits[:20]!r} is not a decimal number",
                                offset=pos)
    # 20 digits already exceed any ceiling; int() of millions of digits is slow.
    index = int(digits) if len(digits) <= 20 else 10**20
    _check_memo_index(walk, op, pos, index)


def _note_ext(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    if walk.ext_offset is None:
        walk.ext_offset = pos


def _note_stop(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    walk.end = end


def _note_number(walk: Walk, op: Opcode, pos: int, end: int) -> None:
    # LONG1 below 8 bytes is below 2**63 and, past BININT's range, needs 5+ bytes: ints
    # under 2**61 - 1 hash to themselves, so only 8+ byte ones can be chosen to collide.
    if op.name != "LONG1" or walk.data[pos + 1] >= 8:
        walk.numbers += 1


_Check: TypeAlias = Callable[[Walk, Opcode, int, int], None]

#: Opcodes whose argument has a meaning the checker enforces or records, by name.
CHECKS_BY_NAME: Final[Mapping[str, _Check]] = {
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
_CHECKS: Final[Mapping[int, _Check]] = {BY_NAME[n].code: f for n, f in CHECKS_BY_NAME.items()}


def read_opcode(walk: Walk, pos: int) -> tuple[Opcode, int]:
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


def step(walk: Walk, pos: int) -> int:
    """Check the one opcode at ``pos`` against every rule; return the next offset."""
    op, end = read_opcode(walk, pos)
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


def walk_steps(walk: Walk) -> None:
    """Rules 1-5 by :func:`step` alone: the reference both gears must agree with."""
    pos = walk.start
    while walk.end < 0:
        pos = step(walk, pos)


_FRAME: Final = BY_NAME["FRAME"].code


def check_frames(data: Buffer, start: int, end: int, limits: Limits) -> None:
    """Rule 6: no opcode straddles the end of a ``FRAME``, and no frame starts inside one.

    Readers disagree on such a stream: ``pickletools`` and a C unpickler
    reading through ``peek()`` take the argument across the frame's end,
    while the C unpickler over a file without ``peek()`` (an ``io.BytesIO``,
    as ``torch.load`` hands it ZIP records) drops what is left of the frame
    and reads the argument from the bytes after it, so a ``BINBYTES`` length
    can hide opcodes from every static reader.  Picklers never write it: a
    frame holds whole opcodes.  The walk visits every opcode of
    ``data[start:end]`` (a stream that passed rules 1-5), so it runs only for
    streams that have frames.
    """
    found = frame_violation(data, start, end, limits)
    if found is not None:
        raise PickleStreamError(found[1], offset=found[0])


def frame_violation(data: Buffer, start: int, end: int, limits: Limits,
                    ) -> tuple[int, str] | None:
    """Where and how ``data[start:end]`` breaks rule 6 (:func:`check_frames`), or None."""
    walk = new_walk(data, start, limits)
    pos = frame_end = start
    while pos < end:
        op, after = read_opcode(walk, pos)
        if op.code == _FRAME and pos < frame_end:
            return pos, (f"FRAME at offset {pos:#x} starts inside the frame that ends at "
                         f"{frame_end:#x}")
        if pos < frame_end < after:
            return pos, (f"{op.name} at offset {pos:#x} straddles the end of its frame at "
                         f"{frame_end:#x}: unpicklers read it differently (with and without "
                         "peek())")
        if op.code == _FRAME:
            frame_end = after + int.from_bytes(walk.data[pos + 1:after], "little")
        pos = after
    return None
