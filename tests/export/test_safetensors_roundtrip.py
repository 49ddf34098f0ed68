"""Nothing lost in a round trip through ``.safetensors`` (issue 29, items 3 and 4).

Real torch writes the ``.pt``/``.bin`` files (tied weights, a nested training dict, a
sharded checkpoint as transformers shards it); ``ptfile convert`` writes the
``.safetensors``; the ``safetensors`` package (``safe_open``, ``numpy.load_file``,
``torch.save``) and ptfile read them back: every name, value, tie and nesting is
accounted for, and ptfile's one writer writes the package's bytes.
"""

from __future__ import annotations

import collections
import json
import math
import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from safetensors import safe_open

import ptfile
from oracle import ptfile_bits, torch_bits
from ptfile import cli, outcomes
from ptfile.export.safetensors import dump
from ptfile.formats.safetensors.writer import Planned, save_file
from ptfile.inspection import diff

VOCAB, DIM, LAYERS = 64, 8, 2


class Tiny(torch.nn.Module):
    """A decoder with its head tied to its embedding, named as transformers names one."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(VOCAB, DIM)
        self.model.layers = torch.nn.ModuleList(
            torch.nn.ModuleDict({"q_proj": torch.nn.Linear(DIM, DIM),
                                 "norm": torch.nn.LayerNorm(DIM)}) for _ in range(LAYERS))
        self.model.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight


def _state_dict() -> collections.OrderedDict[str, torch.Tensor]:
    torch.manual_seed(0)
    return Tiny().state_dict()


TIE = {"model.embed_tokens.weight": "lm_head.weight"}  # sorted(names)[0] is kept


def _training() -> dict[str, Any]:
    sd = _state_dict()
    return {"model": sd, "epoch": 3, "cfg": {"lr": 0.1, "name": "tiny", "sizes": [1, 2]},
            "optim": {"state": {0: {"exp_avg": torch.zeros(3)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "pair": (torch.arange(4.0), torch.ones(2, dtype=torch.int64)),
            "ema": [torch.full((2,), 0.5), None]}


def _same_object(mine: Any, theirs: Any, where: str = "") -> None:
    """``mine`` (ptfile) is ``theirs`` (torch): the same containers, keys, values and
    tensors, bit for bit."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(mine, ptfile.Tensor), where
        assert repr(mine.dtype) == str(theirs.dtype) and tuple(mine.shape) == theirs.shape, where
        np.testing.assert_array_equal(ptfile_bits(mine), torch_bits(theirs), err_msg=where)
        return
    assert type(mine) is type(theirs), (where, type(mine), type(theirs))
    if isinstance(theirs, dict):
        assert list(mine) == list(theirs), where
        for key, value in theirs.items():
            _same_object(mine[key], value, f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(mine) == len(theirs), where
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            _same_object(a, b, f"{where}.{i}")
    else:
        assert mine == theirs, where


def _convert_cli(capsys: pytest.CaptureFixture[str], *args: object) -> dict[str, Any]:
    code = cli.main(["convert", *map(str, args), "--json", "--no-progress"])
    out = capsys.readouterr().out
    assert code == outcomes.EXIT_OK, out
    summary: dict[str, Any] = json.loads(out)
    return summary


# --------------------------------------------------------------------------- ties


@pytest.mark.parametrize("reverse", [False, True])
def test_tied_names_keep_the_one_that_sorts_first(tmp_path: Path, reverse: bool,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sd = _state_dict()
    if reverse:
        sd = collections.OrderedDict(reversed(sd.items()))
    torch.save(sd, tmp_path / "model.bin")
    summary = _convert_cli(capsys, tmp_path / "model.bin", tmp_path / "model.safetensors")
    # safetensors.torch.save_model's own choice, asked of the package.
    removed = safetensors.torch._remove_duplicate_names(dict(sd))
    assert summary["aliases"] == {gone: kept for kept, names in removed.items()
                                  for gone in names} == TIE
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        assert set(f.keys()) == set(sd) - set(TIE)
        assert json.loads(f.metadata()["ptfile.aliases"]) == TIE


def test_a_state_dict_and_its_conversion_diff_identical(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """The user's case: ``ptfile diff model.bin model.safetensors`` right after convert."""
    sd = _state_dict()
    bin_path, st = tmp_path / "model.bin", tmp_path / "model.safetensors"
    torch.save(sd, bin_path)
    _convert_cli(capsys, bin_path, st)
    assert cli.main(["diff", str(bin_path), str(st), "--no-progress"]) == outcomes.EXIT_OK
    assert "identical" in capsys.readouterr().out
    loaded = ptfile.load(st)
    assert set(loaded) == set(sd)
    assert loaded["model.embed_tokens.weight"] is loaded["lm_head.weight"]  # tied again
    with ptfile.open(st) as ck:
        assert set(ck) == set(sd)
        np.testing.assert_array_equal(ck.get_tensor("model.embed_tokens.weight"),
                                      sd["lm_head.weight"].numpy())
    assert set(ptfile.inspect(st).shared) == {"lm_head.weight"}  # one storage, both names
    assert cli.main(["inspect", str(st)]) == outcomes.EXIT_OK
    assert capsys.readouterr().out.startswith(f"{st}: safetensors checkpoint")


def test_shared_copy_writes_every_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    sd = _state_dict()
    torch.save(sd, tmp_path / "model.bin")
    summary = _convert_cli(capsys, tmp_path / "model.bin", tmp_path / "model.safetensors",
                           "--shared", "copy")
    assert summary["aliases"] == {}
    loaded = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert set(loaded) == set(sd)
    for name, t in sd.items():
        assert torch.equal(loaded[name], t)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "ptfile.aliases" not in f.metadata()


# --------------------------------------------------------------------------- nesting


def test_nested_training_dict_comes_back_nested(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    original = _training()
    pt, st, back = tmp_path / "ck.pt", tmp_path / "ck.safetensors", tmp_path / "back.pt"
    torch.save(original, pt)
    summary = _convert_cli(capsys, pt, st)
    assert summary["aliases"] == {f"model.{k}": f"model.{v}" for k, v in TIE.items()}
    assert summary["dropped"] == []
    # What the safetensors package reads: every stored tensor, and the values as JSON.
    flat = safetensors.numpy.load_file(st)
    names = set(ptfile.open(pt).keys())
    assert set(flat) == names - set(summary["aliases"])
    with ptfile.open(pt) as ck:
        for name in flat:
            np.testing.assert_array_equal(flat[name].view(np.uint8),
                                          ck.get_tensor(name).view(np.uint8), err_msg=name)
    with safe_open(str(st), "np") as f:
        meta = f.metadata()
    assert json.loads(meta["epoch"]) == 3 and json.loads(meta["cfg"]) == original["cfg"]
    # What ptfile reads: the object torch.save wrote, as ptfile.load reads the .pt.
    restored, from_pt = ptfile.load(st), ptfile.load(pt)
    _same_object(restored, original)
    assert list(restored["model"]) == list(from_pt["model"])
    model = restored["model"]
    assert model["model.embed_tokens.weight"] is model["lm_head.weight"]
    with ptfile.open(st) as ck:
        assert list(ck) == list(ptfile.open(pt).keys())
    report = diff(pt, st)
    assert report.identical, report.to_dict()
    # Converting the .safetensors again gives the same bytes: nothing was lost to lose.
    _convert_cli(capsys, st, tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == st.read_bytes()
    # And back to a .pt: what torch.load reads is the original object, ties included.
    _convert_cli(capsys, st, back)
    again = torch.load(back, weights_only=True)
    assert again.keys() == original.keys() and again["cfg"] == original["cfg"]
    assert isinstance(again["pair"], tuple) and isinstance(again["model"], collections.OrderedDict)
    assert again["model"]["lm_head.weight"].data_ptr() == \
        again["model"]["model.embed_tokens.weight"].data_ptr()
    assert again["optim"]["param_groups"] == original["optim"]["param_groups"]
    assert torch.equal(again["optim"]["state"][0]["exp_avg"], torch.zeros(3))
    assert again["ema"][1] is None and torch.equal(again["ema"][0], original["ema"][0])


def test_nested_and_flattened_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = torch.arange(3.0)
    torch.save({"model": {"w": w}, "epoch": 3}, tmp_path / "nested.pt")
    torch.save({"model.w": w, "epoch": 3}, tmp_path / "flat.pt")
    report = diff(tmp_path / "nested.pt", tmp_path / "flat.pt")
    assert not report.identical
    assert report.structure == {"model": ["dict", None]}
    assert not (report.added or report.removed or report.values_changed)
    assert diff(tmp_path / "nested.pt", tmp_path / "flat.pt", tensors_only=True).identical
    assert cli.main(["diff", str(tmp_path / "nested.pt"), str(tmp_path / "flat.pt"),
                     "--no-progress"]) == outcomes.EXIT_DIFFERENT
    assert "~ model: dict -> no container (nesting)" in capsys.readouterr().out


def test_what_json_cannot_hold_is_reported_and_keeps_the_indices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": [torch.ones(1), b"blob", torch.zeros(1)], "dims": (1, 2)},
               tmp_path / "odd.pt")
    summary = _convert_cli(capsys, tmp_path / "odd.pt", tmp_path / "odd.safetensors")
    assert [d["name"] for d in summary["dropped"]] == ["w.1"]
    restored = ptfile.load(tmp_path / "odd.safetensors")
    assert restored["w"][1] is None and restored["dims"] == [1, 2]  # a tuple value: a list
    assert set(ptfile.open(tmp_path / "odd.safetensors").keys()) == {"w.0", "w.2"}


# --------------------------------------------------------------------------- sharded


def _shards(folder: Path, sd: dict[str, torch.Tensor]) -> dict[str, str]:
    """Three ``.bin`` shards written with torch.save as transformers writes them, the tied
    pair in the first; the index beside them.  Returns the weight_map."""
    names = list(sd)
    tied = ["lm_head.weight", "model.embed_tokens.weight"]
    rest = [n for n in names if n not in tied]
    groups = [[tied[1], *rest[:3], tied[0]], rest[3:8], rest[8:]]
    weight_map = {}
    for i, group in enumerate(groups, 1):
        shard = f"pytorch_model-{i:05d}-of-{len(groups):05d}.bin"
        torch.save({n: sd[n] for n in group}, folder / shard)
        weight_map.update(dict.fromkeys(group, shard))
    total = sum(t.numel() * t.element_size() for n, t in sd.items() if n != "lm_head.weight")
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return weight_map


def test_sharded_index_keeps_every_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    sd = _state_dict()
    src, out = tmp_path / "hf", tmp_path / "out"
    src.mkdir()
    old_map = _shards(src, sd)
    summary = _convert_cli(capsys, src / "pytorch_model.bin.index.json", out)
    assert summary["aliases"] == TIE and summary["dropped"] == []
    assert summary["tensors"] == len(sd) and summary["shards"] == 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    # The weight_map lists what each shard holds; the alias is in the index's metadata.
    assert set(weight_map) == set(sd) - set(TIE)
    assert index["metadata"]["ptfile.aliases"] == TIE
    stored = 0
    for name, shard in weight_map.items():  # as transformers reads a sharded folder
        with safe_open(str(out / shard), "pt") as f:
            got = f.get_tensor(name)
        assert torch.equal(got, sd[name]), name
        assert shard == old_map[name].replace("pytorch_model", "model").replace(".bin",
                                                                                ".safetensors")
        stored += got.numel() * got.element_size()
    assert index["metadata"]["total_size"] == stored
    # ptfile reads the tied shard whole, and the same choice as a single-file convert.
    first = ptfile.load(out / "model-00001-of-00003.safetensors")
    assert first["model.embed_tokens.weight"] is first["lm_head.weight"]
    torch.save(sd, tmp_path / "whole.bin")
    assert _convert_cli(capsys, tmp_path / "whole.bin", tmp_path / "whole.safetensors"
                        )["aliases"] == summary["aliases"]
    # Back to .bin shards: every name is in a file again, and in the index.
    back = tmp_path / "back"
    again = _convert_cli(capsys, out / "model.safetensors.index.json", back)
    back_map = json.loads((back / "pytorch_model.bin.index.json").read_text())["weight_map"]
    assert back_map == old_map and again["tensors"] == len(sd)
    shard = torch.load(back / back_map["lm_head.weight"], weights_only=True)
    assert shard["lm_head.weight"].data_ptr() == shard["model.embed_tokens.weight"].data_ptr()


# --------------------------------------------------------------------------- the writer

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
          torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.complex64]


def _dtype_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    sd: dict[str, torch.Tensor] = {}
    for i, d in enumerate(DTYPES):
        sd[f"t{i:02d}.{str(d).removeprefix('torch.')}"] = (torch.randn(3, 2) * 9).to(d)
    sd["zero_d"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["Zé\n名"] = torch.ones(2)  # code point order, a control character, non-ASCII
    sd["a"] = torch.arange(5, dtype=torch.int64)
    sd["strided"] = torch.arange(12.0).reshape(3, 4)[:, ::2]
    return sd


def test_writer_writes_the_bytes_safetensors_writes(tmp_path: Path) -> None:
    sd = _dtype_state()
    torch.save(sd, tmp_path / "all.pt")
    with ptfile.open(tmp_path / "all.pt") as ck:
        tensors = ck.load_tensors()
    dump(tensors, tmp_path / "mine.safetensors")
    theirs = safetensors.torch.save({k: v.contiguous() for k, v in sd.items()},
                                    metadata={"format": "pt"})
    assert (tmp_path / "mine.safetensors").read_bytes() == theirs
    # More than one metadata entry: the package's order is a Rust HashMap's (random per
    # process), so the headers agree as JSON and the data byte for byte.
    meta = {"format": "pt", "b": "1", "a": "\x01é"}
    dump(tensors, tmp_path / "meta.safetensors", metadata=meta)
    theirs = safetensors.torch.save({k: v.contiguous() for k, v in sd.items()}, metadata=meta)
    mine = (tmp_path / "meta.safetensors").read_bytes()
    n = int.from_bytes(mine[:8], "little")
    assert mine[:8] == theirs[:8] and mine[8 + n:] == theirs[8 + n:]
    assert json.loads(mine[8:8 + n]) == json.loads(theirs[8:8 + n])


@pytest.mark.parametrize("metadata", [None, {}, {"format": "np"}])
def test_writer_equals_the_numpy_api(tmp_path: Path, metadata: dict[str, str] | None) -> None:
    arrays = {"b": np.arange(6, dtype="<i2").reshape(2, 3), "a": np.full((), 1.5),
              "c": np.zeros((2, 0), "f4")}
    planned = [Planned(k, ptfile.DTYPES[str(v.dtype)], v.shape) for k, v in arrays.items()]
    save_file(tmp_path / "w.safetensors", planned, lambda t: arrays[t.name], metadata)
    assert (tmp_path / "w.safetensors").read_bytes() == \
        safetensors.numpy.save(arrays, metadata=metadata)


def test_writer_holds_one_tensor_at_a_time(tmp_path: Path) -> None:
    """The writer asks for each tensor in data order and lets it go before the next, so a
    consolidation holds one tensor (DCP today, ZeRO next)."""
    shapes = {f"w{i}": (64, 8) for i in range(5)}
    planned = [Planned(k, ptfile.DTYPES["float32"], s) for k, s in shapes.items()]
    asked: list[str] = []
    last: list[weakref.ref[np.ndarray]] = []

    def fill(t: Planned) -> np.ndarray:
        assert all(ref() is None for ref in last), "the previous tensor is still held"
        asked.append(t.name)
        array = np.full(t.shape, len(asked), "<f4")
        last[:] = [weakref.ref(array)]
        return array

    layout = save_file(tmp_path / "s.safetensors", planned, fill, {"format": "pt"})
    assert asked == sorted(shapes) == [t.name for t in layout.order]
    loaded = safetensors.numpy.load_file(tmp_path / "s.safetensors")
    assert [float(loaded[n][0, 0]) for n in asked] == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(ptfile.SaveError, match="bytes given"):
        save_file(tmp_path / "bad.safetensors", planned[:1], lambda t: b"\0" * 3)
    assert not (tmp_path / "bad.safetensors").exists()


# --------------------------------------------------------------------------- hostile


def _deep(levels: int) -> str:
    return '{"list":[' * levels + '{"tensor":"w"}' + "]}" * levels


HOSTILE = {
    "values not JSON": {"ptfile.values": "[1"},
    "structure not JSON": {"ptfile.structure": '{"dict": ['},
    "structure a string": {"ptfile.structure": '"w"'},
    "alias to nowhere": {"ptfile.aliases": '{"v": "nothing"}'},
    "alias is a tensor": {"ptfile.aliases": '{"w": "w"}'},
    "unknown leaf": {"ptfile.structure": '{"dict": [["w", {"blob": "w"}]]}'},
    "tensor twice": {"ptfile.structure": '{"list": [{"tensor": "w"}, {"tensor": "w"}]}'},
    "key twice": {"ptfile.structure": '{"dict": [["k", {"tensor": "w"}], ["k", null]]}'},
    "list key": {"ptfile.structure": '{"dict": [[["k"], {"tensor": "w"}]]}'},
    "body not a list": {"ptfile.structure": '{"tuple": {"tensor": "w"}}'},
    "tensor left out": {"ptfile.structure": '{"dict": []}'},
    "value named like a tensor": {"ptfile.values": '["w"]'},
    "value of no entry": {"ptfile.values": '["missing"]'},
    "too deep for JSON": {"ptfile.structure": _deep(100_000)},
    "too deep for Limits": {"ptfile.structure": _deep(30)},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_ptfile_metadata_reads_as_torch_reads_it(tmp_path: Path, name: str) -> None:
    path = tmp_path / "odd.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(path), metadata=HOSTILE[name])
    limits = ptfile.Limits(max_depth=20)
    with pytest.warns(ptfile.PtfileWarning, match="ptfile metadata is not used"):
        loaded = ptfile.load(path, limits=limits)
    assert list(loaded) == list(torch.load(path)) == ["w"]
    with pytest.warns(ptfile.PtfileWarning), ptfile.open(path, limits=limits) as ck:
        assert list(ck) == ["w"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptfile.PtfileWarning)
        assert ptfile.inspect(path).totals["tensors"] == 1
        assert diff(path, path).identical


def test_structure_within_limits_is_used(tmp_path: Path) -> None:
    path = tmp_path / "deep.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(path),
                                metadata={"ptfile.structure": _deep(30)})
    node = ptfile.load(path)
    for _ in range(30):
        node = node[0]
    assert node.numpy().tolist() == [1.0, 1.0]
    assert math.prod(ptfile.open(path)["0" + ".0" * 29].shape) == 2


def test_what_the_structure_cannot_keep_is_reported(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    first, second = torch.ones(2), torch.zeros(2)
    torch.save({"a.b": first, "a": {"b": second}, "by_pair": {("x", 1): torch.arange(3)}},
               tmp_path / "odd.pt")
    summary = _convert_cli(capsys, tmp_path / "odd.pt", tmp_path / "odd.safetensors")
    assert [(d["name"], d["type"]) for d in summary["dropped"]] == [("a.b", "Tensor")]
    assert {g["change"]: g["names"] for g in summary["changed"]} == \
        {"key-as-text": ["by_pair.('x', 1)"]}
    restored = ptfile.load(tmp_path / "odd.safetensors")
    assert restored["a"] == {} and torch.equal(torch.from_numpy(restored["a.b"].numpy()), first)
    assert list(restored["by_pair"]) == ["('x', 1)"]
    deep: list[Any] = [torch.ones(1)]
    for _ in range(250):
        deep = [deep]
    torch.save(deep, tmp_path / "deep.pt")
    summary = _convert_cli(capsys, tmp_path / "deep.pt", tmp_path / "deep.safetensors")
    assert summary["changed"] == [{"change": "flattened", "names": [""]}]
    assert list(ptfile.load(tmp_path / "deep.safetensors")) == [".".join(["0"] * 251)]
