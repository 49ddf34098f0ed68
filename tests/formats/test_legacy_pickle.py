"""The legacy pickle stream (``_use_new_zipfile_serialization=False``), against torch 2.13."""

from __future__ import annotations

import collections
import io
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, assert_sharing
from ptfile.formats.legacy_pickle import LEGACY_MAGIC

GOLDEN = Path(__file__).parent.parent / "golden"
V2_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
             torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex128,
             torch.complex64]
V3_DTYPES = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
             torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def legacy_bytes(obj: Any, protocol: int = 2) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    return buf.getvalue()


def sample(dtype: torch.dtype, n: int = 6) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float32) * 1.5 - 3).to(dtype)


def test_legacy_golden_file_equals_torch() -> None:
    path = GOLDEN / "tiny_legacy.pt"
    ours, theirs = ptfile.load(path), torch.load(path)
    assert_same(ours, theirs)
    assert_sharing(ours, theirs)
    assert ptfile.detect_format(path) is ptfile.Format.LEGACY


@pytest.mark.parametrize("dtype", V2_DTYPES, ids=str)
def test_legacy_every_typed_dtype_equals_torch(dtype: torch.dtype) -> None:
    x = sample(dtype, 12)
    obj = {"x": x, "slice": x[2:5], "t": x.view(3, 4).t(), "expanded": x[:2].expand(3, 2),
           "scalar": x[0].clone(), "empty": torch.empty(0, 3, dtype=dtype)}
    data = legacy_bytes(obj)
    ours, theirs = ptfile.load(io.BytesIO(data)), torch.load(io.BytesIO(data))
    assert_same(ours, theirs)
    assert_sharing(ours, theirs)


@pytest.mark.parametrize("dtype", V3_DTYPES, ids=str)
def test_legacy_v3_dtypes_that_torch_cannot_reload(dtype: torch.dtype) -> None:
    x = sample(dtype)
    data = legacy_bytes({"x": x, "v": x[1:4]})
    with pytest.raises(AttributeError):  # torch 2.13's own limitation (pt-format.md §8)
        torch.load(io.BytesIO(data), weights_only=False)
    ours = ptfile.load(io.BytesIO(data))
    assert ours["x"].dtype == ptfile.DTYPES[str(dtype)[6:]]
    raw = x.view(torch.uint8).numpy().tobytes()
    assert ours["x"].numpy().tobytes() == raw
    assert ours["v"].storage is ours["x"].storage
    assert ours["v"].storage_offset() == 1


def test_legacy_module_state_dict_parameters_and_protocols() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    for protocol in (2, 3, 4, 5):
        for obj in (model.state_dict(), {"p": torch.nn.Parameter(torch.ones(2))}):
            data = legacy_bytes(obj, protocol)
            theirs = torch.load(io.BytesIO(data), weights_only=False)  # FRAME: not weights-only
            assert_same(ptfile.load(io.BytesIO(data)), theirs)


def test_legacy_mmap_path_and_skip_data(tmp_path: Path) -> None:
    x = torch.arange(10.0)
    path = tmp_path / "legacy.pt"
    torch.save({"x": x, "y": x[3:]}, path, _use_new_zipfile_serialization=False)
    ours = ptfile.load(path, mmap=True)
    assert_same(ours, torch.load(path))
    skipped = ptfile.load(path, skip_data=True)
    assert skipped["y"].shape == (7,)
    assert skipped["y"].storage.data is None


