"""Protocols 4 and 5: opcodes, memo and 64 KiB frames are the C pickler's, byte for byte.

The oracle is ``pickle.dumps(x, protocol)`` (the C pickler).  The property tests
draw graphs whose frame boundaries fall anywhere: many small objects, strs and
bytes around the 65,536-byte payload threshold, nested containers between them.
"""

from __future__ import annotations

import pickle
import pickletools
from collections import Counter, OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptfile.picklevm import framing
from ptfile.picklevm.framing import FRAME_SIZE_MIN, FRAME_SIZE_TARGET
from ptfile.picklevm.pickler import Reduce, dumps, global_

FRAMED = [4, 5]
#: Payload sizes around the frame threshold and the opcodes' length fields.
SIZES = [0, 1, 3, 4, 255, 256, 65535, 65536, 65537, 140_000]


def assert_same_as_c(obj: object, protocol: int) -> bytes:
    expected = pickle.dumps(obj, protocol)
    actual = dumps(obj, protocol)
    assert actual == expected
    return actual


def frames(data: bytes) -> list[int]:
    """The FRAME lengths of a pickle, in order."""
    return [arg for op, arg, _ in pickletools.genops(data)
            if op.name == "FRAME" and isinstance(arg, int)]


@pytest.mark.parametrize("protocol", FRAMED)
@pytest.mark.parametrize("size", SIZES)
def test_framing_payloads_around_the_frame_size_match_c(size: int, protocol: int) -> None:
    text = "x" * size
    wide = "é" * (size // 2)  # two UTF-8 bytes a character: the threshold counts bytes
    for graph in ([text], [b"b" * size], [bytearray(size)], [1, text, 2, b"c" * size, 3],
                  {"k" * size: wide, "w": [wide, wide]}, (text, text.encode(), 7)):
        assert_same_as_c(graph, protocol)


@pytest.mark.parametrize("protocol", FRAMED)
def test_framing_large_payloads_are_written_outside_frames(protocol: int) -> None:
    data = assert_same_as_c(["a", b"p" * FRAME_SIZE_TARGET, "z"], protocol)
    # PROTO, a frame up to the payload's opcode, the payload bare, then a frame again
    assert data[:3] == bytes([0x80, protocol, 0x95])
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ops.count("FRAME") == 2
    assert b"\x95" + (FRAME_SIZE_TARGET + 0).to_bytes(8, "little") not in data


@pytest.mark.parametrize("protocol", FRAMED)
@pytest.mark.parametrize("count", [1, 5000, 20_000, 60_000])
def test_framing_many_small_objects_cross_frames_like_c(count: int, protocol: int) -> None:
    graph = [(i, str(i), [i] * (i % 3)) for i in range(count)]
    data = assert_same_as_c(graph, protocol)
    lengths = frames(data)
    assert all(n >= FRAME_SIZE_TARGET for n in lengths[:-1])  # committed once full
    assert 2 + sum(lengths) + 9 * len(lengths) == len(data)  # everything after PROTO framed


#: One object of each kind the handlers write, built afresh from a number.
KINDS: dict[str, Any] = {
    "none": lambda i: None, "bool": lambda i: i % 2 == 0, "int": lambda i: i * 7919,
    "float": lambda i: i / 3, "str": lambda i: str(i), "bytes": lambda i: str(i).encode(),
    "bytearray": lambda i: bytearray(str(i).encode()), "tuple": lambda i: (i, i + 1, i + 2, i),
    "list": lambda i: [i], "dict": lambda i: {"k": i}, "set": lambda i: {i},
    "frozenset": lambda i: frozenset({i}), "complex": lambda i: complex(i, 1),
    "ordered_dict": lambda i: OrderedDict(k=i), "counter": lambda i: Counter(k=i),
}


@pytest.mark.parametrize("protocol", FRAMED)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_framing_runs_of_every_kind_cross_frames_like_c(kind: str, protocol: int) -> None:
    # Every handler starts with a frame boundary: a run of its objects, fresh or shared
    # (GETs), crosses frames where the C pickler's do.
    make = KINDS[kind]
    fresh = [make(i) for i in range(70_000)]  # a byte or more each: 64 KiB crossed
    assert len(frames(assert_same_as_c(fresh, protocol))) > 1
    assert_same_as_c([fresh[0], *[fresh[1]] * 40_000], protocol)


def test_framing_frames_shorter_than_the_minimum_have_no_header() -> None:
    atoms: tuple[object, ...] = (None, 1, (), "", [], b"")
    for obj in atoms:
        data = assert_same_as_c(obj, 4)
        assert (b"\x95" in data[:3]) == (len(data) - 3 >= FRAME_SIZE_MIN)


@pytest.mark.parametrize("protocol", FRAMED)
def test_framing_sets_and_frozensets_use_their_own_opcodes(protocol: int) -> None:
    data = assert_same_as_c([set(), {1, 2}, frozenset(), frozenset({"a"})], protocol)
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert {"EMPTY_SET", "ADDITEMS", "FROZENSET"} <= ops
    assert "GLOBAL" not in ops and "STACK_GLOBAL" not in ops


def test_framing_bytearray_is_bytearray8_only_from_protocol_5() -> None:
    ops4 = [op.name for op, _, _ in pickletools.genops(assert_same_as_c(bytearray(b"ab"), 4))]
    ops5 = [op.name for op, _, _ in pickletools.genops(assert_same_as_c(bytearray(b"ab"), 5))]
    assert "STACK_GLOBAL" in ops4 and "BYTEARRAY8" not in ops4
    assert "BYTEARRAY8" in ops5 and "STACK_GLOBAL" not in ops5


def test_framing_header_lengths_switch_at_the_c_picklers_limits() -> None:
    # The 8-byte forms need 4 GiB payloads: their headers are checked on their own.
    header = framing._payload_header
    assert header(framing._STR_CODES, 255) == b"\x8c\xff"
    assert header(framing._STR_CODES, 256) == b"X\x00\x01\x00\x00"
    assert header(framing._STR_CODES, 2**32 - 1) == b"X\xff\xff\xff\xff"
    assert header(framing._STR_CODES, 2**32) == b"\x8d" + (2**32).to_bytes(8, "little")
    assert header(framing._BYTES_CODES, 255) == b"C\xff"
    assert header(framing._BYTES_CODES, 2**32 - 1) == b"B\xff\xff\xff\xff"
    assert header(framing._BYTES_CODES, 2**32) == b"\x8e" + (2**32).to_bytes(8, "little")


@pytest.mark.parametrize("protocol", FRAMED)
def test_framing_globals_share_their_modules_str_like_c(protocol: int) -> None:
    # OrderedDict and Counter name the module with one str: the second is a GET.
    expected = pickle.dumps([OrderedDict, Counter, OrderedDict], protocol)
    nodes = [global_("collections", "OrderedDict"), global_("collections", "Counter")]
    assert dumps([*nodes, nodes[0]], protocol) == expected
    ops = [op.name for op, _, _ in pickletools.genops(expected)]
    assert ops.count("STACK_GLOBAL") == 2 and ops.count("SHORT_BINUNICODE") == 3


def test_framing_module_owner_gives_a_module_str_of_its_own() -> None:
    shared = dumps([global_("torch", "Size"), global_("torch", "device")], 4)
    owned = dumps([global_("torch", "Size"), global_("torch", "float32", "torch.dtype")], 4)
    strings = [arg for op, arg, _ in pickletools.genops(owned) if op.name == "SHORT_BINUNICODE"]
    assert strings == ["torch", "Size", "torch", "float32"]
    assert [arg for op, arg, _ in pickletools.genops(shared)
            if op.name == "SHORT_BINUNICODE"] == ["torch", "Size", "device"]
    # Below protocol 4 a global is one GLOBAL line: the owner changes nothing.
    assert dumps(global_("torch", "float32", "torch.dtype"), 2) == dumps(
        global_("torch", "float32"), 2)


def test_framing_non_ascii_globals_are_utf8_strs() -> None:
    data = dumps(Reduce(global_("modulé", "näme"), ()), 4)
    strings = [arg for op, arg, _ in pickletools.genops(data) if op.name == "SHORT_BINUNICODE"]
    assert strings == ["modulé", "näme"]


_ATOMS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
          | st.text(max_size=20) | st.binary(max_size=20))
