"""Issue 24, "one table": ``ptfile.open`` and ``ptfile.load`` go through one table of formats.

:data:`ptfile.formats.TABLE` names each readable format's reader (``load``) and, where
the format reads lazily, its opener (``open``).  The tests: every :class:`Format` has
one entry or none (and then both front doors refuse it alike), the reader and opener of
an entry come from the module it names, ``reader.py`` keeps no dispatch of its own, and
``open`` and ``load`` agree (names, dtypes, shapes, values, and with torch) on a file of
each format written by real torch (the tar one is the golden file: torch no longer
writes that format, it still reads it).
"""

from __future__ import annotations

import ast
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch

import ptfile
import ptfile.reader
from ptfile import formats
from ptfile._io.local import BytesSource
from ptfile.formats import OPENERS, READERS, TABLE, Detected, Format, ReadOptions
from ptfile.model.tree import flatten

torch.manual_seed(24)

#: The members that are not a file's format to read: a folder's, none, and one refused by
#: name (formats.REFUSALS).
NO_ENTRY = frozenset({Format.DCP, Format.SET, Format.ZERO, Format.UNKNOWN, Format.TORCHSCRIPT_JSON})


# --------------------------------------------------------------------------- the table

def test_every_format_has_exactly_one_entry_or_none() -> None:
    assert set(TABLE) == set(Format) - NO_ENTRY
    assert set(READERS) == set(TABLE)  # READERS is made from the table, nothing more
    assert set(OPENERS) == {fmt for fmt, entry in TABLE.items() if entry.opener is not None}
    assert set(OPENERS) >= {Format.ZIP, Format.PT2, Format.SAFETENSORS}
    for fmt, entry in TABLE.items():
        module = f"ptfile.formats.{entry.module}"
        assert (READERS[fmt].__module__, READERS[fmt].__name__) == (module, entry.reader)
        if entry.opener is not None:
            assert (OPENERS[fmt].__module__, OPENERS[fmt].__name__) == (module, entry.opener)
    # one module per format: two formats sharing one would be one entry written twice
    assert len({entry.module for entry in TABLE.values()}) == len(TABLE)


def test_reader_py_has_no_dispatch_of_its_own() -> None:
    """``reader.py`` names no format member: which format reads how is the table's."""
    tree = ast.parse(Path(ptfile.reader.__file__).read_text(encoding="utf-8"))
    named = [f"line {node.lineno}: Format.{node.attr}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "Format"]
    assert named == []


# --------------------------------------------------------------------------- files by torch

class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.scale = torch.nn.Parameter(torch.randn(3, 2).to(torch.float16))
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.scale.float().sum() + self.steps.sum()


def _state() -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float32)
    return {"w": torch.randn(4, 3), "bf": torch.randn(2, 5).to(torch.bfloat16),
            "i": torch.arange(7, dtype=torch.int32), "view": base[2:8].view(2, 3),
            "t": base.view(3, 4).t(), "flag": torch.tensor([True, False])}


def _zip(path: Path) -> dict[str, torch.Tensor]:
    torch.save(_state(), path)
    return dict(torch.load(path))


def _legacy(path: Path) -> dict[str, torch.Tensor]:
    torch.save(_state(), path, _use_new_zipfile_serialization=False)
    return dict(torch.load(path))


def _tar(path: Path) -> dict[str, torch.Tensor]:
    path.write_bytes((Path(__file__).parents[1] / "golden" / "tiny_tar.pt").read_bytes())
    loaded = torch.load(path, weights_only=False)
    return {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}


def _torchscript(path: Path) -> dict[str, torch.Tensor]:
    torch.jit.save(torch.jit.script(_Net()), str(path))
    return dict(torch.jit.load(str(path)).state_dict())


def _pt2(path: Path) -> dict[str, torch.Tensor]:
    torch.export.save(torch.export.export(_Net(), (torch.randn(2, 6),)), str(path))
    program = torch.export.load(str(path))
    return {**program.state_dict, **program.constants}


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    state = {k: v.contiguous() for k, v in _state().items()}
    safetensors.torch.save_file(state, str(path), metadata={"by": "torch"})
    return safetensors.torch.load_file(str(path))


