r"""Pickle writer that reproduces CPython's C pickler byte for byte.

Why hand-written
----------------
``torch.save`` writes ``data.pkl`` with CPython's C pickler (``_pickle.Pickler``,
protocol 2).  The stream names globals such as ``torch._utils._rebuild_tensor_v2``
and ``torch.FloatStorage``.  The C pickler verifies every GLOBAL it writes by
importing the module and looking the name up (``save_global``), so without torch
installed it cannot emit them.  This module therefore writes the opcodes itself.
Its input is a graph of plain Python objects plus three node types that stand for
what torch's objects reduce to: :class:`Global` (a module-level name),
:class:`Reduce` (a ``__reduce__`` result) and :class:`PersistentId` (a
``persistent_id`` result).  It knows nothing about tensors.

The output MUST be identical to what the C pickler (CPython 3.6-3.13,
``Modules/_pickle.c``) writes for the equivalent object graph, so that
``ptfile.save`` and ``torch.save`` give the same bytes.  The rules below are the C
pickler's choices (pt-format spec, sections 3.1 and 3.4); the test suite checks
them against ``pickle.dumps(x, protocol)``.

The rules
---------
A pickle MUST start with ``PROTO <protocol>`` and end with ``STOP``.  Protocol 2
(torch's default) and protocol 3 are supported.  Each object is saved as follows,
in this order (C ``save``):

1. **persistent_id.** When a ``persistent_id`` hook is given it is called with
   every object about to be saved, except the pid it has just returned.  A result
   other than None is written as ``<save(pid)> BINPERSID`` and the object is not
   memoised.  A :class:`PersistentId` node in the graph is written the same way.
2. **Atoms, never memoised.**  ``None`` is NONE; ``bool`` is NEWTRUE/NEWFALSE;
   ``int`` is BININT1 (0..255), BININT2 (256..65535), BININT (any other int32),
   else LONG1 (little-endian two's complement of minimal length; ``n.bit_length()
   // 8 + 1`` bytes, less one when that byte is only sign), or LONG4 from 256
   bytes; ``float`` is BINFLOAT (big-endian IEEE 754 double).
3. **Memo.**  Any other object that was written before is ``BINGET i``
   (``LONG_BINGET`` from 256), where ``i`` is its memo index.  The memo is keyed
   by object *identity*, never equality.  A new entry takes the next index and is
   written ``BINPUT i`` (``LONG_BINPUT`` from 256).  The memo keeps every entry
   alive until the pickle is finished, so ids cannot be reused.
4. **Builtins** (exact types only; subclasses go to the reducer):

   - ``str``: BINUNICODE (u32 length, UTF-8 with ``surrogatepass``), PUT.
   - ``bytes``, protocol 2: reduced to ``_codecs.encode(latin-1 str, 'latin1')``;
     empty bytes to ``__builtin__.bytes()``.  Protocol 3: SHORT_BINBYTES
     (< 256 bytes) or BINBYTES, then PUT.
   - ``tuple``: ``()`` is EMPTY_TUPLE, never memoised.  One to three items are
     ``items TUPLE1/2/3``; more are ``MARK items TUPLE``; then PUT.  When saving
     the items memoised the tuple itself (a cycle through a list, dict or
     reduce), the items are discarded with POP per item (POP_MARK for the
     MARK form) and the tuple is fetched with GET instead.
   - ``list``: EMPTY_LIST, PUT, then one item is ``item APPEND``; otherwise
     chunks of 1000 items, each ``MARK items APPENDS`` (a last chunk of one item
     still uses MARK).
   - ``dict``: EMPTY_DICT, PUT, then one item is ``k v SETITEM``; otherwise
     chunks of 1000 items, each ``MARK k v ... SETITEMS``, plus an empty ``MARK
     SETITEMS`` when the length is a non-zero multiple of 1000.
   - ``set``, ``frozenset``, ``bytearray``, ``complex``, ``OrderedDict`` and
     ``Counter`` are reduced as the C pickler reduces them (table
     ``_BUILTIN_REDUCTIONS``).  Below protocol 3 the module ``builtins`` is
     written ``__builtin__`` (the C pickler's ``fix_imports``).

5. **Reduce** (C ``save_reduce``): ``save(func) save(args) REDUCE``, or with
   ``newobj`` ``save(func) save(copy of args) NEWOBJ`` (the C pickler saves a
   fresh slice of the ``copyreg.__newobj__`` arguments).  Then, when the object
   is already memoised (a cycle through its arguments), ``POP GET`` and nothing
   more; otherwise PUT, then the list items, then the dict items, then
   ``save(state) BUILD`` when the state is not None.  List and dict items come
   from iterators: chunks of 1000, a chunk of a single item is ``item APPEND``
   or ``k v SETITEM`` without MARK, and there is no empty chunk.
6. **Global**: ``GLOBAL "c<module>\n<name>\n"``, PUT.  Module and name are
   written verbatim (ASCII under protocol 2, UTF-8 under 3): callers apply any
   protocol-2 renaming themselves.  :func:`global_` interns nodes, so one
   ``(module, name)`` is memoised once, as the C pickler memoises one class or
   function object.
7. **Anything else**: memo check, then ``reducer(obj)`` (C ``reducer_override``).
   A :class:`Reduce` is written as in rule 5 with ``obj`` as the memo key, a
   :class:`PersistentId` as in rule 1, a :class:`Global` as in rule 6 with
   ``obj`` as the memo key (C ``save_global``).  None, or no reducer, is a
   :class:`~ptfile.errors.SaveError`.

Nesting follows the C pickler too: handlers recurse, one or two Python frames
per level, so a graph nested deeper than the interpreter's recursion limit
(about 1000 levels by default), or one that cycles through arguments built
afresh for each reduction (a Counter holding itself), raises
:class:`~ptfile.errors.SaveError` where the C pickler raises RecursionError.
Unlike ``pickle.Pickler``, every :meth:`Pickler.dump` starts with an empty memo:
each call returns a complete, standalone pickle.

Performance: a state dict of 100,000 tensors is about 3 million objects, so
the hot handlers (str, tuple, Reduce, Global) inline their memo operations,
opcodes and memo codes below 256 are precomputed bytes, and the output is one
``io.BytesIO`` (appending millions of small bytes objects to a list and joining
them is twice as slow).
"""

