"""``ptfile scan`` starts fast: a scan of a plain checkpoint imports neither numpy nor
ml_dtypes (issue 25; ``benchmarks/startup.py`` measures the time).

Each probe is a fresh interpreter, so what it finds in ``sys.modules`` is what the scan
imported.  The files are written by torch (the oracle): a ``torch.save`` state dict ZIP
and a legacy (``_use_new_zipfile_serialization=False``) stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ptfile.allowlist.rebuild import SAFE_GLOBALS
from ptfile.scanning import Verdict, verdict_of
from ptfile.scanning.verdicts import COMMON_ALLOWED

torch = pytest.importorskip("torch")

#: Modules a scan of a plain checkpoint must not import.
HEAVY = ("numpy", "ml_dtypes", "fsspec", "tqdm", "ptfile.model.tensor", "ptfile.model.dtypes",
         "ptfile.allowlist.policy", "ptfile.formats.zipped", "ptfile.archive.writer")


def _checkpoints(tmp_path: Path) -> dict[str, Path]:
    state = {"w": torch.ones(4, 4), "b": torch.zeros(4, dtype=torch.float16),
             "n": torch.arange(3), "p": torch.nn.Parameter(torch.ones(2))}
    paths = {"zip": tmp_path / "small.pt", "legacy": tmp_path / "legacy.pt"}
    torch.save(state, paths["zip"])
    torch.save(state, paths["legacy"], _use_new_zipfile_serialization=False)
    return paths


def _probe(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints a JSON object last."""
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=120)
    doc: dict[str, object] = json.loads(found.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_scan_imports_no_numpy(tmp_path: Path, kind: str) -> None:
    path = _checkpoints(tmp_path)[kind]
    doc = _probe(
        "import json, sys, ptfile.scanning, ptfile\n"
        f"result = ptfile.scan({str(path)!r})\n"
        f"print(json.dumps({{'verdict': result.verdict.value, 'format': result.format, "
        f"'imported': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    assert doc == {"verdict": "allowed", "format": kind, "imported": []}


def test_cli_scan_imports_no_numpy(tmp_path: Path) -> None:
    """The command itself (its parser, the bulk check of its inputs, the scan)."""
    path = _checkpoints(tmp_path)["zip"]
    doc = _probe(
        "import contextlib, io, json, sys\n"
        "from ptfile.cli.commands import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main(['scan', {str(path)!r}])\n"
        f"print(json.dumps({{'code': code, "
        f"'imported': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    assert doc == {"code": 0, "imported": []}


def test_scan_of_other_names_still_asks_the_allowlist(tmp_path: Path) -> None:
    """A name outside the common ones is judged by the allowlist itself (imported then)."""
    path = tmp_path / "q.pt"
    torch.save({"q": torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.quint8)}, path)
    doc = _probe(
        "import json, sys, ptfile.scanning, ptfile\n"
        f"result = ptfile.scan({str(path)!r})\n"
        "print(json.dumps({'verdict': result.verdict.value, "
        "'policy': 'ptfile.allowlist.policy' in sys.modules}))")
    assert doc == {"verdict": "allowed", "policy": True}


def test_common_names_are_on_the_allowlist() -> None:
    """:data:`COMMON_ALLOWED` answers without the allowlist, so it must be part of it."""
    assert COMMON_ALLOWED.issubset(SAFE_GLOBALS)
    assert all(verdict_of(m, n) is Verdict.ALLOWED for m, n in COMMON_ALLOWED)