#: Runs of these fill frames: each handler must start with a boundary, as C save() does.
_LEAVES = _ATOMS | st.sampled_from([
    1 + 2j, OrderedDict(a=1), Counter("ab"), bytearray(b"ba"), {3}, frozenset({4}), [5], {"d": 6},
    (7, 8, 9, 10), (), "", b""])
_PAYLOADS = st.sampled_from(SIZES[3:]).flatmap(
    lambda n: st.sampled_from(["x" * n, b"y" * n, bytearray(n), "é" * (n // 2)]))


@st.composite
def _framed_graphs(draw: st.DrawFn) -> Any:
    """Runs of small items (to fill frames) and big payloads, nested at random."""
    pool: list[Any] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["run", "payload", "tuple", "dict", "set"]))
        if kind == "run":
            leaf = draw(_LEAVES)
            pool.append([leaf, (leaf,)] * draw(st.integers(0, 12_000)))
        elif kind == "payload":
            pool.append(draw(_PAYLOADS))
        elif kind == "tuple" and pool:
            pool.append(tuple(draw(st.lists(st.sampled_from(pool), max_size=5))))
        elif kind == "dict":
            pool.append({str(i): draw(_ATOMS) for i in range(draw(st.integers(0, 3000)))})
        else:
            pool.append(frozenset(draw(st.lists(st.integers(), max_size=50))))
    return pool


@settings(max_examples=40, deadline=None)
@given(graph=_framed_graphs(), protocol=st.sampled_from(FRAMED))
def test_framing_matches_c_on_graphs_that_cross_frames(graph: Any, protocol: int) -> None:
    assert_same_as_c(graph, protocol)
