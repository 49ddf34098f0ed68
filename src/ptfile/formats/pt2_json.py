"""Checked reading of the JSON a ``.pt2`` program is stored as, and its rendering as text.

Three pieces :mod:`.pt2_program` builds on (their layout is described there):

* :class:`JsonDoc` — type-checked field access into a parsed document; every
  failure is a :class:`~ptfile.FormatError` naming the path to the bad field
  and the record; :func:`loads` bounds the text by ``Limits.max_pickle_bytes``.
* :func:`render_expr` — a symbolic size, stored as a sympy ``srepr`` string
  (``Mul(Integer(2), Symbol('s77', positive=True, integer=True))``), printed as
  torch prints it (``2*s77``) by a parser of that call syntax: nothing is
  evaluated.  Text it cannot parse is shown as it is.
* :func:`render_structure` — a pytree TreeSpec serialized as a JSON string
  (``[1, {"type": "builtins.tuple", "context": "null", "children_spec": [...]}]``;
  ``type`` null is a leaf; a dict's ``context`` is the JSON list of its keys)
  printed with the given leaf labels: ``(add, {'s': add_1})``.  Nesting is
  bounded by ``Limits.max_depth``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import FormatError, LimitExceededError, brief
from ..limits import Limits

__all__ = ["JsonDoc", "loads", "render_expr", "render_structure"]

# --------------------------------------------------------------------------- checked JSON

class JsonDoc:
    """Checked access to one parsed document; errors name the path to the bad field."""

    def __init__(self, member: str, limits: Limits) -> None:
        self.member, self.limits = member, limits

    def fail(self, where: str, message: str) -> FormatError:
        return FormatError(f"{where}: {message}", member=self.member)

    def get(self, obj: object, key: str, kind: type | tuple[type, ...], where: str,
            optional: bool = False) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected an object, got {type(obj).__name__}")
        value = obj.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
            raise self.fail(where, f"expected a {key!r} field of type "
                                   f"{getattr(kind, '__name__', kind)}, got {brief(value, 80)}")
        return value

    def union(self, obj: object, where: str) -> tuple[str, Any]:
        """The one field of a serde union object."""
        if not isinstance(obj, dict) or len(obj) != 1:
            raise self.fail(where, f"expected an object of one field (a union), got {brief(obj, 80)}")
        key, value = next(iter(obj.items()))
        return key, value

    def items(self, obj: object, key: str, where: str) -> list[Any]:
        values: list[Any] = self.get(obj, key, list, where)
        return values


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def loads(raw: bytes | str, doc: JsonDoc, where: str) -> Any:
    if len(raw) > doc.limits.max_pickle_bytes:
        raise LimitExceededError("max_pickle_bytes", doc.limits.max_pickle_bytes, len(raw),
                                 f"{doc.member} {where}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise doc.fail(where, f"not JSON: {exc}") from None


# --------------------------------------------------------------------------- sympy srepr

_TOKEN: Final = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(-?\d+)|'([^'\\]*)'|\"([^\"\\]*)\""
                           r"|([(),=]))")
_INFIX: Final[Mapping[str, str]] = {"Add": " + ", "Mul": "*", "Pow": "**", "FloorDiv": "//"}


class _Unparsed(Exception):
    """The text is not in the srepr call syntax (it is then shown as it is)."""


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    args: tuple[_Call | str, ...]


def _tokens(text: str) -> Iterator[str | tuple[str, str]]:
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos:].strip():
                raise _Unparsed(f"unexpected {text[pos:pos + 20]!r}")
            return
        pos = match.end()
        ident, number, quoted, dquoted, punct = match.groups()
        if punct is not None:
            yield punct
        else:
            yield ("atom", ident or number or (quoted if quoted is not None else dquoted or ""))


class _Srepr:
    """A parser of sympy's ``srepr`` call syntax (``Mul(Integer(2), Symbol('s0', ...))``)."""

    def __init__(self, text: str, max_depth: int) -> None:
        self.tokens = list(_tokens(text))
        self.pos, self.max_depth = 0, max_depth

    def peek(self) -> str | tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | tuple[str, str]:
        token = self.peek()
        if token is None:
            raise _Unparsed("truncated expression")
        self.pos += 1
        return token

    def expr(self, depth: int = 0) -> _Call | str:
        if depth > self.max_depth:
            raise _Unparsed("expression nested too deep")
        token = self.take()
        if not isinstance(token, tuple):
            raise _Unparsed(f"unexpected {token!r}")
        if self.peek() != "(":
            return token[1]
        self.take()
        args: list[_Call | str] = []
        while self.peek() != ")":
            arg = self.expr(depth + 1)
            if self.peek() == "=":  # a keyword argument (assumptions): dropped
                self.take()
                self.expr(depth + 1)
            else:
                args.append(arg)
            if self.peek() == ",":
                self.take()
            elif self.peek() != ")":
                raise _Unparsed("expected ',' or ')'")
        self.take()
        return _Call(token[1], tuple(args))


