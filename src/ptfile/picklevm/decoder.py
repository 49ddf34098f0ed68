"""The decoding walk over a pickle stream: one :class:`Op` per opcode, nothing executed.

:func:`genops` is the slow companion of :func:`ptfile.picklevm.lexer.check_stream`
(whose rules it shares, through :func:`~ptfile.picklevm._walk.read_opcode`): it decodes every
argument, for disassembly and for static scanning (:mod:`ptfile.picklevm.symbolic`).
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from ..errors import PickleStreamError
from ..limits import DEFAULT_LIMITS, Limits
from ._walk import Buffer, Walk, new_walk, read_opcode
from .opcodes import BY_NAME, Opcode

__all__ = ["Op", "genops"]

_STOP: Final = BY_NAME["STOP"].code


@dataclass(frozen=True, slots=True)
class Op:
    """One decoded opcode of :func:`genops`.

    Attributes
    ----------
    opcode : Opcode
        The opcode.
    arg : object
        The decoded argument (None when the opcode has none); see :func:`genops`.
    pos : int
        Offset of the opcode byte.
    """

    opcode: Opcode
    arg: object
    pos: int



def _decode_decimal(raw: bytes) -> int:
    # pickletools' reading: protocol 0 writes True/False as INT 01/00.
    if raw in (b"00", b"01"):
        return raw == b"01"
    return int(raw)


def _decode_quoted(raw: bytes) -> bytes:
    if len(raw) < 2 or raw[0] != raw[-1] or raw[:1] not in (b"'", b'"'):
        raise ValueError("the STRING argument must be quoted")
    return codecs.escape_decode(raw[1:-1])[0]


def _decode_names(raw: bytes) -> tuple[str, str]:
    module, _, name = raw.partition(b"\n")
    return module.decode("utf-8"), name.decode("utf-8")


#: Argument decoders by argument layout, given the argument's bytes (without the
#: length prefix of counted arguments or the final newline of text ones).
_DECODERS: Final[Mapping[str, Callable[[bytes], object]]] = {
    "uint1": lambda raw: raw[0],
    "uint2": lambda raw: int.from_bytes(raw, "little"),
    "int4": lambda raw: int.from_bytes(raw, "little", signed=True),
    "uint4": lambda raw: int.from_bytes(raw, "little"),
    "uint8": lambda raw: int.from_bytes(raw, "little"),
    "float8": lambda raw: struct.unpack(">d", raw)[0],
    "long1": lambda raw: int.from_bytes(raw, "little", signed=True),
    "long4": lambda raw: int.from_bytes(raw, "little", signed=True),
    "string1": bytes,
    "string4": bytes,
    "bytes1": bytes,
    "bytes4": bytes,
    "bytes8": bytes,
    "bytearray8": bytes,
    "unicodestring1": lambda raw: raw.decode("utf-8", "surrogatepass"),
    "unicodestring4": lambda raw: raw.decode("utf-8", "surrogatepass"),
    "unicodestring8": lambda raw: raw.decode("utf-8", "surrogatepass"),
    "decimalnl_short": _decode_decimal,
    "decimalnl_long": lambda raw: int(raw[:-1] if raw.endswith(b"L") else raw),
    "floatnl": float,
    "stringnl": _decode_quoted,
    "stringnl_noescape": lambda raw: raw.decode("ascii"),
    "stringnl_noescape_pair": _decode_names,
    "unicodestringnl": lambda raw: raw.decode("raw-unicode-escape"),
}


def _decode(walk: Walk, op: Opcode, pos: int, end: int) -> object:
    """The decoded argument of the opcode at ``pos`` (which ends at ``end``)."""
    arg = op.arg
    if arg is None:
        return None
    begin = pos + 1 + (arg.size if arg.counted else 0)
    raw = bytes(walk.data[begin:end - 1 if arg.lines else end])
    try:
        return _DECODERS[arg.name](raw)
    except (ValueError, OverflowError, struct.error) as exc:  # UnicodeError is a ValueError
        raise PickleStreamError(f"bad {op.name} argument: {exc}", offset=pos) from exc


def genops(data: Buffer, start: int = 0, *, limits: Limits = DEFAULT_LIMITS) -> Iterator[Op]:
    """Yield the opcodes of the pickle at ``data[start:]``, up to and including ``STOP``.

    Nothing is executed.  Arguments are decoded as ``pickletools.genops``
    decodes them, except that ``GLOBAL``/``INST`` give a ``(module, name)``
    tuple decoded as UTF-8 (what ``find_class`` would receive), ``PERSID`` an
    ASCII ``str``, Python 2 strings (``STRING``, ``BINSTRING``,
    ``SHORT_BINSTRING``) their ``bytes`` (their text depends on the
    unpickler's ``encoding``) and ``BYTEARRAY8`` ``bytes``.  Rules 1, 2 and 5 of
    this module are checked as the walk goes; memo and MARK rules are not.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        Holds the pickle at ``start``.
    start : int
        Offset of the first opcode.
    limits : Limits
        ``max_pickle_bytes``, ``max_opcodes`` and ``max_name_length`` apply.

    Yields
    ------
    Op
        Opcode, decoded argument and offset in ``data``.

    Raises
    ------
    PickleStreamError
        Unknown opcode, truncated or undecodable argument, missing ``STOP``.
    LimitExceededError
        A ceiling of ``limits`` was hit.

    Examples
    --------
    >>> [(op.opcode.name, op.arg, op.pos) for op in genops(b"\\x80\\x02K\\x01.")]
    [('PROTO', 2, 0), ('BININT1', 1, 2), ('STOP', None, 4)]
    """
    walk = new_walk(data, start, limits)
    pos = start
    while True:
        op, end = read_opcode(walk, pos)
        yield Op(op, _decode(walk, op, pos, end), pos)
        if op.code == _STOP:
            return
        pos = end
