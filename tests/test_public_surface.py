"""The public surface: every name the documentation uses stays importable from where it is
used.

The names are read from the docs themselves, never listed here: in every ```python block
of README.md and docs/**/*.md (doctest blocks by their ``>>>`` sources), each
``import ptfile.x``, ``from ptfile.x import y`` and each attribute chain rooted at a name
such an import bound (``ptfile.load``, ``ptfile.formats.ReadOptions``, ``st.dump`` after
``import ptfile.export.safetensors as st``); and each mkdocstrings directive
(``::: ptfile.scanning``).  Each must resolve as Python resolves it: a module imported,
then attributes, then submodules.  Renaming or moving a documented name fails here, with
the page and line that uses it.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import re
from pathlib import Path

import pytest

from test_docs import PAGES, ROOT, parse_blocks

DIRECTIVE = re.compile(r"^:::\s+(?P<name>ptfile(?:\.\w+)*)\s*$", re.MULTILINE)


def _source(text: str) -> str:
    """A block's Python: a doctest block's ``>>>`` sources, else the block itself."""
    if ">>>" not in text:
        return text
    return "".join(example.source for example in doctest.DocTestParser().get_examples(text))


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def used_names(source: str, bound: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of each ptfile name ``source`` imports or uses; ``bound``
    maps the names earlier imports bound to what they name (updated as imports go).
    Raises SyntaxError for a fragment that is not Python."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree)
               for child in ast.iter_child_nodes(node)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ptfile":
                    found.append((node.lineno, alias.name))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["ptfile"] = "ptfile"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "ptfile":
            for alias in node.names:
                found.append((node.lineno, f"{node.module}.{alias.name}"))
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):  # each attribute chain once, from its outermost node
        if isinstance(node, ast.Attribute) and not isinstance(parents.get(id(node)),
                                                                ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in bound:
                found.append((node.lineno, ".".join([bound[chain[0]], *chain[1:]])))
    return found


def resolve(dotted: str) -> object:
    """The object ``dotted`` names, found as an import statement and attribute access would
    find it; raises ImportError or AttributeError when it names nothing."""
    parts = dotted.split(".")
    found: object = importlib.import_module(parts[0])
    for at, part in enumerate(parts[1:], start=2):
        if hasattr(found, part):
            found = getattr(found, part)
        else:
            found = importlib.import_module(".".join(parts[:at]))
    return found


def page_names(page: Path) -> list[tuple[str, str]]:
    """``(where, dotted name)`` of each ptfile name the page uses (module docstring)."""
    text = page.read_text(encoding="utf-8")
    found = [(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}",
              match["name"]) for match in DIRECTIVE.finditer(text)]
    bound: dict[str, str] = {}
    for block in parse_blocks(page):
        if block.lang != "python":
            continue
        try:
            names = used_names(_source(block.text), bound)
        except SyntaxError:  # a fragment: test_docs runs the blocks, this reads names only
            continue
        found += [(f"{block.where}+{line}", name) for line, name in names]
    return found


PAGE_NAMES = {str(page.relative_to(ROOT)): page_names(page) for page in PAGES}


@pytest.mark.parametrize("page", sorted(p for p, names in PAGE_NAMES.items() if names))
def test_every_name_the_docs_use_is_importable_there(page: str) -> None:
    missing = []
    for where, name in PAGE_NAMES[page]:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{where}: {name} ({type(exc).__name__}: {exc})")
    assert missing == []


def test_the_docs_use_the_front_doors() -> None:
    """The reader sees the names a reader of the docs meets first (a parser that found
    nothing would pass the test above)."""
    used = {name for names in PAGE_NAMES.values() for _, name in names}
    assert {"ptfile.load", "ptfile.save", "ptfile.open", "ptfile.scan"} <= used
    assert any(name.startswith("ptfile.export.") for name in used)
    assert len(used) > 50


def test_a_name_that_moved_is_reported() -> None:
    bound: dict[str, str] = {}
    source = ("import ptfile\nfrom ptfile.archive import ZipReader\n"
              "import ptfile.formats as fm\nptfile.load\nfm.ReadOptions.policy\n"
              "ptfile.no_such_name(1)\n")
    names = [name for _, name in used_names(source, bound)]
    assert names == ["ptfile", "ptfile.archive.ZipReader", "ptfile.formats", "ptfile.load",
                     "ptfile.formats.ReadOptions.policy", "ptfile.no_such_name"]
    assert resolve("ptfile.formats.ReadOptions") is not None
    with pytest.raises((ImportError, AttributeError)):
        resolve("ptfile.no_such_name")
    with pytest.raises(ImportError):
        resolve("ptfile.archive.sink.DirectSink")  # moved to ptfile._io.sink
