"""What a DCP item is, decided once (ptfile.dcp.items): every reader agrees.

The four readers of a DCP directory are ptfile.load_dcp, ptfile.open (every value read),
ptfile.scan and the consolidation to one .pt (convert_dcp); the checkpoints are written
by real torch 2.13 and then altered, and torch's own dcp_to_torch_save is the oracle
where it reads the result.  scan reads the values' pickles and the safetensors blobs'
headers, never the tensor chunks' ZIPs (torch loads those weights-only).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ptfile
from ptfile.dcp.consolidate import convert_dcp
from ptfile.dcp.items import ItemKind, item_kind, stored_items
from ptfile.dcp.load import read_metadata

STATE = {"w": torch.arange(6, dtype=torch.float32), "step": 7}


def _metadata(directory: Path) -> Any:
    return pickle.loads((directory / ".metadata").read_bytes())


def _saved(directory: Path) -> Path:
    dcp.save({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in STATE.items()},
             checkpoint_id=directory)
    return directory


def _four_readers(directory: Path, out: Path, limits: ptfile.Limits | None = None
                  ) -> dict[str, Any]:
    """What each reader gives: its value, or the type of the ptfile error it raised
    (scan: the types named by its format findings)."""
    kw: dict[str, Any] = {} if limits is None else {"limits": limits}
    got: dict[str, Any] = {}

    def opened() -> dict[str, Any]:
        with ptfile.open(directory, **kw) as ck:
            return {k: ck.value(k) for k in ck.meta.state_dict_metadata}

    def converted() -> dict[str, Any]:
        convert_dcp(directory, out, to="pt", **kw)
        return ptfile.load(out)

    for name, read in (("load_dcp", lambda: ptfile.load_dcp(directory, **kw)),
                       ("open", opened), ("convert", converted)):
        try:
            got[name] = read()
        except ptfile.PtfileError as exc:
            got[name] = type(exc)
    scanned = ptfile.scan(directory, **kw)
    got["scan"] = sorted(f.message.split(": ")[1] for f in scanned.findings
                         if f.kind in ("format", "limit"))
    return got


def _values(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.numpy().tolist() if hasattr(v, "numpy") else v for k, v in state.items()}


def test_kinds_from_the_metadata(tmp_path: Path) -> None:
    meta = read_metadata((_saved(tmp_path / "ck") / ".metadata").read_bytes())
    kinds = [(fqn, kind) for fqn, kind, _ in stored_items(meta)]
    assert kinds == [("step", ItemKind.VALUE), ("w", ItemKind.TORCH_SAVE)]
    w = meta.state_dict_metadata["w"]
    info = meta.storage_data[("w", (0,))]
    assert item_kind(w, info, w.chunks[0], head=b"PK\x03\x04") is ItemKind.TORCH_SAVE
    with pytest.raises(ptfile.FormatError, match="not the chunk's 24"):
        item_kind(w, info, w.chunks[0], head=b"XK\x03\x04")


def test_chunk_whose_first_bytes_disagree_with_its_length(tmp_path: Path) -> None:
    """A torch.save chunk (its length more than the chunk's bytes) whose ZIP signature is
    damaged: the readers decided by the first bytes alone and took it for a safetensors
    blob, whose 'header length' then tripped max_safetensors_header_bytes (a
    LimitExceededError: raising the limit would not have helped).  Now every reader says
    the item disagrees with its metadata (torch fails on it too)."""
    directory = _saved(tmp_path / "ck")
    info = next(v for k, v in _metadata(directory).storage_data.items() if k.fqn == "w")
    data = bytearray((directory / info.relative_path).read_bytes())
    data[info.offset:info.offset + 2] = b"XX"
    (directory / info.relative_path).write_bytes(bytes(data))
    got = _four_readers(directory, tmp_path / "out.pt")
    assert got == {"load_dcp": ptfile.FormatError, "open": ptfile.FormatError,
                   "convert": ptfile.FormatError, "scan": []}  # scan reads no chunk ZIP
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException):
        dcp_to_torch_save(directory, tmp_path / "torch.pt")


def _deflated(item: bytes) -> bytes:
    """The torch.save ZIP ``item`` with its storage records deflated (as a re-zipping tool
    may write it; torch reads such a ZIP)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(item)) as zin, zipfile.ZipFile(out, "w") as zout:
        for record in zin.infolist():
            method = zipfile.ZIP_DEFLATED if "/data/" in record.filename else zipfile.ZIP_STORED
            zout.writestr(record.filename, zin.read(record), compress_type=method)
    return out.getvalue()


