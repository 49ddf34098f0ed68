"""ptfile.load_dcp against real torch 2.13: checkpoints written by torch.distributed.checkpoint
in this process, compared with dcp_to_torch_save's output loaded by torch.load."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ptfile
from dcp_cases import save_ranks_each
from oracle import assert_same


def _model_and_optimizer() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def _state() -> dict[str, Any]:
    torch.manual_seed(1)
    return {
        **_model_and_optimizer(),
        "dtypes": {name: torch.arange(-3, 9).reshape(3, 4).to(getattr(torch, name))
                   for name in ("float16", "float32", "float64", "bfloat16", "int8", "uint8",
                                "int16", "int32", "int64", "bool", "complex64", "uint16",
                                "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")},
        "transposed": torch.arange(15.0).reshape(3, 5).t(),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "empty": torch.zeros(0, 3), "empty_cols": torch.zeros(3, 0, 2),
        "scalar": torch.tensor(7.5),
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "nested": {"deep": {"er": torch.ones(3), 7: torch.zeros(1)}, "dotted.key": torch.ones(1)},
        "lst": [torch.ones(2), {"a": 1}, [torch.zeros(1)]],
        "step": 5, "lr": 0.1, "name": "héllo", "blob": b"\x00\xff", "none": None,
        "ints": [1, 2, 3], "tup": (torch.ones(1), "x"),
    }


def _save(directory: Path, state: dict[str, Any], **options: Any) -> Any:
    dcp.save(state, checkpoint_id=directory, **options)
    out = directory.parent / f"{directory.name}.pt"
    dcp_to_torch_save(directory, out)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("dcp") / "ckpt"
    return directory, _save(directory, _state())


def test_matches_dcp_to_torch_save(checkpoint: tuple[Path, Any]) -> None:
    directory, expected = checkpoint
    got = ptfile.load_dcp(directory)
    assert_same(got, expected)
    assert list(got) == list(expected)
    assert got["optim"]["state"].keys() == {"0", "1", "2", "3"}


def test_values_are_what_was_saved(checkpoint: tuple[Path, Any]) -> None:
    got = ptfile.load_dcp(checkpoint[0])
    state = _state()
    assert np.array_equal(got["transposed"].numpy(), state["transposed"].numpy())
    assert got["transposed"].stride() == (3, 1)
    assert got["empty_cols"].stride() == state["empty_cols"].stride() == (2, 2, 1)
    assert np.array_equal(got["channels_last"].numpy(), state["channels_last"].numpy())
    assert got["param"].requires_grad is False
    assert got["nested"]["deep"]["7"].numpy().tolist() == [0.0]
    assert got["tup"][1] == "x" and got["blob"] == b"\x00\xff" and got["none"] is None


@pytest.mark.parametrize("options", [{"thread_count": 3}, {"single_file_per_rank": False}])
def test_writer_variants(tmp_path: Path, options: dict[str, Any]) -> None:
    directory = tmp_path / "ckpt"
    state = _state()
    writer = dcp.FileSystemWriter(directory, **options)
    dcp.save(state, storage_writer=writer)
    dcp_to_torch_save(directory, tmp_path / "out.pt")
    assert len(list(directory.glob("*.distcp"))) > 1
    assert_same(ptfile.load_dcp(directory), torch.load(tmp_path / "out.pt", weights_only=False))


def _safetensors_state() -> dict[str, Any]:
    """_state() without what safetensors cannot hold: complex, non-contiguous tensors."""
    state = _state()
    del state["dtypes"]["complex64"], state["transposed"], state["channels_last"]
    return state


@pytest.mark.parametrize("threads", [1, 2])
def test_safetensors_serialization_format(tmp_path: Path, threads: int) -> None:
    """dcp_to_torch_save cannot read these: the oracle is the TORCH_SAVE-format checkpoint."""
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    expected = _save(tmp_path / "ref", _safetensors_state())
    writer = dcp.FileSystemWriter(tmp_path / "st", thread_count=threads,
                                  serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save(_safetensors_state(), storage_writer=writer)
    assert_same(ptfile.load_dcp(tmp_path / "st"), expected)
    data = (tmp_path / "st" / "__0_0.distcp").read_bytes()
    start = min(v.offset for k, v in _metadata(tmp_path / "st").storage_data.items()
                if k.offset is not None and v.relative_path == "__0_0.distcp")
    for at, byte in ((start + 9, b"!"), (start + 2, b"\x7f")):
        (tmp_path / "st" / "__0_0.distcp").write_bytes(data[:at] + byte + data[at + 1:])
        with pytest.raises(ptfile.FormatError, match="safetensors"):
            ptfile.load_dcp(tmp_path / "st")


def test_use_collectives_false_merges_rank_metadata(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    expected = _save(tmp_path / "ref", _state())
    dcp.save(_state(), checkpoint_id=directory, use_collectives=False)
    assert not (directory / ".metadata").exists()
    assert (directory / "__0.metadata").exists()
    assert_same(ptfile.load_dcp(directory), expected)


def test_empty_state_dict(tmp_path: Path) -> None:
    dcp.save({}, checkpoint_id=tmp_path)
    assert ptfile.load_dcp(tmp_path) == {}


@pytest.mark.slow  # gloo ranks in child processes
def test_sharded_across_ranks(tmp_path: Path) -> None:
    """3 ranks: uneven shards, a zero-size chunk, chunks on every rank; then the same values
    saved with use_collectives=False (one __<rank>.metadata each) merge to the same dict."""
    save_ranks_each([(tmp_path / "ckpt", 3, True), (tmp_path / "solo", 3, False)])
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "out.pt")
    got = ptfile.load_dcp(tmp_path / "ckpt")
    assert_same(got, torch.load(tmp_path / "out.pt", weights_only=False))
    sizes = [c.sizes for c in _metadata(tmp_path / "ckpt").state_dict_metadata["z"].chunks]
    assert torch.Size([0]) in sizes
    assert np.array_equal(got["s1"].numpy(), np.arange(42.0).reshape(7, 6).T)
    assert sorted(p.name for p in (tmp_path / "solo").glob("*.metadata")) == [
        f"__{r}.metadata" for r in range(3)]
    assert_same(ptfile.load_dcp(tmp_path / "solo"), torch.load(tmp_path / "out.pt",
                                                               weights_only=False))


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


def _metadata(directory: Path) -> Any:
    return pickle.loads((directory / ".metadata").read_bytes())


def _write_metadata(directory: Path, metadata: Any) -> None:
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))


def _first_tensor(metadata: Any) -> tuple[str, Any]:
    return next((k, v) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks"))


def test_missing_and_truncated_files(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    bad = _copy(checkpoint[0], tmp_path / "missing")
    (bad / "__0_0.distcp").unlink()
    with pytest.raises(ptfile.FormatError, match="missing"):
        ptfile.load_dcp(bad)
    bad = _copy(checkpoint[0], tmp_path / "truncated")
    data = (bad / "__0_0.distcp").read_bytes()
    (bad / "__0_0.distcp").write_bytes(data[: len(data) - 100])
    with pytest.raises(ptfile.FormatError, match="outside"):
        ptfile.load_dcp(bad)
    with pytest.raises(ptfile.FormatError, match=r"no \.metadata"):
        ptfile.load_dcp(tmp_path / "missing" / "..")
    with pytest.raises(ptfile.FormatError, match="not a directory"):
        ptfile.load_dcp(bad / "__0_0.distcp")


def test_corrupt_items_raise_ptfile_errors(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = (checkpoint[0] / "__0_0.distcp").read_bytes()
    for trial in range(20):
        bad = _copy(checkpoint[0], tmp_path / f"c{trial}")
        damaged = bytearray(data)
        for at in rng.integers(0, len(data), 8):
            damaged[at] ^= 0xFF
        (bad / "__0_0.distcp").write_bytes(bytes(damaged))
        try:
            ptfile.load_dcp(bad)
        except ptfile.PtfileError:
            pass


def test_chunks_that_overlap_or_leave_gaps(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    for case, match in (("gap", "cover"), ("overlap", "overlap"), ("outside", "fit")):
        bad = _copy(checkpoint[0], tmp_path / case)
        metadata = _metadata(bad)
        fqn, item = next((k, v) for k, v in metadata.state_dict_metadata.items()
                         if hasattr(v, "chunks") and len(v.size) == 2 and v.size[0] > 1)
        rows, cols = item.size
        chunk = item.chunks[0]
        if case == "gap":
            item.size = torch.Size([rows + 1, cols])
        elif case == "overlap":
            item.size = torch.Size([rows + 1, cols])
            item.chunks.append(ChunkStorageMetadata(torch.Size([1, 0]), chunk.sizes))
        else:
            item.chunks[0] = ChunkStorageMetadata(torch.Size([1, 0]), chunk.sizes)
        _write_metadata(bad, metadata)
        with pytest.raises(ptfile.FormatError, match=match):
            ptfile.load_dcp(bad)
        assert fqn


def test_items_that_disagree_with_metadata(checkpoint: tuple[Path, Any], tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties

    bad = _copy(checkpoint[0], tmp_path / "dtype")
    metadata = _metadata(bad)
    fqn, item = _first_tensor(metadata)
    item.properties = TensorProperties(dtype=torch.int8)
    _write_metadata(bad, metadata)
    with pytest.raises(ptfile.FormatError, match="holds"):
        ptfile.load_dcp(bad)
    bad = _copy(checkpoint[0], tmp_path / "swap")
    metadata = _metadata(bad)
    storage = metadata.storage_data
    keys = [k for k in storage if k.offset is not None]
    storage[keys[0]], storage[keys[1]] = storage[keys[1]], storage[keys[0]]
    _write_metadata(bad, metadata)
    with pytest.raises(ptfile.FormatError, match="holds"):
        ptfile.load_dcp(bad)
    bad = _copy(checkpoint[0], tmp_path / "huge")
    metadata = _metadata(bad)
    fqn, item = _first_tensor(metadata)
    index = next(k for k in metadata.storage_data if k.fqn == fqn)
    item.size = torch.Size([2**40])
    item.chunks = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2**40]))]
    metadata.storage_data[type(index)(fqn, torch.Size([0]), 0)] = metadata.storage_data[index]
    _write_metadata(bad, metadata)
    with pytest.raises(ptfile.FormatError, match="no storage entry"):
        ptfile.load_dcp(bad)
    bad = _copy(checkpoint[0], tmp_path / "escape")
    metadata = _metadata(bad)
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../ckpt/__0_0.distcp"
    _write_metadata(bad, metadata)
    with pytest.raises(ptfile.FormatError, match="not one in the directory"):
        ptfile.load_dcp(bad)
    assert fqn


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_metadata_globals_outside_the_policy(checkpoint: tuple[Path, Any],
                                             tmp_path: Path) -> None:
    bad = _copy(checkpoint[0], tmp_path / "evil")
    metadata = _metadata(bad)
    metadata.version = _Evil()
    _write_metadata(bad, metadata)
    with pytest.raises(ptfile.UnsafeGlobalError) as info:
        ptfile.load_dcp(bad)
    assert info.value.name == "system"


def test_metadata_of_another_shape(tmp_path: Path) -> None:
    for value in ([1, 2], {"state_dict_metadata": 1}, None):
        (tmp_path / ".metadata").write_bytes(pickle.dumps(value))
        with pytest.raises(ptfile.FormatError):
            ptfile.load_dcp(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ptfile.FormatError):
        ptfile.load_dcp(tmp_path)


def test_metadata_names_only_the_policy(checkpoint: tuple[Path, Any]) -> None:
    """Every global of a real .metadata resolves in the DCP policy."""
    import io

    from ptfile.formats import policies

    seen: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            seen.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO((checkpoint[0] / ".metadata").read_bytes())).load()
    assert ("torch.distributed.checkpoint.filesystem", "_StorageInfo") in seen
    assert ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata") in seen
    find = policies.dcp()
    for module, name in seen:
        find(module, name)


def _save_zstd(directory: Path, state: dict[str, Any], **options: Any) -> None:
    from torch.distributed.checkpoint._extension import ZStandard

    writer = dcp.FileSystemWriter(directory, _extensions=[ZStandard()], **options)
    dcp.save(state, storage_writer=writer)


@pytest.mark.parametrize("threads", [1, 2])
def test_zstd_items_match_dcp_to_torch_save(tmp_path: Path, threads: int) -> None:
    pytest.importorskip("zstandard")
    directory = tmp_path / "ckpt"
    _save_zstd(directory, _state(), thread_count=threads)
    infos = _metadata(directory).storage_data.values()
    assert {tuple(i.transform_descriptors) for i in infos} == {("stream.zstd/1",)}
    dcp_to_torch_save(directory, tmp_path / "out.pt")
    assert_same(ptfile.load_dcp(directory), torch.load(tmp_path / "out.pt", weights_only=False))


def test_zstd_without_zstandard_names_the_extra(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("zstandard")
    _save_zstd(tmp_path, {"w": torch.ones(2)})
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ptfile.UnsupportedFeatureError, match=r"pip install zstandard \(ptfile.s zstd extra\)"):
        ptfile.load_dcp(tmp_path)


def test_zstd_damage_and_bombs_raise_ptfile_errors(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    _save_zstd(tmp_path, {"w": torch.zeros(64)})
    metadata = _metadata(tmp_path)
    info = next(iter(metadata.storage_data.values()))
    data = (tmp_path / "__0_0.distcp").read_bytes()
    (tmp_path / "__0_0.distcp").write_bytes(data[:info.offset + 4] + b"\xff" * 8
                                            + data[info.offset + 12:])
    with pytest.raises(ptfile.FormatError, match="zstd"):
        ptfile.load_dcp(tmp_path)
    # 64 zeros of float32 cannot inflate to 64 MiB: the bound is the chunk plus a ZIP's overhead.
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    (tmp_path / "__0_0.distcp").write_bytes(bomb)
    info.offset, info.length = 0, len(bomb)
    _write_metadata(tmp_path, metadata)
    with pytest.raises(ptfile.FormatError, match="inflates"):
        ptfile.load_dcp(tmp_path)
    info.transform_descriptors = ["stream.brotli/1"]
    _write_metadata(tmp_path, metadata)
    with pytest.raises(ptfile.UnsupportedFeatureError, match="brotli"):
        ptfile.load_dcp(tmp_path)
