"""Values finished after the load: placeholders a callback hands out, swapped for their values.

``BUILD`` works in place.  For ``REDUCE`` then ``BUILD`` (numpy's
``_reconstruct(ndarray, (0,), b'b')`` and its ``(version, shape, dtype,
is_fortran, rawdata)`` state), the C unpickler pushes what the call returned and
then calls *that object's* ``__setstate__``; the containers built later hold that
very object.  A value that can only be made from its state, and whose own
``__setstate__`` must not run on the stream's data (``ndarray.__setstate__``),
cannot be handed out at the call.  So the callback hands out a placeholder whose
``__setstate__`` checks the state and makes the value, and registers it with
:func:`defer`.  :func:`~ptfile.picklevm.unpickle` runs the C unpickler inside
:func:`collecting`; when it returns and a placeholder was registered, it calls
:func:`substitute`, which puts each placeholder's :meth:`Deferred.finish` wherever
the placeholder is:

* items of lists, dicts (keys and values), sets and frozensets; tuples (rebuilt,
  as they are immutable, and so in turn replaced where they are);
* the instance ``__dict__`` and ``__slots__`` values of other objects (a
  structurally loaded stand-in, a registered class); of the types a layer above
  declares (:func:`enter_only`: ptfile's tensors and storages), only the named ones.

Shared references stay shared (one placeholder, one value), lists, dicts and sets
keep their identity, and the walk is iterative (a pickle can nest a value 10^5
deep).  Functions, classes and modules are not entered.  A tuple reached again
through a cycle while it is being rebuilt keeps the old tuple there.  Nothing runs
when no placeholder was registered: a plain load pays one context-variable lookup.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Final, Protocol

__all__ = ["Deferred", "collecting", "defer", "enter_only", "substitute"]


class Deferred(Protocol):
    """A placeholder: :meth:`finish` is the value that replaces it once the pickle is read."""

    def finish(self) -> object:
        """The value (raise a :class:`~ptfile.errors.PtfileError` when it cannot be made)."""


_PENDING: ContextVar[list[Deferred] | None] = ContextVar("ptfile_deferred", default=None)

#: Values with nothing inside to replace.
_ATOMIC: Final[frozenset[type]] = frozenset({str, bytes, bytearray, int, float, complex, bool, type(None),
                            memoryview, range, slice, type(Ellipsis)})
#: Objects the walk never enters: code and namespaces, not values.
_OPAQUE: Final = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                  types.ModuleType, functools.partial)
#: Types whose instances the walk enters through the named attributes only (none: not
#: at all), beside :data:`_ATOMIC` (:func:`enter_only`).
_ENTER_ONLY: Final[dict[type, tuple[str, ...]]] = dict.fromkeys(_ATOMIC, ())
#: The slot names of each type met, computed once per type.
_SLOTS: Final[dict[type, tuple[str, ...]]] = {}


def enter_only(cls: type, *attributes: str) -> None:
    """Enter instances of exactly ``cls`` through ``attributes`` only (when set and not
    empty): a layer above declares where the many objects of a big checkpoint can hold a
    placeholder (a tensor: its hooks, metadata and Python state; a storage: nowhere), so
    a load with one numpy value does not walk the insides of 10^5 tensors."""
    _ENTER_ONLY[cls] = attributes


@contextlib.contextmanager
def collecting() -> Iterator[list[Deferred]]:
    """Collect the placeholders :func:`defer` registers inside the block (one unpickle run)."""
    pending: list[Deferred] = []
    token = _PENDING.set(pending)
    try:
        yield pending
    finally:
        _PENDING.reset(token)


def defer(placeholder: Deferred) -> None:
    """Register ``placeholder`` with the unpickle run in progress (outside one: nothing)."""
    pending = _PENDING.get()
    if pending is not None:
        pending.append(placeholder)


def _slots(cls: type) -> tuple[str, ...]:
    found = _SLOTS.get(cls)
    if found is None:
        names: list[str] = []
        for klass in cls.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            names.extend((slots,) if isinstance(slots, str) else slots)
        found = _SLOTS[cls] = tuple(n for n in names if n not in ("__dict__", "__weakref__"))
    return found


def _children(obj: object) -> list[Any] | None:
    """What ``obj`` holds, or None when it holds nothing to replace."""
    cls = type(obj)
    only = _ENTER_ONLY.get(cls)
    if only is not None:
        return [v for v in (getattr(obj, a, None) for a in only) if v] or None
    if isinstance(obj, _OPAQUE):
        return None
    if isinstance(obj, (list, tuple)) and (cls is list or cls is tuple):
        return list(obj) or None  # no __dict__, no slots: done
    if isinstance(obj, dict):
        if cls is dict:
            return [*obj.keys(), *obj.values()] or None
        out = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out = list(obj)
    else:
        out = []
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict):
        out.extend(own.values())
    for name in _slots(cls):
        with contextlib.suppress(AttributeError):
            out.append(getattr(obj, name))
    return out or None


def _rebuilt(obj: Any, new: dict[int, Any]) -> Any:
    """``obj`` with each child replaced by ``new[id(child)]``: in place, or a new tuple."""
    def swap(child: Any) -> Any:
        return new.get(id(child), child)

    if isinstance(obj, tuple):
        items = [swap(c) for c in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        if type(obj) is tuple:
            return tuple(items)
        make = getattr(type(obj), "_make", None)  # a named tuple
        return make(items) if make is not None else type(obj)(items)
    if isinstance(obj, frozenset):
        items = [swap(c) for c in obj]
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else frozenset(items)
    if isinstance(obj, list):
        for i, child in enumerate(obj):
            if swap(child) is not child:
                obj[i] = swap(child)
    elif isinstance(obj, set):
        items = [swap(c) for c in obj]
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            obj.clear()
            obj.update(items)
    elif isinstance(obj, dict):
        _rebuild_dict(obj, swap)
    if type(obj) is list or type(obj) is dict:
        return obj
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict):
        _rebuild_dict(own, swap)
    for name in _slots(type(obj)):
        child = getattr(obj, name, swap)
        if child is not swap and swap(child) is not child:
            object.__setattr__(obj, name, swap(child))
    return obj


def _rebuild_dict(table: dict[Any, Any], swap: Any) -> None:
    if any(swap(k) is not k for k in table):  # a key changes: same order, new keys
        items = [(swap(k), swap(v)) for k, v in table.items()]
        table.clear()
        table.update(items)
        return
    for key, value in table.items():
        if swap(value) is not value:
            table[key] = swap(value)


def substitute(root: Any, pending: list[Deferred]) -> Any:
    """``root`` with every placeholder in ``pending`` replaced by its value (see the module
    docstring for where); the placeholders are finished in registration order.

    Raises
    ------
    PtfileError
        Whatever a placeholder's :meth:`Deferred.finish` raises.

    Examples
    --------
    >>> class Twice:
    ...     def __init__(self, n): self.n = n
    ...     def finish(self): return 2 * self.n
    >>> p = Twice(21)
    >>> substitute({"a": (p, [p])}, [p])
    {'a': (42, [42])}
    """
    new: dict[int, Any] = {id(p): p.finish() for p in pending}
    keep: list[Any] = []  # every object met stays alive, so no id is reused during the walk
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        obj, expanded = stack.pop()
        key = id(obj)
        keep.append(obj)
        if expanded:
            new[key] = _rebuilt(obj, new)
            active.discard(key)
            continue
        if key in new or key in active:
            continue
        children = _children(obj)
        if children is None:
            new[key] = obj
            continue
        active.add(key)
        stack.append((obj, True))
        stack.extend((c, False) for c in children if id(c) not in new and id(c) not in active)
    return new.get(id(root), root)
