"""The signature of a .pt2's exported program, as ptfile reads it, against torch 2.13's own."""

from __future__ import annotations

import copy
import io
import json
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_unflatten
from torch.utils._sympy.functions import FloorDiv, Mod

import ptfile
from ptfile.formats.pt2_json import render_expr
from ptfile.formats.pt2_program import ProgramSignature, parse_program
from ptfile.limits import DEFAULT_LIMITS

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class Constants(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = torch.arange(3.0)  # a lifted tensor constant
        self.register_buffer("scratch", torch.ones(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.k + self.scratch


class Many(torch.nn.Module):
    """Several inputs (one a list, one a keyword constant) and a tuple-with-dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, pair: list[torch.Tensor], *,
                scale: float = 2.0) -> tuple[torch.Tensor, dict[str, Any]]:
        y = self.lin(x) * scale
        return y, {"sum": pair[0] + pair[1], "rows": x.shape[0], "none": None}


class Mutating(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        with torch.no_grad():
            self.w.mul_(2)
        return x * self.w


batch = torch.export.Dim("batch", min=2, max=64)
EXPORTS: dict[str, Callable[[], torch.export.ExportedProgram]] = {
    "mlp": lambda: torch.export.export(MLP(), (torch.randn(5, 4),)),
    "conv_bn_eval": lambda: torch.export.export(ConvBN().eval(), (torch.randn(1, 3, 6, 6),)),
    "conv_bn_train": lambda: torch.export.export(
        ConvBN().train(), (torch.randn(2, 3, 6, 6),)).run_decompositions(),
    "constants": lambda: torch.export.export(Constants(), (torch.randn(3),)),
    "dynamic": lambda: torch.export.export(
        MLP(), (torch.randn(5, 4),), dynamic_shapes=({0: batch},)),
    "derived": lambda: _derived(),
    "many": lambda: torch.export.export(
        Many(), (torch.randn(4, 3), [torch.randn(2), torch.randn(2)]), {"scale": 3.0},
        dynamic_shapes={"x": {0: batch}, "pair": [None, None], "scale": None}),
    "mutating": lambda: torch.export.export(Mutating(), (torch.randn(3),)).run_decompositions(),
}


class _Slicer(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) + y[: 2 * x.shape[0]]


def _derived() -> torch.export.ExportedProgram:
    dim = torch.export.Dim("n", max=50)
    return torch.export.export(_Slicer(), (torch.randn(3, 2), torch.randn(6, 2)),
                               dynamic_shapes=({0: dim}, {0: 2 * dim}))


def _save(ep: torch.export.ExportedProgram) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(ep, buf)
    return buf.getvalue()


#: The example of docs/formats.md (tests/golden/make_tiny_export.py), checked with the exports.
GOLDEN: Final = Path(__file__).resolve().parents[1] / "golden" / "tiny_export.pt2"
NAMES: Final = [*EXPORTS, "golden"]


@pytest.fixture(scope="module")
def archives() -> dict[str, bytes]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = {name: _save(make()) for name, make in EXPORTS.items()}
    return {**made, "golden": GOLDEN.read_bytes()}


def _signature(data: bytes) -> ProgramSignature:
    program = ptfile.inspect(io.BytesIO(data)).program
    assert program is not None
    return program


def _torch_specs(specs: Any) -> list[tuple[str, str | None, str | None, Any]]:
    out = []
    for spec in specs:
        name = getattr(spec.arg, "name", None) or None  # a None output's name is ''
        out.append((spec.kind.name.lower(), name, spec.target,
                    getattr(spec, "persistent", None)))
    return out


def _ours(values: Any) -> list[tuple[str, str | None, str | None, Any]]:
    return [(v.kind, v.name, v.target, v.persistent) for v in values]


def _meta(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


@pytest.mark.parametrize("name", NAMES)
def test_specs_equal_torch_graph_signature(archives: dict[str, bytes], name: str) -> None:
    ep = torch.export.load(io.BytesIO(archives[name]))
    got = _signature(archives[name])
    assert _ours(got.inputs) == _torch_specs(ep.graph_signature.input_specs)
    assert _ours(got.outputs) == _torch_specs(ep.graph_signature.output_specs)
    assert got.parameters == list(ep.graph_signature.parameters)
    assert got.buffers == list(ep.graph_signature.buffers)
    assert got.constants == list(ep.graph_signature.lifted_tensor_constants)
    # the golden file says the build that wrote it (2.13.0+cpu); Python 3.13's torch is +cu130
    assert got.torch_version.split("+")[0] == torch.__version__.split("+")[0]


def _shape(value: Any) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape)


@pytest.mark.parametrize("name", NAMES)
def test_dtypes_and_shapes_equal_the_graph_meta(archives: dict[str, bytes], name: str) -> None:
    ep = torch.export.load(io.BytesIO(archives[name]))
    got = _signature(archives[name])
    placeholders = {n.name: _meta(n) for n in ep.graph.nodes if n.op == "placeholder"}
    output = next(n for n in ep.graph.nodes if n.op == "output")
    results = {a.name: _meta(a) for a in output.args[0] if isinstance(a, torch.fx.Node)}
    for value in (*got.inputs, *got.outputs):
        val = {**placeholders, **results}.get(value.name or "")
        if isinstance(val, torch.Tensor):
            assert value.type == "tensor"
            assert value.dtype == str(val.dtype).removeprefix("torch.")
            assert value.shape == _shape(val), value
            assert value.device == str(val.device)
        elif isinstance(val, torch.SymInt):
            assert value.type == "sym_int" and value.expr == str(val)


@pytest.mark.parametrize("name", NAMES)
def test_range_constraints_equal_torch(archives: dict[str, bytes], name: str) -> None:
    ep = torch.export.load(io.BytesIO(archives[name]))
    got = _signature(archives[name])
    expected = {str(k): (int(v.lower), None if not v.upper.is_finite else int(v.upper))
                for k, v in ep.range_constraints.items()}
    assert dict(got.range_constraints) == expected


class _Leaf(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


@pytest.mark.parametrize("name", NAMES)
def test_call_structure_is_torch_pytree_of_the_user_values(archives: dict[str, bytes],
                                                           name: str) -> None:
    ep = torch.export.load(io.BytesIO(archives[name]))
    got = _signature(archives[name])
    out_spec = ep.call_spec.out_spec
    labels = [_Leaf(v.label()) for v in got.user_outputs]
    assert got.returns == repr(tree_unflatten(labels, out_spec))
    args, kwargs = tree_unflatten([_Leaf(v.label()) for v in got.user_inputs],
                                  ep.call_spec.in_spec)
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    assert got.call == f"({', '.join(shown)})"
    sig = ep.module_call_graph[0].signature
    assert sig is not None and got.forward_arg_names == tuple(sig.forward_arg_names or ())


def test_a_mixed_call_reads_as_written(archives: dict[str, bytes]) -> None:
    got = _signature(archives["many"])
    assert got.call == "(x, [pair_0, pair_1], scale=scale)"
    assert got.returns == "(mul, {'sum': add, 'rows': sym_size_int_1, 'none': None})"
    by_name = {v.name: v for v in got.user_inputs}
    assert by_name["scale"].type == "float" and by_name["scale"].value == 3.0
    assert by_name["x"].shape == ("s77", 3) or isinstance(by_name["x"].shape[0], str)
    rows = next(v for v in got.user_outputs if v.name == "sym_size_int_1")
    assert rows.type == "sym_int" and rows.expr == by_name["x"].shape[0]  # type: ignore[index]


def test_a_joint_program_has_loss_and_gradients() -> None:
    from torch.export.experimental import _export_forward_backward
    model = torch.nn.Linear(2, 1)

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.lin(x).sum(),)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = _export_forward_backward(torch.export.export(Loss(), (torch.randn(3, 2),)))
        data = _save(ep)
    got = _signature(data)
    assert _ours(got.outputs) == _torch_specs(ep.graph_signature.output_specs)
    assert {v.kind for v in got.outputs} == {"loss_output", "gradient_to_parameter"}
    assert got.returns is None  # its outputs are not the call's: no structure shown


@pytest.mark.parametrize("expr", [
    sympy.Symbol("s0", positive=True, integer=True) + 1,
    2 * sympy.Symbol("s0", integer=True),
    sympy.Symbol("s0") - 1,
    5 - sympy.Symbol("s0"),
    sympy.Symbol("s0") * sympy.Symbol("s1"),
    2 * (sympy.Symbol("s0") + 1),
    sympy.Symbol("s0") ** 2,
    FloorDiv(sympy.Symbol("s0"), 2),
    Mod(sympy.Symbol("s0"), 3),
    sympy.Max(sympy.Symbol("s0"), sympy.Symbol("s1")),
])
def test_symbolic_sizes_print_as_torch_prints_them(expr: sympy.Expr) -> None:
    assert render_expr(sympy.srepr(expr), DEFAULT_LIMITS) == str(expr)


def test_unparseable_expressions_are_shown_as_they_are() -> None:
    assert render_expr("Foo(", DEFAULT_LIMITS) == "Foo("
    assert render_expr("a b", DEFAULT_LIMITS) == "a b"
    with pytest.raises(ptfile.LimitExceededError):
        render_expr("x" * 100, ptfile.Limits(max_name_length=10))


def test_cli_shows_the_signature(archives: dict[str, bytes], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from ptfile.cli import main
    path = tmp_path / "m.pt2"
    path.write_bytes(archives["many"])
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "forward(x, [pair_0, pair_1], scale=scale) -> (mul, {" in text
    assert "parameter        p_lin_weight: float32[2, 3] -> lin.weight" in text
    assert "user_input       scale: float = 3.0" in text
    assert main(["inspect", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["program"]["parameters"] == ["lin.weight", "lin.bias"]
    assert doc["program"]["inputs"][2] == {"kind": "user_input", "name": "x", "type": "tensor",
                                           "dtype": "float32", "shape": ["s77", 3],
                                           "device": "cpu", "requires_grad": False}


def test_only_a_pt2_has_a_program(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    report = ptfile.inspect(io.BytesIO(buf.getvalue()))
    assert report.program is None and "program" not in report.to_dict()


# --------------------------------------------------------------------------- malformed programs

def _program_json(data: bytes) -> tuple[str, dict[str, Any]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        name = next(n for n in z.namelist() if n.endswith("models/model.json"))
        return name, json.loads(z.read(name))


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner,
                                                                  max_size=2),
    max_leaves=4)


_SPECS = ("in_spec", "out_spec")


def _call_entry(doc: dict[str, Any]) -> dict[str, Any]:
    signature: dict[str, Any] = doc["graph_module"]["module_call_graph"][0]["signature"]
    return signature


@pytest.fixture(scope="module")
def documents(archives: dict[str, bytes]) -> list[tuple[dict[str, Any], list[list[Any]]]]:
    """Programs to mutate, the TreeSpec strings parsed (mutated as JSON too), with their
    paths grouped by section so that each section is mutated as often as the big ones."""
    out = []
    for name in ("many", "conv_bn_train", "constants", "derived"):
        doc = _program_json(archives[name])[1]
        doc["graph_module"]["graph"]["nodes"] = []  # not read: keep the mutations where it is
        for key in _SPECS:
            _call_entry(doc)[key] = json.loads(_call_entry(doc)[key])
        sections: dict[tuple[Any, ...], list[Any]] = {}
        for path in _paths(doc)[1:]:
            sections.setdefault(path[:3] if path[0] == "graph_module" else path[:1],
                                []).append(path)
        out.append((doc, list(sections.values())))
    return out


def _mutate(doc: dict[str, Any], path: tuple[Any, ...], data: st.DataObject) -> None:
    parent: Any = doc
    try:
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON_VALUES)
    except (KeyError, IndexError, TypeError):
        pass  # an earlier mutation removed the path


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_mutated_programs_raise_only_ptfile_errors(
        documents: list[tuple[dict[str, Any], list[list[Any]]]], data: st.DataObject) -> None:
    doc, sections = data.draw(st.sampled_from(documents))
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(doc, data.draw(st.sampled_from(data.draw(st.sampled_from(sections)))), data)
    try:
        entry = _call_entry(doc)
        for key in _SPECS:
            if key in entry and not isinstance(entry[key], str):
                entry[key] = json.dumps(entry[key])
    except (KeyError, IndexError, TypeError):
        pass
    try:
        parse_program(json.dumps(doc).encode(), "model", "models/model.json", DEFAULT_LIMITS)
    except ptfile.PtfileError:
        pass


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, 20_000), flip=st.integers(0, 20_000))
def test_damaged_program_text_raises_only_ptfile_errors(archives: dict[str, bytes], cut: int,
                                                        flip: int) -> None:
    raw = bytearray(json.dumps(_program_json(archives["many"])[1]).encode())
    raw[flip % len(raw)] ^= 0x20
    for text in (bytes(raw), bytes(raw[:cut % len(raw)])):
        try:
            parse_program(text, "model", "models/model.json", DEFAULT_LIMITS)
        except ptfile.PtfileError:
            pass


def _with_program(data: bytes, change: Callable[[dict[str, Any]], None] | bytes) -> bytes:
    member, doc = _program_json(data)
    if isinstance(change, bytes):
        raw = change
    else:
        change(doc)
        raw = json.dumps(doc).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, raw if info.filename == member else src.read(info))
    return out.getvalue()


def _deep_spec(depth: int) -> str:
    """A TreeSpec of ``depth`` nested lists (too deep for json.dumps to write)."""
    leaf = '{"type": null, "context": null, "children_spec": []}'
    opening = '{"type": "builtins.list", "context": "null", "children_spec": ['
    return "[1, " + opening * depth + leaf + "]}" * depth + "]"


@pytest.mark.parametrize(("change", "error", "match"), [
    (b"{", ptfile.FormatError, "not JSON"),
    (b"[]", ptfile.FormatError, "expected an object"),
    (lambda d: d["graph_module"]["signature"].pop("input_specs"), ptfile.FormatError,
     "input_specs"),
    (lambda d: d["graph_module"]["signature"]["input_specs"][0].update(extra={}),
     ptfile.FormatError, "union"),
    (lambda d: d["graph_module"]["graph"]["tensor_values"]["x"].update(sizes=[{"as_x": 1}]),
     ptfile.FormatError, "symbolic value"),
    (lambda d: d["graph_module"]["graph"]["tensor_values"]["x"].update(
        sizes=[{"as_int": 1}] * 65), ptfile.LimitExceededError, "max_ndim"),
    (lambda d: d["graph_module"]["module_call_graph"][0]["signature"].update(
        out_spec=_deep_spec(1200)), (ptfile.FormatError, ptfile.LimitExceededError),
     "not JSON|too deep|max_depth"),
    (lambda d: d["range_constraints"].update(s0={"min_val": "0"}), ptfile.FormatError,
     "min_val"),
    (lambda d: d["graph_module"]["graph"]["tensor_values"]["x"].update(
        sizes=[{"as_int": True}]), ptfile.FormatError, "as_int is not a int"),
])
def test_malformed_programs_raise_ptfile_errors(
        archives: dict[str, bytes], change: Callable[[dict[str, Any]], Any] | bytes,
        error: type[Exception] | tuple[type[Exception], ...], match: str) -> None:
    data = _with_program(archives["many"], change)
    ptfile.load(io.BytesIO(data))  # the weights do not depend on the program
    with pytest.raises(error, match=match):
        ptfile.inspect(io.BytesIO(data))


def test_a_program_over_the_size_ceiling_is_refused(archives: dict[str, bytes]) -> None:
    with pytest.raises(ptfile.LimitExceededError, match="max_pickle_bytes"):
        ptfile.inspect(io.BytesIO(archives["mlp"]), limits=ptfile.Limits(max_pickle_bytes=4096))


def test_an_unknown_spec_kind_is_shown_by_its_name(archives: dict[str, bytes]) -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["graph_module"]["signature"]["output_specs"].append({"future_kind": {"arg": {}}})
    got = _signature(_with_program(archives["mlp"], change))
    assert got.outputs[-1].kind == "future_kind" and got.returns is not None
