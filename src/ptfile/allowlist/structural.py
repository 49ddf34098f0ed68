"""Structural loading: any pickle as an inert tree, and the state dict of a whole-model pickle.

``ptfile.load(f, structural=True)`` unpickles a file whatever globals it
names, without importing or calling anything the file chooses.  Globals on the
allowlist (and the user's registry, :mod:`ptfile.allowlist.policy`) resolve as usual, so
tensors are real :class:`ptfile.Tensor` objects.  Every other global resolves to
a *stand-in class* made for this one load, which records its ``module`` and
``name``; what the stream does with it is recorded, never performed:

================  =============================================================
opcode            effect on a stand-in
================  =============================================================
``REDUCE``        ``cls(*args)``: a new :class:`StandIn` instance, ``how="call"``,
``INST``/``OBJ``  ``args`` recorded
``NEWOBJ``        ``cls.__new__(cls, *args)``: an instance, ``how="new"``
``NEWOBJ_EX``     the same with ``kwargs``
``BUILD``         ``state`` recorded (the last one wins; torch passes one)
``APPEND(S)``     ``listitems`` extended
``SETITEM(S)``    ``dictitems`` appended as ``(key, value)`` pairs
``ADDITEMS``      ``listitems`` extended
``REDUCE`` on an  a :class:`StandIn` of the same class with ``how="call-instance"``
instance          and ``func`` set to the called instance
================  =============================================================

Stand-in classes are fresh per load (the stream can only mutate objects of this
load) and their methods only store references: the C unpickler's calls
(``__new__``, ``__init__``, ``__setstate__``, ``extend``, ``append``,
``__setitem__``, ``add``, ``__call__``) end in plain attribute stores.  Nothing
defined by the file runs, ever.

A ``torch.save(model)`` file pickles each ``nn.Module`` as
``GLOBAL <class> EMPTY_TUPLE NEWOBJ <__dict__> BUILD``; the ``__dict__`` holds
``_parameters``, ``_buffers``, ``_non_persistent_buffers_set`` and
``_modules``.  :func:`state_dict` walks that tree the way
``nn.Module.state_dict`` does.  Legacy files give module classes the persistent
id ``('module', cls, source_file, source)``; the legacy readers resolve it to
``cls`` as torch does, which here is the stand-in class.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from ..errors import LimitExceededError, brief
from ..limits import Limits, active

if TYPE_CHECKING:  # the scanner's stand-ins need no tensor model (nor numpy)
    from ..model.tensor import Tensor

__all__ = [
    "StandIn",
    "StandInType",
    "is_module",
    "state_dict",
]

#: ``StandIn.state`` before any ``BUILD``.
NO_STATE: Final = type("NoState", (), {"__repr__": lambda self: "NO_STATE"})()


class StandInType(type):
    """Metaclass of stand-in classes: a readable ``repr`` naming the global."""

    module: str
    name: str

    def __repr__(cls) -> str:
        return f"<stand-in class {cls.module}.{cls.name}>"


class StandIn(metaclass=StandInType):
    """An inert instance of a global ptfile did not import: what the pickle said, recorded.

    Attributes
    ----------
    module, name : str
        The global, as the pickle names it (class attributes).
    how : str
        ``"new"`` (``NEWOBJ``), ``"call"`` (``REDUCE``/``INST``/``OBJ``) or
        ``"call-instance"`` (an instance called in turn; ``func`` is that instance).
    args : tuple
        Positional arguments.
    kwargs : dict
        Keyword arguments (``NEWOBJ_EX``).
    state : object
        The ``BUILD`` state, or ``NO_STATE``.
    listitems : list
        Items given by ``APPEND``/``APPENDS``/``ADDITEMS``.
    dictitems : list of (key, value)
        Pairs given by ``SETITEM``/``SETITEMS``.
    """

    __slots__ = ("args", "dictitems", "func", "how", "kwargs", "listitems", "state")
    module: str = "?"
    name: str = "?"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    how: str
    func: StandIn | None
    state: Any
    listitems: list[Any]
    dictitems: list[tuple[Any, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:  # noqa: PYI034 - any subclass
        self = object.__new__(cls)
        self.args, self.kwargs, self.how, self.func = args, kwargs, "new", None
        self.state, self.listitems, self.dictitems = NO_STATE, [], []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.how = "call"  # __init__ runs only when the class itself is called

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, item: Any) -> None:
        self.listitems.append(item)

    def extend(self, items: Any) -> None:
        self.listitems.extend(items)

    add = append

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dictitems.append((key, value))

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        called = type(self).__new__(type(self), *args, **kwargs)
        called.how, called.func = "call-instance", self
        return called

    def tree_items(self) -> list[tuple[Any, Any]]:
        """What a walk of the object tree names inside this stand-in
        (:mod:`ptfile.model.tree`): a module's ``state_dict()``; else its arguments by
        index, keywords by name, state (a dict's entries; both dicts of a ``(dict,
        slots)`` pair; other state as ``state``), list items by index, dict items by key.

        Examples
        --------
        >>> cls = make_stand_in("lightning.fabric.utilities.data", "AttributeDict")
        >>> d = cls.__new__(cls)
        >>> d["lr"] = 0.1
        >>> d.tree_items()
        [('lr', 0.1)]
        """
        if is_module(self):
            return list(state_dict(self).items())
        return [*enumerate(self.args), *self.kwargs.items(), *_state_items(self.state),
                *enumerate(self.listitems), *self.dictitems]

    def __repr__(self) -> str:
        state = "" if self.state is NO_STATE else ", state=..."
        return f"<stand-in {self.module}.{self.name} {self.how}{brief(self.args, 60)}{state}>"


def _state_items(state: Any) -> list[tuple[Any, Any]]:
    """A ``BUILD`` state's entries: a dict's (an object's ``__dict__``), both dicts of a
    ``(dict or None, slots dict)`` pair, else the state itself as ``state``."""
    if state is NO_STATE or state is None:
        return []
    if isinstance(state, dict):
        return list(state.items())
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) \
            and isinstance(state[0], (dict, type(None))):
        return [*(state[0] or {}).items(), *state[1].items()]
    return [("state", state)]


def make_stand_in(module: str, name: str) -> StandInType:
    """A fresh stand-in class for ``module.name`` (never the real one)."""
    namespace = {"__slots__": (), "module": module, "name": name, "__module__": __name__}
    return StandInType("StandIn", (StandIn,), namespace)


def is_module(obj: object) -> bool:
    """True for a stand-in whose state looks like an ``nn.Module``'s ``__dict__``.

    Examples
    --------
    >>> is_module({"_parameters": {}})
    False
    """
    return isinstance(obj, StandIn) and isinstance(obj.state, dict) \
        and "_parameters" in obj.state and "_modules" in obj.state


def _entries(state: dict[str, Any], key: str) -> list[tuple[Any, Any]]:
    table = state.get(key)
    return list(table.items()) if isinstance(table, dict) else []


def _module_tensors(module: StandIn, prefix: str, out: OrderedDict[str, Any],
                    seen: set[int], visits: list[int]) -> None:
    """``visits``: the modules visited so far and ``Limits.max_module_visits``."""
    from ..model.tensor import Parameter

    visits[0] += 1
    if visits[0] > visits[1]:
        raise LimitExceededError("max_module_visits", visits[1], visits[0],
                                 "module visits while collecting the state dict")
    state: dict[str, Any] = module.state
    for name, param in _entries(state, "_parameters"):
        if param is not None:
            out[prefix + str(name)] = param.data if isinstance(param, Parameter) else param
    skipped = state.get("_non_persistent_buffers_set")
    for name, buffer in _entries(state, "_buffers"):
        if buffer is not None and not (isinstance(skipped, set) and name in skipped):
            out[prefix + str(name)] = buffer
    for name, child in _entries(state, "_modules"):
        if is_module(child) and id(child) not in seen:  # a cycle is damage, not a model
            _module_tensors(child, f"{prefix}{name}.", out, seen | {id(child)}, visits)


def state_dict(obj: object, prefix: str = "", *,
               limits: Limits | None = None) -> OrderedDict[str, Tensor | Any]:
    """The ``state_dict()`` of a structurally loaded ``nn.Module``, without torch.

    Parameters (``.data``, as ``state_dict`` detaches them) and persistent
    buffers, in torch's order: a module's own parameters, then its buffers,
    then each submodule's, depth first.  A submodule reached by two names is
    listed under both, as ``nn.Module.state_dict`` lists it.

    Parameters
    ----------
    obj : StandIn
        What ``ptfile.load(f, structural=True)`` returned for ``torch.save(model)``.
    prefix : str
        Prepended to every key.
    limits : Limits, optional
        ``max_module_visits`` bounds the walk (default: the active limits,
        :func:`ptfile.limits.active`).

    Returns
    -------
    OrderedDict
        Name → :class:`ptfile.Tensor`.

    Raises
    ------
    TypeError
        ``obj`` is not a structurally loaded module.
    LimitExceededError
        Shared submodules would make the walk visit more than ``max_module_visits``
        modules.

    Examples
    --------
    >>> state_dict({})
    Traceback (most recent call last):
    ...
    TypeError: expected a structurally loaded nn.Module (ptfile.load(f, structural=True)), got dict
    """
    if not is_module(obj):
        raise TypeError("expected a structurally loaded nn.Module (ptfile.load(f, "
                        f"structural=True)), got {type(obj).__name__}")
    out: OrderedDict[str, Any] = OrderedDict()
    most = (limits or active()).max_module_visits
    _module_tensors(obj, prefix, out, {id(obj)}, [0, most])  # type: ignore[arg-type]
    return out
