"""One decision of what an input is (:func:`ptfile.formats.detection.detect_input`), and
every front door agreeing with it: a file, a URL (the suite's loopback range server), a
torch DCP folder, HuggingFaceStorageWriter folders written by real torch 2.13 (one process;
1 and 2 gloo ranks with ``save_distributed``, with and without ``enable_consolidation``)
and a Hugging Face sharded model folder (``*.index.json`` + shards) are each one input to
``ptfile.open``, ``inspect``, ``verify``, ``scan``, ``diff``, ``detect_format``, the command
line (inspect, verify, scan, convert to .pt, .safetensors and a folder) and the bulk walks,
and read as torch reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

import ptfile
from dcp_cases import save_ranks  # the gloo harness of the DCP reading tests
from ptfile import bulk
from ptfile.cli.commands import main
from ptfile.dcp.reader import DCPReader
from ptfile.export.convert import convert
from ptfile.formats.detection import InputKind, detect_input, folder_kind
from ptfile.reader import CheckpointReader
from rangeserver import RangeServer  # the tests' loopback server

pytestmark = pytest.mark.slow  # its tree is written by gloo ranks in child processes

#: Run as a script: for each ``world`` of its arguments, ``world`` gloo ranks on loopback
#: save sharded DTensors through the HuggingFaceStorageWriter with ``save_distributed``,
#: without and with consolidation. The ranks fork from this one parent (as
#: ``dcp_cases.save_ranks``): spawned, each would import torch again.
_HF_RANKS = """
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

def work(rank, world, out, store):
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    a = torch.arange(42.).reshape(7, 6)
    sd = {"s0": distribute_tensor(a, mesh, [Shard(0)]),
          "s1": distribute_tensor(a.t().contiguous(), mesh, [Shard(1)]),
          "rep": distribute_tensor(torch.arange(6, dtype=torch.bfloat16), mesh, [Replicate()])}
    for name, more in (("dist", {}), ("cons", {"enable_consolidation": True})):
        writer = HuggingFaceStorageWriter(os.path.join(out, f"hf_{name}_{world}"),
                                          save_distributed=True, **more)
        dcp.save(sd, storage_writer=writer)
    dist.destroy_process_group()
    os._exit(0)  # as tests/dcp/test_dcp_sharded.py: torch 2.13's teardown may abort

if __name__ == "__main__":
    out = sys.argv[1]
    for world in map(int, sys.argv[2:]):
        mp.start_processes(work, args=(world, out, os.path.join(out, f"store{world}")),
                           nprocs=world, start_method="fork")
"""

#: The HuggingFace-writer folders (and the sharded model folder) the fixture writes.
HF_FOLDERS = ("hf_one", "hf_dist_1", "hf_cons_1", "hf_dist_2", "hf_cons_2", "hf_model")


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"a.weight": torch.randn(3, 4), "a.bias": torch.arange(3, dtype=torch.int32),
            "b": torch.ones(2, 2).to(torch.bfloat16)}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``zoo/``: a file, a torch DCP folder (2 ranks), every HF-writer folder, a sharded
    model folder and, beside them, a folder holding two unrelated checkpoints."""
    root = tmp_path_factory.mktemp("kinds") / "zoo"
    root.mkdir()
    state = _state()
    torch.save(state, root / "file.pt")
    save_ranks(root / "torch_dcp", 2, collectives=True)
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(
        str(root / "hf_one"), fqn_to_index_mapping={"a.weight": 1, "a.bias": 1, "b": 2}))
    script = root.parent / "hf_ranks.py"
    script.write_text(_HF_RANKS)
    done = subprocess.run([sys.executable, str(script), str(root), "1", "2"],
                          check=False, capture_output=True, timeout=300, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in root.glob("store*"):
        f.unlink()
    model = root / "hf_model"
    model.mkdir()
    shards = {"model-00001-of-00002.safetensors": ("a.weight", "a.bias"),
              "model-00002-of-00002.safetensors": ("b",)}
    for name, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(model / name))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}))
    mixed = root / "mixed"
    mixed.mkdir()
    torch.save({"w": torch.ones(2)}, mixed / "model.pt")
    save_file({"lora.A": torch.ones(2, 2)}, str(mixed / "adapter.safetensors"))
    return root