@pytest.mark.parametrize("weights_only", [True, False])
def test_legacy_written_by_ptfile_loads_in_torch(weights_only: bool) -> None:
    base = np.arange(12, dtype=np.float32)
    obj = {"a": base, "b": base[2:6], "c": [np.eye(2, dtype=np.float16)], "n": 3,
           "d": collections.OrderedDict(k=np.array([True, False]))}
    buf = io.BytesIO()
    ptfile.save(obj, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    assert data.startswith(pickle.dumps(LEGACY_MAGIC, protocol=2))
    theirs = torch.load(io.BytesIO(data), weights_only=weights_only)
    assert theirs["b"].untyped_storage().data_ptr() == theirs["a"].untyped_storage().data_ptr()
    assert np.array_equal(theirs["b"].numpy(), base[2:6])
    assert_same(ptfile.load(io.BytesIO(data)), theirs)


def test_legacy_torch_file_round_trips_through_ptfile() -> None:
    x = torch.randn(4, 5)
    src = legacy_bytes({"x": x, "xt": x.t(), "i": torch.arange(3)})
    buf = io.BytesIO()
    ptfile.save(ptfile.load(io.BytesIO(src)), buf, _use_new_zipfile_serialization=False)
    assert_same(ptfile.load(io.BytesIO(buf.getvalue())), torch.load(io.BytesIO(src)))
    # the header pickles are torch's, byte for byte
    header = src[: src.index(b"\x80\x02", 21 + 100)]
    assert buf.getvalue().startswith(header[:137])


# --------------------------------------------------------------------------- crafted files

class _Ref:
    def __init__(self, pid: tuple[Any, ...]) -> None:
        self.pid = pid


class _Tensor:
    """Pickles as torch._utils._rebuild_tensor_v2 of a storage reference, as old torch wrote."""

    def __init__(self, ref: _Ref, offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.args = (ref, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self) -> Any:
        return torch._utils._rebuild_tensor_v2, self.args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Ref) else None


def craft(obj: Any, keys: list[str], storages: list[bytes], counts: list[int]) -> bytes:
    out = io.BytesIO()
    for header in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                        "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(header, out, protocol=2)
    _Pickler(out, protocol=2).dump(obj)
    pickle.dump(keys, out, protocol=2)
    for data, count in zip(storages, counts, strict=True):
        out.write(struct.pack("<q", count) + data)
    return out.getvalue()


def test_legacy_view_metadata_storage_views_equal_torch() -> None:
    root = np.arange(8, dtype=np.float32)
    pid = ("storage", torch.FloatStorage, "root", "cpu", 8)
    view_a = _Ref((*pid, ("va", 2, 4)))
    view_b = _Ref((*pid, ("vb", 5, 3)))
    obj = {"a": _Tensor(view_a, 1, (2,), (1,)), "a2": _Tensor(view_a, 0, (2, 2), (2, 1)),
           "b": _Tensor(view_b, 0, (3,), (1,)), "whole": _Tensor(_Ref((*pid, None)), 0, (8,),
                                                                    (1,))}
    data = craft(obj, ["root"], [root.tobytes()], [8])
    ours, theirs = ptfile.load(io.BytesIO(data)), torch.load(io.BytesIO(data))
    assert_same(ours, theirs)
    assert ours["a"].storage is ours["a2"].storage
    assert ours["a"].numpy().tolist() == [3.0, 4.0]


def test_legacy_view_metadata_outside_its_root_is_a_storage_error() -> None:
    pid = ("storage", torch.FloatStorage, "root", "cpu", 4, ("v", 2, 3))
    data = craft({"a": _Tensor(_Ref(pid), 0, (1,), (1,))}, ["root"], [bytes(16)], [4])
    with pytest.raises(ptfile.StorageError, match="does not fit"):
        ptfile.load(io.BytesIO(data))


def _py2_str(text: bytes) -> bytes:
    return b"U" + bytes([len(text)]) + text  # SHORT_BINSTRING: a Python 2 str


def py2_legacy_file() -> bytes:
    """What Python 2 torch wrote: str as SHORT_BINSTRING, __builtin__ names, _rebuild_tensor."""
    s = _py2_str
    sys_info = (b"\x80\x02}(" + s(b"protocol_version") + b"M\xe9\x03" + s(b"little_endian")
                + b"\x88" + s(b"type_sizes") + b"}(" + s(b"short") + b"K\x02" + s(b"int")
                + b"K\x04" + s(b"long") + b"K\x04uu.")
    pid = b"(" + s(b"storage") + b"ctorch\nFloatStorage\n" + s(b"140") + s(b"cpu") + b"K\x03Nt"
    tensor = b"ctorch._utils\n_rebuild_tensor\n(" + pid + b"QK\x00K\x03\x85K\x01\x85tR"
    obj = (b"\x80\x02}(" + s(b"caf\xe9") + tensor + s(b"tags") + b"c__builtin__\nset\n]K\x01a"
           + b"\x85R" + s(b"name") + s(b"na\xefve") + b"u.")
    keys = b"\x80\x02]" + s(b"140") + b"a."
    data = struct.pack("<q3f", 3, 1.0, 2.0, 3.0)
    return legacy_bytes(0)[:21] + sys_info + obj + keys + data


def test_legacy_python2_pickle_with_latin1_strings_equals_torch() -> None:
    data = py2_legacy_file()
    theirs = torch.load(io.BytesIO(data), encoding="latin1")
    ours = ptfile.load(io.BytesIO(data), encoding="latin1")
    assert list(ours) == ["café", "tags", "name"] == list(theirs)
    assert_same(ours, theirs)
    as_bytes = ptfile.load(io.BytesIO(data), encoding="bytes")
    assert as_bytes[b"name"] == b"na\xefve"
    assert as_bytes[b"caf\xe9"].numpy().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ptfile.PtfileError):  # not UTF-8: torch's default fails too
        ptfile.load(io.BytesIO(data))