#: A writer of each format in the table: the file, and what torch reads back from it.
WRITERS: dict[Format, Callable[[Path], dict[str, torch.Tensor]]] = {
    Format.ZIP: _zip, Format.LEGACY: _legacy, Format.TAR: _tar,
    Format.TORCHSCRIPT: _torchscript, Format.PT2: _pt2, Format.SAFETENSORS: _safetensors,
}


def test_every_entry_has_a_file_here() -> None:
    assert set(WRITERS) == set(TABLE)


def _opened(kind: str, path: Path) -> Any:
    if kind == "mapped":
        return ptfile.open(path)
    if kind == "read":
        return ptfile.open(path, mmap=False)
    return ptfile.open(io.BytesIO(path.read_bytes()))  # a file object: reads on demand


def _values(t: ptfile.Tensor | torch.Tensor) -> np.ndarray[Any, Any]:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return t.float().numpy() if t.dtype is torch.bfloat16 else t.numpy()
    array = t.numpy()
    return array.astype(np.float32) if t.dtype.name == "bfloat16" else array


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
@pytest.mark.parametrize("kind", ["mapped", "read", "file object"])
@pytest.mark.parametrize("fmt", list(WRITERS), ids=lambda f: f.value)
def test_open_and_load_agree(fmt: Format, kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{fmt.value}.bin"
    expected = WRITERS[fmt](path)
    assert ptfile.detect_format(path) is fmt
    loaded = flatten(ptfile.load(path))
    with _opened(kind, path) as ck:
        assert ck.format is fmt
        assert list(ck.keys()) == list(loaded)
        assert sorted(ck.keys()) == sorted(expected)
        for name, tensor in loaded.items():
            info = ck.info(name)
            assert (info.dtype, info.shape) == (tensor.dtype, tuple(tensor.shape)), name
            assert (info.stride, info.storage_offset) == (tensor.stride(),
                                                          tensor.storage_offset()), name
            assert repr(info.dtype) == str(expected[name].dtype), name
            values = _values(tensor)
            np.testing.assert_array_equal(values, _values(expected[name]), err_msg=name)
            np.testing.assert_array_equal(_values(ck[name]), values, err_msg=name)
            got = ck.get_tensor(name)
            np.testing.assert_array_equal(
                got.astype(np.float32) if info.dtype.name == "bfloat16" else got, values,
                err_msg=name)
        if fmt is Format.SAFETENSORS:
            assert ck.metadata() == {"by": "torch"}
        else:
            assert ck.metadata()["format"] == fmt.value


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("data", [b"", b"not a checkpoint at all", bytes(range(256))],
                         ids=["empty", "text", "bytes"])
def test_unknown_bytes_are_refused_alike_by_open_and_load(data: bytes) -> None:
    with pytest.raises(ptfile.PtfileError) as by_load:
        ptfile.load(io.BytesIO(data))
    with pytest.raises(ptfile.PtfileError) as by_open:
        ptfile.open(io.BytesIO(data))
    assert type(by_open.value) is type(by_load.value) is ptfile.UnknownFormatError
    assert str(by_open.value) == str(by_load.value)


@pytest.mark.parametrize("fmt", sorted(NO_ENTRY, key=lambda f: f.value), ids=lambda f: f.value)
def test_a_format_without_an_entry_is_refused_alike(fmt: Format) -> None:
    source = BytesSource(memoryview(b"\0" * 16), name="x")
    detected = Detected(fmt, b"\0" * 16)
    with pytest.raises(ptfile.PtfileError) as by_read:
        formats.read_detected(source, detected, ReadOptions())
    with pytest.raises(ptfile.PtfileError) as by_open:
        formats.open_detected(source, detected, ReadOptions())
    assert type(by_open.value) is type(by_read.value)
    assert str(by_open.value) == str(by_read.value)
    assert fmt.value in str(by_read.value) or fmt is Format.UNKNOWN \
        or str(by_read.value) == formats.REFUSALS[fmt]


def test_a_stream_from_a_file_object_is_read_whole_once() -> None:
    """A legacy stream given as a file object (reads on demand) is copied into memory by
    formats, and what ``open`` reads from is that copy."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf, _use_new_zipfile_serialization=False)
    with ptfile.open(io.BytesIO(buf.getvalue())) as ck:
        assert ck.format is Format.LEGACY
        assert isinstance(ck._source, BytesSource)
        assert ck.get_tensor("w").tolist() == [0.0, 1.0, 2.0, 3.0]
