"""What the C pickler reduces builtins to, and the checks it makes of a reduce's parts.

Rule 4 of :mod:`~ptfile.picklevm.pickler`: ``bytes`` (protocol 2), ``bytearray``,
``set``, ``frozenset``, ``complex``, ``OrderedDict`` and ``Counter`` are written
as the :class:`~ptfile.picklevm.nodes.Reduce` their ``__reduce__`` (or copyreg)
returns; :data:`BUILTIN_REDUCTIONS` is that table, by exact type, given the
protocol's spelling of ``builtins``.  :func:`check_args` and
:func:`checked_pairs` are the C pickler's checks of a reduce's arguments and
dict items (rule 5).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from ..errors import SaveError, brief
from .nodes import Reduce, global_

__all__ = ["BUILTIN_REDUCTIONS", "check_args", "checked_pairs"]

#: The C pickler's interned ``'latin1'`` (``_Py_ID(latin1)``); a literal here is
#: the same interned object, so a user's literal ``'latin1'`` shares its memo slot.
_LATIN1: Final = "latin1"




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


BUILTIN_REDUCTIONS: Final[dict[type, Callable[[Any, str], Reduce]]] = {
    bytes: _reduce_bytes,
    bytearray: _reduce_bytearray,
    set: _reduce_set,
    frozenset: _reduce_frozenset,
    complex: _reduce_complex,
    OrderedDict: _reduce_ordered_dict,
    Counter: _reduce_counter,
}


def check_args(args: object, newobj: bool) -> tuple[object, ...]:
    """Return the arguments of a Reduce whose ``args`` is not exactly a tuple."""
    if not isinstance(args, tuple):
        raise SaveError(f"Reduce.args must be a tuple, not {type(args).__name__}")
    # A tuple subclass is saved as itself (through the reducer), except under
    # NEWOBJ, where the C pickler saves a plain slice of it.
    return tuple(args) if newobj else args


def checked_pairs(pairs: Iterable[object]) -> Iterator[tuple[object, object]]:
    """Yield ``pairs``, each of which must be a 2-tuple (C ``batch_dict``)."""
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise SaveError(f"dict items must be 2-tuples, not {brief(pair, 60)}")
        yield pair
