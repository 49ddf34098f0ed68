"""The pickle opcode set (protocols 0-5), as a table.

Specification (the subset ptfile reads; facts from CPython's ``pickletools``
and ``Modules/_pickle.c``)
---------------------------------------------------------------------------

A pickle is a program for a stack machine.  It is a sequence of *opcodes*;
each opcode is one byte, followed by an *argument* whose layout is fixed by the
opcode.  The program ends at the first ``STOP`` opcode (``.``); bytes after it
are not part of the pickle.

Argument layouts (names are ``pickletools.ArgumentDescriptor`` names):

* **none**: the opcode is one byte.
* **fixed**: ``uint1``, ``uint2``, ``uint4``, ``uint8`` (unsigned little-endian),
  ``int4`` (signed little-endian), ``float8`` (IEEE 754 double, **big**-endian).
* **counted**: a little-endian length prefix of 1, 4 or 8 bytes, then that many
  payload bytes: ``long1``/``long4`` (two's complement integer, little-endian),
  ``string1``/``string4`` (Python 2 ``str``), ``bytes1``/``bytes4``/``bytes8``,
  ``bytearray8``, ``unicodestring1``/``4``/``8`` (UTF-8, surrogates allowed).
  The 4-byte prefixes of ``string4`` and ``long4`` are **signed**; a negative
  length MUST be rejected.  A declared length MUST fit in the bytes that
  remain: CPython allocates the declared length before it reads the payload.
* **text**: newline-terminated lines: ``decimalnl_short``/``decimalnl_long``
  (decimal, ``LONG`` with a trailing ``L``), ``floatnl``, ``stringnl`` (a
  quoted, backslash-escaped ``repr``), ``stringnl_noescape`` (a protocol-0
  persistent id, ASCII), ``unicodestringnl`` (raw-unicode-escape), and
  ``stringnl_noescape_pair``: **two** lines, module and qualified name of a
  global (``GLOBAL``, ``INST``), which CPython decodes as UTF-8.

Machine state: a *stack* of objects; a stack of *marks* (positions in the
object stack pushed by ``MARK``); a *memo*, a table from non-negative integer
indices to objects (``PUT``/``BINPUT``/``LONG_BINPUT`` store at an explicit
index, ``MEMOIZE`` at the next free index, the ``GET`` family reads).

* Opcodes flagged ``pops_mark`` (``TUPLE``, ``LIST``, ``DICT``, ``APPENDS``,
  ``SETITEMS``, ``ADDITEMS``, ``FROZENSET``, ``POP_MARK``, ``OBJ``, ``INST``)
  pop the topmost mark and everything above it; with no mark the pickle is
  invalid and MUST be rejected.  ``MARK`` is the only opcode that pushes one.
* ``PROTO`` (protocol 2+) declares the protocol; a value above 5 MUST be
  rejected.  It SHOULD be the first opcode; readers accept it anywhere.
* ``FRAME`` (protocol 4+) announces that the next ``uint8`` bytes form a frame;
  framing is a read-ahead hint and does not change the meaning of the opcodes.
  The frame length MUST fit in the remaining bytes.
* ``GLOBAL``/``STACK_GLOBAL``/``INST`` and ``EXT1``/``EXT2``/``EXT4`` name a
  global object; loading one runs arbitrary importable code, so a reader of
  untrusted data MUST resolve names through an allowlist (``find_class``).
  ``EXT*`` codes resolve through a process-wide registry (``copyreg``).
* ``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``, ``OBJ``, ``INST`` call an object from
  the stack; ``BUILD`` calls ``__setstate__`` or updates ``__dict__``/sets
  attributes on one; ``APPEND(S)``/``SETITEM(S)``/``ADDITEMS`` call
  ``append``/``extend``/``__setitem__``/``add`` on non-builtin targets.
* ``PERSID``/``BINPERSID`` hand an id to the reader's ``persistent_load``.
* ``NEXT_BUFFER``/``READONLY_BUFFER`` (protocol 5) take out-of-band buffers;
  a reader without buffers MUST reject them.

The protocol of an opcode is the first protocol that defined it; a stream
MAY mix opcodes of any protocol up to the one it declares (CPython does not
check).  :data:`OPCODES` lists every opcode of protocols 0-5; the test suite
checks it against ``pickletools.opcodes`` (codes, names, argument layouts,
protocols, mark effects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ARG_KINDS",
    "BY_CODE",
    "BY_NAME",
    "HIGHEST_PROTOCOL",
    "OPCODES",
    "ArgKind",
    "Opcode",
]

#: Highest protocol this table describes (and CPython 3.8+ reads).
HIGHEST_PROTOCOL: Final = 5


@dataclass(frozen=True, slots=True)
class ArgKind:
    """Layout of an opcode's in-stream argument.

    Attributes
    ----------
    name : str
        The ``pickletools.ArgumentDescriptor`` name (``"uint4"``, ``"bytes8"``...).
    size : int
        Bytes of a fixed argument, or of the length prefix of a counted one;
        0 for text arguments.
    counted : bool
        The ``size`` prefix bytes give the length of a payload that follows.
    signed : bool
        The fixed integer or the length prefix is two's complement.
    lines : int
        Newline-terminated lines of a text argument (0 for binary ones).
    """

    name: str
    size: int
    counted: bool = False
    signed: bool = False
    lines: int = 0

    @property
    def fixed(self) -> bool:
        """Whether the argument always has ``size`` bytes."""
        return not self.counted and self.lines == 0


#: Every argument layout, by pickletools name.
ARG_KINDS: Final[Mapping[str, ArgKind]] = {
    kind.name: kind
    for kind in (
        ArgKind("uint1", 1),
        ArgKind("uint2", 2),
        ArgKind("int4", 4, signed=True),
        ArgKind("uint4", 4),
        ArgKind("uint8", 8),
        ArgKind("float8", 8),
        ArgKind("long1", 1, counted=True),
        ArgKind("long4", 4, counted=True, signed=True),
        ArgKind("string1", 1, counted=True),
        ArgKind("string4", 4, counted=True, signed=True),
        ArgKind("bytes1", 1, counted=True),
        ArgKind("bytes4", 4, counted=True),
        ArgKind("bytes8", 8, counted=True),
        ArgKind("bytearray8", 8, counted=True),
        ArgKind("unicodestring1", 1, counted=True),
        ArgKind("unicodestring4", 4, counted=True),
        ArgKind("unicodestring8", 8, counted=True),
        ArgKind("decimalnl_short", 0, lines=1),
        ArgKind("decimalnl_long", 0, lines=1),
        ArgKind("floatnl", 0, lines=1),
        ArgKind("stringnl", 0, lines=1),
        ArgKind("stringnl_noescape", 0, lines=1),
        ArgKind("stringnl_noescape_pair", 0, lines=2),
        ArgKind("unicodestringnl", 0, lines=1),
    )
}


@dataclass(frozen=True, slots=True)
class Opcode:
    """One pickle opcode.

    Attributes
    ----------
    name : str
        The pickletools name (``"BINUNICODE"``).
    code : int
        The opcode byte.
    arg : ArgKind or None
        Layout of the in-stream argument; None when the opcode has none.
    protocol : int
        The protocol that introduced the opcode.
    pushes_mark, pops_mark : bool
        Whether the opcode pushes a mark (only ``MARK``) or pops the topmost
        mark and the objects above it.
    """

    name: str
    code: int
    arg: ArgKind | None
    protocol: int
    pushes_mark: bool = False
    pops_mark: bool = False

    @property
    def fixed_size(self) -> int | None:
        """Total bytes of the opcode and its argument when fixed, else None."""
        if self.arg is None:
            return 1
        return 1 + self.arg.size if self.arg.fixed else None


# name, code, argument, protocol, mark effect ("push", "pop" or "").
_ROWS: Final[tuple[tuple[str, bytes, str | None, int, str], ...]] = (
    ("INT", b"I", "decimalnl_short", 0, ""),
    ("BININT", b"J", "int4", 1, ""),
    ("BININT1", b"K", "uint1", 1, ""),
    ("BININT2", b"M", "uint2", 1, ""),
    ("LONG", b"L", "decimalnl_long", 0, ""),
    ("LONG1", b"\x8a", "long1", 2, ""),
    ("LONG4", b"\x8b", "long4", 2, ""),
    ("STRING", b"S", "stringnl", 0, ""),
    ("BINSTRING", b"T", "string4", 1, ""),
    ("SHORT_BINSTRING", b"U", "string1", 1, ""),
    ("BINBYTES", b"B", "bytes4", 3, ""),
    ("SHORT_BINBYTES", b"C", "bytes1", 3, ""),
    ("BINBYTES8", b"\x8e", "bytes8", 4, ""),
    ("BYTEARRAY8", b"\x96", "bytearray8", 5, ""),
    ("NEXT_BUFFER", b"\x97", None, 5, ""),
    ("READONLY_BUFFER", b"\x98", None, 5, ""),
    ("NONE", b"N", None, 0, ""),
    ("NEWTRUE", b"\x88", None, 2, ""),
    ("NEWFALSE", b"\x89", None, 2, ""),
    ("UNICODE", b"V", "unicodestringnl", 0, ""),
    ("SHORT_BINUNICODE", b"\x8c", "unicodestring1", 4, ""),
    ("BINUNICODE", b"X", "unicodestring4", 1, ""),
    ("BINUNICODE8", b"\x8d", "unicodestring8", 4, ""),
    ("FLOAT", b"F", "floatnl", 0, ""),
    ("BINFLOAT", b"G", "float8", 1, ""),
    ("EMPTY_LIST", b"]", None, 1, ""),
    ("APPEND", b"a", None, 0, ""),
    ("APPENDS", b"e", None, 1, "pop"),
    ("LIST", b"l", None, 0, "pop"),
    ("EMPTY_TUPLE", b")", None, 1, ""),
    ("TUPLE", b"t", None, 0, "pop"),
    ("TUPLE1", b"\x85", None, 2, ""),
    ("TUPLE2", b"\x86", None, 2, ""),
    ("TUPLE3", b"\x87", None, 2, ""),
    ("EMPTY_DICT", b"}", None, 1, ""),
    ("DICT", b"d", None, 0, "pop"),
    ("SETITEM", b"s", None, 0, ""),
    ("SETITEMS", b"u", None, 1, "pop"),
    ("EMPTY_SET", b"\x8f", None, 4, ""),
    ("ADDITEMS", b"\x90", None, 4, "pop"),
    ("FROZENSET", b"\x91", None, 4, "pop"),
    ("POP", b"0", None, 0, ""),
    ("DUP", b"2", None, 0, ""),
    ("MARK", b"(", None, 0, "push"),
    ("POP_MARK", b"1", None, 1, "pop"),
    ("GET", b"g", "decimalnl_short", 0, ""),
    ("BINGET", b"h", "uint1", 1, ""),
    ("LONG_BINGET", b"j", "uint4", 1, ""),
    ("PUT", b"p", "decimalnl_short", 0, ""),
    ("BINPUT", b"q", "uint1", 1, ""),
    ("LONG_BINPUT", b"r", "uint4", 1, ""),
    ("MEMOIZE", b"\x94", None, 4, ""),
    ("EXT1", b"\x82", "uint1", 2, ""),
    ("EXT2", b"\x83", "uint2", 2, ""),
    ("EXT4", b"\x84", "int4", 2, ""),
    ("GLOBAL", b"c", "stringnl_noescape_pair", 0, ""),
    ("STACK_GLOBAL", b"\x93", None, 4, ""),
    ("REDUCE", b"R", None, 0, ""),
    ("BUILD", b"b", None, 0, ""),
    ("INST", b"i", "stringnl_noescape_pair", 0, "pop"),
    ("OBJ", b"o", None, 1, "pop"),
    ("NEWOBJ", b"\x81", None, 2, ""),
    ("NEWOBJ_EX", b"\x92", None, 4, ""),
    ("PROTO", b"\x80", "uint1", 2, ""),
    ("STOP", b".", None, 0, ""),
    ("FRAME", b"\x95", "uint8", 4, ""),
    ("PERSID", b"P", "stringnl_noescape", 0, ""),
    ("BINPERSID", b"Q", None, 1, ""),
)

#: Every opcode of protocols 0-5, in pickletools order.
OPCODES: Final[tuple[Opcode, ...]] = tuple(
    Opcode(
        name=name,
        code=code[0],
        arg=None if arg is None else ARG_KINDS[arg],
        protocol=protocol,
        pushes_mark=mark == "push",
        pops_mark=mark == "pop",
    )
    for name, code, arg, protocol, mark in _ROWS
)

#: Opcodes by code byte.
BY_CODE: Final[Mapping[int, Opcode]] = {op.code: op for op in OPCODES}

#: Opcodes by name.
BY_NAME: Final[Mapping[str, Opcode]] = {op.name: op for op in OPCODES}