@pytest.mark.parametrize(("cut", "error"), [
    (lambda d: d.replace(b"\x8a\x0al", b"\x8a\x0am", 1), ptfile.FormatError),
    (lambda d: d.replace(b"M\xe9\x03", b"M\xea\x03", 1), ptfile.FormatError),
    (lambda d: d[:-1], ptfile.FormatError),
    (lambda d: d[:-12] + struct.pack("<q", 5) + d[-4:], ptfile.StorageError),
])
def test_legacy_damage_is_a_ptfile_error(cut: Any, error: type[Exception]) -> None:
    data = legacy_bytes(torch.tensor([1.0]))
    with pytest.raises(error):
        ptfile.load(io.BytesIO(cut(data)))


def test_legacy_key_list_must_name_the_used_storages() -> None:
    pid = ("storage", torch.FloatStorage, "k", "cpu", 1, None)
    data = craft({"a": _Tensor(_Ref(pid), 0, (1,), (1,))}, ["other"], [bytes(4)], [1])
    with pytest.raises(ptfile.StorageError, match="key list"):
        ptfile.load(io.BytesIO(data))


@pytest.mark.parametrize("dtype", V2_DTYPES, ids=str)
def test_legacy_ptfile_writes_every_typed_dtype_torch_reads(dtype: torch.dtype) -> None:
    x = sample(dtype, 8)
    src = ptfile.load(io.BytesIO(legacy_bytes({"x": x, "v": x[2:6].view(2, 2)})))
    buf = io.BytesIO()
    ptfile.save(src, buf, _use_new_zipfile_serialization=False)
    theirs = torch.load(io.BytesIO(buf.getvalue()))
    assert torch.equal(theirs["x"], x)
    assert torch.equal(theirs["v"], x[2:6].view(2, 2))
    assert_sharing(src, theirs)


class _CountingFile(io.BytesIO):
    bytes_read = 0

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.bytes_read += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        got = super().readinto(buffer)
        self.bytes_read += got
        return got


def test_legacy_skip_data_reads_the_pickles_only() -> None:
    data = legacy_bytes({"big": torch.zeros(1 << 20), "small": torch.arange(3)})
    f = _CountingFile(data)
    sd = ptfile.load(f, skip_data=True)
    assert sd["big"].shape == (1 << 20,)
    assert f.bytes_read < 100_000 < len(data)
