"""The import graph of ``src/ptfile``: no cycles, and the layer order of STYLE.md §2.1.

    errors/limits/_io → archive, picklevm → dtypes/tensor/rebuild → formats → api/export → cli

Every module's imports are read with :mod:`ast` (nothing is imported), those
inside functions included; imports under ``if TYPE_CHECKING:`` are left out,
since they never run.  An edge ``a → b`` means module ``a`` imports module
``b`` (``from .x import name`` counts as importing ``x``, or ``x.name`` when
that is a module).  Two rules:

* no cycles between modules;
* a module imports only modules of its own layer or lower ones
  (:data:`LAYERS`), and ``archive/`` and ``picklevm/`` import nothing of each
  other or of torch's model: only the base layer and themselves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

SOURCE: Final = Path(__file__).resolve().parents[1] / "src" / "ptfile"

#: The base layer: what everything may use.
BASE: Final = 0
#: Layer of each module or package (the longest matching prefix decides), lowest first.
#: Modules STYLE.md does not name sit where what they do puts them.
LAYERS: Final[dict[str, int]] = {
    # 0: errors, ceilings, sources, settings, a GC helper: no knowledge of any format.
    "ptfile.errors": BASE,
    "ptfile.limits": BASE,
    "ptfile._io": BASE,
    "ptfile.config": BASE,  # torch's serialization settings, as plain data
    "ptfile._gc": BASE,  # pausing the cyclic GC while building many objects
    # 1: mechanism without torch knowledge: a ZIP reader/writer, a restricted pickle VM.
    "ptfile.archive": 1,
    "ptfile.picklevm": 1,
    # 2: torch's model: dtypes, tensors, the allowlist and its save-side inverse, policies.
    "ptfile.dtypes": 2,
    "ptfile.tensor": 2,
    "ptfile.rebuild": 2,
    "ptfile.reduction": 2,  # the save-side inverse of rebuild
    "ptfile.location": 2,  # location tags of storages
    "ptfile.policy": 2,  # which globals a pickle may name (find_class policies)
    "ptfile.numpy_globals": 2,  # inert rebuilders of numpy values (ptfile.NUMPY_GLOBALS)
    "ptfile.structural": 2,  # any pickle as an inert tree of the model's objects
    "ptfile.tree": 2,  # tensors of an object tree by state-dict name (flatten)
    # 3: the checkpoint formats: the one way in.
    "ptfile.formats": 3,
    "ptfile.formats.pt2_program": 3,  # a .pt2 program's signature (inspect)
    "ptfile.formats.pt2_json": 3,  # checked JSON and text rendering for it
    # 4: the front doors and what is built on them.
    "ptfile.api": 4,
    "ptfile.reader": 4,  # ptfile.open
    "ptfile.inspection": 4,  # inspect / verify / diff
    "ptfile.scanning": 4,  # ptfile.scan: the static scanner
    "ptfile.export": 4,  # conversions, the torch bridge (export.torch) among them
    "ptfile._dcp_files": 4,  # a DCP directory's files, local or by URL (uses _remote)
    "ptfile._dcp_hf": 4,  # HuggingFace-writer directories' metadata (formats.safetensors headers)
    "ptfile.dcp": 4,  # load_dcp and the DCP building blocks (items read with formats.read)
    "ptfile.dcp_reader": 4,  # ptfile.open on a DCP directory (TensorInfo of reader)
    "ptfile.opening": 4,  # ptfile.open: a file's reader or a DCP directory's
    "ptfile.dcp_writer": 4,  # save_dcp: DCP directories through the formats' ZIP writer
    "ptfile": 4,  # the package's public surface re-exports the front doors
    # 5: many files at once, on a local pool or Dask, built on the front doors.
    "ptfile.bulk": 5,
    # 6: the command line.
    "ptfile.cli": 6,
    "ptfile._cli_bulk": 6,  # the command line's bulk runs
    "ptfile.__main__": 6,
}
#: The torch-free mechanism packages: each may import only the base layer and itself.
MECHANISM: Final = ("ptfile.archive", "ptfile.picklevm")


def _module_name(path: Path) -> str:
    parts = ["ptfile", *path.relative_to(SOURCE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Final = {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, in functions too, but not under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from _import_nodes(ast.Module(body=child.orelse, type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _resolve(name: str) -> str | None:
    """The module ``name`` stands for: itself, or the package holding the attribute."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The ptfile modules ``module`` imports."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            resolved = _resolve(target) if target.split(".")[0] == "ptfile" else None
            if resolved is not None and resolved != module:
                found.add(resolved)
    return found


GRAPH: Final = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> int:
    best = max((prefix for prefix in LAYERS
                if module == prefix or module.startswith(prefix + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in {__file__}")
    return LAYERS[best]


def _mechanism(module: str) -> str | None:
    return next((p for p in MECHANISM if module == p or module.startswith(p + ".")), None)


def _cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component of more than one module (Tarjan), with one of
    its cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(component, _one_cycle(graph, set(component))) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a path back to it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & component):
                if other == start:
                    return [*paths[node], start]
                if other not in paths:
                    paths[other] = [*paths[node], other]
                    following.append(other)
        frontier = following
    raise AssertionError("a strongly connected component without a cycle")


def test_import_graph_sees_every_module() -> None:
    assert "ptfile.picklevm.lexer" in MODULES
    assert {"ptfile.errors", "ptfile.limits"} <= GRAPH["ptfile.picklevm._walk"]
    assert "ptfile.picklevm.opcodes" in GRAPH["ptfile.picklevm._walk"]
    for module in MODULES:
        _layer(module)  # every module has a layer


def test_import_graph_reader_sees_imports_in_functions_but_not_type_checking() -> None:
    # cli imports its subcommands' modules inside functions; formats/storages names
    # ZipInfo for annotations only.
    tree = ast.parse("import ptfile.errors\nif TYPE_CHECKING:\n    import ptfile.cli\n"
                     "def f():\n    from ptfile import api\n")
    names = [n.names[0].name for n in _import_nodes(tree)]
    assert names == ["ptfile.errors", "api"]


def test_import_graph_has_no_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"  {' -> '.join(cycle)}  (modules in the cycle: {', '.join(component)})"
        for component, cycle in cycles)


def test_import_graph_follows_the_layer_order() -> None:
    wrong = [f"  {module} (layer {_layer(module)}) -> {target} (layer {_layer(target)})"
             for module, targets in sorted(GRAPH.items())
             for target in sorted(targets)
             if _layer(target) > _layer(module)]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", MECHANISM)
def test_import_graph_keeps_the_mechanism_free_of_torch_knowledge(package: str) -> None:
    wrong = [f"  {module} -> {target}"
             for module, targets in sorted(GRAPH.items())
             if _mechanism(module) == package
             for target in sorted(targets)
             if _mechanism(target) != package and _layer(target) != BASE]
    assert not wrong, f"{package} imports beyond the base layer and itself:\n" + "\n".join(wrong)
