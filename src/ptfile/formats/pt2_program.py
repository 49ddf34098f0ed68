"""The signature of a ``torch.export`` program, read from a ``.pt2`` archive as data.

Layout (verified against torch 2.13, export schema 8.20; the field names are
``torch/_export/serde/schema.py``'s).  ``models/<model>.json`` is one JSON
object, the serialized ``ExportedProgram``; ptfile reads these fields and
nothing else (the graph's nodes are never looked at, nothing is run):

* ``graph_module.signature`` — ``{"input_specs": [InputSpec], "output_specs":
  [OutputSpec]}``.  A spec is a *union*: an object of exactly one field naming
  its kind.  Input kinds: ``user_input {arg: Argument}``, ``parameter {arg:
  {name}, parameter_name}``, ``buffer {arg: {name}, buffer_name, persistent}``,
  ``tensor_constant {arg: {name}, tensor_constant_name}``, ``custom_obj {arg:
  {name, class_fqn}, custom_obj_name}``, ``token {arg: {name}}``,
  ``constant_input {name, value: ConstantValue}`` (a user input specialised to a
  constant, e.g. an ``int`` argument).  Output kinds: ``user_output {arg:
  Argument}``, ``loss_output {arg: {name}}``, ``buffer_mutation {arg: {name},
  buffer_name}``, ``parameter_mutation {arg, parameter_name}``,
  ``gradient_to_parameter {arg, parameter_name}``, ``gradient_to_user_input
  {arg, user_input_name}``, ``user_input_mutation {arg, user_input_name}``,
  ``token {arg: {name}}``.  ptfile reports each spec with torch's
  ``InputKind``/``OutputKind`` name, lower-cased (``tensor_constant`` is
  ``constant_tensor``; ``constant_input`` is a ``user_input`` with a value), the
  graph's name for the value and the target (the FQN; for a mutation of a user
  input, that input's name).  A kind this module does not know is reported by
  its field name, so a newer torch's archive still inspects.
* An ``Argument`` is a union too: ``as_tensor {name}``, ``as_sym_int`` /
  ``as_sym_float`` / ``as_sym_bool`` (``{as_name}`` or a concrete ``{as_int}``...),
  ``as_int``, ``as_float``, ``as_string``, ``as_bool``, ``as_none``,
  ``as_custom_obj {name, class_fqn}``; any other field is reported by its name
  (``as_tensors`` is type ``tensors``).
* ``graph_module.graph.tensor_values`` — graph name → ``TensorMeta`` (the same
  record as a payload config's ``tensor_meta``, :mod:`.pt2`), giving each
  tensor's dtype, device, ``requires_grad`` and sizes.  A size is ``{"as_int":
  n}`` or ``{"as_expr": {"expr_str": <sympy srepr>, "hint": ...}}``: symbolic
  sizes (``torch.export.Dim``) are rendered as torch prints them (``s77``,
  ``2*s77``) from the srepr (:func:`.pt2_json.render_expr`; never ``eval``).
  ``graph.sym_int_values`` (and the float/bool tables) give a symbolic scalar's
  expression the same way.
* ``range_constraints`` — symbol → ``{"min_val": int | null, "max_val": int |
  null}``; the keys are already printed expressions.
* ``graph_module.module_call_graph[0]`` (``fqn`` ``""``) ``.signature`` holds
  ``in_spec`` / ``out_spec``: pytree TreeSpecs serialized as JSON *strings*
  ``[1, {"type": str | null, "context": <JSON string> | null, "children_spec":
  [...]}]`` (``type`` null is a leaf), and ``forward_arg_names``.  The leaves of
  ``out_spec`` are the user outputs in order, those of ``in_spec`` the user
  inputs (an ``(args, kwargs)`` pair), so the original structure of the call is
  shown: ``(add, {'s': add_1})``.  A spec whose leaves do not match the user
  values (a joint forward-backward program) is not shown.
* ``torch_version``, ``schema_version {major, minor}``.

Every field is type-checked before use: a malformed document raises
:class:`~ptfile.FormatError`; its size is bounded by ``Limits.max_pickle_bytes``
and every nesting (TreeSpecs, expressions) by ``Limits.max_depth``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from ..archive import ZipReader
from ..errors import FormatError, LimitExceededError, brief
from ..limits import Limits
from .pt2 import SCALAR_TYPES, device_of, model_name
from .pt2_json import JsonDoc, loads, render_expr, render_structure

__all__ = ["ProgramSignature", "ProgramValue", "parse_program", "read_program"]

Scalar = int | float | str | bool | None
Dim = int | str


@dataclass(frozen=True, slots=True)
class ProgramValue:
    """One input or output of an exported program.

    ``kind`` is torch's ``InputKind``/``OutputKind`` name lower-cased
    (``user_input``, ``parameter``, ``buffer``, ``constant_tensor``,
    ``custom_obj``, ``token``; ``user_output``, ``loss_output``,
    ``buffer_mutation``...).  ``name`` is the graph's name for the value (None
    for a constant output), ``target`` the parameter/buffer/constant FQN or the
    mutated user input.  ``type`` is ``tensor``, ``sym_int``, ``int``,
    ``none``...; tensors have ``dtype``, ``shape`` (symbolic sizes as strings),
    ``device`` and ``requires_grad`` when the graph records them; constants have
    ``value``; symbolic scalars ``expr``.
    """

    kind: str
    name: str | None
    type: str
    target: str | None = None
    dtype: str | None = None
    shape: tuple[Dim, ...] | None = None
    device: str | None = None
    requires_grad: bool | None = None
    value: Scalar = None
    expr: str | None = None
    persistent: bool | None = None
    class_fqn: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (those that are None left out, ``kind``/``name``/``type`` kept)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        keep = ("kind", "name", "type") + (("value",) if self.type in _CONSTANTS else ())
        return {k: v for k, v in out.items() if v is not None or k in keep}

    def label(self) -> str:
        """How the value reads in a call's structure: its name, or a constant's repr."""
        if self.type in _CONSTANTS:
            return repr(self.value) if self.name is None else self.name
        return self.name or "?"

    def describe(self) -> str:
        """One line: name, type/dtype/shape, target."""
        what = self.type if self.dtype is None else self.dtype
        if self.shape is not None:
            what += f"[{', '.join(map(str, self.shape))}]"
        if self.type in _CONSTANTS:
            what += f" = {self.value!r}"
        if self.expr is not None:
            what += f" = {self.expr}"
        if self.class_fqn is not None:
            what += f" {self.class_fqn}"
        target = "" if self.target is None else f" -> {self.target}"
        persistent = " (non-persistent)" if self.persistent is False else ""
        return f"{self.kind:<16} {self.name or '-'}: {what}{target}{persistent}"


@dataclass(frozen=True, slots=True)
class ProgramSignature:
    """What ``models/<model>.json`` says about the program's calling convention."""

    model: str
    inputs: tuple[ProgramValue, ...]
    outputs: tuple[ProgramValue, ...]
    range_constraints: Mapping[str, tuple[int | None, int | None]]
    forward_arg_names: tuple[str, ...] | None
    call: str | None
    returns: str | None
    torch_version: str | None
    schema_version: str | None

    def targets(self, kind: str) -> list[str]:
        """The targets (FQNs) of the inputs of one kind, in order."""
        return [v.target for v in self.inputs if v.kind == kind and v.target is not None]

    @property
    def parameters(self) -> list[str]:
        """FQNs of the parameters the program takes."""
        return self.targets("parameter")

    @property
    def buffers(self) -> list[str]:
        """FQNs of the buffers (persistent or not)."""
        return self.targets("buffer")

    @property
    def constants(self) -> list[str]:
        """FQNs of the lifted tensor constants."""
        return self.targets("constant_tensor")

    @property
    def custom_objects(self) -> list[str]:
        """FQNs of the TorchBind / opaque object constants."""
        return self.targets("custom_obj")

    @property
    def user_inputs(self) -> list[ProgramValue]:
        """The caller's inputs (tensors, symbolic and constant values), in order."""
        return [v for v in self.inputs if v.kind == "user_input"]

    @property
    def user_outputs(self) -> list[ProgramValue]:
        """What the call returns to the caller, in order."""
        return [v for v in self.outputs if v.kind == "user_output"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"model": self.model, "torch_version": self.torch_version,
                "schema_version": self.schema_version, "call": self.call,
                "returns": self.returns, "forward_arg_names":
                    None if self.forward_arg_names is None else list(self.forward_arg_names),
                "inputs": [v.to_dict() for v in self.inputs],
                "outputs": [v.to_dict() for v in self.outputs],
                "range_constraints": {k: {"min": lo, "max": hi}
                                      for k, (lo, hi) in self.range_constraints.items()},
                "parameters": self.parameters, "buffers": self.buffers,
                "constants": self.constants, "custom_objects": self.custom_objects}

    def lines(self) -> list[str]:
        """The signature as text lines (``ptfile inspect``)."""
        versions = f"torch {self.torch_version}, schema {self.schema_version}"
        out = [f"Exported program {self.model!r} ({versions})"]
        if self.call is not None:
            returns = "" if self.returns is None else f" -> {self.returns}"
            out.append(f"  forward{self.call}{returns}")
        out.append(f"  Inputs ({len(self.inputs)})")
        out += [f"    {v.describe()}" for v in self.inputs]
        out.append(f"  Outputs ({len(self.outputs)})")
        out += [f"    {v.describe()}" for v in self.outputs]
        if self.range_constraints:
            out.append("  Symbolic sizes")
            out += [f"    {name}: {'' if lo is None else lo}..{'' if hi is None else hi}"
                    for name, (lo, hi) in self.range_constraints.items()]
        return out


