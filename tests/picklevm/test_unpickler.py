"""unpickle: agreement with pickle.loads, the error contract, callbacks, hostile streams."""

from __future__ import annotations

import copyreg
import io
import pickle
import subprocess
import sys
import textwrap
import zipfile
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptfile.errors import (
    LimitExceededError,
    PickleStreamError,
    PtfileError,
    StorageError,
    UnsafeGlobalError,
    UnsupportedFeatureError,
)
from ptfile.limits import Limits
from ptfile.picklevm import unpickle
from pvm_support import PROTOCOLS, find_builtin, objects, same


def _load(data: bytes, **kwargs: Any) -> Any:
    obj, _ = unpickle(data, find_class=find_builtin, persistent_load=None, **kwargs)
    return obj


# --------------------------------------------------------------------------- conformance


@given(objects(), st.sampled_from(PROTOCOLS))
def test_unpickle_equals_pickle_loads(obj: Any, protocol: int) -> None:
    data = pickle.dumps(obj, protocol)
    ours, end = unpickle(data, find_class=find_builtin, persistent_load=None)
    assert end == len(data)
    assert same(ours, pickle.loads(data))


@given(objects(), st.sampled_from(PROTOCOLS), st.binary(max_size=5))
def test_unpickle_from_an_offset_of_a_mutable_buffer(obj: Any, protocol: int, head: bytes) -> None:
    data = pickle.dumps(obj, protocol)
    buffer = bytearray(head + data + b"trailing")
    ours, end = unpickle(memoryview(buffer), find_class=find_builtin, persistent_load=None,
                         start=len(head))
    assert end == len(head) + len(data)
    assert same(ours, pickle.loads(data))


def test_shared_references_and_cycles_survive() -> None:
    inner = [1]
    outer: list[Any] = [inner, inner]
    outer.append(outer)
    for protocol in PROTOCOLS:
        result = _load(pickle.dumps(outer, protocol))
        assert result[0] is result[1]
        assert result[2] is result


def test_python2_strings_follow_encoding() -> None:
    data = b"U\x04caf\xe9."  # SHORT_BINSTRING b"caf\xe9"
    assert _load(data, encoding="latin1") == "caf\xe9"
    assert _load(data, encoding="bytes") == b"caf\xe9"
    with pytest.raises(PickleStreamError, match="UnicodeDecodeError"):
        _load(data)


def test_find_class_receives_names_as_written() -> None:
    seen: list[tuple[str, str]] = []

    def record(module: str, name: str) -> Any:
        seen.append((module, name))
        return find_builtin(module, name)

    unpickle(pickle.dumps({1}, 2), find_class=record, persistent_load=None)
    unpickle(pickle.dumps(frozenset({1}), 0), find_class=record, persistent_load=None)
    assert seen == [("__builtin__", "set"), ("__builtin__", "frozenset")]


# --------------------------------------------------------------------------- callbacks


def test_find_class_refusal_propagates_unchanged() -> None:
    refusal = UnsafeGlobalError("no", module="os", name="system")

    def refuse(module: str, name: str) -> Any:
        raise refusal

    with pytest.raises(UnsafeGlobalError) as caught:
        unpickle(b"cos\nsystem\n.", find_class=refuse, persistent_load=None)
    assert caught.value is refusal


def test_persistent_load_error_propagates_unchanged() -> None:
    error = StorageError("storage '0' has no record")

    def load(pid: Any) -> Any:
        raise error

    with pytest.raises(StorageError) as caught:
        unpickle(b"\x80\x02X\x01\x00\x00\x000Q.", find_class=find_builtin, persistent_load=load)
    assert caught.value is error


def test_persistent_ids_reach_the_hook() -> None:
    obj, end = unpickle(b"\x80\x02(X\x01\x00\x00\x000K\x04tQ.", find_class=find_builtin,
                        persistent_load=lambda pid: ("loaded", pid))
    assert obj == ("loaded", ("0", 4))
    assert end == 14
    obj, _ = unpickle(b"Pkey\n.", find_class=find_builtin, persistent_load=lambda pid: pid)
    assert obj == "key"


