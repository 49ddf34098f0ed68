"""``ptfile convert DIR out.pt|out.safetensors|folder/`` against real torch 2.13: the .pt is
byte-identical to torch.save of what dcp_to_torch_save consolidates, the safetensors output to
ptfile's own (non-streaming) conversion, the folder is Hugging Face's sharded layout."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ptfile
from ptfile import cli, outcomes
from ptfile.dcp import consolidate as dcp_export
from ptfile.dcp.consolidate import convert_dcp as _convert_dcp
from ptfile.export.convert import target_kind
from ptfile.export.safetensors import dump, load_safetensors

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
safetensors_torch = pytest.importorskip("safetensors.torch")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from dcp_cases import save_ranks, trained  # noqa: E402


def convert_dcp(src: Path | str, dst: Path, **options: Any) -> dict[str, Any]:
    """:func:`ptfile.dcp.consolidate.convert_dcp` to the kind the CLI tells from the names."""
    return _convert_dcp(src, dst, to=target_kind(str(dst), str(src)), **options)


def _state() -> dict[str, Any]:
    return {
        **trained(),
        "dtypes": {name: torch.arange(-3, 9).reshape(3, 4).to(getattr(torch, name))
                   for name in ("float16", "float64", "bfloat16", "int8", "uint8", "int32",
                                "bool", "uint16", "uint64", "float8_e4m3fn")},
        "big": torch.randn(64, 96), "transposed": torch.arange(15.0).reshape(3, 5).t(),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "empty": torch.zeros(0, 3), "scalar": torch.tensor(7.5),
        "nested": {"deep": {7: torch.zeros(1)}}, "lst": [torch.ones(2), {"a": 1}],
        "step": 5, "name": "héllo", "tup": (torch.ones(1), "x"),
    }


def _torch_consolidated(directory: Path, out: Path) -> bytes:
    """torch.save of dcp_to_torch_save's result, saved under ``out``'s name."""
    dcp_to_torch_save(directory, out)
    torch.save(torch.load(out, weights_only=False), out)
    return out.read_bytes()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dcp") / "ckpt"
    dcp.save(_state(), checkpoint_id=directory)
    return directory


def test_pt_is_torchs_bytes(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    expected = _torch_consolidated(checkpoint, tmp_path / "torch" / "model.pt")
    summary = convert_dcp(checkpoint, tmp_path / "model.pt")
    assert (tmp_path / "model.pt").read_bytes() == expected
    assert summary["tensors"] == len(_flat_tensors(checkpoint))
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert torch.equal(loaded["channels_last"], _state()["channels_last"])


def test_slabs_smaller_than_rows(checkpoint: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads cut below a row (and below an element's row of the last dimension) still
    assemble the same file."""
    convert_dcp(checkpoint, tmp_path / "whole.pt")
    monkeypatch.setattr(dcp_export, "SLAB_BYTES", 8)

    def whole(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a TORCH_SAVE chunk was read whole, not in slabs")

    monkeypatch.setattr(dcp_export, "read_region", whole)
    (tmp_path / "cut").mkdir()
    convert_dcp(checkpoint, tmp_path / "cut" / "whole.pt")
    assert (tmp_path / "cut" / "whole.pt").read_bytes() == (tmp_path / "whole.pt").read_bytes()


@pytest.mark.slow  # gloo ranks in child processes
def test_sharded_across_ranks(tmp_path: Path) -> None:
    """3 gloo ranks: uneven shards, a zero-size chunk, replicated bf16."""
    save_ranks(tmp_path / "ckpt", 3, collectives=True)
    (tmp_path / "torch").mkdir()
    expected = _torch_consolidated(tmp_path / "ckpt", tmp_path / "torch" / "out.pt")
    convert_dcp(tmp_path / "ckpt", tmp_path / "out.pt")
    assert (tmp_path / "out.pt").read_bytes() == expected
    convert_dcp(tmp_path / "ckpt", tmp_path / "out.safetensors")
    got = safetensors_torch.load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["s1"], torch.arange(42.0).reshape(7, 6).t())
    assert sorted(got) == ["plain", "rep", "s0", "s1", "z"]


def _flat_tensors(directory: Path) -> dict[str, ptfile.Tensor]:
    meta = pickle.loads((directory / ".metadata").read_bytes())
    state = ptfile.load_dcp(directory)
    out = {}
    for fqn, item in meta.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            node: Any = state
            for step in meta.planner_data[fqn]:
                node = node[step]
            out[fqn] = node
    return out


def test_safetensors_is_ptfiles_own_conversion(checkpoint: Path, tmp_path: Path) -> None:
    tensors = _flat_tensors(checkpoint)
    dump(tensors, tmp_path / "expected.safetensors", shared="copy")
    summary = convert_dcp(checkpoint, tmp_path / "out.safetensors")
    assert (tmp_path / "out.safetensors").read_bytes() == \
        (tmp_path / "expected.safetensors").read_bytes()
    assert summary["tensors"] == len(tensors)
    got = safetensors_torch.load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["optim.state.0.exp_avg"], _state()["optim"]["state"][0]["exp_avg"])


