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

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from ..errors import FormatError, LimitExceededError, brief
from .tensor import Parameter, Tensor

__all__ = ["CONTAINERS", "DESCEND", "ITEMS_METHOD", "containers", "flatten", "is_state_dict",
           "outline", "rebuild", "values", "walk"]

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


# --------------------------------------------------------------------------- outlines

#: The containers an outline names (:func:`outline`), and the type each is rebuilt as.
CONTAINERS: Final[dict[str, type]] = {"dict": dict, "OrderedDict": OrderedDict,
                                      "list": list, "tuple": tuple}
_KIND_OF: Final = {kind: name for name, kind in CONTAINERS.items()}
#: Dict keys an outline holds as they are (JSON's scalars).
_KEY_TYPES: Final = frozenset({str, int, float, bool, type(None)})
#: What a ``leaf`` callback of :func:`outline` returns for a container to describe.
DESCEND: Final = object()


def outline(obj: object, leaf: Callable[[str, object], Any], *, max_depth: int = 1000,
            notes: list[tuple[str, str]] | None = None) -> Any:
    """A JSON-able description of an object tree's containers, the inverse of :func:`rebuild`.

    ``leaf(name, node)`` is asked first for every node (named as by :func:`flatten`):
    :data:`DESCEND` describes a dict, list or tuple as a container, None leaves the node
    out, anything else (JSON-able) stands for it.  A container is ``{kind: body}`` with
    ``kind`` a key of :data:`CONTAINERS`: a dict's body is ``[[key, node], ...]``, a list's
    or tuple's ``[node, ...]``.  A list item left out is ``null`` in its place (so the
    others keep their indices); a dict item left out has no pair.  What is not kept as it
    was goes into ``notes`` as ``(change, name)``: ``key-as-text`` (a key that is not a
    JSON scalar, stored as ``str(key)``), ``container-as-base`` (a subclass of dict, list
    or tuple, stored as its base), ``reached-twice`` (a container met again: left out).

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> outline({"a": [1, (2,)], "b": 3},
    ...         lambda name, node: DESCEND if isinstance(node, (dict, list, tuple)) else name)
    {'dict': [['a', {'list': ['a.0', {'tuple': ['a.1.0']}]}], ['b', 'b']]}
    """
    out: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[str, object, int, Callable[[Any], None]]] = [("", obj, 0, out.append)]
    while stack:
        name, node, depth, put = stack.pop()
        got = leaf(name, node)
        items = _children(node) if got is DESCEND else None
        if items is None or id(node) in seen:
            if items is not None and notes is not None:
                notes.append(("reached-twice", name))
            if got is not DESCEND and got is not None:
                put(got)
            elif isinstance(put, _ListItem):
                put(None)
            continue
        if depth >= max_depth:
            raise FormatError(f"object tree deeper than {max_depth} levels at {brief(name, 80)}")
        seen.add(id(node))
        kind = _KIND_OF.get(type(node)) or _base_kind(node)
        if type(node) not in _KIND_OF and notes is not None:
            notes.append(("container-as-base", name))
        body: list[Any] = []
        put({kind: body})
        prefix = f"{name}." if name else ""
        for key, child in reversed(items):
            if kind in ("dict", "OrderedDict"):
                if type(key) not in _KEY_TYPES:
                    if notes is not None:
                        notes.append(("key-as-text", f"{prefix}{key}"))
                    key = str(key)
                item: Callable[[Any], None] = _Pair(body, key)
            else:
                item = _ListItem(body)
            stack.append((f"{prefix}{key}", child, depth + 1, item))
    return out[0] if out else None


class _Pair:
    """Puts a described child into its dict's body as ``[key, node]``."""

    def __init__(self, body: list[Any], key: object) -> None:
        self.body, self.key = body, key

    def __call__(self, node: Any) -> None:
        self.body.append([self.key, node])


class _ListItem:
    """Puts a described child into its list's or tuple's body."""

    def __init__(self, body: list[Any]) -> None:
        self.body = body

    def __call__(self, node: Any) -> None:
        self.body.append(node)


def _base_kind(node: object) -> str:
    return "dict" if isinstance(node, dict) else "tuple" if isinstance(node, tuple) else "list"


