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
* **tuple hash work**: a tuple's hash is not cached; hashing it hashes every
  item, so a key built of memo references to one tuple, level upon level
  (``t1 = (t0, t0)``, ``t2 = (t1, t1)``...), costs ``2**levels`` steps in a
  file of a few hundred bytes.  :attr:`Trace.hash_steps` is the number of tuple
  hashes every key insertion makes, counting shared items once per reference.
* **memory**: :attr:`Trace.alloc_bytes` estimates the bytes CPython's C
  unpickler allocates (:func:`_sizeof` per object, as ``sys.getsizeof`` plus
  the GC header; containers grow per item; its memo table, stack and mark stack;
  what the copying constructors of the weights-only allowlist copy; the claimed
  length of a counted literal cut short, which CPython allocates before it reads).
  A memo ``GET`` or ``DUP`` pushes a reference, never a copy: 8 bytes.  It is a
  total, an upper bound on the peak (objects popped and freed are counted).
  :attr:`Trace.objects` counts the objects built.

The values the machine pushes and the :class:`Trace` it returns are in :mod:`.symbols`;
what each object and key costs CPython, in :mod:`.costs`.

The walk stops at the first stack or memo error (the real unpickler would
raise there too) and reports it in :attr:`Trace.error`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from ..errors import PickleStreamError, PtfileError
from ..limits import DEFAULT_LIMITS, Limits
from ._walk import Buffer
from .costs import (
    HASH_COST,
    MEMO_START,
    SATURATE,
    SIZE_BASE,
    SIZE_BYTEARRAY,
    SIZE_CALL,
    SIZE_DICT,
    SIZE_DICT_ENTRY,
    SIZE_LIST,
    SIZE_OBJECT,
    SIZE_SET,
    SIZE_SET_ENTRY,
    SIZE_TUPLE,
    call_size,
    claimed_length,
    hash_and_canon,
    hash_cost,
    literal_size,
)
from .decoder import Op, genops
from .symbols import Container, GlobalRef, NameUse, Result, Trace, Tup, Unresolved

__all__ = ["Container", "GlobalRef", "NameUse", "Result", "Trace", "Tup", "trace"]


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
    memo_size: int = MEMO_START
    deepest: int = 0

    def alloc(self, size: int, objects: int = 1) -> None:
        self.out.alloc_bytes += size
        self.out.objects += objects

    def memo_slot(self, index: int) -> None:
        """CPython's memo is an array: an index past its size resizes it to twice the index."""
        if index >= self.memo_size:
            self.out.alloc_bytes += 8 * 2 * index  # realloc: the new table, whole
            self.memo_size = 2 * index

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
        if not t:
            return t  # the empty tuple is a singleton
        nested = [i for i in t if isinstance(i, Tup)]
        if nested:
            t.depth = 1 + max(i.depth for i in nested)
            t.cost = min(1 + sum(i.cost for i in nested), SATURATE)
            self.out.max_tuple_depth = max(self.out.max_tuple_depth, t.depth)
        else:
            self.out.max_tuple_depth = max(self.out.max_tuple_depth, 1)
        self.alloc(SIZE_TUPLE + 8 * len(t))
        return t

    def add_keys(self, target: object, keys: Iterable[object], grow: bool = True) -> int:
        """Count ``keys`` inserted into ``target``; returns the tuple hashes they cost."""
        cost = 0
        if isinstance(target, Container) and target.kind in ("dict", "set", "frozenset"):
            n = 0
            for key in keys:
                n += 1
                cost += self.count_key(key)
            target.entries += n
            if grow:
                self.alloc(n * (SIZE_DICT_ENTRY if target.kind == "dict" else SIZE_SET_ENTRY), 0)
        return cost

    def count_key(self, key: object) -> int:
        cost = hash_cost(key)
        if cost:
            self.out.hash_steps = min(self.out.hash_steps + cost, SATURATE)
        if cost > HASH_COST:
            return cost  # hashing it here would take as long as in CPython
        found = hash_and_canon(key)
        if found is None:
            return cost
        h, canon = found
        if canon in self.seen_keys:
            return cost
        self.seen_keys.add(canon)
        n = self.per_hash[h] = self.per_hash.get(h, 0) + 1
        self.out.max_collisions = max(self.out.max_collisions, n)
        return cost


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
    m.alloc(literal_size(arg))


