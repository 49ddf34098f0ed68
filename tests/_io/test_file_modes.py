"""File modes: every writer gives the modes torch's plain ``open(path, "wb")`` gives.

Under umask 022, 027 and 002 each writer (``ptfile.save``, the safetensors and npz
exports, ``save_dcp``, ``ptfile convert`` one file, a sharded index and a DCP
folder, bulk convert under ``--out-prefix``) makes files with the mode
``torch.save`` makes and folders with the mode ``dcp.save`` makes, and a file
that replaces a 0664 (or 0600) one keeps that mode, as it does under torch.
The umask is set in this process (and so inherited by the ``ptfile`` command, run in a
child process: the command lines of one test in one child, see
:func:`commands.run_each`).
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch
import torch.distributed.checkpoint as torch_dcp

import ptfile
from commands import run_each
from ptfile.export import dump, dump_npz


@pytest.fixture(params=[0o022, 0o027, 0o002], ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def torch_file_mode(folder: Path) -> int:
    """What ``torch.save`` gives a new file in ``folder`` under the current umask."""
    path = folder / "by-torch.pt"
    torch.save({"w": torch.ones(2)}, path)
    return mode(path)


def torch_dcp_modes(folder: Path) -> dict[str, int]:
    """What ``dcp.save`` gives its new folder and files under the current umask."""
    out = folder / "by-torch-dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_dcp.save({"w": torch.ones(2)}, checkpoint_id=str(out))
    return {"folder": mode(out), "file": mode(out / ".metadata")}


def ptfile_cli(*commands: Sequence[str | Path]) -> None:
    """Run each command line (in one child: :func:`commands.run_each`); each must succeed."""
    for command, done in zip(commands, run_each(*commands)):
        assert done.returncode == 0, (command, done.stderr)


def tensors() -> dict[str, ptfile.Tensor]:
    storage = ptfile.Storage(memoryview(np.arange(4, dtype="f4")), ptfile.DTYPES["float32"])
    return {"w": ptfile.Tensor(storage, 0, (4,), (1,))}


#: Each file writer of the API: output → writes the output.
API_WRITERS: dict[str, Callable[[Path], object]] = {
    "save": lambda out: ptfile.save({"w": np.ones(2, "f4")}, out.with_suffix(".pt")),
    "safetensors": lambda out: dump(tensors(), out.with_suffix(".safetensors")),
    "npz": lambda out: dump_npz(tensors(), out.with_suffix(".npz")),
}
SUFFIX = {"save": ".pt", "safetensors": ".safetensors", "npz": ".npz"}


@pytest.mark.parametrize("writer", list(API_WRITERS))
def test_a_new_file_gets_torch_saves_mode(writer: str, umask: int, tmp_path: Path) -> None:
    out = tmp_path / f"out{SUFFIX[writer]}"
    API_WRITERS[writer](out)
    assert mode(out) == torch_file_mode(tmp_path) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["by-torch.pt", out.name])


@pytest.mark.parametrize("old_mode", [0o664, 0o600], ids=oct)
@pytest.mark.parametrize("writer", list(API_WRITERS))
def test_a_replaced_file_keeps_its_mode(writer: str, old_mode: int, umask: int,
                                        tmp_path: Path) -> None:
    out, theirs = tmp_path / f"out{SUFFIX[writer]}", tmp_path / "theirs.pt"
    for path in (out, theirs):
        path.write_bytes(b"old")
        path.chmod(old_mode)
    torch.save({"w": torch.ones(2)}, theirs)
    API_WRITERS[writer](out)
    assert out.read_bytes() != b"old"
    assert mode(out) == mode(theirs) == old_mode


@pytest.mark.parametrize("suffix", [".pt", ".safetensors", ".npz"])
def test_the_convert_command_gives_torch_saves_modes(suffix: str, umask: int,
                                                     tmp_path: Path) -> None:
    src = tmp_path / "src.pt"
    torch.save({"w": torch.arange(4.0)}, src)
    new, old = tmp_path / f"new{suffix}", tmp_path / f"old{suffix}"
    old.write_bytes(b"old")
    old.chmod(0o664)
    ptfile_cli(["convert", src, new], ["convert", src, old])
    assert mode(new) == torch_file_mode(tmp_path) == 0o666 & ~umask
    assert mode(old) == 0o664 and old.read_bytes() != b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["by-torch.pt", "src.pt", new.name, old.name])


def test_sharded_index_conversion_gets_torch_saves_modes(umask: int, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"w": torch.ones(2)}, src / "pytorch_model-00001-of-00001.bin")
    (src / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}))
    out = tmp_path / "out"
    ptfile_cli(["convert", src / "pytorch_model.bin.index.json", f"{out}/"])
    want = torch_file_mode(tmp_path)
    assert {p.name: mode(p) for p in out.iterdir()} == {
        "model.safetensors.index.json": want, "model-00001-of-00001.safetensors": want}
    assert mode(out) == 0o777 & ~umask


def test_save_dcp_gets_dcp_saves_modes(umask: int, tmp_path: Path) -> None:
    want = torch_dcp_modes(tmp_path)
    out = tmp_path / "ckpt"
    ptfile.save_dcp({"w": np.ones(2, "f4")}, out)
    assert mode(out) == want["folder"] == 0o777 & ~umask
    assert {p.name: mode(p) for p in out.iterdir()} == {
        ".metadata": want["file"], "__0_0.distcp": want["file"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by-torch-dcp", "ckpt"]


def test_save_dcp_over_a_folder_keeps_its_mode(umask: int, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    ptfile.save_dcp({"w": np.ones(2, "f4")}, out)
    out.chmod(0o2775)
    ptfile.save_dcp({"w": np.zeros(3, "f4")}, out)
    assert mode(out) == 0o775 and ptfile.load_dcp(out)["w"].shape == (3,)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_dcp_conversions_get_torch_saves_modes(umask: int, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ptfile.save_dcp({"w": np.ones(2, "f4")}, ckpt)
    ptfile_cli(["convert", ckpt, tmp_path / "one.pt"], ["convert", ckpt, f"{tmp_path / 'hf'}/"])
    want = torch_file_mode(tmp_path)
    assert mode(tmp_path / "one.pt") == want
    assert mode(tmp_path / "hf") == 0o777 & ~umask
    assert {mode(p) for p in (tmp_path / "hf").iterdir()} == {want}


def test_bulk_convert_under_a_prefix_gets_torch_saves_modes(umask: int, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, tree / "top.pt")
    torch.save({"w": torch.ones(3)}, tree / "a" / "b" / "deep.pt")
    out = tmp_path / "out"
    ptfile_cli(["convert", tree, "--out-prefix", out, "--no-progress", "--workers", "1"])
    want = torch_file_mode(tmp_path)
    made = {p.relative_to(out).as_posix(): mode(p) for p in out.rglob("*")}
    folder = 0o777 & ~umask
    assert made == {"top.safetensors": want, "a": folder, "a/b": folder,
                    "a/b/deep.safetensors": want}


def read_w(path: Path) -> np.ndarray:
    """The ``w`` of a file, read by the format's own library (torch, safetensors, numpy)."""
    if path.suffix == ".npz":
        with np.load(path) as npz:
            return np.asarray(npz["w"])
    if path.suffix == ".safetensors":
        return np.asarray(safetensors.numpy.load_file(path)["w"])
    return np.asarray(torch.load(path)["w"])