def rebuild(described: Any, leaf: Callable[[Any], object], *, max_depth: int = 1000) -> object:
    """The object tree an :func:`outline` describes, each leaf given by ``leaf(node)``
    (``null`` is None: an item left out).

    Raises
    ------
    FormatError
        A container's body is not what its kind needs, a key is not a JSON scalar, or one
        dict holds a key twice; what ``leaf`` raises.
    LimitExceededError
        Containers nest deeper than ``max_depth``.

    Examples
    --------
    >>> rebuild({"dict": [["a", {"tuple": [1, None]}], [2, "x"]]}, lambda node: node * 2)
    {'a': (2, None), 2: 'xx'}
    """
    out: list[Any] = []
    # Entries: (node, depth, put), or (None, -1, finish) to make a tuple of its items.
    stack: list[tuple[Any, int, Callable[[Any], None]]] = [(described, 0, out.append)]
    while stack:
        node, depth, put = stack.pop()
        if depth < 0:
            put(None)
            continue
        kind = _container_kind(node)
        if kind is None:
            put(None if node is None else leaf(node))
            continue
        if depth >= max_depth:
            raise LimitExceededError("max_depth", max_depth, depth + 1, "a described object tree")
        body = node[kind]
        if not isinstance(body, list):
            raise FormatError(f"a described {kind} holds a JSON {type(body).__name__}, not a list")
        if kind in ("dict", "OrderedDict"):
            target: dict[Any, Any] = CONTAINERS[kind]()
            put(target)
            stack.extend((value, depth + 1, _setter(target, key))
                         for key, value in reversed(_pairs(body, kind)))
        else:
            items: list[Any] = []
            if kind == "list":
                put(items)
            else:  # a tuple is made once its items are: after them on the stack
                stack.append((None, -1, _tuple_of(items, put)))
            stack.extend((value, depth + 1, items.append) for value in reversed(body))
    return out[0]


def _container_kind(node: object) -> str | None:
    if isinstance(node, dict) and len(node) == 1:
        kind = next(iter(node))
        return kind if kind in CONTAINERS else None
    return None


def _pairs(body: list[Any], kind: str) -> list[tuple[object, Any]]:
    """A described dict's ``[key, node]`` pairs, checked: scalar keys, each once."""
    pairs, keys = [], set()
    for pair in body:
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) in _KEY_TYPES):
            raise FormatError(f"a described {kind} holds {brief(pair, 80)}, not a [key, node] "
                              "pair with a JSON scalar key")
        if pair[0] in keys:
            raise FormatError(f"a described {kind} holds the key {brief(pair[0], 80)} twice")
        keys.add(pair[0])
        pairs.append((pair[0], pair[1]))
    return pairs


def _tuple_of(items: list[Any], put: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda _: put(tuple(items))


def _setter(target: dict[Any, Any], key: object) -> Callable[[Any], None]:
    return lambda value: target.__setitem__(key, value)


def is_state_dict(obj: object) -> bool:
    """Whether ``obj`` is a flat state dict: a non-empty dict of str keys and tensors,
    whose keys :func:`flatten` gives as they are.

    Examples
    --------
    >>> is_state_dict({"step": 3}), is_state_dict({})
    (False, False)
    """
    return isinstance(obj, dict) and _is_flat(obj)


#: The kind :func:`containers` gives each container type (and its subclasses).
_BASE_KINDS: Final[dict[type, str]] = {dict: "dict", list: "list", tuple: "tuple"}


def containers(obj: object, *, max_depth: int = 1000) -> dict[str, str]:
    """The non-empty dicts, lists and tuples of an object tree by dotted name, with their
    kind: what ``diff`` compares of two trees' nesting.  Any dict is a ``dict`` (an
    ``OrderedDict`` state dict and the plain dict of its ``.safetensors`` conversion mean
    the same); empty ones are values (:func:`values`).

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> containers({"model": OrderedDict(w=1), "pair": (1, []), "step": 3})
    {'': 'dict', 'model': 'dict', 'pair': 'tuple'}
    """
    out: dict[str, str] = {}

    def visit(name: str, node: object, _depth: int) -> bool:
        kind = _BASE_KINDS.get(type(node)) or next(
            (k for t, k in _BASE_KINDS.items() if isinstance(node, t)), None)
        if kind is None or isinstance(node, Tensor) or not node:
            return False
        out.setdefault(name, kind)
        return True

    walk(obj, visit, max_depth=max_depth)
    return out
