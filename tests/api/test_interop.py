"""Real torch 2.13 is the oracle: files torch writes load equal in ptfile, ptfile's saves are
byte-identical to torch's, and torch loads what ptfile writes."""

from __future__ import annotations

import collections
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, assert_sharing, ptfile_bytes, torch_bytes
from torch_objects import CASES

torch.manual_seed(0)



# Kinds assert_same does not compare structurally; they are checked field by field below.
SPECIAL = {"quantized", "sparse", "meta"}


@pytest.fixture(params=sorted(CASES))
def saved(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "ckpt.pt"
    torch.save(CASES[request.param](), path)
    return request.param, path


def test_interop_torch_file_loads_equal(saved: tuple[str, Path]) -> None:
    name, path = saved
    if name in SPECIAL:
        pytest.skip("compared in dedicated tests")
    expected = torch.load(path, weights_only=True)
    for mmap in (False, True):
        got = ptfile.load(path, mmap=mmap)
        assert_same(got, expected)
        assert_sharing(got, expected)


def test_interop_resave_is_byte_identical(saved: tuple[str, Path], tmp_path: Path) -> None:
    _, path = saved
    again = tmp_path / "again"
    again.mkdir()
    ptfile.save(ptfile.load(path), again / "ckpt.pt")
    assert (again / "ckpt.pt").read_bytes() == path.read_bytes()


def test_interop_resave_buffer_is_byte_identical(saved: tuple[str, Path]) -> None:
    _, path = saved
    obj = torch.load(path, weights_only=True)
    expected = io.BytesIO()
    torch.save(obj, expected)
    got = io.BytesIO()
    ptfile.save(ptfile.load(io.BytesIO(expected.getvalue())), got)
    assert got.getvalue() == expected.getvalue()


@pytest.mark.parametrize("shift", range(10))
@pytest.mark.parametrize("kind", [dict, collections.OrderedDict])
def test_interop_resave_identical_where_memo_indices_reach_256(
        shift: int, kind: type[dict[str, Any]]) -> None:
    # Each leading int item moves memo index 256 one PUT further into the tensors'
    # entries, so across the shifts it lands on every kind of PUT a tensor has
    # (key, storage key, pid, size, stride, OrderedDict, args, result): BINPUT
    # below 256, LONG_BINPUT from 256 on, on ptfile's inline writers as in torch's.
    obj = kind({f"p{i}": i for i in range(shift)})
    obj.update({f"layer.{i}.weight": torch.ones(2, 3)[:, i % 2:] for i in range(40)})
    expected = io.BytesIO()
    torch.save(obj, expected)
    got = io.BytesIO()
    ptfile.save(ptfile.load(io.BytesIO(expected.getvalue())), got)
    assert got.getvalue() == expected.getvalue()


def test_interop_quantized_parts(tmp_path: Path) -> None:
    path = tmp_path / "q.pt"
    torch.save(CASES["quantized"](), path)
    ref = torch.load(path)
    got = ptfile.load(path)
    pt = got["pt"]
    assert isinstance(pt, ptfile.QuantizedTensor)
    assert pt.qscheme == "per_tensor_affine" and pt.scale == ref["pt"].q_scale()
    assert pt.zero_point == ref["pt"].q_zero_point()
    assert np.array_equal(pt.int_repr.numpy(), ref["pt"].int_repr().numpy())
    assert np.allclose(pt.dequantize(), ref["pt"].dequantize().numpy())
    pc = got["pc"]
    assert np.array_equal(pc.scales.numpy(), ref["pc"].q_per_channel_scales().numpy())
    assert np.array_equal(pc.zero_points.numpy(), ref["pc"].q_per_channel_zero_points().numpy())
    assert pc.axis == 0
    assert np.allclose(pc.dequantize(), ref["pc"].dequantize().numpy())


def test_interop_sparse_parts(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    torch.save(CASES["sparse"](), path)
    ref = torch.load(path)
    got = ptfile.load(path)
    assert got["coo"].layout == "sparse_coo"
    assert np.array_equal(got["coo"].to_dense(), ref["coo"].to_dense().numpy())
    assert np.array_equal(got["coo"].indices.numpy(), ref["coo"]._indices().numpy())
    assert got["csr"].layout == "sparse_csr"
    assert np.array_equal(got["csr"].to_dense(), ref["csr"].to_dense().numpy())


def test_interop_meta_tensor(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save(CASES["meta"](), path)
    got = ptfile.load(path)
    assert got.storage is None and tuple(got.shape) == (3, 4) and got.stride() == (4, 1)
    with pytest.raises(ptfile.UnsupportedFeatureError):
        got.numpy()


def _numpy_views(x: np.ndarray) -> list[np.ndarray]:
    return [x, x[2:5], x.reshape(3, 4).T, x[::3]]


NUMPY_CASES: dict[str, Callable[[], Any]] = {
    "mixed": lambda: {"w": np.ones((2, 3), "float32"), "b": np.arange(4, dtype=np.int64),
                      "h": np.array([1.5, -2], np.float16), "flag": np.array(True),
                      "c": np.array([1 + 1j], np.complex64), "u16": np.array([1, 65535], np.uint16)},
    "views": lambda: _numpy_views(np.arange(12.0)),
    "negative": lambda: {"rev": np.arange(5.0)[::-1], "be": np.arange(3, dtype=">i4")},
    # 0-d arrays that need a native or aligned copy keep their shape () (they once became (1,))
    "zero_d": lambda: {"be": np.array(1.5, ">f4"), "be_int": np.array(3, ">i8"),
                       "native": np.array(2.0, "f4"),
                       "misaligned": np.frombuffer(bytearray(b"\0\0\0\xc0?"), "f4", 1, 1)
                       .reshape(())},
}


def _ml_dtypes_case() -> Any:
    import ml_dtypes
    return {"bf16": np.array([1.5, -2.0], ml_dtypes.bfloat16),
            "f8": np.array([0.5, 2.0], ml_dtypes.float8_e4m3fn)}


NUMPY_CASES["ml_dtypes"] = _ml_dtypes_case


@pytest.mark.parametrize("name", sorted(NUMPY_CASES))
def test_interop_numpy_save_loads_in_torch(name: str, tmp_path: Path) -> None:
    obj = NUMPY_CASES[name]()
    path = tmp_path / "np.pt"
    ptfile.save(obj, path)
    for loaded in (torch.load(path, weights_only=True), torch.load(path, mmap=True)):
        for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
            t = loaded[key]
            assert tuple(t.shape) == value.shape
            if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
                assert np.array_equal(t.float().numpy(), value.astype(np.float32))
            else:
                assert np.array_equal(t.numpy(), value)


def test_interop_numpy_views_share_one_storage(tmp_path: Path) -> None:
    x = np.arange(12.0)
    path = tmp_path / "v.pt"
    ptfile.save([x, x[2:5], x.reshape(3, 4).T], path)
    a, b, c = torch.load(path)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() \
        == c.untyped_storage().data_ptr()
    assert b.storage_offset() == 2 and c.stride() == (1, 4)
    a[3] = 100
    assert b[1] == 100


def test_interop_numpy_save_matches_torch_bytes(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32)
    ours, theirs = io.BytesIO(), io.BytesIO()
    ptfile.save({"x": x, "y": x[2:4]}, ours)
    tx = torch.arange(6, dtype=torch.float32)
    torch.save({"x": tx, "y": tx[2:4]}, theirs)
    assert ours.getvalue() == theirs.getvalue()


def test_interop_numpy_different_dtype_views_refused() -> None:
    x = np.zeros(4, np.float32)
    with pytest.raises(ptfile.SaveError, match="different types"):
        ptfile.save([x, x.view(np.int32)], io.BytesIO())


def test_interop_golden_examples(golden: Path) -> None:
    for name in ("tiny_tensor", "tiny_state_dict", "tiny_views", "tiny_dtypes",
                 "tiny_buffer_nocrc"):
        path = golden / f"{name}.pt"
        assert_same(ptfile.load(path), torch.load(path, weights_only=True))


def test_interop_golden_resave_identical(golden: Path, tmp_path: Path) -> None:
    for name in ("tiny_tensor", "tiny_state_dict", "tiny_views", "tiny_dtypes"):
        path = golden / f"{name}.pt"
        ptfile.save(ptfile.load(path), tmp_path / f"{name}.pt")
        assert (tmp_path / f"{name}.pt").read_bytes() == path.read_bytes()
    with ptfile.settings(crc32=False):
        out = io.BytesIO()
        ptfile.save(ptfile.load(golden / "tiny_buffer_nocrc.pt"), out)
    assert out.getvalue() == (golden / "tiny_buffer_nocrc.pt").read_bytes()


def test_interop_bigendian_golden(golden: Path) -> None:
    sd = ptfile.load(golden / "tiny_bigendian.pt")
    assert sd["f32"].numpy().tolist() == [1.0, 2.0]
    assert sd["i64"].numpy().tolist() == [1, 258]
    assert sd["u32"].numpy().tolist() == [1, 258]  # torch 2.13 gets this one wrong


def test_interop_sparse_out_of_range_index_is_storage_error(tmp_path: Path) -> None:
    # torch 2.13 writes this without complaint and crashes when using it; ptfile refuses it.
    bad = torch.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,), check_invariants=False)
    path = tmp_path / "bad_sparse.pt"
    torch.save(bad, path)
    with pytest.raises(ptfile.StorageError, match="out of range"):
        ptfile.load(path)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_interop_every_pickle_protocol_parses(protocol: int, tmp_path: Path) -> None:
    obj = {"w": torch.arange(4.0), "meta": {"n": 2**40, "name": "x" * 300, "t": (1, 2)},
           "b": b"\x00\x01", "v": torch.arange(4.0)[1:3]}
    path = tmp_path / f"p{protocol}.pt"
    torch.save(obj, path, pickle_protocol=protocol)
    got = ptfile.load(path)
    expected = torch.load(path, weights_only=False)
    assert_same(got, expected)
    assert_sharing(got, expected)


def test_interop_save_numpy_arrays_that_view_torch_tensors(tmp_path: Path) -> None:
    """``t.numpy()`` has a torch Tensor as its base: saving it used to raise TypeError."""
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert ptfile_bytes({"w": t.numpy()}) == torch_bytes({"w": t})
    ptfile.save({"row": t[1].numpy(), "col": t[:, 2].numpy()}, tmp_path / "v.pt")
    back = torch.load(tmp_path / "v.pt", weights_only=True)
    assert torch.equal(back["row"], t[1]) and torch.equal(back["col"], t[:, 2])
