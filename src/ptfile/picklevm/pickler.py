r"""Pickle writer that reproduces CPython's C pickler byte for byte.

Why hand-written
----------------
``torch.save`` writes ``data.pkl`` with CPython's C pickler (``_pickle.Pickler``,
protocol 2).  The stream names globals such as ``torch._utils._rebuild_tensor_v2``
and ``torch.FloatStorage``.  The C pickler verifies every GLOBAL it writes by
importing the module and looking the name up (``save_global``), so without torch
installed it cannot emit them.  This module therefore writes the opcodes itself.
Its input is a graph of plain Python objects plus the node types of
:mod:`~ptfile.picklevm.nodes` that stand for what torch's objects reduce to:
:class:`Global` (a module-level name), :class:`Reduce` (a ``__reduce__``
result), :class:`PersistentId` (a ``persistent_id`` result) and
:class:`ViewReduce` (the common Reduce of a strided view of a persistently
stored buffer, written in one step).  It knows nothing about tensors.

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
   every object about to be saved (only those of ``persistent_types`` when
   given), except the pid it has just returned.  A result other than None is
   written as ``<save(pid)> BINPERSID`` and the object is not memoised.  A
   :class:`PersistentId` node in the graph is written the same way.
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
   A :class:`Reduce` (or :class:`ViewReduce`, as its :meth:`~ViewReduce.as_reduce`)
   is written as in rule 5 with ``obj`` as the memo key, a :class:`PersistentId`
   as in rule 1, a :class:`Global` as in rule 6 with ``obj`` as the memo key (C
   ``save_global``).  None, or no reducer, is a :class:`~ptfile.errors.SaveError`.

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
them is twice as slow).  A :class:`ViewReduce` (one per tensor) is gathered
into one write by :mod:`~ptfile.picklevm.views`; the objects it writes afresh take a
memo index without a memo entry (``unkeyed``), since id-keyed operations on a
memo of 10^5-10^6 entries are the costliest thing per tensor; dict items go through
:mod:`~ptfile.picklevm.pairs`, where a view alike an earlier one of its shape is
written from that one's template; ``persistent_types`` saves a hook call per object.
"""

from __future__ import annotations

import io
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import islice
from typing import Any, Final

from ptfile.errors import PtfileError, SaveError

from ._codes import (
    APPEND,
    APPENDS,
    BINBYTES,
    BINFLOAT,
    BINGET_CODES,
    BININT1_CODES,
    BINPERSID,
    BINPUT_CODES,
    BINUNICODE,
    BUILD,
    EMPTY_DICT,
    EMPTY_LIST,
    EMPTY_TUPLE,
    GLOBAL,
    LONG_BINGET,
    LONG_BINPUT,
    MARK,
    NEWFALSE,
    NEWOBJ,
    NEWTRUE,
    NONE,
    OP_F64_BE,
    OP_OP_U32,
    OP_U8,
    OP_U32,
    POP,
    POP_MARK,
    PROTO,
    REDUCE,
    SETITEM,
    SETITEMS,
    SHORT_BINBYTES,
    SMALL_TUPLE_CODES,
    STOP,
    TUPLE,
    U32_MAX,
    encode_int,
)
from .nodes import (
    Global,
    PersistentId,
    PersistentIdHook,
    Reduce,
    Reducer,
    ViewReduce,
    global_,
)
from .pairs import PairWriter, add_note
from .views import VIEW_PART_TYPES

__all__ = [
    "BATCH_SIZE",
    "SUPPORTED_PROTOCOLS",
    "Global",
    "PersistentId",
    "PersistentIdHook",
    "Pickler",
    "Reduce",
    "Reducer",
    "ViewReduce",
    "dumps",
    "encode_int",
    "global_",
]