_CONSTANTS: Final = frozenset({"int", "float", "str", "bool", "none"})
#: A SymInt/SymFloat/SymBool union's concrete fields (anything else is an expression).
_CONCRETE: Final[Mapping[str, type]] = {"as_int": int, "as_float": float, "as_bool": bool}


# --------------------------------------------------------------------------- values

class _Values:
    """Turns the signature's arguments into :class:`ProgramValue` with their metadata."""

    def __init__(self, doc: JsonDoc, graph: object) -> None:
        self.doc = doc
        self.tensors: dict[str, Any] = doc.get(graph, "tensor_values", dict, "graph")
        self.symbols: dict[str, Any] = {}
        for table in ("sym_int_values", "sym_float_values", "sym_bool_values"):
            found = doc.get(graph, table, dict, "graph", optional=True)
            self.symbols.update(found or {})

    def dim(self, value: object, where: str) -> Dim:
        key, body = self.doc.union(value, where)
        kind = _CONCRETE.get(key)
        if kind is not None:
            if not isinstance(body, kind) or (kind is int and isinstance(body, bool)):
                raise self.doc.fail(where, f"{key} is not a {kind.__name__}: {brief(body, 40)}")
            return body if isinstance(body, int) and kind is int else str(body)
        if key == "as_expr":
            text = self.doc.get(body, "expr_str", str, f"{where} as_expr")
            return render_expr(text, self.doc.limits)
        raise self.doc.fail(where, f"unknown symbolic value {brief(key, 40)}")

    def tensor(self, kind: str, name: str, where: str, **extra: Any) -> ProgramValue:
        meta = self.tensors.get(name)
        if meta is None:
            return ProgramValue(kind, name, "tensor", **extra)
        where = f"tensor_values[{brief(name, 80)}]"
        code = self.doc.get(meta, "dtype", int, where)
        sizes = self.doc.items(meta, "sizes", where)
        if len(sizes) > self.doc.limits.max_ndim:
            raise LimitExceededError("max_ndim", self.doc.limits.max_ndim, len(sizes), where)
        return ProgramValue(
            kind, name, "tensor", dtype=SCALAR_TYPES.get(code, f"scalar_type_{code}"),
            shape=tuple(self.dim(s, f"{where} sizes") for s in sizes),
            device=device_of(meta, where),
            requires_grad=self.doc.get(meta, "requires_grad", bool, where), **extra)

    def symbol(self, kind: str, type_: str, body: object, where: str,
               **extra: Any) -> ProgramValue:
        key, value = self.doc.union(body, where)
        if key != "as_name":
            return ProgramValue(kind, None, type_.removeprefix("sym_"), value=_scalar(
                self.doc, value, where), **extra)
        if not isinstance(value, str):
            raise self.doc.fail(where, f"as_name is not a string: {brief(value, 40)}")
        known = self.symbols.get(value)
        expr = None if known is None else str(self.dim(known, f"symbol {brief(value, 80)}"))
        return ProgramValue(kind, value, type_, expr=expr, **extra)

    def argument(self, kind: str, arg: object, where: str, **extra: Any) -> ProgramValue:
        """An ``Argument`` union (user inputs and outputs)."""
        key, body = self.doc.union(arg, where)
        type_ = key.removeprefix("as_")
        if key == "as_tensor":
            return self.tensor(kind, self.doc.get(body, "name", str, where), where, **extra)
        if key in ("as_sym_int", "as_sym_float", "as_sym_bool"):
            return self.symbol(kind, type_, body, where, **extra)
        if key == "as_custom_obj":
            return ProgramValue(kind, self.doc.get(body, "name", str, where), "custom_obj",
                                class_fqn=self.doc.get(body, "class_fqn", str, where), **extra)
        if key == "as_none":
            return ProgramValue(kind, None, "none", **extra)
        if key == "as_string":
            type_ = "str"
        if type_ in _CONSTANTS:
            return ProgramValue(kind, None, type_, value=_scalar(self.doc, body, where), **extra)
        return ProgramValue(kind, None, type_, **extra)


