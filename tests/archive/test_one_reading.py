"""One reading, torch's: for an ambiguous file ptfile refuses, or reads what torch reads.

Each file below can be read two ways (two data.pkl records, a renamed local
header, a record the directory never names, a second archive in the comment,
a pickle before the archive, a second pickle after STOP).  The two readings
hold different benign values; torch 2.13 is the oracle.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Callable

import pytest
import torch

import ptfile
from hostile import checkpoint, raw_zip
from ptfile.archive.records import EndOfCentralDirectory

A, B = pickle.dumps({"v": 1}, protocol=2), pickle.dumps({"v": 2}, protocol=2)
D, V = "archive/data.pkl", "archive/version"
VERSION = b"3\n"

AMBIGUOUS: dict[str, Callable[[], bytes]] = {
    "duplicate_names": lambda: raw_zip([(D, A), (D, B), (V, VERSION)]),
    "case_colliding_names": lambda: raw_zip([(D, A), ("archive/DATA.pkl", B), (V, VERSION)]),
    "local_name_differs": lambda: raw_zip([(D, A), (V, VERSION)],
                                          local_names={0: "archive/other.pkl"}),
    "shadow_record": lambda: raw_zip([(D, B), (D, A), (V, VERSION)], central=[(D, 1), (V, 2)]),
    "archive_in_comment": lambda: raw_zip([(D, A), (V, VERSION)],
                                          comment=raw_zip([(D, B), (V, VERSION)])),
    "pickle_then_zip": lambda: B + checkpoint(A),
    "data_after_stop": lambda: checkpoint(A + B),
    "end_record_comment_past_end": lambda: _comment_past_end(raw_zip([(D, A), (V, VERSION)]),
                                                             [(D, B), (V, VERSION)]),
}


def _comment_past_end(first: bytes, members: list[tuple[str, bytes]]) -> bytes:
    """``first``, then an archive of ``members`` whose end record's comment length (255)
    runs past the end of the file.  The last end record is the second archive's."""
    both = raw_zip(members, prefix=first)
    end = EndOfCentralDirectory.from_bytes(both, len(both) - EndOfCentralDirectory.SIZE)
    cut = dataclasses.replace(end, comment=b"\0" * 255).to_bytes()[:EndOfCentralDirectory.SIZE]
    return both[:-EndOfCentralDirectory.SIZE] + cut


def _torch_reading(data: bytes) -> object:
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal by torch counts as one
        return type(exc)


@pytest.mark.parametrize("name", sorted(AMBIGUOUS))
def test_one_reading_refuse_or_agree_with_torch(name: str) -> None:
    # end_record_comment_past_end: issue 11, ptfile read the first archive, torch the second.
    data = AMBIGUOUS[name]()
    try:
        ours = ptfile.load(io.BytesIO(data))
    except ptfile.PtfileError:
        return
    assert ours == _torch_reading(data), name


@pytest.mark.parametrize("name", sorted(AMBIGUOUS))
def test_one_reading_scan_reports_the_ambiguity(name: str) -> None:
    result = ptfile.scan(AMBIGUOUS[name]())
    assert not result.is_clean, name
    assert {f.kind for f in result.findings} & {"archive", "stream", "format"}