def test_persistent_id_without_hook_is_a_stream_error() -> None:
    with pytest.raises(PickleStreamError, match="persistent_load"):
        _load(b"\x80\x02K\x01Q.")


def test_other_callback_errors_become_stream_errors_with_cause() -> None:
    def broken(module: str, name: str) -> Any:
        raise KeyError(name)

    with pytest.raises(PickleStreamError, match="KeyError") as caught:
        unpickle(b"cmod\nname\n.", find_class=broken, persistent_load=None)
    assert isinstance(caught.value.__cause__, KeyError)
    assert caught.value.offset is not None


def test_reduce_calls_only_what_find_class_returned() -> None:
    allowed = {("collections", "OrderedDict"): OrderedDict}
    data = pickle.dumps(OrderedDict(a=1), 2)
    obj, _ = unpickle(data, find_class=lambda m, n: allowed[m, n], persistent_load=None)
    assert obj == OrderedDict(a=1)


# --------------------------------------------------------------------------- refused features


def test_ext_codes_are_refused_even_when_cached() -> None:
    copyreg.add_extension("collections", "OrderedDict", 0x7FFF_FF01)
    try:
        data = pickle.dumps(OrderedDict, 2)
        assert pickle.loads(data) is OrderedDict  # fills copyreg's process-wide cache
        for stream in (data, b"\x80\x02\x82\x07.", b"\x80\x02\x83\x07\x07.",
                       b"\x80\x02\x84\x07\x07\x07\x07."):
            with pytest.raises(UnsupportedFeatureError, match="EXT"):
                unpickle(stream, find_class=find_builtin, persistent_load=None)
    finally:
        copyreg.remove_extension("collections", "OrderedDict", 0x7FFF_FF01)


def test_out_of_band_buffers_are_refused() -> None:
    with pytest.raises(PickleStreamError):
        _load(b"\x80\x05\x97.")


@pytest.mark.parametrize("data", [
    b"\x80\x02]a.",                   # APPEND on a stack of one
    b"\x80\x02h\x05.",                # BINGET of an empty memo slot
    b"\x80\x02X\x01\x00\x00\x00\xff.",  # invalid UTF-8
    b"\x80\x02K\x01K\x02R.",          # REDUCE of an int
    b"\x80\x02N(N\x90.",              # ADDITEMS on None
    b"\x80\x02NN\x93.",                # STACK_GLOBAL of None
    b"I99999999999999999999999999" + b"9" * 5000 + b"\n.",  # int beyond 4300 digits
    b"\x80\x02]}b.",                   # BUILD on a list
    b"\x80\x02K\x01\x98.",             # READONLY_BUFFER of an int
])
def test_unpickler_failures_are_stream_errors(data: bytes) -> None:
    with pytest.raises(PickleStreamError) as caught:
        _load(data)
    assert caught.value.__cause__ is not None or "persistent" in str(caught.value)


# --------------------------------------------------------------------------- hostile streams

_HUGE = 2**62
_HOSTILE = {
    "memo index 10**8": bytes.fromhex("80024e7200e1f5052e"),
    "memo index 2**32-1": b"\x80\x02Nr\xff\xff\xff\xff.",
    "BINBYTES8 2**62": b"\x80\x04\x8e" + _HUGE.to_bytes(8, "little") + b"x.",
    "BINUNICODE8 2**62": b"\x80\x04\x8d" + _HUGE.to_bytes(8, "little") + b"x.",
    "BYTEARRAY8 2**62": b"\x80\x05\x96" + _HUGE.to_bytes(8, "little") + b"x.",
    "BINUNICODE 2**32-1": b"\x80\x02X\xff\xff\xff\xffx.",
    "FRAME 2**62": b"\x80\x04\x95" + _HUGE.to_bytes(8, "little") + b"N.",
    "10**6 nested MARKs": b"\x80\x02" + b"(" * 10**6 + b"t" * 10**6 + b".",
    "10**6 EMPTY_LIST+APPEND pairs": b"\x80\x02" + b"]a" * 10**6 + b".",
    "unknown opcode": b"\x80\x02\xff.",
}


