"""Mutation fuzzing of every format: load (strict and structural) and scan never break the contract.

Mutations: truncation, bit flips, splices (bytes of another sample written
over a region), duplicated ZIP records, and pickle-opcode edits (one byte of a
record's pickle replaced by a random opcode).  The oracle: success or a
:class:`ptfile.PtfileError`, within a time bound; ``scan`` succeeds, or raises a
:class:`ptfile.PtfileError` for a file that is damaged and holds nothing else to report
(the CLI's exit 2, never ``unknown``).
Memory bounds are checked by the hostile corpus, which runs in a limited child.
"""

from __future__ import annotations

import io
import pickle
import time
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile
from hostile import raw_zip
from ptfile._io.local import BytesSource
from ptfile.limits import Limits
from ptfile.picklevm import OPCODES
from ptfile.scanning.containers import read_member, walk_zip
from test_error_contract import SAMPLES as CONTRACT_SAMPLES

#: Seconds one mutated file may take to load twice and scan.
TIME_BOUND = 5.0


def _whole_model() -> bytes:
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), buf)
    return buf.getvalue()


SAMPLES = {**CONTRACT_SAMPLES, "whole_model": _whole_model(),
           "plain_pickle": pickle.dumps({"a": [1, 2.5, "x"], "b": (None, True)}, protocol=4)}
NAMES = sorted(SAMPLES)
OPCODE_BYTES = [op.code for op in OPCODES]


def _check(data: bytes) -> None:
    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptfile.PtfileWarning)
        for structural in (False, True):
            try:
                ptfile.load(io.BytesIO(data), structural=structural)
            except ptfile.PtfileError:
                pass
    try:
        result = ptfile.scan(data)
    except ptfile.PtfileError:
        pass  # damaged, with no finding to report: an error
    else:
        assert result.to_dict()["verdict"] in ("allowed", "unknown", "dangerous")
    assert time.perf_counter() - began < TIME_BOUND


@settings(max_examples=80)
@given(st.sampled_from(NAMES), st.data())
def test_fuzz_truncate(name: str, data: st.DataObject) -> None:
    sample = SAMPLES[name]
    _check(sample[:data.draw(st.integers(0, len(sample) - 1))])


@settings(max_examples=120)
@given(st.sampled_from(NAMES), st.data())
def test_fuzz_bit_flips(name: str, data: st.DataObject) -> None:
    sample = bytearray(SAMPLES[name])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(sample) - 1))
        sample[at] ^= 1 << data.draw(st.integers(0, 7))
    _check(bytes(sample))


@settings(max_examples=80)
@given(st.sampled_from(NAMES), st.sampled_from(NAMES), st.data())
def test_fuzz_splice(name: str, other: str, data: st.DataObject) -> None:
    sample, donor = bytearray(SAMPLES[name]), SAMPLES[other]
    at = data.draw(st.integers(0, len(sample) - 1))
    start = data.draw(st.integers(0, len(donor) - 1))
    piece = donor[start:start + data.draw(st.integers(1, 256))]
    sample[at:at + len(piece)] = piece
    _check(bytes(sample))


def _members(name: str) -> list[tuple[str, bytes]]:
    # zipfile refuses the CRC-less sample torch writes; ptfile's own walk reads it.
    source = BytesSource(SAMPLES[name])
    walked = walk_zip(source)
    assert walked is not None
    limits = Limits(max_pickle_bytes=1 << 30)
    return [(e.name, read_member(source, e, limits) or b"") for e in walked[0]]


ZIP_NAMES = [n for n in NAMES if SAMPLES[n][:4] == b"PK\x03\x04"]


@settings(max_examples=30)
@given(st.sampled_from(ZIP_NAMES), st.data())
def test_fuzz_duplicate_records(name: str, data: st.DataObject) -> None:
    members = _members(name)
    index = data.draw(st.integers(0, len(members) - 1))
    copy = (members[index][0], data.draw(st.binary(max_size=64)) or members[index][1])
    members.insert(data.draw(st.integers(0, len(members))), copy)
    result = ptfile.scan(raw_zip(members))
    assert "duplicate-name" in {f.name for f in result.findings}
    _check(raw_zip(members))


@settings(max_examples=120)
@given(st.sampled_from(ZIP_NAMES), st.data())
def test_fuzz_pickle_opcode_edits(name: str, data: st.DataObject) -> None:
    members = _members(name)
    pickles = [i for i, (n, _) in enumerate(members) if n.endswith(".pkl")]
    index = data.draw(st.sampled_from(pickles))
    record = bytearray(members[index][1])
    for _ in range(data.draw(st.integers(1, 3))):
        record[data.draw(st.integers(0, len(record) - 1))] = data.draw(
            st.sampled_from(OPCODE_BYTES))
    members[index] = (members[index][0], bytes(record))
    _check(raw_zip(members))


@settings(max_examples=80)
@given(st.data())
def test_fuzz_legacy_opcode_edits(data: st.DataObject) -> None:
    sample = bytearray(SAMPLES["ptfile_legacy"])
    at = data.draw(st.integers(0, len(sample) - 1))
    sample[at] = data.draw(st.sampled_from(OPCODE_BYTES))
    _check(bytes(sample))
