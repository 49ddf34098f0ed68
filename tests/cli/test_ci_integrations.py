"""Where security teams gate checkpoints: SARIF for CI code scanning, a GitHub Actions
workflow, a pre-commit hook, and the allow-list they share.

The SARIF log of ``ptfile scan --format sarif`` is read by a real consumer
(``sarif-tools``' ``sarif`` command), validated by a typed model of the SARIF
2.1.0 schema (``sarif-pydantic``) and checked against the schema's constraints and GitHub
code scanning's documented rules that can be checked offline (:func:`github_problems`);
its regions are bytes of the file (read back here).  The workflow of
``examples/github-actions/ptfile-scan.yml`` is parsed and its scan step run on a small
tree; the hook of ``.pre-commit-hooks.yaml`` runs under the real ``pre-commit`` tool
(``pre-commit run``, the hook installed from a snapshot of this working tree as ``try-repo``
takes it) on a temporary git repository, with and without a ``[tool.ptfile]`` table.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from folders import make_zoo

ROOT = Path(__file__).resolve().parents[2]
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


def sarif_of(*args: object, cwd: Path | None = None) -> tuple[dict[str, Any], int]:
    result = subprocess.run([PTFILE, "scan", "--format", "sarif", *map(str, args)],
                            capture_output=True, text=True, timeout=120, check=False, cwd=cwd)
    return json.loads(result.stdout), result.returncode


def github_problems(log: dict[str, Any]) -> list[str]:
    """What GitHub code scanning or the SARIF 2.1.0 schema would refuse in ``log``, as far
    as it can be told offline: the schema's required properties, enums and minimums for
    what ptfile writes, and GitHub's documented rules (a rule id on every result, a
    ``startLine`` on every region, an artifact ``uri`` relative to the checkout, at most
    20 runs and 25,000 results a run, rules' ``security-severity`` a number from 0 to 10)."""
    out: list[str] = []
    if log.get("version") != "2.1.0" or "runs" not in log:
        out.append("version 2.1.0 and runs are required")
    if len(log.get("runs", [])) > 20:
        out.append("more than 20 runs")
    for run in log.get("runs", []):
        driver = run.get("tool", {}).get("driver", {})
        if not driver.get("name"):
            out.append("tool.driver.name is required")
        ids = [r.get("id") for r in driver.get("rules", [])]
        for rule in driver.get("rules", []):
            severity = rule.get("properties", {}).get("security-severity")
            if severity is not None and not 0 <= float(severity) <= 10:
                out.append(f"{rule['id']}: security-severity {severity}")
            if not rule.get("shortDescription", {}).get("text"):
                out.append(f"{rule['id']}: no shortDescription")
        if len(run.get("results", [])) > 25_000:
            out.append("more than 25,000 results")
        for i, result in enumerate(run.get("results", [])):
            where = f"result {i}"
            if result.get("ruleId") not in ids:
                out.append(f"{where}: ruleId {result.get('ruleId')!r} not among the rules")
            if ids.index(result["ruleId"]) != result.get("ruleIndex", ids.index(result["ruleId"])):
                out.append(f"{where}: ruleIndex")
            if result.get("level") not in ("none", "note", "warning", "error"):
                out.append(f"{where}: level")
            if not result.get("message", {}).get("text"):
                out.append(f"{where}: message.text is required")
            if not result.get("locations"):
                out.append(f"{where}: GitHub needs a location")
            for location in result.get("locations", []):
                physical = location.get("physicalLocation", {})
                uri = physical.get("artifactLocation", {}).get("uri", "")
                if not uri or uri.startswith("/") or "://" in uri or " " in uri:
                    out.append(f"{where}: uri {uri!r} is not relative to the checkout")
                region = physical.get("region", {})
                if not isinstance(region.get("startLine"), int) or region["startLine"] < 1:
                    out.append(f"{where}: region.startLine >= 1 is required by GitHub")
                if region.get("byteOffset", 0) < 0:
                    out.append(f"{where}: region.byteOffset < 0")
    return out


