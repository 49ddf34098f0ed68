"""check_stream and genops: agreement with pickle/pickletools, exactness, hostile streams."""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptfile.errors import LimitExceededError, PickleStreamError, PtfileError
from ptfile.limits import Limits
from ptfile.picklevm import BY_CODE, BY_NAME, OPCODES, Opcode, StreamInfo, check_stream, genops
from pvm_support import PROTOCOLS, normalised_pickletools, objects, outcome

# --------------------------------------------------------------------------- valid streams


@given(objects(), st.sampled_from(PROTOCOLS))
def test_check_stream_end_is_the_end_of_real_pickles(obj: Any, protocol: int) -> None:
    data = pickle.dumps(obj, protocol)
    info = check_stream(data)
    assert info.end == len(data)
    assert info.protocol == (protocol if protocol >= 2 else 0)
    assert outcome(data, fast=True) == outcome(data, fast=False)


@given(objects(), st.sampled_from(PROTOCOLS), st.binary(max_size=9), st.binary(max_size=9))
def test_check_stream_reads_from_start_and_ignores_what_follows(
        obj: Any, protocol: int, head: bytes, tail: bytes) -> None:
    data = pickle.dumps(obj, protocol)
    info = check_stream(head + data + tail, start=len(head))
    assert (info.start, info.end) == (len(head), len(head) + len(data))
    assert check_stream(memoryview(bytearray(head + data)), start=len(head)).end == info.end


@given(objects(), st.sampled_from(PROTOCOLS))
def test_genops_agrees_with_pickletools(obj: Any, protocol: int) -> None:
    data = pickle.dumps(obj, protocol)
    ours = [(op.opcode.name, op.arg, op.pos) for op in genops(data)]
    assert ours == normalised_pickletools(data)


def test_genops_decodes_protocol_0_text_arguments() -> None:
    data = b"(S'a\\nb'\nI01\nF1.5\nL12L\nVx\\u20ac\ncmod\nname\np0\nPpid\nt."
    args = [op.arg for op in genops(data)]
    assert args == [None, b"a\nb", True, 1.5, 12, "x\u20ac", ("mod", "name"), 0, "pid",
                    None, None]


def test_check_stream_reports_depth_and_ext() -> None:
    info = check_stream(b"\x80\x02((K\x01t\x82\x01t.")
    assert info == StreamInfo(0, 11, 2, 2, 7)
    assert info.size == 11


# --------------------------------------------------------------------------- the two gears agree

_FIXED = [op for op in OPCODES if op.fixed_size is not None and op.name != "STOP"]
_COUNTED = [op for op in OPCODES if op.arg is not None and op.arg.counted]
_CLOSERS = [op.code for op in OPCODES if op.pops_mark and op.fixed_size]
_LIMITS = [Limits(), Limits(max_depth=2), Limits(max_depth=4, max_memo_index=5000),
           Limits(max_name_length=4)]


_SAFE = [b"N", b"K\x01", b"h\x00", b")", b"R", b"X\x01\x00\x00\x00a", b"\x8c\x00", b"J\x00\x00\x00\x00"]


