"""Format detection from the bytes (never the file name), for every format torch.load reads."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import torch

import ptfile
from ptfile.formats import Format, detect
from ptfile.formats.legacy_pickle import LEGACY_MAGIC

GOLDEN = Path(__file__).parent.parent / "golden"


def test_detect_golden_files() -> None:
    assert ptfile.detect_format(GOLDEN / "tiny_tensor.pt") is Format.ZIP
    assert ptfile.detect_format(GOLDEN / "tiny_legacy.pt") is Format.LEGACY
    assert ptfile.detect_format(GOLDEN / "tiny_tar.pt") is Format.TAR
    assert ptfile.detect_format(GOLDEN / "tiny_bigendian.pt") is Format.ZIP


@pytest.mark.parametrize("protocol", range(6))
def test_detect_legacy_magic_in_every_pickle_protocol(protocol: int) -> None:
    head = pickle.dumps(LEGACY_MAGIC, protocol=protocol) + bytes(600)
    assert detect(head) is Format.LEGACY


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_detect_and_load_torch_legacy_files_of_every_protocol(protocol: int) -> None:
    buf = io.BytesIO()
    torch.save({"x": torch.arange(3)}, buf, _use_new_zipfile_serialization=False,
               pickle_protocol=protocol)
    assert ptfile.detect_format(io.BytesIO(buf.getvalue())) is Format.LEGACY
    assert ptfile.load(io.BytesIO(buf.getvalue()))["x"].numpy().tolist() == [0, 1, 2]


def test_detect_ignores_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes((GOLDEN / "tiny_legacy.pt").read_bytes())
    assert ptfile.detect_format(path) is Format.LEGACY
    assert len(ptfile.load(path)) == 2


def test_detect_torchscript() -> None:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 1)), buf)
    assert ptfile.detect_format(io.BytesIO(buf.getvalue())) is Format.TORCHSCRIPT


def test_detect_pt2_and_read_its_weights() -> None:
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    buf = io.BytesIO()
    torch.export.save(torch.export.export(Tiny(), (torch.zeros(1, 2),)), buf)
    assert ptfile.detect_format(io.BytesIO(buf.getvalue())) is Format.PT2
    assert list(ptfile.load(io.BytesIO(buf.getvalue()))) == ["lin.weight", "lin.bias"]


def test_detect_unknown_and_empty() -> None:
    assert ptfile.detect_format(io.BytesIO(b"hello")) is Format.UNKNOWN
    assert ptfile.detect_format(io.BytesIO(b"")) is Format.UNKNOWN
    assert detect(b"\x80\x02K\x01." + bytes(600)) is Format.UNKNOWN