from __future__ import annotations

import io
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, TypeAlias

from ptfile.errors import PtfileError, SaveError

__all__ = [
    "BATCH_SIZE",
    "SUPPORTED_PROTOCOLS",
    "Global",
    "PersistentId",
    "PersistentIdHook",
    "Pickler",
    "Reduce",
    "Reducer",
    "dumps",
    "encode_int",
    "global_",
]

#: Items per MARK ... APPENDS/SETITEMS chunk (C pickler ``BATCHSIZE``).
BATCH_SIZE: Final = 1000
#: Protocols this writer reproduces.  torch.save's default is 2.
SUPPORTED_PROTOCOLS: Final = frozenset({2, 3})

# Opcodes, named as in pickletools (checked against pickletools.opcodes in tests).
PROTO: Final = b"\x80"
STOP: Final = b"."
NONE: Final = b"N"
NEWTRUE: Final = b"\x88"
NEWFALSE: Final = b"\x89"
BININT1: Final = b"K"
BININT2: Final = b"M"
BININT: Final = b"J"
LONG1: Final = b"\x8a"
LONG4: Final = b"\x8b"
BINFLOAT: Final = b"G"
BINUNICODE: Final = b"X"
SHORT_BINBYTES: Final = b"C"
BINBYTES: Final = b"B"
EMPTY_TUPLE: Final = b")"
TUPLE1: Final = b"\x85"
TUPLE2: Final = b"\x86"
TUPLE3: Final = b"\x87"
TUPLE: Final = b"t"
MARK: Final = b"("
POP: Final = b"0"
POP_MARK: Final = b"1"
EMPTY_LIST: Final = b"]"
APPEND: Final = b"a"
APPENDS: Final = b"e"
EMPTY_DICT: Final = b"}"
SETITEM: Final = b"s"
SETITEMS: Final = b"u"
GLOBAL: Final = b"c"
REDUCE: Final = b"R"
NEWOBJ: Final = b"\x81"
BUILD: Final = b"b"
BINPERSID: Final = b"Q"
BINPUT: Final = b"q"
LONG_BINPUT: Final = b"r"
BINGET: Final = b"h"
LONG_BINGET: Final = b"j"

