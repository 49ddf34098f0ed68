r"""The one-step writer of :class:`~ptfile.picklevm.nodes.ViewReduce` nodes.

Specification
-------------
A :class:`ViewReduce` ``func(<pid>, offset, size, stride, flag, tail)`` MUST
be written with exactly the bytes, memo operations included, that the
generic handlers of :mod:`~ptfile.picklevm.emitter` write for its
:meth:`~ViewReduce.as_reduce` (C ``save_reduce``)::

    <func> MARK <pid items> TUPLE* PUT BINPERSID <offset> <size> PUT <stride> PUT
    <flag> <OrderedDict GLOBAL or GET> EMPTY_TUPLE REDUCE PUT TUPLE PUT REDUCE PUT

(``TUPLE*`` being TUPLE1-3 or ``MARK ... TUPLE``, an empty size or stride
being EMPTY_TUPLE without PUT).  The pid tuple, ``size``, ``stride`` and an
empty ``tail`` are fresh objects: each takes the next memo index but no memo
entry (``unkeyed``), since nothing else can refer to them; the args tuple
likewise; the object the node stands for is memoised under its id last.
When a part memoised that object (a cycle), the end is ``TUPLE PUT REDUCE
POP GET`` as in ``save_reduce``.

How: the str and :class:`~ptfile.picklevm.nodes.Global` parts met once are
fetched afterwards from ``refs`` (their GET codes: memo indices never
change); int tuples from a cache by value (exact, as only all-int tuples
are looked up); any part that is not plain goes to the generic handlers.
For the common view (int offset, non-empty int tuples, a bool, a fresh
empty OrderedDict, memo indices from 256 on), everything after the pid is
one ``struct`` pack of a layout cached by the lengths of its parts.  This is
the per-tensor hot path of ``ptfile.save``.

An empty ``tail`` has no attributes when :func:`gc.get_referents` finds
nothing in it: the C ``OrderedDict`` reports its items and its instance
dict, and makes that dict on the first read of ``__dict__``.  Reading
``__dict__`` instead would attach an empty dict to each of 10^5 hooks of a
loaded checkpoint, and those allocations alone set off a collection of the
whole young heap within the save (80 ms on 100,000 tensors).  An
``OrderedDict`` that has referents goes the generic way, which checks
``__dict__`` itself.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable
from gc import get_referents
from typing import Any, Final

from ..errors import SaveError
from ._codes import (
    BININT1_CODES,
    BINPERSID,
    BINPUT_CODES,
    BINUNICODE,
    EMPTY_TUPLE,
    LONG_BINPUT,
    MARK,
    NEWFALSE,
    NEWTRUE,
    OP_OP_U32,
    OP_U32,
    POP,
    REDUCE,
    SMALL_TUPLE_CODES,
    TUPLE,
    U32_MAX,
    encode_int,
    get_code,
    put_code,
)
from .nodes import Global, PersistentId, Reduce, ViewReduce, global_

__all__ = ["VIEW_PART_TYPES", "ViewWriter"]

#: Exact types :meth:`ViewWriter.write_view` writes itself.  A persistent_id hook
#: asked about any of them must see every part, so it turns that path off.
VIEW_PART_TYPES: Final = frozenset(
    {str, int, bool, tuple, Global, OrderedDict, PersistentId, Reduce, ViewReduce}
)
_ORDERED_DICT: Final = global_("collections", "OrderedDict")
#: What follows the func of an argument-less reduce: ``() REDUCE``.
_EMPTY_REDUCE: Final = EMPTY_TUPLE + REDUCE
#: TUPLE LONG_BINPUT REDUCE LONG_BINPUT: the end of a ViewReduce.
_TUPLE_REDUCE_PUTS: Final = struct.Struct("<ccIccI")
#: EMPTY_TUPLE REDUCE LONG_BINPUT: a fresh OrderedDict() after its GLOBAL.
_EMPTY_REDUCE_PUTS: Final = struct.Struct("<cccI")
#: Opcodes of all-int tuples (items and closing opcode), by value: shapes and
#: strides repeat across the views of one checkpoint.
_INT_TUPLE_CODES: dict[tuple[int, ...], bytes] = {}
#: ... and of the non-empty ones followed by LONG_BINPUT (its index to follow).
_INT_TUPLE_PUTS: dict[tuple[int, ...], bytes] = {}
_INT_TUPLE_CACHE_SIZE: Final = 4096
#: ``TUPLE LONG_BINPUT`` and ``REDUCE LONG_BINPUT`` without their indices.
_TUPLE_PUT: Final = TUPLE + LONG_BINPUT
_REDUCE_PUT: Final = REDUCE + LONG_BINPUT
#: What follows the flag's opcode and the OrderedDict's GET: ``() REDUCE LONG_BINPUT``.
_EMPTY_REDUCE_PUT: Final = _EMPTY_REDUCE + LONG_BINPUT
#: The closing opcode of a pid tuple and LONG_BINPUT, by item count (0: four or more).
_PID_CLOSE_PUTS: Final = tuple(code + LONG_BINPUT for code in (TUPLE, *SMALL_TUPLE_CODES[1:]))
#: BINPERSID and an offset below 256.
_PERSID_INT1: Final = tuple(BINPERSID + code for code in BININT1_CODES)
#: Layouts of everything after the pid items, by the lengths of the offset, size,
#: stride and middle (flag, OrderedDict, ``() REDUCE``) codes.
_REST_LAYOUTS: dict[tuple[int, int, int, int], struct.Struct] = {}


def _rest_layout(lengths: tuple[int, int, int, int]) -> struct.Struct:
    """pid close + PUT, BINPERSID offset, size + PUT, stride + PUT, middle + PUT,
    TUPLE PUT, REDUCE PUT."""
    offset, size, stride, middle = lengths
    layout = struct.Struct(f"<2sI{offset}s{size}sI{stride}sI{middle}sI2sI2sI")
    if len(_REST_LAYOUTS) < _INT_TUPLE_CACHE_SIZE:
        _REST_LAYOUTS[lengths] = layout
    return layout


class ViewWriter:
    """The ViewReduce methods of the pickler's emitter (a mixin: the state is the emitter's)."""

    # The state it owns: memo indices taken under no id, the GETs of the str and
    # Global parts met, and whether the one-step path is on (set by the emitter).
    __slots__ = ("refs", "unkeyed", "views")

    unkeyed: int
    refs: dict[int, bytes]
    views: bool
    memo: dict[int, int]
    keep: list[object]
    write: Callable[[bytes], object]
    lookup: Callable[..., Callable[[Any], None]]
    fallback: Callable[[Any], None]
    save_reduce: Callable[[Reduce, object], None]
    save_persistent: Callable[[object], None]

    def save_view(self, node: ViewReduce, key: object = None) -> None:
        """Write ``node`` as its :class:`Reduce` would be, memoising ``key`` (default: ``node``)."""
        if key is None:
            key = node
        index = self.memo.get(id(key))
        if index is not None:
            self.write(get_code(index))
        else:
            self.save_result_view(node, key)

    def save_result_view(self, node: ViewReduce, key: object) -> None:
        """Write ``node`` for ``key``, which is not memoised."""
        if self.views:
            self.write_view(node, key)
        else:
            self.save_reduce(node.as_reduce(), key)

    def write_view(self, node: ViewReduce, key: object) -> None:
        """The bytes of ``node``'s Reduce, gathered part by part into one write."""
        func, pid = node.func, node.pid
        head = self.refs.get(id(func))
        if head is None or type(pid) is not tuple or not pid:
            parts: list[bytes] = []
            if head is None:
                self.save_part(func, parts)
                head = b""
            parts.append(head + MARK)
            self.add_pid(pid, parts)
            self.write_rest(node, key, parts)
        else:
            parts = [head + MARK + MARK if len(pid) > 3 else head + MARK]
            self.add_pid_items(pid, parts)
            if not self.write_rest_fast(node, key, parts, len(pid)):
                self.close_pid(len(pid), parts)
                self.write_rest(node, key, parts)
        self.write(b"".join(parts))

    def write_rest_fast(
        self, node: ViewReduce, key: object, parts: list[bytes], count: int
    ) -> bool:
        """Close the pid (of ``count`` items) and write the rest of the common view in one pack.

        Returns False, having done nothing, for any other view.
        """
        _, _, offset, size, stride, flag, tail = node
        od = self.refs.get(id(_ORDERED_DICT))
        if (od is None or type(offset) is not int or type(flag) is not bool
                or type(size) is not tuple or type(stride) is not tuple
                or type(tail) is not OrderedDict or get_referents(tail)):  # fmt: skip
            return False
        for item in size:
            if type(item) is not int:
                return False
        for item in stride:
            if type(item) is not int:
                return False
        size_put = _INT_TUPLE_PUTS.get(size) or _int_tuple_put(size)
        stride_put = _INT_TUPLE_PUTS.get(stride) or _int_tuple_put(stride)
        memo = self.memo
        index = len(memo) + self.unkeyed
        if size_put is None or stride_put is None or index < 0x100:
            return False
        self.unkeyed += 5  # the pid tuple, size, stride, the OrderedDict, the args tuple
        found = memo.setdefault(id(key), index + 5)
        if found != index + 5:  # a part of the pid memoised the object: a cycle
            self.unkeyed -= 5
            return False
        self.keep.append(key)
        close = _PID_CLOSE_PUTS[count] if count < 4 else _PID_CLOSE_PUTS[0]
        offset_code = _PERSID_INT1[offset] if 0 <= offset < 0x100 else BINPERSID + encode_int(offset)
        middle = (NEWTRUE if flag else NEWFALSE) + od + _EMPTY_REDUCE_PUT
        lengths = (len(offset_code), len(size_put), len(stride_put), len(middle))
        layout = _REST_LAYOUTS.get(lengths) or _rest_layout(lengths)
        parts.append(layout.pack(close, index, offset_code, size_put, index + 1, stride_put,
                                 index + 2, middle, index + 3, _TUPLE_PUT, index + 4,
                                 _REDUCE_PUT, index + 5))
        return True

    def write_rest(self, node: ViewReduce, key: object, parts: list[bytes]) -> None:
        """After the pid, any view: plain parts inline, the others the generic way."""
        _, _, offset, size, stride, flag, tail = node
        append = parts.append
        if type(offset) is int:
            append(BININT1_CODES[offset] if 0 <= offset < 0x100 else encode_int(offset))
        else:
            self.save_part(offset, parts)
        for values in (size, stride):  # fresh tuples: a memo index each, under no id
            code = _int_tuple_code(values)
            if code is None:
                self.save_part((*values,) if type(values) is tuple else values, parts)
                continue
            if code is not EMPTY_TUPLE:
                index = len(self.memo) + self.unkeyed
                self.unkeyed += 1
                code += BINPUT_CODES[index] if index < 0x100 else OP_U32.pack(LONG_BINPUT, index)
            append(code)
        if type(flag) is bool:
            append(NEWTRUE if flag else NEWFALSE)
        else:
            self.save_part(flag, parts)
        code = self.refs.get(id(_ORDERED_DICT))
        if code is None or not _is_plain_tail(tail):
            self.save_part(OrderedDict() if _is_plain_tail(tail) else tail, parts)
            self.note_ref(_ORDERED_DICT)
        else:  # a fresh OrderedDict(): () REDUCE, memoised under no id
            index = len(self.memo) + self.unkeyed
            self.unkeyed += 1
            append(code + _EMPTY_REDUCE_PUTS.pack(EMPTY_TUPLE, REDUCE, LONG_BINPUT, index)
                   if index > 0xFF else code + _EMPTY_REDUCE + BINPUT_CODES[index])
        memo = self.memo
        index = len(memo) + self.unkeyed
        self.unkeyed += 1  # the args tuple: made by no one, so memoised under no id
        found = memo.setdefault(id(key), index + 1)
        if found != index + 1:  # a part memoised the object: a cycle, as in save_reduce
            append(put_code(TUPLE, index) + REDUCE + POP + get_code(found))
        else:
            self.keep.append(key)
            append(
                _TUPLE_REDUCE_PUTS.pack(TUPLE, LONG_BINPUT, index, REDUCE, LONG_BINPUT, index + 1)
                if index > 0xFF
                else put_code(TUPLE, index) + put_code(REDUCE, index + 1)
            )

    def note_ref(self, node: Global) -> None:
        """Cache the GET of ``node`` in ``refs`` once it is memoised."""
        index = self.memo.get(id(node))
        if index is not None:
            self.refs[id(node)] = get_code(index)

    def flush(self, parts: list[bytes]) -> None:
        """Write the parts gathered so far."""
        if parts:
            self.write(b"".join(parts))
            parts.clear()

    def save_part(self, obj: object, parts: list[bytes]) -> None:
        """Write ``parts`` so far, then ``obj`` the generic way."""
        self.flush(parts)
        self.lookup(type(obj), self.fallback)(obj)
        if type(obj) is Global:
            self.refs[id(obj)] = get_code(self.memo[id(obj)])

    def add_pid(self, pid: object, parts: list[bytes]) -> None:
        """``<a fresh tuple of pid's items> BINPERSID``, as ``save_persistent`` writes it."""
        if type(pid) is not tuple or not pid:
            self.flush(parts)
            self.save_persistent(pid)  # the pid itself skips the hook
            return
        size = len(pid)
        if size > 3:
            parts.append(MARK)
        self.add_pid_items(pid, parts)
        self.close_pid(size, parts)

    def add_pid_items(self, pid: tuple[object, ...], parts: list[bytes]) -> None:
        """The items of a pid tuple, as ``save`` writes each: a str or Global met before as
        its GET, an int or a str inline, any other item the generic way."""
        ref, append = self.refs.get, parts.append
        for item in pid:
            code = ref(id(item))
            if code is not None:
                append(code)
            elif type(item) is int:
                append(BININT1_CODES[item] if 0 <= item < 0x100 else encode_int(item))
            elif type(item) is str:
                append(self.code_str(item))
            else:
                self.save_part(item, parts)

    def close_pid(self, size: int, parts: list[bytes]) -> None:
        """End a pid tuple of ``size`` items: its closing opcode, PUT, BINPERSID."""
        index = len(self.memo) + self.unkeyed
        self.unkeyed += 1  # a fresh tuple: memoised under no id
        close = SMALL_TUPLE_CODES[size] if size < 4 else TUPLE
        parts.append(
            OP_OP_U32.pack(close, LONG_BINPUT, index) + BINPERSID
            if index > 0xFF
            else close + BINPUT_CODES[index] + BINPERSID
        )

    def code_str(self, obj: str) -> bytes:
        """What the pickler's ``save_str`` writes, as bytes; a GET also goes to ``refs``."""
        memo = self.memo
        index = len(memo) + self.unkeyed
        found = memo.setdefault(id(obj), index)
        if found != index:
            code = self.refs[id(obj)] = get_code(found)
            return code
        try:
            data = obj.encode()
        except UnicodeEncodeError:  # lone surrogates: the C pickler's fallback
            data = obj.encode("utf-8", "surrogatepass")
        if len(data) > U32_MAX:
            del memo[id(obj)]
            raise SaveError(f"str of {len(data)} UTF-8 bytes needs pickle protocol 4 or higher")
        self.keep.append(obj)
        return OP_U32.pack(BINUNICODE, len(data)) + data + put_code(b"", index)


