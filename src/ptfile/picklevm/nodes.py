r"""The node types a pickle graph uses for what the C pickler would reduce.

:mod:`ptfile.picklevm.pickler` writes a graph of plain Python objects plus
these nodes, which stand for the results of the C pickler's hooks:

* :class:`Global`: a module-level name (``save_global``), interned by
  :func:`global_` so that one ``(module, name)`` is memoised once;
* :class:`Reduce`: a ``__reduce__`` result (``save_reduce``);
* :class:`PersistentId`: a ``persistent_id`` result (``BINPERSID``);
* :class:`ViewReduce`: one common shape of :class:`Reduce`, a call whose first
  argument is a persistent id followed by an offset, two int tuples, a flag
  and a trailing object (how a strided view of a persistently stored buffer
  reduces).  It means exactly what the equivalent :class:`Reduce` means; the
  pickler writes it in one straight-line step instead of one handler per
  object, which is what makes 10^5-10^6 such views cheap to write.

The nodes know nothing about torch: the caller builds them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from ..errors import SaveError

__all__ = [
    "Global",
    "PersistentId",
    "PersistentIdHook",
    "Reduce",
    "Reducer",
    "ViewReduce",
    "global_",
]


@dataclass(frozen=True, slots=True)
class Global:
    """A module-level name, written as ``GLOBAL "c<module>\\n<name>\\n"``.

    Build nodes with :func:`global_`, which interns them: the memo is keyed by
    identity, and the C pickler memoises one class or function object once.

    Parameters
    ----------
    module, name : str
        Written verbatim; neither may be empty or contain a newline.
    module_owner : str, optional
        Which str object names the module, for protocols 4 and 5: there the
        module and the name are pickled as strs (``STACK_GLOBAL``), memoised by
        identity, so two globals of one module share the module's str when the
        C pickler finds the same object for both.  ``""`` (the default) stands
        for the module's own ``__name__``, which its functions and Python
        classes carry; any other value for a ``__module__`` str of its own that
        every global with that owner shares (torch's dtypes have one).

    Raises
    ------
    SaveError
        If ``module`` or ``name`` is empty or contains a newline.
    """

    module: str
    name: str
    module_owner: str = ""

    def __post_init__(self) -> None:
        for part in (self.module, self.name):
            if not part or "\n" in part:
                raise SaveError(
                    f"cannot write global {self.module!r} {self.name!r}: "
                    "module and name must be non-empty and contain no newline"
                )


_INTERNED_GLOBALS: dict[tuple[str, str, str], Global] = {}


def global_(module: str, name: str, module_owner: str = "") -> Global:
    """Return the one :class:`Global` node for ``(module, name, module_owner)``.

    Parameters
    ----------
    module, name : str
        The global's module and qualified name, written verbatim.
    module_owner : str, optional
        As for :class:`Global`.

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
    key = (module, name, module_owner)
    node = _INTERNED_GLOBALS.get(key)
    if node is None:
        node = _INTERNED_GLOBALS.setdefault(key, Global(module, name, module_owner))
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


class ViewReduce(NamedTuple):
    """``func(<persistent id>, offset, size, stride, flag, tail)``, memoised by identity.

    Exactly :meth:`as_reduce`: the bytes are the same, memo included.  Like
    torch's ``Tensor.__reduce_ex__``, which builds them anew for every
    reduction, the persistent id tuple, ``size`` and ``stride`` (tuples) and an
    empty ``tail`` ``OrderedDict`` are written as fresh objects: never fetched
    from the memo, though each takes its memo index.  The pickler writes the
    plain parts (str, int and :class:`Global` pid items; an int offset; tuples
    of ints; a bool; an empty ``OrderedDict``) inline and any other part the
    generic way.  A NamedTuple, not a dataclass: it is built once per view, and
    a tuple is the cheapest object to build and to unpack.
    """

    func: Global
    pid: object
    offset: object
    size: object
    stride: object
    flag: object
    tail: object

    def as_reduce(self) -> Reduce:
        """The :class:`Reduce` this node stands for, with fresh copies as described above."""
        args = (
            PersistentId(_fresh(self.pid)),
            self.offset,
            _fresh(self.size),
            _fresh(self.stride),
            self.flag,
            _fresh(self.tail),
        )
        return Reduce(self.func, args)


def _fresh(part: object) -> object:
    """A new tuple of a tuple's items, a new empty OrderedDict for an empty one, else ``part``."""
    if type(part) is tuple:
        return (*part,)
    if type(part) is OrderedDict and not part and not part.__dict__:
        return OrderedDict()
    return part


Reducer: TypeAlias = Callable[[object], "Reduce | ViewReduce | PersistentId | Global | None"]
PersistentIdHook: TypeAlias = Callable[[object], object]