_U32_MAX: Final = 0xFFFFFFFF
#: Opcode + little-endian u32 (LONG_BINPUT, LONG_BINGET, BINUNICODE, BINBYTES).
_OP_U32: Final = struct.Struct("<cI")
#: Two opcodes + little-endian u32 (TUPLE1 LONG_BINPUT, REDUCE LONG_BINPUT, ...).
_OP_OP_U32: Final = struct.Struct("<ccI")
_OP_U16: Final = struct.Struct("<cH")
_OP_I32: Final = struct.Struct("<ci")
_OP_U8: Final = struct.Struct("<cB")
_OP_F64_BE: Final = struct.Struct(">cd")
_BININT1_CODES: Final = tuple(_OP_U8.pack(BININT1, i) for i in range(256))
_BINPUT_CODES: Final = tuple(_OP_U8.pack(BINPUT, i) for i in range(256))
_BINGET_CODES: Final = tuple(_OP_U8.pack(BINGET, i) for i in range(256))
#: Closing opcode of a tuple of 1-3 items; index 0 is unused (EMPTY_TUPLE).
_SMALL_TUPLE_CODES: Final = (EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3)
#: What undoes the items of a recursive tuple of 1-3 items (C writes one POP each).
_SMALL_TUPLE_DISCARD: Final = (b"", POP, POP * 2, POP * 3)
#: How ``builtins`` is spelled in GLOBAL lines (fix_imports below protocol 3).
_BUILTINS_MODULE: Final = {2: "__builtin__", 3: "builtins"}
#: How GLOBAL module and name are encoded (C ``save_global``).
_GLOBAL_ENCODING: Final = {2: "ascii", 3: "utf-8"}
#: The C pickler's interned ``'latin1'`` (``_Py_ID(latin1)``); a literal here is
#: the same interned object, so a user's literal ``'latin1'`` shares its memo slot.
_LATIN1: Final = "latin1"


@dataclass(frozen=True, slots=True)
class Global:
    """A module-level name, written as ``GLOBAL "c<module>\\n<name>\\n"``.

    Build nodes with :func:`global_`, which interns them: the memo is keyed by
    identity, and the C pickler memoises one class or function object once.

    Parameters
    ----------
    module, name : str
        Written verbatim; neither may be empty or contain a newline.

    Raises
    ------
    SaveError
        If ``module`` or ``name`` is empty or contains a newline.
    """

    module: str
    name: str

    def __post_init__(self) -> None:
        for part in (self.module, self.name):
            if not part or "\n" in part:
                raise SaveError(
                    f"cannot write global {self.module!r} {self.name!r}: "
                    "module and name must be non-empty and contain no newline"
                )


_INTERNED_GLOBALS: dict[tuple[str, str], Global] = {}


def global_(module: str, name: str) -> Global:
    """Return the one :class:`Global` node for ``(module, name)``.

    Parameters
    ----------
    module, name : str
        The global's module and qualified name, written verbatim.

    Returns
    -------
    Global
        The same object for every call with the same arguments.

    Raises
    ------
    SaveError
        If ``module`` or ``name`` is empty or contains a newline.

    Examples
    --------
    >>> global_("collections", "OrderedDict") is global_("collections", "OrderedDict")
    True
    """
    key = (module, name)
    node = _INTERNED_GLOBALS.get(key)
    if node is None:
        node = _INTERNED_GLOBALS.setdefault(key, Global(module, name))
    return node


