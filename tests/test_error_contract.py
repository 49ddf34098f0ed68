"""The error contract: any mutation of a checkpoint loads, or raises a ptfile error."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile

GOLDEN = Path(__file__).parent / "golden"
ZIP_FILES = ["tiny_tensor.pt", "tiny_state_dict.pt", "tiny_views.pt", "tiny_dtypes.pt",
             "tiny_buffer_nocrc.pt", "tiny_bigendian.pt"]
ALL_FILES = [*ZIP_FILES, "tiny_legacy.pt", "tiny_tar.pt"]


def _ptfile_sample() -> bytes:
    buf = io.BytesIO()
    x = np.arange(12.0)
    ptfile.save({"a": x, "b": x[3:7], "c": [np.ones((2, 2), np.float16)], "n": 3}, buf)
    return buf.getvalue()


def _ptfile_legacy_sample() -> bytes:
    buf = io.BytesIO()
    x = np.arange(8, dtype=np.int32)
    ptfile.save({"a": x, "b": x[2:5], "s": "text"}, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def _torchscript_sample() -> bytes:
    """A scripted module with a parameter, buffers (one shared) and a Linear submodule."""
    torch = pytest.importorskip("torch")
    module = torch.nn.Module()
    module.lin = torch.nn.Linear(2, 2)
    module.register_buffer("b", torch.arange(4, dtype=torch.int16))
    module.register_buffer("bv", module.b[1:3])
    module.register_parameter("w", torch.nn.Parameter(torch.ones(3)))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf, _extra_files={"x.txt": b"hi"})
    return buf.getvalue()


SAMPLES = {name: (GOLDEN / name).read_bytes() for name in ALL_FILES}
SAMPLES["ptfile"] = _ptfile_sample()
SAMPLES["ptfile_legacy"] = _ptfile_legacy_sample()
SAMPLES["torchscript"] = _torchscript_sample()


def _load_or_ptfile_error(data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptfile.PtfileWarning)
        for mmap in (False,):
            try:
                result = ptfile.load(io.BytesIO(data), mmap=mmap)
            except ptfile.PtfileError:
                continue
            _touch(result)
        try:  # the TorchScript-specific reader, on every input
            _touch(ptfile.load_torchscript(io.BytesIO(data)).module.attributes)
        except ptfile.PtfileError:
            pass


def _touch(obj: object) -> None:
    """Read every value of a loaded tree, so lazy damage surfaces too."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, ptfile.Tensor):
            try:
                x.numpy().sum()
            except ptfile.UnsupportedFeatureError:
                pass
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_error_contract_every_truncation(name: str) -> None:
    data = SAMPLES[name]
    for cut in range(0, len(data), max(1, len(data) // 300)):
        _load_or_ptfile_error(data[:cut])


@settings(max_examples=300)
@given(name=st.sampled_from(sorted(SAMPLES)), data=st.data())
def test_error_contract_bit_flips(name: str, data: st.DataObject) -> None:
    blob = bytearray(SAMPLES[name])
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 7)),
                               min_size=1, max_size=4))
    for pos, bit in flips:
        blob[pos] ^= 1 << bit
    _load_or_ptfile_error(bytes(blob))


@settings(max_examples=200)
@given(name=st.sampled_from(sorted(SAMPLES)), data=st.data())
def test_error_contract_byte_overwrites_and_splices(name: str, data: st.DataObject) -> None:
    blob = bytearray(SAMPLES[name])
    start = data.draw(st.integers(0, len(blob) - 1))
    patch = data.draw(st.binary(min_size=1, max_size=16))
    if data.draw(st.booleans()):
        blob[start:start + len(patch)] = patch
    else:
        other = SAMPLES[data.draw(st.sampled_from(sorted(SAMPLES)))]
        cut = data.draw(st.integers(0, len(other)))
        blob = blob[:start] + other[cut:]
    _load_or_ptfile_error(bytes(blob))


def test_error_contract_garbage_is_unknown_format() -> None:
    with pytest.raises(ptfile.UnknownFormatError, match="not a PyTorch checkpoint"):
        ptfile.load(io.BytesIO(b"hello world, not a checkpoint"))
    with pytest.raises(ptfile.FormatError):
        ptfile.load(io.BytesIO(b""))


def _rezip(data: bytes, change: dict[str, bytes]) -> bytes:
    """``data`` with some records' payloads replaced, as a well-formed stored ZIP."""
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, change.get(info.filename, src.read(info)))
    return out.getvalue()


@settings(max_examples=200)
@given(data=st.data())
def test_error_contract_torchscript_record_mutations(data: st.DataObject) -> None:
    """Damage inside the records (the ZIP stays valid), so it reaches the TorchScript reader."""
    import zipfile

    sample = SAMPLES["torchscript"]
    names = [n for n in zipfile.ZipFile(io.BytesIO(sample)).namelist()
             if n.endswith((".pkl", ".py")) or "/data/" in n]
    name = data.draw(st.sampled_from(sorted(names)))
    blob = bytearray(zipfile.ZipFile(io.BytesIO(sample)).read(name))
    if blob and data.draw(st.booleans()):
        for pos, bit in data.draw(st.lists(st.tuples(st.integers(0, len(blob) - 1),
                                                     st.integers(0, 7)), min_size=1, max_size=3)):
            blob[pos] ^= 1 << bit
    else:
        start = data.draw(st.integers(0, len(blob)))
        blob[start:start + data.draw(st.integers(0, 8))] = data.draw(st.binary(max_size=8))
    _load_or_ptfile_error(_rezip(sample, {name: bytes(blob)}))
