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


SAMPLES = {name: (GOLDEN / name).read_bytes() for name in ALL_FILES}
SAMPLES["ptfile"] = _ptfile_sample()


def _load_or_ptfile_error(data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptfile.PtfileWarning)
        for mmap in (False,):
            try:
                result = ptfile.load(io.BytesIO(data), mmap=mmap)
            except ptfile.PtfileError:
                continue
            _touch(result)


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