def _torch_reads(folder: Path) -> dict[str, torch.Tensor]:
    """What torch itself reads from a checkpoint folder (its own readers, no ptfile)."""
    if folder.name == "hf_model":  # a model folder: the safetensors files, merged
        return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in
                load_file(str(f)).items()}
    reader = (dcp.FileSystemReader(str(folder)) if (folder / ".metadata").exists()
              else dcp.HuggingFaceStorageReader(str(folder)))
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _array(value: Any) -> tuple[str, np.ndarray[Any, Any]]:
    """A tensor's dtype name and its values (bfloat16 widened to float32 to compare)."""
    if isinstance(value, torch.Tensor):
        wide = value.float() if value.dtype == torch.bfloat16 else value
        return str(value.dtype).removeprefix("torch."), wide.numpy()
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    name = str(getattr(value, "dtype", array.dtype)).removeprefix("torch.")
    return name, array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _same(got: dict[str, Any], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        (got_dtype, array), (dtype, expected) = _array(got[name]), _array(value)
        assert got_dtype == dtype, name
        assert array.shape == expected.shape, name
        np.testing.assert_array_equal(array, expected, err_msg=name)


def cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def served(tree: Path) -> Iterator[str]:
    with RangeServer(tree) as server:
        yield server.url("file.pt")


#: Each input kind of the table: its name under the tree, the kind detect_input gives,
#: and the format every front door reports.
KINDS = [("file.pt", InputKind.FILE, "zip"), ("url", InputKind.URL, "zip"),
         ("torch_dcp", InputKind.DCP, "dcp"), ("hf_one", InputKind.SHARDS, "dcp"),
         ("hf_cons_2", InputKind.SHARDS, "dcp"), ("hf_dist_2", InputKind.SHARDS, "dcp"),
         ("hf_model", InputKind.SHARDS, "dcp")]


@pytest.mark.parametrize(("name", "kind", "fmt"), KINDS, ids=[k[0] for k in KINDS])
def test_every_front_door_agrees_on_what_the_input_is(
        tree: Path, served: str, capsys: pytest.CaptureFixture[str], name: str,
        kind: InputKind, fmt: str) -> None:
    x = served if name == "url" else str(tree / name)
    assert detect_input(x) is kind
    with ptfile.open(x) as ck:
        assert isinstance(ck, DCPReader if kind.is_checkpoint_folder else CheckpointReader)
        assert ck.format.value == fmt
        names = sorted(ck.keys())
    assert ptfile.detect_format(x).value == fmt
    ins = ptfile.inspect(x)
    assert (ins.format, sorted(t.name for t in ins.tensors)) == (fmt, names)
    report = ptfile.verify(x)
    assert report.ok and report.format == fmt and report.tensors_checked == len(names)
    assert ptfile.scan(x).format == fmt
    assert ptfile.diff(x, x).identical
    assert bulk.expand([x]) == [x] and not bulk.expands(x, probe=True)
    for command in ("inspect", "verify", "scan"):  # one input: one JSON document, not lines
        code, out = cli(capsys, command, x, "--json")
        doc = json.loads(out)
        assert code == 0 and doc.get("format") == fmt, (command, out[:300])
    code, out = cli(capsys, "diff", x, x)
    assert code == 0 and out.startswith("identical"), out
    [record] = bulk.inspect([x])
    assert record["path"] == x and record["result"]["format"] == fmt, record


@pytest.mark.parametrize("name", HF_FOLDERS)
def test_hf_folders_are_one_checkpoint_read_as_torch_reads_them(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    folder = tree / name
    assert not (folder / ".metadata").exists()
    assert detect_input(str(folder)) is InputKind.SHARDS
    want = _torch_reads(folder)
    _same(ptfile.load_dcp(folder), want)
    with ptfile.open(folder) as ck:
        _same({k: ck.get_tensor(k) for k in ck}, want)
    # the command line: one checkpoint for inspect, verify and scan
    for command in ("inspect", "verify", "scan"):
        code, out = cli(capsys, command, folder, "--json")
        assert code == 0 and json.loads(out)["format"] == "dcp", (command, out[:300])
    # ... and convert consolidates it, to a .pt, a .safetensors and a sharded folder
    code, _ = cli(capsys, "convert", folder, tmp_path / "out.pt")
    assert code == 0
    _same(torch.load(tmp_path / "out.pt", weights_only=True), want)
    code, _ = cli(capsys, "convert", folder, tmp_path / "out.safetensors")
    assert code == 0
    _same(load_file(str(tmp_path / "out.safetensors")), want)
    code, _ = cli(capsys, "convert", folder, tmp_path / "outdir")
    assert code == 0
    _same({k: v for f in sorted((tmp_path / "outdir").glob("*.safetensors"))
           for k, v in load_file(str(f)).items()}, want)


def test_a_walk_keeps_each_checkpoint_folder_as_one_record(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bulk walk over the tree: one record per checkpoint folder (not one per shard, and
    not the consolidated folder's ``sharded/`` copy), the mixed folder's files one each."""
    expected = sorted([str(tree / "file.pt"), str(tree / "torch_dcp"),
                       str(tree / "mixed" / "adapter.safetensors"),
                       str(tree / "mixed" / "model.pt"),
                       *(str(tree / n) for n in HF_FOLDERS)])
    assert bulk.expand([tree]) == expected
    assert bulk.expands(str(tree)) and bulk.expands(str(tree / "mixed"))
    code, out = cli(capsys, "inspect", tree, "--jsonl")
    *records, summary = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and summary["files"] == len(expected)
    by_path = {r["path"]: r for r in records}
    assert sorted(by_path) == expected
    for name in ("torch_dcp", *HF_FOLDERS):
        assert by_path[str(tree / name)]["result"]["format"] == "dcp"


def test_a_folder_of_many_checkpoints_is_no_one_checkpoint(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``model.pt`` beside an adapter's ``.safetensors``: every front door says it is many
    files (none reads the adapter alone as if it were the folder)."""
    mixed = str(tree / "mixed")
    assert detect_input(mixed) is InputKind.FOLDER
    for door in (ptfile.open, ptfile.inspect, ptfile.scan, ptfile.load_dcp):
        with pytest.raises(ptfile.FormatError):
            door(mixed)  # type: ignore[operator]
    report = ptfile.verify(mixed)  # damage is reported, not raised
    assert not report.ok and "folder of many files" in report.problems[0].message
    with pytest.raises(ptfile.FormatError, match="many files"):
        convert(mixed, str(tmp_path / "x.pt"), to="pt")
    assert ptfile.detect_format(mixed) is ptfile.Format.UNKNOWN
    code, out = cli(capsys, "inspect", mixed)
    assert code == 0 and len(out.splitlines()) == 3  # two records and the summary


def test_folder_kind_by_names() -> None:
    assert folder_kind(["__0.metadata", "__0_0.distcp", "model.pt"]) is InputKind.DCP
    assert folder_kind(["shard-00001-model-00001-of-00001.safetensors"]) is InputKind.SHARDS
    assert folder_kind(["model.safetensors", "model.safetensors.index.json"]) is InputKind.SHARDS
    assert folder_kind(["model.safetensors", "config.json"]) is InputKind.SHARDS  # one alone
    # Unrelated safetensors files are many checkpoints: no index, no shard names.
    assert folder_kind(["a.safetensors", "b.safetensors"]) is InputKind.FOLDER
    assert folder_kind(["diffusion_pytorch_model-00001-of-00002.safetensors",
                        "diffusion_pytorch_model-00002-of-00002.safetensors"]) is InputKind.SHARDS
    assert folder_kind(["pytorch_model.bin", "model.safetensors"]) is InputKind.FOLDER
    assert folder_kind(["model.SAFETENSORS"]) is InputKind.FOLDER  # its reader reads none
    assert folder_kind([]) is InputKind.FOLDER
    assert detect_input(os.devnull) is InputKind.FILE


def test_a_folder_of_unrelated_safetensors_files_is_many_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A folder of adapters holds one key twice: read as one checkpoint it was an error
    # ("the chunk of 'w' is in two files") for inspect, scan and convert alike.
    from safetensors.numpy import save_file as save_numpy

    folder = tmp_path / "adapters"
    folder.mkdir()
    save_numpy({"w": np.ones(3, "float32")}, str(folder / "a.safetensors"))
    save_numpy({"w": np.zeros(3, "float32")}, str(folder / "b.safetensors"))
    assert detect_input(folder) is InputKind.FOLDER
    assert sorted(Path(u).name for u in bulk.expand([str(folder)])) == \
        ["a.safetensors", "b.safetensors"]
    for command in ("inspect", "scan", "verify"):
        code, out = cli(capsys, command, "--json", folder)
        records = [json.loads(line) for line in out.splitlines()]
        assert code == 0, out
        assert sorted(Path(r["path"]).name for r in records if "summary" not in r) == \
            ["a.safetensors", "b.safetensors"]
