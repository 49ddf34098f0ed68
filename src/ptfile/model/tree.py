"""Tensors of a loaded object tree by state-dict name (:func:`flatten`), and the other
values beside them (:func:`values`).

A checkpoint holds a state dict (names to tensors) or any tree of dicts, lists
and tuples around its tensors (a training checkpoint: ``{"model": {...},
"optim": {...}}``).  Every tool that names tensors (``open``, ``convert``,
``inspect``) names them as :func:`flatten` does: dict keys and list or tuple
indices joined with ``.``, as ``state_dict()`` names a module's parameters.
What is neither a tensor nor a dict, list or tuple (``step``, ``lr``, a string,
None) is a value, named the same way by :func:`values`: what ``diff`` compares
and ``convert`` reports beside the tensors.  Both, and ``convert``'s own sorting of the
values (:func:`ptfile.export.values.split_values`), are one :func:`walk`.

Objects of a structural load
----------------------------
A pickle read with ``structural=True`` holds *stand-ins* for the classes ptfile did not
import (:mod:`ptfile.allowlist.structural`), and they may hold tensors: Lightning keeps
``hyper_parameters``, an ``AttributeDict`` (a ``dict`` subclass), holding a whole
``nn.Module``.  :func:`flatten` names a tensor reached only through a stand-in too (the
walk asks the object for its items: a ``tree_items()`` method, :data:`ITEMS_METHOD`, so this
layer needs no knowledge of the layer above); the name continues the stand-in's own:

==========================  =============================================================
the stand-in                its items, named after the stand-in's name and ``.``
==========================  =============================================================
a module (``nn.Module``:    its ``state_dict()`` names: its parameters, persistent buffers,
``_parameters`` and         then each submodule's (``hyper_parameters.net.bn.running_mean``);
``_modules`` in its state)  a non-persistent buffer is not named, as ``state_dict()`` skips it
any other                   its call's arguments by index (``cfg.0``) and keywords by name,
                            its state's entries by name when a dict (its attributes,
                            ``__dict__``; both dicts of a ``(dict, slots)`` pair), other state
                            as ``state``, its list items by index, its dict items by key
                            (``hyper_parameters.net``)
==========================  =============================================================

A name reached twice keeps its first tensor, as everywhere in :func:`flatten`.
:func:`values` does not walk into stand-ins (a stand-in is a value of its own), nor
does ``convert``, which lists a stand-in as dropped after converting the tensors in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..errors import FormatError, brief
from .tensor import Parameter, Tensor

__all__ = ["ITEMS_METHOD", "flatten", "values", "walk"]

#: The method of an object of a layer above (a structural stand-in) that gives the items a
#: walk with ``into_objects`` names in it: ``(key, value)`` pairs, or None for none.
ITEMS_METHOD: Final = "tree_items"


def flatten(obj: object, *, max_depth: int = 1000) -> dict[str, Tensor]:
    """Tensors of an object tree by dotted state-dict name (``model.layers.0.weight``).

    Dict keys and list/tuple indices are joined with ``.``; a bare tensor is
    named ``""``.  A container reached twice is listed under its first path.  Tensors
    inside a structural stand-in are named too (the module docstring).

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> import numpy as np, ptfile
    >>> t = ptfile.Tensor(ptfile.Storage(memoryview(np.zeros(2, "f4")), ptfile.DTYPES["float32"]),
    ...                   0, (2,), (1,))
    >>> list(flatten({"a": {"b": t}, "c": [t]}))
    ['a.b', 'c.0']
    """
    if isinstance(obj, dict) and _is_flat(obj):
        return dict(obj)  # a state dict: the keys are the names
    out: dict[str, Tensor] = {}

    def visit(name: str, node: object, _depth: int) -> bool:
        if isinstance(node, Tensor):
            out.setdefault(name, node)
            return False
        return True

    walk(obj, visit, max_depth=max_depth, into_objects=True)
    return out


def values(obj: object, *, max_depth: int = 1000) -> dict[str, object]:
    """The leaves of an object tree that are not tensors, by the dotted names of
    :func:`flatten` (a training checkpoint's ``epoch``, ``optim.param_groups.0.lr``).

    An empty dict, list or tuple is a value of its own (it holds no leaf to name).

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> values({"model": {}, "epoch": 3, "optim": {"groups": [{"lr": 0.1, "nesterov": None}]}})
    {'model': {}, 'epoch': 3, 'optim.groups.0.lr': 0.1, 'optim.groups.0.nesterov': None}
    """
    if isinstance(obj, dict) and _is_flat(obj):
        return {}
    out: dict[str, object] = {}

    def visit(name: str, node: object, _depth: int) -> bool:
        if isinstance(node, Tensor):
            return False
        if not _children(node):  # not a container, or an empty one: a value
            out.setdefault(name, node)
            return False
        return True

    walk(obj, visit, max_depth=max_depth)
    return out


def walk(obj: object, visit: Callable[[str, object, int], bool], *,
         max_depth: int = 1000, into_objects: bool = False) -> None:
    """Call ``visit(name, node, depth)`` for each node of an object tree, depth first in
    order, and walk into the children of a dict, list or tuple when it returns True (with
    ``into_objects``, of an object with a :data:`ITEMS_METHOD` too: a structural stand-in).

    Names are :func:`flatten`'s (dict keys and indices joined with ``.``; the root is
    ``""``).  A container reached twice is visited each time but walked into only under
    its first path, so a cycle ends.

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> seen = []
    >>> walk({"a": [1, 2], "b": 3}, lambda name, node, depth: seen.append(name) or True)
    >>> seen
    ['', 'a', 'a.0', 'a.1', 'b']
    """
    seen: set[int] = set()
    stack: list[tuple[str, object, int]] = [("", obj, 0)]
    while stack:
        name, node, depth = stack.pop()
        if not visit(name, node, depth):
            continue
        items = _children(node) if not into_objects else _object_children(node)
        if items is None or id(node) in seen:
            continue
        if depth >= max_depth:
            raise FormatError(f"object tree deeper than {max_depth} levels at {brief(name, 80)}")
        seen.add(id(node))
        prefix = f"{name}." if name else ""
        stack.extend((f"{prefix}{k}", v, depth + 1) for k, v in reversed(items))


_LEAVES: Final = frozenset({Tensor, Parameter})


def _is_flat(obj: dict[Any, Any]) -> bool:
    """Str keys and Tensor/Parameter values (a dict flatten returns as is)."""
    return bool(obj) and _LEAVES.issuperset(map(type, obj.values())) \
        and set(map(type, obj)) == {str}


def _children(node: object) -> list[tuple[object, object]] | None:
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, (list, tuple)):
        return list(enumerate(node))
    return None


def _object_children(node: object) -> list[tuple[object, object]] | None:
    """A container's children, or those an object of a layer above gives (a stand-in)."""
    items = _children(node)
    if items is not None:
        return items
    method = getattr(type(node), ITEMS_METHOD, None)
    return None if method is None else method(node)
