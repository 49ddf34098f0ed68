r"""The loop that writes a chunk of dict items: str keys and reduced values, inline.

Specification
-------------
:meth:`PairWriter.write_pairs` MUST write a chunk of dict items with exactly
the bytes, memo operations included, that the pickler's generic loop writes:
for each pair ``save(key)`` then ``save(value)`` (the caller writes MARK and
SETITEMS around the chunk).  An error raised while writing a value gets the
note ``while pickling the value of key ...``, as in the generic loop.  It
runs only where the one-step :class:`~ptfile.picklevm.nodes.ViewReduce`
writer may (no persistent_id hook is asked about the parts it writes).

How: a state dict is 10^5-10^6 ``str -> tensor`` pairs, so this is the hot
loop of ``ptfile.save``: one loop of local names, with one Python call per pair
besides the reducer's (the view's writer: :meth:`PairWriter.write_alike`, else
:meth:`PairWriter.write_common_view`).  Once memo indices have reached 256 (every
PUT is then LONG_BINPUT):

* a str key: ``BINUNICODE <u32> <utf-8> LONG_BINPUT <u32>`` in one pack of a
  layout cached by length, or its GET when it is memoised;
* a value the reducer turns into the common :class:`ViewReduce` (as
  :meth:`~ptfile.picklevm.views.ViewWriter.write_rest_fast` defines it: func,
  OrderedDict and pid items already met, or plain str and int pid items; int
  offset; non-empty all-int size and stride; bool flag; an OrderedDict tail
  without referents, i.e. empty and without ``__dict__``, as
  :mod:`~ptfile.picklevm.views` explains): the head and pid items, then the
  rest in one pack of a layout cached by the lengths of its parts;
* a view *alike* the first common view of its size tuple (see
  :meth:`PairWriter.like`: the same func, offset, size, stride and flag
  objects, the same pid items but one fresh str, at the same place): the
  template's bytes around that str and the memo indices, in one pack.  A
  loaded checkpoint shares one size tuple per shape, and torch's pids differ
  only in the storage key, so nearly every tensor of a state dict is one
  identity check per part and one pack (B, 100,000 tensors: 390 -> 335 ms
  for the pickle).

Any other key, value or part is written by the generic handlers
(``lookup``/``save_other``'s result dispatch/``write_view``) once the bytes
gathered so far are written, so the output never depends on which path wrote
a pair.  Size and stride tuples are looked up by identity first (a loaded
checkpoint shares one tuple among equal shapes); each entry of that cache
holds its tuple, so the identity cannot be reused while the cache lives.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from gc import get_referents
from typing import Any, Final

from ..errors import PtfileError, SaveError, add_note, brief
from ._codes import (
    BINPERSID,
    BINUNICODE,
    LONG_BINPUT,
    MARK,
    NEWFALSE,
    NEWTRUE,
    U32_MAX,
    encode_int,
    get_code,
)
from .nodes import Reducer, ViewReduce
from .views import (
    _EMPTY_REDUCE_PUT,
    _INT_TUPLE_CACHE_SIZE,
    _ORDERED_DICT,
    _PERSID_INT1,
    _PID_CLOSE_PUTS,
    _REDUCE_PUT,
    _TUPLE_PUT,
    ViewWriter,
    _int_tuple_put,
)

__all__ = ["PairWriter", "add_note"]

#: BINUNICODE layouts by UTF-8 length: opcode, length, bytes, LONG_BINPUT, index.
_STR_LAYOUTS: dict[int, struct.Struct] = {}
#: Rest-of-view layouts (pid close + PUT ... REDUCE PUT) by the lengths of the
#: offset, size, stride and OrderedDict GET codes.
_VIEW_LAYOUTS: dict[tuple[int, int, int, int], struct.Struct] = {}
#: The bytes before a view's pid items: the args tuple's MARK, the pid's own MARK
#: when it has more than 3 items.
_PID_OPEN: Final = (MARK, MARK, MARK, MARK, MARK + MARK)
#: The flag's opcode.
_FLAG: Final = {False: NEWFALSE, True: NEWTRUE}
#: Items of the pids that views alike may share (torch's: storage, class, key,
#: location, numel): one fresh str among them, the others the same objects.
_LIKE_PID_ITEMS: Final = 5
#: ``templates`` entry of a size tuple whose first view could not be a template.
_UNLIKE: Final = ()


def _str_layout(size: int) -> struct.Struct:
    if size > U32_MAX:
        raise SaveError(f"str of {size} UTF-8 bytes needs pickle protocol 4 or higher")
    layout = struct.Struct(f"<cI{size}scI")
    if len(_STR_LAYOUTS) < _INT_TUPLE_CACHE_SIZE:
        _STR_LAYOUTS[size] = layout
    return layout


def _view_layout(lengths: tuple[int, int, int, int]) -> struct.Struct:
    """pid close + PUT, BINPERSID offset, size + PUT, stride + PUT, flag,
    OrderedDict GET, ``() REDUCE`` + PUT, TUPLE PUT, REDUCE PUT."""
    offset, size, stride, od = lengths
    layout = struct.Struct(f"<2sI{offset}s{size}sI{stride}sIc{od}s3sI2sI2sI")
    if len(_VIEW_LAYOUTS) < _INT_TUPLE_CACHE_SIZE:
        _VIEW_LAYOUTS[lengths] = layout
    return layout


def _like_layout(segments: tuple[bytes, ...], by_size: dict[int, struct.Struct],
                 size: int) -> struct.Struct:
    """The layout of a view alike a template (``segments``), its fresh str of ``size`` bytes."""
    if size > U32_MAX:
        raise SaveError(f"str of {size} UTF-8 bytes needs pickle protocol 4 or higher")
    pre, close, size_put, stride_put, middle = map(len, segments)
    layout = struct.Struct(f"<{pre}scI{size}scI{close}sI{size_put}sI{stride_put}sI{middle}sI2sI2sI")
    if len(by_size) < _INT_TUPLE_CACHE_SIZE:
        by_size[size] = layout
    return layout


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # lone surrogates: the C pickler's fallback
        return text.encode("utf-8", "surrogatepass")




class PairWriter(ViewWriter):
    """The dict-items loop of the pickler's emitter (a mixin: the state is the emitter's)."""

    # The puts of size and stride tuples by id (b"" for any other object; the
    # objects are held in ``keep``) and the rest-of-view layouts of this dump by
    # (offset code, size put, stride put), the OrderedDict's GET being fixed.
    # ``templates``: the views alike, by the id of their size tuple (see like()).
    __slots__ = ("layouts", "shapes", "templates")

    shapes: dict[int, bytes]
    layouts: dict[tuple[bytes, bytes, bytes], struct.Struct]
    templates: dict[int, tuple[Any, ...]]
    reducer: Reducer | None
    save_reduced: Callable[[object, object], None]

    def write_pairs(self, chunk: Sequence[tuple[object, object]]) -> None:
        """Write ``<key> <value>`` for every pair of ``chunk``, in few writes: each str key
        here, then its value: a view alike an earlier one (:meth:`write_alike`), another
        common view (:meth:`write_common_view`), or the generic way."""
        memo, reducer, templates = self.memo, self.reducer, self.templates
        claim, known, lookup, keep = memo.setdefault, memo.get, self.lookup, self.keep.append
        strs = _STR_LAYOUTS
        parts: list[bytes] = []
        add = parts.append
        for key, value in chunk:
            index = len(memo) + self.unkeyed
            if type(key) is not str or index < 0x100 or reducer is None:
                self.write_pair(key, value, parts)
                continue
            found = claim(id(key), index)
            if found == index:
                try:
                    data = key.encode()
                except UnicodeEncodeError:
                    data = _utf8(key)
                keep(key)
                size = len(data)
                add((strs.get(size) or _str_layout(size)).pack(
                    BINUNICODE, size, data, LONG_BINPUT, index))
            else:
                add(get_code(found))
            if lookup(type(value)) is not None or known(id(value)) is not None:
                self.write_value(key, value, parts)
                continue
            try:
                view = reducer(value)
            except PtfileError as exc:
                add_note(exc, f"while pickling the value of key {brief(key, 80)}")
                raise
            if type(view) is not ViewReduce:
                self.write_reduced(key, value, view, parts)
                continue
            like = templates.get(id(view[3]))
            if not (like and self.write_alike(like, view, value, parts)):
                self.write_common_view(key, value, view, like, parts)
        self.flush(parts)

    def write_alike(self, like: tuple[Any, ...], view: ViewReduce, value: object,
                    parts: list[bytes]) -> bool:
        """Write ``view`` by the template ``like`` (:meth:`like`) when it is alike: the
        template's bytes around its one fresh str and the memo indices, in one pack;
        False (nothing written) when it is not."""
        f, pid, offset, _, stride, flag, tail = view
        if (type(pid) is not tuple or len(pid) != _LIKE_PID_ITEMS
                or type(tail) is not OrderedDict or get_referents(tail)):  # fmt: skip
            return False
        (_, t_stride, t_func, t_offset, t_flag, at, i0, o0, i1, o1, i2, o2, i3, o3,
         segments, by_size) = like
        item = pid[at]
        if not (stride is t_stride and f is t_func and offset is t_offset and flag is t_flag
                and pid[i0] is o0 and pid[i1] is o1 and pid[i2] is o2 and pid[i3] is o3
                and type(item) is str):  # fmt: skip
            return False
        memo = self.memo
        index = len(memo) + self.unkeyed
        if memo.setdefault(id(item), index) != index:  # a str met before: not alike
            return False
        try:
            data = item.encode()
        except UnicodeEncodeError:
            data = _utf8(item)
        keep = self.keep.append
        keep(item)
        memo[id(value)] = index + 6  # nothing but the str was saved: no cycle
        keep(value)
        self.unkeyed += 5  # the pid tuple, size, stride, the OrderedDict, args
        size = len(data)
        pre, close, size_put, stride_put, middle = segments
        parts.append((by_size.get(size) or _like_layout(segments, by_size, size)).pack(
            pre, BINUNICODE, size, data, LONG_BINPUT, index, close, index + 1,
            size_put, index + 2, stride_put, index + 3, middle, index + 4,
            _TUPLE_PUT, index + 5, _REDUCE_PUT, index + 6))
        return True

    def write_common_view(self, key: object, value: object, view: ViewReduce,
                          like: tuple[Any, ...] | None, parts: list[bytes]) -> None:
        """Write a common view (module docstring): its head and pid items, then the rest in
        one pack; any other view the generic way.  The first common view of a size tuple
        leaves its template (``like`` None: none yet)."""
        f, pid, offset, size_, stride, flag, tail = view
        ref = self.refs.get
        head, od = ref(id(f)), ref(id(_ORDERED_DICT))
        if (head is None or od is None or type(pid) is not tuple or not pid
                or type(offset) is not int or type(flag) is not bool
                or type(tail) is not OrderedDict or get_referents(tail)):  # fmt: skip
            self.write_reduced(key, value, view, parts)
            return
        count = len(pid)
        parts.append(head)
        parts.append(_PID_OPEN[count] if count < 4 else _PID_OPEN[4])
        self.add_pid_items(pid, parts)
        size_put = self.shapes.get(id(size_)) or self.shape_put(size_)
        stride_put = self.shapes.get(id(stride)) or self.shape_put(stride)
        index = len(self.memo) + self.unkeyed
        if not size_put or not stride_put or self.memo.setdefault(id(value), index + 5) != index + 5:
            self.close_pid(count, parts)
            self.write_rest(view, value, parts)
            return
        self.unkeyed += 5  # the pid tuple, size, stride, the OrderedDict, the args tuple
        self.keep.append(value)
        persid = _PERSID_INT1[offset] if 0 <= offset < 0x100 else BINPERSID + encode_int(offset)
        layout = self.layouts.get((persid, size_put, stride_put))
        if layout is None:
            layout = self.view_layout(persid, size_put, stride_put, od)
        parts.append(layout.pack(
            _PID_CLOSE_PUTS[count] if count < 4 else _PID_CLOSE_PUTS[0], index,
            persid, size_put, index + 1, stride_put, index + 2, _FLAG[flag], od,
            _EMPTY_REDUCE_PUT, index + 3, _TUPLE_PUT, index + 4, _REDUCE_PUT, index + 5))
        if like is None and len(self.templates) < _INT_TUPLE_CACHE_SIZE:
            self.templates[id(size_)] = self.like(view, persid + size_put, stride_put, od)

    def like(self, view: ViewReduce, size_put: bytes, stride_put: bytes,
             od: bytes) -> tuple[Any, ...]:
        """The template of the views alike ``view``, just written (``_UNLIKE`` if none).

        A view is alike when its func, offset, size, stride, flag and the pid
        items but one are the very objects of ``view``'s, the one being a str
        met for the first time, at the same place in a pid of
        :data:`_LIKE_PID_ITEMS` items, and its tail an empty OrderedDict.
        Every part but that str is then written as for ``view`` (memo indices
        apart): the same objects give the same codes, as GETs never change and
        ints are not memoised.  The template holds these objects, so their ids
        stay theirs.
        """
        func, pid, offset, size, stride, flag, _ = view
        if type(pid) is not tuple or len(pid) != _LIKE_PID_ITEMS:
            return _UNLIKE
        codes: list[bytes] = []
        fixed: list[object] = []
        fresh = [i for i, item in enumerate(pid)
                 if type(item) is str and self.refs.get(id(item)) is None]
        for at, item in enumerate(pid):
            code = self.refs.get(id(item))
            if code is None and type(item) is int:
                code = encode_int(item)
            if code is not None:
                codes.append(code)
                fixed += (at, item)
            elif fresh != [at]:
                return _UNLIKE
        if len(fresh) != 1 or type(flag) is not bool:
            return _UNLIKE
        at = fresh[0]
        segments = (self.refs[id(func)] + _PID_OPEN[4] + b"".join(codes[:at]),
                    b"".join(codes[at:]) + _PID_CLOSE_PUTS[0], size_put, stride_put,
                    _FLAG[flag] + od + _EMPTY_REDUCE_PUT)
        return (size, stride, func, offset, flag, at, *fixed, segments, {})

    def view_layout(self, persid: bytes, size_put: bytes, stride_put: bytes,
                    od: bytes) -> struct.Struct:
        """The rest-of-view layout for these codes, cached for this dump."""
        lengths = (len(persid), len(size_put), len(stride_put), len(od))
        layout = _VIEW_LAYOUTS.get(lengths) or _view_layout(lengths)
        if len(self.layouts) < _INT_TUPLE_CACHE_SIZE:
            self.layouts[persid, size_put, stride_put] = layout
        return layout

    def write_pair(self, key: object, value: object, parts: list[bytes]) -> None:
        """A pair the generic way, after what ``parts`` gathered."""
        self.save_part(key, parts)
        self.write_value(key, value, parts)

    def write_value(self, key: object, value: object, parts: list[bytes]) -> None:
        """A value the generic way, after what ``parts`` gathered."""
        try:
            self.save_part(value, parts)
        except PtfileError as exc:
            add_note(exc, f"while pickling the value of key {brief(key, 80)}")
            raise

    def write_reduced(self, key: object, value: object, result: object,
                      parts: list[bytes]) -> None:
        """The reducer's ``result`` for ``value`` the generic way, after what ``parts`` gathered."""
        self.flush(parts)
        try:
            self.save_reduced(result, value)
        except PtfileError as exc:
            add_note(exc, f"while pickling the value of key {brief(key, 80)}")
            raise

    def shape_put(self, values: object) -> bytes:
        """The items, closing opcode and LONG_BINPUT of a non-empty all-int tuple (b"" else).

        Cached by identity for the first
        :data:`~ptfile.picklevm.views._INT_TUPLE_CACHE_SIZE` objects met, which
        ``keep`` then holds, so their ids stay theirs.
        """
        put = _int_tuple_put(values) if type(values) is tuple and values else None
        if len(self.shapes) < _INT_TUPLE_CACHE_SIZE:
            self.keep.append(values)
            self.shapes[id(values)] = put or b""
        return put or b""
