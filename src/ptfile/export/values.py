"""What ``convert`` keeps beside the tensors, and its account of what it dropped or changed.

A checkpoint is a tree of dicts, lists and tuples around its tensors; its other
leaves (``step: 3``, ``lr: 0.1``, a ``config`` dict, a string) are **values**.
:func:`split_values` names them as :func:`ptfile.model.tree.flatten` names tensors (dict
keys and list indices joined with ``.``) and sorts them:

* a subtree with no tensor in it whose leaves are JSON's own (None, bool, int,
  float, str; lists, tuples and dicts with str keys of those) is **one value**, kept
  whole under its name (``config`` → ``{"hidden": 4, "act": "gelu"}``);
* a dict, list or tuple that holds a tensor, or a leaf JSON cannot hold, is walked
  into, so its JSON-able parts are still kept (``config.act``) and only the rest is
  **dropped**, named with its type (``blob (bytes)``, ``dtype (ptfile.DType)``).

For a ``.pt`` output (``as_json=False``) any leaf but a stand-in (an object of a
class ptfile did not import, read with ``structural``) is kept as it is.

Where the values go depends on the output (:func:`header_values`):

* ``.safetensors``: each value is a JSON text in the header's ``__metadata__`` (the
  string → string map the format has), under its dotted name: ``"step": "3"``,
  ``"name": "\\"bert\\""``, ``"config": "{\\"hidden\\": 4}"``; ``json.loads`` gives
  each back.  ``ptfile.values`` lists the names so stored (a JSON list), so a reader
  tells them from other metadata; ``format: pt`` stays, as transformers checks it.
  Names ``format`` and ``ptfile.*`` are the header's own, and a value over
  :data:`VALUE_MAX_BYTES` of JSON (or past :data:`METADATA_MAX_BYTES` in all) does not
  fit: those are dropped.
* ``.npz``: the ``values`` object of the ``__ptfile__`` notes (:mod:`.npz`).
* ``.pt``: the values themselves (nothing is encoded).

Tuples (``torch.Size`` among them) become JSON lists, a change reported as such.
Non-finite floats are written as Python's :mod:`json` writes them (``NaN``,
``Infinity``), which ``json.loads`` reads back.

:class:`Changes` is the account a conversion returns: ``aliases`` (``{alias:
kept}``, tied tensors stored once), ``dropped`` (``{"name", "type", "reason"}``
each) and ``changed`` (groups ``{"change", "names", ...}``: ``json`` with
``to``, ``tuple-as-list``, ``key-as-text``, ``container-as-base``, ``flattened``,
``raw-bits`` and ``upcast`` with ``from`` and ``to``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..allowlist.structural import StandIn
from ..formats.safetensors.meta import PREFIX
from ..model.tensor import Tensor
from ..model.tree import walk

__all__ = ["METADATA_MAX_BYTES", "VALUE_MAX_BYTES", "Changes", "header_values",
           "split_values", "type_name"]

#: The most JSON text one value may take in a header (a bigger one is dropped).
VALUE_MAX_BYTES: Final = 64 << 10
#: The most JSON text all values of one file may take in a header.
METADATA_MAX_BYTES: Final = 16 << 20
#: Header metadata names that are not values: safetensors/transformers' ``format``
#: and ptfile's own ``ptfile.*`` (:mod:`ptfile.formats.safetensors.meta`).
RESERVED_PREFIX: Final = PREFIX
#: How deep a value may nest and still be kept whole (deeper ones are walked into).
_PLAIN_DEPTH: Final = 64
_SCALARS: Final = (str, int, float, bool, type(None))


@dataclass
class Changes:
    """What a conversion did not write as it read: the summary's ``aliases``,
    ``dropped`` and ``changed`` (module docstring)."""

    aliases: dict[str, str] = field(default_factory=dict)
    dropped: list[dict[str, str]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)

    def drop(self, name: str, kind: str, reason: str) -> None:
        self.dropped.append({"name": name, "type": kind, "reason": reason})

    def change(self, change: str, names: list[str], **how: str) -> None:
        """Add ``names`` to the group of ``change`` (with the same ``how``)."""
        if not names:
            return
        for group in self.changed:
            if group["change"] == change and all(group.get(k) == v for k, v in how.items()):
                group["names"].extend(names)
                return
        self.changed.append({"change": change, **how, "names": list(names)})

    def merge(self, other: Changes) -> None:
        self.aliases.update(other.aliases)
        self.dropped.extend(other.dropped)
        for group in other.changed:
            how = {k: v for k, v in group.items() if k not in ("change", "names")}
            self.change(group["change"], group["names"], **how)

    def to_dict(self) -> dict[str, Any]:
        return {"aliases": dict(self.aliases), "dropped": list(self.dropped),
                "changed": list(self.changed)}


def type_name(value: object) -> str:
    """``int``, ``bytes``, ``ptfile.DType``; a stand-in's global (``mymodule.Config``)."""
    if isinstance(value, StandIn):
        return f"{value.module}.{value.name}"
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"


