"""The opcode table agrees with pickletools, the executable documentation of pickle."""

from __future__ import annotations

import pickle
import pickletools

import pytest

from ptfile.picklevm.opcodes import (
    ARG_KINDS,
    BY_CODE,
    BY_NAME,
    HIGHEST_PROTOCOL,
    OPCODES,
    ArgKind,
    Opcode,
)

_REFERENCE = {op.name: op for op in pickletools.opcodes}


def _pickletools_n(kind: ArgKind) -> int:
    """The ``ArgumentDescriptor.n`` that ``kind`` stands for."""
    if kind.lines:
        return pickletools.UP_TO_NEWLINE
    if not kind.counted:
        return kind.size
    return {
        (1, False): pickletools.TAKEN_FROM_ARGUMENT1,
        (4, True): pickletools.TAKEN_FROM_ARGUMENT4,
        (4, False): pickletools.TAKEN_FROM_ARGUMENT4U,
        (8, False): pickletools.TAKEN_FROM_ARGUMENT8U,
    }[kind.size, kind.signed]


def test_opcodes_cover_pickletools_in_its_order() -> None:
    assert [op.name for op in OPCODES] == [op.name for op in pickletools.opcodes]


def test_opcodes_codes_and_names_are_unique() -> None:
    assert len(BY_CODE) == len(BY_NAME) == len(OPCODES) == 68


@pytest.mark.parametrize("op", OPCODES, ids=lambda op: op.name)
def test_opcode_matches_pickletools(op: Opcode) -> None:
    ref = _REFERENCE[op.name]
    assert op.code == ref.code.encode("latin-1")[0]
    assert op.protocol == ref.proto
    assert op.pushes_mark == (pickletools.markobject in ref.stack_after)
    assert op.pops_mark == (pickletools.markobject in ref.stack_before)
    if ref.arg is None:
        assert op.arg is None
    else:
        assert op.arg is not None
        assert op.arg.name == ref.arg.name
        assert _pickletools_n(op.arg) == ref.arg.n


def test_arg_kinds_are_exactly_those_pickletools_uses() -> None:
    used = {op.arg.name for op in pickletools.opcodes if op.arg is not None}
    assert set(ARG_KINDS) == used
    assert all(name == kind.name for name, kind in ARG_KINDS.items())


def test_text_arguments_have_lines_and_only_global_names_two() -> None:
    two = {op.name for op in OPCODES if op.arg is not None and op.arg.lines == 2}
    assert two == {"GLOBAL", "INST"}


def test_highest_protocol_is_the_highest_opcode_protocol() -> None:
    assert HIGHEST_PROTOCOL == max(op.protocol for op in OPCODES) == pickle.HIGHEST_PROTOCOL


def test_fixed_size_counts_the_opcode_byte() -> None:
    assert BY_NAME["STOP"].fixed_size == 1
    assert BY_NAME["LONG_BINPUT"].fixed_size == 5
    assert BY_NAME["BINUNICODE"].fixed_size is None
    assert BY_NAME["GLOBAL"].fixed_size is None