#: Items per MARK ... APPENDS/SETITEMS chunk (C pickler ``BATCHSIZE``).
BATCH_SIZE: Final = 1000
#: Protocols this writer reproduces.  torch.save's default is 2.
SUPPORTED_PROTOCOLS: Final = frozenset({2, 3})
#: What undoes the items of a recursive tuple of 1-3 items (C writes one POP each).
_SMALL_TUPLE_DISCARD: Final = (b"", POP, POP * 2, POP * 3)
#: How ``builtins`` is spelled in GLOBAL lines (fix_imports below protocol 3).
_BUILTINS_MODULE: Final = {2: "__builtin__", 3: "builtins"}
#: How GLOBAL module and name are encoded (C ``save_global``).
_GLOBAL_ENCODING: Final = {2: "ascii", 3: "utf-8"}
#: The C pickler's interned ``'latin1'`` (``_Py_ID(latin1)``); a literal here is
#: the same interned object, so a user's literal ``'latin1'`` shares its memo slot.
_LATIN1: Final = "latin1"


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
    PersistentId: "save_result_pid",
    ViewReduce: "save_view",
    **dict.fromkeys(_BUILTIN_REDUCTIONS, "save_builtin_reduction"),
}
#: Per-protocol overrides of _HANDLERS.
_PROTOCOL_HANDLERS: Final[dict[int, dict[type, str]]] = {
    2: {},
    3: {bytes: "save_bytes"},
}