def test_an_output_in_a_new_folder_is_made_with_its_folders(umask: int, tmp_path: Path) -> None:
    """Every writer (save, the exports, ``ptfile convert`` to each kind) makes the folders
    of an output that do not exist yet, with the mode ``dcp.save`` gives a new folder, and
    leaves no temporary behind."""
    src = tmp_path / "src.pt"
    torch.save({"w": torch.arange(4.0)}, src)
    want = {"file": torch_file_mode(tmp_path), "folder": torch_dcp_modes(tmp_path)["folder"]}
    outs = []
    for writer, write in API_WRITERS.items():
        outs.append(tmp_path / "api" / writer / f"out{SUFFIX[writer]}")
        write(outs[-1])
    cli_outs = [tmp_path / "cli" / suffix[1:] / "deeper" / f"model{suffix}"
                for suffix in SUFFIX.values()]
    ptfile_cli(*(["convert", src, out] for out in cli_outs))
    outs += cli_outs
    for out in outs:
        expected = np.ones(2) if out.parent.name == "save" else np.arange(4.0)
        np.testing.assert_array_equal(read_w(out), expected)
        assert mode(out) == want["file"] == 0o666 & ~umask
        for folder in out.relative_to(tmp_path).parents[:-1]:
            assert mode(tmp_path / folder) == want["folder"] == 0o777 & ~umask, folder
    made = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert made == sorted(["by-torch.pt", "by-torch-dcp/.metadata", "by-torch-dcp/__0_0.distcp",
                           "src.pt", *(o.relative_to(tmp_path).as_posix() for o in outs)])


def test_a_write_error_names_the_output_never_its_temporary(tmp_path: Path) -> None:
    src, taken, blocker = tmp_path / "src.pt", tmp_path / "taken.pt", tmp_path / "blocker"
    torch.save({"w": torch.arange(4.0)}, src)
    (taken / "inside").mkdir(parents=True)  # a folder where the output goes: no rename over it
    blocker.write_bytes(b"a file where a folder should be")
    with pytest.raises(IsADirectoryError) as caught:
        ptfile.save({"w": np.ones(2, "f4")}, taken)
    assert caught.value.filename == str(taken) and ".tmp" not in str(caught.value)
    cases = ((taken, taken), (blocker / "model.safetensors", blocker))
    for (_, named), done in zip(cases, run_each(*(["convert", src, out] for out, _ in cases))):
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"ptfile convert: error: {named}: "), done.stderr
        assert ".tmp" not in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["blocker", "inside", "src.pt",
                                                           "taken.pt"]
