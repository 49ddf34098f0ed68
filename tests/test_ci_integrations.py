"""Where security teams gate checkpoints: SARIF for CI code scanning, and a pre-commit hook.

The SARIF log of ``ptfile scan --format sarif`` is read by a real consumer
(``sarif-tools``' ``sarif`` command) and validated by a typed model of the SARIF
2.1.0 schema (``sarif-pydantic``); the hook of ``.pre-commit-hooks.yaml`` runs under
the real ``pre-commit`` tool (``try-repo``) on a temporary git repository.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PTFILE = str(BIN / "ptfile")


class Payload:
    """``os.system("true")`` when unpickled by anyone but a scanner (never run here)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


class Net:
    """A socket opener: its own rule (network access)."""

    def __reduce__(self) -> tuple[Any, ...]:
        import socket

        return (socket.create_connection, (("127.0.0.1", 9),))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate")
    out = {"clean": root / "models" / "clean.pt", "evil": root / "models" / "evil.pkl",
           "net": root / "net.pt", "whole": root / "whole.pt", "empty": root / "empty.pt"}
    out["clean"].parent.mkdir()
    torch.save({"w": torch.ones(2, 2)}, out["clean"])
    out["evil"].write_bytes(pickle.dumps(Payload(), protocol=2))
    out["net"].write_bytes(pickle.dumps(Net(), protocol=4))
    torch.save(torch.nn.Linear(2, 2), out["whole"])
    out["empty"].write_bytes(b"")
    return out


def sarif_of(*args: object) -> tuple[dict[str, Any], int]:
    result = subprocess.run([PTFILE, "scan", "--format", "sarif", *map(str, args)],
                            capture_output=True, text=True, timeout=120, check=False)
    return json.loads(result.stdout), result.returncode


def test_sarif_log_has_one_result_per_finding_with_rules_by_capability(
        files: dict[str, Path]) -> None:
    from sarif_pydantic import Sarif

    log, code = sarif_of(*files.values())
    assert code == 1  # dangerous wins, as for every scan
    Sarif.model_validate(log)  # the 2.1.0 schema's model
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "ptfile"
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    by_file: dict[str, list[str]] = {}
    for result in run["results"]:
        assert result["ruleId"] in rules
        assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"] and result["level"] in ("error", "warning", "none")
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        by_file.setdefault(Path(uri).name, []).append(result["ruleId"])
    assert by_file["evil.pkl"] == ["PTF101"]          # code execution
    assert by_file["net.pt"] == ["PTF103"]            # network access
    assert by_file["whole.pt"] == ["PTF201"]          # unknown global (a warning)
    assert by_file["empty.pt"] == ["PTF301"]          # could not scan
    assert "clean.pt" not in by_file                  # allowed names are no results
    evil = next(r for r in run["results"] if r["ruleId"] == "PTF101")
    assert evil["properties"]["global"] in ("posix.system", "os.system")
    assert evil["locations"][0]["physicalLocation"]["region"]["byteOffset"] >= 0
    assert evil["partialFingerprints"]["ptfileFinding/v1"]
    whole = next(r for r in run["results"] if r["ruleId"] == "PTF201")
    assert whole["locations"][0]["logicalLocations"][0]["name"].endswith("data.pkl")
    assert run["invocations"][0]["exitCode"] == 1
    assert {a["location"]["uri"] for a in run["artifacts"]} == {str(p) for p in files.values()}


def test_sarif_reads_in_a_real_consumer(files: dict[str, Path], tmp_path: Path) -> None:
    log, _ = sarif_of(files["evil"], files["whole"], files["clean"])
    path = tmp_path / "scan.sarif"
    path.write_text(json.dumps(log))
    summary = subprocess.run([str(BIN / "sarif"), "summary", str(path)], capture_output=True,
                             text=True, timeout=120, check=True)
    assert "error: 1" in summary.stdout and "warning: 1" in summary.stdout
    assert "PTF101" in summary.stdout and "PTF201" in summary.stdout
    gate = subprocess.run([str(BIN / "sarif"), "--check", "error", "summary", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert gate.returncode != 0  # the consumer's own gate fails on the error


def test_sarif_over_a_folder_is_one_log(files: dict[str, Path]) -> None:
    log, code = sarif_of(files["clean"].parent)
    assert code == 1 and len(log["runs"]) == 1
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["PTF101"]
    verbose, _ = sarif_of(files["clean"], "-v")
    assert {r["ruleId"] for r in verbose["runs"][0]["results"]} == {"PTF900"}


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_pre_commit_hook_blocks_a_hostile_checkpoint(files: dict[str, Path],
                                                     tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": f"{BIN}{os.pathsep}"
           f"{os.environ.get('PATH', '')}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=repo, env=env, capture_output=True, text=True,
                              timeout=600, check=False)

    assert run("git", "init", "-q").returncode == 0
    shutil.copy(files["clean"], repo / "clean.pt")
    shutil.copy(files["evil"], repo / "evil.pkl")
    (repo / "notes.txt").write_text("not scanned")
    assert run("git", "add", "clean.pt", "evil.pkl", "notes.txt").returncode == 0
    pre_commit = str(BIN / "pre-commit")
    clean = run(pre_commit, "try-repo", str(ROOT), "ptfile-scan", "--files", "clean.pt",
                "notes.txt")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout
    hostile = run(pre_commit, "try-repo", str(ROOT), "ptfile-scan", "--files", "clean.pt",
                  "evil.pkl")
    assert hostile.returncode == 1, hostile.stdout + hostile.stderr
    assert "Failed" in hostile.stdout and "DANGEROUS" in hostile.stdout
