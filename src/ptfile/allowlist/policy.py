"""Which globals a pickle may name: the safe-globals registry and the allowlist lookups.

A pickle names globals (``GLOBAL``, ``STACK_GLOBAL``, ``INST``) by ``module``
and ``name`` strings.  ptfile never imports anything by name: every name is
looked up in a table, and what the table holds is what the stream gets.

This module holds the lookups (:func:`find_allowed`, :func:`find_strict_class`), the
registry and the choice between the two policies a load may ask for; the ``find_class``
policies themselves are made in one home, :mod:`ptfile.formats.policies`, and asked for
by name (:class:`ptfile.formats.options.Policy`).

The two policies of a load
--------------------------
``strict`` (the default of :func:`ptfile.load`)
    torch 2.13's ``weights_only=True`` allowlist (:data:`ptfile.allowlist.rebuild.SAFE_GLOBALS`),
    then the user's registry.  Modules ``sys``, ``os``, ``posix`` and ``nt``
    are refused even when registered, as torch refuses them.  Anything else
    raises :class:`~ptfile.errors.UnsafeGlobalError`, whose message says how to
    allow the name or how to load the file structurally.
``structural`` (``ptfile.load(f, structural=True)``)
    The same lookups, but an unknown name becomes an inert stand-in class
    (:mod:`ptfile.allowlist.structural`) instead of an error.  Nothing from the file is
    ever called except ptfile's own rebuild functions and the user's entries.

Choosing the policy: ``weights_only`` and torch's environment variables
------------------------------------------------------------------------
ptfile never executes a pickle, so ``weights_only=False`` cannot mean what it
means in torch (import and run whatever the file names).  It means the nearest
thing that runs nothing: the ``structural`` policy.  :func:`loads_structurally`
decides, at each load, from the arguments and from the two variables torch reads
(set when their value is ``1``, ``y``, ``yes`` or ``true``, in any case):

=====================================  ==========================================
``load(f)`` / ``weights_only=True``    strict (``structural=True``: structural)
``weights_only=False``                 structural: unknown globals become stand-ins
``TORCH_FORCE_WEIGHTS_ONLY_LOAD``      strict, whatever ``weights_only`` and
                                       ``structural`` say (torch: forces
                                       ``weights_only=True`` even when passed False)
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``   structural, with a :class:`PtfileWarning`,
                                       but only when ``weights_only`` was not
                                       passed (torch: ``weights_only=False`` then);
                                       it never makes ptfile execute anything
both set                               :class:`~ptfile.errors.PtfileError` (torch
                                       raises too)
=====================================  ==========================================

Guarding what the stream receives
---------------------------------
``BUILD`` works on *any* object on the stack, including the very objects
``find_class`` returned: it calls their ``__setstate__`` or sets attributes
(``__defaults__`` of a function).  The allowlist's objects are shared by every
load in the process, so a stream that BUILDs on ``torch.FloatStorage`` or on
``collections.OrderedDict`` would change what every later load reads.  So
:func:`find_allowed` never hands out the table's objects as they are: functions
are wrapped in a slotted :class:`CallOnly` (call, compare and hash like the
function; ``__setstate__`` raises), and the table's data objects (dtypes,
storage and tensor types, qschemes) get a ``__setstate__`` that refuses to
touch them (fresh copies, as ``pickle``/``copy`` make, are unaffected).

The registry
------------
Torch's API, keyed the way torch keys it (``"module.qualname"``):
:func:`add_safe_globals`, :func:`get_safe_globals`, :func:`clear_safe_globals`
and the :func:`safe_globals` context manager.  An entry maps the name a pickle
uses to an object the *user* trusts; a bare object is keyed by its own
``__module__`` and ``__qualname__``.  The stream can mutate what it gets
(``BUILD`` sets attributes, ``APPENDS`` calls ``extend``; see
:mod:`ptfile.picklevm.unpickler`), so register callables and classes whose
instances are fresh per call, as with torch.

Numpy values
------------
:data:`NUMPY_GLOBALS` is a ready-made set of entries for the numpy names training
checkpoints hold (RNG states, numpy hyperparameters): inert rebuilders that
check every argument and never run numpy's pickle code (:mod:`ptfile.allowlist.numpy_globals`).
``with safe_globals(NUMPY_GLOBALS): load(f)`` returns what ``torch.load`` returns
once numpy's names are allowlisted; a refusal of one of these names says so.

A DCP checkpoint's non-tensor items are read with them by default
(:func:`reads_numpy_values`): torch's DCP loader unpickles those items with
``torch.load(weights_only=False)``, so ``np.random.get_state()`` saved with
``torch.distributed.checkpoint.save`` loads back, as numpy values, inertly.  Tensor items
are read strictly (torch: ``weights_only=True``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias, TypeVar

from ..errors import PtfileError, PtfileWarning, UnsafeGlobalError
from .numpy_globals import NUMPY_REBUILDERS
from .rebuild import SAFE_GLOBALS, lookup

__all__ = [
    "BLOCKED_MODULES",
    "FORCE_NO_WEIGHTS_ONLY",
    "FORCE_WEIGHTS_ONLY",
    "NUMPY_GLOBALS",
    "SafeGlobals",
    "add_safe_globals",
    "clear_safe_globals",
    "find_strict_class",
    "get_safe_globals",
    "loads_structurally",
    "reads_numpy_values",
    "safe_globals",
    "unsafe_global_message",
]

#: Modules refused whatever the registry says (torch's ``_blocklisted_modules``).
BLOCKED_MODULES: Final = frozenset({"sys", "os", "posix", "nt"})

#: What :func:`add_safe_globals` takes: a mapping from ``"module.qualname"`` to an
#: object, or an iterable of objects and ``(object, "module.qualname")`` pairs.
SafeGlobals: TypeAlias = "Mapping[str, object] | Iterable[object]"

_LOCK: Final = threading.Lock()
_REGISTRY: dict[str, object] = {}


def _entries(globals_: SafeGlobals) -> dict[str, object]:
    """Normalise the accepted forms to ``{"module.qualname": object}``."""
    if isinstance(globals_, Mapping):
        items = list(globals_.items())
    else:
        items = []
        for entry in globals_:
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
                items.append((entry[1], entry[0]))
            else:
                items.append((_own_name(entry), entry))
    for name, _ in items:
        if not isinstance(name, str) or "." not in name.strip("."):
            raise ValueError(f"safe global names are 'module.qualname' strings, got {name!r}")
    return dict(items)


def _own_name(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"{obj!r} has no __module__/__qualname__: pass (obj, 'module.qualname')")
    return f"{module}.{qualname}"


def add_safe_globals(globals_: SafeGlobals) -> None:
    """Allow pickles to name more globals, each mapped to an object you trust.

    Parameters
    ----------
    globals_ : mapping or iterable
        ``{"module.qualname": obj}``, or a list of objects (keyed by their own
        ``__module__`` and ``__qualname__``) and ``(obj, "module.qualname")``
        pairs, as ``torch.serialization.add_safe_globals`` takes them.

    Raises
    ------
    ValueError
        A name is not of the form ``"module.qualname"``.
    TypeError
        A bare object has no ``__module__``/``__qualname__``.

    Examples
    --------
    >>> import ptfile
    >>> ptfile.add_safe_globals({"mylib.Config": dict})
    >>> "mylib.Config" in ptfile.get_safe_globals()
    True
    >>> ptfile.clear_safe_globals()
    """
    entries = _entries(globals_)
    with _LOCK:
        _REGISTRY.update(entries)


def get_safe_globals() -> dict[str, object]:
    """A copy of the user's registry, ``{"module.qualname": object}``.

    Examples
    --------
    >>> import ptfile
    >>> ptfile.get_safe_globals()
    {}
    """
    with _LOCK:
        return dict(_REGISTRY)


def clear_safe_globals() -> None:
    """Forget every user entry (torch's default allowlist is unaffected).

    Examples
    --------
    >>> import ptfile
    >>> ptfile.clear_safe_globals()
    """
    with _LOCK:
        _REGISTRY.clear()


@contextlib.contextmanager
def safe_globals(globals_: SafeGlobals) -> Iterator[None]:
    """Add entries for the duration of a ``with`` block, then restore the registry.

    Raises
    ------
    ValueError, TypeError
        As :func:`add_safe_globals`.

    Examples
    --------
    >>> import ptfile
    >>> with ptfile.safe_globals({"mylib.Config": dict}):
    ...     sorted(ptfile.get_safe_globals())
    ['mylib.Config']
    >>> ptfile.get_safe_globals()
    {}
    """
    entries = _entries(globals_)
    with _LOCK:
        saved = dict(_REGISTRY)
        _REGISTRY.update(entries)
    try:
        yield
    finally:
        with _LOCK:
            _REGISTRY.clear()
            _REGISTRY.update(saved)


_C = TypeVar("_C", bound="CallOnly")


class CallOnly(functools.partial):  # type: ignore[type-arg]
    """An allowlisted function as the stream sees it: callable, not mutable.

    A :class:`functools.partial` with no bound arguments, so a call costs no
    Python frame of its own (a wrapper's ``__call__`` cost ~0.1 µs on each of a
    big state dict's ~10^5 tensors); its ``__setstate__`` refuses ``BUILD``.
    Equal to (and hashing like) the function, so table lookups keyed by the
    function still find it.

    Examples
    --------
    >>> wrapped = CallOnly(len)
    >>> wrapped([1, 2]), wrapped == len
    (2, True)
    """

    __slots__ = ()

    def __new__(cls: type[_C], function: Callable[..., Any]) -> _C:  # noqa: PYI019 (3.10: no Self)
        return super().__new__(cls, function)

    @property
    def _function(self) -> Callable[..., Any]:
        return self.func

    def __eq__(self, other: object) -> bool:
        return bool(self.func == (other.func if isinstance(other, CallOnly) else other))

    def __hash__(self) -> int:
        return hash(self.func)

    def __setstate__(self, state: object) -> None:
        name = getattr(self.func, "__name__", "?")
        raise UnsafeGlobalError(f"the pickle BUILDs on the global {name}: allowlisted globals "
                                "are read-only", module="", name=name)

    def __repr__(self) -> str:
        return repr(self.func)


_WRAPPED: Final[dict[int, CallOnly]] = {}
_PROTECTED: Final[set[int]] = set()


def _refusing_setstate(original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def refuse(self: Any, state: Any) -> None:
        if id(self) in _PROTECTED:
            raise UnsafeGlobalError(f"the pickle BUILDs on the global {self!r}: allowlisted "
                                    "globals are read-only", module="", name=repr(self))
        original(self, state)
    return refuse


def _guard_table() -> None:
    """Wrap the allowlist's functions; make its data objects refuse ``BUILD``."""
    patched: set[type] = set()
    for value in SAFE_GLOBALS.values():
        if callable(value) and not isinstance(value, type):
            _WRAPPED[id(value)] = CallOnly(value)
            continue
        _PROTECTED.add(id(value))
        cls = type(value)
        if cls not in patched and hasattr(cls, "__setstate__"):
            cls.__setstate__ = _refusing_setstate(cls.__setstate__)
            patched.add(cls)


_guard_table()

#: Numpy values as data (:mod:`ptfile.allowlist.numpy_globals`): numpy's ``_reconstruct``,
#: ``scalar``, ``ndarray`` and ``dtype`` (numpy 1.x and 2.x names) mapped to inert
#: rebuilders that check every argument and never run numpy's pickle code, for
#: ``with ptfile.safe_globals(ptfile.NUMPY_GLOBALS): ptfile.load(f)``.  Read-only; the
#: functions are wrapped against ``BUILD`` (:class:`CallOnly`).
NUMPY_GLOBALS: Final[Mapping[str, object]] = MappingProxyType({
    name: CallOnly(value) if callable(value) else value
    for name, value in NUMPY_REBUILDERS.items()
})


def _guarded(value: object) -> object:
    return _WRAPPED.get(id(value), value)


def _user_entry(module: str, name: str) -> object | None:
    with _LOCK:
        return _REGISTRY.get(f"{module}.{name}")


def find_allowed(module: str, name: str) -> Any:
    """The object for ``module.name`` from the allowlist or the registry, or None."""
    if module.split(".")[0] in BLOCKED_MODULES:
        return None
    found = lookup(module, name)
    return _guarded(found) if found is not None else _user_entry(module, name)


def unsafe_global_message(module: str, name: str) -> str:
    """The refusal text: what was refused, and the three ways forward."""
    qual = f"{module}.{name}"
    if qual in NUMPY_GLOBALS and module.partition(".")[0] == "numpy":
        return (f"unsupported global {qual}: numpy values are not among the globals torch.load("
                "weights_only=True) allows. ptfile reads numpy arrays, scalars, dtypes and "
                "RNG states as data, without numpy's pickle code: `with ptfile.safe_globals("
                "ptfile.NUMPY_GLOBALS): ptfile.load(f)` (or ptfile.add_safe_globals(ptfile."
                "NUMPY_GLOBALS)). To load the file without calling anything (unknown objects "
                "become inert stand-ins): ptfile.load(f, structural=True)")
    if module.split(".")[0] in BLOCKED_MODULES:
        return (f"the pickle names {qual}, in module {module.split('.')[0]!r}, which ptfile "
                "(like torch) never allows. To look at the file without running anything: "
                "ptfile.load(f, structural=True) or ptfile.scan(f)")
    return (
        f"unsupported global {qual}: it is not one of the globals torch.load(weights_only="
        "True) allows, so ptfile will not reconstruct it. If you trust it, map the name to "
        f"an object of yours: ptfile.add_safe_globals({{{qual!r}: obj}}) or `with "
        f"ptfile.safe_globals({{{qual!r}: obj}}): ...`. To load the file without calling "
        "anything (unknown objects become inert stand-ins): ptfile.load(f, structural=True). "
        "To list everything it references: ptfile.scan(f)"
    )


def find_strict_class(module: str, name: str) -> Any:
    """``find_class`` of the default policy: the allowlist, the registry, or an error.

    Raises
    ------
    UnsafeGlobalError
        ``module.name`` is neither allowlisted nor registered, or its module is blocked.
    """
    found = find_allowed(module, name)
    if found is None:
        raise UnsafeGlobalError(unsafe_global_message(module, name), module=module, name=name)
    return found


FindClass: TypeAlias = Callable[[str, str], Any]


#: torch's environment variables that override ``weights_only`` (module docstring).
FORCE_WEIGHTS_ONLY: Final = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WEIGHTS_ONLY: Final = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: The values torch counts as set (compared lower-cased).
_SET_VALUES: Final = frozenset({"1", "y", "yes", "true"})


def _env_set(name: str) -> bool:
    return os.environ.get(name, "0").lower() in _SET_VALUES


def loads_structurally(weights_only: bool | None, structural: bool) -> bool:
    """Whether a load uses the structural policy rather than the strict one.

    ``weights_only=None`` means the caller did not pass it; see the module
    docstring for the table, environment variables included.

    Raises
    ------
    PtfileError
        Both ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
        are set.

    Examples
    --------
    >>> loads_structurally(None, False), loads_structurally(False, False)
    (False, True)
    """
    force, force_no = _env_set(FORCE_WEIGHTS_ONLY), _env_set(FORCE_NO_WEIGHTS_ONLY)
    if force and force_no:
        raise PtfileError(f"only one of {FORCE_WEIGHTS_ONLY} and {FORCE_NO_WEIGHTS_ONLY} "
                          "may be set, but both are")
    if force:
        return False
    if weights_only is None:
        if not force_no:
            return structural
        warnings.warn(f"{FORCE_NO_WEIGHTS_ONLY} is set and weights_only was not passed: "
                      "loading structurally (globals outside the allowlist become inert "
                      "stand-ins; ptfile never executes a pickle)", PtfileWarning, stacklevel=3)
        return True
    return structural or not weights_only


def reads_numpy_values(weights_only: bool | None) -> bool:
    """Whether a DCP checkpoint's non-tensor items read numpy values as data
    (:data:`NUMPY_GLOBALS`): yes, as torch's DCP loader reads them (``torch.load(...,
    weights_only=False)``), unless ``weights_only=True`` is passed or
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` is set (which turns torch's load weights-only too).

    Examples
    --------
    >>> reads_numpy_values(None), reads_numpy_values(False), reads_numpy_values(True)
    (True, True, False)
    """
    return weights_only is not True and not _env_set(FORCE_WEIGHTS_ONLY)