def _scalar(doc: JsonDoc, value: object, where: str) -> Scalar:
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    raise doc.fail(where, f"expected a number, string or bool, got {brief(value, 60)}")


# --------------------------------------------------------------------------- specs

# Each spec kind: (torch's kind name, the field naming the target, how its "arg" reads).
_TENSOR, _ARGUMENT, _CUSTOM = "tensor", "argument", "custom"
_INPUT_SPECS: Final[Mapping[str, tuple[str, str | None, str]]] = {
    "user_input": ("user_input", None, _ARGUMENT),
    "parameter": ("parameter", "parameter_name", _TENSOR),
    "buffer": ("buffer", "buffer_name", _TENSOR),
    "tensor_constant": ("constant_tensor", "tensor_constant_name", _TENSOR),
    "custom_obj": ("custom_obj", "custom_obj_name", _CUSTOM),
    "token": ("token", None, _TENSOR),
}
_OUTPUT_SPECS: Final[Mapping[str, tuple[str, str | None, str]]] = {
    "user_output": ("user_output", None, _ARGUMENT),
    "loss_output": ("loss_output", None, _TENSOR),
    "buffer_mutation": ("buffer_mutation", "buffer_name", _TENSOR),
    "parameter_mutation": ("parameter_mutation", "parameter_name", _TENSOR),
    "gradient_to_parameter": ("gradient_to_parameter", "parameter_name", _TENSOR),
    "gradient_to_user_input": ("gradient_to_user_input", "user_input_name", _TENSOR),
    "user_input_mutation": ("user_input_mutation", "user_input_name", _TENSOR),
    "token": ("token", None, _TENSOR),
}


