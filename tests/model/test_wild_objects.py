"""Objects from the wild (issue 29 item 5): numpy scalars written by ``ptfile.save`` byte for
byte as ``torch.save`` writes them, tensors with Python attributes (DeepSpeed ZeRO-3's
``ds_id``, ``ds_shape``…), and a DCP checkpoint's numpy items, each against torch 2.13.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

import ptfile
from numpy_oracle import assert_same, resolve, torch_asks
from ptfile.cli import main as cli_main
from ptfile.model.torch import to_torch


def torch_bytes(obj: object, **options: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **options)
    return buffer.getvalue()


def ptfile_bytes(obj: object, **options: Any) -> bytes:
    buffer = io.BytesIO()
    ptfile.save(obj, buffer, **options)
    return buffer.getvalue()


def numpy_load(data: bytes) -> Any:
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        return ptfile.load(io.BytesIO(data))


# -- numpy scalars and dtypes written as torch.save writes them ----------------------------
NUMPY_OBJECTS = {
    "float64": np.float64(0.5),
    "int64": np.int64(3),
    "float32": np.float32(1.5),
    "bool": np.bool_(True),
    "mean": np.mean(np.arange(4.0)),
    "dict": {"lr": np.float64(0.5), "momentum": np.float64(0.25), "step": np.int64(7),
             "flags": [np.bool_(True), np.bool_(True), np.bool_(False)],
             "nested": {"beta": (np.float32(0.9), np.float32(0.999))}},
    "kinds": (np.uint16(7), np.int8(-1), np.complex64(1 - 2j), np.float16(2), np.bytes_(b"xy"),
              np.str_("tok"), np.datetime64("2020-01-01"), np.timedelta64(3, "ms"),
              np.longdouble(2.5)),
    "dtypes": [np.dtype("f8"), np.dtype(">i4"), np.dtype("M8[ms]"), np.dtype("U3")],
}


@pytest.mark.parametrize("name", sorted(NUMPY_OBJECTS))
@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_save_numpy_scalars_byte_equal_to_torch(name: str, protocol: int) -> None:
    obj = NUMPY_OBJECTS[name]
    data = ptfile_bytes(obj, pickle_protocol=protocol)
    assert data == torch_bytes(obj, pickle_protocol=protocol)
    assert_same(torch.load(io.BytesIO(data), weights_only=False), obj)
    assert_same(numpy_load(data), obj)


def test_save_numpy_scalars_beside_tensors_and_legacy() -> None:
    obj = {"w": torch.arange(4.0), "lr": np.float64(1e-3), "step": np.int64(9)}
    assert ptfile_bytes(obj) == torch_bytes(obj)
    legacy = ptfile_bytes(obj, _use_new_zipfile_serialization=False)
    loaded = torch.load(io.BytesIO(legacy), weights_only=False)
    assert torch.equal(loaded.pop("w"), obj["w"])
    assert_same(loaded, {"lr": obj["lr"], "step": obj["step"]})


def test_numpy_scalars_load_in_torch_with_safe_globals(tmp_path: Path) -> None:
    obj = NUMPY_OBJECTS["dict"]
    path = tmp_path / "x.pt"
    path.write_bytes(ptfile_bytes(obj))
    with pytest.raises(pickle.UnpicklingError, match="scalar"):
        torch.load(path, weights_only=True)  # torch's weights-only default refuses them
    with pytest.raises(ptfile.UnsafeGlobalError, match="NUMPY_GLOBALS"):
        ptfile.load(path)  # and so does ptfile's
    names = torch_asks(path)
    assert {"numpy._core.multiarray.scalar", "numpy.dtype"} <= set(names)
    with torch.serialization.safe_globals([resolve(n) for n in names]):
        assert_same(torch.load(path, weights_only=True), obj)
    assert_same(numpy_load(path.read_bytes()), obj)


@pytest.mark.parametrize("value", [np.void(b"ab"), np.dtype([("a", "f4")]),
                                   np.dtype("f8", metadata={"k": 1}), np.dtype("O")],
                         ids=["void", "structured", "metadata", "object"])
def test_save_refuses_numpy_values_ptfile_cannot_read_back(value: object) -> None:
    with pytest.raises(ptfile.SaveError, match="plain numpy dtypes"):
        ptfile_bytes({"v": value})


# -- tensors with Python attributes ------------------------------------------------------------
def with_attributes(t: torch.Tensor, **attributes: Any) -> torch.Tensor:
    for name, value in attributes.items():
        setattr(t, name, value)
    return t


def zero3_like() -> dict[str, Any]:
    """A tensor and parameters with attributes of the kinds DeepSpeed ZeRO-3 sets."""
    values = {"ds_id": 3, "ds_name": "layer.weight", "ds_shape": torch.Size([2, 3]),
              "ds_tensor_shape": (6,), "ds_persist": False, "ds_list": [1, (2, "x")],
              "ds_none": None, "ds_dict": {"a": 1.5}}
    return {
        "t": with_attributes(torch.arange(6.0).reshape(2, 3), **values),
        "p": with_attributes(torch.nn.Parameter(torch.ones(2)), ds_id=7,
                             ds_shape=torch.Size([2]), ds_status="AVAILABLE"),
        "g": with_attributes(torch.zeros(3, requires_grad=True), extra=5),
        "plain": torch.ones(1),
        "list": [with_attributes(torch.ones(2), ds_id=1), with_attributes(torch.ones(2),
                                                                          ds_id=2)],
    }


def expected_attributes(t: torch.Tensor) -> dict[str, Any]:
    return dict(t.__dict__)


def assert_attributes(p: Any, t: torch.Tensor) -> None:
    assert dict(p.attributes).keys() == expected_attributes(t).keys()
    for name, value in expected_attributes(t).items():
        got = p.attributes[name]
        if isinstance(value, torch.Size):
            assert isinstance(got, ptfile.Size) and tuple(got) == tuple(value)
        else:
            assert type(got) is type(value) and got == value


def test_tensor_attributes_load_as_torch_loads_them(tmp_path: Path) -> None:
    obj = zero3_like()
    path = tmp_path / "zero.pt"
    torch.save(obj, path)
    expected = torch.load(path, weights_only=True)
    for loaded in (ptfile.load(path), ptfile.load(path, mmap=False)):
        for key in ("t", "p", "g", "plain"):
            assert_attributes(loaded[key], expected[key])
        for got, want in zip(loaded["list"], expected["list"], strict=True):
            assert_attributes(got, want)
        assert loaded["g"].requires_grad and loaded["p"].is_parameter
        np.testing.assert_array_equal(loaded["t"].numpy(), expected["t"].numpy())
    with ptfile.open(path) as reader:
        assert_attributes(reader["t"], expected["t"])
        assert reader.get_tensor("t").shape == (2, 3)


def test_tensor_attributes_top_level_and_legacy(tmp_path: Path) -> None:
    t = with_attributes(torch.ones(3), extra=5, ds_shape=torch.Size([3]))
    for options in ({}, {"_use_new_zipfile_serialization": False}):
        data = torch_bytes(t, **options)
        loaded = ptfile.load(io.BytesIO(data))
        assert_attributes(loaded, torch.load(io.BytesIO(data), weights_only=True))
        again = torch.load(io.BytesIO(ptfile_bytes(loaded, **options)), weights_only=True)
        assert again.extra == 5 and again.ds_shape == torch.Size([3])


@pytest.mark.parametrize("protocol", [2, 4])
def test_tensor_attributes_save_byte_equal_to_torch(protocol: int) -> None:
    obj = zero3_like()
    data = torch_bytes(obj, pickle_protocol=protocol)
    assert ptfile_bytes(obj, pickle_protocol=protocol) == data  # from torch objects
    loaded = ptfile.load(io.BytesIO(data))
    assert ptfile_bytes(loaded, pickle_protocol=protocol) == data  # a load's round trip
    back = to_torch(loaded)
    assert back["t"].ds_shape == torch.Size([2, 3]) and type(back["t"].ds_shape) is torch.Size
    assert back["p"].ds_id == 7 and back["list"][1].ds_id == 2


def test_attributes_set_on_a_ptfile_tensor_load_in_torch() -> None:
    storage = ptfile.Storage(memoryview(np.arange(4, dtype=np.float32)).cast("B"),
                             ptfile.DTYPES["float32"])
    t = ptfile.Tensor(storage, 0, (4,), (1,))
    t.attributes = {"ds_id": 11, "ds_shape": ptfile.Size([4])}
    p = ptfile.Parameter(ptfile.Tensor(storage, 0, (2,), (1,)))
    p.attributes = {"ds_id": 12}
    loaded = torch.load(io.BytesIO(ptfile_bytes({"t": t, "p": p})), weights_only=True)
    assert loaded["t"].ds_id == 11 and loaded["t"].ds_shape == torch.Size([4])
    assert loaded["p"].ds_id == 12 and isinstance(loaded["p"], torch.nn.Parameter)
    t.attributes = {}
    plain = torch.load(io.BytesIO(ptfile_bytes(t)), weights_only=True)
    assert plain.__dict__ == {}
    assert ptfile_bytes(t) == torch_bytes(torch.arange(4, dtype=torch.float32))


@pytest.mark.parametrize("state", [[1], ("a", "b", "c"), {1: "x"}, ({"a": 1}, 5)],
                         ids=["list", "3-tuple", "int-key", "bad-slots"])
def test_malformed_tensor_state_refused_like_torch(state: object) -> None:
    storage = ptfile.Storage(memoryview(np.zeros(2, np.float32)).cast("B"),
                             ptfile.DTYPES["float32"])
    t = ptfile.Tensor(storage, 0, (2,), (1,))
    t.python_state, t.type_name = state, "torch.Tensor"
    data = ptfile_bytes(t)
    with pytest.raises(Exception):  # noqa: B017,PT011 (torch raises RuntimeError, TypeError…)
        torch.load(io.BytesIO(data), weights_only=True)
    with pytest.raises(ptfile.PickleStreamError, match="Python state"):
        ptfile.load(io.BytesIO(data))


def test_scan_verdicts_of_numpy_scalars_and_attributes(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"t": with_attributes(torch.ones(2), ds_id=1), "lr": np.float64(0.1)}, path)
    verdicts = {(f.module, f.name): f.verdict for f in ptfile.scan(path).findings
                if f.kind == "global"}
    assert verdicts["torch._tensor", "_rebuild_from_type_v2"] is ptfile.Verdict.ALLOWED
    assert verdicts["torch", "Tensor"] is ptfile.Verdict.ALLOWED
    # numpy values: refused by both loaders' defaults, harmless: unknown, never dangerous
    assert verdicts["numpy._core.multiarray", "scalar"] is ptfile.Verdict.UNKNOWN
    assert verdicts["numpy", "dtype"] is ptfile.Verdict.UNKNOWN
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        assert all(f.verdict is ptfile.Verdict.ALLOWED for f in ptfile.scan(path).findings)


# -- a DCP checkpoint's numpy items ------------------------------------------------------------
@pytest.fixture
def numpy_dcp(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    np.random.seed(3)
    state = {"rng": np.random.get_state(), "lr": np.float64(0.5), "step": np.int64(7),
             "model": {"w": torch.arange(6.0).reshape(2, 3)}}
    directory = tmp_path / "ckpt"
    dcp.save(state, checkpoint_id=directory)
    return directory, state


@pytest.mark.filterwarnings("ignore:torch.distributed is unavailable:UserWarning")
def test_dcp_numpy_items_load_as_torch_dcp_loads_them(
        numpy_dcp: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    directory, _ = numpy_dcp
    expected = _load_state_dict_from_keys(checkpoint_id=str(directory))
    assert_same(ptfile.load_dcp(directory), expected)
    assert_same(ptfile.load_dcp(directory, weights_only=False)["rng"], expected["rng"])
    with ptfile.open(directory) as reader:
        assert_same(reader.value("lr"), expected["lr"])
        assert_same(reader.value("rng"), expected["rng"])
    out = tmp_path / "whole.pt"
    assert cli_main(["convert", str(directory), str(out)]) == 0
    converted = torch.load(out, weights_only=False)
    assert_same(converted["lr"], expected["lr"])
    assert converted["step"] == expected["step"] and type(converted["step"]) is np.int64
    np.testing.assert_array_equal(np.asarray(converted["rng"][1]), expected["rng"][1])


@pytest.mark.filterwarnings("ignore:torch.distributed is unavailable:UserWarning")
def test_dcp_numpy_items_refused_when_weights_only(numpy_dcp: tuple[Path, dict[str, Any]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = numpy_dcp
    with pytest.raises(ptfile.UnsafeGlobalError, match="NUMPY_GLOBALS"):
        ptfile.load_dcp(directory, weights_only=True)
    with ptfile.open(directory, weights_only=True) as reader, \
            pytest.raises(ptfile.UnsafeGlobalError):
        reader.value("lr")
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")  # torch's DCP load refuses too
    with pytest.raises(CheckpointException, match="Weights only load failed"):
        _load_state_dict_from_keys(checkpoint_id=str(directory))
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load_dcp(directory)


# -- TorchScript's model.json layout (torch 1.0/1.1) ----------------------------------------
MODEL_JSON = {
    "protoVersion": "2", "producerName": "pytorch", "producerVersion": "1.0",
    "mainModule": {"name": "archive", "optimize": True,
                   "torchscriptArena": {"key": "code/archive.py"},
                   "parameters": [{"isBuffer": False, "tensorId": "0", "name": "weight"}]},
    "tensors": [{"dims": ["2", "3"], "offset": "0", "strides": ["3", "1"],
                 "requiresGrad": True, "dataType": "FLOAT", "data": {"key": "tensors/0"},
                 "device": "cpu"}],
}


def model_json_archive(path: Path, base: bytes | None = None) -> Path:
    """torch.jit.save's first layout: version 1, model.json, tensors/<n>, code/; with
    ``base``, that archive's records (under ``archive/``) plus a model.json."""
    with zipfile.ZipFile(path, "w") as archive:
        if base is None:
            archive.writestr("archive/version", "1\n")
            archive.writestr("archive/code/archive.py",
                             "op_version_set = 0\ndef forward(self, x):\n  return x\n")
            archive.writestr("archive/tensors/0", bytes(24))
        else:
            with zipfile.ZipFile(io.BytesIO(base)) as original:
                for info in original.infolist():
                    archive.writestr(info.filename, original.read(info))
        archive.writestr("archive/model.json", json.dumps(MODEL_JSON))
    return path


