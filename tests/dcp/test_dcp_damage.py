"""Damaged DCP directories raise ptfile errors, never stray builtins or silent garbage.

The checkpoints are written by real torch 2.13; the damage is done to torch's own
``.metadata`` objects (re-pickled) or to the bytes of the files.  Each front door is
tried: load_dcp, open (+ every tensor read), inspect, scan and verify (which reports
instead of raising).
"""

from __future__ import annotations

import copy
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

import ptfile
from dcp_cases import make_chunked
from ptfile.inspection import verify


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("damage") / "ckpt"
    make_chunked(directory)
    return directory


def _metadata(directory: Path) -> Any:
    return pickle.loads((directory / ".metadata").read_bytes())


def _every_front_door(directory: Path) -> list[str]:
    """Run every reader on ``directory``; the ptfile errors raised (others propagate)."""
    raised = []
    for attempt in (lambda: ptfile.load_dcp(directory), lambda: _read_all(directory),
                    lambda: ptfile.inspect(directory), lambda: ptfile.scan(directory)):
        try:
            attempt()
        except ptfile.PtfileError as exc:
            raised.append(type(exc).__name__)
    report = verify(directory)
    if raised:
        assert not report.ok, report.to_dict()
    return raised


def _read_all(directory: Path) -> None:
    with ptfile.open(directory) as ck:
        for name in ck:
            ck.get_tensor(name)
            ck.get_slice(name)[...]


def _rewritten(source: Path, target: Path, meta: Any) -> Path:
    shutil.copytree(source, target)
    (target / ".metadata").write_bytes(pickle.dumps(meta))
    return target


def test_length_that_disagrees_with_the_item(source: Path, tmp_path: Path) -> None:
    for delta in (1, 64, -1):
        for key in _metadata(source).storage_data:
            meta = _metadata(source)
            meta.storage_data[key].length += delta
            bad = _rewritten(source, tmp_path / f"{delta}-{key.fqn}-{key.index}", meta)
            with pytest.raises(ptfile.FormatError, match=r"disagrees|outside"):
                ptfile.load_dcp(bad)


def test_offsets_beyond_the_file(source: Path, tmp_path: Path) -> None:
    meta = _metadata(source)
    info = next(iter(meta.storage_data.values()))
    info.offset = (source / info.relative_path).stat().st_size + 10
    with pytest.raises(ptfile.FormatError, match="outside"):
        ptfile.load_dcp(_rewritten(source, tmp_path / "beyond", meta))
    info.offset = -5
    with pytest.raises(ptfile.FormatError, match="outside"):
        ptfile.load_dcp(_rewritten(source, tmp_path / "negative", meta))


def test_missing_chunk_entry_and_missing_chunk(source: Path, tmp_path: Path) -> None:
    meta = _metadata(source)
    del meta.storage_data[MetadataIndex("w", torch.Size([3, 0]))]
    bad = _rewritten(source, tmp_path / "entry", meta)
    with pytest.raises(ptfile.FormatError, match="no storage entry"):
        ptfile.load_dcp(bad)
    with ptfile.open(bad) as ck:  # the metadata reads; the tensor, even a slice of it, not
        assert ck.info("w").shape == (9, 4)
        with pytest.raises(ptfile.FormatError, match="no storage entry"):
            ck.get_slice("w")[:3]
    assert not verify(bad).ok
    meta = _metadata(source)
    meta.state_dict_metadata["w"].chunks.pop(1)
    with pytest.raises(ptfile.FormatError, match="cover"):
        ptfile.load_dcp(_rewritten(source, tmp_path / "chunk", meta))


def test_overlapping_chunks(source: Path, tmp_path: Path) -> None:
    meta = _metadata(source)
    chunks = meta.state_dict_metadata["w"].chunks
    chunks[1] = ChunkStorageMetadata(torch.Size([2, 0]), chunks[1].sizes)
    meta.storage_data[MetadataIndex("w", torch.Size([2, 0]))] = meta.storage_data.pop(
        MetadataIndex("w", torch.Size([3, 0])))
    bad = _rewritten(source, tmp_path / "overlap", meta)
    with pytest.raises(ptfile.FormatError, match=r"overlap|cover"):
        ptfile.load_dcp(bad)
    assert any("overlap" in p.message or "cover" in p.message for p in verify(bad).problems)


def test_missing_and_truncated_files(source: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in source.glob("*.distcp"))
    for name in names:
        bad = tmp_path / f"missing-{name}"
        shutil.copytree(source, bad)
        (bad / name).unlink()
        assert "FormatError" in _every_front_door(bad)
        bad = tmp_path / f"cut-{name}"
        shutil.copytree(source, bad)
        (bad / name).write_bytes((bad / name).read_bytes()[:-7])
        assert _every_front_door(bad)
    bad = tmp_path / "no-metadata"
    shutil.copytree(source, bad)
    (bad / ".metadata").unlink()
    with pytest.raises(ptfile.FormatError, match=r"no \.metadata"):
        ptfile.open(bad)
    assert not verify(bad).ok


