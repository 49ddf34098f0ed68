"""Sources are told apart by what they can do, never by their class.

Every reader above ``ptfile._io`` asks a :class:`~ptfile._io.local.Source` for its
capabilities (``reads_on_demand``, ``map_access``, ``bytes_fetched``, ``gather``);
a directory of files (:class:`~ptfile._io.directory.DirectoryFiles`) holds one source
per file, mapped without a descriptor of its own.
"""

from __future__ import annotations

import ast
import os
import warnings
from pathlib import Path

import pytest

import ptfile
from ptfile._io.directory import DirectoryFiles
from ptfile._io.local import BytesSource, MmapSource

SRC = Path(ptfile.__file__).parent
#: The source classes (``Window`` is the scanner's view of part of a source).
SOURCE_CLASSES = {"BytesSource", "FileSource", "MmapSource", "RemoteSource", "Window"}


def _class_tests(tree: ast.AST) -> list[int]:
    """Lines of ``isinstance(x, <a source class>)`` (or a tuple holding one)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1]
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(isinstance(n, ast.Name) and n.id in SOURCE_CLASSES for n in names):
                found.append(node.lineno)
    return found


def test_no_module_tests_a_sources_class() -> None:
    found = {str(path.relative_to(SRC)): lines for path in sorted(SRC.rglob("*.py"))
             if (lines := _class_tests(ast.parse(path.read_text(encoding="utf-8"))))}
    assert found == {}


def test_the_class_test_finder_finds_one() -> None:
    tree = ast.parse("isinstance(s, (BytesSource, int))\nisinstance(s, MmapSource)\n"
                     "isinstance(s, bytes)\n")
    assert _class_tests(tree) == [1, 2]


def test_sources_say_what_they_can_do(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(200)))
    in_memory = BytesSource(path.read_bytes())
    mapped, bare = MmapSource(path, "r"), MmapSource(path, "r", descriptor=False)
    try:
        for source in (in_memory, mapped, bare):
            assert not source.reads_on_demand and source.bytes_fetched == 0
        assert (in_memory.map_access, mapped.map_access, bare.map_access) == (None, "r", "r")
        assert in_memory.gather([3], [2]) is None  # slices are the cheap read in memory
        if hasattr(os, "pread"):
            assert mapped.gather([3, 100], [2, 1]) == bytes([3, 4, 100])
        assert bare.gather([3], [2]) is None  # no descriptor: the caller slices the map
        assert bytes(bare.view(3, 2, "two bytes")) == bytes([3, 4])
    finally:
        for source in (mapped, bare):
            source.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_directory_files_map_each_file_with_one_descriptor(tmp_path: Path) -> None:
    """A folder's files are mapped without a descriptor of their own (the map keeps one):
    a DCP folder of many rank files opens one descriptor per file, not two."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = {f"w{i}": torch.full((4,), float(i)) for i in range(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path,
                                                            single_file_per_rank=False))
    names = [n for n in os.listdir(tmp_path) if n.endswith(".distcp")]
    assert len(names) == 3
    with DirectoryFiles(tmp_path) as files:
        before = _open_descriptors()
        sizes = {name: files.size(name) for name in names}
        assert _open_descriptors() - before == len(names)
        assert sizes == {name: (tmp_path / name).stat().st_size for name in names}
        first = names[0]
        assert bytes(files.read(first, 1, 5, "five bytes")) == \
            (tmp_path / first).read_bytes()[1:6]
        assert files.read(first, 0, 0, "nothing") == b""
        assert files.bytes_fetched == 0 and files.bytes_read == 5
    assert _open_descriptors() == before  # closed: no view of the maps lives
    loaded = ptfile.load_dcp(tmp_path)
    assert {k: v.numpy().tolist() for k, v in loaded.items()} == \
        {k: v.tolist() for k, v in state.items()}
