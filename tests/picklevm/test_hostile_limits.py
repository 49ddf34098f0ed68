"""Limits against the costs no opcode rule sees: hash floods, deep tuples; no false positives."""

from __future__ import annotations

import contextvars
import io
import pickle
import struct
import time

import pytest

import ptfile
from hostile import checkpoint, proto2
from ptfile.picklevm.hazards import INLINE_STACK_BYTES, call_with_stack


def _int_keys(n: int, step: int = 2**61 - 1) -> bytes:
    body = b"".join(b"\x8a\x0b" + (k * step).to_bytes(11, "little") + b"K\x00" for k in range(n))
    return checkpoint(proto2(b"}(" + body + b"u"))


def test_limits_hash_flood_is_refused_fast() -> None:
    began = time.perf_counter()
    with pytest.raises(ptfile.LimitExceededError) as info:
        ptfile.load(io.BytesIO(_int_keys(20_000)))
    assert info.value.limit == "max_hash_collisions"
    assert time.perf_counter() - began < 5


def test_limits_hash_flood_threshold_is_a_knob() -> None:
    data = _int_keys(1_500)
    with pytest.raises(ptfile.LimitExceededError):
        ptfile.load(io.BytesIO(data))
    loaded = ptfile.load(io.BytesIO(data), limits=ptfile.Limits(max_hash_collisions=2_000))
    assert len(loaded) == 1_500


def test_limits_tuple_keys_of_colliding_ints_are_refused() -> None:
    body = b"".join(b"\x8a\x0b" + (k * (2**61 - 1)).to_bytes(11, "little") + b"\x85K\x00"
                    for k in range(3_000))
    with pytest.raises(ptfile.LimitExceededError):
        ptfile.load(io.BytesIO(checkpoint(proto2(b"}(" + body + b"u"))))


def test_limits_many_numbers_without_collisions_load() -> None:
    values = {"floats": [i / 7 for i in range(50_000)], "big": [2**70 + i for i in range(5_000)],
              "keys": {2**62 + i: i for i in range(5_000)}}
    loaded = ptfile.load(io.BytesIO(checkpoint(pickle.dumps(values, protocol=2))))
    assert loaded == values


def test_limits_meta_tensor_of_2_60_elements_allocates_nothing() -> None:
    size = b"(\x8a\x08" + struct.pack("<q", 2**60) + b"t"
    data = proto2(b"ctorch._utils\n_rebuild_meta_tensor_no_storage\n(ctorch\nfloat32\n" + size
                  + b"(K\x01t\x89tR")
    tensor = ptfile.load(io.BytesIO(checkpoint(data)))
    assert tensor.shape == (2**60,)
    assert tensor.storage is None


def test_limits_call_with_stack_propagates_results_errors_and_context() -> None:
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=0)
    var.set(7)
    assert call_with_stack(var.get, INLINE_STACK_BYTES * 4) == 7

    def fail() -> None:
        raise ptfile.FormatError("boom")

    with pytest.raises(ptfile.FormatError, match="boom"):
        call_with_stack(fail, INLINE_STACK_BYTES * 4)
    with pytest.raises(ptfile.LimitExceededError):
        call_with_stack(fail, 1 << 45)


def test_limits_deep_tuples_are_refused_after_a_safe_unpickle() -> None:
    deep = proto2(b"]K\x01" + b"\x85" * 60_000 + b"a")  # a list holding a 60,000-deep tuple
    with pytest.raises(ptfile.LimitExceededError, match="tuples nested"):
        ptfile.load(io.BytesIO(checkpoint(deep)))
    shallow = proto2(b"]K\x01" + b"\x85" * 1_000 + b"a")
    assert len(ptfile.load(io.BytesIO(checkpoint(shallow)))) == 1
