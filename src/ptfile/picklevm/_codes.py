"""Opcode bytes and precomputed codes shared by the pickle writers.

The opcode bytes are those of :data:`ptfile.picklevm.opcodes.OPCODES` (the
table the readers use, checked against ``pickletools``), as one-byte
``bytes``; the rest are the fixed layouts and small-argument codes the
writers (:mod:`~ptfile.picklevm.emitter`, :mod:`~ptfile.picklevm.views`)
pack, and :func:`encode_int`, the C pickler's ``save_long``.
"""

from __future__ import annotations

import struct
from typing import Final

from ..errors import SaveError
from .opcodes import BY_NAME


def _op(name: str) -> bytes:
    """The opcode byte of ``name`` in the shared table."""
    return bytes((BY_NAME[name].code,))


# Opcodes, named as in pickletools.
PROTO: Final = _op("PROTO")
STOP: Final = _op("STOP")
NONE: Final = _op("NONE")
NEWTRUE: Final = _op("NEWTRUE")
NEWFALSE: Final = _op("NEWFALSE")
BININT1: Final = _op("BININT1")
BININT2: Final = _op("BININT2")
BININT: Final = _op("BININT")
LONG1: Final = _op("LONG1")
LONG4: Final = _op("LONG4")
BINFLOAT: Final = _op("BINFLOAT")
BINUNICODE: Final = _op("BINUNICODE")
SHORT_BINBYTES: Final = _op("SHORT_BINBYTES")
BINBYTES: Final = _op("BINBYTES")
EMPTY_TUPLE: Final = _op("EMPTY_TUPLE")
TUPLE1: Final = _op("TUPLE1")
TUPLE2: Final = _op("TUPLE2")
TUPLE3: Final = _op("TUPLE3")
TUPLE: Final = _op("TUPLE")
MARK: Final = _op("MARK")
POP: Final = _op("POP")
POP_MARK: Final = _op("POP_MARK")
EMPTY_LIST: Final = _op("EMPTY_LIST")
APPEND: Final = _op("APPEND")
APPENDS: Final = _op("APPENDS")
EMPTY_DICT: Final = _op("EMPTY_DICT")
SETITEM: Final = _op("SETITEM")
SETITEMS: Final = _op("SETITEMS")
GLOBAL: Final = _op("GLOBAL")
REDUCE: Final = _op("REDUCE")
NEWOBJ: Final = _op("NEWOBJ")
BUILD: Final = _op("BUILD")
BINPERSID: Final = _op("BINPERSID")
BINPUT: Final = _op("BINPUT")
LONG_BINPUT: Final = _op("LONG_BINPUT")
BINGET: Final = _op("BINGET")
LONG_BINGET: Final = _op("LONG_BINGET")
# Protocol 4 and 5 only (:mod:`~ptfile.picklevm.framing`).
FRAME: Final = _op("FRAME")
MEMOIZE: Final = _op("MEMOIZE")
STACK_GLOBAL: Final = _op("STACK_GLOBAL")
SHORT_BINUNICODE: Final = _op("SHORT_BINUNICODE")
BINUNICODE8: Final = _op("BINUNICODE8")
BINBYTES8: Final = _op("BINBYTES8")
BYTEARRAY8: Final = _op("BYTEARRAY8")
EMPTY_SET: Final = _op("EMPTY_SET")
ADDITEMS: Final = _op("ADDITEMS")
FROZENSET: Final = _op("FROZENSET")

U32_MAX: Final = 0xFFFFFFFF
#: Opcode + little-endian u32 (LONG_BINPUT, LONG_BINGET, BINUNICODE, BINBYTES).
OP_U32: Final = struct.Struct("<cI")
#: Opcode + little-endian u64 (FRAME, BINUNICODE8, BINBYTES8, BYTEARRAY8).
OP_U64: Final = struct.Struct("<cQ")
#: Two opcodes + little-endian u32 (TUPLE1 LONG_BINPUT, REDUCE LONG_BINPUT, ...).
OP_OP_U32: Final = struct.Struct("<ccI")
OP_U16: Final = struct.Struct("<cH")
OP_I32: Final = struct.Struct("<ci")
OP_U8: Final = struct.Struct("<cB")
OP_F64_BE: Final = struct.Struct(">cd")
BININT1_CODES: Final = tuple(OP_U8.pack(BININT1, i) for i in range(256))
BINPUT_CODES: Final = tuple(OP_U8.pack(BINPUT, i) for i in range(256))
BINGET_CODES: Final = tuple(OP_U8.pack(BINGET, i) for i in range(256))
#: Closing opcode of a tuple of 1-3 items; index 0 is unused (EMPTY_TUPLE).
SMALL_TUPLE_CODES: Final = (EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3)


def encode_int(value: int) -> bytes:
    """Return the opcode bytes of an ``int`` (C ``save_long``, protocol >= 2).

    Raises
    ------
    SaveError
        If the two's complement takes 2**31 bytes or more.

    Examples
    --------
    >>> encode_int(255), encode_int(-1), encode_int(2**31)
    (b'K\\xff', b'J\\xff\\xff\\xff\\xff', b'\\x8a\\x05\\x00\\x00\\x00\\x80\\x00')
    """
    if 0 <= value < 0x100:
        return BININT1_CODES[value]
    if 0 <= value < 0x10000:
        return OP_U16.pack(BININT2, value)
    if -0x80000000 <= value < 0x80000000:
        return OP_I32.pack(BININT, value)
    size = (value.bit_length() >> 3) + 1
    if size > 0x7FFFFFFF:  # the C pickler's "int too large to pickle"
        raise SaveError(f"int of {value.bit_length()} bits is too large to pickle")
    data = value.to_bytes(size, "little", signed=True)
    if value < 0 and data[-1] == 0xFF and data[-2] & 0x80:
        data = data[:-1]  # the top byte is only sign: -(2**(8*j-1)) fits in j bytes
    if len(data) < 0x100:
        return OP_U8.pack(LONG1, len(data)) + data
    return OP_U32.pack(LONG4, len(data)) + data


def get_code(index: int) -> bytes:
    """BINGET/LONG_BINGET of memo ``index``."""
    return BINGET_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINGET, index)


def put_code(opcode: bytes, index: int) -> bytes:
    """``opcode`` followed by the BINPUT/LONG_BINPUT of memo ``index``."""
    if index < 0x100:
        return opcode + BINPUT_CODES[index]
    if len(opcode) == 1:
        return OP_OP_U32.pack(opcode, LONG_BINPUT, index)
    return opcode + OP_U32.pack(LONG_BINPUT, index)