def test_torchscript_model_json_refused_by_name_everywhere(tmp_path: Path) -> None:
    path = model_json_archive(tmp_path / "archive.pt")
    with pytest.raises(RuntimeError, match=r"data\.pkl"):
        torch.load(path)
    with pytest.raises(RuntimeError, match="Legacy model format is not supported"):
        torch.jit.load(path)
    message = r"TorchScript model.json layout \(torch 1.0/1.1\) is not supported"
    for front_door in (ptfile.load, ptfile.open, ptfile.inspect, ptfile.verify,
                       ptfile.load_torchscript):
        with pytest.raises(ptfile.UnsupportedFeatureError, match=message):
            front_door(path)
    assert ptfile.detect_format(path) is ptfile.Format.TORCHSCRIPT_JSON
    assert ptfile.scan(path).format == "torchscript-json"
    assert cli_main(["verify", str(path)]) == 2  # could not read, not damaged
    assert cli_main(["inspect", str(path)]) == 2


def test_model_json_beside_data_pkl_or_constants_pkl(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buffer, _use_new_zipfile_serialization=True)
    beside_data = model_json_archive(tmp_path / "data.pt", buffer.getvalue())
    expected = torch.load(beside_data)["w"]  # torch.load reads data.pkl, whatever else is there
    np.testing.assert_array_equal(ptfile.load(beside_data)["w"].numpy(), expected.numpy())
    script = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), script)
    beside_constants = model_json_archive(tmp_path / "script.pt", script.getvalue())
    with pytest.raises(RuntimeError, match="Legacy model format"):
        torch.jit.load(beside_constants)  # model.json is looked for first
    with pytest.raises(ptfile.UnsupportedFeatureError, match=r"model\.json layout"):
        ptfile.load(beside_constants)