def _is_plain_tail(tail: object) -> bool:
    """True for an empty OrderedDict without attributes (what torch writes as backward hooks).

    No referents (see the module docstring) is the quick answer; an OrderedDict
    that has them may still be empty with an empty ``__dict__``.
    """
    return type(tail) is OrderedDict and (
        not get_referents(tail) or (not tail and not tail.__dict__)
    )


def _int_tuple_code(values: object) -> bytes | None:
    """The items and closing opcode of a tuple of ints (EMPTY_TUPLE for ``()``), else None.

    Pure: ints are never memoised.  Answers are cached by value, which is exact
    because only all-int tuples are looked up or stored.
    """
    if type(values) is not tuple:
        return None
    for item in values:
        if type(item) is not int:
            return None
    code = _INT_TUPLE_CODES.get(values)
    if code is None:
        size = len(values)
        items = b"".join(map(encode_int, values))
        if not size:
            code = EMPTY_TUPLE
        elif size < 4:
            code = items + SMALL_TUPLE_CODES[size]
        else:
            code = MARK + items + TUPLE
        if len(_INT_TUPLE_CODES) < _INT_TUPLE_CACHE_SIZE:
            _INT_TUPLE_CODES[values] = code
    return code


def _int_tuple_put(values: tuple[int, ...]) -> bytes | None:
    """:func:`_int_tuple_code` + LONG_BINPUT of a non-empty all-int tuple; None for ``()``."""
    code = _int_tuple_code(values)
    if code is None or code is EMPTY_TUPLE:
        return None
    put = code + LONG_BINPUT
    if len(_INT_TUPLE_PUTS) < _INT_TUPLE_CACHE_SIZE:
        _INT_TUPLE_PUTS[values] = put
    return put

