"""Checkpoint folders as people have them (issue 29): one input record, every folder kind
a checkpoint in every front door, checked against torch, ``safetensors`` and
``transformers`` reading the same folders and ptfile's outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ptfile
from commands import Ran, run_each
from folders import make_zoo
from ptfile.formats.inputs import Input, InputKind, resolve_input
from ptfile.model.tree import flatten

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_zoo(tmp_path_factory.mktemp("zoo"))


def _cli(*args: object, check: int | None = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ptfile", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)
    if check is not None:
        assert done.returncode == check, done.stdout + done.stderr
    return done


def _cli_each(*commands: tuple[object, ...], checks: tuple[int, ...] = ()) -> list[Ran]:
    """Each command line run in turn in one child (:func:`commands.run_each`); the exit
    codes must be ``checks`` (0 each by default)."""
    done = run_each(*([str(a) for a in c] for c in commands))
    for command, ran, check in zip(commands, done, checks or (0,) * len(commands),
                                   strict=True):
        assert ran.returncode == check, (command, ran.stdout + ran.stderr)
    return done


def _same(a: Any, b: Any) -> None:
    """``a`` (ptfile) equals ``b`` (torch), tensors value for value."""
    if isinstance(b, torch.Tensor):
        assert np.array_equal(np.asarray(a), b.detach().numpy())
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            _same(a[k], b[k])
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(b, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize(("name", "kind", "roles"), [
    ("st_one", InputKind.SHARDS, ["model"]),
    ("st_sharded", InputKind.SHARDS, ["model"]),
    ("bin_one", InputKind.MODEL, ["model"]),
    ("bin_sharded", InputKind.MODEL, ["model"]),
    ("trainer", InputKind.TRAINER, ["model", "optimizer", "rng_state", "scheduler",
                                    "trainer_state", "training_args"]),
])
def test_each_folder_is_one_checkpoint_with_its_parts(zoo: dict[str, Any], name: str,
                                                      kind: InputKind, roles: list[str]) -> None:
    record = resolve_input(zoo[name])
    assert record.kind is kind
    assert sorted(p.role for p in record.parts) == sorted(roles)
    assert resolve_input(record) is record  # a layer handed the record does not decide again
    assert ptfile.detect_format(zoo[name]) is (
        ptfile.Format.DCP if kind is InputKind.SHARDS else ptfile.Format.SET)


@pytest.mark.parametrize("index", ["bin_sharded/pytorch_model.bin.index.json",
                                   "st_sharded/model.safetensors.index.json"])
def test_an_index_file_stands_for_its_model(zoo: dict[str, Any], index: str) -> None:
    folder, name = index.split("/")
    path = zoo[folder] / name
    record = resolve_input(path)
    assert record.kind is resolve_input(zoo[folder]).kind
    weight_map = json.loads(path.read_text())["weight_map"]
    assert dict(record.weight_map) == weight_map
    with ptfile.open(path) as ck:
        assert sorted(ck) == sorted(weight_map)


def test_bin_shards_load_as_torch_loads_them(zoo: dict[str, Any]) -> None:
    folder = zoo["bin_sharded"]
    weight_map = json.loads((folder / "pytorch_model.bin.index.json").read_text())["weight_map"]
    shards = {f: torch.load(folder / f, weights_only=True) for f in set(weight_map.values())}
    sd = ptfile.load(folder)
    assert list(sd) == list(weight_map)  # the index's order
    for name, shard in weight_map.items():
        _same(sd[name], shards[shard][name])
    # tied names share one storage, as in torch's load of their shard
    assert sd["lm_head.weight"].storage is sd["model.embed_tokens.weight"].storage
    single = ptfile.load(zoo["bin_one"])
    assert sorted(single) == sorted(sd)


def test_a_trainer_folder_loads_part_by_part(zoo: dict[str, Any]) -> None:
    folder = zoo["trainer"]
    ck = ptfile.load(folder)
    assert sorted(ck) == ["model", "optimizer", "rng_state", "scheduler", "trainer_state",
                          "training_args"]
    from safetensors.torch import load_file

    _same(ck["model"], load_file(folder / "model.safetensors"))
    _same(ck["optimizer"], torch.load(folder / "optimizer.pt", weights_only=True))
    _same(ck["scheduler"], torch.load(folder / "scheduler.pt", weights_only=True))
    rng = torch.load(folder / "rng_state.pth", weights_only=False)
    _same(ck["rng_state"]["cpu"], rng["cpu"])
    assert ck["rng_state"]["numpy"][0] == rng["numpy"][0]
    assert np.array_equal(ck["rng_state"]["numpy"][1], rng["numpy"][1])
    assert ck["trainer_state"] == json.loads((folder / "trainer_state.json").read_text())
    args = ck["training_args"]  # read structurally: an inert stand-in, nothing imported
    assert type(args).__name__ == "StandIn" or "stand-in" in repr(args)


def test_open_names_a_trainer_folders_tensors_by_role(zoo: dict[str, Any]) -> None:
    folder = zoo["trainer"]
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    with ptfile.open(folder) as ck:
        assert sorted(ck) == sorted(flatten(ptfile.load(folder)))
        exp_avg = optimizer["state"][0]["exp_avg"]
        info = ck.info("optimizer.state.0.exp_avg")
        assert info.shape == tuple(exp_avg.shape)
        assert np.array_equal(ck.get_tensor("optimizer.state.0.exp_avg"), exp_avg.numpy())
        assert np.array_equal(ck.get_slice("optimizer.state.0.exp_avg")[1:3],
                              exp_avg[1:3].numpy())
        assert ck.metadata()["part.optimizer"] == "optimizer.pt"


def test_inspect_describes_the_set_as_a_whole(zoo: dict[str, Any]) -> None:
    folder = zoo["trainer"]
    done, text_done, sharded = _cli_each(("inspect", folder, "--json"), ("inspect", folder),
                                         ("inspect", zoo["st_sharded"]))
    record = json.loads(done.stdout)
    parts = {p["role"]: p for p in record["parts"]}
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    n = sum(len(s) - 1 for s in optimizer["state"].values()) + len(optimizer["state"])
    assert parts["optimizer"]["totals"]["tensors"] == n
    assert parts["model"]["format"] == "safetensors shards"
    assert parts["trainer_state"]["format"] == "json"
    assert record["totals"]["tensors"] == sum(p["totals"]["tensors"] for p in parts.values())
    text = text_done.stdout
    assert text.startswith(f"{folder}: trainer checkpoint")
    assert "Parts (6)" in text and "training_args" in text
    assert "safetensors shards checkpoint" in sharded.stdout


VERIFIED = ("st_sharded", "bin_one", "bin_sharded", "trainer")


@pytest.fixture(scope="module")
def verified(zoo: dict[str, Any]) -> dict[str, Ran]:
    """``ptfile verify FOLDER --json`` of each folder of :data:`VERIFIED`, in one child."""
    return dict(zip(VERIFIED, _cli_each(*(("verify", zoo[name], "--json")
                                          for name in VERIFIED)), strict=True))


@pytest.mark.parametrize("name", VERIFIED)
def test_verify_reads_every_part(verified: dict[str, Ran], name: str) -> None:
    report = json.loads(verified[name].stdout)
    assert report["ok"] and report["tensors_checked"] > 0


def test_verify_names_the_damaged_shard(zoo: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "bin"
    shutil.copytree(zoo["bin_sharded"], folder)
    shard = folder / "pytorch_model-00002-of-00003.bin"
    data = bytearray(shard.read_bytes())
    data[-200] ^= 0xFF  # inside the central directory or a record: damage either way
    shard.write_bytes(bytes(data))
    report = ptfile.verify(folder)
    assert not report.ok
    assert any("pytorch_model-00002-of-00003.bin" in f"{p.where} {p.message}"
               for p in report.problems)
    assert _cli("verify", folder, check=1).stdout.startswith(f"{folder}: DAMAGED")


def test_diff_compares_a_model_in_one_file_and_in_shards(zoo: dict[str, Any]) -> None:
    files, trainer = _cli_each(("diff", zoo["bin_one"], zoo["bin_sharded"]),
                               ("diff", zoo["trainer"], zoo["trainer"]))
    assert "identical" in files.stdout
    assert "identical" in trainer.stdout


def test_convert_bin_shards_to_one_file(zoo: dict[str, Any], tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    out, back = tmp_path / "one.safetensors", tmp_path / "one.pt"
    done, _ = _cli_each(("convert", zoo["bin_sharded"], out, "--json"),
                        ("convert", zoo["bin_sharded"], back))
    summary = json.loads(done.stdout)
    stored = load_file(out)
    state = zoo["state"]
    # every name is stored or declared as an alias of a stored one, values equal
    assert set(stored) | set(summary["aliases"]) == set(state)
    for name, t in state.items():
        kept = summary["aliases"].get(name, name)
        assert np.array_equal(stored[kept], t.detach().numpy())
    loaded = torch.load(back, weights_only=True)
    assert sorted(loaded) == sorted(state)


def test_convert_bin_shards_to_a_folder_transformers_loads(zoo: dict[str, Any],
                                                         tmp_path: Path) -> None:
    import shutil

    from transformers import LlamaForCausalLM

    out = tmp_path / "st"
    _cli("convert", zoo["bin_sharded"], f"{out}/")
    shutil.copy(zoo["bin_sharded"] / "config.json", out / "config.json")
    assert (out / "model.safetensors.index.json").exists()
    model = LlamaForCausalLM.from_pretrained(out)
    for name, t in model.state_dict().items():
        assert torch.equal(t, zoo["state"][name]), name


def test_convert_a_trainer_folder_writes_its_model(zoo: dict[str, Any], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "model.pt"
    summary = json.loads(_cli("convert", zoo["trainer"], out, "--json").stdout)
    assert sorted(d["name"] for d in summary["dropped"]) == [
        "optimizer", "rng_state", "scheduler", "trainer_state", "training_args"]
    want = load_file(zoo["trainer"] / "model.safetensors")
    got = torch.load(out, weights_only=True)
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name])


def test_scan_reads_every_file_of_a_set(zoo: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    # A trainer folder's rng_state (numpy) and training_args (transformers' classes) are
    # allowed by their role, in those files only: numpy in the optimizer (moved), or another
    # class beside the arguments (other), stays unknown; a payload in a part of a set
    # (hostile) is found, whatever the rest holds. All scanned in one child.
    moved, other, hostile = tmp_path / "moved", tmp_path / "other", tmp_path / "ck"
    for folder in (moved, other, hostile):
        shutil.copytree(zoo["trainer"], folder)
    (moved / "optimizer.pt").write_bytes((moved / "rng_state.pth").read_bytes())
    (other / "training_args.bin").write_bytes(b"\x80\x02ctransformers.models.auto\nThing\n"
                                              b")\x81q\x00.")
    (hostile / "scheduler.pt").write_bytes(b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00trueq"
                                           b"\x00\x85R.")
    _, done, _, other_done, hostile_done = _cli_each(
        ("scan", zoo["bin_sharded"]), ("scan", zoo["trainer"], "--json"), ("scan", moved),
        ("scan", other), ("scan", hostile, "--json"), checks=(0, 0, 3, 3, 1))
    # the trainer's own files: read as data as ptfile.load reads them
    found = json.loads(done.stdout)
    findings = found["findings"] if isinstance(found, dict) else found[0]["findings"]
    by_role = [f for f in findings if f["location"].startswith("training_args.bin:")]
    assert by_role and all(f["verdict"] == "allowed" for f in by_role)
    assert any("Trainer's arguments" in f["message"] for f in by_role)
    assert "transformers.models.auto.Thing" in other_done.stdout
    assert "posix" in hostile_done.stdout and "scheduler.pt" in hostile_done.stdout


@pytest.fixture
def listings(zoo: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``bin_sharded`` behind ``memory://zoo/bin_sharded``; yields the folders listed."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    fs = fsspec.filesystem("memory")
    for path in sorted(zoo["bin_sharded"].iterdir()):
        fs.pipe(f"/zoo/bin_sharded/{path.name}", path.read_bytes())
    calls: list[str] = []
    real = MemoryFileSystem.ls

    def counted(self: Any, path: str, detail: bool = True, **kw: Any) -> Any:
        calls.append(path)
        return real(self, path, detail=detail, **kw)

    monkeypatch.setattr(MemoryFileSystem, "ls", counted)
    yield calls
    fs.rm("/zoo", recursive=True)


@pytest.mark.parametrize("command", ["convert", "scan", "inspect", "verify"])
def test_a_command_lists_a_folder_url_once(listings: list[str], tmp_path: Path,
                                           command: str, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    from ptfile.cli import main

    url = "memory://zoo/bin_sharded"
    args = [url, str(tmp_path / "out.safetensors")] if command == "convert" else [url]
    assert main([command, *args, "--json"]) == 0, capsys.readouterr()
    assert len(listings) == 1, listings


def test_a_folder_url_is_listed_once(zoo: dict[str, Any], listings: list[str]) -> None:
    url = "memory://zoo/bin_sharded"
    sd = ptfile.load(url)
    assert len(listings) == 1
    assert sorted(sd) == sorted(zoo["state"])
    listings.clear()
    assert ptfile.inspect(url).totals["tensors"] == len(zoo["state"])
    assert len(listings) == 1
    record = resolve_input(url)
    listings.clear()
    assert isinstance(record, Input)
    with ptfile.open(record) as ck:
        assert len(ck) == len(zoo["state"])
    assert listings == []


def test_a_converted_folder_reads_back_whole(zoo: dict[str, Any], tmp_path: Path) -> None:
    """``.bin`` shards → a safetensors folder (the tie stored once, declared) → every
    front door sees every name again, the tie one tensor; and back to ``.pt`` for torch."""
    out = tmp_path / "st"
    summary = json.loads(_cli("convert", zoo["bin_sharded"], f"{out}/", "--json").stdout)
    assert summary["aliases"]  # the tied pair, stored once
    state = zoo["state"]
    sd = ptfile.load(out)
    assert sorted(sd) == sorted(state)
    for alias, kept in summary["aliases"].items():
        assert sd[alias] is sd[kept]
    with ptfile.open(out) as ck:
        assert sorted(ck) == sorted(state)
        for name, t in state.items():
            assert np.array_equal(ck.get_tensor(name), t.numpy())
        loaded = ck.load_tensors()  # with data: the tie is one tensor, as load gives it
        for alias, kept in summary["aliases"].items():
            assert loaded[alias] is loaded[kept]
    back, single = tmp_path / "back.pt", tmp_path / "one.safetensors"
    diffed, converted, _ = _cli_each(("diff", zoo["bin_sharded"], out),
                                     ("convert", out, back, "--json"), ("convert", out, single))
    assert "identical" in diffed.stdout
    again = json.loads(converted.stdout)
    assert again["aliases"] == summary["aliases"]
    loaded = torch.load(back, weights_only=True)
    assert sorted(loaded) == sorted(state)
    for alias, kept in summary["aliases"].items():
        assert loaded[alias].untyped_storage().data_ptr() == \
            loaded[kept].untyped_storage().data_ptr()
    with ptfile.open(single) as ck:
        assert sorted(ck) == sorted(state)