@pytest.mark.parametrize("name", _HOSTILE)
def test_hostile_streams_raise_ptfile_errors(name: str) -> None:
    with pytest.raises((PickleStreamError, LimitExceededError)):
        _load(_HOSTILE[name])


_MEMORY_PROBE = textwrap.dedent("""
    import resource, sys
    from ptfile.errors import PtfileError
    from ptfile.picklevm import unpickle
    huge = (2**62).to_bytes(8, "little")
    streams = [
        bytes.fromhex("80024e7200e1f5052e"),
        b"\\x80\\x02Nr\\xff\\xff\\xff\\xff.",
        b"\\x80\\x02N" + b"r\\x00\\x00\\x00\\x40" * 1000 + b".",
        b"\\x80\\x04\\x8e" + huge + b"x.",
        b"\\x80\\x04\\x8d" + huge + b"x.",
        b"\\x80\\x05\\x96" + huge + b"x.",
        b"\\x80\\x02X\\xff\\xff\\xff\\xffx.",
        b"\\x80\\x02B\\xff\\xff\\xff\\xffx.",
        b"\\x80\\x04\\x95" + huge + b"N.",
        b"\\x80\\x02" + b"(" * 10**6 + b"t" * 10**6 + b".",
        b"\\x80\\x02" + b"]a" * 10**6 + b".",
    ]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for data in streams:
        try:
            unpickle(data, find_class=None, persistent_load=None)
        except PtfileError:
            continue
        sys.exit(f"accepted {data[:20]!r}")
    # Valid but deep: a 10**5-deep nested list (memory is linear in the stream).
    deep, _ = unpickle(b"\\x80\\x02" + b"]" * 10**5 + b"a" * (10**5 - 1) + b".",
                       find_class=None, persistent_load=None)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
""")


def test_hostile_streams_use_little_memory() -> None:
    probe = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], capture_output=True,
                           text=True, timeout=120, check=False)
    assert probe.returncode == 0, probe.stderr + probe.stdout
    grown_kib = int(probe.stdout.split()[-1])
    assert grown_kib < 64 * 1024  # each stream alone would take 1.5 GB to exabytes unchecked


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_truncation_is_a_pickle_stream_error(protocol: int) -> None:
    data = pickle.dumps([{"k": (1, 2.5, "v" * 300, b"b" * 300, {3})}, 2**100], protocol)
    for cut in range(len(data)):
        with pytest.raises(PickleStreamError):
            _load(data[:cut])


def _torch_like() -> bytes:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2), "b": [torch.zeros(1), {"n": 3}]}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


def _stub_class(module: str, name: str) -> Any:
    if module == "collections" and name == "OrderedDict":
        return OrderedDict
    if module.startswith("torch"):
        return lambda *args: (module, name, args)
    raise UnsafeGlobalError("refused", module=module, name=name)


def test_torch_stream_unpickles_with_stubs() -> None:
    data = _torch_like()
    obj, end = unpickle(data, find_class=_stub_class, persistent_load=lambda pid: pid)
    assert end == len(data)
    assert set(obj) == {"w", "b"}
    assert obj["w"][:2] == ("torch._utils", "_rebuild_tensor_v2")


@given(st.integers(0, 10**6), st.integers(0, 7), st.integers(1, 3))
def test_bit_flips_load_or_raise_ptfile_errors(where: int, bit: int, count: int) -> None:
    data = bytearray(pickle.dumps([{"k": (1, 2.5, "v", b"b" * 3, {3})}, 2**100, [None] * 3], 2))
    for i in range(count):
        data[(where + 7919 * i) % len(data)] ^= 1 << bit
    try:
        _load(bytes(data), limits=Limits(max_depth=50))
    except PtfileError:
        pass


def test_failure_offset_is_exact_beyond_the_prefetch_buffer() -> None:
    # The failing BINGET sits past the 128 KiB the C unpickler prefetches at a time.
    data = b"\x80\x02]q\x00(" + b"K\x01" * 200_000 + b"h\x09" + b"e."
    with pytest.raises(PickleStreamError, match="Memo value not found") as caught:
        unpickle(data, find_class=lambda module, name: None, persistent_load=None)
    assert caught.value.offset == len(data) - 2