def test_chunk_with_a_deflated_record_agrees_with_torch(tmp_path: Path) -> None:
    """The consolidation located a torch.save chunk's storage record and copied its bytes
    in place, even when the record was deflated: the .pt held the compressed bytes as the
    tensor's values, where load_dcp, open and torch inflate them."""
    directory = _saved(tmp_path / "ck")
    meta = _metadata(directory)
    key = next(k for k in meta.storage_data if k.fqn == "w")
    info = meta.storage_data[key]
    path = directory / info.relative_path
    data = path.read_bytes()
    item = _deflated(data[info.offset:info.offset + info.length])
    info.offset, info.length = len(data), len(item)
    path.write_bytes(data + item)
    (directory / ".metadata").write_bytes(pickle.dumps(meta))

    got = _four_readers(directory, tmp_path / "out.pt")
    dcp_to_torch_save(directory, tmp_path / "torch.pt")
    expected = _values(torch.load(tmp_path / "torch.pt", weights_only=True))
    assert expected == {"w": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "step": 7}
    for name in ("load_dcp", "open", "convert"):
        assert _values(got[name]) == expected, name
    assert got["scan"] == []


def test_value_longer_than_its_zip(tmp_path: Path) -> None:
    """A value whose length runs past its ZIP's end record: all four refuse it (scan as a
    finding); torch's ZIP reader accepts the trailing bytes."""
    directory = _saved(tmp_path / "ck")
    meta = _metadata(directory)
    next(v for k, v in meta.storage_data.items() if k.fqn == "step").length += 5
    (directory / ".metadata").write_bytes(pickle.dumps(meta))
    got = _four_readers(directory, tmp_path / "out.pt")
    assert got["load_dcp"] is got["open"] is got["convert"] is ptfile.FormatError
    scanned = ptfile.scan(directory)
    assert any("after the end of the archive" in f.message for f in scanned.findings)


def _safetensors_dcp(directory: Path) -> Path:
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    dcp.save({"w": torch.arange(6, dtype=torch.float32), "step": 7},
             storage_writer=dcp.FileSystemWriter(
                 directory, serialization_format=SerializationFormat.SAFETENSORS))
    return directory


def _hf_dcp(directory: Path) -> Path:
    dcp.save({"w": torch.arange(6, dtype=torch.float32)},
             storage_writer=dcp.HuggingFaceStorageWriter(str(directory)))
    return directory


@pytest.mark.parametrize("make", [_safetensors_dcp, _hf_dcp], ids=["safetensors-format", "hf"])
def test_oversized_safetensors_header_is_the_limit_everywhere(tmp_path: Path, make: Any) -> None:
    """A safetensors header over Limits.max_safetensors_header_bytes, in a blob of a DCP
    directory: every reader raises LimitExceededError (scan reports it), and reads it
    under the default limits."""
    directory = make(tmp_path / "ck")
    small = ptfile.Limits(max_safetensors_header_bytes=16)
    got = _four_readers(directory, tmp_path / "small.pt", small)
    assert got == {"load_dcp": ptfile.LimitExceededError, "open": ptfile.LimitExceededError,
                   "convert": ptfile.LimitExceededError, "scan": ["LimitExceededError"]}
    fine = _four_readers(directory, tmp_path / "fine.pt")
    assert fine["scan"] == []
    for name in ("load_dcp", "open", "convert"):
        assert np.array_equal(fine[name]["w"].numpy(), np.arange(6, dtype="f4")), name