def _spec(values: _Values, spec: object, table: Mapping[str, tuple[str, str | None, str]],
          where: str) -> ProgramValue:
    doc = values.doc
    key, body = doc.union(spec, where)
    where = f"{where} {brief(key, 40)}"
    if key == "constant_input":  # a user input specialised to a constant
        name = doc.get(body, "name", str, where)
        type_, value = doc.union(doc.get(body, "value", dict, where), f"{where} value")
        type_ = {"as_string": "str"}.get(type_, type_.removeprefix("as_"))
        return ProgramValue("user_input", name, type_, value=_scalar(doc, value, where))
    found = table.get(key)
    if found is None:  # a kind of a newer schema: shown by its field name
        return ProgramValue(key, None, "unknown")
    kind, target_field, reads = found
    extra: dict[str, Any] = {}
    if target_field is not None:
        extra["target"] = doc.get(body, target_field, str, where)
    if key == "buffer":
        extra["persistent"] = doc.get(body, "persistent", bool, where)
    arg = doc.get(body, "arg", dict, where)
    if reads == _ARGUMENT:
        return values.argument(kind, arg, where, **extra)
    name = doc.get(arg, "name", str, f"{where} arg")
    if reads == _CUSTOM:
        return ProgramValue(kind, name, "custom_obj",
                            class_fqn=doc.get(arg, "class_fqn", str, f"{where} arg"), **extra)
    return values.tensor(kind, name, where, **extra) if key != "token" else \
        ProgramValue(kind, name, "token", **extra)


