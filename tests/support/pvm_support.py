"""Shared helpers of the picklevm tests: an allowlist of builtins, object strategies, oracles."""

from __future__ import annotations

import codecs
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from ptfile.errors import PtfileError, UnsafeGlobalError
from ptfile.limits import DEFAULT_LIMITS, Limits
from ptfile.picklevm import _gears, _walk

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


def _bytes(*args: Any) -> bytes:
    # Only bytes() of nothing: bytes(2**31) from a damaged stream would allocate 2 GiB.
    if args:
        raise TypeError("bytes() takes no arguments here")
    return b""


def _bytearray(source: Any = b"", *args: Any) -> bytearray:
    if not isinstance(source, (bytes, str, list)):
        raise TypeError("bytearray() of bytes, str or list only")
    return bytearray(source, *args)


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise TypeError("_codecs.encode(str, 'latin1') only")
    return codecs.encode(text, str(encoding))


#: What CPython's pickler emits for builtins, under both module spellings.
ALLOWED: dict[tuple[str, str], object] = {}
for _module in ("builtins", "__builtin__"):
    ALLOWED.update({
        (_module, "set"): set,
        (_module, "frozenset"): frozenset,
        (_module, "bytearray"): _bytearray,
        (_module, "bytes"): _bytes,
    })
ALLOWED[("_codecs", "encode")] = _encode


def find_builtin(module: str, name: str) -> object:
    """A test ``find_class``: the allowlist above, else UnsafeGlobalError."""
    try:
        return ALLOWED[module, name]
    except KeyError:
        raise UnsafeGlobalError(f"{module}.{name} is not allowed", module=module,
                                name=name) from None


# --------------------------------------------------------------------------- objects

_hashable = (st.none() | st.booleans() | st.integers()
             | st.integers(min_value=-(2**300), max_value=2**300)
             | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
_leaves = _hashable | st.binary(max_size=300).map(bytearray) | st.text(min_size=250, max_size=300)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (st.lists(children, max_size=6) | st.tuples(children)
            | st.lists(children, max_size=6).map(tuple)
            | st.dictionaries(_hashable, children, max_size=5)
            | st.sets(_hashable, max_size=5) | st.frozensets(_hashable, max_size=5))


_trees = st.recursive(_leaves, _containers, max_leaves=25)


def _lists_in(obj: Any, found: list[Any], seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, list):
        found.append(obj)
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _lists_in(item, found, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            _lists_in(item, found, seen)


@st.composite
def objects(draw: st.DrawFn) -> Any:
    """Nested builtins, with shared references and (through lists) cycles."""
    root = [draw(_trees)]
    lists: list[Any] = []
    _lists_in(root, lists, set())
    for _ in range(draw(st.integers(0, 4))):
        target = draw(st.sampled_from(lists))
        target.append(draw(st.sampled_from(lists)))
    return root if draw(st.booleans()) else root[0]


def same(a: Any, b: Any) -> bool:
    """Equal values *and* the same sharing and cycles (their pickles are identical)."""
    return pickle.dumps(a, 4) == pickle.dumps(b, 4)


# --------------------------------------------------------------------------- oracles


def normalised_pickletools(data: bytes) -> list[tuple[str, object, int | None]]:
    """``pickletools.genops`` with arguments decoded the way :func:`genops` decodes them."""
    result = []
    for opcode, arg, pos in pickletools.genops(data):
        if opcode.name in ("GLOBAL", "INST"):
            arg = tuple(str(arg).split(" ", 1))
        result.append((opcode.name, arg, pos))
    return result


Outcome = tuple[object, ...]


def outcome(data: bytes, limits: Limits = DEFAULT_LIMITS, *, fast: bool,
            steps: bool = False, runs: bool = False, counts: bool = False) -> Outcome:
    """What one gear of :func:`check_stream` says about ``data``: the walk's result or error.

    ``fast=False, steps=True`` is the reference: :func:`_walk.step` alone;
    ``fast=False, runs=True`` the run gear.  ``counts`` adds the opcode count
    and the memo index rule 3 must cover (the exact gears only).
    """
    walk = _walk.new_walk(data, 0, limits)
    gear: Callable[[_walk.Walk], None] = _gears.walk_fast if fast else \
        _walk.walk_steps if steps else _gears.walk_runs if runs else _gears.walk_exact
    try:
        gear(walk)
    except PtfileError as exc:
        return (type(exc), str(exc))
    result = (walk.end, walk.max_depth, walk.protocol, walk.ext_offset)
    return (*result, walk.opcodes, max(walk.memo_seen, 255)) if counts else result