def _mutate_metadata(meta: Any, data: st.DataObject) -> None:
    """One of the damages a forged or corrupt ``.metadata`` can carry."""
    number = st.integers(-3, 2**40) | st.integers(0, 5000)
    kind = data.draw(st.sampled_from(["offset", "length", "path", "size", "chunk", "dtype",
                                      "drop", "swap"]))
    keys = list(meta.storage_data)
    key = data.draw(st.sampled_from(keys))
    info = meta.storage_data[key]
    item = meta.state_dict_metadata["w"]
    if kind == "offset":
        info.offset = data.draw(number)
    elif kind == "length":
        info.length = data.draw(number)
    elif kind == "path":
        info.relative_path = data.draw(st.sampled_from(["", ".", "..", "../x", "nope.distcp",
                                                        "__0_0.distcp", "__0_4.distcp"]))
    elif kind == "size":
        item.size = torch.Size(data.draw(st.lists(st.integers(0, 12), max_size=3)))
    elif kind == "chunk":
        i = data.draw(st.integers(0, len(item.chunks) - 1))
        dims = st.lists(st.integers(0, 12), min_size=2, max_size=2)
        item.chunks[i] = ChunkStorageMetadata(torch.Size(data.draw(dims)),
                                              torch.Size(data.draw(dims)))
    elif kind == "dtype":
        item.properties.dtype = data.draw(st.sampled_from([torch.int8, torch.float64,
                                                           torch.bfloat16, torch.bool]))
    elif kind == "drop":
        del meta.storage_data[key]
    else:
        other = data.draw(st.sampled_from(keys))
        meta.storage_data[key], meta.storage_data[other] = meta.storage_data[other], info


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_metadata_raises_only_ptfile_errors(source: Path, data: st.DataObject) -> None:
    meta = _metadata(source)
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate_metadata(meta, data)
    with tempfile.TemporaryDirectory() as scratch:
        _every_front_door(_rewritten(source, Path(scratch) / "ckpt", copy.deepcopy(meta)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_files_raise_only_ptfile_errors(source: Path, data: st.DataObject) -> None:
    names = sorted(p.name for p in source.iterdir())
    with tempfile.TemporaryDirectory() as scratch:
        bad = Path(scratch) / "ckpt"
        shutil.copytree(source, bad)
        name = data.draw(st.sampled_from(names))
        blob = bytearray((bad / name).read_bytes())
        if data.draw(st.booleans()):
            del blob[data.draw(st.integers(0, len(blob))):]
        for _ in range(data.draw(st.integers(0, 8)) if blob else 0):
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
        (bad / name).write_bytes(bytes(blob))
        _every_front_door(bad)


def test_zstd_item_with_trailing_bytes(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    from torch.distributed.checkpoint._extension import ZStandard

    dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(
        tmp_path / "z", _extensions=[ZStandard()]))
    meta = _metadata(tmp_path / "z")
    info = next(iter(meta.storage_data.values()))
    (tmp_path / "z" / info.relative_path).write_bytes(
        (tmp_path / "z" / info.relative_path).read_bytes() + b"\0" * 9)
    info.length += 9
    (tmp_path / "z" / ".metadata").write_bytes(pickle.dumps(meta))
    assert _every_front_door(tmp_path / "z")


def test_verify_finds_altered_tensor_bytes_by_crc(source: Path, tmp_path: Path) -> None:
    """A flipped bit in a chunk's values loads (torch does not check CRCs either); verify
    finds it from the item's CRC-32."""
    import numpy as np

    bad = tmp_path / "flipped"
    shutil.copytree(source, bad)
    values = np.arange(12, dtype="<f4").tobytes()
    name = next(p.name for p in bad.glob("*.distcp") if values in p.read_bytes())
    data = bytearray((bad / name).read_bytes())
    data[data.index(values) + 5] ^= 0x40
    (bad / name).write_bytes(bytes(data))
    assert ptfile.load_dcp(bad)["w"].numpy()[0, 1] != 1.0
    report = verify(bad)
    assert not report.ok
    assert [p.where for p in report.problems] == ["w"]
    assert "CRC-32 mismatch" in report.problems[0].message
    assert verify(source).ok


def test_verify_accepts_items_saved_without_crcs(tmp_path: Path) -> None:
    from torch.utils.serialization import config

    saved = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        dcp.save({"w": torch.ones(3), "n": 2}, checkpoint_id=tmp_path)
    finally:
        config.save.compute_crc32 = saved
    assert verify(tmp_path).ok
    assert ptfile.load_dcp(tmp_path)["n"] == 2
