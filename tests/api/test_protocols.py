"""``ptfile.save(..., pickle_protocol=4|5)`` writes what ``torch.save`` writes, byte for byte.

Each case saves an object with torch, loads it with both libraries and saves
it again with the protocol under test: ptfile's file equals torch's.  torch
2.13 reads these files back only with ``weights_only=False``: its weights-only
unpickler knows none of the protocol-4 opcodes (``FRAME``, ``MEMOIZE``,
``SHORT_BINUNICODE``, ``STACK_GLOBAL``) and refuses torch's own files, as it
refuses ptfile's.  The legacy format names storages by memory address in
torch, so there the pickles are compared opcode by opcode.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
import zipfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile
from oracle import assert_same, ptfile_bytes, torch_bytes

torch = pytest.importorskip("torch")

FRAMED = [4, 5]
#: Every dtype torch 2.13 saves that ptfile reads (typed, untyped-storage and bits dtypes).
DTYPES = [getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")]


def _resaves(obj: Any, protocol: int) -> tuple[bytes, bytes]:
    """(ptfile's, torch's) saves at ``protocol`` of what each loads from torch's file."""
    raw = torch_bytes(obj)
    theirs = torch_bytes(torch.load(io.BytesIO(raw), weights_only=True), pickle_protocol=protocol)
    return ptfile_bytes(ptfile.load(io.BytesIO(raw)), pickle_protocol=protocol), theirs


def _refusal(raw: bytes) -> str | None:
    """Why ``torch.load(weights_only=True)`` refuses ``raw`` (None if it reads it)."""
    try:
        torch.load(io.BytesIO(raw), weights_only=True)
    except pickle.UnpicklingError as exc:
        return str(exc).split("\n")[3]  # the line naming the opcode
    return None


def assert_like_torch(obj: Any, protocol: int) -> bytes:
    ours, theirs = _resaves(obj, protocol)
    assert ours == theirs
    assert _refusal(ours) == _refusal(theirs)
    assert_same(ptfile.load(io.BytesIO(ours)), torch.load(io.BytesIO(theirs), weights_only=False))
    return ours


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_big_state_dict_crosses_several_frames(protocol: int) -> None:
    torch.manual_seed(0)
    state = {f"model.layers.{i}.{part}": torch.randn(3)
             for i in range(2500) for part in ("weight", "bias")}
    ours = assert_like_torch(state, protocol)
    frames = [arg for op, arg, _ in pickletools.genops(_pkl(ours))
              if op.name == "FRAME" and isinstance(arg, int)]
    assert len(frames) >= 6 and all(n >= 64 * 1024 for n in frames[:-1])


