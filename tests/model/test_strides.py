"""Contiguous strides with zero-size and one-element dimensions, in every format.

torch counts a size-0 dimension as 1 when it lays a tensor out (``torch.empty(3, 0)``
has stride ``(1, 1)``, not ``(0, 1)``).  Formats that record strides (torch.save's ZIP
and legacy files) give them back as written; formats that record only a shape
(safetensors, DCP) ask :func:`ptfile.model.tensor.contiguous_stride`.  Each case is
written by real torch and its ``stride()`` compared with what torch reads back.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ptfile
from ptfile.model.tensor import contiguous_stride

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

#: Zero-size and one-element dimensions, alone and mixed, and a scalar.
SHAPES = ((3, 0), (0, 3), (0, 0), (0,), (1,), (1, 4), (4, 1), (1, 1), (2, 1, 0, 3),
          (1, 0, 1), ())


def _state() -> dict[str, Any]:
    return {f"t{i}": torch.zeros(shape) for i, shape in enumerate(SHAPES)}


def _zip(state: dict[str, Any], where: Path) -> Path:
    torch.save(state, where / "a.pt")
    return where / "a.pt"


def _legacy(state: dict[str, Any], where: Path) -> Path:
    torch.save(state, where / "a.pt", _use_new_zipfile_serialization=False)
    return where / "a.pt"


def _safetensors(state: dict[str, Any], where: Path) -> Path:
    safetensors_torch.save_file(state, where / "a.safetensors")
    return where / "a.safetensors"


def _dcp(state: dict[str, Any], where: Path) -> Path:
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=where / "ckpt")
    return where / "ckpt"


def _torch_dcp(path: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(path, path.parent / "consolidated.pt")
    return dict(torch.load(path.parent / "consolidated.pt"))


WRITERS: dict[str, tuple[Callable[[dict[str, Any], Path], Path],
                         Callable[[Path], dict[str, Any]]]] = {
    "zip": (_zip, torch.load),
    "legacy": (_legacy, torch.load),
    "safetensors": (_safetensors, torch.load),
    "safetensors.torch": (_safetensors, safetensors_torch.load_file),
    "dcp": (_dcp, _torch_dcp),
}


@pytest.mark.parametrize("fmt", WRITERS)
def test_strides_match_torch(fmt: str, tmp_path: Path) -> None:
    """``load`` and ``open`` give each tensor the stride torch reads back."""
    write, read = WRITERS[fmt]
    path = write(_state(), tmp_path)
    expected = {name: tuple(t.stride()) for name, t in read(path).items()}
    assert len(expected) == len(SHAPES)
    loaded = (ptfile.load_dcp if fmt == "dcp" else ptfile.load)(path)
    assert {name: tuple(loaded[name].stride()) for name in expected} == expected
    with ptfile.open(path) as reader:
        assert {name: tuple(reader[name].stride()) for name in expected} == expected


@pytest.mark.parametrize("shape", SHAPES)
def test_contiguous_stride_is_torchs(shape: tuple[int, ...]) -> None:
    assert contiguous_stride(shape) == torch.empty(shape).stride()
