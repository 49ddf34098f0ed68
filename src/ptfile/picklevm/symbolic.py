"""A symbolic pickle machine: what a stream would name, call and hash, without running it.

:func:`trace` walks :func:`~ptfile.picklevm.decoder.genops` with a *symbolic*
stack, mark stack and memo.  Literals are kept as their values; globals as
:class:`GlobalRef`; the result of a call (``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``,
``INST``, ``OBJ``) or a persistent id as a :class:`Result`; lists, dicts and
sets as :class:`Container`.  Nothing is imported or called.  Because the memo
and the stack are simulated, a ``STACK_GLOBAL`` whose module and name strings
were built earlier, stored in the memo and fetched back (the trick that hides
names from scanners that only look at the opcode before it) resolves to the
name the real unpickler would import.  Operands that are not strings (the
result of a call, say) leave the name :attr:`NameUse.resolved` False.

The walk also measures two hazards of CPython's unpickler that no opcode-level
rule sees:

* **hash flooding**: dict and set keys that are distinct but hash alike make
  each insertion probe every earlier one (``int`` keys ``k * (2**61 - 1)`` all
  hash to 0).  Keys whose hash can be computed without running anything
  (numbers, strings, bytes, tuples of those, ``complex`` and ``torch.Size``
  calls on literal arguments) are counted per hash value;
  :attr:`Trace.max_collisions` is the largest count of distinct keys sharing one.
* **deep tuples**: hashing a tuple recurses in C without a depth check; a
  key nested a few hundred thousand tuples deep overflows the C stack.
  :attr:`Trace.max_tuple_depth` is the deepest tuple built.

The walk stops at the first stack or memo error (the real unpickler would
raise there too) and reports it in :attr:`Trace.error`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import PtfileError
from ..limits import DEFAULT_LIMITS, Limits
from ._walk import Buffer
from .decoder import Op, genops

__all__ = ["Container", "GlobalRef", "NameUse", "Result", "Trace", "Tup", "trace"]

#: Tuples nested deeper than this are not hashed by the walk (it would recurse).
HASH_DEPTH: Final = 64


@dataclass(frozen=True, slots=True)
class GlobalRef:
    """A global named by ``GLOBAL``, ``STACK_GLOBAL`` or ``INST``."""

    module: str
    name: str


@dataclass(frozen=True, slots=True)
class Unresolved:
    """A ``STACK_GLOBAL`` whose operands are not both strings."""

    module: object
    name: object


class Tup(tuple):  # type: ignore[type-arg]
    """A symbolic tuple that knows how deeply tuples nest in it."""

    depth: int = 1


@dataclass(eq=False, slots=True)
class Result:
    """What a call or a persistent id returns: ``func(*args)`` or ``persistent_load(pid)``."""

    func: object
    args: object
    opcode: str
    pos: int


@dataclass(eq=False, slots=True)
class Container:
    """A list, dict, set or frozenset under construction (``kind``); ``items`` for lists/sets."""

    kind: str
    items: list[object] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NameUse:
    """One use of a global name: which opcode, where, and whether the name is known."""

    module: str
    name: str
    opcode: str
    pos: int
    resolved: bool = True


@dataclass(slots=True)
class Trace:
    """Everything :func:`trace` saw.

    Attributes
    ----------
    names : list of NameUse
        Every ``GLOBAL``/``STACK_GLOBAL``/``INST`` (and unresolved ones).
    calls : list of Result
        Every call, in stream order.
    exts : list of (code, pos)
        ``EXT1``/``EXT2``/``EXT4`` codes.
    blobs : list of (bytes, pos)
        Byte-string literals (and latin-1 text literals that start like a
        pickle or a ZIP, or are ASCII and long enough to be base64 or hex of
        one): where nested pickles hide.
    persistent_ids : list of (object, pos)
        Persistent ids handed to ``persistent_load``.
    global_builds : list of NameUse
        ``BUILD`` applied to a global itself (sets attributes on an imported
        object: how names get smuggled past scanners, and how shared objects
        get changed for later loads).
    max_collisions, max_tuple_depth : int
        The hazards described in the module docstring.
    end : int
        Offset after ``STOP``.
    error : str or None
        Why the walk stopped early.
    """

    names: list[NameUse] = field(default_factory=list)
    calls: list[Result] = field(default_factory=list)
    exts: list[tuple[int, int]] = field(default_factory=list)
    blobs: list[tuple[bytes, int]] = field(default_factory=list)
    persistent_ids: list[tuple[object, int]] = field(default_factory=list)
    global_builds: list[NameUse] = field(default_factory=list)
    max_collisions: int = 0
    max_tuple_depth: int = 0
    end: int = -1
    error: str | None = None


class _StackError(Exception):
    """The symbolic machine hit what would be an unpickling error."""


#: Text that may carry a nested pickle or archive once latin-1 encoded: by its first
#: characters (a pickle's opcodes), or ASCII text this long (base64 or hex of one).
_BLOB_HEADS: Final = ("\x80", "PK\x03\x04", *"c(iSVIN]}")
_ENCODED_CHARS: Final = 24


@dataclass(slots=True)
class _Machine:
    out: Trace
    stack: list[object] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    memo: dict[int, object] = field(default_factory=dict)
    seen_keys: set[bytes] = field(default_factory=set)
    per_hash: dict[int, int] = field(default_factory=dict)

    def pop(self) -> object:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise _StackError("stack underflow")
        return self.stack.pop()

    def pop_mark(self) -> list[object]:
        if not self.marks:
            raise _StackError("no MARK to pop")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def top(self) -> object:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise _StackError("stack underflow")
        return self.stack[-1]

    def tuple_of(self, items: Iterable[object]) -> Tup:
        t = Tup(items)
        t.depth = 1 + max((i.depth for i in t if isinstance(i, Tup)), default=0)
        self.out.max_tuple_depth = max(self.out.max_tuple_depth, t.depth)
        return t

    def add_keys(self, target: object, keys: Iterable[object]) -> None:
        if isinstance(target, Container) and target.kind in ("dict", "set", "frozenset"):
            for key in keys:
                self.count_key(key)

    def count_key(self, key: object) -> None:
        found = _hash_and_canon(key)
        if found is None:
            return
        h, canon = found
        if canon in self.seen_keys:
            return
        self.seen_keys.add(canon)
        n = self.per_hash[h] = self.per_hash.get(h, 0) + 1
        self.out.max_collisions = max(self.out.max_collisions, n)


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


def _hash_and_canon(key: object) -> tuple[int, bytes] | None:
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


# --------------------------------------------------------------------------- opcode handlers

_Handler = Callable[[_Machine, Op], None]


def _push_arg(m: _Machine, op: Op) -> None:
    arg = op.arg
    if isinstance(arg, bytes):
        m.out.blobs.append((arg, op.pos))
    elif isinstance(arg, str) and len(arg) > 4 and (arg.startswith(_BLOB_HEADS) or (
            len(arg) >= _ENCODED_CHARS and arg.isascii())):
        try:
            m.out.blobs.append((arg.encode("latin-1"), op.pos))
        except UnicodeEncodeError:
            pass
    m.stack.append(arg)


def _bytearray(m: _Machine, op: Op) -> None:
    _push_arg(m, op)
    m.stack[-1] = Container("bytearray")


def _pusher(value: Callable[[], object]) -> _Handler:
    return lambda m, op: m.stack.append(value())


def _names(op: Op) -> tuple[str, str]:
    pair = op.arg
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise _StackError(f"{op.opcode.name} without a (module, name) argument")
    return str(pair[0]), str(pair[1])


def _global(m: _Machine, op: Op) -> None:
    module, name = _names(op)
    m.out.names.append(NameUse(module, name, op.opcode.name, op.pos))
    m.stack.append(GlobalRef(module, name))


def _stack_global(m: _Machine, op: Op) -> None:
    name, module = m.pop(), m.pop()
    if isinstance(module, str) and isinstance(name, str):
        m.out.names.append(NameUse(module, name, op.opcode.name, op.pos))
        m.stack.append(GlobalRef(module, name))
        return
    m.out.names.append(NameUse(_describe(module), _describe(name), op.opcode.name, op.pos,
                               resolved=False))
    m.stack.append(Unresolved(module, name))


def _describe(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Result) and isinstance(value.func, GlobalRef):
        return f"<result of {value.func.module}.{value.func.name}>"
    return f"<{type(value).__name__}>"


def _call(m: _Machine, func: object, args: object, op: Op) -> None:
    result = Result(func, args, op.opcode.name, op.pos)
    m.out.calls.append(result)
    m.stack.append(result)


def _reduce(m: _Machine, op: Op) -> None:
    args = m.pop()
    _call(m, m.pop(), args, op)


def _newobj_ex(m: _Machine, op: Op) -> None:
    m.pop()  # kwargs
    args = m.pop()
    _call(m, m.pop(), args, op)


def _inst(m: _Machine, op: Op) -> None:
    module, name = _names(op)
    m.out.names.append(NameUse(module, name, op.opcode.name, op.pos))
    _call(m, GlobalRef(module, name), m.tuple_of(m.pop_mark()), op)


def _obj(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    if not items:
        raise _StackError("OBJ without a class")
    _call(m, items[0], m.tuple_of(items[1:]), op)


def _persid(m: _Machine, op: Op) -> None:
    pid = op.arg if op.opcode.name == "PERSID" else m.pop()
    m.out.persistent_ids.append((pid, op.pos))
    m.stack.append(Result("persistent_load", pid, op.opcode.name, op.pos))


def _ext(m: _Machine, op: Op) -> None:
    m.out.exts.append((int(op.arg), op.pos))  # type: ignore[call-overload]
    m.stack.append(Result("ext", op.arg, op.opcode.name, op.pos))


def _tuple_n(n: int) -> _Handler:
    def handler(m: _Machine, op: Op) -> None:
        items = [m.pop() for _ in range(n)][::-1]
        m.stack.append(m.tuple_of(items))
    return handler


def _appends(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    target = m.top()
    if isinstance(target, Container):
        target.items.extend(items)


def _append(m: _Machine, op: Op) -> None:
    item = m.pop()
    target = m.top()
    if isinstance(target, Container):
        target.items.append(item)


def _setitems(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    m.add_keys(m.top(), items[0::2])


def _setitem(m: _Machine, op: Op) -> None:
    m.pop()
    key = m.pop()
    m.add_keys(m.top(), [key])


def _additems(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    m.add_keys(m.top(), items)


def _frozenset(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    target = Container("frozenset", items)
    m.add_keys(target, items)
    m.stack.append(target)


def _dict(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    target = Container("dict")
    m.add_keys(target, items[0::2])
    m.stack.append(target)


def _get(m: _Machine, op: Op) -> None:
    index = int(op.arg)  # type: ignore[call-overload]
    if index not in m.memo:
        raise _StackError(f"memo index {index} was never stored")
    m.stack.append(m.memo[index])


def _put(m: _Machine, op: Op) -> None:
    m.memo[int(op.arg)] = m.top()  # type: ignore[call-overload]


def _memoize(m: _Machine, op: Op) -> None:
    m.memo[len(m.memo)] = m.top()


def _build(m: _Machine, op: Op) -> None:
    m.pop()
    target = m.top()
    if isinstance(target, GlobalRef):
        m.out.global_builds.append(NameUse(target.module, target.name, op.opcode.name, op.pos))


def _set_from_list(m: _Machine) -> None:
    """``builtins.set([...])``-style calls hash their list's items: count them."""
    call = m.stack[-1]
    if isinstance(call, Result) and isinstance(call.func, GlobalRef) \
            and call.func.name in ("set", "frozenset", "OrderedDict", "Counter") \
            and isinstance(call.args, tuple) and call.args \
            and isinstance(call.args[0], Container):
        m.add_keys(Container("set"), call.args[0].items)


