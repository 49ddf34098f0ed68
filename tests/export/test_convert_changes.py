"""``ptfile convert`` says what it dropped or changed, and keeps what the output can hold:
non-tensor values in a ``.safetensors`` header's ``__metadata__`` (JSON texts) or an
``.npz``'s ``__ptfile__`` notes, bfloat16/float8 as raw bits in an ``.npz``, tied
weights stored once in both, everything in a ``.pt``.  Checked on files real torch
writes, with the real ``safetensors`` package, ``numpy.load`` and ``torch.load``, through
the installed ``ptfile`` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import ptfile
from ptfile.export.convert import convert
from ptfile.export.values import VALUE_MAX_BYTES

ENTRY = Path(sys.executable).with_name("ptfile")
VOCAB, DIM = 512, 64
#: What transformers' load_state_dict accepts in a safetensors file's metadata["format"].
TRANSFORMERS_FORMATS = ("pt", "tf", "flax", "mlx")


def run(*args: object) -> subprocess.CompletedProcess[str]:
    command = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "ptfile"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def convert_json(*args: object) -> dict[str, Any]:
    result = run("convert", *args, "--json", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight


def _checkpoint() -> dict[str, Any]:
    torch.manual_seed(0)
    net = Tied().to(torch.bfloat16)
    return {
        "model": net.state_dict(),
        "scale": torch.randn(8).to(torch.float8_e4m3fn),
        "step": 3, "lr": 0.1, "name": "bert", "best": float("inf"), "note": None,
        "config": {"hidden": DIM, "act": "gelu", "dims": (1, 2)},
        "optim": {"state": {0: {"exp_avg": torch.zeros(4)}},
                  "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]},
        "blob": b"\x00\x01",
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("changes") / "ck.pt"
    torch.save(_checkpoint(), path)
    return path


@pytest.fixture(scope="module")
def converted(source: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``source`` converted once by the command to a ``.safetensors`` and an ``.npz``:
    each output and its JSON summary, by suffix (for tests that only read them)."""
    out = {}
    for suffix in ("safetensors", "npz"):
        path = source.parent / f"model.{suffix}"
        out[suffix] = path, convert_json(source, path)
    return out


EMBED_BYTES = VOCAB * DIM * 2
VALUES = {"step": 3, "lr": 0.1, "name": "bert", "best": float("inf"), "note": None,
          "config": {"hidden": DIM, "act": "gelu", "dims": [1, 2]},
          "optim.param_groups": [{"lr": 0.1, "betas": [0.9, 0.99], "params": [0]}]}
TENSORS = {"model.embed.weight", "model.norm.weight", "model.norm.bias", "scale",
           "optim.state.0.exp_avg"}
BLOB_DROPPED = {"name": "blob", "type": "bytes", "reason": "JSON cannot hold it"}


def _group(summary: dict[str, Any], change: str, **how: str) -> list[str]:
    groups = [g for g in summary["changed"] if g["change"] == change
              and all(g.get(k) == v for k, v in how.items())]
    assert len(groups) == 1, summary["changed"]
    names: list[str] = groups[0]["names"]
    return names


