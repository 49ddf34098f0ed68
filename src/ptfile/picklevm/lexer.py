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

6. No opcode straddles the end of a ``FRAME`` and no ``FRAME`` starts inside
   another (:func:`~ptfile.picklevm._walk.check_frames`: unpicklers read such
   a stream differently).  Checked only for streams with frames (protocol 4+).

``EXT1``/``EXT2``/``EXT4`` are accepted here but reported in
:attr:`StreamInfo.ext_offset` (the unpickler refuses them).

How fast
--------
Three gears (:mod:`~ptfile.picklevm._gears`), chosen by the stream's size,
enforce these rules with the same outcome; the exact one checks each opcode with
:func:`~ptfile.picklevm._walk.step`.

:func:`ptfile.picklevm.decoder.genops` is the slow, decoding walk (one
:class:`~ptfile.picklevm.decoder.Op` per opcode), for disassembly and static scanning.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..limits import DEFAULT_LIMITS, Limits
from ._gears import (
    FAST_GEAR_MIN_BYTES,
    RUN_GEAR_MIN_BYTES,
    memo_bits,
    walk_exact,
    walk_fast,
    walk_runs,
)
from ._walk import FREE_MEMO_INDEX, Buffer, check_frames, new_walk
from .hazards import check_number_keys

__all__ = ["Buffer", "StreamInfo", "check_stream"]


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
    walk = new_walk(data, start, limits)
    # The run and fast gears cannot count opcodes; counting only matters when the
    # ceiling on opcodes is below the ceiling on bytes (each opcode is at least a byte).
    size = walk.limit - start
    exact = limits.max_opcodes < size or limits.max_memo_index < FREE_MEMO_INDEX \
        or size < RUN_GEAR_MIN_BYTES
    gear = walk_exact if exact else walk_runs if size < FAST_GEAR_MIN_BYTES else walk_fast
    gear(walk)
    length = walk.end - start
    accepted = walk.memo_seen if exact else max(walk.memo_seen, 2 ** memo_bits(walk) - 1)
    if accepted > max(FREE_MEMO_INDEX, length):
        # STOP came before the data's end: walk again with the stream's own length.
        walk = new_walk(data, start, limits, length)
        gear(walk)
    if walk.numbers > limits.max_hash_collisions:  # rare: walk the keys (picklevm.hazards)
        check_number_keys(data, start, limits)
    if walk.frames:
        check_frames(data, start, walk.end, limits)
    return StreamInfo(start, walk.end, walk.protocol or 0, walk.max_depth, walk.ext_offset)
