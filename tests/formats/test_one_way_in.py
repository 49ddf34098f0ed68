"""Issue 11, "one way in": every front door opens a checkpoint through formats/, once.

Regression tests for the drift the issue found between the copies of one decision:
the TorchScript storage loader that did not inflate, the legacy encoding that
``open`` and ``load`` chose differently, and the central directory parsed twice.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from ptfile.archive import ZipReader
from ptfile.formats import READERS, Format

torch.manual_seed(11)


def _jit_file() -> bytes:
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()))
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    return buf.getvalue()


def _deflated(data: bytes, pattern: str) -> bytes:
    """``data`` re-packed by Python's zipfile with every record whose name contains
    ``pattern`` deflated (what a ZIP tool that recompresses an archive writes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            method = zipfile.ZIP_DEFLATED if pattern in info.filename else zipfile.ZIP_STORED
            dst.writestr(info.filename, src.read(info), compress_type=method)
    return out.getvalue()


def _assert_state_dict_equal(ours: Any, theirs: dict[str, torch.Tensor]) -> None:
    assert list(ours) == list(theirs)
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(ours[name].numpy(), tensor.numpy(), err_msg=name)


@pytest.mark.parametrize("mmap", [False, True])
def test_issue_11_deflated_torchscript_storages_are_inflated(tmp_path: Path, mmap: bool) -> None:
    packed = _deflated(_jit_file(), "/data/")
    with zipfile.ZipFile(io.BytesIO(packed)) as z:  # the test's premise: really deflated
        assert any(i.compress_type == zipfile.ZIP_DEFLATED and i.compress_size < i.file_size
                   for i in z.infolist() if "/data/" in i.filename)
    path = tmp_path / "model.pt"
    path.write_bytes(packed)
    expected = torch.jit.load(str(path)).state_dict()
    _assert_state_dict_equal(ptfile.load(path, mmap=mmap), expected)
    _assert_state_dict_equal(ptfile.load_torchscript(path, mmap=mmap).state_dict(), expected)
    with ptfile.open(path) as ck:
        assert ck.format is Format.TORCHSCRIPT
        for name, tensor in expected.items():
            np.testing.assert_array_equal(ck.get_tensor(name), tensor.numpy())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_issue_11_deflated_torchscript_constants_are_inflated(tmp_path: Path) -> None:
    class WithConstant(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tensor([float(i) for i in range(16)])  # a traced constant

    with pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(WithConstant(), torch.zeros(16))
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    path = tmp_path / "const.pt"
    path.write_bytes(_deflated(buf.getvalue(), "/constants/"))
    (constant,) = ptfile.load_torchscript(path).constants
    np.testing.assert_array_equal(constant.numpy(), np.arange(16.0, dtype=np.float32))


def _legacy_with_key(key_opcode: bytes) -> bytes:
    """A legacy stream torch writes for ``{"a": tensor}``, its key re-spelled as ``key_opcode``
    (a Python 2 ``SHORT_BINSTRING``, which decodes with the load's ``encoding``)."""
    buf = io.BytesIO()
    torch.save({"a": torch.arange(3.0)}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    plain_key = b"X" + struct.pack("<I", 1) + b"a"
    assert data.count(plain_key) == 1
    return data.replace(plain_key, key_opcode)


def test_issue_11_open_decodes_legacy_strings_like_load() -> None:
    data = _legacy_with_key(b"U\x02\xc3\xa9")  # SHORT_BINSTRING 'é' in UTF-8 (torch's default)
    expected = torch.load(io.BytesIO(data), weights_only=True)
    assert list(expected) == ["é"]
    assert list(ptfile.load(io.BytesIO(data))) == ["é"]
    with ptfile.open(io.BytesIO(data)) as ck:  # it decoded as ASCII and raised
        assert list(ck.keys()) == ["é"]
        np.testing.assert_array_equal(ck.get_tensor("é"), expected["é"].numpy())


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = ZipReader.__init__

    def counting(self: ZipReader, *args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        real(self, *args, **kwargs)

    monkeypatch.setattr(ZipReader, "__init__", counting)
    return calls


@pytest.mark.parametrize("entry", ["load", "load_torchscript", "open", "detect_format"])
def test_issue_11_torchscript_directory_parsed_once(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path, entry: str) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(_jit_file())
    calls = _count_parses(monkeypatch)
    result = getattr(ptfile, entry)(path)
    if entry == "open":
        result.close()
    assert calls[0] == 1


def test_issue_11_every_readable_format_has_one_reader() -> None:
    assert set(READERS) == {Format.ZIP, Format.TORCHSCRIPT, Format.PT2, Format.LEGACY, Format.TAR,
                            Format.SAFETENSORS}
    with pytest.raises(ptfile.UnknownFormatError):
        ptfile.load(io.BytesIO(b"not a checkpoint at all" * 30))


def test_issue_11_open_inflates_compressed_records_like_load(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    ref = {"x": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(100, dtype=torch.bfloat16)}
    torch.save(ref, path)
    packed = tmp_path / "z.pt"
    packed.write_bytes(_deflated(path.read_bytes(), "/data/"))
    for mmap in (False, True):
        with ptfile.open(packed, mmap=mmap) as ck:  # it refused them: "compressed"
            np.testing.assert_array_equal(ck.get_tensor("x"), ref["x"].numpy())
            np.testing.assert_array_equal(ck.get_slice("x")[1:, ::2], ref["x"].numpy()[1:, ::2])
            assert ck.get_tensor("b").tobytes() == ref["b"].view(torch.int16).numpy().tobytes()