class _Emitter(PairWriter):
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
        "results",
        "table",
        "write",
    )

    def __init__(
        self,
        protocol: int,
        reducer: Reducer | None,
        hook: PersistentIdHook | None,
        persistent_types: Collection[type] | None = None,
    ) -> None:
        self.builtins = _BUILTINS_MODULE[protocol]
        self.encoding = _GLOBAL_ENCODING[protocol]
        self.reducer = reducer
        self.hook = _no_persistent_id if hook is None else hook
        self.out = io.BytesIO()
        self.write = self.out.write
        self.write(PROTO + bytes([protocol]))
        self.memo: dict[int, int] = {}  # id(obj) -> memo index
        self.keep: list[object] = []  # keeps every memoised id in use
        self.unkeyed = 0  # memo indices given to objects no one else holds (under no id)
        self.refs: dict[int, bytes] = {}  # id -> GET, for the str and Global write_view met
        self.shapes: dict[int, bytes] = {}  # these two: see PairWriter
        self.layouts: dict[tuple[bytes, bytes, bytes], Any] = {}
        self.templates: dict[int, tuple[Any, ...]] = {}
        names = {**_HANDLERS, **_PROTOCOL_HANDLERS[protocol]}
        self.table: dict[type, Callable[[Any], None]] = {
            kind: getattr(self, name) for kind, name in names.items()
        }
        self.lookup, self.fallback = self._lookup(hook, persistent_types)
        # The one-step ViewReduce writer calls no hook: it runs only when the hook
        # would not be asked about any of the parts it writes.
        self.views = hook is None or (
            persistent_types is not None and VIEW_PART_TYPES.isdisjoint(persistent_types)
        )
        self.results: dict[type, Callable[[Any, object], None]] = {
            Reduce: self.save_reduce,
            ViewReduce: self.write_view if self.views else self.save_result_view,
            PersistentId: self.save_result_pid,
            Global: self.save_result_global,
        }

    def _lookup(
        self, hook: PersistentIdHook | None, persistent_types: Collection[type] | None
    ) -> tuple[Callable[..., Callable[[Any], None]], Callable[[Any], None]]:
        """``lookup(type, fallback)`` finds the handler of an object.

        With a hook, the objects it is asked about (all of them, or those of
        ``persistent_types``) meet it first through :meth:`save_hooked`, which
        then uses the real table.
        """
        if hook is None:
            return self.table.get, self.save_other
        if persistent_types is None:
            return {}.get, self.save_hooked
        hooked = {**self.table, **dict.fromkeys(persistent_types, self.save_hooked)}
        return hooked.get, self.save_other

    def run(self, obj: object) -> bytes:
        """Save ``obj`` and return the whole pickle."""
        try:
            self.save(obj)
            self.write(STOP)
            return self.out.getvalue()
        except RecursionError as exc:
            raise SaveError(
                "the object graph is nested too deeply to pickle, or cycles through "
                "arguments built afresh (CPython's C pickler raises RecursionError too)"
            ) from exc
        finally:
            self.release()  # on failure too

    def release(self) -> None:
        """Empty the memo and the caches now.

        The emitter's tables hold its own bound methods, a reference cycle: left
        alone, the memo of a big state dict (10^5-10^6 entries, tens of MB) would
        live until a garbage collection found the cycle, after walking it.
        """
        for held in (self.memo, self.keep, self.refs, self.shapes, self.layouts, self.templates):
            held.clear()

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
        index = self.memo[id(obj)] = len(self.memo) + self.unkeyed
        self.keep.append(obj)
        # A LONG_BINPUT index above 2**32 would need 2**32 live objects.
        self.write(BINPUT_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINPUT, index))

    def fetch(self, index: int) -> None:
        """Write BINGET/LONG_BINGET of a memo index."""
        self.write(BINGET_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINGET, index))

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
        self.write(BININT1_CODES[obj] if 0 <= obj < 0x100 else encode_int(obj))

    def save_float(self, obj: float) -> None:
        self.write(OP_F64_BE.pack(BINFLOAT, obj))

    # -- memoised builtins -------------------------------------------------------

    def save_str(self, obj: str) -> None:
        memo = self.memo
        index = len(memo) + self.unkeyed
        found = memo.setdefault(id(obj), index)
        if found != index:
            self.write(BINGET_CODES[found] if found < 0x100 else OP_U32.pack(LONG_BINGET, found))
            return
        try:
            data = obj.encode()
        except UnicodeEncodeError:  # lone surrogates: the C pickler's fallback
            data = obj.encode("utf-8", "surrogatepass")
        size = len(data)
        if size > U32_MAX:
            raise SaveError(f"str of {size} UTF-8 bytes needs pickle protocol 4 or higher")
        self.keep.append(obj)
        write = self.write
        write(OP_U32.pack(BINUNICODE, size))
        write(data)
        write(BINPUT_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINPUT, index))

    def save_bytes(self, obj: bytes) -> None:
        """Protocol 3 bytes (C ``_save_bytes_data``)."""
        if self.fetch_memoized(obj):
            return
        size = len(obj)
        if size > U32_MAX:
            raise SaveError(f"bytes of {size} bytes needs pickle protocol 4 or higher")
        self.write(
            OP_U8.pack(SHORT_BINBYTES, size) if size < 0x100 else OP_U32.pack(BINBYTES, size)
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
            self.write(BINGET_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINGET, index))
            return
        if size > 3:
            self.write(MARK)
        get = self.lookup
        fallback = self.fallback
        for item in obj:
            get(type(item), fallback)(item)
        index = len(memo) + self.unkeyed
        found = memo.setdefault(key, index)
        if found != index:  # an item memoised the tuple: a cycle
            self.write(_SMALL_TUPLE_DISCARD[size] if size < 4 else POP_MARK)
            self.fetch(found)
            return
        self.keep.append(obj)
        close = SMALL_TUPLE_CODES[size] if size < 4 else TUPLE
        self.write(
            close + BINPUT_CODES[index]
            if index < 0x100
            else OP_OP_U32.pack(close, LONG_BINPUT, index)
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
            if self.views:  # no hook to ask about keys and parts: the inline loop
                self.write_pairs(chunk)
            else:
                for key, value in chunk:
                    get(type(key), fallback)(key)
                    try:
                        get(type(value), fallback)(value)
                    except PtfileError as exc:
                        add_note(exc, f"while pickling the value of key {key!r:.80}")
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
            self.write(BINGET_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINGET, index))
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
        index = len(memo) + self.unkeyed
        found = memo.setdefault(id(key), index)
        if found != index:  # the arguments memoised the object: a cycle
            self.write(NEWOBJ + POP if spec.newobj else REDUCE + POP)
            self.fetch(found)
            return
        self.keep.append(key)
        code = NEWOBJ if spec.newobj else REDUCE
        self.write(
            code + BINPUT_CODES[index]
            if index < 0x100
            else OP_OP_U32.pack(code, LONG_BINPUT, index)
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

    def save_persistent(self, pid: object) -> None:
        """Write ``<save(pid)> BINPERSID``; the pid itself skips the hook."""
        self.table.get(type(pid), self.save_other)(pid)
        self.write(BINPERSID)

    def save_other(self, obj: object) -> None:
        """Save an object of any other type through the reducer."""
        index = self.memo.get(id(obj))
        if index is not None:
            self.fetch(index)
            return
        self.save_reduced(None if self.reducer is None else self.reducer(obj), obj)

    def save_reduced(self, result: object, obj: object) -> None:
        """Write the reducer's ``result`` for ``obj``."""
        handler = self.results.get(type(result))
        if handler is None:
            if result is None:
                raise SaveError(f"cannot pickle {_describe(obj)}: {_why_not(self.reducer)}")
            raise SaveError(
                f"the reducer returned {type(result).__name__} for {_describe(obj)}; "
                "expected Reduce, ViewReduce, PersistentId, Global or None"
            )
        handler(result, obj)

    def save_result_pid(self, result: PersistentId, obj: object = None) -> None:
        self.save_persistent(result.pid)

    def save_result_global(self, result: Global, obj: object) -> None:
        self.write_global(result)
        self.memoize(obj)


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
        :class:`Reduce`, :class:`ViewReduce`, :class:`PersistentId` or
        :class:`Global` for it, or None when it cannot be written (C
        ``reducer_override``).
    persistent_id : callable, optional
        Called first with every object to be saved; a result other than None is
        written as a persistent id (C ``persistent_id``, as ``torch.save`` uses).
    persistent_types : collection of type, optional
        When given, ``persistent_id`` is only called with objects of these exact
        types.  The output is the same as long as the hook returns None for every
        other object; the C pickler cannot know that and asks about each one,
        which costs a call per object.

    Raises
    ------
    SaveError
        If ``protocol`` is not supported.
    """

    __slots__ = ("_persistent_id", "_persistent_types", "_reducer", "protocol")

    def __init__(
        self,
        protocol: int = 2,
        *,
        reducer: Reducer | None = None,
        persistent_id: PersistentIdHook | None = None,
        persistent_types: Collection[type] | None = None,
    ) -> None:
        if protocol not in SUPPORTED_PROTOCOLS:
            raise SaveError(
                f"pickle protocol {protocol} is not supported; ptfile writes protocols "
                f"{sorted(SUPPORTED_PROTOCOLS)}"
            )
        self.protocol = protocol
        self._reducer = reducer
        self._persistent_id = persistent_id
        self._persistent_types = None if persistent_types is None else frozenset(persistent_types)

    def dump(self, obj: object) -> bytes:
        """Return the whole pickle of ``obj``, from PROTO to STOP.

        Raises
        ------
        SaveError
            If the graph holds an object that cannot be written.
        """
        return _Emitter(
            self.protocol, self._reducer, self._persistent_id, self._persistent_types
        ).run(obj)


def dumps(
    obj: object,
    protocol: int = 2,
    *,
    reducer: Reducer | None = None,
    persistent_id: PersistentIdHook | None = None,
    persistent_types: Collection[type] | None = None,
) -> bytes:
    r"""Return the pickle of ``obj``, byte-identical to ``pickle.dumps(obj, protocol)``.

    Parameters
    ----------
    obj : object
        Builtins, :class:`Global`, :class:`Reduce` and :class:`PersistentId` nodes,
        and anything ``reducer`` handles.
    protocol, reducer, persistent_id, persistent_types
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
    >>> view = ViewReduce(global_("m", "f"), ("k", 2), 0, (2,), (1,), False, OrderedDict())
    >>> dumps(view) == dumps(view.as_reduce())
    True
    """
    return Pickler(
        protocol, reducer=reducer, persistent_id=persistent_id, persistent_types=persistent_types
    ).dump(obj)