def _reduce_and_hash(m: _Machine, op: Op) -> None:
    _reduce(m, op)
    _set_from_list(m)


def _pop_mark_discard(m: _Machine, op: Op) -> None:
    m.pop_mark()


def _mark(m: _Machine, op: Op) -> None:
    m.marks.append(len(m.stack))


def _pop(m: _Machine, op: Op) -> None:
    m.pop()


def _dup(m: _Machine, op: Op) -> None:
    m.stack.append(m.top())


def _ignore(m: _Machine, op: Op) -> None:
    return


_LITERALS: Final = (
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
)

_HANDLERS: Final[dict[str, _Handler]] = {
    **dict.fromkeys(_LITERALS, _push_arg),
    "BYTEARRAY8": _bytearray,
    "NONE": _pusher(lambda: None),
    "NEWTRUE": _pusher(lambda: True),
    "NEWFALSE": _pusher(lambda: False),
    "EMPTY_TUPLE": _pusher(lambda: Tup()),
    "EMPTY_LIST": _pusher(lambda: Container("list")),
    "EMPTY_DICT": _pusher(lambda: Container("dict")),
    "EMPTY_SET": _pusher(lambda: Container("set")),
    "MARK": _mark,
    "TUPLE": lambda m, op: m.stack.append(m.tuple_of(m.pop_mark())),
    "TUPLE1": _tuple_n(1), "TUPLE2": _tuple_n(2), "TUPLE3": _tuple_n(3),
    "LIST": lambda m, op: m.stack.append(Container("list", m.pop_mark())),
    "DICT": _dict,
    "FROZENSET": _frozenset,
    "APPEND": _append, "APPENDS": _appends,
    "SETITEM": _setitem, "SETITEMS": _setitems, "ADDITEMS": _additems,
    "POP": _pop, "POP_MARK": _pop_mark_discard, "DUP": _dup,
    "GET": _get, "BINGET": _get, "LONG_BINGET": _get,
    "PUT": _put, "BINPUT": _put, "LONG_BINPUT": _put, "MEMOIZE": _memoize,
    "GLOBAL": _global, "STACK_GLOBAL": _stack_global, "INST": _inst, "OBJ": _obj,
    "REDUCE": _reduce_and_hash, "NEWOBJ": _reduce, "NEWOBJ_EX": _newobj_ex,
    "BUILD": _build,
    "PERSID": _persid, "BINPERSID": _persid,
    "EXT1": _ext, "EXT2": _ext, "EXT4": _ext,
    "NEXT_BUFFER": _pusher(lambda: Container("buffer")),
    "READONLY_BUFFER": _ignore,
    "PROTO": _ignore, "FRAME": _ignore, "STOP": _ignore,
}