@dataclass(frozen=True, slots=True, eq=False)
class Reduce:
    """An object written as a ``__reduce__`` result, memoised by identity.

    Parameters
    ----------
    func : Global
        The callable (the class, with ``newobj``).
    args : tuple
        Its arguments (without the class, with ``newobj``).
    state : object, optional
        Written with BUILD after the items when not None.
    listitems : iterable, optional
        Items written with APPEND/APPENDS.
    dictitems : iterable of 2-tuples, optional
        Items written with SETITEM/SETITEMS.
    newobj : bool, optional
        Write NEWOBJ instead of REDUCE, as the C pickler does for
        ``copyreg.__newobj__``.
    """

    func: Global
    args: tuple[object, ...]
    state: object = None
    listitems: Iterable[object] | None = None
    dictitems: Iterable[tuple[object, object]] | None = None
    newobj: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class PersistentId:
    """An object written as ``<save(pid)> BINPERSID``; the node is never memoised.

    ``pid`` is pickled normally, memo included: reuse one pid tuple and the second
    reference becomes a BINGET.  torch builds a fresh pid tuple per reference.
    """

    pid: object


Reducer: TypeAlias = Callable[[object], "Reduce | PersistentId | Global | None"]
PersistentIdHook: TypeAlias = Callable[[object], object]


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
        return _BININT1_CODES[value]
    if 0 <= value < 0x10000:
        return _OP_U16.pack(BININT2, value)
    if -0x80000000 <= value < 0x80000000:
        return _OP_I32.pack(BININT, value)
    size = (value.bit_length() >> 3) + 1
    if size > 0x7FFFFFFF:  # the C pickler's "int too large to pickle"
        raise SaveError(f"int of {value.bit_length()} bits is too large to pickle")
    data = value.to_bytes(size, "little", signed=True)
    if value < 0 and data[-1] == 0xFF and data[-2] & 0x80:
        data = data[:-1]  # the top byte is only sign: -(2**(8*j-1)) fits in j bytes
    if len(data) < 0x100:
        return _OP_U8.pack(LONG1, len(data)) + data
    return _OP_U32.pack(LONG4, len(data)) + data


# -- builtin reductions (what the C pickler / copyreg / __reduce__ return) --------


def _reduce_bytes(obj: bytes, builtins: str) -> Reduce:
    if not obj:
        return Reduce(global_(builtins, "bytes"), ())
    return Reduce(global_("_codecs", "encode"), (obj.decode("latin-1"), _LATIN1))


def _reduce_bytearray(obj: bytearray, builtins: str) -> Reduce:
    return Reduce(global_(builtins, "bytearray"), (bytes(obj),) if obj else ())


def _reduce_set(obj: set[object], builtins: str) -> Reduce:
    return Reduce(global_(builtins, "set"), (list(obj),))


def _reduce_frozenset(obj: frozenset[object], builtins: str) -> Reduce:
    return Reduce(global_(builtins, "frozenset"), (list(obj),))


def _reduce_complex(obj: complex, builtins: str) -> Reduce:
    return Reduce(global_(builtins, "complex"), (obj.real, obj.imag))  # copyreg.pickle_complex


def _reduce_ordered_dict(obj: OrderedDict[object, object], builtins: str) -> Reduce:
    # odict_reduce: (cls, (), __dict__ or None, None, iter(items()))
    return Reduce(
        global_("collections", "OrderedDict"), (), obj.__dict__ or None, None, obj.items()
    )


def _reduce_counter(obj: Counter[object], builtins: str) -> Reduce:
    return Reduce(global_("collections", "Counter"), (dict(obj),))  # Counter.__reduce__


_BUILTIN_REDUCTIONS: Final[dict[type, Callable[[Any, str], Reduce]]] = {
    bytes: _reduce_bytes,
    bytearray: _reduce_bytearray,
    set: _reduce_set,
    frozenset: _reduce_frozenset,
    complex: _reduce_complex,
    OrderedDict: _reduce_ordered_dict,
    Counter: _reduce_counter,
}


#: Exact type -> _Emitter method (C ``save``'s type tests, as a table).
_HANDLERS: Final[dict[type, str]] = {
    type(None): "save_none",
    bool: "save_bool",
    int: "save_int",
    float: "save_float",
    str: "save_str",
    tuple: "save_tuple",
    list: "save_list",
    dict: "save_dict",
    Global: "save_global",
    Reduce: "save_reduce",
    PersistentId: "save_persistent_id",
    **dict.fromkeys(_BUILTIN_REDUCTIONS, "save_builtin_reduction"),
}
#: Per-protocol overrides of _HANDLERS.
_PROTOCOL_HANDLERS: Final[dict[int, dict[type, str]]] = {
    2: {},
    3: {bytes: "save_bytes"},
}


