"""The hostile corpus: every file is refused or loaded inertly, and the scanner flags it.

All cases run in one child process (limited to 4 GiB of address space and two
minutes) so that a crash, a hang or an unbounded allocation fails the test
instead of the test run; ``MemoryError`` anywhere in an error's chain counts as
a failure too (ptfile must refuse before allocating).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ptfile
from hostile import corpus

#: The child that loads and scans the corpus (a helper, beside the others in tests/support).
RUN_HOSTILE = Path(__file__).parents[1] / "support" / "run_hostile.py"
NAMES = [case.name for case in corpus(Path("/nonexistent"))]
DANGEROUS = {case.name for case in corpus(Path("/nonexistent")) if case.dangerous}
#: Outcomes the contract allows: success or a ptfile error.
ALLOWED = {name for name in ptfile.__dict__ if name.endswith("Error")} | {"ok"}
ADDRESS_SPACE = 4 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hostile")
    markers, files = root / "markers", root / "files"
    markers.mkdir()
    files.mkdir()
    for case in corpus(markers):
        (files / f"{case.name}.pt").write_bytes(case.data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(RUN_HOSTILE), str(files)],
                          capture_output=True, text=True, timeout=180, preexec_fn=_limit,
                          env=env, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_case = {row["case"]: row for row in rows if "case" in row}
    started = [row["start"] for row in rows if "start" in row]
    crashed = started[-1] if started and started[-1] not in by_case else None
    return {"rows": by_case, "crashed": crashed, "returncode": done.returncode,
            "stderr": done.stderr[-2000:], "markers": sorted(p.name for p in markers.iterdir())}


def test_hostile_child_survives(results: dict[str, Any]) -> None:
    assert results["crashed"] is None, f"crashed on {results['crashed']}: {results['stderr']}"
    assert results["returncode"] == 0, results["stderr"]


def test_hostile_no_marker_appears(results: dict[str, Any]) -> None:
    assert results["markers"] == []


@pytest.mark.parametrize("name", NAMES)
def test_hostile_case_is_refused_or_inert(results: dict[str, Any], name: str) -> None:
    row = results["rows"].get(name)
    assert row is not None, f"no result (crash in {results['crashed']})"
    for mode in ("strict", "structural"):
        assert row[mode].split(":")[0] in ALLOWED, (mode, row[mode])
        assert not row[f"{mode}_memory"], (mode, "MemoryError: allocation before a check")
    assert row["seconds"] < 20, row
    assert row["max_rss_mb"] < 3000, row
    if "error" in row["scan"]:  # damaged and nothing else to report: scan's error (exit 2)
        assert name not in DANGEROUS, row["scan"]
        assert row["scan"]["error"].split(":")[0] in DAMAGE, row["scan"]


#: The errors a scan raises for a damaged file with nothing else to report.
DAMAGE = {"FormatError", "ArchiveError", "PickleStreamError", "UnknownFormatError"}


@pytest.mark.parametrize("name", sorted(DANGEROUS))
def test_hostile_scan_flags_dangerous(results: dict[str, Any], name: str) -> None:
    assert results["rows"][name]["scan"]["dangerous"], name


@pytest.mark.parametrize("name", sorted(DANGEROUS - {"prepended", "shadow", "after_stop",
                                                     "case_collision", "nested_bytes"}))
def test_hostile_strict_load_refuses_dangerous(results: dict[str, Any], name: str) -> None:
    # The exceptions load the benign reading torch itself reads (and scan flags the rest).
    assert results["rows"][name]["strict"] != "ok", name
