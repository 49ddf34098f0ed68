"""Conversions: safetensors (float8 included, shared storages explicit), npz, legacy → ZIP."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ptfile
from ptfile.export import dump, dump_npz, load_safetensors
from ptfile.export.convert import convert, target_kind
from ptfile.export.safetensors import plan, shard_name

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.int64, torch.int8, torch.uint8, torch.bool, torch.uint16, torch.complex64]


def _tensors(path: Path) -> dict[str, ptfile.Tensor]:
    with ptfile.open(path) as ck:
        return ck.load_tensors()


@pytest.fixture
def dtype_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    sd = {str(d).removeprefix("torch."): (torch.randn(3, 4) * 4).to(d) for d in DTYPES}
    sd["strided"] = torch.arange(20.0).reshape(4, 5)[:, 1::2]
    path = tmp_path / "dtypes.pt"
    torch.save(sd, path)
    return path, sd


def test_safetensors_every_dtype_equal_in_safetensors(tmp_path: Path,
                                                      dtype_file: tuple[Path, dict]) -> None:
    path, sd = dtype_file
    out = tmp_path / "out.safetensors"
    assert dump(_tensors(path), out) == {}
    loaded = load_file(out)
    assert set(loaded) == set(sd)
    for name, t in sd.items():
        assert loaded[name].dtype == t.dtype
        assert torch.equal(loaded[name].view(torch.uint8), t.contiguous().view(torch.uint8))


def test_safetensors_keeps_zero_d_shapes(tmp_path: Path) -> None:
    # A 0-d tensor is shape [] in safetensors, as safetensors.torch writes it (it was once
    # written as [1]: np.ascontiguousarray makes 0-d arrays 1-d).
    sd = {"scalar": torch.tensor(1.5), "step": torch.tensor(7), "w": torch.ones(2)[1]}
    torch.save(sd, tmp_path / "a.pt")
    convert(str(tmp_path / "a.pt"), str(tmp_path / "a.safetensors"), to="safetensors")
    loaded = load_file(tmp_path / "a.safetensors")
    for name, t in sd.items():
        assert loaded[name].shape == t.shape == ()
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)


def test_safetensors_back_to_pt_round_trips(tmp_path: Path,
                                            dtype_file: tuple[Path, dict]) -> None:
    path, sd = dtype_file
    st, pt = tmp_path / "a.safetensors", tmp_path / "b.pt"
    dump(_tensors(path), st)
    _, meta = load_safetensors(st)
    assert meta == {"format": "pt"}
    summary = convert(str(st), str(pt), to="pt")
    assert summary["tensors"] == len(sd)
    back = torch.load(pt)
    for name, t in sd.items():
        assert torch.equal(back[name].view(torch.uint8), t.contiguous().view(torch.uint8))


def test_shared_storage_policies(tmp_path: Path) -> None:
    base = torch.arange(6.0)
    path = tmp_path / "tied.pt"
    torch.save({"a": base, "tied": base, "part": base[2:4]}, path)
    tensors = _tensors(path)
    assert plan(tensors, "dedupe") == {"tied": "a"}
    assert plan(tensors, "copy") == {}
    with pytest.raises(ptfile.SaveError, match="share storage"):
        plan(tensors, "error")
    out = tmp_path / "tied.safetensors"
    assert dump(tensors, out) == {"tied": "a"}
    loaded = load_file(out)
    assert set(loaded) == {"a", "part"}
    assert loaded["part"].tolist() == [2.0, 3.0]
    pt = tmp_path / "tied_back.pt"
    convert(str(out), str(pt), to="pt")
    back = torch.load(pt)
    assert back["tied"].data_ptr() == back["a"].data_ptr()  # the alias comes back tied


def test_npz(tmp_path: Path, dtype_file: tuple[Path, dict]) -> None:
    path, sd = dtype_file
    out = tmp_path / "out.npz"
    dump_npz(_tensors(path), out, upcast=True)
    with np.load(out) as npz:
        np.testing.assert_array_equal(npz["float32"], sd["float32"].numpy())
        np.testing.assert_array_equal(npz["bfloat16"], sd["bfloat16"].float().numpy())
        np.testing.assert_array_equal(npz["strided"], sd["strided"].numpy())
        assert npz["float8_e4m3fn"].dtype == np.float32


def test_legacy_to_current_zip(tmp_path: Path, golden: Path) -> None:
    out = tmp_path / "new.pt"
    convert(str(golden / "tiny_legacy.pt"), str(out), to="pt")
    assert out.read_bytes()[:4] == b"PK\x03\x04"
    assert torch.load(out)[0].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("damage", [b"\xff" * 8, struct.pack("<Q", 10) + b"{not json}",
                                    struct.pack("<Q", 2) + b"[]",
                                    struct.pack("<Q", 60) + json.dumps(
                                        {"w": {"dtype": "F32", "shape": [4],
                                               "data_offsets": [0, 99]}}).encode().ljust(60)])
def test_damaged_safetensors_raise_ptfile_errors(tmp_path: Path, damage: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(damage)
    with pytest.raises(ptfile.PtfileError):
        load_safetensors(path)


def test_names() -> None:
    assert shard_name("pytorch_model-00001-of-00003.bin", "safetensors") == \
        "model-00001-of-00003.safetensors"
    assert target_kind("x.npz", "a.pt") == "npz"
    with pytest.raises(ptfile.UnsupportedFeatureError):
        target_kind("x.weird", "a.pt")


def test_unsupported_dtype_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"c": torch.zeros(2, dtype=torch.complex32)}, buf)
    path = tmp_path / "c32.pt"
    path.write_bytes(buf.getvalue())
    with pytest.raises(ptfile.UnsupportedFeatureError):
        dump(_tensors(path), tmp_path / "c.safetensors")
