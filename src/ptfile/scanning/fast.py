"""The scanner's fast path: CPython's own unpickler, fed nothing but inert stand-ins.

The symbolic walk of :mod:`ptfile.picklevm.symbolic` costs a few microseconds
per opcode (~10 s for a 100,000-tensor state dict).  Most files are plain
state dicts, so :func:`fast_names` first asks CPython itself which globals the
stream resolves: it unpickles (after the same pre-check as ``load``) with a
``find_class`` that returns a fresh stand-in class (:mod:`ptfile.allowlist.structural`)
for *every* name, allowlisted or not, and a ``persistent_load`` that returns
one too.  Nothing but stand-in methods can run, and the names are exactly the
ones CPython's unpickler would import (memo, stack and ``STACK_GLOBAL`` as
CPython sees them).

The fast path only *clears* streams.  It gives up (returns None), and the
scanner does the precise symbolic walk, whenever anything is off: an error of
any kind (EXT codes, ``BUILD`` on a global, a non-string ``STACK_GLOBAL``
operand, a hash flood, damage), a name that is not allowed, ``_codecs.encode``
with a codec outside the standard set, a text or byte string that may hold a
pickle or a ZIP (raw, base64 or hex: :func:`.nested.may_hold_payload`), or tuples nested deeper than ``Limits.max_depth``.

Resources (``Limits.max_unpickled_bytes``): streams shorter than :data:`MIN_BYTES` are
left to the walk (it costs little there, and it counts what hashing each key costs:
CPython would hash a key of shared tuples for ``2**levels`` steps here too); longer ones
are only cleared when the opcodes alone cannot allocate the limit
(:data:`~ptfile.picklevm.costs.MAX_BYTES_PER_BYTE` per byte) and the copying
constructors (:data:`~ptfile.picklevm.costs.COPIERS`, called through a recorder)
copy too little to reach it with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..allowlist.structural import StandIn, make_stand_in
from ..errors import PtfileError
from ..limits import Limits
from ..picklevm import unpickle
from ..picklevm.costs import COPIERS, MAX_BYTES_PER_BYTE
from ..picklevm.hazards import tuple_height
from .nested import MIN_ENCODED_CHARS, starts_in_alphabet
from .verdicts import codec_is_standard

__all__ = ["fast_names"]

#: Objects the result walk visits, at most, before giving up (then: symbolic walk).  Not
#: a ceiling on input: past it the precise walk (bounded by ``Limits``) decides instead,
#: with the same findings, so it chooses how to scan, never what is found.
MAX_OBJECTS: Final = 10_000_000
#: Streams shorter than this go to the symbolic walk directly (a few milliseconds).
MIN_BYTES: Final = 1 << 16


class _Recorder:
    """``find_class`` and ``persistent_load`` that record and hand out stand-ins."""

    def __init__(self) -> None:
        self.names: list[tuple[str, str]] = []
        self._classes: dict[tuple[str, str], type] = {}
        self._pid = make_stand_in("<persistent_load>", "id")
        self.copied = 0

    def find_class(self, module: str, name: str) -> Any:
        self.names.append((module, name))
        cls = self._classes.get((module, name))
        if cls is None:
            cls = self._classes[module, name] = make_stand_in(module, name)
        cost = COPIERS.get(("builtins" if module == "__builtin__" else module, name))
        if cost is not None:  # a function, not a class: NEWOBJ on it fails (then: walk)
            return self._copier(cls, *cost)
        return cls

    def _copier(self, cls: type, per: int, fixed: int) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            first: Any = args[0] if args else None
            self.copied += fixed + (max(first, 0) if type(first) is int and per == 1 else
                                    per * len(first) if hasattr(first, "__len__") else 0)
            return cls(*args)
        return call

    def persistent_load(self, pid: object) -> Any:
        return self._pid(pid)


#: ``_codecs.encode``: cleared only with a standard codec name (:func:`codec_is_standard`).
_ENCODE: Final = ("_codecs", "encode")
_ATOMS: Final = frozenset({int, float, bool, complex, type(None)})
_TEXT: Final = frozenset({str, bytes, bytearray})
#: First characters (str) and bytes that may open a pickle or a ZIP (:data:`.nested._OPENERS`);
#: longer texts may be base64 or hex of one (:data:`.nested.MIN_ENCODED_CHARS`).
_HEADS: Final = frozenset({*"\x80Pc(iSVIN]}", *(bytes([c]) for c in b"\x80Pc(iSVIN]}")})


class _NotPlain(Exception):
    """A stand-in the fast path does not clear (see :func:`_children`)."""


def _children(obj: object) -> tuple[object, ...]:
    if isinstance(obj, (tuple, list, set, frozenset)):
        return tuple(obj)
    if isinstance(obj, dict):
        return (*obj.keys(), *obj.values(), *getattr(obj, "__dict__", {}).values())
    if isinstance(obj, StandIn):
        if (type(obj).module, type(obj).name) == _ENCODE and not codec_is_standard(obj.args):
            raise _NotPlain
        return (*obj.args, *obj.kwargs.values(), obj.state, *obj.listitems,
                *(x for pair in obj.dictitems for x in pair))
    return ()


def _walk_is_plain(root: object, heads: Callable[[str | bytes | bytearray], bool],
                   max_depth: int) -> bool:
    """No suspicious blob and no tuple taller than ``max_depth`` in the result graph."""
    seen: set[int] = set()
    heights: dict[int, int] = {}
    stack = [(root,)]
    while stack:
        for child in _children(stack.pop()):
            kind = type(child)
            if kind in _ATOMS:
                continue
            if kind in _TEXT:
                text: str | bytes | bytearray = child  # type: ignore[assignment]
                head = bytes(text[:1]) if isinstance(text, bytearray) else text[:1]
                if (head in _HEADS or (len(text) >= MIN_ENCODED_CHARS
                                       and starts_in_alphabet(text))) and heads(text):
                    return False
                continue
            if id(child) in seen:
                continue
            seen.add(id(child))
            if len(seen) > MAX_OBJECTS:
                return False
            if kind is tuple:
                items: tuple[object, ...] = child  # type: ignore[assignment]
                if any(type(c) is tuple for c in items) and \
                        tuple_height(items, heights, max_depth) > max_depth:
                    return False
            stack.append(child)  # type: ignore[arg-type]
    return True


def fast_names(data: bytes, start: int, limits: Limits, allowed: Callable[[str, str], bool],
               heads: Callable[[str | bytes | bytearray], bool],
               ) -> tuple[list[tuple[str, str]], int] | None:
    """The names the pickle at ``data[start:]`` resolves and its end, if it is plainly clean.

    Returns None when the precise symbolic walk must decide (see the module docstring).
    """
    size = len(data) - start
    if size < MIN_BYTES or size * MAX_BYTES_PER_BYTE > limits.max_unpickled_bytes:
        return None
    recorder = _Recorder()
    try:
        result, end = unpickle(data, hash_work=True, find_class=recorder.find_class,
                               persistent_load=recorder.persistent_load, limits=limits,
                               start=start, encoding="latin1")
    except PtfileError:
        return None
    if not all(allowed(module, name) for module, name in recorder.names) \
            or recorder.copied + size * MAX_BYTES_PER_BYTE > limits.max_unpickled_bytes:
        return None
    try:
        if not _walk_is_plain(result, heads, limits.max_depth):
            return None
    except _NotPlain:
        return None
    return recorder.names, end