@st.composite
def _group(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A MARK group (sometimes left open) of valid opcodes and nested groups."""
    parts = [b"("]
    for _ in range(draw(st.integers(0, 5))):
        if depth < 5 and draw(st.integers(0, 3)) == 0:
            parts.append(draw(_group(depth + 1)))
        else:
            parts.append(draw(st.sampled_from(_SAFE)))
    if draw(st.integers(0, 9)):
        parts.append(bytes([draw(st.sampled_from(_CLOSERS))]))
    return b"".join(parts)


_KINDS = ["pad"] * 3 + ["fixed"] * 4 + ["group"] * 5 + ["counted"] * 3 + ["memo"] * 3 + [
    "text", "mark", "closer", "byte"]


@st.composite
def _token(draw: st.DrawFn, offset: int) -> bytes:
    """One opcode (or a run or group of them) likely to sit near a rule's boundary."""
    kind = draw(st.sampled_from(_KINDS))
    if kind == "pad":
        return draw(st.sampled_from([b"N0", b"K\x00", b"q\x07"])) * draw(st.integers(0, 3000))
    if kind == "fixed":
        op = draw(st.sampled_from(_FIXED))
        size = (op.fixed_size or 1) - 1
        arg = draw(st.binary(min_size=size, max_size=size))
        if op.name == "PROTO" and draw(st.integers(0, 9)):
            arg = bytes([draw(st.integers(0, 5))])
        return bytes([op.code]) + arg
    if kind == "group":
        return draw(_group())
    if kind == "counted":
        op = draw(st.sampled_from(_COUNTED))
        assert op.arg is not None
        length = draw(st.integers(0, 300)) if draw(st.integers(0, 9)) else draw(
            st.sampled_from([2**31 - 1, 2**31, 2**62]))
        prefix = (length % (1 << 8 * op.arg.size)).to_bytes(op.arg.size, "little")
        given = draw(st.integers(0, 400)) if draw(st.integers(0, 4)) == 0 else length
        return bytes([op.code]) + prefix + bytes(min(length, given, 400))
    if kind == "memo":
        index = draw(st.sampled_from([offset - 1, offset, offset + 1, offset // 2, 255, 256])
                     | st.integers(0, max(offset, 255)) | st.integers(0, 2**32 - 1))
        if draw(st.integers(0, 3)):
            return b"r" + (index % 2**32).to_bytes(4, "little")
        return b"p" + str(index).encode() + b"\n"
    if kind == "text":
        names = draw(st.lists(st.binary(max_size=7).filter(lambda b: b"\n" not in b),
                              min_size=2, max_size=2))
        return draw(st.sampled_from([b"c", b"i"])) + b"\n".join(names) + b"\n"
    if kind == "mark":
        return b"("
    if kind == "closer":
        return bytes([draw(st.sampled_from(_CLOSERS))])
    return bytes([draw(st.integers(0, 255))])


@st.composite
def op_streams(draw: st.DrawFn) -> bytes:
    """Streams mixing every kind of opcode, valid or not, across the fast gear's boundaries."""
    out = bytearray(draw(st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05"])))
    for _ in range(draw(st.integers(0, 40))):
        out += draw(_token(len(out)))
    if draw(st.integers(0, 9)):
        out += b"."
    return bytes(out)


@st.composite
def valid_streams(draw: st.DrawFn) -> bytes:
    """Valid streams of long runs, deep MARK groups, memo indices at their bound."""
    out = bytearray(b"\x80\x02")
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["pad", "group", "memo", "text"]))
        if kind == "pad":
            out += draw(st.sampled_from(_SAFE)) * draw(st.integers(0, 2000))
        elif kind == "group":
            out += draw(_group().filter(lambda g: g.count(b"(") == sum(
                g.count(bytes([c])) for c in _CLOSERS)))
        elif kind == "memo":
            index = draw(st.integers(0, max(255, len(out))) | st.sampled_from([len(out)]))
            out += b"r" + index.to_bytes(4, "little")
        else:
            out += b"X" + draw(st.integers(0, 600)).to_bytes(4, "little")
            out += b"x" * int.from_bytes(out[-4:], "little")
    return bytes(out + b".")


@given(valid_streams(), st.sampled_from(_LIMITS[:3]))
def test_fast_gear_agrees_on_valid_streams(data: bytes, limits: Limits) -> None:
    fast = outcome(data, limits, fast=True)
    assert fast == outcome(data, limits, fast=False)
    if limits.max_depth > 5:
        assert fast[0] == len(data)


@pytest.mark.parametrize("offset", [400, 700, 1024, 1500, 3000, 5000, 20000, 70000, 300000])
@pytest.mark.parametrize("scale", [0.5, 1, 1.01, 1.3, 1.9, 2.5, 3.9])
def test_fast_gear_memo_bound_is_the_stream_length(offset: int, scale: float) -> None:
    # The 300-character string stops a fast run, so the next run starts at LONG_BINPUT.
    head = b"\x80\x02" + b"N" * (offset - 307) + b"X" + (300).to_bytes(4, "little") + b"s" * 300
    tail = b"N" * 5000 + b"."
    length = len(head) + 5 + len(tail)
    index = int(length * scale)
    data = head + b"r" + index.to_bytes(4, "little") + tail
    fast = outcome(data, fast=True)
    assert fast == outcome(data, fast=False)
    assert len(head) == offset
    assert (fast[0] == len(data)) == (index <= length)


@pytest.mark.parametrize("scale", [0.5, 1, 1.01, 3])
@pytest.mark.parametrize("trailing", [0, 100, 10_000, 300_000])
def test_memo_bound_is_the_stream_not_the_data_after_it(scale: float, trailing: int) -> None:
    # Bytes after STOP (a legacy file's storages) do not raise the bound.
    stream = b"\x80\x02" + b"N" * 200_000 + b"r" + int(200_008 * scale).to_bytes(4, "little") + b"."
    data = stream + b"\x00" * trailing
    if scale <= 1:
        assert check_stream(data).end == len(stream)
    else:
        with pytest.raises(PickleStreamError, match="cannot exceed the stream's length") as caught:
            check_stream(data)
        assert caught.value.offset == 200_002


@pytest.mark.parametrize("op", _FIXED, ids=lambda op: op.name)
@pytest.mark.parametrize("fill", [0x00, 0x01, 0xFF])
def test_fast_gear_agrees_on_every_fixed_opcode(op: Opcode, fill: int) -> None:
    arg = bytes([fill]) * (op.fixed_size - 1) if op.fixed_size else b""
    for head in (b"", b"(", b"N" * 5000):
        data = b"\x80\x02" + head + bytes([op.code]) + arg + b"N" * 100 + b"t" * len(head) + b"."
        assert outcome(data, fast=True) == outcome(data, fast=False)


@given(op_streams(), st.sampled_from(_LIMITS))
def test_fast_gear_agrees_with_exact_gear(data: bytes, limits: Limits) -> None:
    assert outcome(data, limits, fast=True) == outcome(data, limits, fast=False)


@given(op_streams(), st.sampled_from([*_LIMITS, Limits(max_opcodes=20),
                                     Limits(max_memo_index=100)]))
def test_exact_gear_agrees_with_the_step_reference(data: bytes, limits: Limits) -> None:
    # walk_exact skips plain opcodes inline; walk_steps checks each one with step.
    assert outcome(data, limits, fast=False, counts=True) == \
        outcome(data, limits, fast=False, steps=True, counts=True)


@given(valid_streams(), st.sampled_from(_LIMITS[:3]))
def test_exact_gear_agrees_with_the_step_reference_on_valid_streams(
        data: bytes, limits: Limits) -> None:
    assert outcome(data, limits, fast=False, counts=True) == \
        outcome(data, limits, fast=False, steps=True, counts=True)


@given(op_streams(), st.sampled_from(_LIMITS))
def test_run_gear_agrees_with_exact_gear(data: bytes, limits: Limits) -> None:
    assert outcome(data, limits, fast=False, runs=True) == outcome(data, limits, fast=False)


@given(valid_streams(), st.sampled_from(_LIMITS[:3]))
def test_run_gear_agrees_on_valid_streams(data: bytes, limits: Limits) -> None:
    assert outcome(data, limits, fast=False, runs=True) == outcome(data, limits, fast=False)


@pytest.mark.parametrize("op", _FIXED, ids=lambda op: op.name)
def test_run_gear_agrees_on_every_fixed_opcode(op: Opcode) -> None:
    arg = b"\xff" * (op.fixed_size - 1) if op.fixed_size else b""
    for head in (b"", b"(", b"N" * 5000):
        data = b"\x80\x02" + head + bytes([op.code]) + arg + b"N" * 100 + b"t" * len(head) + b"."
        assert outcome(data, fast=False, runs=True) == outcome(data, fast=False)


@pytest.mark.parametrize("size", [1 << 10, 1 << 14, 1 << 20])
def test_check_stream_chooses_its_gear_by_size(size: int) -> None:
    # Each gear alone gives the same answer; check_stream's own choice must too.
    data = b"\x80\x02" + b"r\x00\x01\x00\x00" + b"N" * size + b"0" + b"r\x00\x01\x00\x00."
    assert check_stream(data).end == len(data)
    beyond = data[:-6] + b"r" + (2 * len(data)).to_bytes(4, "little") + b"."
    with pytest.raises(PickleStreamError, match="cannot exceed the stream's length") as caught:
        check_stream(beyond)
    assert caught.value.offset == len(data) - 6


@given(op_streams(), st.integers(0, 2**20), st.integers(0, 7))
def test_fast_gear_agrees_after_a_bit_flip(data: bytes, where: int, bit: int) -> None:
    flipped = bytearray(data)
    if flipped:
        flipped[where % len(flipped)] ^= 1 << bit
    exact = outcome(bytes(flipped), fast=False)
    assert outcome(bytes(flipped), fast=True) == exact
    assert outcome(bytes(flipped), fast=False, runs=True) == exact


def _torch_data_pkl(tensors: int) -> bytes:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save({f"model.layers.{i}.weight": torch.ones(2) for i in range(tensors)}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        return archive.read(name)


def test_fast_gear_agrees_on_a_torch_state_dict() -> None:
    data = _torch_data_pkl(3000)  # memo indices past 2**12, offsets past 2**18, 3 SETITEMS
    assert outcome(data, fast=True) == outcome(data, fast=False) == (len(data), 3, 2, None)
    assert outcome(data, fast=False, runs=True) == (len(data), 3, 2, None)
    assert check_stream(data, Limits(max_depth=3)).max_depth == 3
    with pytest.raises(LimitExceededError, match="max_depth"):
        check_stream(data, Limits(max_depth=2))


# --------------------------------------------------------------------------- hostile streams

_HUGE = 2**62
_HOSTILE: dict[str, bytes] = {
    "memo index 10**8": bytes.fromhex("80024e7200e1f5052e"),
    "memo index 2**32-1": b"\x80\x02Nr\xff\xff\xff\xff.",
    "text memo index": b"N p99999999999999999999999999999\n.",
    "BINBYTES8 2**62": b"\x80\x04\x8e" + _HUGE.to_bytes(8, "little") + b"x.",
    "BINUNICODE8 2**62": b"\x80\x04\x8d" + _HUGE.to_bytes(8, "little") + b"x.",
    "BYTEARRAY8 2**62": b"\x80\x05\x96" + _HUGE.to_bytes(8, "little") + b"x.",
    "BINUNICODE 2**32-1": b"\x80\x02X\xff\xff\xff\xffx.",
    "BINSTRING negative": b"T\xff\xff\xff\xffx.",
    "LONG4 negative": b"\x80\x02\x8b\xff\xff\xff\xffx.",
    "FRAME 2**62": b"\x80\x04\x95" + _HUGE.to_bytes(8, "little") + b"N.",
    "10**6 nested MARKs": b"\x80\x02" + b"(" * 10**6 + b"t" * 10**6 + b".",
    "GLOBAL name of 1 MB": b"\x80\x02c" + b"m" * 10**6 + b"\nx\n.",
    "PROTO 6": b"\x80\x06N.",
    "pop without MARK": b"\x80\x02t.",
    "no STOP": b"\x80\x02" + b"N" * 1000,
    "empty": b"",
}


@pytest.mark.parametrize("name", _HOSTILE)
def test_hostile_streams_are_refused(name: str) -> None:
    with pytest.raises(PtfileError) as caught:
        check_stream(_HOSTILE[name])
    assert isinstance(caught.value, (PickleStreamError, LimitExceededError))


def test_the_nine_byte_memo_bomb_names_its_offset() -> None:
    with pytest.raises(PickleStreamError, match=r"memo index 100000000") as caught:
        check_stream(_HOSTILE["memo index 10**8"])
    assert caught.value.offset == 3


def test_unknown_opcodes_are_refused() -> None:
    for code in set(range(256)) - set(BY_CODE):
        with pytest.raises(PickleStreamError, match="unknown opcode") as caught:
            check_stream(b"\x80\x02" + bytes([code]) + b".")
        assert caught.value.offset == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_truncation_is_a_pickle_stream_error(protocol: int) -> None:
    data = pickle.dumps([{"k": (1, 2.5, "v" * 300, b"b" * 300)}, 2**100, None], protocol)
    for cut in range(len(data)):
        with pytest.raises(PickleStreamError):
            check_stream(data[:cut])
        with pytest.raises(PickleStreamError):
            list(genops(data[:cut]))


@given(st.binary(max_size=200))
def test_garbage_raises_only_ptfile_errors(data: bytes) -> None:
    for walk in (lambda: check_stream(data), lambda: list(genops(data))):
        try:
            walk()
        except (PickleStreamError, LimitExceededError):
            pass


# --------------------------------------------------------------------------- limits


def test_memo_indices_up_to_255_or_the_length_are_accepted() -> None:
    check_stream(b"Nq\xff.")
    check_stream(b"N" * 300 + b"r" + (306).to_bytes(4, "little") + b".")  # 306 bytes
    with pytest.raises(PickleStreamError):
        check_stream(b"N" * 300 + b"r" + (307).to_bytes(4, "little") + b".")


def test_limits_are_enforced() -> None:
    deep = b"(" * 5 + b"t" * 5 + b"."
    assert check_stream(deep, Limits(max_depth=5)).max_depth == 5
    cases = [
        (deep, Limits(max_depth=4), "max_depth"),
        (b"N" * 100 + b".", Limits(max_pickle_bytes=50), "max_pickle_bytes"),
        (b"N" * 100 + b".", Limits(max_opcodes=50), "max_opcodes"),
        (b"N" * 300 + b"r\x2c\x01\x00\x00.", Limits(max_memo_index=299), "max_memo_index"),
        (b"Nq\x09.", Limits(max_memo_index=8), "max_memo_index"),
        (b"cmodule\nname\n.", Limits(max_name_length=5), "max_name_length"),
        (b"X\x05\x00\x00\x00abcde.", Limits(max_pickle_bytes=8), "max_pickle_bytes"),
    ]
    for data, limits, limit in cases:
        with pytest.raises(LimitExceededError) as caught:
            check_stream(data, limits)
        assert caught.value.limit == limit
        with pytest.raises(PtfileError):
            check_stream(data, limits)
    check_stream(b"cmodul\nname\n.", Limits(max_name_length=6))


def test_opcode_count_limit_uses_the_exact_gear() -> None:
    assert check_stream(b"N0" * 20 + b"N.", Limits(max_opcodes=42)).end == 42
    with pytest.raises(LimitExceededError):
        check_stream(b"N0" * 20 + b"N.", Limits(max_opcodes=41))


def test_stop_inside_an_argument_is_not_the_end() -> None:
    assert check_stream(b"K.K..").end == 5
    assert [op.opcode.name for op in genops(b"K.K..")] == ["BININT1", "BININT1", "STOP"]


def test_disassembly_of_the_torch_example_matches_pickletools() -> None:
    data = _torch_data_pkl(2)
    assert [(op.opcode.name, op.pos) for op in genops(data)] == [
        (op.name, pos) for op, _, pos in pickletools.genops(data)]
    assert BY_NAME["BINPERSID"] in {op.opcode for op in genops(data)}