# -- older files, crafted from the format (no old torch to write them) ------------------------
class _Pid:
    """Stands for a persistent id in a crafted pickle."""

    def __init__(self, *pid: object) -> None:
        self.pid = pid


class _Call:
    """Pickles as ``fn(*args)``."""

    def __init__(self, fn: Any, *args: object) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        return self.fn, self.args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        return obj.pid if isinstance(obj, _Pid) else None


def _pickled(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def crafted_zip(obj: object, records: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", _pickled(obj))
        for key, data in records.items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", "3\n")
    return out.getvalue()


def crafted_legacy(obj: object, storages: dict[str, tuple[int, bytes]]) -> bytes:
    """torch's legacy stream: magic, protocol, sys_info, the object, the keys, the data."""
    sys_info = {"protocol_version": 1001, "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    parts = [pickle.dumps(v, protocol=2) for v in (0x1950A86A20F9469CFC6C, 1001, sys_info)]
    parts += [_pickled(obj), pickle.dumps(sorted(storages), protocol=2)]
    for key in sorted(storages):
        count, data = storages[key]
        parts += [count.to_bytes(8, "little"), data]
    return b"".join(parts)


def both_load(data: bytes) -> tuple[Any, Any]:
    """What torch.load and ptfile.load make of ``data``: the object, or the exception."""
    results: list[Any] = []
    for load in (torch.load, ptfile.load):
        try:
            results.append(load(io.BytesIO(data)))
        except Exception as exc:  # noqa: BLE001 (the outcome is compared)
            results.append(exc)
    return results[0], results[1]


FLOATS = np.arange(4, dtype=np.float32).tobytes()
HOOKS: Any = __import__("collections").OrderedDict()


def _v2(pid: _Pid, offset: int = 0, size: tuple[int, ...] = (4,)) -> _Call:
    return _Call(torch._utils._rebuild_tensor_v2, pid, offset, size, (1,), False, HOOKS)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("container", "pid", "accepted"), [
    ("legacy", ("storage", torch.FloatStorage, "0", "cpu", 4, None), True),  # torch 1.3's
    ("legacy", ("storage", torch.FloatStorage, "0", "cpu", 4), False),
    ("zip", ("storage", torch.FloatStorage, "0", "cpu", 4), True),
    ("zip", ("storage", torch.FloatStorage, "0", "cpu", 4, None), False),
], ids=["legacy-6", "legacy-5", "zip-5", "zip-6"])
def test_storage_ids_accepted_where_torch_accepts_them(container: str, pid: tuple[Any, ...],
                                                       accepted: bool) -> None:
    obj = {"w": _v2(_Pid(*pid))}
    data = crafted_legacy(obj, {"0": (4, FLOATS)}) if container == "legacy" \
        else crafted_zip(obj, {"0": FLOATS})
    by_torch, by_ptfile = both_load(data)
    assert isinstance(by_torch, dict) is accepted
    if accepted:
        np.testing.assert_array_equal(by_ptfile["w"].numpy(), by_torch["w"].numpy())
    else:
        assert isinstance(by_ptfile, ptfile.FormatError)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_legacy_storage_views_of_old_torch() -> None:
    """Old torch pickled a view of a storage as ``(view_key, offset, size)``."""
    root = ("storage", torch.FloatStorage, "0", "cpu", 4)
    obj = {"a": _v2(_Pid(*root, ("1", 1, 2)), 0, (2,)), "b": _v2(_Pid(*root, None))}
    by_torch, by_ptfile = both_load(crafted_legacy(obj, {"0": (4, FLOATS)}))
    for key in ("a", "b"):
        np.testing.assert_array_equal(by_ptfile[key].numpy(), by_torch[key].numpy())
    outside = {"a": _v2(_Pid(*root, ("1", 3, 2)), 0, (2,))}  # past the root's 4 elements
    by_torch, by_ptfile = both_load(crafted_legacy(outside, {"0": (4, FLOATS)}))
    assert isinstance(by_ptfile, ptfile.StorageError)


def _qtensor(params: tuple[Any, ...], *rest: object) -> dict[str, _Call]:
    pid = _Pid("storage", torch.QUInt8Storage, "0", "cpu", 4)
    return {"q": _Call(torch._utils._rebuild_qtensor, pid, 0, (2, 2), (2, 1), *params,
                       False, HOOKS, *rest)}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("scheme", [torch.per_channel_affine,
                                    torch.per_channel_affine_float_qparams])
def test_per_channel_quantizer_lists_read_as_torch_reads_them(scheme: Any) -> None:
    zeros = [1, 2] if scheme is torch.per_channel_affine else [1.0, 2.0]
    by_torch, by_ptfile = both_load(crafted_zip(
        _qtensor(((scheme, [0.5, 0.25], zeros, 1),)), {"0": bytes([1, 2, 3, 4])}))
    q, t = by_ptfile["q"], by_torch["q"]
    np.testing.assert_array_equal(q.dequantize(), t.dequantize().numpy())
    np.testing.assert_array_equal(q.scales.numpy(), t.q_per_channel_scales().numpy())
    np.testing.assert_array_equal(q.zero_points.numpy(), t.q_per_channel_zero_points().numpy())
    assert q.scales.numpy().dtype == t.q_per_channel_scales().numpy().dtype
    wrong = _qtensor(((scheme, [0.5, 0.25, 1.0], zeros, 1),))  # three scales, two channels
    by_torch, by_ptfile = both_load(crafted_zip(wrong, {"0": bytes([1, 2, 3, 4])}))
    assert isinstance(by_torch, Exception) and isinstance(by_ptfile, ptfile.StorageError)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_pre_1_3_qtensor_arguments_refused_as_torch_refuses_them() -> None:
    old = {"q": _Call(torch._utils._rebuild_qtensor,
                      _Pid("storage", torch.QUInt8Storage, "0", "cpu", 4), 0, (4,), (1,),
                      0.5, 3, False, HOOKS)}  # torch 1.1/1.2: scale, zero_point
    by_torch, by_ptfile = both_load(crafted_zip(old, {"0": bytes([1, 2, 3, 4])}))
    assert isinstance(by_torch, TypeError)
    assert isinstance(by_ptfile, ptfile.PickleStreamError)
    new = _qtensor(((torch.per_tensor_affine, 0.5, 3),))
    by_torch, by_ptfile = both_load(crafted_zip(new, {"0": bytes([1, 2, 3, 4])}))
    np.testing.assert_array_equal(by_ptfile["q"].dequantize(), by_torch["q"].dequantize())