def _bytearray(m: _Machine, op: Op) -> None:
    _push_arg(m, op)
    size = m.stack[-1]
    m.stack[-1] = Container("bytearray")
    m.alloc(SIZE_BYTEARRAY + (len(size) if isinstance(size, bytes) else 0))


def _pusher(value: Callable[[], object]) -> _Handler:
    return lambda m, op: m.stack.append(value())


def _new(kind: str, size: int) -> _Handler:
    def handler(m: _Machine, op: Op) -> None:
        m.stack.append(Container(kind))
        m.alloc(size)
    return handler


def _list(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    m.stack.append(Container("list", items))
    m.alloc(SIZE_LIST + 8 * len(items))


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
    m.alloc(call_size(func, args) + SIZE_CALL)
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
    m.alloc(SIZE_OBJECT)
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
    m.alloc(9 * len(items), 0)  # list slots, with CPython's over-allocation
    if isinstance(target, Container):
        target.items.extend(items)


def _append(m: _Machine, op: Op) -> None:
    item = m.pop()
    target = m.top()
    m.alloc(9, 0)
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
    m.alloc(SIZE_SET)
    m.add_keys(target, items)
    m.stack.append(target)


def _dict(m: _Machine, op: Op) -> None:
    items = m.pop_mark()
    target = Container("dict")
    m.alloc(SIZE_DICT)
    m.add_keys(target, items[0::2])
    m.stack.append(target)


def _get(m: _Machine, op: Op) -> None:
    index = int(op.arg)  # type: ignore[call-overload]
    if index not in m.memo:
        raise _StackError(f"memo index {index} was never stored")
    m.stack.append(m.memo[index])


def _put(m: _Machine, op: Op) -> None:
    index = int(op.arg)  # type: ignore[call-overload]
    m.memo_slot(index)
    m.memo[index] = m.top()


def _memoize(m: _Machine, op: Op) -> None:
    m.memo_slot(len(m.memo))
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
        source = call.args[0]  # handed over again and again: its keys are counted once
        source.key_cost += m.add_keys(Container("set"), source.items[source.hashed:], False)
        m.out.hash_steps = min(m.out.hash_steps + source.key_cost, SATURATE)
        source.hashed = len(source.items)


def _reduce_and_hash(m: _Machine, op: Op) -> None:
    _reduce(m, op)
    _set_from_list(m)


def _pop_mark_discard(m: _Machine, op: Op) -> None:
    m.pop_mark()


def _mark(m: _Machine, op: Op) -> None:
    m.marks.append(len(m.stack))
    m.alloc(8, 0)  # CPython's mark stack: a Py_ssize_t per open MARK


def _pop(m: _Machine, op: Op) -> None:
    m.pop()


def _dup(m: _Machine, op: Op) -> None:
    m.stack.append(m.top())  # a reference: its stack slot is counted by the walk


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
    "EMPTY_LIST": _new("list", SIZE_LIST),
    "EMPTY_DICT": _new("dict", SIZE_DICT),
    "EMPTY_SET": _new("set", SIZE_SET),
    "MARK": _mark,
    "TUPLE": lambda m, op: m.stack.append(m.tuple_of(m.pop_mark())),
    "TUPLE1": _tuple_n(1), "TUPLE2": _tuple_n(2), "TUPLE3": _tuple_n(3),
    "LIST": _list,
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
    pos, stack, peak = start, machine.stack, 0
    try:
        for op in genops(data, start, limits=limits):
            pos = op.pos
            _HANDLERS[op.opcode.name](machine, op)
            if len(stack) > peak:  # noqa: PLR1730 - cheaper than max() once per opcode
                peak = len(stack)
            if op.opcode.name == "STOP":
                machine.out.end = op.pos + 1
    except _StackError as exc:
        machine.out.error = f"{exc} at offset {pos:#x}"
    except PtfileError as exc:  # what came before the damage still counts
        if isinstance(exc, PickleStreamError):
            machine.out.alloc_bytes += claimed_length(data, exc.offset)
        if not machine.out.names and not machine.out.calls \
                and machine.out.alloc_bytes <= limits.max_unpickled_bytes:
            raise
        machine.out.error = str(exc)
    machine.out.alloc_bytes += 9 * peak + SIZE_BASE  # the stack's slots, with over-allocation
    return machine.out