def test_sarif_log_has_one_result_per_finding_with_rules_by_capability(
        files: dict[str, Path]) -> None:
    from sarif_pydantic import Sarif

    root = files["clean"].parent.parent
    log, code = sarif_of(*(p.relative_to(root) for p in files.values()), cwd=root)
    assert code == 1  # dangerous wins, as for every scan
    Sarif.model_validate(log)  # the 2.1.0 schema's model
    assert github_problems(log) == []
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
    assert {a["location"]["uri"] for a in run["artifacts"]} == \
        {p.relative_to(root).as_posix() for p in files.values()}
    assert {a["location"]["uriBaseId"] for a in run["artifacts"]} == {"%SRCROOT%"}


def record_data_offset(path: Path, suffix: str) -> int:
    """Where the bytes of the ZIP record whose name ends with ``suffix`` start in the file."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    raw = path.read_bytes()
    name_len, extra_len = (int.from_bytes(raw[info.header_offset + k:info.header_offset + k + 2],
                                          "little") for k in (26, 28))
    return info.header_offset + 30 + name_len + extra_len


def test_sarif_regions_are_bytes_of_the_file(tmp_path: Path) -> None:
    zipped, legacy, bare = tmp_path / "zipped.pt", tmp_path / "legacy.pt", tmp_path / "bare.pkl"
    torch.save({"w": torch.ones(2), "x": Payload()}, zipped)
    torch.save({"w": torch.ones(2), "x": Payload()}, legacy, _use_new_zipfile_serialization=False)
    bare.write_bytes(b"\x80\x02" + pickle.dumps(Payload(), protocol=2)[2:])
    deflated = tmp_path / "deflated.pt"
    with zipfile.ZipFile(zipped) as src, zipfile.ZipFile(deflated, "w",
                                                        zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    log, code = sarif_of(*(p.name for p in (zipped, legacy, bare, deflated)), cwd=tmp_path)
    assert code == 1 and github_problems(log) == []
    results = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: r
               for r in log["runs"][0]["results"] if r["ruleId"] == "PTF101"}
    assert set(results) == {"zipped.pt", "legacy.pt", "bare.pkl", "deflated.pt"}
    for uri, result in results.items():
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] == 1
        in_record = result["properties"]["offsetInRecord"]
        if uri == "deflated.pt":  # no byte of the file is the opcode: none is named
            assert "byteOffset" not in region and in_record > 0
            continue
        raw = (tmp_path / uri).read_bytes()
        at = region["byteOffset"]
        assert raw[at:at + 1] == b"c" and raw[at + 1:].startswith(b"posix\nsystem\n"), uri
        base = record_data_offset(zipped, "data.pkl") if uri == "zipped.pt" else 0
        assert at == base + in_record, uri  # the record's data offset, plus the opcode's place
    assert results["zipped.pt"]["locations"][0]["physicalLocation"]["region"]["byteOffset"] \
        > results["zipped.pt"]["properties"]["offsetInRecord"] > 0


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


#: The commits the hook test makes need an identity, whatever git is set up with here.
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def _hook_repo(dest: Path) -> str:
    """ROOT's working tree as ``pre-commit try-repo`` takes it (tracked and untracked files
    git does not ignore, as they are now) committed in a repository of its own; its commit.
    ``try-repo`` installs the hook into a fresh store at every call (~6 s each); from this
    repository ``pre-commit run`` installs it once and reuses the environment."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the tree is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "hooks"]):
        subprocess.run(["git", "-C", str(dest), *args], check=True, capture_output=True,
                       env={**os.environ, **GIT_ID})
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.slow  # pre-commit builds its own environment
@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_pre_commit_hook_blocks_a_hostile_checkpoint(files: dict[str, Path],
                                                     tmp_path: Path) -> None:
    repo, hooks = tmp_path / "repo", tmp_path / "hooks"
    repo.mkdir()
    hooks.mkdir()
    env = {**os.environ, **GIT_ID, "PRE_COMMIT_HOME": str(tmp_path / "cache"),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=repo, env=env, capture_output=True, text=True,
                              timeout=600, check=False)

    def hook(*names: str) -> subprocess.CompletedProcess[str]:
        return run(str(BIN / "pre-commit"), "run", "ptfile-scan", "--files", *names)

    assert run("git", "init", "-q").returncode == 0
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{
        "repo": str(hooks), "rev": _hook_repo(hooks), "hooks": [{"id": "ptfile-scan"}]}]}))
    shutil.copy(files["clean"], repo / "clean.pt")
    shutil.copy(files["evil"], repo / "evil.pkl")
    (repo / "notes.txt").write_text("not scanned")
    assert run("git", "add", ".pre-commit-config.yaml", "clean.pt", "evil.pkl",
               "notes.txt").returncode == 0
    clean = hook("clean.pt", "notes.txt")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout
    hostile = hook("clean.pt", "evil.pkl")
    assert hostile.returncode == 1, hostile.stdout + hostile.stderr
    assert "Failed" in hostile.stdout and "DANGEROUS" in hostile.stdout
    # Any name: torch.load reads a payload by its path, so the hook takes every staged file
    # and scans those a loader reads (notes.txt is skipped, model.weights is not).
    shutil.copy(files["evil"], repo / "model.weights")
    assert run("git", "add", "model.weights").returncode == 0
    renamed = hook("notes.txt", "model.weights")
    assert renamed.returncode == 1 and "DANGEROUS" in renamed.stdout, renamed.stdout
    # A training checkpoint's RNG state: unknown numpy names block the commit, until the
    # repository's [tool.ptfile] table allows numpy (no blanket --allow-unknown).
    torch.save({"numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               repo / "rng_state.pth")
    assert run("git", "add", "rng_state.pth").returncode == 0
    blocked = hook("rng_state.pth")
    assert blocked.returncode == 1 and "UNKNOWN" in blocked.stdout, blocked.stdout
    (repo / "pyproject.toml").write_text("[tool.ptfile]\nallow-numpy = true\n")
    passed = hook("rng_state.pth")
    assert passed.returncode == 0 and "Passed" in passed.stdout, passed.stdout


#: What a Trainer folder needs beyond numpy: transformers' TrainingArguments and the
#: enums and classes it holds (accelerate's among them), as written by the real Trainer.
TRAINER_ALLOW = ("transformers.training_args.*", "transformers.trainer_utils.*",
                 "transformers.trainer_pt_utils.AcceleratorConfig", "accelerate.state.*",
                 "accelerate.utils.dataclasses.DistributedType")


def scan_code(*args: object, cwd: Path | None = None) -> tuple[int, str]:
    done = subprocess.run([PTFILE, "scan", *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Trainer run's state and arguments (rng_state.pth holds np.random.get_state(),
    training_args.bin TrainingArguments) copied out of their checkpoint folder: there a
    scan allows them by their role (test_folders), here they are loose files."""
    folder = make_zoo(tmp_path_factory.mktemp("zoo"))["trainer"]
    loose = tmp_path_factory.mktemp("loose")
    # other names: rng_state.pth and training_args.bin side by side make a trainer folder
    shutil.copy(folder / "rng_state.pth", loose / "rng.pth")
    shutil.copy(folder / "training_args.bin", loose / "args.bin")
    (loose / "model.pt").write_bytes((folder / "optimizer.pt").read_bytes())
    return loose


def test_a_trainer_folder_passes_with_a_precise_allow_list(trainer: Path) -> None:
    assert scan_code(trainer)[0] == 3                        # unknown globals by default
    assert scan_code(trainer / "rng.pth")[0] == 3            # numpy's names
    assert scan_code(trainer / "rng.pth", "--allow-numpy")[0] == 0
    assert scan_code(trainer, "--allow-numpy")[0] == 3       # TrainingArguments still unknown
    allow = [arg for name in TRAINER_ALLOW for arg in ("--allow", name)]
    assert scan_code(trainer, *allow)[0] == 3                # and numpy without --allow-numpy
    code, text = scan_code(trainer, "--allow-numpy", *allow, "--json")
    assert code == 0, text
    records = [json.loads(line) for line in text.splitlines()]
    findings = [f for r in records if r.get("result") for f in r["result"]["findings"]]
    allowed_by = {f["name"]: f["message"] for f in findings if "(allowed: " in f["message"]}
    assert allowed_by["TrainingArguments"].endswith("(allowed: --allow transformers.training_args.*)")
    assert allowed_by["ndarray"].endswith("(allowed: --allow-numpy)")


def test_the_pyproject_table_is_read_from_the_repository(trainer: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(trainer, repo / "runs" / "checkpoint-2")  # loose files, no trainer folder
    (repo / ".git").mkdir()  # the walk up stops at the repository's root
    names = ", ".join(json.dumps(n) for n in TRAINER_ALLOW)
    (repo / "pyproject.toml").write_text(f"[tool.ptfile]\nallow = [{names}]\nallow-numpy = true\n")
    (tmp_path / "pyproject.toml").write_text("[tool.ptfile]\nallow-unknown = true\n")  # above
    assert scan_code("runs", cwd=repo)[0] == 0
    assert scan_code("checkpoint-2", cwd=repo / "runs")[0] == 0  # found walking up
    assert scan_code("runs", "--no-config", cwd=repo)[0] == 3
    (repo / "pyproject.toml").write_text("[tool.ptfile]\nallow-nunpy = true\n")
    code, text = scan_code("runs", cwd=repo)
    assert code == 2 and "unknown key 'allow-nunpy'" in text


@pytest.mark.parametrize("pattern", ["posix.system", "builtins.eval", "os.*", "*"])
def test_an_allow_list_never_passes_a_dangerous_name(files: dict[str, Path], tmp_path: Path,
                                                     pattern: str) -> None:
    code, text = scan_code(files["evil"], "--allow", pattern)
    assert code == 2 and "a dangerous name" in text          # refused, nothing scanned
    (tmp_path / "pyproject.toml").write_text(f'[tool.ptfile]\nallow = ["{pattern}"]\n')
    assert scan_code(files["evil"], cwd=tmp_path)[0] == 2


def test_allowed_names_leave_dangerous_findings_dangerous(tmp_path: Path) -> None:
    """A file with both numpy names and an object array: --allow-numpy passes the names,
    the object array (arbitrary pickled objects) stays dangerous."""
    path = tmp_path / "objects.pt"
    torch.save({"rng": np.random.get_state(), "objects": np.array([1, "a"], dtype=object),
                "py": random.getstate()}, path)
    code, text = scan_code(path, "--allow-numpy")
    assert code == 1 and "numpy-object-array" in text


def test_the_workflow_example_parses_and_its_scan_runs(files: dict[str, Path],
                                                       tmp_path: Path) -> None:
    workflow = yaml.safe_load((ROOT / "examples" / "github-actions" / "ptfile-scan.yml")
                              .read_text())
    assert workflow["permissions"]["security-events"] == "write"
    steps = workflow["jobs"]["scan"]["steps"]
    scan = next(s for s in steps if "ptfile scan" in s.get("run", ""))
    upload = next(s for s in steps if s.get("uses", "").startswith(
        "github/codeql-action/upload-sarif@"))
    assert upload["if"] == "always()" and scan["continue-on-error"] is True
    assert steps.index(scan) < steps.index(upload)
    assert any(s.get("if") == f"steps.{scan['id']}.outcome == 'failure'" for s in steps)
    tree = tmp_path / "checkout"
    shutil.copytree(files["clean"].parent, tree / "models")
    (tree / "README.md").write_text("not a checkpoint\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-e", "-c", scan["run"]], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr  # evil.pkl: the step fails, the log is written
    log = json.loads((tree / upload["with"]["sarif_file"]).read_text())
    assert github_problems(log) == []
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in log["runs"][0]["results"]}
    assert uris == {"models/evil.pkl"}


def test_loadable_only_scans_what_a_loader_reads(files: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``scan --loadable-only`` (the hook's): a named file no torch loader reads is skipped,
    one it reads is scanned whatever its name; with nothing left, the exit is 0."""
    from ptfile.cli import main

    (tmp_path / "README.md").write_text("# a repository\n")
    shutil.copy(files["evil"], tmp_path / "model.weights")
    shutil.copy(files["clean"], tmp_path / "clean.pt")
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")  # named as one: scanned
    readme, weights, clean = (str(tmp_path / n) for n in ("README.md", "model.weights",
                                                          "clean.pt"))
    assert main(["scan", "--no-config", readme]) == 2  # named, no checkpoint: an error
    capsys.readouterr()
    assert main(["scan", "--no-config", "--loadable-only", readme]) == 0
    assert capsys.readouterr().out == ""
    assert main(["scan", "--no-config", "--loadable-only", "--json", readme, weights,
                 clean]) == 1
    found = json.loads(capsys.readouterr().out)
    assert [doc["path"] for doc in found] == [weights, clean]
    assert main(["scan", "--no-config", "--loadable-only", str(tmp_path / "broken.pt")]) == 2
