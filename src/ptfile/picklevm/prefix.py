"""How far CPython's unpickler gets into a file's first bytes: a sniff that runs nothing.

``torch.load`` unpickles the start of every file that is neither a ZIP nor a tar (its
legacy loader's first ``pickle.load``), and ``pickle.load`` does the same: a file runs code
there only if the unpickler, reading it opcode by opcode from byte 0, reaches an opcode
that imports or calls before it fails.  :func:`reaches_code` replays the opcodes of a
file's first bytes on a model of the unpickler's stacks (counts of objects between marks,
the memo's keys) and answers whether it may get that far:

* **True** (the file is read as a pickle): it reaches an opcode that looks a name up or
  calls (``GLOBAL`` and ``INST`` of a dotted identifier, ``STACK_GLOBAL``, ``REDUCE``,
  ``BUILD``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``EXT1/2/4``) with the stack it needs, or a
  ``STOP`` of a pickle that holds torch's legacy magic number as an int literal (in any
  of the int opcodes: ``_legacy_load`` then reads the next pickles), or the bytes looked
  at end first (undecided: the caller scans the file).
* **False**: a ``STOP`` of any other pickle without code (``pickle.load`` returns a
  value, ``torch.load`` stops at its magic-number check: ``Git v2.12.2 Release Notes``
  reads as ``BINFLOAT`` and ``STOP``), or it fails first, as CPython fails: an unknown opcode, a stack underflow, no
  mark to pop, a memo key never stored, an argument that is not a number where one must
  be, a length or a line that runs past the file's end, a protocol over 5, out-of-band
  buffers (none are given), a persistent id (``pickle.load`` and torch's first legacy
  pickle have no ``persistent_load``).

The model keeps counts, not types: where CPython would fail on a type (``APPEND`` to an
int) the sniff goes on, so it errs towards True.  A ``GLOBAL`` or ``INST`` whose module is
not a dotted identifier (``make_minimum_required(VERSION 3.10)`` of a CMake file) counts as
a failure, as does one whose attribute path is not (``ctest_submit`` over a line of
dashes, an rst title): ``__import__`` finds no such module unless a file of that name sits
on ``sys.path``, and ``getattr`` no such attribute.  The one thing given up is the import
of an installed module that a text file's first line happens to name before a name that
no module defines; a file made to run code names its callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from .opcodes import BY_CODE, HIGHEST_PROTOCOL, Opcode

__all__ = ["reaches_code"]

#: Opcodes that look a name up or call something: reaching one is reaching code.
_CODE: Final = frozenset({"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ",
                          "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"})
#: torch's legacy magic number: an int equal to it makes ``_legacy_load`` read on.
_MAGIC: Final = 0x1950A86A20F9469CFC6C
#: The opcodes of int literals, and how their argument reads as an int.
_INTS: Final[Mapping[str, Callable[[bytes], int]]] = {
    **dict.fromkeys(("INT", "LONG"), lambda raw: _decimal(raw)),
    **dict.fromkeys(("LONG1", "LONG4"), lambda raw: int.from_bytes(raw, "little", signed=True)),
}
#: Objects each code opcode needs above the mark (INST and OBJ pop a mark first).
_CODE_NEEDS: Final = {"STACK_GLOBAL": 2, "REDUCE": 2, "BUILD": 2, "OBJ": 1, "NEWOBJ": 2,
                      "NEWOBJ_EX": 3}
#: Opcodes that fail whatever the stack holds, in ``pickle.load`` and torch's first pickle.
_FAILS: Final = frozenset({"PERSID", "BINPERSID", "NEXT_BUFFER"})
#: (objects popped, objects pushed) of the opcodes that keep the marks; each pop needs an
#: object above the topmost mark.  Value opcodes, not listed, push one.
_EFFECT: Final[Mapping[str, tuple[int, int]]] = {
    "APPEND": (1, 0), "SETITEM": (2, 0), "TUPLE1": (1, 1), "TUPLE2": (2, 1), "TUPLE3": (3, 1),
    "DUP": (1, 2), "PUT": (1, 1), "BINPUT": (1, 1), "LONG_BINPUT": (1, 1), "MEMOIZE": (1, 1),
    "READONLY_BUFFER": (1, 1), "PROTO": (0, 0), "FRAME": (0, 0), "STOP": (1, 0),
}
#: Mark-popping opcodes: what each leaves (objects pushed) and needs below the mark (the
#: list, dict or set it fills).
_MARKED: Final[Mapping[str, tuple[int, int]]] = {
    "LIST": (1, 0), "TUPLE": (1, 0), "DICT": (1, 0), "FROZENSET": (1, 0), "POP_MARK": (0, 0),
    "APPENDS": (0, 1), "SETITEMS": (0, 1), "ADDITEMS": (0, 1),
}


class _Fails(Exception):
    """The unpickler fails here (internal: never leaves this module)."""


@dataclass(slots=True)
class _Machine:
    """The unpickler's stacks as counts: objects above each mark, bottom frame first."""

    frames: list[int] = field(default_factory=lambda: [0])
    memo: set[int] = field(default_factory=set)

    def pop(self, n: int) -> None:
        if self.frames[-1] < n:
            raise _Fails
        self.frames[-1] -= n

    def pop_mark(self) -> int:
        if len(self.frames) == 1:
            raise _Fails
        return self.frames.pop()


