"""ptfile.open, inspect, scan and verify on DCP directories that real torch 2.13 wrote
(:func:`dcp_cases.make_chunked`: one tensor in three chunks, each in its own file)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import MetadataIndex

import ptfile
from dcp_cases import BLOCKS, make_chunked
from oracle import assert_same


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    directory = tmp_path_factory.mktemp("chunked") / "ckpt"
    return directory, make_chunked(directory)


def _file_of(directory: Path, fqn: str, offsets: tuple[int, ...]) -> str:
    meta = pickle.loads((directory / ".metadata").read_bytes())
    return str(meta.storage_data[MetadataIndex(fqn, torch.Size(offsets))].relative_path)


def test_torch_consolidates_the_chunked_checkpoint(chunked: tuple[Path, np.ndarray],
                                                   tmp_path: Path) -> None:
    directory, full = chunked
    dcp_to_torch_save(directory, tmp_path / "out.pt")
    expected = torch.load(tmp_path / "out.pt", weights_only=False)
    assert np.array_equal(expected["w"].numpy(), full)
    assert_same(ptfile.load_dcp(directory), expected)


def test_open_reads_metadata_only(chunked: tuple[Path, np.ndarray]) -> None:
    directory, full = chunked
    with ptfile.open(directory) as ck:
        assert isinstance(ck, ptfile.DCPReader)
        assert ck.format is ptfile.Format.DCP
        assert list(ck.keys()) == ["b", "w"]
        info = ck.info("w")
        assert (info.dtype.name, info.shape, info.stride) == ("float32", (9, 4), (4, 1))
        assert ck.get_slice("w").get_shape() == [9, 4]
        assert ck.get_slice("b").get_dtype() == "bfloat16"
        assert [c.offsets for c in ck.chunks("w")] == [(0, 0), (3, 0), (5, 0)]
        assert ck.metadata()["chunks"] == "4"
        assert ck.files.opened == {".metadata"}
        tree = ck.object
        assert tree["step"] == ptfile.dcp.reader.BytesItem("step")
        assert ck.value("step") == 7
        np.testing.assert_array_equal(ck.get_tensor("w"), full)
        assert ck["w"].shape == (9, 4)


@pytest.mark.parametrize(("key", "blocks"), [
    ((slice(0, 2),), {0}), ((4,), {1}), ((np.int64(-5),), {1}), ((slice(4, 6), 1), {1, 2}),
    ((Ellipsis, 2), {0, 1, 2}), ((slice(8, 2, -3),), {2}), ((slice(5, 5),), set()),
])
def test_slice_reads_only_the_chunks_it_meets(chunked: tuple[Path, np.ndarray], key: Any,
                                              blocks: set[int]) -> None:
    directory, full = chunked
    with ptfile.open(directory) as ck:
        got = ck.get_slice("w")[key]
        np.testing.assert_array_equal(got, full[key])
        wanted = {_file_of(directory, "w", (BLOCKS[i][0], 0)) for i in blocks}
        assert ck.files.opened == {".metadata", *wanted}
        assert ck.files.bytes_read < sum(p.stat().st_size for p in directory.iterdir())


_index = st.one_of(st.integers(-9, 8), st.slices(10), st.none(), st.just(Ellipsis))


@settings(max_examples=60, deadline=None)
@given(key=st.tuples(_index, st.one_of(st.integers(-4, 3), st.slices(5))))
def test_slices_agree_with_numpy(chunked: tuple[Path, np.ndarray], key: tuple[Any, ...]
                                 ) -> None:
    directory, full = chunked
    try:
        expected = full[key]
    except IndexError:
        with ptfile.open(directory) as ck, pytest.raises(IndexError):
            ck.get_slice("w")[key]
        return
    with ptfile.open(directory) as ck:
        np.testing.assert_array_equal(ck.get_slice("w")[key], expected)


def test_open_any_directory_kind(tmp_path: Path) -> None:
    with pytest.raises(ptfile.FormatError, match="folder of many files, not one checkpoint"):
        ptfile.open(tmp_path)
    assert ptfile.detect_format(tmp_path) is ptfile.Format.UNKNOWN


def test_inspect_verify_scan(chunked: tuple[Path, np.ndarray]) -> None:
    directory, _ = chunked
    assert ptfile.detect_format(directory) is ptfile.Format.DCP
    ins = ptfile.inspect(directory)
    assert ins.format == "dcp"
    assert [(t.name, t.shape) for t in ins.tensors] == [("b", (3,)), ("w", (9, 4))]
    assert [c["sizes"] for c in ins.to_dict()["chunks"]["w"]] == [[3, 4], [2, 4], [4, 4]]
    from ptfile.inspection import verify

    report = verify(directory)
    assert report.ok and report.format == "dcp"
    assert report.records_checked == 5 and report.tensors_checked == 2  # 4 chunks, 1 value
    result = ptfile.scan(directory)
    assert result.format == "dcp" and result.is_clean, result.to_dict()
    assert "torch.distributed.checkpoint.metadata.Metadata" in result.globals


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, ("true",))


def test_scan_flags_dangerous_metadata_and_items(chunked: tuple[Path, np.ndarray],
                                                 tmp_path: Path) -> None:
    bad = _copy(chunked[0], tmp_path / "meta")
    meta = pickle.loads((bad / ".metadata").read_bytes())
    meta.version = _Evil()
    (bad / ".metadata").write_bytes(pickle.dumps(meta))
    result = ptfile.scan(bad)
    assert result.is_dangerous
    assert any(f.qualname.endswith("system") and f.location.startswith(".metadata")
               for f in result.findings)
    bad = _copy(chunked[0], tmp_path / "item")
    dcp.save({"evil": _Evil()}, checkpoint_id=bad / "sub")
    result = ptfile.scan(bad / "sub")
    assert result.is_dangerous
    assert any("(evil)" in f.location and f.qualname.endswith("system")
               for f in result.findings)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ptfile", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_cli_on_a_directory(chunked: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    directory, _ = chunked
    shown = _cli("inspect", directory)
    assert shown.returncode == 0, shown.stderr
    assert "dcp" in shown.stdout and "Chunks (4)" in shown.stdout
    doc = json.loads(_cli("inspect", directory, "--json").stdout)
    assert doc["format"] == "dcp" and len(doc["chunks"]["w"]) == 3
    assert _cli("scan", directory).returncode == 0
    assert _cli("verify", directory).returncode == 0
    bad = _copy(directory, tmp_path / "bad")
    victim = _file_of(directory, "w", (3, 0))
    data = (bad / victim).read_bytes()
    (bad / victim).write_bytes(data[:-30])
    checked = _cli("verify", bad)
    assert checked.returncode != 0
    assert "w" in checked.stdout + checked.stderr