def trace(data: Buffer, start: int = 0, *, limits: Limits = DEFAULT_LIMITS) -> Trace:
    """Walk the pickle at ``data[start:]`` symbolically; nothing is imported or called.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        Holds the pickle at ``start``.
    start : int
        Offset of the first opcode.
    limits : Limits
        As :func:`~ptfile.picklevm.genops` applies them.

    Returns
    -------
    Trace
        Names, calls, EXT codes, byte blobs, persistent ids and hazards; ``error``
        says why the walk stopped before ``STOP``, if it did.

    Raises
    ------
    PickleStreamError
        An opcode or argument cannot be decoded (as :func:`~ptfile.picklevm.genops`)
        before any global or call was seen; after one, the trace is returned with
        ``error`` set, so that damage placed after a payload does not hide it.
    LimitExceededError
        As ``PickleStreamError``, for a ceiling of ``limits``.

    Examples
    --------
    >>> t = trace(b"\\x80\\x04\\x8c\\x02os\\x94\\x8c\\x06system\\x94\\x93.")
    >>> [(n.module, n.name, n.opcode) for n in t.names]
    [('os', 'system', 'STACK_GLOBAL')]
    """
    machine = _Machine(Trace())
    pos = start
    try:
        for op in genops(data, start, limits=limits):
            pos = op.pos
            _HANDLERS[op.opcode.name](machine, op)
            if op.opcode.name == "STOP":
                machine.out.end = op.pos + 1
    except _StackError as exc:
        machine.out.error = f"{exc} at offset {pos:#x}"
    except PtfileError as exc:  # what came before the damage still counts
        if not machine.out.names and not machine.out.calls:
            raise
        machine.out.error = str(exc)
    return machine.out


def hazards(info: Trace) -> dict[str, Any]:
    """The hazard measures of a trace, for messages and reports."""
    return {"max_collisions": info.max_collisions, "max_tuple_depth": info.max_tuple_depth}
