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
A pickle MUST start with ``PROTO <protocol>`` and end with ``STOP``.  Protocols 2
(torch's default) to 5 are supported; the rules below are those of 2 and 3, and
:mod:`~ptfile.picklevm.framing` says how 4 and 5 differ (MEMOIZE, SHORT_BINUNICODE,
STACK_GLOBAL, their set and bytearray opcodes, 64 KiB frames).  Each object is
saved as follows, in this order (C ``save``):

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
     :data:`~ptfile.picklevm.reductions.BUILTIN_REDUCTIONS`).  Below protocol 3
     the module ``builtins`` is written ``__builtin__`` (the C pickler's
     ``fix_imports``).

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

from collections.abc import Collection
from typing import Final

from ..errors import SaveError
from ._codes import encode_int
from .emitter import BATCH_SIZE, Emitter
from .framing import FramedEmitter
from .nodes import (
    Global,
    PersistentId,
    PersistentIdHook,
    Reduce,
    Reducer,
    ViewReduce,
    global_,
)

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

#: The emitter of each protocol this writer reproduces.  torch.save's default is 2.
EMITTERS: Final[dict[int, type[Emitter]]] = {2: Emitter, 3: Emitter, 4: FramedEmitter,
                                             5: FramedEmitter}
SUPPORTED_PROTOCOLS: Final = frozenset(EMITTERS)


class Pickler:
    """Writes pickles identical to CPython's C pickler, without importing globals.

    Parameters
    ----------
    protocol : int, optional
        2 (torch.save's default), 3, 4 or 5.
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
        return EMITTERS[self.protocol](
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
    >>> from collections import OrderedDict
    >>> view = ViewReduce(global_("m", "f"), ("k", 2), 0, (2,), (1,), False, OrderedDict())
    >>> dumps(view) == dumps(view.as_reduce())
    True
    """
    return Pickler(
        protocol, reducer=reducer, persistent_id=persistent_id, persistent_types=persistent_types
    ).dump(obj)