def _pkl(raw: bytes) -> bytes:
    """The data.pkl record of a ZIP checkpoint."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_large_bytes_and_long_strings(protocol: int) -> None:
    obj = {"small": b"b" * 300, "big": b"x" * 70_000, "text": "t" * 300, "wide": "é" * 40_000,
           "k" * 70_000: torch.ones(2), "after": torch.zeros(1)}
    ours = assert_like_torch(obj, protocol)
    ops = {op.name for op, _, _ in pickletools.genops(_pkl(ours))}
    assert {"BINBYTES", "BINUNICODE", "SHORT_BINUNICODE", "FRAME"} <= ops


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_nested_containers_shared_storages_and_metadata(protocol: int) -> None:
    base = torch.arange(24, dtype=torch.float32)
    state: collections.OrderedDict[str, Any] = collections.OrderedDict()
    state["whole"] = base
    state["view"] = base[2:10].view(2, 4).t()
    state["again"] = base[::3]
    state["nested"] = {"list": [base[:2], (base[4:6], {"deep": [1, "two", 3.0, None]})],
                       "tuple": (1, 2, 3, 4, 5), "empty": ((), [], {})}
    state["param"] = torch.nn.Parameter(base.clone())
    state["size"] = torch.Size([2, 3])
    state["device"] = torch.device("cpu")
    state["dtypes"] = [torch.float32, torch.int8, torch.float32]
    state._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
        {"": {"version": 1}, "layer": {"version": 2}})
    assert_like_torch(state, protocol)
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert_like_torch(module.state_dict(), protocol)


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_tensors_of_every_dtype(protocol: int) -> None:
    # The v3 rebuild of untyped storages and the dtype globals, whose module is a str
    # of its own in torch (one for all dtypes, another than torch's own module name).
    state: dict[str, Any] = {str(dtype): torch.zeros(3, dtype=dtype) for dtype in DTYPES}
    state["names"] = DTYPES
    assert_like_torch(state, protocol)
    ours, theirs = _resaves({"meta": torch.empty(2, 2, device="meta"), "d": DTYPES[3]}, protocol)
    assert ours == theirs


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_quantized_and_sparse_tensors(protocol: int) -> None:
    quantized = torch.quantize_per_tensor(torch.ones(4), 0.5, 1, torch.quint8)
    per_channel = torch.quantize_per_channel(torch.ones(2, 2), torch.tensor([0.1, 0.2]),
                                             torch.tensor([1, 2]), 0, torch.qint8)
    sparse = {"coo": torch.eye(3).to_sparse(), "csr": torch.eye(3).to_sparse_csr()}
    ours, theirs = _resaves({"q": quantized, "c": per_channel, **sparse}, protocol)
    assert ours == theirs


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_save_of_numpy_arrays_loads_in_torch(protocol: int) -> None:
    arrays: dict[str, np.ndarray] = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int64)}
    arrays["view"] = arrays["a"][:, 1]
    raw = ptfile_bytes(arrays, pickle_protocol=protocol)
    loaded = torch.load(io.BytesIO(raw), weights_only=False)
    for name, array in arrays.items():
        assert np.array_equal(loaded[name].numpy(), array)
    assert loaded["view"].untyped_storage().data_ptr() == loaded["a"].untyped_storage().data_ptr()
    assert _pkl(raw)[:3] == bytes([0x80, protocol, 0x95])


def _pickles(raw: bytes) -> list[bytes]:
    """The five pickles of a legacy file (magic, version, sys_info, object, keys)."""
    out, start = [], 0
    for _ in range(5):
        end = start + 1 + max(pos or 0 for _, _, pos in pickletools.genops(raw[start:]))  # STOP
        out.append(raw[start:end])
        start = end
    return out


@pytest.mark.parametrize("protocol", FRAMED)
def test_protocol_legacy_format_is_torchs_but_for_its_storage_keys(protocol: int) -> None:
    # torch names legacy storages by address, so the object pickles differ in those
    # strs: the headers are equal, the opcodes the same, the values torch.load's.
    obj = {"w": torch.arange(6.0), "v": torch.arange(6.0)[1:3], "n": 3, "s": "x" * 300}
    options = {"pickle_protocol": protocol, "_use_new_zipfile_serialization": False}
    theirs = torch_bytes(torch.load(io.BytesIO(torch_bytes(obj)), weights_only=True),
                          **options)
    ours = ptfile_bytes(ptfile.load(io.BytesIO(torch_bytes(obj))), **options)
    mine, torchs = _pickles(ours), _pickles(theirs)
    assert mine[:3] == torchs[:3]

    def opcodes(data: bytes) -> list[str]:
        return [op.name for op, _, _ in pickletools.genops(data)]

    assert opcodes(mine[3]) == opcodes(torchs[3])
    assert_same(ptfile.load(io.BytesIO(ours)), torch.load(io.BytesIO(ours), weights_only=False))


_VALUES = st.sampled_from(["tensor", "tensor", "int", "str", "bytes", "list", "nested", "dtype"])


@st.composite
def _objects(draw: st.DrawFn) -> Any:
    """State dicts of a random size (0 to ~40 KiB of pickle a filler), so frame ends fall anywhere."""
    bases = [torch.arange(draw(st.integers(1, 9))).to(draw(st.sampled_from(DTYPES[:16])))
             for _ in range(draw(st.integers(1, 3)))]
    out: dict[str, Any] = {}
    for i in range(draw(st.integers(0, 400))):
        kind = draw(_VALUES)
        base = draw(st.sampled_from(bases))
        if kind == "tensor":
            out[f"layer.{i}.weight"] = base[draw(st.integers(0, len(base) - 1)):]
        elif kind == "int":
            out[f"n{i}"] = draw(st.integers(-(2**70), 2**70))
        elif kind == "str":
            out[f"s{i}"] = draw(st.text(max_size=3)) * draw(st.sampled_from([1, 100, 30_000]))
        elif kind == "bytes":
            out[f"b{i}"] = b"b" * draw(st.sampled_from([1, 256, 70_000]))
        elif kind == "list":
            out[f"l{i}"] = [base, (base[:1], i)]
        elif kind == "dtype":
            out[f"d{i}"] = base.dtype
        else:
            out[f"m{i}"] = {"w": base, "step": i}
    return out


@settings(max_examples=30, deadline=None)
@given(_objects(), st.sampled_from(FRAMED))
def test_protocol_resave_of_random_state_dicts_is_byte_identical(obj: Any, protocol: int) -> None:
    ours, theirs = _resaves(obj, protocol)
    assert ours == theirs