def _render(node: _Call | str) -> str:
    if isinstance(node, str):
        return node
    args = [_render(a) for a in node.args]
    if node.name in ("Symbol", "Integer") and len(args) == 1:
        return args[0]
    if node.name == "Rational" and len(args) == 2:
        return f"{args[0]}/{args[1]}"
    if node.name == "Mul" and len(args) >= 2 and args[0] == "-1":
        return "-" + _render(_Call("Mul", node.args[1:]))
    if node.name in _INFIX and args:
        parts = [f"({a})" if isinstance(n, _Call) and n.name == "Add" and node.name != "Add"
                 else a for a, n in zip(args, node.args, strict=True)]
        text = _INFIX[node.name].join(parts).replace("+ -", "- ")
        return f"({text})" if node.name == "FloorDiv" else text
    return f"{node.name}({', '.join(args)})"


def render_expr(text: str, limits: Limits) -> str:
    """A sympy ``srepr`` string printed as torch prints the expression; unparseable text
    is returned as it is (it is only shown).

    Examples
    --------
    >>> from ptfile.limits import DEFAULT_LIMITS
    >>> render_expr("Mul(Integer(2), Symbol('s77', positive=True, integer=True))",
    ...             DEFAULT_LIMITS)
    '2*s77'
    """
    if len(text) > limits.max_name_length:
        raise LimitExceededError("max_name_length", limits.max_name_length, len(text),
                                 "symbolic size expression")
    try:
        parser = _Srepr(text, limits.max_depth)
        node = parser.expr()
        if parser.peek() is not None:
            raise _Unparsed("trailing text")
        return _render(node)
    except (_Unparsed, RecursionError):
        return text


# --------------------------------------------------------------------------- tree specs

_SEQUENCES: Final[Mapping[str, tuple[str, str]]] = {
    "builtins.tuple": ("(", ")"), "builtins.list": ("[", "]"),
    "torch.fx.immutable_collections.immutable_list": ("[", "]"),
}
_MAPPINGS: Final = frozenset({"builtins.dict", "collections.OrderedDict",
                              "torch.fx.immutable_collections.immutable_dict"})


class _Tree:
    """Renders a serialized pytree TreeSpec with the given leaf labels."""

    def __init__(self, doc: JsonDoc, leaves: list[str]) -> None:
        self.doc, self.leaves, self.used = doc, leaves, 0

    def node(self, spec: object, depth: int, where: str) -> str:
        if depth > self.doc.limits.max_depth:
            raise LimitExceededError("max_depth", self.doc.limits.max_depth, depth, where)
        type_ = self.doc.get(spec, "type", str, where, optional=True)
        children = self.doc.items(spec, "children_spec", where)
        if type_ is None:
            if self.used >= len(self.leaves):
                raise _Mismatch
            self.used += 1
            return self.leaves[self.used - 1]
        parts = [self.node(child, depth + 1, where) for child in children]
        return self.join(type_, self.context(spec, where), parts, where)

    def context(self, spec: object, where: str) -> Any:
        raw = self.doc.get(spec, "context", str, where, optional=True)
        return None if raw is None else loads(raw, self.doc, f"{where} context")

    def join(self, type_: str, context: Any, parts: list[str], where: str) -> str:
        if type_ in _SEQUENCES:
            left, right = _SEQUENCES[type_]
            tail = "," if left == "(" and len(parts) == 1 else ""
            return f"{left}{', '.join(parts)}{tail}{right}"
        if type_ in _MAPPINGS:
            if not isinstance(context, list) or len(context) != len(parts):
                raise self.doc.fail(where, f"a {type_} spec's context is not its keys")
            return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(context, parts,
                                                                   strict=True)) + "}"
        return f"{type_.rsplit('.', 1)[-1]}({', '.join(parts)})"


class _Mismatch(Exception):
    """The TreeSpec has more leaves than values (a program whose outputs are not the call's)."""


def render_structure(doc: JsonDoc, raw: object, leaves: list[str], where: str,
               as_call: bool) -> str | None:
    if not isinstance(raw, str):
        raise doc.fail(where, f"expected a serialized TreeSpec string, got {brief(raw, 60)}")
    top = loads(raw, doc, where)
    if not isinstance(top, list) or len(top) != 2 or top[0] != 1:
        return None  # another TreeSpec protocol: not shown
    tree = _Tree(doc, leaves)
    spec = top[1]
    try:
        if as_call and doc.get(spec, "type", str, where, optional=True) == "builtins.tuple":
            text = _call(tree, spec, where)
        else:
            text = tree.node(spec, 0, where)
    except _Mismatch:
        return None
    except RecursionError:  # json.loads allows as much nesting as the stack does: not us
        raise doc.fail(where, "the TreeSpec is nested too deep to render") from None
    return text if tree.used == len(leaves) else None


def _call(tree: _Tree, spec: object, where: str) -> str:
    """``(args, kwargs)`` rendered as a call's argument list: ``(x, y, scale=scale)``."""
    children = tree.doc.items(spec, "children_spec", where)
    if len(children) != 2:
        return tree.node(spec, 0, where)
    args = tree.node(children[0], 1, where)
    kwargs = tree.doc.items(children[1], "children_spec", where)
    keys = tree.context(children[1], where)
    if not isinstance(keys, list) or len(keys) != len(kwargs):
        raise tree.doc.fail(where, "the kwargs spec's context is not its keys")
    named = [f"{k}={tree.node(c, 2, where)}" for k, c in zip(keys, kwargs, strict=True)]
    inner = args[1:-1].removesuffix(",") if args.startswith("(") else args
    return "(" + ", ".join([p for p in (inner,) if p] + named) + ")"