def test_safetensors_keeps_values_in_metadata(
        converted: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    out, summary = converted["safetensors"]
    assert summary["dropped"] == [BLOB_DROPPED]
    assert summary["aliases"] == {"model.lm_head.weight": "model.embed.weight"}
    assert set(_group(summary, "json", to="__metadata__")) == set(VALUES)
    assert set(_group(summary, "tuple-as-list")) == {"config", "optim.param_groups"}
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
        assert set(f.keys()) == TENSORS
    assert meta["format"] in TRANSFORMERS_FORMATS and meta["format"] == "pt"
    assert {name: json.loads(meta[name]) for name in VALUES} == VALUES
    assert json.loads(meta["ptfile.values"]) == list(summary["changed"][0]["names"])
    loaded = load_file(out)
    original = _checkpoint()
    assert torch.equal(loaded["model.embed.weight"], original["model"]["embed.weight"])
    assert loaded["model.embed.weight"].dtype == torch.bfloat16
    assert loaded["scale"].dtype == torch.float8_e4m3fn
    assert out.stat().st_size < 1.5 * EMBED_BYTES  # the tied weight once


def test_safetensors_back_to_pt_restores_values_and_ties(
        converted: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path) -> None:
    st, pt = converted["safetensors"][0], tmp_path / "back.pt"
    summary = convert_json(st, pt)
    assert summary["dropped"] == [] and summary["changed"] == []
    back, original = torch.load(pt, weights_only=True), _checkpoint()
    # The nesting comes back (ptfile.structure); tuples inside values are JSON lists.
    assert back.keys() == original.keys() - {"blob"}
    assert {k: back[k] for k in ("step", "lr", "name", "best", "note", "config")} == \
        {k: VALUES[k] for k in ("step", "lr", "name", "best", "note", "config")}
    assert back["optim"]["param_groups"] == VALUES["optim.param_groups"]
    assert torch.equal(back["optim"]["state"][0]["exp_avg"], torch.zeros(4))
    model = back["model"]
    assert model["lm_head.weight"].data_ptr() == model["embed.weight"].data_ptr()


def test_cli_text_names_what_changed_and_what_was_dropped(source: Path, tmp_path: Path) -> None:
    result = run("convert", source, tmp_path / "model.safetensors", "--no-progress")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  model.lm_head.weight: same data as model.embed.weight (stored once)" in lines
    assert "  dropped: blob (bytes): JSON cannot hold it" in lines
    assert any(line.startswith("  changed: 7 values stored as JSON text in __metadata__: step, ")
               for line in lines), lines
    result = run("convert", source, tmp_path / "model.npz", "--no-progress")
    assert "  changed: 3 tensors bfloat16 stored as uint16 (raw bits; the dtype is in "\
           "__ptfile__): model.embed.weight, model.norm.weight, model.norm.bias" \
        in result.stdout.splitlines()


def test_npz_keeps_raw_bits_and_ties_once(
        converted: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    out, summary = converted["npz"]
    assert _group(summary, "raw-bits", **{"from": "bfloat16", "to": "uint16"}) == \
        ["model.embed.weight", "model.norm.weight", "model.norm.bias"]
    assert _group(summary, "raw-bits", **{"from": "float8_e4m3fn", "to": "uint8"}) == ["scale"]
    assert set(_group(summary, "json", to="__ptfile__")) == set(VALUES)
    assert summary["dropped"] == [BLOB_DROPPED]
    assert summary["aliases"] == {"model.lm_head.weight": "model.embed.weight"}
    original = _checkpoint()
    with np.load(out) as z:  # allow_pickle=False: the notes are a plain str array
        assert set(z.files) == TENSORS | {"__ptfile__"}
        notes = json.loads(z["__ptfile__"].item())
        arrays = {k: z[k] for k in z.files if k != "__ptfile__"}
    assert arrays["model.embed.weight"].dtype == np.uint16
    assert arrays["scale"].dtype == np.uint8
    assert notes["aliases"] == {"model.lm_head.weight": "model.embed.weight"}
    assert notes["values"] == VALUES
    for name, dtype in notes["dtypes"].items():  # the rebuild the npz module documents
        arrays[name] = arrays[name].view(getattr(ml_dtypes, dtype))
    for alias, kept in notes["aliases"].items():
        arrays[alias] = arrays[kept]
    want = original["model"]["lm_head.weight"].view(torch.uint16).numpy()
    np.testing.assert_array_equal(arrays["model.lm_head.weight"].view(np.uint16), want)
    np.testing.assert_array_equal(arrays["scale"].view(np.uint8),
                                  original["scale"].view(torch.uint8).numpy())
    assert arrays["model.embed.weight"].dtype == ml_dtypes.bfloat16
    assert out.stat().st_size < 1.5 * EMBED_BYTES


def test_npz_upcast_widens_and_says_so(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.npz"
    summary = convert_json(source, out, "--npz-upcast")
    assert _group(summary, "upcast", **{"from": "bfloat16", "to": "float32"}) == \
        ["model.embed.weight", "model.norm.weight", "model.norm.bias"]
    assert not [g for g in summary["changed"] if g["change"] == "raw-bits"]
    with np.load(out) as z:
        assert z["model.embed.weight"].dtype == np.float32
        np.testing.assert_array_equal(z["model.embed.weight"],
                                      _checkpoint()["model"]["embed.weight"].float().numpy())
        assert json.loads(z["__ptfile__"].item())["upcast"]["scale"] == "float8_e4m3fn"


def test_npz_shared_policy_means_what_it_means_for_safetensors(source: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "copy.npz"
    summary = convert_json(source, out, "--shared", "copy")
    assert summary["aliases"] == {}
    with np.load(out) as z:
        assert "model.lm_head.weight" in z.files
        assert "aliases" not in json.loads(z["__ptfile__"].item())
    assert out.stat().st_size > 2 * EMBED_BYTES
    with pytest.raises(ptfile.SaveError):
        convert(str(source), str(tmp_path / "e.npz"), to="npz", shared="error")
    result = run("convert", source, tmp_path / "e2.npz", "--shared", "error", "--no-progress")
    assert result.returncode != 0 and "share storage" in result.stderr


def test_pt_output_drops_nothing(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.pt"
    summary = convert_json(source, out)
    assert summary["dropped"] == [] and summary["changed"] == []
    back, original = torch.load(out, weights_only=True), _checkpoint()
    assert back.keys() == original.keys()
    for key in ("step", "lr", "name", "best", "note", "config", "blob"):
        assert back[key] == original[key]
    assert back["optim"]["param_groups"] == original["optim"]["param_groups"]
    assert torch.equal(back["model"]["embed.weight"], original["model"]["embed.weight"])
    assert back["model"]["lm_head.weight"].data_ptr() == back["model"]["embed.weight"].data_ptr()


def test_structural_pickled_module_reports_the_module_dropped(tmp_path: Path) -> None:
    path = tmp_path / "whole.pt"
    torch.save(Tied(), path)
    summary = convert_json(path, tmp_path / "whole.safetensors", "--structural")
    assert [(d["name"], d["type"]) for d in summary["dropped"]] == \
        [("", "test_convert_changes.Tied")]
    assert "state_dict" in summary["dropped"][0]["reason"]


def test_header_names_and_oversized_values_are_dropped_not_clobbered(tmp_path: Path) -> None:
    path, out = tmp_path / "odd.pt", tmp_path / "odd.safetensors"
    torch.save({"w": torch.ones(2), "format": "tf", "ptfile.aliases": "x",
                "big": "x" * (VALUE_MAX_BYTES + 1), "ok": 1}, path)
    summary = convert_json(path, out)
    assert {d["name"]: d["reason"].split(":")[0] for d in summary["dropped"]} == {
        "format": "the header's own metadata has this name",
        "ptfile.aliases": "the header's own metadata has this name",
        "big": f"{VALUE_MAX_BYTES + 3} bytes of JSON"}
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and "ptfile.aliases" not in meta
    assert json.loads(meta["ptfile.values"]) == ["ok"] and meta["ok"] == "1"


def test_foreign_safetensors_metadata_carried_or_reported(tmp_path: Path) -> None:
    src = tmp_path / "lora.safetensors"
    save_file({"w": torch.ones(2)}, str(src), metadata={"format": "pt", "ss_rank": "8"})
    summary = convert_json(src, tmp_path / "again.safetensors")
    assert summary["dropped"] == []
    with safe_open(str(tmp_path / "again.safetensors"), "pt") as f:
        assert f.metadata()["ss_rank"] == "8"
    summary = convert_json(src, tmp_path / "lora.pt")
    assert summary["dropped"] == [{"name": "__metadata__.ss_rank", "type": "str",
                                   "reason": "safetensors header metadata: a .pt has no "
                                             "place for it"}]


def test_dcp_to_safetensors_lists_non_tensor_items(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.ones(3)}, "step": 3}, checkpoint_id=tmp_path / "dcp")
    summary = convert_json(tmp_path / "dcp", tmp_path / "dcp.safetensors")
    assert [d["name"] for d in summary["dropped"]] == ["step"]
    assert convert_json(tmp_path / "dcp", tmp_path / "dcp.pt")["dropped"] == []


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_bulk_records_carry_the_same_account(
        source: Path, converted: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path,
        fmt: str) -> None:
    single = converted[fmt][1]  # the one-file conversion's account
    result = run("convert", source, "--out-prefix", tmp_path / "out", "--to", fmt,
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    converted = [r for r in records if r.get("verdict") == "converted"]
    assert len(converted) == 1, records
    for key in ("aliases", "dropped", "changed"):
        assert converted[0]["result"][key] == single[key]


@pytest.mark.parametrize("meta", [{"ptfile.values": "[1"}, {"ptfile.values": "{}"},
                                  {"ptfile.aliases": "[]"},
                                  {"ptfile.values": '["a"]', "a": "not json"}])
def test_damaged_ptfile_metadata_reads_as_torch_reads_it(tmp_path: Path,
                                                         meta: dict[str, str]) -> None:
    """ptfile's own metadata that does not hold together is not used, with a warning:
    the file converts as torch reads it (its tensors by name), never fails."""
    src = tmp_path / "odd.safetensors"
    save_file({"w": torch.ones(2)}, str(src), metadata=meta)
    with pytest.warns(ptfile.PtfileWarning, match="ptfile metadata is not used"):
        convert(str(src), str(tmp_path / "odd.pt"), to="pt")
    back = torch.load(tmp_path / "odd.pt", weights_only=True)
    assert list(back) == list(torch.load(src)) == ["w"]


def test_an_alias_to_nothing_is_not_used(tmp_path: Path) -> None:
    src = tmp_path / "odd.safetensors"
    save_file({"w": torch.ones(2)}, str(src), metadata={"ptfile.aliases": '{"a": [1], "b": "x"}'})
    with pytest.warns(ptfile.PtfileWarning, match="alias 'a' names \\[1\\]"):
        convert(str(src), str(tmp_path / "odd.pt"), to="pt")
    assert list(torch.load(tmp_path / "odd.pt", weights_only=True)) == ["w"]
