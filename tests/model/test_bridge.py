"""The torch bridge: zero-copy to_torch with sharing kept, and ptfile.save of torch tensors."""

from __future__ import annotations

import io
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from ptfile.model.torch import from_torch, to_torch


def _state() -> dict[str, object]:
    base = torch.arange(12.0).reshape(3, 4)
    return {"a": base, "b": base[1:, ::2], "p": torch.nn.Parameter(torch.ones(2)),
            "bf": torch.ones(3, dtype=torch.bfloat16),
            "f8": torch.tensor([0.5, 1.0]).to(torch.float8_e4m3fn),
            "c": torch.tensor([1 + 2j]).conj(), "n": [torch.tensor(7)], "meta": {"k": "v"}}


def test_save_of_torch_objects_is_byte_identical_to_torch_save() -> None:
    sd = _state()
    theirs, ours = io.BytesIO(), io.BytesIO()
    torch.save(sd, theirs)
    ptfile.save(sd, ours)
    assert ours.getvalue() == theirs.getvalue()


def test_save_keeps_a_module_state_dict_identical(tmp_path: Path) -> None:
    sd = torch.nn.Linear(3, 2).state_dict()
    torch.save(sd, tmp_path / "a.pt")
    ptfile.save(sd, tmp_path / "b.pt", archive_name="a")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()


@pytest.mark.parametrize("mmap", [True, False])
def test_to_torch_shares_memory_and_storages(tmp_path: Path, mmap: bool) -> None:
    path = tmp_path / "s.pt"
    torch.save(_state(), path)
    obj = ptfile.load(path, mmap=mmap)
    out = to_torch(obj)
    want = torch.load(path)
    for key in ("a", "b", "bf", "f8", "c"):
        assert torch.equal(out[key].resolve_conj(), want[key].resolve_conj()) or key == "f8"
        assert out[key].dtype == want[key].dtype
        assert out[key].stride() == want[key].stride()
    assert torch.equal(out["f8"].float(), want["f8"].float())
    assert out["c"].is_conj()
    assert out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()
    assert isinstance(out["p"], torch.nn.Parameter)
    assert out["p"].requires_grad
    assert out["n"][0].item() == 7
    assert out["meta"] == {"k": "v"}
    # zero-copy: the torch tensor views the ptfile storage's memory
    assert out["a"].data_ptr() == obj["a"].numpy().ctypes.data


def test_to_torch_map_location() -> None:
    buf = io.BytesIO()
    ptfile.save({"w": np.arange(3, dtype=np.float32)}, buf)
    obj = ptfile.load(io.BytesIO(buf.getvalue()))
    assert to_torch(obj, map_location="meta")["w"].device.type == "meta"
    assert to_torch(obj, map_location={"cpu": "meta"})["w"].device.type == "meta"
    assert to_torch(obj, map_location=lambda tag: "cpu")["w"].device.type == "cpu"
    if torch.cuda.is_available():
        moved = to_torch(obj, map_location="cuda:0")["w"]
        assert moved.device.type == "cuda"
        assert moved.cpu().tolist() == [0.0, 1.0, 2.0]


def test_to_torch_skip_data_gives_meta_tensors(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    torch.save({"w": torch.ones(2, 3)}, path)
    out = to_torch(ptfile.load(path, skip_data=True))
    assert out["w"].device.type == "meta"
    assert out["w"].shape == (2, 3)


def test_from_torch_leaves_plain_trees_alone() -> None:
    tree = {"a": [1, 2], "b": OrderedDict(x=np.ones(2))}
    assert from_torch(tree) is tree
    converted = from_torch({"t": torch.zeros(2), "s": torch.Size([1, 2]),
                            "d": torch.float16, "dev": torch.device("cpu")})
    assert isinstance(converted["t"], ptfile.Tensor)
    assert converted["s"] == (1, 2)
    assert converted["d"] is ptfile.DTYPES["float16"]
    assert str(converted["dev"]) == "cpu"


def test_core_never_imports_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, io, numpy as np, ptfile; b = io.BytesIO(); "
            "ptfile.save({'w': np.ones(2, 'f4')}, b); ptfile.load(io.BytesIO(b.getvalue())); "
            "ptfile.open(io.BytesIO(b.getvalue())).keys(); import ptfile.cli, ptfile.inspection; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_to_torch_rebuilds_quantized_and_sparse_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    obj = {
        "q8": torch.quantize_per_tensor(torch.randn(5), 0.1, 3, torch.quint8),
        "qi8": torch.quantize_per_tensor(torch.randn(2, 3), 0.05, -2, torch.qint8),
        "qc": torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                                         torch.tensor([1, 2]), 0, torch.quint8),
        "coo": torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3)),
        "coalesced": torch.sparse_coo_tensor([[0, 1], [2, 0]], [3.0, 4.0], (2, 3)).coalesce(),
        "csr": torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse_csr(),
        "csc": torch.tensor([[0.0, 1.0], [2.0, 3.0]]).to_sparse_csc(),
    }
    path = tmp_path / "special.pt"
    torch.save(obj, path)
    want, got = torch.load(path), to_torch(ptfile.load(path))
    for key in ("q8", "qi8", "qc"):
        assert got[key].is_quantized and got[key].qscheme() == want[key].qscheme()
        assert got[key].dtype == want[key].dtype
        assert torch.equal(got[key].int_repr(), want[key].int_repr())
        assert torch.equal(got[key].dequantize(), want[key].dequantize())
    for key in ("coo", "coalesced", "csr", "csc"):
        assert got[key].layout == want[key].layout
        if key in ("coo", "coalesced"):
            assert got[key].is_coalesced() == want[key].is_coalesced()
        assert torch.equal(got[key].to_dense(), want[key].to_dense())