def test_hf_folder(checkpoint: Path, tmp_path: Path) -> None:
    tensors = _flat_tensors(checkpoint)
    sizes = {k: t.numel() * t.dtype.itemsize for k, t in tensors.items()}
    summary = convert_dcp(checkpoint, tmp_path / "hf", shard_bytes=1024)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": sum(sizes.values())}
    assert sorted(index["weight_map"]) == sorted(tensors)
    files = list(index["weight_map"].values())
    assert files == sorted(files)  # listed shard by shard, as huggingface_hub lists them
    shards = sorted(set(index["weight_map"].values()))
    assert summary["shards"] == len(shards) > 2
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                      for i in range(1, len(shards) + 1)]
    assert "big" in [k for k, v in index["weight_map"].items()
                     if list(index["weight_map"].values()).count(v) == 1]  # 24 KiB: a shard of its own
    for shard in shards:
        size = sum(sizes[k] for k, v in index["weight_map"].items() if v == shard)
        assert size <= 1024 or size == sizes["big"]
        safetensors_torch.load_file(tmp_path / "hf" / shard)  # torch's reader takes it
        for name, value in load_safetensors(tmp_path / "hf" / shard)[0].items():
            assert index["weight_map"][name] == shard
            raw = np.dtype(f"V{value.dtype.itemsize}")
            assert np.array_equal(value._raw_view(raw), tensors[name]._raw_view(raw))
    convert_dcp(checkpoint, tmp_path / "one/")
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["model.safetensors"]


def test_sources_torch_cannot_consolidate(tmp_path: Path) -> None:
    """SAFETENSORS-format and HF-writer checkpoints (read in slabs from their blobs), a zstd
    one (read whole, through load_dcp's reader) and a use_collectives=False one (per-rank
    metadata merged) give ptfile.save(ptfile.load_dcp(DIR))."""
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    state = {"w": torch.randn(8, 5), "b": torch.arange(4, dtype=torch.int16), "step": 3}
    writers = {"st": dcp.FileSystemWriter(tmp_path / "st",
                                          serialization_format=SerializationFormat.SAFETENSORS)}
    try:
        import zstandard  # noqa: F401
        from torch.distributed.checkpoint._extension import ZStandard
        writers["zstd"] = dcp.FileSystemWriter(tmp_path / "zstd", _extensions=[ZStandard()])
    except ImportError:
        pass
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(str(tmp_path / "hf")))
    dcp.save(state, checkpoint_id=tmp_path / "solo", use_collectives=False)
    for name in ("hf", "solo", *writers):
        if name in writers:
            dcp.save(state, storage_writer=writers[name])
        ptfile.save(ptfile.load_dcp(tmp_path / name), tmp_path / f"{name}.pt")
        expected = (tmp_path / f"{name}.pt").read_bytes()
        convert_dcp(tmp_path / name, tmp_path / f"{name}.pt")
        assert (tmp_path / f"{name}.pt").read_bytes() == expected, name


def test_cli_convert(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                     ) -> None:
    assert cli.main(["convert", str(checkpoint), str(tmp_path / "m.pt"),
                     "--no-progress"]) == outcomes.EXIT_OK
    assert f"(pt, {len(_flat_tensors(checkpoint))} tensors)" in capsys.readouterr().out
    assert (tmp_path / "m.pt").read_bytes() == ptfile_bytes(checkpoint, tmp_path / "x" / "m.pt")
    assert cli.main(["convert", str(checkpoint), str(tmp_path / "hf") + "/", "--no-progress",
                     "--json"]) == outcomes.EXIT_OK
    assert json.loads(capsys.readouterr().out)["kind"] == "hf"
    assert (tmp_path / "hf" / "model.safetensors").exists()


def ptfile_bytes(directory: Path, out: Path) -> bytes:
    """ptfile.save of ptfile.load_dcp (the non-streaming consolidation) at ``out``."""
    out.parent.mkdir()
    ptfile.save(ptfile.load_dcp(directory), out)
    return out.read_bytes()


def test_damaged_chunks_raise_and_leave_nothing(checkpoint: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for item in checkpoint.iterdir():
        (bad / item.name).write_bytes(item.read_bytes())
    meta = pickle.loads((bad / ".metadata").read_bytes())
    keys = [k for k in meta.storage_data if k.offset is not None and k.fqn.startswith("dtypes")]
    meta.storage_data[keys[0]], meta.storage_data[keys[1]] = \
        meta.storage_data[keys[1]], meta.storage_data[keys[0]]
    (bad / ".metadata").write_bytes(pickle.dumps(meta))
    for name in ("out.pt", "out.safetensors"):
        with pytest.raises(ptfile.FormatError, match="holds"):
            convert_dcp(bad, tmp_path / name)
        assert not (tmp_path / name).exists()
    data = (bad / "__0_0.distcp").read_bytes()
    (bad / "__0_0.distcp").write_bytes(data[:-2000])
    with pytest.raises(ptfile.FormatError):
        convert_dcp(bad, tmp_path / "out.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_url_source(checkpoint: Path, tmp_path: Path) -> None:
    """A directory behind an fsspec URL (memory://) converts to the same file."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for item in checkpoint.iterdir():
        with memory.open(f"/dcp-convert/{item.name}", "wb") as fp:
            fp.write(item.read_bytes())
    (tmp_path / "url").mkdir()
    convert_dcp("memory://dcp-convert", tmp_path / "url" / "model.pt")
    convert_dcp(checkpoint, tmp_path / "model.pt")
    assert (tmp_path / "url" / "model.pt").read_bytes() == (tmp_path / "model.pt").read_bytes()
