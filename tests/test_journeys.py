"""A new user's first hour, as tests: the installed ``ptfile`` command over a realistic tree.

Each test runs the console script the package installs (not ``main()`` in-process) over
a folder as users have them: nested team/run folders, mixed extensions, duplicate base
names, a damaged, an empty, a random and a hostile file among torch-written ones, and
checks every exit code, every output file and every JSON record against the one
exit-code table (0 ok, 1 found something, 2 could not read, 3 unknown globals).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rangeserver import RangeServer

#: The console script next to this interpreter: what ``pip install`` put on the PATH.
PTFILE = str(Path(sys.executable).with_name("ptfile"))


def ptfile(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PTFILE, *map(str, args)], capture_output=True, text=True,
                          timeout=180, check=False, cwd=cwd)


def jsonl(result: subprocess.CompletedProcess[str]) -> tuple[list[dict[str, Any]],
                                                              dict[str, Any]]:
    *records, summary = [json.loads(line) for line in result.stdout.splitlines()]
    assert summary["summary"] is True
    return records, summary


class Sentinel:
    """A payload for the hostile file: would create a file if anything ran it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """teamN/runNN/model.pt (and a model.bin beside it in run01), plus bad files."""
    root = tmp_path_factory.mktemp("zoo")
    torch.manual_seed(0)
    for team in range(2):
        for run in range(3):
            folder = root / f"team{team}" / f"run{run:02d}"
            folder.mkdir(parents=True)
            torch.save({"w": torch.randn(4, 3), "b": torch.arange(3.0), "step": run,
                        "config": {"lr": 0.1 * (run + 1), "name": f"t{team}"}},
                       folder / "model.pt")
            if run == 1:  # the same base name, another extension: one output path
                torch.save({"w": torch.ones(2)}, folder / "model.bin")
    from safetensors.torch import save_file  # torch.load reads these too
    save_file({"lora.A": torch.ones(2, 2)}, str(root / "team1" / "run02" / "adapter.safetensors"))
    (root / "team0" / "notes.txt").write_text("not a checkpoint, not a checkpoint suffix")
    (root / "team0" / "random.pt").write_bytes(np.random.default_rng(1).bytes(300))
    (root / "team0" / "empty.pt").write_bytes(b"")
    good = (root / "team0" / "run00" / "model.pt").read_bytes()
    (root / "team1" / "truncated.pt").write_bytes(good[: len(good) // 2])
    sentinel = root.parent / f"{root.name}-SENTINEL"
    (root / "team1" / "hostile.pt").write_bytes(pickle.dumps(Sentinel(str(sentinel)),
                                                             protocol=2))
    return root


def test_bulk_convert_keeps_the_tree_and_refuses_clashes(zoo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ptfile("convert", zoo, "--out-prefix", out)
    records, summary = jsonl(result)
    by_path = {os.path.relpath(r["path"], zoo): r for r in records}
    # every model.pt without a twin lands at its own relative path
    for team in range(2):
        for run in (0, 2):
            r = by_path[f"team{team}/run{run:02d}/model.pt"]
            assert r["verdict"] == "converted" and r["exit_code"] == 0, r
            written = out / f"team{team}" / f"run{run:02d}" / "model.safetensors"
            assert r["result"]["output"] == str(written)
            from safetensors.numpy import load_file
            got = load_file(str(written))
            want = torch.load(zoo / f"team{team}/run{run:02d}/model.pt", weights_only=True)
            assert set(got) == {"w", "b"}
            np.testing.assert_array_equal(got["w"], want["w"].numpy())
        # model.pt and model.bin would both become run01/model.safetensors: both refused
        for name in ("model.pt", "model.bin"):
            r = by_path[f"team{team}/run01/{name}"]
            assert r["verdict"] == "error" and r["exit_code"] == 2
            assert "same output" in r["error"]["message"]
        assert not (out / f"team{team}" / "run01").exists()
    for bad in ("team0/random.pt", "team0/empty.pt", "team1/truncated.pt", "team1/hostile.pt"):
        assert by_path[bad]["verdict"] == "error" and by_path[bad]["exit_code"] == 2, bad
    # not a checkpoint suffix; already safetensors (a walked file of the output kind)
    assert "team0/notes.txt" not in by_path and "team1/run02/adapter.safetensors" not in by_path
    assert summary["files"] == len(records) == 12
    assert summary["verdicts"] == {"converted": 4, "error": 8}
    assert result.returncode == summary["exit_code"] == 2
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == [f"team{t}/run{r:02d}/model.safetensors" for t in range(2) for r in (0, 2)]
    # a rerun converts nothing twice: every earlier output is skipped, nothing overwritten
    again, _ = jsonl(ptfile("convert", zoo, "--out-prefix", out, "--workers", "1"))
    assert sorted(r["verdict"] for r in again if r["verdict"] != "error") == ["skipped"] * 4


def test_bulk_convert_beside_the_inputs_refuses_clashes(zoo: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run01"
    folder.mkdir()
    for name in ("model.pt", "model.bin"):
        (folder / name).write_bytes((zoo / "team0" / "run01" / name).read_bytes())
    result = ptfile("convert", folder)
    records, _summary = jsonl(result)
    assert {r["verdict"] for r in records} == {"error"} and result.returncode == 2
    assert not (folder / "model.safetensors").exists()


@pytest.mark.parametrize("name", ["team0/random.pt", "team0/empty.pt", "team1/truncated.pt"])
def test_a_damaged_file_is_an_error_for_every_command(zoo: Path, name: str) -> None:
    path = zoo / name
    good = zoo / "team0" / "run00" / "model.pt"
    for args in (["inspect", path], ["scan", path], ["scan", "--allow-unknown", path],
                 ["diff", good, path], ["convert", path, path.with_suffix(".safetensors")]):
        result = ptfile(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert str(path) in result.stderr or str(path) in result.stdout, (args, result.stderr)
    assert not path.with_suffix(".safetensors").exists()
    scan = ptfile("scan", "--json", path)
    doc = json.loads(scan.stdout)
    assert doc["path"] == str(path) and doc["exit_code"] == 2 and doc["error"]
    # verify: a file that is no checkpoint cannot be verified (2); a checkpoint cut short is
    # what verify is for: damaged (1)
    verify = ptfile("verify", path)
    assert verify.returncode == (1 if name.endswith("truncated.pt") else 2), verify.stdout


def test_scan_tree_gives_each_file_its_verdict(zoo: Path) -> None:
    result = ptfile("scan", zoo, "--allow-unknown")
    records, _summary = jsonl(result)
    verdicts = {os.path.relpath(r["path"], zoo): (r["verdict"], r["exit_code"]) for r in records}
    assert verdicts["team1/hostile.pt"] == ("dangerous", 1)
    for bad in ("team0/random.pt", "team0/empty.pt", "team1/truncated.pt"):
        assert verdicts[bad] == ("error", 2)
    clean = [k for k in verdicts if k.endswith(("model.pt", "model.bin", ".safetensors"))]
    assert len(clean) == 9 and all(verdicts[k] == ("allowed", 0) for k in clean)
    assert result.returncode == 1  # dangerous wins over error
    assert not any(p.name.endswith("SENTINEL") for p in zoo.parent.iterdir())


def test_scan_text_says_what_the_findings_are(zoo: Path) -> None:
    clean = ptfile("scan", zoo / "team0" / "run00" / "model.pt")
    assert clean.returncode == 0
    assert "clean" in clean.stdout and "all allowed" in clean.stdout
    assert "findings" not in clean.stdout
    hostile = ptfile("scan", zoo / "team1" / "hostile.pt")
    assert hostile.returncode == 1 and "DANGEROUS" in hostile.stdout
    assert "builtins.open" in hostile.stdout or "io.open" in hostile.stdout


def test_diff_sees_values_beside_tensors(zoo: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    w = torch.arange(6.0).reshape(2, 3)
    torch.save({"w": w, "step": 1, "config": {"lr": 0.1, "tags": ["x"]}}, a)
    torch.save({"w": w, "step": 2, "config": {"lr": 0.1}}, b)
    result = ptfile("diff", a, b)
    assert result.returncode == 1, result.stdout
    assert "~ step: 1 -> 2" in result.stdout and "- config.tags.0" in result.stdout
    doc = json.loads(ptfile("diff", "--json", a, b).stdout)
    assert doc["identical"] is False and doc["values_changed"] == {"step": ["1", "2"]}
    assert doc["removed"] == ["config.tags.0"] and doc["max_abs_diff"] == {"w": 0.0}
    assert (doc["a"], doc["b"]) == (str(a), str(b))
    same = ptfile("diff", a, a)
    assert same.returncode == 0 and same.stdout.startswith("identical")
    # a .pt against its .safetensors conversion: the values come back from its metadata
    st = tmp_path / "a.safetensors"
    assert ptfile("convert", a, st).returncode == 0
    converted = ptfile("diff", a, st)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    # against a foreign .safetensors of the same tensors: the values only the .pt holds
    # are listed unless --tensors-only
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": w}, str(foreign))
    full = ptfile("diff", a, foreign)
    assert full.returncode == 1 and "- step" in full.stdout, full.stdout + full.stderr
    tensors = ptfile("diff", "--tensors-only", a, foreign)
    assert tensors.returncode == 0, tensors.stdout + tensors.stderr


def test_errors_name_the_file_and_the_flag(zoo: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.pt"
    torch.save(torch.nn.Linear(2, 2), whole)
    good = zoo / "team0" / "run00" / "model.pt"
    for args in (["inspect", whole], ["convert", whole, tmp_path / "w.safetensors"],
                 ["diff", good, whole]):
        result = ptfile(*args)
        assert result.returncode == 2
        assert f"{whole} names torch.nn.modules.linear.Linear" in result.stderr, result.stderr
        assert "--structural" in result.stderr and "ptfile.load(" not in result.stderr
    assert ptfile("inspect", "--structural", whole).returncode == 0
    bad = ptfile("diff", good, zoo / "team0" / "random.pt")
    assert bad.returncode == 2 and f"{zoo / 'team0' / 'random.pt'}:" in bad.stderr
    doc = json.loads(ptfile("diff", "--json", good, zoo / "team0" / "random.pt").stdout)
    assert doc["path"] == str(zoo / "team0" / "random.pt") and doc["exit_code"] == 2
    missing = ptfile("inspect", tmp_path / "nope.pt")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_every_json_names_its_input_path(zoo: Path) -> None:
    good = zoo / "team0" / "run00" / "model.pt"
    for command in ("inspect", "verify", "scan"):
        doc = json.loads(ptfile(command, "--json", good).stdout)
        assert doc["path"] == str(good), command
        assert "source" not in doc and "url" not in doc
    records, _ = jsonl(ptfile("verify", zoo / "team0"))
    assert all("path" in r and "url" not in r for r in records)


def test_a_url_that_is_not_there_is_an_error_not_damage(zoo: Path) -> None:
    with RangeServer(zoo) as server:
        for command in ("verify", "inspect", "scan"):
            result = ptfile(command, server.url("team0/nothere.pt"))
            assert result.returncode == 2, (command, result.stdout, result.stderr)
            assert "DAMAGED" not in result.stdout
        assert ptfile("verify", server.url("team0/run00/model.pt")).returncode == 0


def test_help_prints_the_exit_code_table() -> None:
    text = ptfile("--help").stdout
    for line in ("0  ok", "1  found something", "2  could not read", "3  scan only"):
        assert line in text


def test_progress_counts_files_as_whole_numbers(zoo: Path, tmp_path: Path) -> None:
    result = ptfile("inspect", zoo / "team0" / "run00", zoo / "team0" / "run02", "--progress")
    assert result.returncode == 0
    assert "/2 [" in result.stderr and ".00/" not in result.stderr, result.stderr


def test_ptfile_warnings_print_as_one_line(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import ptfile
    from ptfile import cli

    def warns(args: Any, out: Any) -> int:
        warnings.warn("http://h/m.pt: the server ignores range requests", ptfile.PtfileWarning,
                      stacklevel=1)
        return 0

    monkeypatch.setitem(cli.commands._COMMANDS, "inspect", (warns, "describe"))
    assert cli.main(["inspect", "m.pt"]) == 0
    assert capsys.readouterr().err == \
        "ptfile inspect: warning: http://h/m.pt: the server ignores range requests\n"


def test_a_dcp_checkpoint_from_python_3_13_converts_and_diffs_identical(tmp_path: Path) -> None:
    """A DCP folder torch wrote on Python 3.13 (a committed fixture): inspect, convert to a
    .pt, and diff the two: the same tensors and the same values, list items leaf by leaf."""
    folder = Path(__file__).parent / "fixtures" / "pythons" / "3.13" / "dcp-nested"
    assert ptfile("inspect", folder).returncode == 0
    out = tmp_path / "consolidated.pt"
    assert ptfile("convert", folder, out).returncode == 0
    result = ptfile("diff", folder, out)
    assert result.returncode == 0 and result.stdout.startswith("identical"), result.stdout
    assert "other values" in result.stdout


def test_an_hf_writer_dcp_folder_converts_as_one_checkpoint(zoo: Path, tmp_path: Path) -> None:
    """``ptfile convert DIR out.pt`` on a folder torch's HuggingFaceStorageWriter wrote (on
    Python 3.13, a committed fixture) consolidates it as ``load_dcp`` reads it; a folder
    holding another checkpoint beside a ``.safetensors`` still names many files."""
    folder = Path(__file__).parent / "fixtures" / "pythons" / "3.13" / "dcp-hf"
    out = tmp_path / "hf.pt"
    result = ptfile("convert", folder, out)
    assert result.returncode == 0, result.stderr
    diff = ptfile("diff", folder, out)
    assert diff.returncode == 0 and diff.stdout.startswith("identical"), diff.stdout
    mixed = ptfile("convert", zoo / "team1" / "run02", tmp_path / "x.pt")
    assert mixed.returncode == 2 and "names many files" in mixed.stderr
    assert not (tmp_path / "x.pt").exists()