def _plain(node: object, tuples: list[bool], as_json: bool, depth: int = 0) -> bool:
    """Whether ``node`` is JSON's own all the way down (``as_json``), or else holds no
    tensor and no stand-in; notes a tuple."""
    if type(node) in _SCALARS or isinstance(node, str):
        return True
    if depth >= _PLAIN_DEPTH or isinstance(node, (Tensor, StandIn)):
        return False
    if isinstance(node, dict):
        return all((isinstance(k, str) or (not as_json and _plain(k, tuples, False, depth + 1)))
                   and _plain(v, tuples, as_json, depth + 1) for k, v in node.items())
    if isinstance(node, (list, tuple)):
        if isinstance(node, tuple):
            tuples[0] = True
        return all(_plain(v, tuples, as_json, depth + 1) for v in node)
    return not as_json


def split_values(obj: object, tensors: Mapping[str, Tensor], changes: Changes, *,
                 as_json: bool = True, max_depth: int = 1000
                 ) -> tuple[dict[str, object], list[str]]:
    """The values of ``obj`` by dotted name, and the names of those holding a tuple;
    what cannot be kept goes to ``changes.dropped``.

    ``as_json=False`` (a ``.pt`` output, which pickles what it is given) keeps any
    value but a stand-in (:mod:`ptfile.allowlist.structural`: a class ptfile did not import).

    Raises
    ------
    FormatError
        The tree is deeper than ``max_depth``.

    Examples
    --------
    >>> c = Changes()
    >>> split_values({"step": 3, "cfg": {"act": "gelu", "dims": (1, 2)}, "blob": b"x"}, {}, c)
    ({'step': 3, 'cfg': {'act': 'gelu', 'dims': (1, 2)}}, ['cfg'])
    >>> c.dropped
    [{'name': 'blob', 'type': 'bytes', 'reason': 'JSON cannot hold it'}]
    """
    out: dict[str, object] = {}
    with_tuples: list[str] = []

    def visit(name: str, node: object, depth: int) -> bool:
        if isinstance(node, Tensor):
            return False
        tuples = [False]
        if depth and _plain(node, tuples, as_json):
            if name in tensors:
                changes.drop(name, type_name(node), "a tensor has the same name")
            else:
                out[name] = node
                if tuples[0]:
                    with_tuples.append(name)
            return False
        if isinstance(node, (dict, list, tuple)):
            return True
        changes.drop(name, type_name(node), "JSON cannot hold it" if as_json and depth else
                     "a stand-in for a class ptfile did not import" if depth else
                     "the file holds this one object, not a tree of tensors")
        return False

    walk(obj, visit, max_depth=max_depth)
    return out, with_tuples


def header_values(values: Mapping[str, object], changes: Changes, *,
                  reserved: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each value as its JSON text, within :data:`VALUE_MAX_BYTES` each and
    :data:`METADATA_MAX_BYTES` in all; names in ``reserved`` or under ``ptfile.`` are
    dropped (with the values that do not fit) into ``changes``.

    Examples
    --------
    >>> header_values({"step": 3, "name": "bert", "format": "x"}, Changes(),
    ...               reserved=frozenset({"format"}))
    {'step': '3', 'name': '"bert"'}
    """
    out: dict[str, str] = {}
    total = 0
    for name, value in values.items():
        if name in reserved or name.startswith(RESERVED_PREFIX):
            changes.drop(name, type_name(value), "the header's own metadata has this name")
            continue
        text = json.dumps(value, ensure_ascii=False)
        size = len(text.encode())
        if size > VALUE_MAX_BYTES or total + size > METADATA_MAX_BYTES:
            changes.drop(name, type_name(value), f"{size} bytes of JSON: over "
                         f"{VALUE_MAX_BYTES if size > VALUE_MAX_BYTES else METADATA_MAX_BYTES}"
                         " bytes, too large for the header")
            continue
        out[name] = text
        total += size
    return out
