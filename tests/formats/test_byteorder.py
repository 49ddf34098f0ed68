"""Big-endian checkpoints: read for every dtype (where torch 2.13 itself fails too), and write."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_tensor_equal

GOLDEN = Path(__file__).parent.parent / "golden"
TYPED = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
         torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex128, torch.complex64]
UNTYPED = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def swap_unit(dtype: torch.dtype) -> int:
    size = dtype.itemsize
    return size // 2 if dtype.is_complex else size


def sample(dtype: torch.dtype) -> torch.Tensor:
    values = torch.tensor([1.0, 2.5, -3.0, 258.0, 0.0, 65535.0])
    if dtype in (torch.uint16, torch.uint32, torch.uint64, torch.uint8, torch.bool):
        values = values.abs()
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


def big_endian_copy(data: bytes, units: list[int]) -> bytes:
    """What a big-endian host writes: the tests/golden/README.md recipe (byteorder 'big')."""
    zin = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            name = info.filename.split("/", 1)[1]
            payload = zin.read(info.filename)
            if name == ".data/serialization_id":
                continue
            if name == "byteorder":
                payload = b"big"
            if name.startswith("data/"):
                n = units[int(name[5:])]
                payload = b"".join(payload[i:i + n][::-1] for i in range(0, len(payload), n))
            zout.writestr("archive/" + name, payload)
    return out.getvalue()


def saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_byteorder_golden_file() -> None:
    ours = ptfile.load(GOLDEN / "tiny_bigendian.pt")
    assert ours["u32"].numpy().tolist() == [1, 258]  # torch 2.13 says [16777216, 33619968]
    assert ours["i64"].numpy().tolist() == [1, 258]
    assert ours["f32"].numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("dtype", TYPED + UNTYPED, ids=str)
def test_byteorder_big_endian_file_values_for_every_dtype(dtype: torch.dtype) -> None:
    x = sample(dtype)
    obj = {"x": x, "view": x[1:5].view(2, 2).t()}
    data = big_endian_copy(saved(obj), [swap_unit(dtype)])
    ours = ptfile.load(io.BytesIO(data))
    for name, tensor in obj.items():
        assert_tensor_equal(ours[name], tensor)
    assert ours["view"].storage is ours["x"].storage
    array = ours["x"].numpy()
    if array.dtype.kind in "biufc" and swap_unit(dtype) > 1:  # numpy holds it: a zero-copy view
        assert array.dtype.byteorder == ">"
        native = array.astype(array.dtype.newbyteorder("="))  # swapped on request
        assert native.dtype.isnative
        assert native.tolist() == array.tolist()
    if dtype in TYPED:  # torch swaps typed storages itself: the crafted file is right
        assert torch.equal(torch.load(io.BytesIO(data))["x"], x)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
def test_byteorder_untyped_dtypes_torch_gets_wrong(dtype: torch.dtype) -> None:
    x = sample(dtype)
    data = big_endian_copy(saved({"x": x}), [swap_unit(dtype)])
    assert not torch.equal(torch.load(io.BytesIO(data))["x"], x)  # pt-format.md §5, bug
    assert_tensor_equal(ptfile.load(io.BytesIO(data))["x"], x)


def test_byteorder_complex32_swaps_each_half() -> None:
    x = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex32)
    data = big_endian_copy(saved({"x": x}), [2])
    t = ptfile.load(io.BytesIO(data))["x"]
    assert t.dtype == ptfile.DTYPES["complex32"]
    assert t.storage.byteorder == "big"
    swapped = np.frombuffer(t.raw_bytes(), ">f2").astype("<f2").tobytes()
    assert swapped == x.view(torch.float16).numpy().tobytes()


NUMPY = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.int32, np.int16,
         np.uint8, np.bool_, np.complex64, np.uint16, np.uint32, np.uint64]


def test_byteorder_save_big_endian_loads_back_in_ptfile_and_torch() -> None:
    arrays = {np.dtype(t).name: (np.arange(6) % 5 + 1).astype(t) for t in NUMPY}
    arrays["view"] = arrays["float32"][2:5]
    buf = io.BytesIO()
    ptfile.save(arrays, buf, byteorder="big")
    data = buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.read("archive/byteorder") == b"big"
        assert z.read("archive/data/1") == arrays["float32"].astype(">f4").tobytes()
    ours = ptfile.load(io.BytesIO(data))
    theirs = torch.load(io.BytesIO(data))
    for name, array in arrays.items():
        assert np.array_equal(np.asarray(ours[name]).astype(array.dtype), array), name
        if name not in ("uint16", "uint32", "uint64"):  # torch's untyped-storage bug
            assert_tensor_equal(ours[name], theirs[name])
    assert ours["view"].storage is ours["float32"].storage


def test_byteorder_big_endian_file_resaved_little_for_torch() -> None:
    x = sample(torch.uint32)
    big = ptfile.load(io.BytesIO(big_endian_copy(saved({"x": x}), [4])))
    for legacy in (False, True):
        buf = io.BytesIO()
        ptfile.save(big, buf, byteorder="little", _use_new_zipfile_serialization=not legacy)
        if legacy:  # torch cannot read v3 dtypes from the legacy format; ptfile can
            assert_tensor_equal(ptfile.load(io.BytesIO(buf.getvalue()))["x"], x)
        else:
            assert torch.equal(torch.load(io.BytesIO(buf.getvalue()))["x"], x)


def test_byteorder_keyword_is_checked() -> None:
    with pytest.raises(ValueError, match="byteorder"):
        ptfile.save({}, io.BytesIO(), byteorder="middle")
    with pytest.raises(ValueError, match="little-endian only"):
        ptfile.save({}, io.BytesIO(), byteorder="big", _use_new_zipfile_serialization=False)


def test_byteorder_big_endian_torchscript_archive() -> None:
    module = torch.nn.Module()
    buffers = {"f32": sample(torch.float32), "u16": sample(torch.uint16),
               "i64": sample(torch.int64), "c64": sample(torch.complex64)}
    for name, value in buffers.items():
        module.register_buffer(name, value)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf)
    data = big_endian_copy(buf.getvalue(), [swap_unit(t.dtype) for t in buffers.values()])
    ours = ptfile.load(io.BytesIO(data))
    for name, value in buffers.items():
        assert_tensor_equal(ours[name], value)