class _Emitter:
    """The state of one :meth:`Pickler.dump`: output and memo.

    Handlers call each other directly through ``lookup`` (one Python frame per
    level of nesting, like the C pickler's C frames), so too deep a graph ends in
    RecursionError, which :meth:`run` turns into :class:`SaveError`.
    """

    __slots__ = (
        "builtins",
        "encoding",
        "fallback",
        "hook",
        "keep",
        "lookup",
        "memo",
        "out",
        "reducer",
        "table",
        "write",
    )

    def __init__(self, protocol: int, reducer: Reducer | None, hook: PersistentIdHook | None):
        self.builtins = _BUILTINS_MODULE[protocol]
        self.encoding = _GLOBAL_ENCODING[protocol]
        self.reducer = reducer
        self.hook = _no_persistent_id if hook is None else hook
        self.out = io.BytesIO()
        self.write = self.out.write
        self.write(PROTO + bytes([protocol]))
        self.memo: dict[int, int] = {}  # id(obj) -> memo index
        self.keep: list[object] = []  # memo index -> obj: keeps every memoised id in use
        names = {**_HANDLERS, **_PROTOCOL_HANDLERS[protocol]}
        self.table: dict[type, Callable[[Any], None]] = {
            kind: getattr(self, name) for kind, name in names.items()
        }
        # ``lookup(type, fallback)`` finds the handler of an object.  With a hook,
        # every object must meet it first: lookup in an empty table sends
        # everything to save_hooked, which then uses the real table.
        self.lookup = (self.table if hook is None else {}).get
        self.fallback = self.save_other if hook is None else self.save_hooked

    def run(self, obj: object) -> bytes:
        """Save ``obj`` and return the whole pickle."""
        try:
            self.save(obj)
        except RecursionError as exc:
            raise SaveError(
                "the object graph is nested too deeply to pickle, or cycles through "
                "arguments built afresh (CPython's C pickler raises RecursionError too)"
            ) from exc
        self.write(STOP)
        return self.out.getvalue()

    def save(self, obj: object) -> None:
        """Save any object (C ``save``)."""
        self.lookup(type(obj), self.fallback)(obj)

    def save_hooked(self, obj: object) -> None:
        """Offer ``obj`` to the persistent_id hook, then save it (C ``save_pers``)."""
        pid = self.hook(obj)
        if pid is None:
            self.table.get(type(obj), self.save_other)(obj)
        else:
            self.save_persistent(pid)

    # -- memo --------------------------------------------------------------------

    def memoize(self, obj: object) -> None:
        """Give ``obj`` the next memo index and write BINPUT/LONG_BINPUT."""
        index = self.memo[id(obj)] = len(self.memo)
        self.keep.append(obj)
        # A LONG_BINPUT index above 2**32 would need 2**32 live objects.
        self.write(_BINPUT_CODES[index] if index < 0x100 else _OP_U32.pack(LONG_BINPUT, index))

    def fetch(self, index: int) -> None:
        """Write BINGET/LONG_BINGET of a memo index."""
        self.write(_BINGET_CODES[index] if index < 0x100 else _OP_U32.pack(LONG_BINGET, index))

    def fetch_memoized(self, obj: object) -> bool:
        """Write a GET and return True when ``obj`` is memoised."""
        index = self.memo.get(id(obj))
        if index is None:
            return False
        self.fetch(index)
        return True

    # -- atoms -------------------------------------------------------------------

    def save_none(self, obj: None) -> None:
        self.write(NONE)

    def save_bool(self, obj: bool) -> None:
        self.write(NEWTRUE if obj else NEWFALSE)

    def save_int(self, obj: int) -> None:
        self.write(_BININT1_CODES[obj] if 0 <= obj < 0x100 else encode_int(obj))

    def save_float(self, obj: float) -> None:
        self.write(_OP_F64_BE.pack(BINFLOAT, obj))

    # -- memoised builtins -------------------------------------------------------

    def save_str(self, obj: str) -> None:
        memo = self.memo
        index = len(memo)
        found = memo.setdefault(id(obj), index)
        if found != index:
            self.write(_BINGET_CODES[found] if found < 0x100 else _OP_U32.pack(LONG_BINGET, found))
            return
        try:
            data = obj.encode()
        except UnicodeEncodeError:  # lone surrogates: the C pickler's fallback
            data = obj.encode("utf-8", "surrogatepass")
        size = len(data)
        if size > _U32_MAX:
            raise SaveError(f"str of {size} UTF-8 bytes needs pickle protocol 4 or higher")
        self.keep.append(obj)
        write = self.write
        write(_OP_U32.pack(BINUNICODE, size))
        write(data)
        write(_BINPUT_CODES[index] if index < 0x100 else _OP_U32.pack(LONG_BINPUT, index))

    def save_bytes(self, obj: bytes) -> None:
        """Protocol 3 bytes (C ``_save_bytes_data``)."""
        if self.fetch_memoized(obj):
            return
        size = len(obj)
        if size > _U32_MAX:
            raise SaveError(f"bytes of {size} bytes needs pickle protocol 4 or higher")
        self.write(
            _OP_U8.pack(SHORT_BINBYTES, size) if size < 0x100 else _OP_U32.pack(BINBYTES, size)
        )
        self.write(obj)
        self.memoize(obj)

    def save_tuple(self, obj: tuple[object, ...]) -> None:
        size = len(obj)
        if not size:
            self.write(EMPTY_TUPLE)
            return
        memo = self.memo
        key = id(obj)
        index = memo.get(key)
        if index is not None:
            self.write(_BINGET_CODES[index] if index < 0x100 else _OP_U32.pack(LONG_BINGET, index))
            return
        if size > 3:
            self.write(MARK)
        get = self.lookup
        fallback = self.fallback
        for item in obj:
            get(type(item), fallback)(item)
        index = len(memo)
        found = memo.setdefault(key, index)
        if found != index:  # an item memoised the tuple: a cycle
            self.write(_SMALL_TUPLE_DISCARD[size] if size < 4 else POP_MARK)
            self.fetch(found)
            return
        self.keep.append(obj)
        close = _SMALL_TUPLE_CODES[size] if size < 4 else TUPLE
        self.write(
            close + _BINPUT_CODES[index]
            if index < 0x100
            else _OP_OP_U32.pack(close, LONG_BINPUT, index)
        )

    def save_list(self, obj: list[object]) -> None:
        if self.fetch_memoized(obj):
            return
        self.write(EMPTY_LIST)
        self.memoize(obj)
        if obj:  # batch_list_exact: only a whole list of one item uses APPEND
            self.save_appends(obj, single=len(obj) == 1)

    def save_dict(self, obj: dict[object, object]) -> None:
        if self.fetch_memoized(obj):
            return
        self.write(EMPTY_DICT)
        self.memoize(obj)
        if obj:  # batch_dict_exact: SETITEM for one item, a trailing empty batch
            self.save_setitems(obj.items(), single=len(obj) == 1)
            if len(obj) % BATCH_SIZE == 0:
                self.write(MARK + SETITEMS)

    def save_appends(self, items: Iterable[object], *, single: bool) -> None:
        """Write chunks of :data:`BATCH_SIZE` items as ``MARK items APPENDS``.

        With ``single``, a chunk of one item (the last) is ``item APPEND``.
        """
        get = self.lookup
        fallback = self.fallback
        rest = iter(items)
        while chunk := list(islice(rest, BATCH_SIZE)):
            if single and len(chunk) == 1:
                self.save(chunk[0])
                self.write(APPEND)
                return
            self.write(MARK)
            for item in chunk:
                get(type(item), fallback)(item)
            self.write(APPENDS)

    def save_setitems(self, pairs: Iterable[tuple[object, object]], *, single: bool) -> None:
        """Write chunks of :data:`BATCH_SIZE` pairs as ``MARK k v ... SETITEMS``.

        With ``single``, a chunk of one pair (the last) is ``k v SETITEM``.
        """
        get = self.lookup
        fallback = self.fallback
        rest = iter(pairs)
        while chunk := list(islice(rest, BATCH_SIZE)):
            if single and len(chunk) == 1:
                self.save(chunk[0][0])
                self.save(chunk[0][1])
                self.write(SETITEM)
                return
            self.write(MARK)
            for key, value in chunk:
                get(type(key), fallback)(key)
                try:
                    get(type(value), fallback)(value)
                except PtfileError as exc:
                    _add_note(exc, f"while pickling the value of key {key!r:.80}")
                    raise
            self.write(SETITEMS)

    # -- reduce, globals, persistent ids -----------------------------------------

    def save_builtin_reduction(self, obj: object) -> None:
        if self.fetch_memoized(obj):
            return
        self.save_reduce(_BUILTIN_REDUCTIONS[type(obj)](obj, self.builtins), obj)

    def save_reduce(self, spec: Reduce, key: object = None) -> None:
        """Write ``spec`` and memoise ``key`` (default: ``spec``) as its result.

        This is C ``save_reduce``; ``key`` is the object the reduce stands for.
        """
        memo = self.memo
        if key is None:
            key = spec
        index = memo.get(id(key))
        if index is not None:
            self.write(_BINGET_CODES[index] if index < 0x100 else _OP_U32.pack(LONG_BINGET, index))
            return
        args: object = spec.args
        if type(args) is not tuple:
            args = _check_args(args, spec.newobj)
        elif spec.newobj and args:
            args = (*args,)  # a new tuple object, like the C pickler's argtup[1:]
        get = self.lookup
        func = spec.func
        get(type(func), self.fallback)(func)
        get(type(args), self.fallback)(args)
        index = len(memo)
        found = memo.setdefault(id(key), index)
        if found != index:  # the arguments memoised the object: a cycle
            self.write(NEWOBJ + POP if spec.newobj else REDUCE + POP)
            self.fetch(found)
            return
        self.keep.append(key)
        code = NEWOBJ if spec.newobj else REDUCE
        self.write(
            code + _BINPUT_CODES[index]
            if index < 0x100
            else _OP_OP_U32.pack(code, LONG_BINPUT, index)
        )
        if spec.listitems is not None or spec.dictitems is not None or spec.state is not None:
            self.save_reduction_tail(spec)

    def save_reduction_tail(self, spec: Reduce) -> None:
        """Write the list items, dict items and BUILD state of a reduce."""
        if spec.listitems is not None:
            self.save_appends(spec.listitems, single=True)
        if spec.dictitems is not None:
            self.save_setitems(_checked_pairs(spec.dictitems), single=True)
        if spec.state is not None:
            self.save(spec.state)
            self.write(BUILD)

    def save_global(self, node: Global) -> None:
        index = self.memo.get(id(node))
        if index is not None:
            self.fetch(index)
            return
        self.write_global(node)
        self.memoize(node)

    def write_global(self, node: Global) -> None:
        try:
            module = node.module.encode(self.encoding)
            name = node.name.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise SaveError(
                f"global {node.module!r} {node.name!r} is not {self.encoding}; "
                "use pickle protocol 3 for non-ASCII names"
            ) from exc
        self.write(b"".join((GLOBAL, module, b"\n", name, b"\n")))

    def save_persistent_id(self, node: PersistentId) -> None:
        pid = node.pid  # save_persistent, inlined: one call less per tensor
        self.table.get(type(pid), self.save_other)(pid)
        self.write(BINPERSID)

    def save_persistent(self, pid: object) -> None:
        """Write ``<save(pid)> BINPERSID``; the pid itself skips the hook."""
        self.table.get(type(pid), self.save_other)(pid)
        self.write(BINPERSID)

    def save_other(self, obj: object) -> None:
        """Save an object of any other type through the reducer."""
        if self.fetch_memoized(obj):
            return
        result = None if self.reducer is None else self.reducer(obj)
        match result:
            case Reduce():
                self.save_reduce(result, obj)
            case PersistentId():
                self.save_persistent(result.pid)
            case Global():
                self.write_global(result)
                self.memoize(obj)
            case None:
                raise SaveError(f"cannot pickle {_describe(obj)}: {_why_not(self.reducer)}")
            case _:
                raise SaveError(
                    f"the reducer returned {type(result).__name__} for {_describe(obj)}; "
                    "expected Reduce, PersistentId, Global or None"
                )