# --------------------------------------------------------------------------- the document

def _ranges(doc: JsonDoc, program: object) -> dict[str, tuple[int | None, int | None]]:
    table = doc.get(program, "range_constraints", dict, "program", optional=True) or {}
    out: dict[str, tuple[int | None, int | None]] = {}
    for name, bounds in table.items():
        where = f"range_constraints[{brief(name, 80)}]"
        out[name] = (doc.get(bounds, "min_val", int, where, optional=True),
                     doc.get(bounds, "max_val", int, where, optional=True))
    return out


def _call_signature(doc: JsonDoc, module: object) -> dict[str, Any] | None:
    entries = doc.items(module, "module_call_graph", "graph_module")
    for i, entry in enumerate(entries):
        if doc.get(entry, "fqn", str, f"module_call_graph[{i}]") == "":
            found: dict[str, Any] | None = doc.get(entry, "signature", dict,
                                                   f"module_call_graph[{i}]", optional=True)
            return found
    return None


def _version(doc: JsonDoc, program: object) -> str | None:
    version = doc.get(program, "schema_version", dict, "program", optional=True)
    if version is None:
        return None
    return (f"{doc.get(version, 'major', int, 'schema_version')}."
            f"{doc.get(version, 'minor', int, 'schema_version')}")


def _values(values: _Values, specs: list[Any], table: Mapping[str, tuple[str, str | None, str]],
            where: str) -> tuple[ProgramValue, ...]:
    return tuple(_spec(values, spec, table, f"{where}[{i}]") for i, spec in enumerate(specs))


def parse_program(raw: bytes, model: str, member: str, limits: Limits) -> ProgramSignature:
    """The signature of the serialized ExportedProgram ``raw`` (``models/<model>.json``).

    Raises
    ------
    FormatError
        Not JSON, or a field is missing or of the wrong type.
    LimitExceededError
        The document, a size expression or a nesting is over its ceiling.
    """
    doc = JsonDoc(member, limits)
    program = loads(raw, doc, "program")
    module = doc.get(program, "graph_module", dict, "program")
    signature = doc.get(module, "signature", dict, "graph_module")
    values = _Values(doc, doc.get(module, "graph", dict, "graph_module"))
    inputs = _values(values, doc.items(signature, "input_specs", "signature"), _INPUT_SPECS,
                     "input_specs")
    outputs = _values(values, doc.items(signature, "output_specs", "signature"), _OUTPUT_SPECS,
                      "output_specs")
    call = _call_signature(doc, module)
    names = None if call is None else doc.get(call, "forward_arg_names", list, "call",
                                              optional=True)
    if names is not None and not all(isinstance(n, str) for n in names):
        raise doc.fail("forward_arg_names", "expected a list of strings")

    def structure(key: str, of: list[ProgramValue], as_call: bool) -> str | None:
        return None if call is None else render_structure(
            doc, call.get(key), [v.label() for v in of], f"module_call_graph {key}", as_call)

    return ProgramSignature(
        model=model, inputs=inputs, outputs=outputs, range_constraints=_ranges(doc, program),
        forward_arg_names=None if names is None else tuple(names),
        call=structure("in_spec", [v for v in inputs if v.kind == "user_input"], True),
        returns=structure("out_spec", [v for v in outputs if v.kind == "user_output"], False),
        torch_version=doc.get(program, "torch_version", str, "program", optional=True),
        schema_version=_version(doc, program))


def read_program(reader: ZipReader, prefix: str, limits: Limits) -> ProgramSignature:
    """The signature of the one program of a ``.pt2`` archive (reads ``models/<model>.json``).

    Raises
    ------
    FormatError, LimitExceededError
        As :func:`parse_program`; or the record is over ``Limits.max_pickle_bytes``.
    UnsupportedFeatureError
        The archive holds no program or several.
    """
    model = model_name(reader, prefix)
    member = f"{prefix}/models/{model}.json"
    record = reader.get(member)
    if record is None:  # model_name found it: only a damaged directory gets here
        raise FormatError("the .pt2 archive has no program record", member=member)
    if record.size > limits.max_pickle_bytes:
        raise LimitExceededError("max_pickle_bytes", limits.max_pickle_bytes, record.size, member)
    return parse_program(reader.read(record), model, member, limits)
