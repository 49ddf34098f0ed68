"""The import graph of ``src/ptfile``: no cycles, and the layer order of STYLE.md §2.1.

    errors/limits/config/outcomes/_gc/_io → archive, picklevm → model → allowlist → formats
    → reader → dcp → api → scanning → inspection → export → bulk → cli

Every module's imports are read with :mod:`ast` (nothing is imported), those
inside functions included; imports under ``if TYPE_CHECKING:`` are left out,
since they never run.  An edge ``a → b`` means module ``a`` imports module
``b`` (``from .x import name`` counts as importing ``x``, or ``x.name`` when
that is a module).  The rules:

* every module belongs to exactly one entry of :data:`LAYERS` (a package, with
  all its modules, or a module); there is no fallback: an unlisted module fails;
* no cycles between modules, nor between the entries of :data:`LAYERS`
  (packages);
* a module imports only modules of its own layer or lower ones;
* the top level holds at most 12 modules; each package's ``__init__`` says
  what the package owns.
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
#: The layer of each package (with all its modules) or top-level module, lowest first.
LAYERS: Final[dict[str, int]] = {
    # 0: errors, ceilings, settings, exit codes, bytes in and out: no knowledge of any format.
    "ptfile": BASE,  # the package's face: the errors at import, every other name lazily
    "ptfile.errors": BASE,
    "ptfile.limits": BASE,
    "ptfile.config": BASE,  # torch's serialization settings, as plain data
    "ptfile.outcomes": BASE,  # the exit codes of every command
    "ptfile._gc": BASE,  # pausing the cyclic GC while building many objects
    "ptfile._lazy": BASE,  # package faces that import their names on first use
    "ptfile._io": BASE,  # local and remote sources, directories, atomic writes, progress
    # 1: mechanism without torch knowledge: ZIP and tar, a restricted pickle VM.
    "ptfile.archive": 1,
    "ptfile.picklevm": 1,
    # 2: torch's object model: dtypes, tensors, locations, selections, trees, the torch bridge.
    "ptfile.model": 2,
    # 3: which globals a pickle may name, and what they rebuild (and the save-side inverse).
    "ptfile.allowlist": 3,
    # 4: each checkpoint format's one reader (and writer).
    "ptfile.formats": 4,
    # 5: ptfile.open's reader of one file.
    "ptfile.reader": 5,
    # 6: distributed checkpoints, built on the formats and the file reader.
    "ptfile.dcp": 6,
    # 6: checkpoint sets (a .bin model folder, a trainer folder), read part by part with
    # the file reader and, for a safetensors model part, the DCP readers.
    "ptfile.sets": 6,
    # 6: DeepSpeed ZeRO checkpoints, beside DCP: rank pieces assembled tensor by tensor.
    "ptfile.zero": 6,
    # 7..10: the front doors, in the order they build on each other.
    "ptfile.api": 7,  # load, save, open, detect_format
    "ptfile.scanning": 8,  # scan
    "ptfile.inspection": 9,  # inspect, verify, diff (through open)
    "ptfile.export": 10,  # conversions (through load and open)
    # 11: many files at once, on a local pool or Dask.
    "ptfile.bulk": 11,
    # 12: the command line.
    "ptfile.cli": 12,
    "ptfile.__main__": 12,
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


def _entry(module: str) -> str:
    """The entry of :data:`LAYERS` that ``module`` belongs to: itself, or its package
    (the package ``ptfile`` holds only itself: it is no fallback)."""
    for entry in LAYERS:
        if module == entry or (entry != "ptfile" and module.startswith(entry + ".")):
            return entry
    raise AssertionError(f"{module} has no layer: add it (or its package) to LAYERS in "
                         f"{__file__}")


def _layer(module: str) -> int:
    return LAYERS[_entry(module)]


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


def test_import_graph_has_no_cycles_between_packages() -> None:
    packages = {entry: set() for entry in LAYERS}
    for module, targets in GRAPH.items():
        packages[_entry(module)] |= {_entry(target) for target in targets} - {_entry(module)}
    cycles = _cycles(packages)
    assert not cycles, "import cycles between packages:\n" + "\n".join(
        f"  {' -> '.join(cycle)}" for _, cycle in cycles)


def test_import_graph_entries_are_what_exists() -> None:
    # A LAYERS entry naming nothing would hide a renamed package from the rules above.
    assert sorted(entry for entry in LAYERS if entry not in MODULES) == []


def test_layout_keeps_the_top_level_small_and_says_what_each_package_owns() -> None:
    top = sorted(path.name for path in SOURCE.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules at the top level of src/ptfile: {top}"
    for init in sorted(SOURCE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init.relative_to(SOURCE)} has no docstring saying what its package owns"
