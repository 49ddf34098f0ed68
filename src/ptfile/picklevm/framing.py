r"""Pickle protocols 4 and 5: the C pickler's opcodes and its 64 KiB frames.

Specification
-------------
:class:`FramedEmitter` MUST write, for protocols 4 and 5, exactly what
CPython's C pickler (``Modules/_pickle.c``, CPython 3.8-3.13) writes for the
equivalent object graph.  Everything of :mod:`~ptfile.picklevm.pickler`'s rules
holds, with these differences (pickletools names):

* **Memo.** A new entry is ``MEMOIZE`` (no argument: the index is the memo's
  size), never BINPUT; GETs are BINGET/LONG_BINGET as before.
* **str**: ``SHORT_BINUNICODE`` (u8 length) up to 255 UTF-8 bytes, BINUNICODE
  (u32) up to 2**32 - 1, then ``BINUNICODE8`` (u64).
* **bytes**: SHORT_BINBYTES, BINBYTES, then ``BINBYTES8``.  **bytearray**:
  protocol 4 reduces it as protocol 3 does (``builtins.bytearray(bytes)``);
  protocol 5 writes ``BYTEARRAY8`` (u64 length), then MEMOIZE.
* **set**: ``EMPTY_SET`` MEMOIZE, then per chunk of 1000 items ``MARK items
  ADDITEMS``; the chunks run while the last one was full, so a non-empty
  multiple of 1000 items ends with an empty ``MARK ADDITEMS``.  **frozenset**:
  ``MARK items FROZENSET`` MEMOIZE (``POP_MARK`` and a GET when an item
  memoised the frozenset, a cycle).
* **Global**: ``<save(module)> <save(name)> STACK_GLOBAL`` MEMOIZE.  Module and
  name are saved as strs (a persistent_id hook is asked about them as about
  any str).  The name is a fresh str each time; the module's str is shared by
  the globals of one module and :attr:`~ptfile.picklevm.nodes.Global.module_owner`,
  so the second global of a module fetches it with a GET.  Both take memo
  indices of their own, under no id of the graph's: they are never the
  graph's strs.  No ``fix_imports`` renaming: ``builtins`` is ``builtins``.

Framing
-------
After ``PROTO`` the stream is cut into frames (C ``_Pickler_OpcodeBoundary``,
``_Pickler_CommitFrame``, ``_Pickler_write_bytes``):

1. The first write after a cut opens a frame.  At the *start of every save*
   (every object the C ``save()`` is called with: atoms, containers, each
   item, the func and args of a reduce, a global's module and name strs, a
   persistent id), the open frame is committed when it holds 65,536 bytes
   (``FRAME_SIZE_TARGET``) or more.  Nothing else commits a frame mid-object,
   so a frame may hold far more than 64 KiB (one long run of opcodes with no
   save between them, such as a tuple's closing opcodes, is never split).
2. The payload of a str, bytes or bytearray of 65,536 bytes or more is never
   framed: the open frame is committed, then the opcode with its length and
   the payload are written outside any frame; the next write opens a new one.
3. After ``STOP`` the open frame is committed.
4. A committed frame of at least 4 bytes (``FRAME_SIZE_MIN``) is written
   ``FRAME <u64 length>`` then its bytes; a shorter one is written bare, and
   an empty one not at all.

The emitter writes the stream unframed and records where it is cut; the frames
are put in at the end (one copy of the pickle).  Only the generic handlers run:
the one-step view and dict-items writers of protocol 2 and 3 gather many saves
into one write and would miss the boundaries between them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from itertools import islice
from typing import Any, Final

from ._codes import (
    ADDITEMS,
    BINBYTES,
    BINBYTES8,
    BINUNICODE,
    BINUNICODE8,
    BYTEARRAY8,
    EMPTY_DICT,
    EMPTY_LIST,
    EMPTY_SET,
    EMPTY_TUPLE,
    FRAME,
    FROZENSET,
    MARK,
    MEMOIZE,
    NEWOBJ,
    OP_U8,
    OP_U32,
    OP_U64,
    POP,
    POP_MARK,
    REDUCE,
    SETITEMS,
    SHORT_BINBYTES,
    SHORT_BINUNICODE,
    SMALL_TUPLE_CODES,
    STACK_GLOBAL,
    TUPLE,
    U32_MAX,
)
from .emitter import BATCH_SIZE, Emitter
from .nodes import Global, PersistentId, PersistentIdHook, Reduce, Reducer, ViewReduce
from .reductions import BUILTIN_REDUCTIONS, check_args

__all__ = ["FRAME_SIZE_MIN", "FRAME_SIZE_TARGET", "FramedEmitter"]

#: A frame is committed at a save's start once it holds this many bytes; payloads
#: this long are written outside frames (C ``FRAME_SIZE_TARGET``).
FRAME_SIZE_TARGET: Final = 64 * 1024
#: Shorter frames are written without their FRAME header (C ``FRAME_SIZE_MIN``).
FRAME_SIZE_MIN: Final = 4
#: The types whose (inherited) handlers :meth:`FramedEmitter.bounded` wraps; every
#: other handler of the table is a method of FramedEmitter that starts with a boundary.
_WRAPPED_TYPES: Final = (type(None), bool, int, float, Global, PersistentId)
#: What undoes the items of a recursive tuple of 1-3 items (C writes one POP each).
_SMALL_TUPLE_DISCARD: Final = (b"", POP, POP * 2, POP * 3)


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # lone surrogates: the C pickler's fallback
        return text.encode("utf-8", "surrogatepass")


#: The opcodes of a str's and of a bytes' payload, by length prefix: u8, u32, u64.
_STR_CODES: Final = (SHORT_BINUNICODE, BINUNICODE, BINUNICODE8)
_BYTES_CODES: Final = (SHORT_BINBYTES, BINBYTES, BINBYTES8)


def _payload_header(codes: tuple[bytes, bytes, bytes], size: int) -> bytes:
    """The opcode and length of a payload of ``size`` bytes: the shortest prefix it fits."""
    short, long, huge = codes
    if size <= 0xFF:
        return OP_U8.pack(short, size)
    if size <= U32_MAX:
        return OP_U32.pack(long, size)
    return OP_U64.pack(huge, size)


class FramedEmitter(Emitter):
    """The emitter of protocols 4 and 5 (see the module docstring)."""

    __slots__ = ("asks_str", "cut", "modules", "pieces", "tell")

    def __init__(
        self,
        protocol: int,
        reducer: Reducer | None,
        hook: PersistentIdHook | None,
        persistent_types: Collection[type] | None = None,
    ) -> None:
        self.cut = 2  # where the open frame starts in the unframed output (after PROTO)
        self.pieces: list[tuple[int, int, bool]] = [(0, 2, False)]  # (start, end, framed)
        self.modules: dict[tuple[str, str], int] = {}  # (module, owner) -> memo index of its str
        super().__init__(protocol, reducer, hook, persistent_types)
        self.tell = self.out.tell
        self.asks_str = hook is not None and (persistent_types is None or str in persistent_types)
        self.views = False  # every save through the handlers: each is a frame boundary
        self.results[ViewReduce] = self.save_result_view

    def _lookup(
        self, hook: PersistentIdHook | None, persistent_types: Collection[type] | None
    ) -> tuple[Callable[..., Callable[[Any], None]], Callable[[Any], None]]:
        """Every handler starts with a frame boundary, as the C ``save()`` does.

        The handlers of this class call :meth:`boundary` first themselves (no
        Python frame more per level of nesting); the inherited ones, of objects
        that hold no others, are wrapped.
        """
        for kind in _WRAPPED_TYPES:
            if kind in self.table:
                self.table[kind] = self.bounded(self.table[kind])
        return super()._lookup(hook, persistent_types)

    def bounded(self, handler: Callable[[Any], None]) -> Callable[[Any], None]:
        """``handler`` preceded by :meth:`boundary` (a second boundary at once does nothing)."""
        boundary = self.boundary

        def save(obj: Any) -> None:
            boundary()
            handler(obj)

        return save

    # -- frames ------------------------------------------------------------------

    def boundary(self) -> None:
        """The start of a save: commit the open frame once it holds FRAME_SIZE_TARGET bytes."""
        if self.tell() - self.cut >= FRAME_SIZE_TARGET:
            self.commit()

    def commit(self) -> None:
        """End the open frame here (an empty one is no frame)."""
        end = self.out.tell()
        if end > self.cut:
            self.pieces.append((self.cut, end, True))
            self.cut = end

    def write_payload(self, header: bytes, data: bytes | bytearray) -> None:
        """``header`` and ``data``; outside any frame when ``data`` is FRAME_SIZE_TARGET or more."""
        if len(data) < FRAME_SIZE_TARGET:
            self.write(header)
            self.out.write(data)
            return
        self.commit()
        self.write(header)
        self.out.write(data)
        end = self.out.tell()
        self.pieces.append((self.cut, end, False))
        self.cut = end

    def run(self, obj: object) -> bytes:
        """Save ``obj`` and return the whole pickle, its frames put in."""
        body = memoryview(super().run(obj))
        self.commit()  # after STOP (super().run wrote it)
        parts: list[bytes | memoryview] = []
        for start, end, framed in self.pieces:
            if framed and end - start >= FRAME_SIZE_MIN:
                parts.append(OP_U64.pack(FRAME, end - start))
            parts.append(body[start:end])
        return b"".join(parts)

    def release(self) -> None:
        super().release()
        self.modules.clear()

    # -- memo --------------------------------------------------------------------

    def memoize(self, obj: object) -> None:
        """Give ``obj`` the next memo index and write MEMOIZE."""
        self.memo[id(obj)] = len(self.memo) + self.unkeyed
        self.keep.append(obj)
        self.write(MEMOIZE)

    # -- builtins ----------------------------------------------------------------

    def save_str4(self, obj: str) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        data = _utf8(obj)
        self.write_payload(_payload_header(_STR_CODES, len(data)), data)
        self.memoize(obj)

    def save_bytes4(self, obj: bytes) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write_payload(_payload_header(_BYTES_CODES, len(obj)), obj)
        self.memoize(obj)

    def save_bytearray5(self, obj: bytearray) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write_payload(OP_U64.pack(BYTEARRAY8, len(obj)), obj)
        self.memoize(obj)

    def save_set4(self, obj: set[object]) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write(EMPTY_SET)
        self.memoize(obj)
        if not obj:
            return
        rest = iter(obj)
        while True:
            chunk = list(islice(rest, BATCH_SIZE))
            self.write(MARK)
            for item in chunk:
                self.save(item)
            self.write(ADDITEMS)
            if len(chunk) < BATCH_SIZE:
                return

    def save_frozenset4(self, obj: frozenset[object]) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write(MARK)
        for item in obj:
            self.save(item)
        index = self.memo.get(id(obj))
        if index is not None:  # an item memoised the frozenset: a cycle
            self.write(POP_MARK)
            self.fetch(index)
            return
        self.write(FROZENSET)
        self.memoize(obj)

    def save_tuple(self, obj: tuple[object, ...]) -> None:
        self.boundary()
        size = len(obj)
        if not size:
            self.write(EMPTY_TUPLE)
            return
        if self.fetch_memoized(obj):
            return
        if size > 3:
            self.write(MARK)
        get, fallback = self.lookup, self.fallback
        for item in obj:
            get(type(item), fallback)(item)
        index = self.memo.get(id(obj))
        if index is not None:  # an item memoised the tuple: a cycle
            self.write(_SMALL_TUPLE_DISCARD[size] if size < 4 else POP_MARK)
            self.fetch(index)
            return
        self.write(SMALL_TUPLE_CODES[size] if size < 4 else TUPLE)
        self.memoize(obj)

    def save_list(self, obj: list[object]) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write(EMPTY_LIST)
        self.memoize(obj)
        if obj:  # batch_list_exact: only a whole list of one item uses APPEND
            self.save_appends(obj, single=len(obj) == 1)

    def save_dict(self, obj: dict[object, object]) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.write(EMPTY_DICT)
        self.memoize(obj)
        if obj:  # batch_dict_exact: SETITEM for one item, a trailing empty batch
            self.save_setitems(obj.items(), single=len(obj) == 1)
            if len(obj) % BATCH_SIZE == 0:
                self.write(MARK + SETITEMS)

    def save_builtin_reduction(self, obj: object) -> None:
        self.boundary()
        if self.fetch_memoized(obj):
            return
        self.save_reduce(BUILTIN_REDUCTIONS[type(obj)](obj, self.builtins), obj)

    def save_view(self, node: ViewReduce, key: object = None) -> None:
        """A :class:`ViewReduce` is written as its Reduce (the frames need every save)."""
        self.boundary()
        if key is None:
            key = node
        if not self.fetch_memoized(key):
            self.save_reduce(node.as_reduce(), key)

    # -- reduce and globals ------------------------------------------------------

    def save_reduce(self, spec: Reduce, key: object = None) -> None:
        """C ``save_reduce``, MEMOIZE for the memo (see the emitter's).

        Its boundary is its save's (the reducer writes nothing): a second one
        at the same place, which does nothing.
        """
        self.boundary()
        if key is None:
            key = spec
        if self.fetch_memoized(key):
            return
        args: object = spec.args
        if type(args) is not tuple:
            args = check_args(args, spec.newobj)
        elif spec.newobj and args:
            args = (*args,)  # a new tuple object, like the C pickler's argtup[1:]
        get, fallback, func = self.lookup, self.fallback, spec.func
        get(type(func), fallback)(func)
        get(type(args), fallback)(args)
        code = NEWOBJ if spec.newobj else REDUCE
        index = self.memo.get(id(key))
        if index is not None:  # the arguments memoised the object: a cycle
            self.write(code + POP)
            self.fetch(index)
            return
        self.write(code)
        self.memoize(key)
        if spec.listitems is not None or spec.dictitems is not None or spec.state is not None:
            self.save_reduction_tail(spec)

    def write_global(self, node: Global) -> None:
        """``<module> <name> STACK_GLOBAL``; the caller memoises the global."""
        self.save_name(node.module, (node.module, node.module_owner))
        self.save_name(node.name, None)
        self.write(STACK_GLOBAL)

    def save_name(self, text: str, key: tuple[str, str] | None) -> None:
        """Save a global's module (memoised under ``key``) or name (``key`` None) as a str."""
        self.boundary()
        if self.asks_str:
            pid = self.hook(text)
            if pid is not None:
                self.save_persistent(pid)
                return
        if key is not None:
            index = self.modules.get(key)
            if index is not None:
                self.fetch(index)
                return
        data = _utf8(text)
        self.write_payload(_payload_header(_STR_CODES, len(data)), data)
        index = len(self.memo) + self.unkeyed
        self.unkeyed += 1  # a str of its own: memoised under no id of the graph's
        self.write(MEMOIZE)
        if key is not None:
            self.modules[key] = index

    def save_other(self, obj: object) -> None:
        self.boundary()
        if not self.fetch_memoized(obj):
            self.save_reduced(None if self.reducer is None else self.reducer(obj), obj)

    def save_hooked(self, obj: object) -> None:
        self.boundary()
        pid = self.hook(obj)
        if pid is None:
            self.table.get(type(obj), self.save_other)(obj)
        else:
            self.save_persistent(pid)