def _argument(head: bytes, size: int, op: Opcode, pos: int) -> tuple[bytes, int] | None:
    """The argument of the opcode at ``pos`` and the offset after it; None when it runs
    past ``head`` (undecided); raises :class:`_Fails` when it runs past the file's end."""
    arg = op.arg
    if arg is None:
        return b"", pos + 1
    if arg.lines:
        end = pos + 1
        for _ in range(arg.lines):
            found = head.find(b"\n", end)
            if found < 0:
                if len(head) >= size or not _may_continue(op, head[pos + 1:]):
                    raise _Fails
                return None
            end = found + 1
        return head[pos + 1:end], end
    end = pos + 1 + arg.size
    if end > len(head):
        _past(size, end)
        return None
    if not arg.counted:
        return head[pos + 1:end], end
    length = int.from_bytes(head[pos + 1:end], "little", signed=arg.signed)
    if length < 0:
        raise _Fails
    if end + length > len(head):
        _past(size, end + length)
        return None
    return head[end:end + length], end + length


#: What may start a text argument that the bytes looked at cut short, by opcode: digits
#: (numbers in any base ``int(text, 0)`` reads, floats, ``inf``), a quote (STRING), names.
_NUMBER_TEXT: Final = frozenset(b" \t+-0123456789abcdefABCDEFxXoObB._LinfINFNn")
_NAME_TEXT: Final = frozenset(b"._\n0123456789abcdefghijklmnopqrstuvwxyz"
                              b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_PARTIAL: Final[Mapping[str, Callable[[bytes], bool]]] = {
    **dict.fromkeys(("INT", "LONG", "FLOAT", "GET", "PUT"),
                    lambda text: all(c in _NUMBER_TEXT for c in text)),
    "STRING": lambda text: text[:1] in (b"'", b'"'),
    **dict.fromkeys(("GLOBAL", "INST"),
                    lambda text: all(c in _NAME_TEXT or c >= 0x80 for c in text)),
}


def _may_continue(op: Opcode, text: bytes) -> bool:
    """Whether a text argument cut short at the bytes' end may still read (module
    docstring: erring towards yes; UNICODE lines take any text)."""
    test = _PARTIAL.get(op.name)
    return test is None or test(text)


def _past(size: int, end: int) -> None:
    """An argument that runs past the bytes looked at: a failure past the file's end."""
    if end > size:
        raise _Fails


def _decimal(raw: bytes) -> int:
    """A text number as CPython may read it (``strtol`` or ``int(text, 0)``: leniently)."""
    text = raw.strip().rstrip(b"L")
    if len(text) > 40:  # int() of a long text is slow; its digits tell enough
        if not all(c in _NUMBER_TEXT for c in text):
            raise _Fails
        return 1 << 64
    for base in (10, 0):
        try:
            return int(text, base)
        except ValueError:
            continue
    raise _Fails


def _importable(raw: bytes) -> bool:
    """Whether the two lines of GLOBAL/INST name a module and an attribute path as dotted
    identifiers (module docstring)."""
    try:
        lines = raw.decode("utf-8").split("\n")[:2]
    except UnicodeDecodeError:
        return False
    return all(part.isidentifier() for line in lines for part in line.split("."))


def _memo(m: _Machine, op: Opcode, raw: bytes) -> None:
    """GET/PUT and their binary forms: the memo's keys."""
    index = _decimal(raw) if op.name in ("GET", "PUT") else int.from_bytes(raw, "little")
    if op.name.endswith("GET"):
        if index not in m.memo:
            raise _Fails
        m.frames[-1] += 1
        return
    if op.name == "MEMOIZE":
        index = len(m.memo)
    m.pop(1)
    m.frames[-1] += 1
    if index < 0:
        raise _Fails
    m.memo.add(index)


def _value(raw: bytes, op: Opcode) -> None:
    """Text arguments CPython parses: numbers must be numbers, STRING must be quoted."""
    if op.name in ("INT", "LONG"):
        _decimal(raw)
    elif op.name == "FLOAT":
        try:
            float(raw)
        except ValueError:
            raise _Fails from None
    elif op.name == "STRING":
        text = raw.rstrip(b"\r\n")
        if len(text) < 2 or text[:1] not in (b"'", b'"') or text[-1:] != text[:1]:
            raise _Fails
    elif op.name == "PROTO" and raw[0] > HIGHEST_PROTOCOL:
        raise _Fails


def _step_code(m: _Machine, op: Opcode, raw: bytes) -> bool:
    if op.name in ("GLOBAL", "INST"):
        if op.name == "INST":
            m.pop_mark()
        return _importable(raw)
    if op.name == "OBJ":
        m.frames[-1] += m.pop_mark()
    need = _CODE_NEEDS.get(op.name, 0)
    if m.frames[-1] < need:
        raise _Fails
    return True


def reaches_code(head: bytes, size: int) -> bool:
    """Whether CPython's unpickler, reading a file of ``size`` bytes that starts with
    ``head`` from byte 0, may reach code or a ``STOP`` (module docstring).

    Examples
    --------
    >>> reaches_code(b"\\x80\\x02cos\\nsystem\\nq\\x00.", 14)
    True
    >>> reaches_code(b"Git v2.12.2 Release Notes\\n", 26)  # BINFLOAT, STOP: no code
    False
    >>> reaches_code(b"hello world\\n", 12), reaches_code(b"import os\\n", 10)
    (False, False)
    >>> reaches_code(b"cmake_minimum_required(VERSION 3.10)\\nproject(x)\\n", 48)
    False
    """
    m = _Machine()
    pos = 0
    magic = False
    try:
        while pos < len(head):
            op = BY_CODE.get(head[pos])
            if op is None or op.name in _FAILS:
                return False
            found = _argument(head, size, op, pos)
            if found is None:
                return True
            raw, pos = found
            if op.name in _CODE:
                return _step_code(m, op, raw)
            _value(raw, op)
            magic = magic or (op.name in _INTS and _INTS[op.name](raw) == _MAGIC)
            if op.name.endswith(("GET", "PUT")) or op.name == "MEMOIZE":
                _memo(m, op, raw)
            elif op.pushes_mark:
                m.frames.append(0)
            elif op.name in _MARKED:
                _pop_marked(m, op)
            elif op.name == "POP":
                _pop_one(m)
            else:
                pops, pushes = _EFFECT.get(op.name, (0, 1))
                m.pop(pops)
                if op.name == "STOP":
                    return magic
                m.frames[-1] += pushes
    except _Fails:
        return False
    return len(head) < size


def _pop_marked(m: _Machine, op: Opcode) -> None:
    pushes, below = _MARKED[op.name]
    m.pop_mark()
    if m.frames[-1] < below:
        raise _Fails
    m.frames[-1] += pushes


def _pop_one(m: _Machine) -> None:
    """POP: the topmost object, or the topmost mark when none is above it (CPython)."""
    if m.frames[-1]:
        m.frames[-1] -= 1
    else:
        m.pop_mark()
