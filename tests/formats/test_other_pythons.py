"""Checkpoints torch 2.13 wrote on Python 3.10-3.13 (``tests/fixtures/pythons/``), read by ptfile
on this Python and compared with what this venv's torch reads from the same files.

A DCP ``.metadata`` is a plain pickle, so it names the classes of the Python that wrote it:
``pathlib.PosixPath`` up to 3.12, ``pathlib._local.PosixPath`` from 3.13 (issue 22).  torch on
a Python before 3.13 cannot import ``pathlib._local``; the oracle lends it that module for the
one load (:func:`_torch_reads_pathlib_local`), ptfile needs no such help.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ptfile
from oracle import assert_same, assert_sharing, torch_bits
from ptfile.cli import main
from ptfile.formats import policies

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pythons"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
FILES = ("state.pt", "state-legacy.pt")
DCP_DIRS = ("dcp", "dcp-nested")


def _fixture(python: str, name: str) -> Path:
    path = FIXTURES / python / name
    assert path.exists(), f"{path} is missing: run make_fixtures.py with Python {python}"
    return path


@contextlib.contextmanager
def _torch_reads_pathlib_local() -> Iterator[None]:
    """Let ``pickle`` in this process resolve ``pathlib._local.*`` as Python 3.13 does."""
    if sys.version_info >= (3, 13):
        yield
        return
    shim = types.ModuleType("pathlib._local")
    for name in ("PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath",
                 "WindowsPath"):
        setattr(shim, name, getattr(pathlib, name))
    with mock.patch.dict(sys.modules, {"pathlib._local": shim}):
        yield


def _torch_dcp(directory: Path, tmp_path: Path) -> Any:
    out = tmp_path / f"{directory.name}.pt"
    with _torch_reads_pathlib_local():
        dcp_to_torch_save(directory, out)
    return torch.load(out, weights_only=False)


def _flat(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested dict/list, under its dotted name."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(
        tree, (list, tuple)) else ()
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _assert_reader(reader: Any, expected: dict[str, torch.Tensor]) -> None:
    with reader:
        assert sorted(reader.keys()) == sorted(expected)
        for name, t in expected.items():
            got = np.asarray(reader.get_tensor(name))
            assert got.shape == tuple(t.shape), name
            assert got.tobytes() == torch_bits(t).tobytes(), name


def _assert_inspected(path: Path, expected: dict[str, torch.Tensor]) -> None:
    info = ptfile.inspect(path)
    got = {t.name: (t.dtype.name, tuple(t.shape)) for t in info.tensors}
    assert got == {k: (str(t.dtype).removeprefix("torch."), tuple(t.shape))
                   for k, t in expected.items()}


def _assert_scans_clean(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ptfile.scan(path).verdict is ptfile.Verdict.ALLOWED
    assert main(["scan", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "allowed"


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", FILES)
def test_torch_save_files_match_torch(python: str, name: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _fixture(python, name)
    expected = torch.load(path, weights_only=True)
    got = ptfile.load(path)
    assert_same(got, expected)
    assert_sharing(got, expected)
    assert got["model"]["f32_view"].storage is got["model"]["f32"].storage
    _assert_reader(ptfile.open(path), _flat(expected))
    _assert_inspected(path, _flat(expected))
    _assert_scans_clean(path, capsys)


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", DCP_DIRS)
def test_dcp_directories_match_torch(python: str, name: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    directory = _fixture(python, name)
    expected = _torch_dcp(directory, tmp_path)
    assert_same(ptfile.load_dcp(directory), expected)
    _assert_reader(ptfile.open(directory), _flat(expected))
    _assert_inspected(directory, _flat(expected))
    _assert_scans_clean(directory, capsys)


@pytest.mark.parametrize("python", PYTHONS)
def test_hf_writer_directories_match_torch(python: str) -> None:
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load

    directory = _fixture(python, "dcp-hf")
    reader = HuggingFaceStorageReader(str(directory))
    items = reader.read_metadata().state_dict_metadata
    expected = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)  # type: ignore[union-attr]
                for k, v in items.items()}
    dcp_load(expected, storage_reader=reader)
    got = ptfile.load_dcp(directory)
    assert sorted(got) == sorted(expected)
    for fqn, t in expected.items():
        assert_same(got[fqn], t)
    _assert_reader(ptfile.open(directory), expected)
    assert ptfile.scan(directory).verdict is ptfile.Verdict.ALLOWED


def _checkpoint_ids() -> dict[str, Any]:
    """What ``StorageMeta.checkpoint_id`` each fixture's ``.metadata`` holds, read by torch."""
    with _torch_reads_pathlib_local():
        return {python: pickle.loads(_fixture(python, "dcp/.metadata").read_bytes())
                .storage_meta.checkpoint_id for python in PYTHONS}


def test_the_pythons_name_their_paths_differently() -> None:
    """The fixtures hold both spellings, so the tests above cover both."""
    ids = _checkpoint_ids()
    assert {str(p) for p in ids.values()} == {"dcp"}
    for python in PYTHONS:
        data = _fixture(python, "dcp/.metadata").read_bytes()
        local = b"pathlib._local" in data
        assert local == (python >= "3.13"), python


@pytest.mark.parametrize(("module", "name", "parts", "shown"), [
    ("pathlib", "PosixPath", ("/", "tmp", "ck"), "/tmp/ck"),
    ("pathlib._local", "PosixPath", ("ck",), "ck"),
    ("pathlib", "WindowsPath", ("C:\\", "ck", "a"), "C:\\ck\\a"),
    ("pathlib._local", "WindowsPath", ("C:\\", "ck"), "C:\\ck"),
])
def test_every_python_spelling_of_a_checkpoint_path(module: str, name: str,
                                                    parts: tuple[str, ...], shown: str) -> None:
    assert policies.dcp()(module, name)(*parts) == shown


@pytest.mark.parametrize(("module", "name"), [
    ("pathlib._abc", "PathBase"), ("pathlib", "os"), ("pathlib._local", "os"),
    ("pathlib._local", "Path.__init__"), ("pathlib", "PosixPath.write_text"),
])
def test_other_pathlib_names_stay_refused(module: str, name: str) -> None:
    with pytest.raises(ptfile.UnsafeGlobalError):
        policies.dcp()(module, name)


def test_windows_written_metadata_loads(tmp_path: Path) -> None:
    """A ``.metadata`` as torch on Windows writes it (a ``WindowsPath`` checkpoint_id), made
    here from the 3.11 fixture: torch on POSIX cannot unpickle it, ptfile reads it."""

    class _WindowsPath:
        def __reduce__(self) -> tuple[Any, tuple[str, ...]]:
            return pathlib.WindowsPath, ("C:\\", "runs", "dcp")

    source = _fixture("3.11", "dcp")
    meta = pickle.loads((source / ".metadata").read_bytes())
    meta.storage_meta.checkpoint_id = _WindowsPath()
    directory = tmp_path / "dcp"
    directory.mkdir()
    (directory / ".metadata").write_bytes(pickle.dumps(meta))
    (directory / "__0_0.distcp").write_bytes((source / "__0_0.distcp").read_bytes())
    assert_same(ptfile.load_dcp(directory), _torch_dcp(source, tmp_path))
    with ptfile.open(directory) as reader:
        assert reader.meta.checkpoint_id == "C:\\runs\\dcp"