def _check_args(args: object, newobj: bool) -> tuple[object, ...]:
    """Return the arguments of a Reduce whose ``args`` is not exactly a tuple."""
    if not isinstance(args, tuple):
        raise SaveError(f"Reduce.args must be a tuple, not {type(args).__name__}")
    # A tuple subclass is saved as itself (through the reducer), except under
    # NEWOBJ, where the C pickler saves a plain slice of it.
    return tuple(args) if newobj else args


def _checked_pairs(pairs: Iterable[object]) -> Iterator[tuple[object, object]]:
    """Yield ``pairs``, each of which must be a 2-tuple (C ``batch_dict``)."""
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise SaveError(f"dict items must be 2-tuples, not {pair!r:.60}")
        yield pair


def _no_persistent_id(obj: object) -> None:
    """The persistent_id hook of a Pickler without one (never called)."""


def _add_note(exc: BaseException, note: str) -> None:
    """Add context to an error on its way out (``add_note`` is new in Python 3.11)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def _describe(obj: object) -> str:
    kind = type(obj)
    return f"object of type {kind.__module__}.{kind.__qualname__}"


def _why_not(reducer: Reducer | None) -> str:
    if reducer is None:
        return "it is not a supported builtin and no reducer was given"
    return "it is not a supported builtin and the reducer returned None"


class Pickler:
    """Writes pickles identical to CPython's C pickler, without importing globals.

    Parameters
    ----------
    protocol : int, optional
        2 (torch.save's default) or 3.
    reducer : callable, optional
        Called with each object of a type this module does not handle; returns a
        :class:`Reduce`, :class:`PersistentId` or :class:`Global` for it, or None
        when it cannot be written (C ``reducer_override``).
    persistent_id : callable, optional
        Called first with every object to be saved; a result other than None is
        written as a persistent id (C ``persistent_id``, as ``torch.save`` uses).

    Raises
    ------
    SaveError
        If ``protocol`` is not supported.
    """

    __slots__ = ("_persistent_id", "_reducer", "protocol")

    def __init__(
        self,
        protocol: int = 2,
        *,
        reducer: Reducer | None = None,
        persistent_id: PersistentIdHook | None = None,
    ) -> None:
        if protocol not in SUPPORTED_PROTOCOLS:
            raise SaveError(
                f"pickle protocol {protocol} is not supported; ptfile writes protocols "
                f"{sorted(SUPPORTED_PROTOCOLS)}"
            )
        self.protocol = protocol
        self._reducer = reducer
        self._persistent_id = persistent_id

    def dump(self, obj: object) -> bytes:
        """Return the whole pickle of ``obj``, from PROTO to STOP.

        Raises
        ------
        SaveError
            If the graph holds an object that cannot be written.
        """
        return _Emitter(self.protocol, self._reducer, self._persistent_id).run(obj)


def dumps(
    obj: object,
    protocol: int = 2,
    *,
    reducer: Reducer | None = None,
    persistent_id: PersistentIdHook | None = None,
) -> bytes:
    r"""Return the pickle of ``obj``, byte-identical to ``pickle.dumps(obj, protocol)``.

    Parameters
    ----------
    obj : object
        Builtins, :class:`Global`, :class:`Reduce` and :class:`PersistentId` nodes,
        and anything ``reducer`` handles.
    protocol, reducer, persistent_id
        As for :class:`Pickler`.

    Returns
    -------
    bytes
        The pickle, PROTO to STOP.

    Raises
    ------
    SaveError
        If ``protocol`` is not supported or the graph holds an object that cannot
        be written.

    Examples
    --------
    >>> dumps([1, "a"])
    b'\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.'
    >>> dumps(Reduce(global_("collections", "OrderedDict"), ()))
    b'\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.'
    """
    return Pickler(protocol, reducer=reducer, persistent_id=persistent_id).dump(obj)
