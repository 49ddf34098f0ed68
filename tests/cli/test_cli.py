"""The ``ptfile`` command, run as a real subprocess on files written by real torch."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptfile.outcomes import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_UNSAFE,
)

ENTRY = Path(sys.executable).with_name("ptfile")


def run(*args: str | Path, module: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ptfile"] if module or not ENTRY.exists() else [str(ENTRY)]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(4, 3)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    net = Tied()
    ckpt = {"model": net.state_dict(), "step": 7,
            "ema": {"w": net.fc.weight.detach().to(torch.bfloat16)}}
    paths = {"model": folder / "model.pt", "other": folder / "other.pt"}
    torch.save(ckpt, paths["model"])
    changed = {"model": {k: v.clone() for k, v in net.state_dict().items()}, "step": 8}
    changed["model"]["fc.bias"] += 0.5
    changed["model"]["extra"] = torch.zeros(2)
    del changed["model"]["fc.weight"]
    torch.save(changed, paths["other"])
    return paths


def test_help_is_readable_and_lists_every_command() -> None:
    result = run("--help")
    assert result.returncode == EXIT_OK
    for word in ("inspect", "scan", "convert", "verify", "diff", "exit codes"):
        assert word in result.stdout
    assert run("convert", "--help").returncode == EXIT_OK
    assert run().returncode == EXIT_ERROR  # no command: argparse usage error
    assert run("--help", module=True).returncode == EXIT_OK


def test_inspect_text(files: dict[str, Path]) -> None:
    result = run("inspect", files["model"])
    assert result.returncode == EXIT_OK, result.stderr
    out = result.stdout
    assert "zip checkpoint" in out
    assert "byteorder little" in out
    assert "model.embed.weight" in out
    assert "bfloat16" in out
    assert "[10, 4]" in out
    assert "Shared storages" in out
    assert "model.embed.weight, model.head.weight" in out
    assert "Object tree: dict (3)" in out
    assert "step: int = 7" in out
    assert "Records (" in out
    assert "Totals:" in out


def test_inspect_json_matches_torch(files: dict[str, Path]) -> None:
    result = run("inspect", files["model"], "--json")
    assert result.returncode == EXIT_OK
    doc = json.loads(result.stdout)
    tensors = {t["name"]: t for t in doc["tensors"]}
    sd = torch.load(files["model"])
    for name, t in sd["model"].items():
        info = tensors[f"model.{name}"]
        assert info["shape"] == list(t.shape)
        assert info["stride"] == list(t.stride())
        assert info["dtype"] == str(t.dtype).removeprefix("torch.")
    assert doc["totals"]["parameters"] == 40 + 12 + 3 + 12
    assert doc["metadata"]["version"] == "3"
    assert doc["format"] == "zip"
    assert any(r["name"] == "model/data.pkl" for r in doc["records"])
    assert doc["shared_storages"]


def test_inspect_errors_exit_2(tmp_path: Path, files: dict[str, Path]) -> None:
    missing = run("inspect", tmp_path / "missing.pt")
    assert missing.returncode == EXIT_ERROR
    assert "error" in missing.stderr
    bad = tmp_path / "bad.pt"
    bad.write_bytes(files["model"].read_bytes()[:300])
    result = run("inspect", bad, "--json")
    assert result.returncode == EXIT_ERROR
    assert json.loads(result.stdout)["error"]


def test_verify_ok_and_damage(tmp_path: Path, files: dict[str, Path]) -> None:
    ok = run("verify", files["model"])
    assert ok.returncode == EXIT_OK
    assert "OK" in ok.stdout
    assert ok.stderr == ""
    data = bytearray(files["model"].read_bytes())
    reader_doc = json.loads(run("inspect", files["model"], "--json").stdout)
    record = next(r for r in reader_doc["records"] if r["name"].endswith("data/1"))
    data[record["data_offset"] + 1] ^= 0xFF
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(data))
    result = run("verify", flipped)
    assert result.returncode == EXIT_INVALID
    assert "CRC-32 mismatch" in result.stdout
    assert "model/data/1" in result.stdout
    doc = json.loads(run("verify", flipped, "--json").stdout)
    assert doc["ok"] is False
    assert doc["problems"][0]["where"] == "model/data/1"
    cut = tmp_path / "cut.pt"
    cut.write_bytes(bytes(data[: len(data) // 2]))
    assert run("verify", cut).returncode == EXIT_INVALID


def test_verify_warns_on_skip_data_crc(tmp_path: Path) -> None:
    import numpy as np

    import ptfile

    path = tmp_path / "skip.pt"
    ptfile.save({"w": np.ones(4, np.float32)}, path, skip_data=True)
    result = run("verify", path)
    assert result.returncode == EXIT_OK
    assert "no CRC-32 recorded" in result.stdout


def test_diff(files: dict[str, Path]) -> None:
    same = run("diff", files["model"], files["model"])
    assert same.returncode == EXIT_OK
    assert "identical" in same.stdout
    result = run("diff", files["model"], files["other"])
    assert result.returncode == EXIT_DIFFERENT
    assert "- model.fc.weight" in result.stdout
    assert "+ model.extra" in result.stdout
    assert "model.fc.bias: max |a-b| = 0.5" in result.stdout
    doc = json.loads(run("diff", files["model"], files["other"], "--json").stdout)
    assert doc["max_abs_diff"]["model.fc.bias"] == pytest.approx(0.5)
    assert doc["removed"] == ["model.fc.weight", "ema.w"]
    assert doc["added"] == ["model.extra"]


def test_convert_to_safetensors_loads_in_safetensors(tmp_path: Path,
                                                     files: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "model.safetensors"
    result = run("convert", files["model"], out)
    assert result.returncode == EXIT_OK, result.stderr
    assert "same data as model.embed.weight" in result.stdout
    loaded = load_file(out)
    sd = torch.load(files["model"])
    for name, t in sd["model"].items():
        if name != "head.weight":
            assert torch.equal(loaded[f"model.{name}"], t)
    assert torch.equal(loaded["ema.w"], sd["ema"]["w"])
    assert run("convert", files["model"], tmp_path / "x.unknown").returncode == EXIT_ERROR


def test_convert_sharded_index(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = tmp_path / "hf"
    src.mkdir()
    torch.manual_seed(1)
    shards = [{"a.weight": torch.randn(3, 2), "a.bias": torch.randn(3)},
              {"b.weight": torch.randn(2, 2).to(torch.float16)}]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"pytorch_model-0000{i}-of-00002.bin"
        torch.save(shard, src / name)
        weight_map.update(dict.fromkeys(shard, name))
    (src / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    out = tmp_path / "out"
    result = run("convert", src / "pytorch_model.bin.index.json", out)
    assert result.returncode == EXIT_OK, result.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["b.weight"] == "model-00002-of-00002.safetensors"
    for name, shard_file in index["weight_map"].items():
        tensor = load_file(out / shard_file)[name]
        want = next(s[name] for s in shards if name in s)
        assert torch.equal(tensor, want)
    back = tmp_path / "back"
    assert run("convert", out / "model.safetensors.index.json", back).returncode == EXIT_OK
    back_index = json.loads((back / "pytorch_model.bin.index.json").read_text())
    assert torch.equal(torch.load(back / back_index["weight_map"]["a.bias"])["a.bias"],
                       shards[0]["a.bias"])


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_scan_exit_codes(tmp_path: Path, files: dict[str, Path]) -> None:
    pytest.importorskip("ptfile.scanning")
    clean = run("scan", files["model"])
    assert clean.returncode == EXIT_OK, clean.stdout + clean.stderr
    assert "clean" in clean.stdout
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"w": _Evil()}, protocol=2))
    result = run("scan", files["model"], evil)
    assert result.returncode == EXIT_UNSAFE
    assert "DANGEROUS" in result.stdout
    assert "system" in result.stdout
    doc = json.loads(run("scan", evil, "--json").stdout)
    assert doc["is_dangerous"] is True
    assert doc["exit_code"] == EXIT_UNSAFE


def test_scan_unknown_fails_the_gate_unless_allowed(tmp_path: Path,
                                                    files: dict[str, Path]) -> None:
    # A whole pickled module: torch.load(weights_only=False) would import its classes.
    whole = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), whole)
    result = run("scan", whole)
    assert result.returncode == EXIT_UNKNOWN == 3, result.stdout + result.stderr
    assert run("scan", whole, "--allow-unknown").returncode == EXIT_OK
    assert run("scan", files["model"], whole, "--allow-unknown").returncode == EXIT_OK
    doc = json.loads(run("scan", whole, "--json").stdout)
    assert (doc["verdict"], doc["exit_code"]) == ("unknown", EXIT_UNKNOWN)
    # Over several files the worst code wins: dangerous, then error, then unknown.
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"w": _Evil()}, protocol=2))
    missing = tmp_path / "missing.pt"
    assert run("scan", whole, missing).returncode == EXIT_ERROR
    assert run("scan", whole, missing, evil, "--allow-unknown").returncode == EXIT_UNSAFE
    assert run("scan", files["model"], missing).returncode == EXIT_ERROR


def test_inspect_and_convert_legacy_formats(tmp_path: Path) -> None:
    golden = Path(__file__).parents[1] / "golden"
    result = run("inspect", golden / "tiny_legacy.pt")
    assert result.returncode == EXIT_OK and "legacy checkpoint" in result.stdout
    out = tmp_path / "current.pt"
    assert run("convert", golden / "tiny_legacy.pt", out).returncode == EXIT_OK
    assert out.read_bytes()[:4] == b"PK\x03\x04"
    assert torch.load(out)[1].tolist() == [2.0, 3.0]


def test_outcomes_table_is_whole() -> None:
    """Every verdict's code is one of the table's, every failing code has its place in the
    worst-first order, and the mapping, allow_unknown and worst-wins agree with it."""
    from ptfile import outcomes

    codes = {c for verdicts in outcomes.VERDICT_CODES.values() for c in verdicts.values()}
    assert codes | {EXIT_ERROR} == set(outcomes.EXIT_CODES)
    assert set(outcomes.WORST_FIRST) == set(outcomes.EXIT_CODES) - {EXIT_OK}
    assert outcomes.VERDICT_CODES["scan"] is outcomes.SCAN_CODES
    for command, verdicts in outcomes.VERDICT_CODES.items():
        assert outcomes.exit_code(command, outcomes.ERROR) == EXIT_ERROR
        for verdict, code in verdicts.items():
            assert outcomes.exit_code(command, verdict) == code
            assert outcomes.needs_attention(command, verdict) == (code != EXIT_OK)
            allowed = outcomes.exit_code(command, verdict, allow_unknown=True)
            assert allowed == (EXIT_OK if code == EXIT_UNKNOWN else code)
    for worst in outcomes.WORST_FIRST:
        better = outcomes.WORST_FIRST[outcomes.WORST_FIRST.index(worst) + 1:]
        assert outcomes.worst([EXIT_OK, *better, worst]) == worst
    assert (EXIT_UNSAFE, EXIT_INVALID, EXIT_DIFFERENT) == (1, 1, 1)
