"""The state and handlers of one :meth:`~ptfile.picklevm.pickler.Pickler.dump`.

:class:`Emitter` writes the rules of :mod:`~ptfile.picklevm.pickler`: one
handler per exact type (:data:`HANDLERS`, C ``save``'s type tests as a table),
the memo, and the result dispatch of the reducer.  The one-step
:class:`~ptfile.picklevm.nodes.ViewReduce` writer and the inline loop over dict
items are its bases (:mod:`~ptfile.picklevm.views`, :mod:`~ptfile.picklevm.pairs`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Iterable
from itertools import islice
from typing import Any, Final

from ..errors import PtfileError, SaveError, brief
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
)
from .pairs import PairWriter, add_note
from .reductions import BUILTIN_REDUCTIONS, check_args, checked_pairs
from .views import VIEW_PART_TYPES

__all__ = ["BATCH_SIZE", "HANDLERS", "PROTOCOL_HANDLERS", "Emitter"]

#: Items per MARK ... APPENDS/SETITEMS chunk (C pickler ``BATCHSIZE``).
BATCH_SIZE: Final = 1000
#: What undoes the items of a recursive tuple of 1-3 items (C writes one POP each).
_SMALL_TUPLE_DISCARD: Final = (b"", POP, POP * 2, POP * 3)
#: How ``builtins`` is spelled in GLOBAL lines (fix_imports below protocol 3).
_BUILTINS_MODULE: Final = {2: "__builtin__", 3: "builtins", 4: "builtins", 5: "builtins"}
#: How GLOBAL module and name are encoded (C ``save_global``; 4 and 5 save strs).
_GLOBAL_ENCODING: Final = {2: "ascii", 3: "utf-8", 4: "utf-8", 5: "utf-8"}


#: Exact type -> Emitter method (C ``save``'s type tests, as a table).
HANDLERS: Final[dict[type, str]] = {
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
    **dict.fromkeys(BUILTIN_REDUCTIONS, "save_builtin_reduction"),
}
#: Per-protocol overrides of HANDLERS (those of 4 and 5 are methods of
#: :class:`~ptfile.picklevm.framing.FramedEmitter`).
PROTOCOL_HANDLERS: Final[dict[int, dict[type, str]]] = {
    2: {},
    3: {bytes: "save_bytes"},
    4: {str: "save_str4", bytes: "save_bytes4", set: "save_set4", frozenset: "save_frozenset4"},
    5: {str: "save_str4", bytes: "save_bytes4", set: "save_set4", frozenset: "save_frozenset4",
        bytearray: "save_bytearray5"},
}


class Emitter(PairWriter):
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
        names = {**HANDLERS, **PROTOCOL_HANDLERS[protocol]}
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
                        add_note(exc, f"while pickling the value of key {brief(key, 80)}")
                        raise
            self.write(SETITEMS)

    # -- reduce, globals, persistent ids -----------------------------------------

    def save_builtin_reduction(self, obj: object) -> None:
        if self.fetch_memoized(obj):
            return
        self.save_reduce(BUILTIN_REDUCTIONS[type(obj)](obj, self.builtins), obj)

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
            args = check_args(args, spec.newobj)
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
            self.save_setitems(checked_pairs(spec.dictitems), single=True)
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


def _no_persistent_id(obj: object) -> None:
    """The persistent_id hook of a Pickler without one (never called)."""


def _describe(obj: object) -> str:
    kind = type(obj)
    return f"object of type {kind.__module__}.{kind.__qualname__}"


def _why_not(reducer: Reducer | None) -> str:
    if reducer is None:
        return "it is not a supported builtin and no reducer was given"
    return "it is not a supported builtin and the reducer returned None"
