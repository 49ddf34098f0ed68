"""ptfile's own safetensors metadata: how a ``.safetensors`` file gives back the object
ptfile wrote to it (tied names, values, nesting), and the one reader of it.

A safetensors file holds named tensors and a ``__metadata__`` map of strings.  ptfile
writes three entries there, each a JSON text, beside ``format: pt`` (which transformers
checks) and the values themselves (:mod:`ptfile.export.values`):

=====================  ===============================================================
``ptfile.aliases``     ``{alias: kept}``: names not stored because they are the same
                       view of the same storage as ``kept`` (tied weights); ``kept`` is
                       the name of the group that sorts first, as ``safetensors.torch``'s
                       ``save_model`` keeps ``sorted(names)[0]``
``ptfile.values``      ``[name, ...]``: the metadata entries that hold a value (a JSON
                       text: ``"step": "3"``), not text of their own
``ptfile.structure``   the object's containers, :func:`ptfile.model.tree.outline`'s JSON,
                       with the leaves ``{"tensor": name}`` (a stored name or an alias)
                       and ``{"value": name}``; written unless the object is a flat dict
                       of tensors (a state dict), which the names alone give back
=====================  ===============================================================

The reading rule (:func:`restore`, for :func:`ptfile.load`, :func:`ptfile.open` and so
``inspect``, ``diff`` and ``convert``):

* A file without these entries (a foreign file) reads as torch 2.13 reads any
  ``.safetensors``: ``{name: tensor}`` in data order, the metadata left aside.
* Otherwise each alias is its kept tensor again (one tensor under both names), each
  value is its JSON decoded, and the object is the structure rebuilt, or without one,
  the tensors, then the aliases, then the values, by name in one dict.
* The entries MUST hold together: JSON of the right type, aliases naming a stored tensor
  and no name twice (among tensors, aliases and values), values naming metadata entries,
  a structure placing every tensor name and value exactly once and nesting within
  :attr:`Limits.max_depth`.  Metadata that does not is not used at all: the file reads as
  a foreign one, with a :class:`~ptfile.PtfileWarning` saying why (torch reads the file;
  ptfile never reads less).

What a round trip through ``.safetensors`` keeps: every tensor (dtype, shape, values;
contiguous, on the cpu), ties (same view of one storage), values JSON can hold (None,
bool, int, float with NaN and infinities, str; lists and str-keyed dicts of those), and
the nesting of dicts, ``OrderedDict``s, lists and tuples around the tensors with their
keys (str, int, float, bool, None).  What it does not: a tuple inside a value (a JSON
list), values JSON cannot hold or too large for a header (dropped, and a list item so
dropped is None in its place), views that only partly overlap (stored as separate
copies), strides and storage offsets, ``requires_grad``, the type of other dict, list or
tuple subclasses (their base), and the order of a flat state dict's names (data order).
``convert`` reports each of these that it meets.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection, Mapping
from typing import Any, Final

from ...errors import FormatError, LimitExceededError, PtfileWarning, brief
from ...limits import DEFAULT_LIMITS, Limits
from ...model.tensor import Tensor
from ...model.tree import DESCEND, is_state_dict, outline, rebuild

__all__ = ["ALIASES", "OWN", "PREFIX", "STRUCTURE", "VALUES", "aliases_of", "outline_text",
           "restore"]

ALIASES: Final = "ptfile.aliases"
VALUES: Final = "ptfile.values"
STRUCTURE: Final = "ptfile.structure"
#: The names ptfile's own metadata entries start with (no value may take one).
PREFIX: Final = "ptfile."
#: The metadata names that are not values: transformers' ``format`` and ptfile's own.
OWN: Final = frozenset({"format", ALIASES, VALUES, STRUCTURE})
#: How deep a structure ptfile writes may nest: its JSON is three levels a dict, and
#: Python's JSON reader stops near 1000 levels (real checkpoints nest fewer than 10).
STRUCTURE_MAX_DEPTH: Final = 200
_TENSOR: Final = "tensor"
_VALUE: Final = "value"


def outline_text(obj: object, tensors: Collection[str], values: Collection[str],
                 notes: list[tuple[str, str]]) -> str | None:
    """The ``ptfile.structure`` text of ``obj`` whose tensors are written under the names
    ``tensors`` and values under ``values``; None for a flat dict of tensors.  What the
    structure cannot keep goes into ``notes`` (:func:`ptfile.model.tree.outline`'s, and
    ``name-taken``: a tensor whose dotted name an earlier one took).

    Raises
    ------
    FormatError
        The object nests deeper than :data:`STRUCTURE_MAX_DEPTH`.

    Examples
    --------
    >>> import numpy as np, ptfile
    >>> t = ptfile.Tensor(ptfile.Storage(memoryview(np.zeros(1, "f4")), ptfile.DTYPES["float32"]),
    ...                   0, (1,), (1,))
    >>> outline_text({"model": {"w": t}, "epoch": 3}, {"model.w"}, {"epoch"}, [])
    '{"dict":[["model",{"dict":[["w",{"tensor":"model.w"}]]}],["epoch",{"value":"epoch"}]]}'
    """
    if is_state_dict(obj):
        return None
    # The paths of the containers that hold what is written (a superset, for keys with dots).
    holders = {name.rsplit(".", i)[0] for names in (tensors, values) for name in names
               for i in range(1, name.count(".") + 1)}
    placed: set[str] = set()

    def leaf(name: str, node: object) -> Any:
        if isinstance(node, Tensor):
            if name not in tensors or name in placed:
                notes.append(("name-taken", name))
                return None
            placed.add(name)
            return {_TENSOR: name}
        if name in values and name not in placed:
            placed.add(name)
            return {_VALUE: name}
        return DESCEND if not name or name in holders else None

    described = outline(obj, leaf, max_depth=STRUCTURE_MAX_DEPTH, notes=notes)
    return json.dumps(described, separators=(",", ":"), ensure_ascii=False)


def restore(tensors: dict[str, Tensor], metadata: Mapping[str, str] | None,
            limits: Limits = DEFAULT_LIMITS) -> Any:
    """The object a safetensors file holds: ``tensors`` (its ``{name: tensor}``) as the
    module docstring's reading rule gives them back with the file's ``metadata``.

    Examples
    --------
    >>> import numpy as np, ptfile
    >>> t = ptfile.Tensor(ptfile.Storage(memoryview(np.zeros(1, "f4")), ptfile.DTYPES["float32"]),
    ...                   0, (1,), (1,))
    >>> back = restore({"embed": t}, {"ptfile.aliases": '{"head": "embed"}', "step": "3",
    ...                               "ptfile.values": '["step"]'})
    >>> back["head"] is back["embed"], back["step"]
    (True, 3)
    """
    meta = metadata or {}
    if not any(key in meta for key in (ALIASES, VALUES, STRUCTURE)):
        return tensors
    try:
        return _restore(tensors, meta, limits)
    except (FormatError, LimitExceededError) as exc:
        warnings.warn(f"the safetensors file's ptfile metadata is not used: {exc}; it reads "
                      "as torch reads it, {name: tensor}", PtfileWarning, stacklevel=2)
        return tensors


def aliases_of(metadata: Mapping[str, str] | None, stored: Collection[str]) -> dict[str, str]:
    """The ``ptfile.aliases`` of one file of a folder whose tensors are ``stored`` (every
    file's): ``{alias: kept}``, each ``kept`` a stored name and no alias one; metadata
    that does not hold together is not used (a :class:`~ptfile.PtfileWarning`), as by
    :func:`restore`.

    Examples
    --------
    >>> aliases_of({"ptfile.aliases": '{"head": "embed"}'}, {"embed"})
    {'head': 'embed'}
    """
    try:
        found = _json(metadata or {}, ALIASES, dict, {})
        for alias, kept in found.items():
            if not isinstance(kept, str) or kept not in stored or alias in stored:
                raise FormatError(f"alias {brief(alias, 80)} names {brief(kept, 80)}, not "
                                  "another stored tensor")
    except FormatError as exc:
        warnings.warn(f"the safetensors file's ptfile aliases are not used: {exc}",
                      PtfileWarning, stacklevel=2)
        return {}
    return found  # type: ignore[no-any-return]


def _restore(tensors: dict[str, Tensor], meta: Mapping[str, str], limits: Limits) -> Any:
    named = dict(tensors)
    for alias, kept in _json(meta, ALIASES, dict, {}).items():
        if not isinstance(kept, str) or kept not in tensors:
            raise FormatError(f"alias {brief(alias, 80)} names {brief(kept, 80)}, not a "
                              "tensor the file stores")
        if alias in named:
            raise FormatError(f"alias {brief(alias, 80)} is also a tensor's name")
        named[alias] = tensors[kept]
    values: dict[str, object] = {}
    for name in _json(meta, VALUES, list, []):
        if not isinstance(name, str) or name not in meta or name in OWN:
            raise FormatError(f"{VALUES} names {brief(name, 80)}, not a value's entry")
        if name in named or name in values:
            raise FormatError(f"value {brief(name, 80)} is listed twice or is also a tensor")
        values[name] = _json(meta, name, object, None)
    if STRUCTURE not in meta:
        return {**named, **values}
    tables: dict[str, Mapping[str, object]] = {_TENSOR: named, _VALUE: values}
    placed: set[tuple[str, str]] = set()

    def leaf(node: Any) -> object:
        kind, name = next(iter(node.items())) if isinstance(node, dict) and len(node) == 1 \
            else ("", None)
        table = tables.get(kind)
        if table is None or not isinstance(name, str) or name not in table:
            raise FormatError(f"{STRUCTURE} holds {brief(node, 80)}, not a tensor or value "
                              "of the file")
        if (kind, name) in placed:
            raise FormatError(f"{STRUCTURE} places {kind} {brief(name, 80)} twice")
        placed.add((kind, name))
        return table[name]

    obj = rebuild(_json(meta, STRUCTURE, object, None), leaf, max_depth=limits.max_depth)
    left = [name for kind, table in tables.items() for name in table if (kind, name) not in placed]
    if left:
        raise FormatError(f"{STRUCTURE} leaves out {len(left)} name(s): {brief(left, 120)}")
    return obj


def _json(meta: Mapping[str, str], key: str, kind: type, default: Any) -> Any:
    """The JSON text under ``key`` decoded, of type ``kind`` (``default`` when absent).

    Raises
    ------
    FormatError
        Not JSON, or not of that type.
    """
    if key not in meta:
        return default
    try:
        value = json.loads(meta[key])
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"metadata {brief(key, 80)} is not JSON: {exc!s:.200}") from exc
    if not isinstance(value, kind):
        raise FormatError(f"metadata {brief(key, 80)} is a JSON {type(value).__name__}, "
                          f"not {'an object' if kind is dict else 'a list'}")
    return value
